"""More of tf.compat.v1.metrics (confusion counts, at thresholds,
sensitivity/specificity, mean per-class accuracy, mean IoU, relative error,
cosine distance, percentage below): values streamed over uneven weighted
batches equal TF 2.15's (recorded by
tests/support/fixtures/record_tf_more_metrics.py), in a model_fn too."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from estimator import metrics
from metric_rows import BATCHES, CASES, CLASS_LABELS, CLASS_PREDICTIONS, WEIGHTS
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_more_metrics.json"), encoding="utf-8") as _f:
    TF = json.load(_f)


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_values_are_tfs(case):
    function, args, kwargs = CASES[case]
    metric, start = None, 0
    for size in BATCHES:
        batch = {k: np.asarray(v)[start:start + size] for k, v in args.items()}
        start += size
        if metric is None:
            metric = getattr(metrics, function)(**batch, **kwargs)
        else:
            metric.update_state(*(batch[k] for k in args))
    np.testing.assert_allclose(metric.result().numpy(), TF["values"][case], rtol=2e-6,
                               atol=1e-6)


def test_per_class_accuracy_and_iou_in_a_model_fn_over_two_names(tmp_path):
    """In eval_metric_ops, over the evaluation's batches; two uses of one
    default name give mean_iou and mean_iou_1, as TF's scopes."""
    def model_fn(features, labels, mode):
        bias = est.get_module("bias", lambda: torch.nn.Linear(1, 1))
        loss = bias(torch.ones(1, 1)).sum() * 0
        predictions = features["predictions"]
        if mode == est.ModeKeys.TRAIN:
            return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
                lambda p: torch.optim.SGD(p, lr=0.0)))
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "per_class": metrics.mean_per_class_accuracy(labels, predictions, 4,
                                                         weights=features["w"]),
            "iou": metrics.mean_iou(labels, predictions, 4),
            "iou_weighted": metrics.mean_iou(labels, predictions, 4, weights=features["w"])})

    def input_fn():
        start = 0
        for size in BATCHES:
            part = slice(start, start + size)
            start += size
            yield ({"predictions": CLASS_PREDICTIONS[part], "w": WEIGHTS[part]},
                   CLASS_LABELS[part])
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path))
    estimator.train(input_fn, max_steps=1)
    results = estimator.evaluate(input_fn)
    values = TF["values"]
    assert results["per_class"] == pytest.approx(values["mean_per_class_accuracy_weighted"],
                                                 rel=1e-6)
    assert results["iou"] == pytest.approx(values["mean_iou"], rel=1e-6)
    assert results["iou_weighted"] == pytest.approx(values["mean_iou_weighted"], rel=1e-6)


def test_nothing_counted_and_ties():
    assert metrics.mean_iou([0], [0], 3).result().item() == 1.0     # one class occurs
    empty = metrics.MeanIoU(3)
    assert empty.result().item() == 0.0
    assert metrics.MeanPerClassAccuracy(2).result().item() == 0.0
    assert metrics.precision_at_thresholds([1], [0.3], [0.5]).result().tolist() == [0.0]
    # thresholds in any order: the values keep it
    unsorted = metrics.true_positives_at_thresholds([1, 1, 0], [0.9, 0.4, 0.8], [0.5, 0.1])
    assert unsorted.result().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("call, error, match", [
    (lambda: metrics.sensitivity_at_specificity([1], [0.5], 1.5), ValueError,
     r"`specificity` must be in the range \[0, 1\]"),
    (lambda: metrics.specificity_at_sensitivity([1], [0.5], -0.1), ValueError,
     r"`sensitivity` must be in the range \[0, 1\]"),
    (lambda: metrics.sensitivity_at_specificity([1], [0.5], 0.5, num_thresholds=1),
     ValueError, "num_thresholds must be an int >= 2"),
    (lambda: metrics.mean_iou([0, 1], [0, 1], 0), ValueError,
     "num_classes must be a positive int, got 0"),
    (lambda: metrics.mean_per_class_accuracy([0, 1], [0, 1, 1], 2), ValueError,
     r"labels shape \(2,\) does not match predictions shape \(3,\)"),
    (lambda: metrics.true_positives_at_thresholds([1], [0.5], []), ValueError,
     "thresholds must not be empty"),
    (lambda: metrics.ConditionCount("hits"), ValueError, "condition must be one of"),
    # TF's confusion matrix refuses ids out of range (a pair was counted in
    # another's cell: predictions 3 as label 1's of class 0)
    (lambda: metrics.mean_iou([0, 1, 2, 0, 1], [3, 1, 2, 0, 1], 3), ValueError,
     r"^predictions out of bound: not in \[0, num_classes - 1\] = \[0, 2\]; got 3$"),
    (lambda: metrics.mean_iou([1, 1, 2, 0, 1], [-1, 1, 2, 0, 1], 3), ValueError,
     "predictions out of bound.*; got -1$"),
    (lambda: metrics.mean_iou([3, 1], [0, 1], 3), ValueError, "labels out of bound.*; got 3$"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("case", sorted(CASES))
def test_replicas_summed_state_gives_tfs_value(case):
    """What the SUM all-reduce across replicas relies on: float64 sums whose
    total over two halves of the rows gives the whole's value."""
    function, args, kwargs = CASES[case]
    halves = []
    for part in (slice(0, 9), slice(9, None)):
        halves.append(getattr(metrics, function)(
            **{k: np.asarray(v)[part] for k, v in args.items()}, **kwargs))
    assert all(b.dtype == torch.float64 for b in halves[0].buffers())
    merged = type(halves[0])(**halves[0].config)
    for name, buffer in merged.named_buffers():
        buffer.copy_(sum(dict(h.named_buffers())[name] for h in halves))
    np.testing.assert_allclose(merged.result().numpy(), TF["values"][case], rtol=2e-6,
                               atol=1e-6)
