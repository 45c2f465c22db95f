"""TF2's heads (`est.BinaryClassHead`, `MultiClassHead`, `RegressionHead`,
`PoissonRegressionHead`, `LogisticRegressionHead`) under `DNNEstimator`
against TF's: DNNEstimators TF 2.15 trained under each
(tests/support/fixtures/record_tf_v2_heads.py: thresholds, a weight column,
string labels, SUM reduction, a named head, two label dimensions, an inverse
link) warm-start here, then evaluate (uneven batches 16 x 3 + 5, float64
weights) and predict what TF did, and one SGD step from TF's checkpoint moves
every weight as TF's did."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from head_data import LABELS, head_model_fn, rows, v2_labels
from paths import FIXTURES
from tf_recorded import (assert_evaluation_is_tfs, assert_predictions_are_tfs,
                         assert_variables_are_tfs)

with open(os.path.join(FIXTURES, "tf_v2_heads.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
HEADS = {
    "binary": (lambda: est.BinaryClassHead(weight_column="w", thresholds=[0.3, 0.7]), 4),
    "binary_vocabulary_sum": (lambda: est.BinaryClassHead(
        label_vocabulary=["no", "yes"], loss_reduction="sum"), "yes_no"),
    "multi_class_named": (lambda: est.MultiClassHead(
        3, weight_column="w", label_vocabulary=LABELS, name="kind"), 3),
    "regression_2d": (lambda: est.RegressionHead(label_dimension=2, weight_column="w"), 1),
    "regression_exp": (lambda: est.RegressionHead(inverse_link_fn=torch.exp), "positive"),
    "poisson": (lambda: est.PoissonRegressionHead(weight_column="w"), "counts"),
    "logistic_regression": (lambda: est.LogisticRegressionHead(weight_column="w"),
                            "fraction"),
    "multi_head": (lambda: est.MultiHead(
        [est.MultiClassHead(3, weight_column="w", label_vocabulary=LABELS, name="kind"),
         est.RegressionHead(name="score")], head_weights=[1.0, 0.5]), "multi"),
}


def make(name, model_dir, rate):
    head, target = HEADS[name]
    estimator = est.DNNEstimator(
        head(), [6], [est.feature_column.numeric_column("x", shape=3)], model_dir=model_dir,
        optimizer=lambda params: torch.optim.SGD(params, lr=rate),
        warm_start_from=os.path.join(FIXTURES, "tf_ckpt", "v2_heads", name))
    return estimator, target


def first_16(data):
    return tuple({k: v[:16] for k, v in part.items()} if isinstance(part, dict) else part[:16]
                 for part in data)


def test_every_head_is_recorded():
    assert sorted(HEADS) == sorted(TF["models"])


@pytest.mark.parametrize("name", sorted(HEADS))
def test_evaluation_and_predictions_are_tfs(name, tmp_path):
    recorded = TF["models"][name]
    estimator, target = make(name, str(tmp_path), 0.0)
    train, eval_ = first_16(rows(64, 0)), rows(53, 1)
    estimator.train(est.inputs.numpy_input_fn(train[0], v2_labels(train, target), 16, 1,
                                              False), steps=1)
    got = estimator.evaluate(est.inputs.numpy_input_fn(eval_[0], v2_labels(eval_, target),
                                                       16, 1, False))
    assert_evaluation_is_tfs(got, recorded["evaluation"])
    few = {k: v[:5] for k, v in eval_[0].items()}
    assert_predictions_are_tfs(
        list(estimator.predict(est.inputs.numpy_input_fn(few, None, 5, 1, False))),
        recorded["predictions"])


@pytest.mark.parametrize("name", sorted(HEADS))
def test_one_training_step_from_tfs_checkpoint_moves_the_weights_as_tfs(name, tmp_path):
    estimator, target = make(name, str(tmp_path), 0.1)
    train = first_16(rows(64, 0))
    estimator.train(est.inputs.numpy_input_fn(train[0], v2_labels(train, target), 16, 1,
                                              False), steps=1)
    assert_variables_are_tfs(estimator, TF["models"][name]["after_one_sgd_step"])


def test_a_model_fn_hands_its_logits_to_a_head_with_its_own_loss(tmp_path):
    """TF2's `loss_fn(labels, logits, features)`: its unreduced loss is the
    one trained and evaluated (here twice the head's own)."""
    def doubled(labels, logits, features):
        assert sorted(features) == ["w", "x"]
        return 2 * torch.nn.functional.binary_cross_entropy_with_logits(
            logits, labels.float(), reduction="none")

    data = rows(64, 0)
    estimator = est.Estimator(head_model_fn(est.BinaryClassHead(loss_fn=doubled, name="b"),
                                            lr=0.5), model_dir=str(tmp_path))
    estimator.train(est.inputs.numpy_input_fn(data[0], data[4], 16, None, False), steps=30)
    results = estimator.evaluate(est.inputs.numpy_input_fn(data[0], data[4], 16, 1, False))
    plain = est.Estimator(head_model_fn(est.BinaryClassHead(name="b")), model_dir=str(tmp_path)
                          ).evaluate(est.inputs.numpy_input_fn(data[0], data[4], 16, 1, False))
    assert results["average_loss/b"] == pytest.approx(2 * plain["average_loss/b"])
    assert results["accuracy/b"] == plain["accuracy/b"] > 0.8


@pytest.mark.parametrize("make_head, error", [
    (lambda: est.MultiClassHead(2), r"n_classes must be > 2: 2 \(BinaryClassHead for two\)"),
    (lambda: est.BinaryClassHead(thresholds=[0.0]), r"thresholds must be in \(0, 1\)"),
    (lambda: est.RegressionHead(loss_reduction="none"), "Invalid loss_reduction: 'none'"),
    (lambda: est.RegressionHead(inverse_link_fn="exp"), "inverse_link_fn must be callable"),
    (lambda: est.PoissonRegressionHead(label_dimension=0), "Invalid label_dimension 0"),
])
def test_bad_arguments_are_named(make_head, error):
    with pytest.raises(ValueError, match=error):
        make_head()


@pytest.mark.parametrize("head, labels, error", [
    (est.LogisticRegressionHead(), np.array([[0.5], [1.5]], np.float32),
     r"Labels must be in range \[0, 1\]; got 1.5"),
    (est.RegressionHead(label_dimension=2, loss_fn=lambda labels, logits: logits[:, 0]),
     np.zeros((2, 2), np.float32),
     r"loss_fn must return a Tensor of shape \[batch_size, 2\], got \[2\]"),
    (est.BinaryClassHead(), np.array([[0], [2]]), r"Labels must be in \[0, n_classes - 1\]"),
])
def test_bad_labels_are_named(head, labels, error, tmp_path):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=error):
        est.Estimator(head_model_fn(head), model_dir=str(tmp_path)).train(
            lambda: iter([({"x": x}, labels)]), steps=1)


# -- MultiHead, used as TF programs use it ----------------------------------------------
def multi_task_model_fn(head):
    """A model_fn with a logits dict by head name (TF's other MultiHead form)."""
    def model_fn(features, labels, mode):
        trunk = est.get_module("trunk", lambda: torch.nn.Linear(3, 8))(features["x"]).relu()
        logits = {h.name: est.get_module(h.name, lambda h=h: torch.nn.Linear(
            8, h.logits_dimension))(trunk) for h in head.heads}
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        return head.create_estimator_spec(features, mode, logits, labels,
                                          train_op_fn=lambda loss: opt)
    return model_fn


def two_heads(reduction="sum_over_batch_size"):
    return est.MultiHead([est.BinaryClassHead(name="flag", loss_reduction=reduction),
                          est.RegressionHead(name="score", weight_column="w")],
                         head_weights=[2.0, 1.0])


def multi_labels(data):
    return {"flag": data[4], "score": data[2]}


def test_a_multi_task_model_fn_exports_tfs_signatures(tmp_path):
    data = rows(64, 0)
    head = two_heads()
    estimator = est.Estimator(multi_task_model_fn(head), model_dir=str(tmp_path / "m"))
    estimator.train(est.inputs.numpy_input_fn(data[0], multi_labels(data), 16, None, False),
                    steps=20)
    results = estimator.evaluate(est.inputs.numpy_input_fn(data[0], multi_labels(data), 16, 1,
                                                           False))
    assert {"loss", "loss/flag", "loss/score", "accuracy/flag", "auc/flag",
            "average_loss/score", "label/mean/score"} <= set(results)
    assert results["loss"] == pytest.approx(2 * results["loss/flag"] + results["loss/score"],
                                            rel=1e-5)
    few = {k: v[:4] for k, v in data[0].items()}
    predicted = list(estimator.predict(est.inputs.numpy_input_fn(few, None, 4, 1, False)))
    assert ("flag", "logistic") in predicted[0] and ("score", "predictions") in predicted[0]
    receiver = est.export.build_raw_serving_input_receiver_fn(
        {"x": torch.zeros(2, 3), "w": torch.zeros(2, dtype=torch.float64)})
    served = est.export.load(estimator.export_saved_model(str(tmp_path / "e"), receiver))
    assert set(served.signatures) == {
        "serving_default", "predict", "flag", "flag/classification", "flag/regression",
        "flag/predict", "score", "score/regression", "score/predict"}
    outputs = served.signatures["predict"](x=torch.from_numpy(few["x"]),
                                           w=torch.from_numpy(few["w"]))
    assert {"flag/logistic", "score/predictions"} <= set(outputs)
    np.testing.assert_allclose(outputs["flag/logistic"].numpy(),
                               [p[("flag", "logistic")] for p in predicted], rtol=1e-5)


@pytest.mark.slow
def test_two_replicas_train_a_multi_head_as_one_process(tmp_path):
    """A SUM-reduced head beside a mean-reduced one: two Mirrored replicas of 16
    rows end with the weights of one process on 32."""
    import distribute
    data = rows(96, 0)

    def trained(name, strategy, batch):
        estimator = est.Estimator(multi_task_model_fn(two_heads("sum")),
                                  model_dir=str(tmp_path / name),
                                  config=est.RunConfig(train_distribute=strategy,
                                                       tf_random_seed=3))
        estimator.train(est.inputs.numpy_input_fn(data[0], multi_labels(data), batch, None,
                                                  False), max_steps=6)
        return {n: estimator.get_variable_value(n) for n in estimator.get_variable_names()
                if not n.startswith("optimizer") and n != "global_step"}
    one = trained("one", None, 32)
    two = trained("two", distribute.MirroredStrategy(["cpu:0", "cpu:1"]), 16)
    assert one.keys() == two.keys() and one
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("make, error", [
    (lambda: est.MultiHead([]), "Must specify heads"),
    (lambda: est.MultiHead([est.BinaryClassHead()]), "All given heads must have name"),
    (lambda: est.MultiHead([est.BinaryClassHead(name="a"), est.RegressionHead(name="a")]),
     r"distinct names, got \['a', 'a'\]"),
    (lambda: est.MultiHead([est.BinaryClassHead(name="a")], head_weights=[1.0, 2.0]),
     "Given len\\(heads\\): 1. Given len\\(head_weights\\): 2"),
])
def test_bad_multi_heads_are_named(make, error):
    with pytest.raises(ValueError, match=error):
        make()


@pytest.mark.parametrize("labels, error", [
    (lambda data: data[4], "labels must be a dict {head name: labels} for MultiHead"),
    (lambda data: {"flag": data[4]}, r"labels has no entry for head\(s\) \['score'\]"),
])
def test_bad_multi_head_labels_are_named(labels, error, tmp_path):
    data = rows(16, 0)
    estimator = est.Estimator(multi_task_model_fn(two_heads()), model_dir=str(tmp_path))
    with pytest.raises(ValueError, match=error):
        estimator.train(est.inputs.numpy_input_fn(data[0], labels(data), 16, 1, False), steps=1)
