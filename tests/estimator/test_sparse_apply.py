"""A canned linear model's tables under each TF1 optimizer, against TF 2.15
(tests/support/fixtures/tf_sparse_apply.json, recorded by
record_tf_sparse_apply.py): TF's lookups give sparse gradients, so RMSProp,
Ftrl and the others update only the rows of the batch. The tables' dense
gradients here moved the other rows too: RMSProp's mean square decayed for
a row not in the batch (its next update 10% off TF's), Ftrl with
l2_shrinkage shrank it, and Ftrl set an embedding table's unseen rows to 0."""
import json
import logging
import os

import numpy as np
import pytest
import torch

import estimator as est

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "support", "fixtures",
                       "tf_sparse_apply.json")
TF = json.load(open(FIXTURE))
LR = TF["learning_rate"]
OPTIMIZERS = {
    "RMSProp": "RMSProp",
    "RMSProp_momentum": lambda p: est.optimizers.RMSProp(p, LR, momentum=0.9),
    "RMSProp_centered": lambda p: est.optimizers.RMSProp(p, LR, centered=True),
    "Ftrl": "Ftrl",
    "Ftrl_shrinkage": lambda p: est.optimizers.Ftrl(
        p, LR, l2_shrinkage_regularization_strength=0.5),
    "Adagrad": "Adagrad",
    "Adam": "Adam",
    "SGD": "SGD",
}
SLOTS = {  # our optimizer state -> TF's slot suffix
    "RMSProp": {"rms": "RMSProp", "momentum": "RMSProp_1"},
    "RMSProp_momentum": {"rms": "RMSProp", "momentum": "RMSProp_1"},
    "RMSProp_centered": {"rms": "RMSProp", "mg": "RMSProp_1", "momentum": "RMSProp_2"},
    "Ftrl": {"accum": "Ftrl", "linear": "Ftrl_1"},
    "Ftrl_shrinkage": {"accum": "Ftrl", "linear": "Ftrl_1"},
    "Adagrad": {"sum": "Adagrad"},
    "Adam": {"m": "Adam", "v": "Adam_1"},
    "SGD": {},
}


def _columns():
    fc = est.feature_column
    s = fc.categorical_column_with_vocabulary_list("s", ["a", "b", "c", "d"])
    t = fc.embedding_column(fc.categorical_column_with_vocabulary_list(
        "t", ["x", "y", "z", "w"]), 2, initializer=lambda shape: np.array(TF["embedding"]))
    return [s, t]


def _input_fn():
    return [({"s": np.array(s), "t": np.array(t)}, np.array(y, dtype=np.int64))
            for s, t, y in TF["batches"]]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_tables_are_updated_as_tfs_sparse_apply(tmp_path, name, caplog):
    caplog.set_level(logging.WARNING)
    e = est.LinearClassifier(_columns(), optimizer=OPTIMIZERS[name], model_dir=str(tmp_path))
    e.train(_input_fn, steps=len(TF["batches"]))
    ours = {}
    for n in e.get_variable_names():
        if n.startswith("optimizer/"):
            var, slot = n[len("optimizer/"):].rsplit("/", 1)
            if slot in SLOTS[name]:
                ours[f"{var}/part_0/{SLOTS[name][slot]}"] = n
        elif n.startswith("linear/linear_model/"):
            ours[n] = n
    assert sorted(ours) == sorted(TF["optimizers"][name])
    for tf_name, value in TF["optimizers"][name].items():
        np.testing.assert_allclose(e.get_variable_value(ours[tf_name]), np.array(value),
                                   rtol=1e-5, atol=1e-6, err_msg=tf_name)


def test_a_tables_own_lookups_may_be_noted():
    """`est.optimizers.looked_up` for a table of one's own read with
    `table[ids]`: RMSProp leaves the other rows' slots, as TF's sparse apply."""
    table = torch.nn.Parameter(torch.ones(4, 2))
    opt = est.optimizers.RMSProp([table], 0.1)
    for ids in ([0, 1], [1, 2]):
        ids = torch.tensor(ids)
        est.optimizers.looked_up(table, ids)
        (table[ids] * 3.0).sum().backward()
        opt.step()
        opt.zero_grad()
    rms = opt.state[table]["rms"]
    assert rms[3].tolist() == [1.0, 1.0] and rms[0].tolist() != [1.0, 1.0]
    assert table[3].tolist() == [1.0, 1.0]
    assert not table._looked_up_rows.any()   # (cleared by the step)
    with torch.no_grad():   # (an evaluation's lookups are not noted)
        est.optimizers.looked_up(table, torch.tensor([3]))
    assert not table._looked_up_rows.any()


def test_sparse_gradients_for_rmsprop_and_adam_as_tfs():
    """nn.Embedding(sparse=True): RMSProp's sparse apply updates the rows of
    the batch alone; TF1's Adam decays every row's moments (as a dense step)."""
    def train(cls, sparse):
        torch.manual_seed(0)
        table = torch.nn.Embedding(4, 2, sparse=sparse)
        opt = cls(table.parameters(), 0.1)
        rows = []
        for ids in ([0, 1], [1, 2], [0, 0]):
            opt.zero_grad()
            table(torch.tensor(ids)).pow(2).sum().backward()
            opt.step()
            rows.append(table.weight[2].tolist())
        return table.weight.detach(), rows
    _, rows = train(est.optimizers.RMSProp, sparse=True)
    assert rows[2] == rows[1]   # row 2, not in the last batch, stays
    weight, rows = train(est.optimizers.Adam, sparse=True)
    assert rows[2] != rows[1]   # moves on its first moment
    torch.testing.assert_close(weight, train(est.optimizers.Adam, sparse=False)[0])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tables_on_replicas_are_updated_as_in_one_process(tmp_path):
    """MirroredStrategy, 2 replicas: the rows no replica read keep their
    RMSProp slots, as in one process on the concatenated batches (each
    replica knows only its own lookups: the rows with a gradient, the same
    on every replica, are updated)."""
    import distribute
    batches = [(["a", "a", "b"], ["x", "y", "x"], [1, 1, 0]),
               (["a", "b", "b"], ["y", "y", "x"], [0, 0, 0]),
               (["c", "a", "a"], ["x", "x", "y"], [1, 1, 0]),
               (["c", "c", "a"], ["y", "x", "x"], [0, 1, 1])]

    def train(model_dir, batches, strategy=None):   # (the categorical column: an embedding
        # column's rows read have a zero gradient at the first step, their
        # `weights` starting at zeros, which replicas leave: see looked_up)
        e = est.LinearClassifier(_columns()[:1], optimizer="RMSProp", config=est.RunConfig(
            model_dir=str(model_dir), train_distribute=strategy))
        e.train(lambda: [({"s": np.array(s), "t": np.array(t)}, np.array(y))
                         for s, t, y in batches])
        return e
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=30))
    replicas = train(tmp_path / "replicas", batches, strategy)
    pairs = [tuple(a + b for a, b in zip(batches[i], batches[i + 1])) for i in (0, 2)]
    one = train(tmp_path / "one", pairs)
    assert replicas.get_variable_value("global_step") == 2
    for name in one.get_variable_names():
        np.testing.assert_allclose(replicas.get_variable_value(name),
                                   one.get_variable_value(name), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    rms = one.get_variable_value("optimizer/linear/linear_model/s/weights/rms")
    assert rms[3].tolist() == [1.0]   # "d": read by no batch
