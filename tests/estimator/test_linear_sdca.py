"""est.experimental.LinearSDCA (tf.estimator.experimental.LinearSDCA) under
LinearRegressor and LinearClassifier, against TF 2.15's recorded by
tests/support/fixtures/record_tf_linear_sdca.py: the weights and TF's
`_unshrunk` slots after each train call (the second resuming from the
checkpoint, its example table included), the evaluation and predictions.
Batches of one example step by step (TF's order within a batch is drawn
from std::random_device), larger batches at the optimum (150 epochs)."""
import glob
import json
import os

import numpy as np
import pytest
import torch

import distribute
import estimator as est
from hooks.event_files import read_scalars
from paths import FIXTURES

TF = json.load(open(os.path.join(FIXTURES, "tf_linear_sdca.json")))
DATA = TF["data"]
CASES = sorted(k for k in TF if k not in ("data", "warm_started"))
fc = est.feature_column


def columns(which):
    bucketized = fc.bucketized_column(fc.numeric_column("s"), [0.0, 1.0])
    made = {"x": fc.numeric_column("x", shape=(2,)),
            "c": fc.categorical_column_with_vocabulary_list("c", ["a", "b", "c", "d"]),
            "s": bucketized, "h": fc.categorical_column_with_hash_bucket("h", 5),
            "k": fc.crossed_column(["h", bucketized], 7)}
    return [made[w] for w in which]


def features(rows):
    return {"id": np.array(DATA["id"])[rows], "x": np.array(DATA["x"], np.float32)[rows],
            "c": np.array(DATA["c"])[rows], "s": np.array(DATA["s"], np.float32)[rows][:, None],
            "h": np.array(DATA["h"])[rows], "w": np.array(DATA["w"], np.float32)[rows][:, None]}


def labels(kind):
    return np.array(DATA["y_reg"] if kind == "regressor" else DATA["y_cls"], np.float32)[:, None]


def input_fn(kind, batch):
    """TF's recorded input: batches in order, repeated (each call from the start)."""
    def fn():
        y, start = labels(kind), 0
        while True:
            rows = np.arange(start, start + batch) % 12
            yield features(rows), y[rows]
            start += batch
    return fn


def one_pass(kind):
    return lambda: iter([(features(np.arange(12)), labels(kind))])


def estimator(case, model_dir, **kwargs):
    sdca = est.experimental.LinearSDCA(
        "id", num_loss_partitions=case["partitions"],
        symmetric_l1_regularization=case["l1"], symmetric_l2_regularization=case["l2"])
    make = est.LinearRegressor if case["kind"] == "regressor" else est.LinearClassifier
    return make(columns(case["columns"]), model_dir=str(model_dir), weight_column="w",
                optimizer=sdca, **kwargs)


def ours_name(tf_name):
    """TF1's slot linear/linear/linear_model/x/weights/part_0_unshrunk is
    linear/sdca/x/weights_unshrunk here."""
    if tf_name.endswith("_unshrunk"):
        return tf_name.replace("linear/linear/linear_model/", "linear/sdca/").replace(
            "/part_0_unshrunk", "_unshrunk")
    return tf_name


@pytest.mark.parametrize("name", CASES)
def test_weights_evaluation_and_predictions_are_tfs(name, tmp_path):
    case = TF[name]
    converged = case["batch"] > 1
    atol = 3e-5 if converged else 1e-6
    e = estimator(case, tmp_path, config=est.RunConfig(tf_random_seed=1))
    for steps, after in zip(case["calls"], case["after"]):
        e.train(input_fn(case["kind"], case["batch"]), steps=steps)
        for tf_name, value in after.items():
            np.testing.assert_allclose(
                np.reshape(e.get_variable_value(ours_name(tf_name)), -1), np.reshape(value, -1),
                atol=atol, rtol=0, err_msg=tf_name)
    result = e.evaluate(one_pass(case["kind"]))
    for key, value in case["evaluation"].items():
        assert result[key] == pytest.approx(value, rel=1e-4 if converged else 1e-5,
                                            abs=1e-6), key
    key = "predictions" if case["kind"] == "regressor" else "logistic"
    predicted = [p[key] for p in e.predict(one_pass(case["kind"]))]
    np.testing.assert_allclose(np.reshape(predicted, -1), np.reshape(case["predictions"], -1),
                               atol=10 * atol, rtol=0)


def test_tfs_summaries_and_the_duality_gap_closing(tmp_path):
    """TF's training summaries (linear/approximate_duality_gap, examples_seen,
    bias, fraction_of_zero_weights, loss, average_loss); the gap is NaN before
    any example is in the table and near 0 at the optimum."""
    case = TF["classifier_converged"]
    e = estimator(case, tmp_path, config=est.RunConfig(save_summary_steps=1))
    e.train(input_fn(case["kind"], case["batch"]), steps=450)
    scalars = read_scalars(glob.glob(os.path.join(str(tmp_path), "events.out.tfevents*"))[0])
    tags = set().union(*(s.keys() for s in scalars.values()))
    assert sorted(t for t in tags if t != "global_step/sec") == case["summary_tags"]
    assert np.isnan(scalars[1]["linear/approximate_duality_gap"])
    assert scalars[1]["linear/examples_seen"] == 0 and scalars[4]["linear/examples_seen"] == 12
    assert scalars[4]["linear/approximate_duality_gap"] > 0.01
    assert abs(scalars[450]["linear/approximate_duality_gap"]) < 1e-4


def test_a_run_repeats_under_its_seed_and_an_id_seen_again_continues_from_its_dual(tmp_path):
    """Batches of 4 in torch's random order (TF's: std::random_device): the
    same seed, the same weights; a batch holding an id twice keeps one row."""
    case = TF["classifier_converged"]
    weights = []
    for run in range(2):
        e = estimator(case, tmp_path / str(run), config=est.RunConfig(tf_random_seed=7))
        e.train(input_fn(case["kind"], 4), steps=5)
        weights.append(e.get_variable_value("linear/linear_model/x/weights"))
    np.testing.assert_array_equal(weights[0], weights[1])
    assert e.get_variable_value("linear/sdca/examples_seen") == 12

    rows = np.array([0, 1, 0, 2])
    e = estimator(case, tmp_path / "dup")
    e.train(lambda: iter([(features(rows), labels("classifier")[rows])]), steps=1)
    assert e.get_variable_value("linear/sdca/examples_seen") == 3


def test_an_export_serves_the_sdca_model(tmp_path):
    case = TF["classifier_one_by_one"]
    e = estimator(case, tmp_path / "m")
    e.train(input_fn(case["kind"], 1), steps=24)
    rows = features(np.arange(12))
    raw = {"x": torch.from_numpy(rows["x"]), "c": rows["c"]}
    path = e.export_saved_model(str(tmp_path / "export"),
                                est.export.build_raw_serving_input_receiver_fn(raw))
    out = est.export.load(path).signatures["predict"](**raw)
    np.testing.assert_allclose(np.reshape(out["logistic"], -1),
                               np.reshape(case["predictions"], -1), atol=1e-5)


def test_a_warm_start_continues_from_the_loaded_model(tmp_path):
    """From an SDCA model: TF's '.*' warm start loads its slots too (l1 0:
    the slots are the weights), 3 steps on as TF's. From an Ftrl model (TF:
    its slots are not found): the slots are set to give the loaded weights;
    they were left zero and the first step replaced every weight by their
    shrunk zeros, the loaded model gone silently (SDCA attack)."""
    case = TF["classifier_no_l1"]
    estimator(case, tmp_path / "sdca").train(input_fn("classifier", 1), steps=12)
    warm = estimator(case, tmp_path / "warm", warm_start_from=str(tmp_path / "sdca"))
    warm.train(input_fn("classifier", 1), steps=3)
    for name, value in TF["warm_started"].items():
        np.testing.assert_allclose(np.reshape(warm.get_variable_value(name), -1),
                                   np.reshape(value, -1), atol=1e-6, err_msg=name)

    ftrl = est.LinearClassifier(columns("xc"), model_dir=str(tmp_path / "ftrl"),
                                weight_column="w")
    ftrl.train(input_fn("classifier", 4), steps=30)
    loaded = ftrl.get_variable_value("linear/linear_model/c/weights").reshape(-1)
    case = dict(case, l1=0.1)
    warm = estimator(case, tmp_path / "warm2", warm_start_from=str(tmp_path / "ftrl"))
    rows = np.array([3])   # (c "d" alone: the weights of "a", "b", "c" untouched)
    warm.train(lambda: iter([(features(rows), labels("classifier")[rows])]), steps=1)
    now = warm.get_variable_value("linear/linear_model/c/weights").reshape(-1)
    np.testing.assert_allclose(now[:3], loaded[:3], atol=1e-7)
    assert now[3] != loaded[3]
    shrunk = warm.get_variable_value("linear/sdca/c/weights_unshrunk")[:3]
    np.testing.assert_allclose(np.sign(shrunk) * np.maximum(np.abs(shrunk) - 0.1 / 3.0, 0),
                               loaded[:3], atol=1e-6)


def test_a_batch_holding_an_id_twice_is_warned(tmp_path, caplog):
    """Batches crossing the end of the data (numpy_input_fn, pandas_input_fn
    with epochs): TF's and this SDCA settle off the optimum, silently before
    (SDCA attack: 3.6e-2 off with batches of 32 over 150 rows)."""
    case = TF["classifier_no_l1"]
    e = estimator(case, tmp_path)
    e.train(input_fn("classifier", 4), steps=3)
    assert "holds an example id more than once" not in caplog.text
    e.train(input_fn("classifier", 14), steps=2)   # (the 12 examples and 2 again)
    assert "a batch holds an example id more than once (12 ids for 14 examples)" in caplog.text
    assert caplog.text.count("holds an example id") == 1


BAD = [
    (lambda: est.LinearClassifier([fc.numeric_column("x", shape=(2,))], n_classes=3,
                                  optimizer=est.experimental.LinearSDCA("id")),
     "LinearSDCA cannot be used in a multi-class setting"),
    (lambda: est.LinearRegressor([fc.numeric_column("x", shape=(2,))], label_dimension=2,
                                 optimizer=est.experimental.LinearSDCA("id")),
     "LinearSDCA can only be used with one-dimensional label"),
    (lambda: est.LinearClassifier([fc.numeric_column("x", shape=(2,))], sparse_combiner="mean",
                                  optimizer=est.experimental.LinearSDCA("id")),
     'sparse_combiner must be "sum" when optimizer is a LinearSDCA object'),
    (lambda: est.LinearEstimator(est.PoissonRegressionHead(), [fc.numeric_column("x")],
                                 optimizer=est.experimental.LinearSDCA("id")),
     "unsupported head type PoissonRegressionHead"),
    (lambda: est.LinearClassifier([fc.indicator_column(fc.categorical_column_with_identity(
        "i", 3))], optimizer=est.experimental.LinearSDCA("id")),
     "'i_indicator' is an indicator_column"),
    (lambda: est.LinearClassifier([fc.numeric_column("m", shape=(2, 2))],
                                  optimizer=est.experimental.LinearSDCA("id")),
     r"'m' has shape \(2, 2\) \(TF: Column NumericColumn has rank 2"),
    (lambda: est.LinearClassifier([fc.embedding_column(fc.categorical_column_with_identity(
        "i", 3), 2)], optimizer=est.experimental.LinearSDCA("id")),
     "LinearSDCA does not support column type EmbeddingColumn here"),
    (lambda: est.DNNClassifier([8], [fc.numeric_column("x")],
                               optimizer=est.experimental.LinearSDCA("id")),
     "LinearSDCA trains LinearClassifier, LinearRegressor and LinearEstimator only"),
    (lambda: est.DNNLinearCombinedClassifier(
        linear_feature_columns=[fc.numeric_column("x")], dnn_feature_columns=[
            fc.numeric_column("x")], dnn_hidden_units=[4],
        linear_optimizer=est.experimental.LinearSDCA("id")),
     "LinearSDCA trains LinearClassifier, LinearRegressor and LinearEstimator only"),
    (lambda: est.experimental.LinearSDCA("id", symmetric_l2_regularization="2.0"),
     "symmetric_l2_regularization must be a number, got '2.0'"),
    (lambda: est.experimental.LinearSDCA("id", symmetric_l2_regularization=0.0),
     "symmetric_l2_regularization should be positive"),
    (lambda: est.experimental.LinearSDCA("id", symmetric_l1_regularization=-1.0),
     "symmetric_l1_regularization should be non-negative"),
    (lambda: est.experimental.LinearSDCA("id", adaptive=True), "adaptive=True"),
    (lambda: est.experimental.LinearSDCA(None), "example_id_column must be the name"),
    (lambda: est.experimental.LinearSDCA("id", num_loss_partitions=0),
     "num_loss_partitions must be a positive int, got 0"),
]


@pytest.mark.parametrize("make, message", BAD)
def test_misuse_is_refused_with_tfs_message(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_numpy_integers_are_partitions():
    assert est.experimental.LinearSDCA("id", num_loss_partitions=np.int64(2)
                                       )._num_loss_partitions == 2


def test_inputs_sdca_cannot_train_are_refused(tmp_path):
    case = TF["classifier_no_l1"]
    e = estimator(case, tmp_path / "a")
    rows = np.arange(2)
    no_ids = {k: v for k, v in features(rows).items() if k != "id"}
    with pytest.raises(ValueError, match="the features have no 'id'"):
        e.train(lambda: iter([(no_ids, labels("classifier")[rows])]), steps=1)
    with pytest.raises(ValueError, match="Only labels of 0.0 or 1.0 are supported right now. "
                                         "Found example with label: 0.5"):
        e.train(lambda: iter([(features(rows), np.array([[0.5], [1.0]], np.float32))]),
                steps=1)
    odd = dict(features(rows), id=np.array([1.5, 2.5]))
    with pytest.raises(ValueError, match=r"example ids must be strings or integers, got 1.5"):
        e.train(lambda: iter([(odd, labels("classifier")[rows])]), steps=1)
    assert not glob.glob(str(tmp_path / "a" / "model.ckpt-*"))   # (nothing trained)


def test_integer_ids_and_torch_inputs_train_as_strings_do(tmp_path):
    case = TF["classifier_no_l1"]
    out = []
    for i, ids in enumerate([np.array(DATA["id"]), torch.arange(12)]):
        e = estimator(case, tmp_path / str(i))

        def fn(ids=ids):
            y = labels("classifier")
            for r in range(12):
                f = features(np.array([r]))
                f["id"] = ids[r:r + 1]
                f["x"] = torch.from_numpy(f["x"])
                yield f, y[r:r + 1]
        e.train(fn, steps=12)
        out.append(e.get_variable_value("linear/linear_model/x/weights"))
    np.testing.assert_allclose(out[0], out[1], atol=0)
    np.testing.assert_allclose(np.reshape(out[0], -1), np.reshape(
        case["after"][0]["linear/linear_model/x/weights"], -1), atol=1e-6)


@pytest.mark.slow
def test_two_replicas_keep_one_table_and_reach_tfs_optimum(tmp_path):
    """Each replica steps its batch with num_loss_partitions 2 (TF's setting
    for two workers) and applies every replica's rows and changes: one table
    and the same weights on both (the chief's checkpoint holds every
    example, restored on both), at TF's optimum. They were refused."""
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    case = dict(TF["classifier_converged"], partitions=2)
    e = estimator(case, tmp_path, config=est.RunConfig(train_distribute=strategy))
    for _ in range(2):   # (each step: 4 examples a replica; the second call restores)
        e.train(input_fn(case["kind"], 4), steps=300)
    assert e.get_variable_value("linear/sdca/examples_seen") == 12
    for tf_name, value in case["after"][-1].items():
        np.testing.assert_allclose(
            np.reshape(e.get_variable_value(ours_name(tf_name)), -1), np.reshape(value, -1),
            atol=2e-5, rtol=0, err_msg=tf_name)


def test_string_labels_through_a_vocabulary_train_as_class_ids(tmp_path):
    """TF fails casting them (Cast string to float is not supported)."""
    case = TF["classifier_no_l1"]
    words = np.array(["no", "yes"])
    e = est.LinearClassifier(columns("xc"), model_dir=str(tmp_path), weight_column="w",
                             label_vocabulary=["no", "yes"], optimizer=est.experimental.LinearSDCA(
                                 "id", symmetric_l2_regularization=case["l2"]))
    y = labels("classifier").astype(np.int64)
    e.train(lambda: ((features(np.array([r])), words[y[r]]) for r in range(12)), steps=12)
    np.testing.assert_allclose(
        np.reshape(e.get_variable_value("linear/linear_model/x/weights"), -1),
        np.reshape(case["after"][0]["linear/linear_model/x/weights"], -1), atol=1e-6)
