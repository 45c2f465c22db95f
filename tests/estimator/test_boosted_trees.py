"""`BoostedTreesClassifier` / `BoostedTreesRegressor` against TF's
(`tf.estimator.BoostedTrees*`, recorded with TF 2.8, the last with them:
tests/support/fixtures/record_tf_boosted_trees.py): on the rows of
tests/support/bt_data.py (bucketized x1 and x2, an indicator of color; an
out-of-vocabulary color among them), each case trains until it stops as
TF's did, with the same trees (splits, thresholds, gains, leaf values),
evaluation, predictions, feature importances and training summaries:
pruning none/pre/post with l1, l2, tree complexity and min node weight,
two batches a layer over uneven batches, bias centering (converging, and
never converging as the batches' means differ), weights, a label
vocabulary, a regressor."""
import itertools
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from bt_data import CASES, COLORS, X1_BOUNDARIES, X2_BOUNDARIES, batches, rows
from bt_trees import assert_trees_are, tf_trees, trees_of
from paths import FIXTURES
from tf_recorded import assert_evaluation_is_tfs, assert_predictions_are_tfs

fc = est.feature_column
with open(os.path.join(FIXTURES, "tf_boosted_trees.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
RECORDED = sorted(TF["cases"])


def _columns(numeric=False):
    x1, x2 = fc.numeric_column("x1"), fc.numeric_column("x2")
    if not numeric:
        x1, x2 = fc.bucketized_column(x1, X1_BOUNDARIES), fc.bucketized_column(x2, X2_BOUNDARIES)
    color = fc.indicator_column(fc.categorical_column_with_vocabulary_list("color", COLORS))
    return [x1, x2, color]


def _labels(data, kind):
    _, binary, target, words = data
    return {"binary": binary, "binary_words": np.array([["no", "yes"][v] for v in binary]),
            "target": target, "kind": words}[kind]


def _train(name, model_dir, **more):
    kind, arguments, labels, size = CASES[name]
    estimator = getattr(est, kind)(_columns(name.startswith("numeric")), model_dir=model_dir,
                                   config=est.RunConfig(save_summary_steps=1),
                                   **{**arguments, **more})
    train_rows = rows(60, 0)
    train = batches((train_rows[0], _labels(train_rows, labels)), size)
    estimator.train(lambda: itertools.cycle(train), max_steps=30)
    return estimator


def test_every_case_is_recorded():
    assert sorted(CASES) == sorted(TF["cases"])


@pytest.mark.parametrize("name", RECORDED)
def test_the_trees_evaluation_and_predictions_are_tfs(name, tmp_path):
    recorded = TF["cases"][name]
    estimator = _train(name, str(tmp_path / "model"))
    assert estimator.get_variable_value("global_step") == recorded["final_global_step"]
    if "boundaries" in recorded:   # (TF's quantile sketch of x1 and x2)
        boundaries = estimator.get_variable_value("boosted_trees/boundaries")
        for got, expected in zip(boundaries, recorded["boundaries"]):
            assert got[:len(expected)].tolist() == expected
            assert np.isinf(got[len(expected):]).all()
    trees = trees_of(estimator)
    singular = name == "multiclass_no_l2"   # (TF's default l2 0: a singular hessian)
    assert_trees_are(trees, tf_trees(recorded["ensemble"]),
                     ties=name.startswith("multiclass"), singular=singular)
    _, _, labels, _ = CASES[name]
    eval_rows = rows(30, 1)
    assert_evaluation_is_tfs(
        estimator.evaluate(lambda: batches((eval_rows[0], _labels(eval_rows, labels)), 8)),
        recorded["evaluation"])
    few = [(f, None) for f, _ in batches((eval_rows[0], _labels(eval_rows, labels)), 6)[:1]]
    predictions = list(estimator.predict(lambda: few))
    expected = recorded["predictions"]
    if singular:   # (the logits less their mean, and the rest as TF's)
        for p, t in zip(predictions, expected):
            p["logits"] = p["logits"] - p["logits"].mean()
            t["logits"] = list(np.asarray(t["logits"]) - np.mean(t["logits"]))
    assert_predictions_are_tfs(predictions, expected)
    importances = estimator.experimental_feature_importances()
    assert list(importances) == [k for k, _ in recorded["feature_importances"]]
    np.testing.assert_allclose(list(importances.values()),
                               [v for _, v in recorded["feature_importances"]], rtol=1e-6,
                               atol=1e-7)


@pytest.mark.parametrize("name", ["binary", "binary_weighted_vocabulary_center_bias"])
def test_training_summaries_are_tfs(name, tmp_path):
    """TF's ``boosted_trees/ensemble/*`` counts as each step starts and the
    loss, at every step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    _train(name, str(tmp_path / "model"))
    events = EventAccumulator(str(tmp_path / "model")).Reload()
    recorded = TF["cases"][name]["summaries"]
    assert sorted(t for t in events.Tags()["scalars"] if t != "global_step/sec") == \
        sorted(recorded)
    for tag, values in recorded.items():
        got = [[e.step, e.value] for e in events.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in values], tag
        np.testing.assert_allclose([v for _, v in got], [v for _, v in values], rtol=1e-5,
                                   err_msg=tag)


def test_a_finished_ensemble_stays_as_it_is(tmp_path):
    """A later `train` call on a finished model makes one step (TF's global
    step) and stops; TF grew its trailing empty tree a layer in that step
    (here the trees stay as they were: said in the docs)."""
    estimator = _train("binary", str(tmp_path / "model"))
    before = trees_of(estimator)
    train_rows = rows(60, 0)
    estimator.train(lambda: itertools.cycle(batches((train_rows[0], train_rows[1]), 20)),
                    steps=5)
    recorded = TF["cases"]["binary"]["second_train_call"]
    assert estimator.get_variable_value("global_step") == recorded["global_step"]
    assert trees_of(estimator) == before
    assert len(tf_trees(recorded["ensemble"])[-1]) == 3   # (TF's: grown)


def test_a_restart_between_two_batches_of_a_layer_sums_the_layer_anew(tmp_path):
    """As TF, whose accumulators are not in its checkpoints: stopped after
    one of a layer's two batches, the restart sums that layer's batches
    anew (one step more than one run, the same trees on the same batches;
    the attack measured TF's 19 steps for one run's 18), and a checkpoint
    holds the trees, not the statistics (it held 48.6 MB for an indicator
    of 1000 words at depth 6, TF's 1 MB)."""
    features, _, target, _ = rows(60, 0)
    data = [(features, target)]

    def regressor(model_dir):
        return est.BoostedTreesRegressor(_columns(), n_batches_per_layer=2, n_trees=2,
                                         max_depth=2, learning_rate=0.5, center_bias=True,
                                         model_dir=model_dir)
    whole = regressor(str(tmp_path / "whole"))
    whole.train(lambda: itertools.cycle(data), max_steps=50)
    parts = regressor(str(tmp_path / "parts"))
    for last in (3, 5, 50):   # (3: the first batch of a layer; 5: a layer's last)
        parts.train(lambda: itertools.cycle(data), max_steps=last)
    assert parts.get_variable_value("global_step") == \
        whole.get_variable_value("global_step") + 1
    assert_trees_are(trees_of(parts), trees_of(whole))
    assert not any(n.endswith("stats") for n in parts.get_variable_names())


def test_tfs_refusals_and_what_is_not_built_here():
    for key, arguments in (("pruning_mode", dict(pruning_mode="bogus", tree_complexity=0.1)),
                           ("pruning_without_complexity", dict(pruning_mode="pre")),
                           ("complexity_without_pruning", dict(tree_complexity=0.1)),
                           ("center_bias_multiclass", dict(n_classes=3, center_bias=True))):
        with pytest.raises(ValueError) as raised:
            est.BoostedTreesClassifier(_columns(), n_batches_per_layer=1, n_trees=1,
                                       max_depth=1, **arguments)
        assert str(raised.value) == TF["errors"][key]["message"], key
    color = fc.categorical_column_with_vocabulary_list("color", COLORS)
    with pytest.raises(ValueError, match="BoostedTrees takes numeric_column, bucketized_column, "
                                         "indicator_column and categorical columns .one id an "
                                         "example., got EmbeddingColumn 'color_embedding'"):
        est.BoostedTreesClassifier([fc.embedding_column(color, 2)], n_batches_per_layer=1)
    with pytest.raises(ValueError, match="only support Dense column with rank of 1"):
        est.BoostedTreesClassifier([fc.numeric_column("x", shape=(2, 2))],
                                   n_batches_per_layer=1)
    with pytest.raises(ValueError, match=r"quantile_sketch_epsilon must be in \(0, 1\)"):
        est.BoostedTreesClassifier(_columns(), n_batches_per_layer=1, quantile_sketch_epsilon=0)
    with pytest.raises(NotImplementedError, match="one label dimension only"):
        est.BoostedTreesRegressor(_columns(), n_batches_per_layer=1, label_dimension=2)
    with pytest.raises(ValueError, match="n_trees must be a positive int, got 0"):
        est.BoostedTreesRegressor(_columns(), n_batches_per_layer=1, n_trees=0)
    with pytest.raises(ValueError, match="Expected learning_rate > 0, received: 0"):
        est.BoostedTreesRegressor(_columns(), n_batches_per_layer=1, learning_rate=0)
    with pytest.raises(ValueError, match="l2_regularization must be a non-negative number"):
        est.BoostedTreesRegressor(_columns(), n_batches_per_layer=1, l2_regularization=-1.0)


@pytest.mark.parametrize("name", ["binary_weighted_vocabulary_center_bias", "numeric_binary",
                                  "multiclass"])
def test_a_boosted_trees_classifier_exports_and_serves_as_it_predicts(name, tmp_path):
    """Bucketized, numeric (the sketch's boundaries in the program) and
    three-class trees: served scores equal predict's and TF's."""
    from estimator import serving
    estimator = _train(name, str(tmp_path / "model"))
    features, _, _, _ = rows(30, 1)
    raw = {"x1": torch.tensor(features["x1"][:2], dtype=torch.float32),
           "x2": torch.tensor(features["x2"][:2], dtype=torch.float32),
           "color": features["color"][:2]}
    path = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(raw))
    few = {k: v[:6] for k, v in features.items() if k != "w"}
    instances = [{"x1": [float(few["x1"][i, 0])], "x2": [float(few["x2"][i, 0])],
                  "color": [str(few["color"][i, 0])]} for i in range(6)]
    served = serving.Model(path).predict({"instances": instances})["predictions"]
    predicted = list(estimator.predict(lambda: [(few, None)]))
    np.testing.assert_allclose([s["scores"] for s in served],
                               [p["probabilities"] for p in predicted], atol=1e-6)
    assert TF["cases"][name]["predictions"][0]["probabilities"] == pytest.approx(
        served[0]["scores"], abs=1e-6)


def test_a_larger_n_trees_grows_more_trees_after_a_checkpoints(tmp_path):
    """TF's ensemble is one resource of any size: a model restored with a
    larger n_trees grows the trees it lacks after the checkpoint's (the same
    trees as one run to that many), and one built with other n_trees and
    max_depth (the defaults) evaluates a checkpoint's trees as they are."""
    _, arguments, labels, _ = CASES["binary"]
    data = rows(60, 0)
    whole = batches((data[0], _labels(data, labels)), 60)

    def train(model_dir, **more):
        estimator = est.BoostedTreesClassifier(_columns(), model_dir=model_dir,
                                               **{**arguments, **more})
        estimator.train(lambda: itertools.cycle(whole), max_steps=30)
        return estimator
    once = train(str(tmp_path / "once"))
    train(str(tmp_path / "twice"), n_trees=2)
    twice = train(str(tmp_path / "twice"))
    assert twice.get_variable_value("global_step") == once.get_variable_value("global_step")
    assert_trees_are(trees_of(twice), trees_of(once))
    default = est.BoostedTreesClassifier(_columns(), n_batches_per_layer=1,
                                         model_dir=str(tmp_path / "once"))
    few = {k: v[:6] for k, v in data[0].items()}
    np.testing.assert_allclose([p["probabilities"] for p in default.predict(lambda: [(few, None)])],
                               [p["probabilities"] for p in once.predict(lambda: [(few, None)])],
                               atol=1e-7)


@pytest.mark.slow
def test_two_replicas_grow_the_trees_of_one_process(tmp_path):
    """Each replica's half of each batch: the statistics are the replicas'
    mean, so the trees are one process's on the whole batches."""
    import distribute
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    _, arguments, _, _ = CASES["binary_weighted_vocabulary_center_bias"]
    features, binary, _, _ = rows(60, 0)
    whole = batches((features, np.array([["no", "yes"][v] for v in binary])), 20)
    halves = [part for f, y in whole for part in batches((f, y), 10)]
    two = est.BoostedTreesClassifier(_columns(), config=est.RunConfig(
        model_dir=str(tmp_path / "two"), train_distribute=strategy), **arguments)
    two.train(lambda: itertools.cycle(halves), max_steps=30)
    one = est.BoostedTreesClassifier(_columns(), model_dir=str(tmp_path / "one"), **arguments)
    one.train(lambda: itertools.cycle(whole), max_steps=30)
    assert two.get_variable_value("global_step") == one.get_variable_value("global_step")
    assert_trees_are(trees_of(two), trees_of(one))


@pytest.mark.slow
def test_two_replicas_sketch_numeric_columns_as_one_process(tmp_path):
    """Each replica's quantile summaries of its half, merged in replica
    order: with fewer distinct values than num_quantiles the boundaries are
    every value, one process's; the sketch's step is not counted on either."""
    import distribute
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    _, arguments, _, _ = CASES["numeric_binary"]
    features, binary, _, _ = rows(60, 0)
    whole = batches((features, binary), 20)
    halves = [part for f, y in whole for part in batches((f, y), 10)]
    two = est.BoostedTreesClassifier(_columns(numeric=True), config=est.RunConfig(
        model_dir=str(tmp_path / "two"), train_distribute=strategy), **arguments)
    two.train(lambda: itertools.cycle(halves), max_steps=30)
    one = est.BoostedTreesClassifier(_columns(numeric=True), model_dir=str(tmp_path / "one"),
                                     **arguments)
    one.train(lambda: itertools.cycle(whole), max_steps=30)
    assert one.get_variable_value("global_step") == TF["cases"]["numeric_binary"][
        "final_global_step"]
    assert two.get_variable_value("global_step") == one.get_variable_value("global_step")
    np.testing.assert_array_equal(two.get_variable_value("boosted_trees/boundaries"),
                                  one.get_variable_value("boosted_trees/boundaries"))
    assert_trees_are(trees_of(two), trees_of(one))


def test_nan_values_are_left_out_of_the_sketch_and_bucket_0(tmp_path):
    """BoostedTrees attack: a NaN in a numeric column's first batch made a NaN
    boundary and the first save failed saying the model diverged. NaN is
    left out of the sketch (TF's boundaries held it, out of order) and a
    NaN value is bucket 0, as TF's."""
    x = np.array([[1.0], [2.0], [np.nan], [4.0], [5.0], [np.nan], [7.0], [8.0]], np.float32)
    y = np.array([0, 0, 1, 0, 1, 1, 1, 1])
    model = est.BoostedTreesClassifier([fc.numeric_column("x")], n_batches_per_layer=1,
                                       n_trees=2, max_depth=2, learning_rate=0.5,
                                       model_dir=str(tmp_path / "model"))
    model.train(lambda: itertools.repeat(({"x": x}, y)), max_steps=20)
    count = int(model.get_variable_value("boosted_trees/boundary_count")[0])
    assert model.get_variable_value("boosted_trees/boundaries")[0, :count].tolist() == \
        [1.0, 2.0, 4.0, 5.0, 7.0, 8.0]
    logits = [p["logits"][0] for p in model.predict(lambda: [({"x": x}, None)])]
    assert logits[2] == logits[5] == logits[0]   # (NaN: bucket 0, with 1.0)


def test_a_vocabulary_of_numpy_ints_exports(tmp_path):
    """BoostedTrees attack (TF's tutorial: sorted(df[c].unique())): numpy int64
    vocabulary entries trained, but an export failed writing them as JSON."""
    column = fc.categorical_column_with_vocabulary_list("sib", sorted(np.array([0, 1, 8, 2])))
    assert all(type(v) is int for v in column.vocabulary_list)
    columns = [fc.numeric_column("age"), fc.indicator_column(column)]
    model = est.BoostedTreesClassifier(columns, n_batches_per_layer=1, n_trees=1, max_depth=1,
                                       model_dir=str(tmp_path / "model"))
    features = {"sib": np.array([0, 1, 0, 2, 8, 7]),
                "age": np.array([22.0, 38.0, 26.0, 35.0, 54.0, 2.0])}
    model.train(lambda: itertools.repeat((features, np.array([0, 1, 1, 1, 0, 0]))),
                max_steps=5)
    assert model.export_saved_model(str(tmp_path / "export"),
                                    est.export.build_parsing_serving_input_receiver_fn(
                                        fc.make_parse_example_spec(columns)))
