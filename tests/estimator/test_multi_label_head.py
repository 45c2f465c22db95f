"""`MultiLabelHead` under the head-taking estimators against TF's: models TF
2.15 trained (tests/support/fixtures/record_tf_multi_label.py: a DNNEstimator
with a weight column, thresholds and class metrics; a LinearEstimator over a
label vocabulary with SUM reduction; a named wide & deep) warm-start here, then
evaluate (uneven batches 16 x 3 + 5, float64 weights) and predict what TF did,
and one SGD step from TF's checkpoint moves every weight as TF's did (the
loss's reduction and weights, seen through its gradient)."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from canned_data import batches
from head_data import LABELS, head_model_fn, multi_label_rows
from paths import FIXTURES
from tf_recorded import (assert_evaluation_is_tfs, assert_predictions_are_tfs,
                         assert_variables_are_tfs)

with open(os.path.join(FIXTURES, "tf_multi_label.json"), encoding="utf-8") as _f:
    TF = json.load(_f)


def sgd(rate):
    return lambda params: torch.optim.SGD(params, lr=rate)


def make(name, model_dir, rate):
    """(estimator warm-started from TF's checkpoint, index of its labels in the rows)."""
    x = [est.feature_column.numeric_column("x", shape=3)]
    warm = os.path.join(FIXTURES, "tf_ckpt", "multi_label", name)
    if name == "dnn":
        head = est.MultiLabelHead(3, weight_column="w", thresholds=[0.3, 0.5],
                                  classes_for_class_based_metrics=[0, 2])
        return est.DNNEstimator(head, [6], x, model_dir=model_dir, optimizer=sgd(rate),
                                warm_start_from=warm), 1
    if name == "linear_vocabulary":
        head = est.MultiLabelHead(3, label_vocabulary=LABELS, loss_reduction="sum",
                                  classes_for_class_based_metrics=["mid"])
        return est.LinearEstimator(head, x, model_dir=model_dir, optimizer=sgd(rate),
                                   warm_start_from=warm), 2
    assert name == "wide_deep_named"
    head = est.MultiLabelHead(3, weight_column="w", name="tags")
    return est.DNNLinearCombinedEstimator(
        head, model_dir=model_dir, linear_feature_columns=x, dnn_feature_columns=x,
        dnn_hidden_units=[4], linear_optimizer=sgd(rate), dnn_optimizer=sgd(rate),
        warm_start_from=warm), 1


def first_16(rows):
    return tuple({k: v[:16] for k, v in part.items()} if isinstance(part, dict) else part[:16]
                 for part in rows)


@pytest.mark.parametrize("name", sorted(TF["models"]))
def test_evaluation_and_predictions_are_tfs(name, tmp_path):
    recorded = TF["models"][name]
    estimator, target = make(name, str(tmp_path), 0.0)
    train, eval_ = first_16(multi_label_rows(64, 0)), multi_label_rows(53, 1)
    estimator.train(est.inputs.numpy_input_fn(train[0], train[target], 16, 1, False), steps=1)
    got = estimator.evaluate(est.inputs.numpy_input_fn(eval_[0], eval_[target], 16, 1, False))
    assert_evaluation_is_tfs(got, recorded["evaluation"])
    few = {k: v[:5] for k, v in eval_[0].items()}
    assert_predictions_are_tfs(
        list(estimator.predict(est.inputs.numpy_input_fn(few, None, 5, 1, False))),
        recorded["predictions"])


@pytest.mark.parametrize("name", sorted(TF["models"]))
def test_one_training_step_from_tfs_checkpoint_moves_the_weights_as_tfs(name, tmp_path):
    estimator, target = make(name, str(tmp_path), 0.1)
    train = first_16(multi_label_rows(64, 0))
    estimator.train(est.inputs.numpy_input_fn(train[0], train[target], 16, 1, False), steps=1)
    assert_variables_are_tfs(estimator, TF["models"][name]["after_one_sgd_step"])


# -- used as TF programs use it ---------------------------------------------------
X = [est.feature_column.numeric_column("x", shape=3)]


@pytest.mark.slow
def test_two_replicas_train_what_one_process_trains(tmp_path):
    """Two Mirrored CPU replicas of 16 rows each end with the weights of one
    process on batches of 32: each replica's loss is its mean, and the
    strategy averages their gradients ('sum_over_batch_size' over the global
    batch)."""
    import distribute
    rows = multi_label_rows(96, 0)

    def trained(name, strategy, batch):
        estimator = est.DNNEstimator(
            est.MultiLabelHead(3, weight_column="w"), [5], X, model_dir=str(tmp_path / name),
            optimizer="SGD", config=est.RunConfig(train_distribute=strategy, tf_random_seed=3))
        estimator.train(est.inputs.numpy_input_fn(rows[0], rows[1], batch, None, False),
                        max_steps=6)
        return {n: estimator.get_variable_value(n) for n in estimator.get_variable_names()
                if n.startswith("dnn/")}
    one = trained("one", None, 32)
    two = trained("two", distribute.MirroredStrategy(["cpu:0", "cpu:1"]), 16)
    assert one.keys() == two.keys() and one
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_exported_model_serves_what_predict_gives(tmp_path):
    rows = multi_label_rows(64, 0)
    estimator = est.DNNEstimator(est.MultiLabelHead(3, label_vocabulary=LABELS), [6], X,
                                 model_dir=str(tmp_path / "m"), dropout=0.3)
    estimator.train(est.inputs.numpy_input_fn(rows[0], rows[2], 16, None, False),
                    max_steps=10)
    receiver = est.export.build_raw_serving_input_receiver_fn({"x": torch.zeros(2, 3)})
    served = est.export.load(estimator.export_saved_model(str(tmp_path / "export"), receiver))
    assert set(served.signatures) == {"serving_default", "classification", "predict"}
    x = torch.from_numpy(rows[0]["x"])
    predicted = np.stack([p["probabilities"] for p in estimator.predict(
        est.inputs.numpy_input_fn({"x": rows[0]["x"]}, None, 16, 1, False))])
    classified = served.signatures["classification"](x=x)
    np.testing.assert_allclose(classified["scores"].numpy(), predicted, rtol=1e-5, atol=1e-6)
    assert classified["classes"].tolist() == [[0, 1, 2]] * len(x)
    outputs = served.signatures["predict"](x=x)
    assert set(outputs) == {"logits", "probabilities"}
    np.testing.assert_allclose(outputs["probabilities"].numpy(), predicted, rtol=1e-5,
                               atol=1e-6)


def test_a_model_fn_hands_its_logits_to_the_head(tmp_path):
    """TF's custom-model_fn pattern, `head.create_estimator_spec(...)`, with
    label words as lists (rows of any length) and a loss_fn reading the
    features: its loss is the one trained and evaluated."""
    seen = []

    def loss_fn(labels, logits, features):
        seen.append(sorted(features))
        per_class = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, labels, reduction="none")
        return 2.0 * per_class.mean(-1)   # [batch]: taken as [batch, 1]
    head = est.MultiLabelHead(3, label_vocabulary=LABELS, loss_fn=loss_fn)
    features, _, words = multi_label_rows(64, 0)
    lists = [[w for w in row if w] for row in words.tolist()]
    assert {len(r) for r in lists} == {0, 1, 2, 3}
    estimator = est.Estimator(head_model_fn(head, lr=0.5), model_dir=str(tmp_path))
    x = {"x": features["x"]}
    estimator.train(lambda: batches(x, lists, 16, repeat=True), max_steps=40)
    results = estimator.evaluate(lambda: batches(x, lists, 16))
    assert seen[0] == ["x"]
    assert results["auc"] > 0.8
    # The same labels as a string matrix padded with "" evaluate alike.
    again = estimator.evaluate(est.inputs.numpy_input_fn(x, words, 16, 1, False))
    assert again["average_loss"] == pytest.approx(results["average_loss"])
    # Batches that start with examples without labels.
    order = np.argsort([len(r) for r in lists], kind="stable")
    assert not lists[order[0]] and not lists[order[1]]
    sorted_ = estimator.evaluate(lambda: batches({"x": x["x"][order]},
                                                 [lists[i] for i in order], 16))
    assert sorted_["average_loss"] == pytest.approx(results["average_loss"])
    default = est.Estimator(head_model_fn(est.MultiLabelHead(3, label_vocabulary=LABELS)),
                            model_dir=str(tmp_path))
    assert results["loss"] == pytest.approx(
        2 * default.evaluate(lambda: batches(x, lists, 16))["loss"], rel=1e-6)
    predictions = next(iter(estimator.predict(
        est.inputs.numpy_input_fn({"x": features["x"]}, None, 16, 1, False))))
    assert [c.decode() for c in predictions["classes"]] == LABELS


@pytest.mark.parametrize("kwargs, error", [
    ({"n_classes": 1}, "n_classes must be > 1: 1"),
    ({"n_classes": 3, "thresholds": [0.5, 1.0]}, r"thresholds must be in \(0, 1\)"),
    ({"n_classes": 3, "loss_reduction": "mean"}, "Invalid loss_reduction: 'mean'"),
    ({"n_classes": 3, "label_vocabulary": ["a", "b"]}, "has 2 entries, but n_classes is 3"),
    ({"n_classes": 2, "label_vocabulary": ["a", ""]}, "empty string"),
    ({"n_classes": 3, "classes_for_class_based_metrics": [3]}, r"class ids in \[0, 2\]"),
    ({"n_classes": 3, "classes_for_class_based_metrics": ["mid"]}, "'mid' is not in"),
    ({"n_classes": 3, "loss_fn": "bce"}, "loss_fn must be callable"),
])
def test_bad_arguments_are_named(kwargs, error):
    with pytest.raises(ValueError, match=error):
        est.MultiLabelHead(**kwargs)


def test_a_canned_estimator_refuses_what_is_not_a_head():
    with pytest.raises(TypeError, match="head must be a head of this library.*got str"):
        est.DNNEstimator("multi_label", [4], X)


@pytest.mark.parametrize("head, labels, error", [
    (est.MultiLabelHead(3), np.array([[0, 1, 2]] * 4), "each value 0 or 1.*got 2"),
    (est.MultiLabelHead(3), np.array([[0, 1]] * 4), r"labels shape must be \[batch, 3\]"),
    (est.MultiLabelHead(3, label_vocabulary=LABELS), [["low"], ["top"], [], ["mid"]],
     r"Label 'top' \(example 1\) is not in label_vocabulary"),
    (est.MultiLabelHead(3, label_vocabulary=LABELS), np.zeros((4, 3), np.int64),
     "labels must be strings"),
    (est.MultiLabelHead(3, label_vocabulary=LABELS), [["low"], [], ["mid", 2], []],
     r"labels must be strings; example 2 has 2 \(int\)"),
    (est.MultiLabelHead(3, loss_fn=lambda labels, logits: logits), np.zeros((4, 3), np.int64),
     r"loss_fn must return a Tensor of shape \[batch_size, 1\].*got \[4, 3\]"),
])
def test_bad_labels_are_named(head, labels, error, tmp_path):
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=error):
        est.Estimator(head_model_fn(head), model_dir=str(tmp_path)).train(
            lambda: iter([({"x": x}, labels)]), steps=1)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("model.ckpt")]


def test_a_baseline_learns_each_class_frequency(tmp_path):
    rows = multi_label_rows(64, 0)
    estimator = est.BaselineEstimator(est.MultiLabelHead(3), model_dir=str(tmp_path),
                                      optimizer=lambda p: torch.optim.SGD(p, lr=2.0))
    estimator.train(est.inputs.numpy_input_fn(rows[0], rows[1], 16, None, False),
                    max_steps=300)
    probabilities = next(iter(estimator.predict(
        est.inputs.numpy_input_fn({"x": rows[0]["x"]}, None, 16, 1, False))))["probabilities"]
    np.testing.assert_allclose(probabilities, rows[1].mean(0), atol=0.02)
    assert estimator.get_variable_names() and "baseline/bias" in estimator.get_variable_names()
