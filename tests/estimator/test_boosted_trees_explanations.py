"""`experimental_predict_with_explanations` (directional feature contributions)
of the boosted trees and `BoostedTreesEstimator` against TF's (recorded with
TF 2.8, the last with them: tests/support/fixtures/
record_tf_boosted_trees_explanations.py), on the rows of tests/support/bt_data.py:
classifiers and regressors with bucketized, indicator, numeric (sketched)
and two-valued numeric columns, the estimator under TF2's heads, TF's
`predict_keys` handling and its refusals."""
import itertools
import json
import logging
import os

import numpy as np
import pytest

import estimator as est
from bt_data import COLORS, KINDS, X1_BOUNDARIES, X2_BOUNDARIES, batches, rows
from bt_trees import assert_trees_are, tf_trees, trees_of
from paths import FIXTURES
from tf_recorded import assert_evaluation_is_tfs, assert_predictions_are_tfs

fc = est.feature_column
with open(os.path.join(FIXTURES, "tf_boosted_trees_explanations.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
TRAINED = sorted(n for n, c in TF["cases"].items() if "train_error" not in c)

# BoostedTreesEstimator's heads: TF's recorded head and ours (TF's private v1
# binary head is the classifier's, our BinaryClassHead's training and predictions)
HEADS = {
    "estimator_binary_class_head": lambda: est.BinaryClassHead(),
    "estimator_v1_binary_head": lambda: est.BinaryClassHead(),
    "estimator_regression_head": lambda: est.RegressionHead(),
    "estimator_regression_head_no_center_bias": lambda: est.RegressionHead(),
    "estimator_multi_class_head": lambda: est.MultiClassHead(3, label_vocabulary=KINDS),
    "estimator_multi_class_head_center_bias":
        lambda: est.MultiClassHead(3, label_vocabulary=KINDS),
}


def _columns(kind):
    color = fc.indicator_column(fc.categorical_column_with_vocabulary_list("color", COLORS))
    if kind == "numeric_two_dims":
        return [fc.numeric_column("xs", shape=(2,)), color]
    x1, x2 = fc.numeric_column("x1"), fc.numeric_column("x2")
    if kind == "bucketized":
        x1, x2 = fc.bucketized_column(x1, X1_BOUNDARIES), fc.bucketized_column(x2, X2_BOUNDARIES)
    return [x1, x2, color]


def _rows(n, seed, record):
    """(features, labels) of the case's columns and labels."""
    features, binary, target, kind = rows(n, seed)
    if record["columns"] == "numeric_two_dims":
        features = dict(features, xs=np.concatenate([features["x1"], features["x2"]], 1))
    return features, {"binary": binary, "target": target, "kind": kind}[record["labels"]]


def _build(name, model_dir, **more):
    record = TF["cases"][name]
    arguments = dict(record["arguments"], **more)
    if record["estimator"] == "BoostedTreesEstimator":
        arguments["head"] = HEADS[name]()
    return getattr(est, record["estimator"])(
        _columns(record["columns"]), model_dir=model_dir,
        config=est.RunConfig(save_summary_steps=1000), **arguments)


def _train(name, model_dir):
    record = TF["cases"][name]
    estimator = _build(name, model_dir)
    train = batches(_rows(60, 0, record), record["batch_size"])
    estimator.train(lambda: itertools.cycle(train), max_steps=record["max_steps"])
    return estimator


def _few(record):
    return [(f, None) for f, _ in batches(_rows(30, 1, record), 6)[:1]]


def _assert_explanations_are(got, recorded):
    """Each example's keys, head predictions, bias and contributions (their
    names in TF's order, largest change first) as TF's."""
    assert len(got) == len(recorded)
    for ours, theirs in zip(got, recorded):
        assert set(ours) == set(theirs)
        assert isinstance(ours["dfc"], dict)
        assert list(ours["dfc"]) == [name for name, _ in theirs["dfc"]]
        np.testing.assert_allclose(list(ours["dfc"].values()), [v for _, v in theirs["dfc"]],
                                   rtol=1e-5, atol=2e-7)
        assert ours["bias"] == pytest.approx(theirs["bias"], rel=1e-6)
        assert_predictions_are_tfs([{k: v for k, v in ours.items() if k not in ("bias", "dfc")}],
                                   [{k: v for k, v in theirs.items() if k not in ("bias", "dfc")}])


@pytest.mark.parametrize("name", TRAINED)
def test_the_trees_predictions_and_explanations_are_tfs(name, tmp_path):
    record = TF["cases"][name]
    estimator = _train(name, str(tmp_path / "model"))
    assert estimator.get_variable_value("global_step") == record["final_global_step"]
    assert_trees_are(trees_of(estimator), tf_trees(record["ensemble"]),
                     ties=name.startswith("estimator_multi_class"), negligible=1e-6)
    eval_features, eval_labels = _rows(30, 1, record)
    evaluation = estimator.evaluate(lambda: batches((eval_features, eval_labels), 8))
    if name != "estimator_v1_binary_head":   # (its precision-recall AUC: TF1's, not TF2's)
        assert_evaluation_is_tfs(evaluation, record["evaluation"])
    predictions = list(estimator.predict(lambda: _few(record)))
    assert_predictions_are_tfs(predictions, record["predictions"])
    importances = estimator.experimental_feature_importances()
    assert list(importances) == [k for k, _ in record["feature_importances"]]
    np.testing.assert_allclose(list(importances.values()),
                               [v for _, v in record["feature_importances"]], rtol=1e-5,
                               atol=1e-7)
    recorded = record["explanations"]
    if name == "estimator_binary_class_head":
        # TF fails there ('BinaryClassHead' object has no attribute '_inverse_link_fn'): ours
        # explains it as the classifier of the same trees
        assert recorded["type"] == "AttributeError"
        recorded = TF["cases"]["classifier_bucketized"]["explanations"]
    if isinstance(recorded, dict):   # (TF's refusal)
        with pytest.raises(ValueError) as raised:
            next(estimator.experimental_predict_with_explanations(lambda: _few(record)))
        assert str(raised.value) == recorded["message"]
        return
    explained = list(estimator.experimental_predict_with_explanations(lambda: _few(record)))
    _assert_explanations_are(explained, recorded)
    for ours, prediction in zip(explained, predictions):   # (bias + sum(dfc): the prediction)
        value = prediction["probabilities"][1] if "probabilities" in prediction \
            else prediction["predictions"][0]
        assert ours["bias"] + sum(ours["dfc"].values()) == pytest.approx(value, abs=1e-6)
    for keyed in record.get("explanations_with_predict_keys", {}).values():
        got = list(estimator.experimental_predict_with_explanations(
            lambda: _few(record), predict_keys=keyed["predict_keys"]))
        _assert_explanations_are(got, keyed["result"])


def test_the_explanations_follow_each_examples_path(tmp_path):
    """A classifier's contributions are the changes of the sigmoid of the
    running logit along the path, summed per feature: the first tree's
    measured from the bias, the later trees' from their predecessors' sum
    (TF's kernel's, recorded: logits_path and feature_ids)."""
    record = TF["cases"]["classifier_bucketized_depth3"]
    estimator = _train("classifier_bucketized_depth3", str(tmp_path / "model"))
    names = record["feature_col_names"]
    explained = estimator.experimental_predict_with_explanations(lambda: _few(record))
    for ours, debug in zip(explained, record["debug_outputs"]):
        path = 1 / (1 + np.exp(-np.asarray(debug["logits_path"], np.float64)))
        expected = dict.fromkeys(names, 0.0)
        for feature, change in zip(debug["feature_ids"], np.diff(path)):
            expected[names[feature]] += change
        assert ours["bias"] == pytest.approx(path[0], rel=1e-6)
        assert dict(ours["dfc"]) == pytest.approx(expected, abs=2e-7)


def test_explanations_at_a_checkpoint_and_with_hooks(tmp_path):
    """`checkpoint_path` explains that checkpoint's trees; hooks run."""
    record = TF["cases"]["regressor_bucketized"]
    estimator = _build("regressor_bucketized", str(tmp_path / "model"))
    train = batches(_rows(60, 0, record), 60)
    estimator.train(lambda: itertools.cycle(train), max_steps=3)
    early = est.checkpoint.latest_checkpoint(estimator.model_dir)
    estimator.train(lambda: itertools.cycle(train), max_steps=record["max_steps"])

    class Counting(est.SessionRunHook):
        runs = 0

        def after_run(self, run_context, run_values):
            Counting.runs += 1
    at_early = list(estimator.experimental_predict_with_explanations(
        lambda: _few(record), checkpoint_path=early, hooks=[Counting()]))
    assert Counting.runs == 1
    predictions = list(estimator.predict(lambda: _few(record), checkpoint_path=early))
    for ours, prediction in zip(at_early, predictions):
        assert ours["predictions"] == pytest.approx(prediction["predictions"])
        assert ours["bias"] + sum(ours["dfc"].values()) == pytest.approx(
            prediction["predictions"][0], abs=1e-6)
    latest = list(estimator.experimental_predict_with_explanations(lambda: _few(record)))
    assert [p["dfc"] for p in latest] != [p["dfc"] for p in at_early]


def _base(**more):
    return dict(n_batches_per_layer=1, n_trees=1, max_depth=1, **more)


# TF's refusals (recorded), each: how ours is built, and where TF's is raised
OURS = {
    "classifier_center_bias_false":
        lambda: est.BoostedTreesClassifier(_columns("bucketized"), **_base()),
    "classifier_n_classes_3":
        lambda: est.BoostedTreesClassifier(_columns("bucketized"), n_classes=3, **_base()),
    "classifier_n_classes_3_center_bias":
        lambda: est.BoostedTreesClassifier(_columns("bucketized"), n_classes=3,
                                           center_bias=True, **_base()),
    "regressor_center_bias_false":
        lambda: est.BoostedTreesRegressor(_columns("bucketized"), **_base()),
    "estimator_multi_class_head":
        lambda: est.BoostedTreesEstimator(_columns("bucketized"), head=est.MultiClassHead(3),
                                          **_base()),
    "estimator_logistic_regression_head_center_bias":
        lambda: est.BoostedTreesEstimator(_columns("bucketized"),
                                          head=est.LogisticRegressionHead(), center_bias=True,
                                          **_base()),
    "estimator_logistic_regression_head":
        lambda: est.BoostedTreesEstimator(_columns("bucketized"),
                                          head=est.LogisticRegressionHead(), **_base()),
    "estimator_poisson_regression_head_center_bias":
        lambda: est.BoostedTreesEstimator(_columns("bucketized"),
                                          head=est.PoissonRegressionHead(), center_bias=True,
                                          **_base()),
    "estimator_poisson_regression_head":
        lambda: est.BoostedTreesEstimator(_columns("bucketized"),
                                          head=est.PoissonRegressionHead(), **_base()),
    "estimator_binary_class_head":
        lambda: est.BoostedTreesEstimator(_columns("bucketized"), head=est.BinaryClassHead(),
                                          **_base()),
    "estimator_regression_head":
        lambda: est.BoostedTreesEstimator(_columns("bucketized"), head=est.RegressionHead(),
                                          **_base()),
}


@pytest.mark.parametrize("name", sorted(OURS))
def test_tfs_refusals(name, tmp_path):
    recorded = TF["errors"][name]
    if recorded["at"] == "constructor":
        with pytest.raises(ValueError) as raised:
            OURS[name]()
    else:   # (a generator: TF's checks run at the first next())
        explaining = OURS[name]().experimental_predict_with_explanations(lambda: [])
        with pytest.raises(ValueError) as raised:
            next(explaining)
    assert str(raised.value) == recorded["message"]


def test_what_tf_fails_on_later_is_refused_at_construction():
    """TF builds these and fails in training (a multi-class head's centred
    bias: a shape error) or trains vector leaves not built here."""
    assert "Dimension 1 in both shapes must be equal" in \
        TF["cases"]["estimator_multi_class_head_center_bias"]["train_error"]["message"]
    with pytest.raises(ValueError, match="center_bias not yet support with n_classes > 2"):
        est.BoostedTreesEstimator(_columns("bucketized"), head=est.MultiClassHead(3),
                                  center_bias=True, **_base())
    for head in (est.RegressionHead(label_dimension=2), est.MultiLabelHead(3)):
        with pytest.raises(NotImplementedError, match="vector leaves"):
            est.BoostedTreesEstimator(_columns("bucketized"), head=head, **_base())
    with pytest.raises(TypeError, match="head must be a head of this library"):
        est.BoostedTreesEstimator(_columns("bucketized"), head="regression", **_base())


def test_the_estimators_weight_column_is_unused_as_tfs(tmp_path, caplog):
    """TF's BoostedTreesEstimator never reads its `weight_column`: the head's
    weights the loss, the quantile sketch is unweighted. Ours warns; the
    model is the one without it (the sketch's boundaries included)."""
    features, _, target, _ = rows(60, 0)
    columns = [fc.numeric_column("x1"), fc.numeric_column("x2")]
    train = batches((features, target), 30)

    def trained(model_dir, head=None, **more):
        model = est.BoostedTreesEstimator(
            columns, n_batches_per_layer=2, head=head or est.RegressionHead(),
            model_dir=model_dir, n_trees=1, max_depth=2, quantile_sketch_epsilon=0.1, **more)
        model.train(lambda: itertools.cycle(train), max_steps=10)
        return model
    with caplog.at_level(logging.WARNING):
        weighted = trained(str(tmp_path / "weighted"), weight_column="w")
    assert "weight_column='w') is unused" in caplog.text
    plain = trained(str(tmp_path / "plain"))
    for name in ("boundaries", "value", "feature", "threshold"):
        np.testing.assert_array_equal(weighted.get_variable_value(f"boosted_trees/{name}"),
                                      plain.get_variable_value(f"boosted_trees/{name}"))
    # the head's weight_column weighs the loss, not the sketch (where TF's
    # BoostedTreesRegressor's weighs both)
    head = trained(str(tmp_path / "head"), head=est.RegressionHead(weight_column="w"))
    by_regressor = est.BoostedTreesRegressor(
        columns, n_batches_per_layer=2, weight_column="w", n_trees=1, max_depth=2,
        model_dir=str(tmp_path / "regressor"), quantile_sketch_epsilon=0.1)
    by_regressor.train(lambda: itertools.cycle(train), max_steps=10)
    boundaries = plain.get_variable_value("boosted_trees/boundaries")
    np.testing.assert_array_equal(head.get_variable_value("boosted_trees/boundaries"),
                                  boundaries)
    assert not np.array_equal(head.get_variable_value("boosted_trees/value"),
                              plain.get_variable_value("boosted_trees/value"))
    assert not np.array_equal(by_regressor.get_variable_value("boosted_trees/boundaries"),
                              boundaries)


@pytest.mark.slow
def test_two_replicas_train_and_explain_as_one_process(tmp_path):
    """BoostedTreesEstimator trained on two replicas (each a half of each
    batch) grows one process's trees, and its explanations under two
    replicas (an odd last batch split unevenly) are one process's."""
    import distribute

    def strategy():
        return distribute.MirroredStrategy(
            ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
                timeout_seconds=60))
    record = TF["cases"]["estimator_v1_binary_head"]
    features, labels = _rows(60, 0, record)
    whole = batches((features, labels), 60)
    halves = [part for f, y in whole for part in batches((f, y), 30)]
    eval_features, _ = _rows(30, 1, record)
    uneven = [(f, None) for f, _ in batches((eval_features, np.zeros(30)), 13)]   # 13, 13, 4

    def trained(name, data, config):
        model = est.BoostedTreesEstimator(
            _columns("bucketized"), head=est.BinaryClassHead(weight_column="w"),
            config=est.RunConfig(model_dir=str(tmp_path / name), **config),
            **record["arguments"])
        model.train(lambda: itertools.cycle(data), max_steps=record["max_steps"])
        return model
    two = trained("two", halves, dict(train_distribute=strategy(),
                                      eval_distribute=strategy()))
    one = trained("one", whole, {})
    assert_trees_are(trees_of(two), trees_of(one))
    explained = list(two.experimental_predict_with_explanations(lambda: uneven))
    expected = list(one.experimental_predict_with_explanations(lambda: uneven))
    assert len(explained) == len(expected) == 30
    for ours, theirs in zip(explained, expected):
        assert list(ours["dfc"]) == list(theirs["dfc"])
        np.testing.assert_allclose(list(ours["dfc"].values()), list(theirs["dfc"].values()),
                                   rtol=1e-6, atol=1e-7)
        assert ours["bias"] == pytest.approx(theirs["bias"])
        np.testing.assert_allclose(ours["probabilities"], theirs["probabilities"], rtol=1e-6)
