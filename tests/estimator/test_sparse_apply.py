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
from distribute import lookups

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
    "Momentum": lambda p: est.optimizers.Momentum(p, LR, 0.9),
    "Momentum_nesterov": lambda p: est.optimizers.Momentum(p, LR, 0.9, use_nesterov=True),
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
    "Momentum": {"momentum_buffer": "Momentum"},
    "Momentum_nesterov": {"momentum_buffer": "Momentum"},
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
    assert not lookups.rows(table).any()   # (cleared by the step)
    with torch.no_grad():   # (an evaluation's lookups are not noted)
        est.optimizers.looked_up(table, torch.tensor([3]))
    assert not lookups.rows(table).any()


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


def _strategy(kind):
    import distribute
    options = distribute.CommunicationOptions(timeout_seconds=30)
    if kind == "central":
        return distribute.experimental.CentralStorageStrategy(
            ["cpu:0", "cpu:1"], communication_options=options)
    return distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=options,
        cross_device_ops=distribute.ReductionToOneDevice() if kind == "to_one" else None)


def _assert_same_variables(replicas, one):
    for name in one.get_variable_names():
        np.testing.assert_allclose(replicas.get_variable_value(name),
                                   one.get_variable_value(name), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def _pairs(batches):
    """One process's batches: each two replicas' batches joined."""
    return [tuple(a + b for a, b in zip(batches[i], batches[i + 1]))
            for i in range(0, len(batches), 2)]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["mirrored", "to_one", "central"])
def test_tables_on_replicas_are_updated_as_in_one_process(tmp_path, kind):
    """2 replicas: the rows any replica read are updated, those no replica
    read keep their RMSProp slots, as in one process on the joined batches
    (each replica knew only its own: a row read whose gradient summed to
    zero, an embedding column's at the first step, its `weights` starting at
    zeros, was left; CentralStorageStrategy's replicas that do not step kept
    theirs into the next step)."""
    def train(model_dir, batches, strategy=None):
        e = est.LinearClassifier(_columns(), optimizer="RMSProp", config=est.RunConfig(
            model_dir=str(model_dir), train_distribute=strategy))
        e.train(lambda: [({"s": np.array(s), "t": np.array(t)}, np.array(y))
                         for s, t, y in batches])
        return e
    batches = TF["batches"] * 2
    replicas = train(tmp_path / "replicas", batches, _strategy(kind))
    one = train(tmp_path / "one", _pairs(batches))
    assert replicas.get_variable_value("global_step") == 4
    _assert_same_variables(replicas, one)
    assert one.get_variable_value("linear/linear_model/t_embedding/embedding_weights")[3].tolist(
        ) == pytest.approx(TF["embedding"][3])   # "w": read by no batch


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["mirrored", "to_one", "central"])
def test_a_sparse_embedding_on_replicas_trains_as_in_one_process(tmp_path, kind):
    """nn.Embedding(sparse=True) under Ftrl beside Adam: the replicas'
    sparse gradients reduced into one over the rows any of them had, as
    TF's IndexedSlices (ReductionToOneDevice and CentralStorageStrategy
    failed: "unsupported memory format option Contiguous")."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 20, (8,), generator=g), torch.randn(8, 1, generator=g))
               for _ in range(8)]

    def model_fn(features, labels, mode):
        emb = est.get_module("emb", lambda: torch.nn.Embedding(50, 3, sparse=True))
        head = est.get_module("head", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(head(emb(features["ids"])), labels)
        opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.01), var_list=head)
        rows = est.get_optimizer(lambda p: est.optimizers.Ftrl(p, 0.1), name="rows",
                                 var_list=emb)

        def train_op():
            loss.backward()
            opt.step()
            rows.step()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)

    def train(model_dir, batches, strategy=None):
        torch.manual_seed(1)
        e = est.Estimator(model_fn, config=est.RunConfig(
            model_dir=str(model_dir), train_distribute=strategy))
        e.train(lambda: [({"ids": x}, y) for x, y in batches])
        return e
    replicas = train(tmp_path / "replicas", batches, _strategy(kind))
    one = train(tmp_path / "one", [(torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]]))
                                   for a, b in zip(batches[::2], batches[1::2])])
    _assert_same_variables(replicas, one)
    # rows 20-49, read by no batch, keep their initial values (dense Ftrl: zeros)
    assert not np.isclose(one.get_variable_value("emb/weight")[20:], 0.0).any()


def test_a_warm_started_table_keeps_its_rows_no_batch_read(tmp_path):
    """Ftrl, a linear model's default: TF's sparse apply leaves the rows a
    batch did not read; the dense step (taken where it is the same, a table
    from zeros) set a warm-started table's unread rows to 0."""
    def train(model_dir, batches, warm=None):
        e = est.LinearClassifier(_columns()[:1], model_dir=str(model_dir),
                                 warm_start_from=warm)
        e.train(lambda: [({"s": np.array(s)}, np.array(y)) for s, y in batches])
        return e
    first = train(tmp_path / "first", [(["c", "d"], [1, 0])])
    warm = first.get_variable_value("linear/linear_model/s/weights")
    assert np.count_nonzero(warm[2:]) == 2
    second = train(tmp_path / "second", [(["a", "b"], [1, 0])], warm=str(tmp_path / "first"))
    after = second.get_variable_value("linear/linear_model/s/weights")
    np.testing.assert_array_equal(after[2:], warm[2:])   # "c", "d": not read
    assert np.count_nonzero(after[:2]) == 2


class _Table(torch.nn.Module):
    """A table of one's own read with `table[ids]`, projected by `w` (from
    zeros); `declared`: its lookups are agreed over the replicas."""

    def __init__(self, rows, declared):
        super().__init__()
        self.t = torch.nn.Parameter(torch.arange(rows * 2.0).reshape(rows, 2) / 10)
        if declared:
            est.optimizers.looked_up(self.t)
        self.w = torch.nn.Parameter(torch.full((2, 1), 0.5) if not declared else torch.zeros(2, 1))

    def forward(self, ids):
        est.optimizers.looked_up(self.t, ids)
        return (self.t[ids] @ self.w).sum(1)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["mirrored", "central"])
def test_tables_of_ones_own_on_replicas(tmp_path, kind):
    """A declared table whose module is made at a later step is agreed over
    the replicas as in one process (the tables were those of the first
    step); a table noted but not declared has each replica's rows alone
    there (the rows with a gradient), and no all-reduce of its rows (one of
    them noted on one replica only aborted gloo)."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 5, (4,), generator=g), torch.randint(0, 6, (4,), generator=g),
                torch.randn(4, generator=g)) for _ in range(8)]

    def model_fn(features, labels, mode):
        first = est.get_module("first", lambda: _Table(10, declared=False))
        out = first(features["a"])
        opts = [est.get_optimizer(lambda p: est.optimizers.RMSProp(p, 0.1), var_list=first)]
        if est.get_global_step() >= 2:
            late = est.get_module("late", lambda: _Table(12, declared=True))
            out = out + late(features["b"])
            opts.append(est.get_optimizer(lambda p: est.optimizers.RMSProp(p, 0.1),
                                          name="late", var_list=late))
        loss = ((out - labels) ** 2).mean()

        def train_op():
            loss.backward()
            for opt in opts:
                opt.step()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)

    def train(model_dir, batches, strategy=None):
        e = est.Estimator(model_fn, config=est.RunConfig(
            model_dir=str(model_dir), train_distribute=strategy))
        e.train(lambda: [({"a": a, "b": b}, y) for a, b, y in batches])
        return e
    replicas = train(tmp_path / "replicas", batches, _strategy(kind))
    one = train(tmp_path / "one", [tuple(torch.cat([x, z]) for x, z in zip(
        batches[i], batches[i + 1])) for i in range(0, 8, 2)])
    assert replicas.get_variable_value("global_step") == 4
    _assert_same_variables(replicas, one)
    rms = one.get_variable_value("late/late/t/rms")
    assert (rms[6:] == 1.0).all() and (rms[:6] < 1.0).any()   # the rows read alone


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["mirrored", "central"])
def test_a_table_whose_rows_no_optimizer_asks_for_on_replicas(tmp_path, kind):
    """Wide & deep, 2 replicas, 110 steps: an embedding table under torch's
    Adagrad (the canned DNN's default, which takes no rows read) is left out
    of the replicas' agreement after 100 steps, every replica alike (under
    CentralStorageStrategy replica 0's optimizer alone steps; a replica
    leaving it out alone would abort gloo), a linear table under RMSProp
    still agreed: both trained as in one process."""
    fc = est.feature_column
    vocab = fc.categorical_column_with_vocabulary_list("s", [f"v{i}" for i in range(10)])
    rng = np.random.RandomState(0)
    batches = [([f"v{i}" for i in rng.randint(0, 6, 2)], rng.randint(0, 2, 2).tolist())
               for _ in range(220)]

    def train(model_dir, batches, strategy=None):
        e = est.DNNLinearCombinedClassifier(
            linear_feature_columns=[vocab], linear_optimizer="RMSProp",
            dnn_feature_columns=[fc.embedding_column(vocab, 2)], dnn_hidden_units=[3],
            config=est.RunConfig(model_dir=str(model_dir), tf_random_seed=3,
                                 train_distribute=strategy, log_step_count_steps=None))
        e.train(lambda: [({"s": np.array(s)}, np.array(y)) for s, y in batches])
        return e
    replicas = train(tmp_path / "replicas", batches, _strategy(kind))
    one = train(tmp_path / "one", _pairs(batches))
    assert replicas.get_variable_value("global_step") == 110
    _assert_same_variables(replicas, one)
    rms = one.get_variable_value("linear_optimizer/linear/linear_model/s/weights/rms")
    assert _rows_touched(rms) == list(range(6))


class _LateTable(torch.nn.Module):
    """A declared table read by two lookups a step, or as
    `nn.Embedding(sparse=True)` (TF's IndexedSlices): the reference."""

    def __init__(self, sparse=False):
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.randn(4000, 3, generator=torch.Generator().manual_seed(0)) * 0.1)
        self.sparse = sparse
        if not sparse:
            est.optimizers.looked_up(self.weight)

    def forward(self, ids):
        if self.sparse:
            return torch.nn.functional.embedding(ids, self.weight, sparse=True)
        out = []
        for j in range(ids.shape[1]):   # (two lookups a step: the rows of both)
            est.optimizers.looked_up(self.weight, ids[:, j])
            out.append(self.weight[ids[:, j]])
        return torch.stack(out, 1)


def _late_model_fn(first_step, sparse=False, accumulate=False, zero_first=False,
                   zero_grad_first=False, set_to_none=True, read_from=0):
    """A head trained from the first step, a table by its own RMSProp from
    `first_step` (kept from the steps before, its gradients set to None at
    the end of the train_op, or with `zero_grad_first` at its start, as
    PyTorch's `zero_grad(); backward(); step()`; `set_to_none=False`: zeroed
    in place; `accumulate`: added up until then); `zero_first`: the first
    lookup's rows get zero gradients (read all the same: TF's apply updates
    them); `read_from`: the table is not read before that step (its
    lookups' output replaced by zeros)."""
    def model_fn(features, labels, mode):
        table = est.get_module("emb", lambda: _LateTable(sparse))
        head = est.get_module("head", lambda: torch.nn.Linear(3, 1))
        ids = torch.as_tensor(features["ids"])
        x = table(ids) if est.get_global_step() >= read_from else torch.zeros(*ids.shape, 3)
        x = x[:, 1] + (0.0 if zero_first else 1.0) * x[:, 0]
        loss = ((head(x).squeeze(1) - torch.as_tensor(labels)) ** 2).mean()
        h = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.05), name="head",
                              var_list=head)
        t = est.get_optimizer(lambda p: est.optimizers.RMSProp(p, 0.05), name="emb",
                              var_list=table)
        step = est.get_global_step()

        def train_op():
            if zero_grad_first:
                h.zero_grad()
                t.zero_grad(set_to_none=set_to_none)
            loss.backward()
            h.step()
            if step >= first_step:
                t.step()
            if not zero_grad_first:
                h.zero_grad()
                if step >= first_step or not accumulate:
                    t.zero_grad(set_to_none=set_to_none)
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


def _train_late(model_dir, batches, first_step, strategy=None, **kwargs):
    config = est.RunConfig(model_dir=str(model_dir), train_distribute=strategy,
                           log_step_count_steps=None, tf_random_seed=3)
    e = est.Estimator(_late_model_fn(first_step, **kwargs), config=config)
    e.train(lambda: [({"ids": np.array(i, dtype=np.int64)}, np.array(y, np.float32))
                     for i, y in batches])
    return e


def _ids_read(batches):
    return sorted({i for ids, _ in batches for row in ids for i in row})


def _late_batches(n, lookups=2):
    rng = np.random.RandomState(1)
    return [(rng.randint(0, 4000, (2, lookups)).tolist(), rng.randn(2).tolist())
            for _ in range(n)]


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("zero_grad_first", [False, True])
def test_rows_read_while_a_table_is_kept_from_training_are_not_stepped_later(
        tmp_path, zero_grad_first, set_to_none):
    """A table kept from training (its gradient set to None) for 4 steps,
    then stepped: its first step updates the rows that step read, as TF's
    sparse apply (the rows read since the first step were all updated:
    RMSProp's mean square of rows read only then decayed), those of both its
    lookups (one with zero gradients), whether the train_op zeroes the
    gradients before its backward pass or after its step, setting them to
    None or zeroing them in place (`zero_grad(set_to_none=False)`)."""
    batches = _late_batches(6)
    how = {"zero_first": True, "zero_grad_first": zero_grad_first, "set_to_none": set_to_none}
    noted = _train_late(tmp_path / "noted", batches, 4, **how)
    sparse = _train_late(tmp_path / "sparse", batches, 4, sparse=True, **how)
    for name in sparse.get_variable_names():
        np.testing.assert_allclose(noted.get_variable_value(name),
                                   sparse.get_variable_value(name), rtol=1e-6, err_msg=name)
    rms = noted.get_variable_value("emb/emb/weight/rms")
    assert _rows_touched(rms) == _ids_read(batches[4:])


def test_rows_read_by_many_lookups_while_a_table_is_kept_from_training_are_not_stepped(
        tmp_path):
    """As above with 70 lookups a step (a sequence model's lookup a time
    step): the rows read in the steps the table was kept from training were
    all stepped at its first step (noted past 64 lookups, they were kept)."""
    batches = _late_batches(6, lookups=70)
    noted = _train_late(tmp_path / "noted", batches, 4)
    sparse = _train_late(tmp_path / "sparse", batches, 4, sparse=True)
    for name in sparse.get_variable_names():
        np.testing.assert_allclose(noted.get_variable_value(name),
                                   sparse.get_variable_value(name), rtol=1e-6, err_msg=name)
    rms = noted.get_variable_value("emb/emb/weight/rms")
    assert _rows_touched(rms) == _ids_read(batches[4:])


def _branch_model_fn(sparse):
    """A table looked up every step whose lookups reach the loss on even
    global steps alone (a branch some steps take), one RMSProp for all."""
    def model_fn(features, labels, mode):
        table = est.get_module("emb", lambda: _LateTable(sparse))
        head = est.get_module("head", lambda: torch.nn.Linear(3, 1))
        x = table(torch.as_tensor(features["ids"])).sum(1)
        if est.get_global_step() % 2:
            x = torch.ones_like(x.detach())
        loss = ((head(x).squeeze(1) - torch.as_tensor(labels)) ** 2).mean()
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: est.optimizers.RMSProp(p, 0.05)))
    return model_fn


def _train_branch(model_dir, batches, sparse=False, strategy=None):
    e = est.Estimator(_branch_model_fn(sparse), config=est.RunConfig(
        model_dir=str(model_dir), log_step_count_steps=None, tf_random_seed=3,
        train_distribute=strategy))
    e.train(lambda: [({"ids": np.array(i, dtype=np.int64)}, np.array(y, np.float32))
                     for i, y in batches])
    return e


def test_rows_read_by_lookups_the_loss_does_not_reach_are_not_stepped(tmp_path):
    """Rows read in a step whose loss does not reach the table have no
    gradient (TF: no IndexedSlices, nothing applied): the next step updates
    its own rows alone, not those too."""
    batches = _late_batches(6)
    noted = _train_branch(tmp_path / "noted", batches)
    sparse = _train_branch(tmp_path / "sparse", batches, sparse=True)
    for name in sparse.get_variable_names():
        np.testing.assert_allclose(noted.get_variable_value(name),
                                   sparse.get_variable_value(name), rtol=1e-6, err_msg=name)
    rms = noted.get_variable_value("optimizer/emb/weight/rms")
    assert _rows_touched(rms) == _ids_read(batches[::2])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_table_some_replicas_loss_skips_is_named_as_a_cause_of_the_hang(tmp_path):
    """A branch the data decides leaves the table out of one replica's loss:
    the replicas waited on each other until the timeout, which ended in
    gloo's own "Timed out waiting ... for recv" from DDP's forward; the error
    now says the replicas waited on each other, and the likely cause."""
    def model_fn(features, labels, mode):
        table = est.get_module("emb", lambda: _LateTable())
        head = est.get_module("head", lambda: torch.nn.Linear(3, 1))
        labels = torch.as_tensor(labels)
        x = table(torch.as_tensor(features["ids"])).sum(1)
        if labels[0] <= 0:   # (a branch this replica's batch decides)
            x = torch.ones_like(x.detach())
        loss = ((head(x).squeeze(1) - labels) ** 2).mean()
        opt = est.get_optimizer(lambda p: est.optimizers.RMSProp(p, 0.05))

        def train_op():   # (a callable one: the first step's check of the
            loss.backward()   # parameters the loss reaches is DDP's own then)
            opt.step()
            opt.zero_grad()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    batches = _late_batches(8)
    for i, (_, y) in enumerate(batches):   # (replica 0's batches reach the table, 1's not)
        y[0] = abs(y[0]) if i % 2 == 0 else -abs(y[0])
    import distribute
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=4))
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path),
                                                     train_distribute=strategy))
    with pytest.raises(distribute.ReplicaFailedError, match=r"each waited for the others: "
                       r"their steps did not make the same collectives. Under DDP a common "
                       r"cause is a parameter the loss reaches on some replicas only"):
        e.train(lambda: [({"ids": np.array(i, dtype=np.int64)}, np.array(y, np.float32))
                         for i, y in batches])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["mirrored", "central"])
def test_rows_read_by_lookups_the_loss_does_not_reach_on_replicas(tmp_path, kind):
    """The test above on 2 replicas: as in one process on the joined batches."""
    batches = _late_batches(12)
    replicas = _train_branch(tmp_path / "replicas", batches, strategy=_strategy(kind))
    one = _train_branch(tmp_path / "one", _pairs(batches))
    _assert_same_variables(replicas, one)
    rms = one.get_variable_value("optimizer/emb/weight/rms")
    assert _rows_touched(rms) == _ids_read(_pairs(batches)[::2])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("set_to_none, lookups, read_from",
                         [(True, 2, 0), (False, 2, 0), (True, 70, 0), (True, 2, 1)])
@pytest.mark.parametrize("kind", ["mirrored", "central"])
def test_rows_read_while_a_table_is_kept_from_training_on_replicas(tmp_path, kind, set_to_none,
                                                                   lookups, read_from):
    """The test above on 2 replicas, the gradients zeroed first: the rows any
    replica read for the step the table is first stepped, those of its
    zero-gradient lookup too (agreed over the replicas), alone; as in one
    process on the joined batches; with 70 lookups a step too, and with the
    table first read at the second step (the replicas' agreement of its
    rows came before any lookup: they were kept)."""
    batches = _late_batches(12, lookups)
    how = {"zero_first": True, "zero_grad_first": True, "set_to_none": set_to_none,
           "read_from": read_from}
    replicas = _train_late(tmp_path / "replicas", batches, 4, _strategy(kind), **how)
    one = _train_late(tmp_path / "one", _pairs(batches), 4, **how)
    _assert_same_variables(replicas, one)
    rms = one.get_variable_value("emb/emb/weight/rms")
    assert _rows_touched(rms) == _ids_read(batches[8:])


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["mirrored", "central"])
@pytest.mark.parametrize("how", ["set aside", "zero_grad first", "accumulate"])
def test_a_table_first_stepped_after_its_rows_were_left_out_on_replicas(tmp_path, kind, how):
    """A declared table left out of the replicas' agreement (for 100 steps
    no optimizer asked for its rows), then stepped by RMSProp from step 104,
    its gradients set aside or added up until then: as in one process
    (before, with them set aside, each replica took its own rows read since
    the first step, as agreed: the replicas updated different rows)."""
    batches = _late_batches(2 * 106)
    how = {"accumulate": how == "accumulate", "zero_grad_first": how == "zero_grad first"}
    replicas = _train_late(tmp_path / "replicas", batches, 104, _strategy(kind), **how)
    one = _train_late(tmp_path / "one", _pairs(batches), 104, **how)
    _assert_same_variables(replicas, one)


def _rows_touched(rms):
    return [i for i, row in enumerate(np.asarray(rms).reshape(len(rms), -1)) if (row != 1.0).any()]


def _embedding_model_fn(every=1, scaler=False):
    """An embedding column (ones) under a head from zeros: the table's
    gradients are 0, so only the rows read say which rows RMSProp updates;
    the train_op steps every `every`-th call (gradient accumulation), or
    through a GradScaler (a label of inf: that step skipped)."""
    col = est.feature_column.embedding_column(
        est.feature_column.categorical_column_with_vocabulary_list(
            "s", [f"v{i}" for i in range(8)]), 2, initializer=lambda shape: np.ones(shape))
    calls = [0]

    def model_fn(features, labels, mode):
        head = est.get_module("head", lambda: torch.nn.Linear(2, 1).requires_grad_(False)
                              .apply(lambda m: torch.nn.init.zeros_(m.weight)
                                     if isinstance(m, torch.nn.Linear) else None)
                              .requires_grad_(True))
        x = est.feature_column.input_layer(features, [col])
        loss = ((head(x).squeeze(1) - torch.as_tensor(labels, dtype=torch.float32)) ** 2).mean()
        opt = est.get_optimizer(lambda p: est.optimizers.RMSProp(p, 0.1))
        grad_scaler = scaler and est.get_grad_scaler(lambda: torch.amp.GradScaler("cpu"))

        def train_op():
            calls[0] += 1
            if grad_scaler:
                grad_scaler.scale(loss).backward()
                grad_scaler.step(opt)
                grad_scaler.update()
                opt.zero_grad()
                return
            loss.backward()
            if calls[0] % every == 0:
                opt.step()
                opt.zero_grad()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


def _train_embedding(model_dir, batches, strategy=None, **kwargs):
    e = est.Estimator(_embedding_model_fn(**kwargs), config=est.RunConfig(
        model_dir=str(model_dir), train_distribute=strategy))
    e.train(lambda: [({"s": np.array(s)}, np.array(y, dtype=np.float32)) for s, y in batches])
    return e


RMS = "optimizer/input_layer/s_embedding/embedding_weights/rms"


def test_a_skipped_step_forgets_the_rows_it_read(tmp_path):
    """A GradScaler's skipped step: TF's apply is not made, its
    IndexedSlices gone; its rows were carried into the next step."""
    e = _train_embedding(tmp_path, [(["v0", "v1"], [np.inf, 1.0]), (["v2", "v3"], [1.0, 1.0])],
                         scaler=True)
    assert _rows_touched(e.get_variable_value(RMS)) == [2, 3]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["mirrored", "central"])
def test_accumulated_micro_batches_on_replicas_step_every_row_they_read(tmp_path, kind):
    """A train_op stepping every second call: the first micro-batch's rows
    (an agreement over the replicas cleared them at the next lookup)."""
    batches = [([f"v{i}"], [1.0]) for i in range(4)]
    replicas = _train_embedding(tmp_path / "r", batches, _strategy(kind), every=2)
    one = _train_embedding(tmp_path / "o", _pairs(batches), every=2)
    assert _rows_touched(replicas.get_variable_value(RMS)) == [0, 1, 2, 3]
    np.testing.assert_allclose(replicas.get_variable_value(RMS), one.get_variable_value(RMS))


def test_ftrl_takes_the_rows_alone_once_its_rate_changes():
    """The dense step is the sparse apply only while the hyperparameters
    stay: a decaying rate recomputed the rows stepped before from their
    slots (a row read once moved at the next step: -0.0477 for TF's -0.0953)."""
    def train(sparse):
        torch.manual_seed(0)
        table = torch.nn.Embedding(4, 1, sparse=sparse)
        torch.nn.init.zeros_(table.weight)
        opt = est.optimizers.Ftrl(table.parameters(), 0.1)
        for step, ids in enumerate([[0], [1]]):
            opt.param_groups[0]["lr"] = 0.1 * 0.5 ** step
            ids = torch.tensor(ids)
            if not sparse:
                est.optimizers.looked_up(table.weight, ids)
            opt.zero_grad()
            table(ids).sum().backward()
            opt.step()
        return table.weight.detach().ravel().tolist()
    assert train(sparse=False) == train(sparse=True)


def test_rows_read_over_more_than_4096_backward_passes_before_a_step_are_stepped():
    """A gradient accumulated over 4098 micro-batches (a lookup each) before
    RMSProp's first step: the rows read with a zero gradient are stepped, as
    TF's sparse apply (their notes were dropped after 4096 lookups, taken for
    a table torch's optimizer steps; attack probe)."""
    table = torch.nn.Parameter(torch.ones(4, 1))
    opt = est.optimizers.RMSProp([table], 0.1)
    for i in range(4098):   # row 0 with a gradient, row 1 read with a zero one
        ids = torch.tensor([i % 2])
        est.optimizers.looked_up(table, ids)
        (table[ids] * (1.0 if i % 2 == 0 else 0.0)).sum().backward()
    opt.step()
    assert _rows_touched(opt.state[table]["rms"].numpy()) == [0, 1]
    # made after 5000 lookups stepped by nothing (notes no longer kept): the rows
    # read once it exists are stepped (notes resumed only at its first step)
    late = torch.nn.Parameter(torch.ones(4, 1))
    for i in range(5000):
        est.optimizers.looked_up(late, torch.tensor([0]))
        late[torch.tensor([0])].sum().backward()
    late.grad = None
    opt = est.optimizers.RMSProp([late], 0.1)
    ids = torch.tensor([2, 3])
    est.optimizers.looked_up(late, ids)
    (late[ids] * torch.tensor([[3.0], [0.0]])).sum().backward()
    opt.step()
    assert _rows_touched(opt.state[late]["rms"].numpy()) == [2, 3]
    # and the notes of a table no optimizer asks for stay bounded, read by lookups
    # no backward pass takes too (they grew by one a lookup; attack probe)
    unread = torch.nn.Parameter(torch.ones(4, 1))
    for i in range(5000):
        est.optimizers.looked_up(unread, torch.tensor([i % 4]))
    assert len(unread.__dict__.get("_rows_read_ids", ())) <= 64


def test_lookups_many_a_step_and_in_a_compiled_module():
    """70 lookups in one step (a loop over time steps): every row read
    (the notes past 64 were dropped); and noted from a compiled module
    (it failed in dynamo: the table's __dict__)."""
    table = torch.nn.Parameter(torch.ones(80, 2))
    opt = est.optimizers.RMSProp([table], 0.1)
    out = sum((table[torch.tensor([t])] * 0.0).sum() for t in range(70)
              if est.optimizers.looked_up(table, torch.tensor([t])) is None)
    out.backward()
    opt.step()
    assert _rows_touched(opt.state[table]["rms"].numpy()) == list(range(70))

    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.t = torch.nn.Parameter(torch.ones(6, 2))

        def forward(self, ids):
            est.optimizers.looked_up(self.t, ids)
            return (self.t[ids] * 0.0).sum()
    module = Lookup()
    compiled = torch.compile(module, backend="eager")
    opt = est.optimizers.RMSProp(module.parameters(), 0.1)
    compiled(torch.tensor([1, 3])).backward()
    opt.step()
    assert _rows_touched(opt.state[module.t]["rms"].numpy()) == [1, 3]
