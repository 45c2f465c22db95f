"""est.feature_column.shared_embedding_columns against TF1's (recorded from
TF 2.15 by tests/support/fixtures/record_tf_shared_embeddings.py): names, one
table for every layer of a model (two towers), lookups and combiners, a
canned DNN over them, and the errors."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_shared_embeddings.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
fc = est.feature_column
FEATURES = {k: np.array(v) for k, v in TF["features"].items()}


def columns(combiner="mean", initializer=None):
    q = fc.categorical_column_with_vocabulary_list("q", ["x", "y", "z"])
    d = fc.categorical_column_with_vocabulary_list("d", ["u", "v", "w"])
    return fc.shared_embedding_columns([d, q], dimension=2, combiner=combiner,
                                       initializer=initializer)


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_one_table_gives_tfs_outputs(combiner):
    recorded = TF[combiner]
    sd, sq = columns(combiner, initializer=lambda shape: torch.tensor(recorded["table"]))
    assert [sd.name, sq.name, sd.shared_embedding_collection_name] == recorded["names"]
    found = {}
    out = fc.input_layer(FEATURES, [sq, sd], cols_to_vars=found)
    assert found[sq][0] is found[sd][0] and tuple(found[sd][0].shape) == (3, 2)
    np.testing.assert_allclose(out.detach().numpy(), recorded["both"], rtol=1e-6, atol=1e-7)


def _two_towers(features, labels, mode):
    sd, sq = columns()
    both = fc.input_layer(features, [sq, sd])
    tower = fc.input_layer(features, [sq], scope="tower")          # TF: a second scope
    est.named_tensor("tower", tower)
    net = est.get_module("net", lambda: torch.nn.Linear(6, 1))
    logits = net(torch.cat([both, tower], 1)).squeeze(-1)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"tower": tower, "both": both})
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.float())
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)))


def test_every_layer_of_a_model_shares_the_table_as_tfs_collection(tmp_path):
    estimator = est.Estimator(_two_towers, model_dir=str(tmp_path))
    estimator.train(lambda: [(FEATURES, np.array([0, 1, 1]))] * 3, max_steps=3)
    names = [n for n in estimator.get_variable_names() if "embedding" in n]
    assert names == list(TF["mean"]["variables"])        # one table, the first layer's
    prediction = next(estimator.predict(lambda: [FEATURES], yield_single_examples=False))
    np.testing.assert_allclose(prediction["tower"], prediction["both"][:, 2:])   # q: 2nd by name
    table = estimator.get_variable_value(names[0])
    assert not np.allclose(table, 0)


def test_a_canned_dnn_names_the_table_as_tf(tmp_path):
    estimator = est.DNNClassifier([4], columns(), model_dir=str(tmp_path))
    estimator.train(lambda: [(FEATURES, np.array([0, 1, 1]))], max_steps=1)
    names = [n for n in estimator.get_variable_names() if not n.startswith("optimizer/")]
    assert sorted(names) == sorted(TF["dnn_variables"])


def test_serialized_and_back():
    sd, _ = columns()
    again = fc.deserialize_feature_column(fc.serialize_feature_column(sd))
    assert again.name == sd.name and again._var_scope_name == "d_q_shared_embedding"


@pytest.mark.parametrize("make, error, match", [
    (lambda: fc.shared_embedding_columns(
        [fc.categorical_column_with_vocabulary_list("q", ["x", "y"]),
         fc.categorical_column_with_identity("i", 2)], 2), ValueError,
     "must have the same type.*IdentityCategoricalColumn does not match"),
    (lambda: fc.shared_embedding_columns(
        [fc.categorical_column_with_identity("a", 3),
         fc.categorical_column_with_identity("b", 5)], 2), ValueError,
     "must have the same number of buckets.*with buckets: 3 does not match .* buckets: 5"),
    (lambda: fc.shared_embedding_columns([fc.numeric_column("n")], 2), ValueError,
     "must be categorical columns.*NumericColumn"),
    (lambda: fc.shared_embedding_columns([], 2), ValueError, "at least one"),
    (lambda: fc.shared_embedding_columns(
        [fc.categorical_column_with_identity("a", 3)], 0), ValueError, "Invalid dimension 0"),
    (lambda: fc.linear_model(FEATURES, columns()), ValueError,
     "linear_model: 'd_shared_embedding' is a shared embedding column"),
])
def test_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def _tower_batches(n_batches, size, seed=0):
    rng = np.random.default_rng(seed)
    return [({"q": rng.choice(["x", "y", "z"], (size, 2)),
              "d": rng.choice(["u", "v", "w"], (size, 1))}, rng.integers(0, 2, size))
            for _ in range(n_batches)]


def _concatenated(batches):
    out = []
    for a, b in zip(batches[::2], batches[1::2]):
        out.append(({k: np.concatenate([a[0][k], b[0][k]]) for k in a[0]},
                    np.concatenate([a[1], b[1]])))
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_replicas_train_the_shared_table_as_one_process(tmp_path):
    """Two towers over one table (the table's module called twice a step)
    under MirroredStrategy: the same weights as one process on the
    concatenated batches."""
    import distribute
    batches = _tower_batches(8, 6)
    config = dict(tf_random_seed=2, save_checkpoints_steps=100)
    two = est.Estimator(_two_towers, config=est.RunConfig(
        model_dir=str(tmp_path / "two"), train_distribute=distribute.MirroredStrategy(
            ["cpu:0", "cpu:1"]), **config))
    two.train(lambda: batches, max_steps=4)
    one = est.Estimator(_two_towers, config=est.RunConfig(model_dir=str(tmp_path / "one"),
                                                          **config))
    one.train(lambda: _concatenated(batches), max_steps=4)
    for name in one.get_variable_names():
        np.testing.assert_allclose(two.get_variable_value(name), one.get_variable_value(name),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_export_over_shared_columns_predicts_as_the_estimator(tmp_path):
    """The export records the shared columns' transform: served tf.Examples
    give what Estimator.predict gives."""
    from estimator.host_transform import example_of
    sd, sq = columns()
    estimator = est.DNNClassifier([4], [sd, sq], model_dir=str(tmp_path / "m"))
    batches = _tower_batches(5, 6)
    estimator.train(lambda: batches, max_steps=5)
    spec = fc.make_parse_example_spec([sd, sq])
    export = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_parsing_serving_input_receiver_fn(spec))
    rows = {"q": [["x", "z"], ["y"], []], "d": [["w"], ["u", "v"], ["v"]]}
    expected = np.stack([p["logistic"] for p in estimator.predict(lambda: [rows])])
    examples = [example_of({k: v[i] for k, v in rows.items()}, spec) for i in range(3)]
    served = est.export.load(export).signatures["predict"](examples=examples)
    np.testing.assert_allclose(served["logistic"].numpy(), expected, rtol=1e-5, atol=1e-6)
