"""Streaming metrics (TF: `tf.compat.v1.metrics`; the functions listed in
`__all__`, checked against TF 2.15).

Used inside a model_fn, which runs once per batch::

    accuracy = est.metrics.accuracy(labels, logits.argmax(-1))
    est.summary.scalar("accuracy", accuracy[1])     # the running value, in TRAIN too
    return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})

Each function finds its `Metric` by `name` in the model scope (created on first
use, as TF's metric local variables are; a name used twice in one model_fn call
becomes `name_1`, as TF's name scopes make it), updates it with the batch in
TRAIN and EVAL (PREDICT has no labels: there a call does no tensor work) and
returns it. Where TF returns `(value, update_op)`, this returns the object,
which indexes like that pair: `m[0]` and `m[1]` are its current value. In
TRAIN the value runs over the steps of this `train` call; in EVAL the
framework reads it once the input is exhausted.

Custom metrics: subclass `Metric` (float64 sum/count state declared with
`_add_state`, `update_state`, `result`). In `eval_metric_ops` either a metric
of the scope, or a new `Metric` made and updated in each model_fn call (the
framework adds up each batch's state, so the result covers every batch), or a
scalar tensor (averaged over all evaluated examples, each batch weighted by its
size); anything else is an error naming the key.

All state is float64 buffers holding sums or counts: summing the buffers of
several replicas (an all-reduce with SUM) gives the exact global metric, and
`state_dict()` / `.to(device)` work as for any module. Updates are pure tensor
ops on the buffers' device (no host sync); inputs may be on any device.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import torch

from hooks import model_scope

__all__ = [
    "Metric", "Mean", "Accuracy", "MeanSquaredError", "RootMeanSquaredError",
    "MeanAbsoluteError", "Precision", "Recall", "AUC", "PrecisionAtK", "RecallAtK",
    "mean", "accuracy", "mean_squared_error", "root_mean_squared_error",
    "mean_absolute_error", "precision", "recall", "auc", "precision_at_k",
    "recall_at_k", "precision_at_top_k", "recall_at_top_k",
    "ConditionCount", "CountsAtThresholds", "PrecisionAtThresholds", "RecallAtThresholds",
    "SensitivityAtSpecificity", "SpecificityAtSensitivity", "MeanPerClassAccuracy", "MeanIoU",
    "MeanRelativeError", "MeanCosineDistance", "PercentageBelow",
    "true_positives", "false_positives", "true_negatives", "false_negatives",
    "true_positives_at_thresholds", "false_positives_at_thresholds",
    "true_negatives_at_thresholds", "false_negatives_at_thresholds",
    "precision_at_thresholds", "recall_at_thresholds", "sensitivity_at_specificity",
    "specificity_at_sensitivity", "mean_per_class_accuracy", "mean_iou",
    "mean_relative_error", "mean_cosine_distance", "percentage_below",
    "AveragePrecisionAtK", "average_precision_at_k", "sparse_average_precision_at_k",
    "sparse_precision_at_k",
]

_F64 = torch.float64


# -- helpers ---------------------------------------------------------------------
def _as(x, device, dtype=None) -> torch.Tensor:
    """`x` (tensor, array, list) as a detached tensor on `device`. Copies to an
    accelerator are non-blocking (no stream sync; safe from pageable memory)."""
    t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    return t.to(device=device, dtype=dtype, non_blocking=device.type != "cpu")


def _match(labels, predictions, device, dtype=None):
    """Labels and predictions of one shape, squeezing a trailing 1 off either
    (TF: `confusion_matrix.remove_squeezable_dimensions`)."""
    labels, predictions = _as(labels, device, dtype), _as(predictions, device, dtype)
    diff = predictions.dim() - labels.dim()
    if diff == 1 and predictions.shape[-1] == 1:
        predictions = predictions.squeeze(-1)
    elif diff == -1 and labels.shape[-1] == 1:
        labels = labels.squeeze(-1)
    if labels.shape != predictions.shape:
        raise ValueError(f"labels shape {tuple(labels.shape)} does not match "
                         f"predictions shape {tuple(predictions.shape)}")
    return labels, predictions


def _weights(weights, shape, device) -> Optional[torch.Tensor]:
    """`weights` as float64 broadcast to `shape`, after squeezing or adding a
    trailing dimension when the ranks differ by one (TF:
    `_remove_squeezable_dimensions` + `broadcast_weights`); None stays None."""
    if weights is None:
        return None
    w = _as(weights, device, _F64)
    if w.dim() and w.dim() == len(shape) + 1 and w.shape[-1] == 1:
        w = w.squeeze(-1)
    elif w.dim() and w.dim() == len(shape) - 1:
        w = w.unsqueeze(-1)
    try:
        return torch.broadcast_to(w, shape)
    except RuntimeError:
        raise ValueError(f"weights shape {tuple(w.shape)} cannot be broadcast to "
                         f"{tuple(shape)}") from None


def _wsum(x: torch.Tensor, w: Optional[torch.Tensor]) -> torch.Tensor:
    """Sum of `x` (weighted by `w`), float64."""
    x = x.to(_F64)
    return x.sum() if w is None else (x * w).sum()


def _div_no_nan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b, 0 where b == 0 (TF: `math_ops.div_no_nan`)."""
    zero = b == 0
    return torch.where(zero, torch.zeros_like(a), a / torch.where(zero, 1.0, b))


# -- base class ----------------------------------------------------------------------
class Metric(torch.nn.Module):
    """A streaming metric (TF: a `tf.compat.v1.metrics` op's local variables,
    update op and value tensor; `tf.keras.metrics.Metric`). Subclasses declare
    their state with `_add_state` (float64 sums/counts only: state that adds
    up over batches and replicas) and implement `update_state` and `result`;
    `config` holds the constructor arguments.

        class MeanRelativeError(est.metrics.Metric):
            def __init__(self):
                super().__init__()
                self._add_state("total")
                self._add_state("count")
            def update_state(self, labels, predictions):
                err = ((predictions - labels).abs() / labels.abs()).double()
                self.total += err.sum().to(self.device)
                self.count += err.numel()
            def result(self):
                return self.total / self.count

        # in model_fn, EVAL: a new one per call, updated with this batch
        m = MeanRelativeError(); m.update_state(labels, predictions)
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={"mre": m})
    """

    def __init__(self, **config):
        super().__init__()
        self.config = config

    def __getitem__(self, index: int) -> torch.Tensor:
        """`m[0]` / `m[1]`: the current value, as TF's `(value, update_op)` pair
        gives it (the update already happened when the metric was called), a
        float64 result as TF's float32 (what a hook fetches, a summary holds)."""
        if index not in (0, 1, -1, -2):
            raise IndexError(f"{type(self).__name__} indexes like TF's (value, update_op) "
                             f"pair: m[0] or m[1], got m[{index!r}]")
        value = self.result()
        return value.float() if value.dtype == _F64 else value

    def _add_state(self, name: str, shape: Sequence[int] = ()) -> None:
        self.register_buffer(name, torch.zeros(shape, dtype=_F64))

    @property
    def device(self) -> torch.device:
        return next(self.buffers()).device

    def update_state(self, *args, **kwargs) -> None:
        """Accumulate one batch (TF: run the update op)."""
        raise NotImplementedError

    def result(self) -> torch.Tensor:
        """The metric over everything accumulated (TF: the value tensor)."""
        raise NotImplementedError

    def reset_state(self) -> None:
        """Zero the state in place (TF: re-run the local variables initializer)."""
        for buf in self.buffers():
            buf.zero_()

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config.items())


class Mean(Metric):
    """Weighted mean: total / count (TF: `tf.compat.v1.metrics.mean`)."""

    def __init__(self, **config):
        super().__init__(**config)
        self._add_state("total")
        self._add_state("count")

    def update_state(self, values, weights=None) -> None:
        self._accumulate(_as(values, self.device, _F64), weights)

    def _accumulate(self, values: torch.Tensor, weights) -> None:
        w = _weights(weights, values.shape, self.device)
        self.total += _wsum(values, w)
        self.count += values.numel() if w is None else w.sum()

    def result(self) -> torch.Tensor:
        return _div_no_nan(self.total, self.count)


class _PairMean(Mean):
    """Mean of an elementwise function of (labels, predictions)."""

    def update_state(self, labels, predictions, weights=None) -> None:
        labels, predictions = _match(labels, predictions, self.device)
        self._accumulate(self._values(labels, predictions).to(_F64), weights)

    def _values(self, labels: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Accuracy(_PairMean):
    """Fraction of predictions equal to labels (TF: `metrics.accuracy`)."""

    def _values(self, labels, predictions):
        return predictions.to(labels.dtype) == labels


class MeanSquaredError(_PairMean):
    """TF: `metrics.mean_squared_error`."""

    def _values(self, labels, predictions):
        return (predictions.to(_F64) - labels.to(_F64)).square()


class RootMeanSquaredError(MeanSquaredError):
    """TF: `metrics.root_mean_squared_error` (sqrt of the streamed MSE)."""

    def result(self):
        return super().result().sqrt()


class MeanAbsoluteError(_PairMean):
    """TF: `metrics.mean_absolute_error`."""

    def _values(self, labels, predictions):
        return (predictions.to(_F64) - labels.to(_F64)).abs()


# -- ratios: tp / (tp + other) ----------------------------------------------------------
class _Ratio(Metric):
    """true_positives / (true_positives + <other>), `_empty` when both are 0."""

    _other = "false_positives"
    _empty = 0.0

    def __init__(self, **config):
        super().__init__(**config)
        self._add_state("true_positives")
        self._add_state(self._other)

    def update_state(self, *args, **kwargs) -> None:
        tp, other = self._counts(*args, **kwargs)
        self.true_positives += tp
        getattr(self, self._other).add_(other)

    def result(self) -> torch.Tensor:
        tp = self.true_positives
        total = tp + getattr(self, self._other)
        return torch.where(total > 0, tp / total, self._empty)

    def _counts(self, *args, **kwargs):
        """Weighted (true positives, <other>) of one batch."""
        raise NotImplementedError


class Precision(_Ratio):
    """tp / (tp + fp) over bool-cast labels and predictions; 0 when nothing is
    predicted positive (TF: `metrics.precision`)."""

    def _counts(self, labels, predictions, weights=None):
        labels, predictions = _match(labels, predictions, self.device, torch.bool)
        w = _weights(weights, labels.shape, self.device)
        hit = labels & predictions
        return _wsum(hit, w), _wsum(self._miss(labels, predictions), w)

    def _miss(self, labels, predictions):
        return predictions & ~labels


class Recall(Precision):
    """tp / (tp + fn); 0 when there are no positive labels (TF: `metrics.recall`)."""

    _other = "false_negatives"

    def _miss(self, labels, predictions):
        return labels & ~predictions


def _set_counts(a: torch.Tensor, b: torch.Tensor, class_id: Optional[int]):
    """Per row (last dim) of the sets A and B: (|A & B|, |A - B|), both
    restricted to {class_id} when given (TF: `tf.sets` ops + `_select_class_id`)."""
    if class_id is not None:
        in_a, in_b = (a == class_id).any(-1), (b == class_id).any(-1)
        return in_a & in_b, in_a & ~in_b
    a = a.sort(dim=-1).values
    first = torch.ones_like(a, dtype=torch.bool)     # dedupe: first of equal runs
    first[..., 1:] = a[..., 1:] != a[..., :-1]
    in_b = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1)
    return (first & in_b).sum(-1), (first & ~in_b).sum(-1)


def _top_k(labels, predictions, k, indices: bool, device):
    """(labels [..., n] as int64, the top-k class ids [..., k], the number of
    classes or None): `predictions` are scores (ties: the lower id first, as
    TF's top_k), or with `indices` the ids already."""
    idx = _as(predictions, device)
    classes = None if indices or idx.dim() < 1 else idx.shape[-1]
    if not indices:
        if idx.dim() < 1 or idx.shape[-1] < k:
            raise ValueError(f"k={k} exceeds the number of classes of predictions "
                             f"shape {tuple(idx.shape)}")
        idx = idx.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    idx = idx.long()
    labels = _as(labels, device, torch.long)
    if labels.dim() == idx.dim() - 1:
        labels = labels.unsqueeze(-1)
    if labels.shape[:-1] != idx.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} does not match "
                         f"predictions shape {tuple(idx.shape)}")
    return labels, idx, classes


class PrecisionAtK(_Ratio):
    """Precision of the top-k predicted classes against the label set (TF:
    `metrics.precision_at_k`; with `indices=True`, `precision_at_top_k`, the
    predictions being the top-k class ids). NaN when nothing counts, as TF."""

    _empty = math.nan

    def __init__(self, k: Optional[int], class_id: Optional[int] = None,
                 indices: bool = False):
        if not indices and (not isinstance(k, numbers.Integral) or k < 1):
            raise ValueError(f"k must be a positive int, got {k!r}")
        super().__init__(k=k, class_id=class_id, indices=indices)

    def _counts(self, labels, predictions, weights=None):
        labels, idx, _ = _top_k(labels, predictions, self.config["k"], self.config["indices"],
                                self.device)
        tp, other = self._sets(labels, idx)
        w = _weights(weights, tp.shape, self.device)
        return _wsum(tp, w), _wsum(other, w)

    def _sets(self, labels, idx):
        return _set_counts(idx, labels, self.config["class_id"])


class RecallAtK(PrecisionAtK):
    """Recall of the label set within the top-k predicted classes; labels out
    of range count as false negatives (TF: `metrics.recall_at_k` /
    `recall_at_top_k`). NaN when nothing counts, as TF."""

    _other = "false_negatives"

    def _sets(self, labels, idx):
        return _set_counts(labels, idx, self.config["class_id"])


class AveragePrecisionAtK(Metric):
    """The mean over examples of the average precision of the top-k predicted
    classes against the label set: the sum of precision@i at each relevant
    rank i, over min(number of labels in range, k) (TF:
    `metrics.average_precision_at_k`). As TF: a label repeated in a row
    counts once as relevant but each time in the divisor, and a row with no
    label in range makes it NaN."""

    def __init__(self, k: int):
        if not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"Invalid k={k!r}. `k` should be >= 1.")
        super().__init__(k=k)
        self._add_state("total")
        self._add_state("max")

    def update_state(self, labels, predictions, weights=None) -> None:
        labels, idx, classes = _top_k(labels, predictions, self.config["k"], False,
                                      self.device)
        labels = torch.where(labels >= classes, -1, labels)   # past the classes: no label
        k = idx.shape[-1]
        relevant = (idx.unsqueeze(-1) == labels.unsqueeze(-2)).any(-1).to(_F64)
        ranks = torch.arange(1, k + 1, dtype=_F64, device=idx.device)
        precision_sum = (relevant.cumsum(-1) / ranks * relevant).sum(-1)
        num_relevant = (labels >= 0).sum(-1).clamp(max=k).to(_F64)
        average_precision = precision_sum / num_relevant
        w = _weights(weights, average_precision.shape, self.device)
        self.total += _wsum(average_precision, w)
        self.max += average_precision.numel() if w is None else w.sum()

    def result(self) -> torch.Tensor:
        return _div_no_nan(self.total, self.max)


def _counts_at_thresholds(labels, predictions, weights, thresholds: torch.Tensor):
    """Weighted (tp, fn, tn, fp) at each of the sorted float32 `thresholds`
    (on the labels' device): a prediction is positive when strictly above a
    threshold, compared in float32; labels cast to bool (TF:
    `_confusion_matrix_at_thresholds`)."""
    dev = thresholds.device
    labels, predictions = _match(labels, predictions, dev)
    labels, predictions = labels.to(torch.bool), predictions.to(torch.float32)
    w = _weights(weights, predictions.shape, dev)
    w = torch.ones(predictions.shape, dtype=_F64, device=dev) if w is None else w
    n = thresholds.numel()
    # Bucket b = number of thresholds strictly below the prediction: positive
    # at thresholds t < b. Weighted histogram per label, then cumulative sums.
    bucket = torch.searchsorted(thresholds, predictions.reshape(-1).contiguous())
    hist = torch.zeros(2 * (n + 1), dtype=_F64, device=dev)
    hist.scatter_add_(0, labels.reshape(-1).long() * (n + 1) + bucket, w.reshape(-1))
    hist = hist.view(2, n + 1)
    above = hist.flip(-1).cumsum(-1).flip(-1)[:, 1:]    # weight with bucket > t
    below = hist.cumsum(-1)[:, :-1]                     # weight with bucket <= t
    return above[1], below[1], below[0], above[0]


class AUC(Metric):
    """Area under the ROC or PR curve from confusion counts at fixed thresholds
    (TF: `metrics.auc`: thresholds `[-1e-7, 1/(n-1), ..., (n-2)/(n-1), 1+1e-7]`,
    a prediction is positive when strictly above a threshold, compared in
    float32; `summation_method` 'trapezoidal', 'careful_interpolation' (PR),
    'minoring' or 'majoring'). Predictions should lie in [0, 1]; unlike TF this
    is not checked (that would need a host sync)."""

    _EPS = 1e-6
    _METHODS = ("trapezoidal", "careful_interpolation", "minoring", "majoring")

    def __init__(self, num_thresholds: int = 200, curve: str = "ROC",
                 summation_method: str = "trapezoidal",
                 thresholds: Optional[Sequence[float]] = None):
        if curve not in ("ROC", "PR"):
            raise ValueError(f"curve must be either ROC or PR, got {curve!r}")
        if summation_method not in self._METHODS:
            raise ValueError(f"summation_method must be one of {self._METHODS}, "
                             f"got {summation_method!r}")
        if thresholds is not None:
            thresholds = tuple(thresholds)
            inner = sorted(float(t) for t in thresholds)
            if inner and not 0.0 <= inner[0] <= inner[-1] <= 1.0:
                raise ValueError(f"thresholds must lie in [0, 1], got {thresholds}")
        elif num_thresholds < 2:
            raise ValueError(f"num_thresholds must be >= 2, got {num_thresholds}")
        else:
            inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        super().__init__(num_thresholds=num_thresholds, curve=curve,
                         summation_method=summation_method, thresholds=thresholds)
        self._thresholds_list = [0.0 - 1e-7] + inner + [1.0 + 1e-7]
        self._thresholds_on = {}            # device -> float32 tensor (not state)
        n = len(self._thresholds_list)
        for name in ("true_positives", "false_negatives", "true_negatives", "false_positives"):
            self._add_state(name, (n,))

    def _thresholds(self, device) -> torch.Tensor:
        t = self._thresholds_on.get(device)
        if t is None:
            t = _as(torch.tensor(self._thresholds_list, dtype=torch.float32), device)
            self._thresholds_on[device] = t
        return t

    def update_state(self, labels, predictions, weights=None) -> None:
        tp, fn, tn, fp = _counts_at_thresholds(labels, predictions, weights,
                                               self._thresholds(self.device))
        self.true_positives += tp
        self.false_negatives += fn
        self.true_negatives += tn
        self.false_positives += fp

    def result(self) -> torch.Tensor:
        tp, fn = self.true_positives, self.false_negatives
        tn, fp = self.true_negatives, self.false_positives
        curve, method = self.config["curve"], self.config["summation_method"]
        if curve == "PR" and method == "careful_interpolation":
            return self._interpolate_pr_auc(tp, fp, fn)
        eps = self._EPS
        recall = (tp + eps) / (tp + fn + eps)
        if curve == "ROC":
            x, y = fp / (fp + tn + eps), recall
        else:
            x, y = recall, (tp + eps) / (tp + fp + eps)
        if method == "minoring":
            height = torch.minimum(y[:-1], y[1:])
        elif method == "majoring":
            height = torch.maximum(y[:-1], y[1:])
        else:
            height = (y[:-1] + y[1:]) / 2.0
        return ((x[:-1] - x[1:]) * height).sum()

    @staticmethod
    def _interpolate_pr_auc(tp, fp, fn):
        """TF's closed-form PR interpolation (Davis & Goadrich 2006)."""
        dtp = tp[:-1] - tp[1:]
        p = tp + fp
        slope = _div_no_nan(dtp, (p[:-1] - p[1:]).clamp(min=0))
        intercept = tp[1:] - slope * p[1:]
        ratio = torch.where((p[:-1] > 0) & (p[1:] > 0),
                            _div_no_nan(p[:-1], p[1:].clamp(min=0)), torch.ones_like(p[1:]))
        return _div_no_nan(slope * (dtp + intercept * ratio.log()),
                           (tp[1:] + fn[1:]).clamp(min=0)).sum()


# -- confusion counts and matrices ---------------------------------------------------------
_CONDITIONS = {
    "true_positives": lambda labels, predictions: labels & predictions,
    "false_positives": lambda labels, predictions: ~labels & predictions,
    "true_negatives": lambda labels, predictions: ~labels & ~predictions,
    "false_negatives": lambda labels, predictions: labels & ~predictions,
}


class ConditionCount(Metric):
    """Weighted count of the examples whose bool-cast label and prediction
    meet `condition`: "true_positives", "false_positives", "true_negatives"
    or "false_negatives" (TF: `metrics.true_positives` and the others)."""

    def __init__(self, condition: str):
        if condition not in _CONDITIONS:
            raise ValueError(f"condition must be one of {sorted(_CONDITIONS)}, got {condition!r}")
        super().__init__(condition=condition)
        self._add_state("count")

    def update_state(self, labels, predictions, weights=None) -> None:
        labels, predictions = _match(labels, predictions, self.device, torch.bool)
        hit = _CONDITIONS[self.config["condition"]](labels, predictions)
        self.count += _wsum(hit, _weights(weights, hit.shape, self.device))

    def result(self) -> torch.Tensor:
        return self.count


class _AtThresholds(Metric):
    """tp, fn, tn and fp at each of `thresholds` (in their given order)."""

    def __init__(self, points: Sequence[float], **config):
        thresholds = tuple(float(t) for t in points)
        if not thresholds:
            raise ValueError("thresholds must not be empty")
        super().__init__(**config)
        order = sorted(range(len(thresholds)), key=thresholds.__getitem__)
        self._sorted = [thresholds[i] for i in order]
        self._unsort = sorted(range(len(order)), key=order.__getitem__)
        self._on = {}                       # device -> (sorted thresholds, unsort index)
        for name in ("true_positives", "false_negatives", "true_negatives", "false_positives"):
            self._add_state(name, (len(thresholds),))

    def update_state(self, labels, predictions, weights=None) -> None:
        dev = self.device
        if dev not in self._on:
            self._on[dev] = (torch.tensor(self._sorted, dtype=torch.float32, device=dev),
                             torch.tensor(self._unsort, dtype=torch.long, device=dev))
        thresholds, unsort = self._on[dev]
        tp, fn, tn, fp = _counts_at_thresholds(labels, predictions, weights, thresholds)
        self.true_positives += tp[unsort]
        self.false_negatives += fn[unsort]
        self.true_negatives += tn[unsort]
        self.false_positives += fp[unsort]


class CountsAtThresholds(_AtThresholds):
    """One of the counts (`condition`, as `ConditionCount`) at each threshold,
    a prediction being positive when above it (TF: `metrics.true_positives_at_thresholds`
    and the others)."""

    def __init__(self, thresholds: Sequence[float], condition: str):
        if condition not in _CONDITIONS:
            raise ValueError(f"condition must be one of {sorted(_CONDITIONS)}, got {condition!r}")
        thresholds = tuple(float(t) for t in thresholds)
        super().__init__(thresholds, thresholds=thresholds, condition=condition)

    def result(self) -> torch.Tensor:
        return getattr(self, self.config["condition"])


class PrecisionAtThresholds(_AtThresholds):
    """tp / (tp + fp + 1e-7) at each threshold (TF: `metrics.precision_at_thresholds`)."""

    def __init__(self, thresholds: Sequence[float]):
        thresholds = tuple(float(t) for t in thresholds)
        super().__init__(thresholds, thresholds=thresholds)

    def result(self) -> torch.Tensor:
        return self.true_positives / (1e-7 + self.true_positives + self.false_positives)


class RecallAtThresholds(PrecisionAtThresholds):
    """tp / (tp + fn + 1e-7) at each threshold (TF: `metrics.recall_at_thresholds`)."""

    def result(self) -> torch.Tensor:
        return self.true_positives / (1e-7 + self.true_positives + self.false_negatives)


def _curve_thresholds(num_thresholds: int, last: float) -> list:
    if not isinstance(num_thresholds, numbers.Integral) or num_thresholds < 2:
        raise ValueError(f"num_thresholds must be an int >= 2, got {num_thresholds!r}")
    inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
    return [0.0 - 1e-7] + inner + [last]


def _check_rate(value, name: str) -> float:
    if not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"`{name}` must be in the range [0, 1]. Currently, `{name}` got "
                         f"{value!r}.")
    return float(value)


def _rate(hits: torch.Tensor, misses: torch.Tensor) -> torch.Tensor:
    """hits / (hits + misses + 1e-7) in float32, as TF's: the rates nearest a
    target are then TF's (in float64 the 1e-7 broke a tie of two rates
    0.25 from it, another threshold picked)."""
    hits = hits.float()
    return hits / (hits + misses.float() + 1e-7)


def _float32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


class SensitivityAtSpecificity(_AtThresholds):
    """The sensitivity at the threshold whose specificity is nearest to
    `specificity` (the first such; TF: `metrics.sensitivity_at_specificity`)."""

    def __init__(self, specificity: float, num_thresholds: int = 200):
        super().__init__(_curve_thresholds(num_thresholds, 1.0 + 1e-7),
                         specificity=_check_rate(specificity, "specificity"),
                         num_thresholds=num_thresholds)

    def result(self) -> torch.Tensor:
        tp, fn = self.true_positives, self.false_negatives
        specificity = _rate(self.true_negatives, self.false_positives)
        i = (specificity - _float32(self.config["specificity"])).abs().argmin()
        return tp[i] / (tp[i] + fn[i] + 1e-7)


class SpecificityAtSensitivity(_AtThresholds):
    """The specificity at the threshold whose sensitivity is nearest to
    `sensitivity` (the last such; TF: `metrics.specificity_at_sensitivity`,
    whose last threshold is 1 - 1e-7)."""

    def __init__(self, sensitivity: float, num_thresholds: int = 200):
        super().__init__(_curve_thresholds(num_thresholds, 1.0 - 1e-7),
                         sensitivity=_check_rate(sensitivity, "sensitivity"),
                         num_thresholds=num_thresholds)

    def result(self) -> torch.Tensor:
        tn, fp = self.true_negatives, self.false_positives
        sensitivity = _rate(self.true_positives, self.false_negatives)
        gap = (sensitivity - _float32(self.config["sensitivity"])).abs()
        i = (gap == gap.min()).nonzero()[-1, 0]
        return tn[i] / (tn[i] + fp[i] + 1e-7)


def _class_ids(labels, predictions, device, weights):
    """Flat int64 labels and predictions and their float64 weights (TF
    reshapes each to [-1])."""
    labels, predictions = _match(labels, predictions, device, torch.int64)
    w = _weights(weights, labels.shape, device)
    w = torch.ones(labels.shape, dtype=_F64, device=device) if w is None else w
    return labels.reshape(-1), predictions.reshape(-1), w.reshape(-1)


def check_range(ids: torch.Tensor, high: int, message: str, hint: str = "") -> None:
    """Raise ValueError(`message`, the first id outside [0, high], `hint`)
    where `ids` has one (TF's assert ops): on the host for CPU ids, a
    device-side assertion elsewhere (no sync)."""
    if ids.device.type != "cpu":
        torch._assert_async(((ids >= 0) & (ids <= high)).all(), message)
    elif ids.numel():
        bounds = torch.aminmax(ids)
        if bounds.min.item() < 0 or bounds.max.item() > high:
            bad = ids[(ids < 0) | (ids > high)].reshape(-1)[0].item()
            raise ValueError(f"{message}; got {bad}{hint}")


def _check_num_classes(num_classes) -> int:
    if not isinstance(num_classes, numbers.Integral) or isinstance(num_classes, bool) \
            or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return num_classes


class MeanPerClassAccuracy(Metric):
    """The mean over all `num_classes` classes of each class's (weighted)
    accuracy; a class no label names counts as 0, as in TF
    (`metrics.mean_per_class_accuracy`)."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes=_check_num_classes(num_classes))
        self._add_state("total", (num_classes,))
        self._add_state("count", (num_classes,))

    def update_state(self, labels, predictions, weights=None) -> None:
        labels, predictions, w = _class_ids(labels, predictions, self.device, weights)
        self.total.scatter_add_(0, labels, w)
        self.count.scatter_add_(0, labels, w * (predictions == labels))

    def result(self) -> torch.Tensor:
        return _div_no_nan(self.count, self.total.clamp(min=0)).mean()


class MeanIoU(Metric):
    """Mean intersection over union of the classes that occur (as label or
    prediction) (TF: `metrics.mean_iou`); 0 when none does."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes=_check_num_classes(num_classes))
        self._add_state("total_confusion_matrix", (num_classes, num_classes))

    def update_state(self, labels, predictions, weights=None) -> None:
        labels, predictions, w = _class_ids(labels, predictions, self.device, weights)
        n = self.config["num_classes"]
        for name, ids in (("labels", labels), ("predictions", predictions)):   # (TF's checks:
            check_range(ids, n - 1, f"{name} out of bound: not in [0, num_classes - 1] = "   # a
                        f"[0, {n - 1}]")   # pair out of range made another's cell count)
        self.total_confusion_matrix.view(-1).scatter_add_(0, labels * n + predictions, w)

    def result(self) -> torch.Tensor:
        cm = self.total_confusion_matrix
        diagonal = cm.diagonal()
        union = cm.sum(0) + cm.sum(1) - diagonal
        valid = (union != 0).sum()
        iou = diagonal / torch.where(union > 0, union, torch.ones_like(union))
        return torch.where(valid > 0, iou.sum() / valid.clamp(min=1), torch.zeros_like(iou.sum()))


class MeanRelativeError(Mean):
    """Mean of |labels - predictions| / normalizer, 0 where the normalizer is
    0 (TF: `metrics.mean_relative_error`)."""

    def update_state(self, labels, predictions, normalizer, weights=None) -> None:
        labels, predictions = _match(labels, predictions, self.device, _F64)
        normalizer = _as(normalizer, self.device, _F64)
        if normalizer.dim() == predictions.dim() + 1 and normalizer.shape[-1] == 1:
            normalizer = normalizer.squeeze(-1)
        error = (labels - predictions).abs() / torch.where(normalizer == 0, 1.0, normalizer)
        self._accumulate(torch.where(normalizer == 0, 0.0, error), weights)


class MeanCosineDistance(Mean):
    """1 - the mean over examples of sum(labels * predictions) along `dim`
    (unit vectors: their cosine distance; TF: `metrics.mean_cosine_distance`)."""

    def __init__(self, dim: int):
        super().__init__(dim=dim)

    def update_state(self, labels, predictions, weights=None) -> None:
        labels, predictions = _match(labels, predictions, self.device, _F64)
        self._accumulate((labels * predictions).sum(self.config["dim"], keepdim=True), weights)

    def result(self) -> torch.Tensor:
        return 1.0 - super().result()


class PercentageBelow(Mean):
    """The (weighted) fraction of values below `threshold` (TF: `metrics.percentage_below`)."""

    def __init__(self, threshold: float):
        super().__init__(threshold=threshold)

    def update_state(self, values, weights=None) -> None:
        values = _as(values, self.device)
        self._accumulate((values < self.config["threshold"]).to(_F64), weights)


# -- the tf.compat.v1.metrics functions ------------------------------------------------
def _streaming(name: str, cls, args: tuple, **config) -> Metric:
    """The scope's metric `name` (a `cls(**config)`), updated with `args` when
    the scope updates metrics (TRAIN, EVAL, or no scope); no tensor work in
    PREDICT."""
    metric = model_scope.get_metric(name, lambda: cls(**config))
    if isinstance(metric, Metric) and (type(metric) is not cls or metric.config != config):
        raise ValueError(f"metric name {name!r} is already used by {metric!r}; "
                         f"pass a distinct name= for {cls.__name__}({_kw(config)})")
    if model_scope.updates_metrics():
        metric.update_state(*args)
    return metric


def _kw(config: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in config.items())


def mean(values, weights=None, name=None) -> Mean:
    """TF: `tf.compat.v1.metrics.mean`."""
    return _streaming(name or "mean", Mean, (values, weights))


def accuracy(labels, predictions, weights=None, name=None) -> Accuracy:
    """TF: `tf.compat.v1.metrics.accuracy`."""
    return _streaming(name or "accuracy", Accuracy, (labels, predictions, weights))


def mean_squared_error(labels, predictions, weights=None, name=None) -> MeanSquaredError:
    """TF: `tf.compat.v1.metrics.mean_squared_error`."""
    return _streaming(name or "mean_squared_error", MeanSquaredError,
                      (labels, predictions, weights))


def root_mean_squared_error(labels, predictions, weights=None,
                            name=None) -> RootMeanSquaredError:
    """TF: `tf.compat.v1.metrics.root_mean_squared_error`."""
    return _streaming(name or "root_mean_squared_error", RootMeanSquaredError,
                      (labels, predictions, weights))


def mean_absolute_error(labels, predictions, weights=None, name=None) -> MeanAbsoluteError:
    """TF: `tf.compat.v1.metrics.mean_absolute_error`."""
    return _streaming(name or "mean_absolute_error", MeanAbsoluteError,
                      (labels, predictions, weights))


def precision(labels, predictions, weights=None, name=None) -> Precision:
    """TF: `tf.compat.v1.metrics.precision` (inputs cast to bool)."""
    return _streaming(name or "precision", Precision, (labels, predictions, weights))


def recall(labels, predictions, weights=None, name=None) -> Recall:
    """TF: `tf.compat.v1.metrics.recall` (inputs cast to bool)."""
    return _streaming(name or "recall", Recall, (labels, predictions, weights))


def auc(labels, predictions, weights=None, num_thresholds=200, curve="ROC", name=None,
        summation_method="trapezoidal", thresholds=None) -> AUC:
    """TF: `tf.compat.v1.metrics.auc` (bucketed thresholds; labels cast to bool,
    predictions in [0, 1])."""
    return _streaming(name or "auc", AUC, (labels, predictions, weights),
                      num_thresholds=num_thresholds, curve=curve,
                      summation_method=summation_method,
                      thresholds=None if thresholds is None else tuple(thresholds))


def _at_k_name(name: str, k: Optional[int], class_id: Optional[int]) -> str:
    """TF's default name: `precision_at_5`, `recall_at_1_class3`."""
    name = f"{name}_at_{k}" if k is not None else f"{name}_at_k"
    return name if class_id is None else f"{name}_class{class_id}"


def precision_at_k(labels, predictions, k, class_id=None, weights=None,
                   name=None) -> PrecisionAtK:
    """TF: `tf.compat.v1.metrics.precision_at_k`. `labels`: int class ids
    (N,) or (N, num_labels); `predictions`: scores (N, C). Default name as TF's
    (`precision_at_<k>[_class<id>]`)."""
    return _streaming(name or _at_k_name("precision", k, class_id), PrecisionAtK,
                      (labels, predictions, weights), k=k, class_id=class_id,
                      indices=False)


sparse_precision_at_k = precision_at_k     # TF's older name


def recall_at_k(labels, predictions, k, class_id=None, weights=None,
                name=None) -> RecallAtK:
    """TF: `tf.compat.v1.metrics.recall_at_k` (see `precision_at_k`)."""
    return _streaming(name or _at_k_name("recall", k, class_id), RecallAtK,
                      (labels, predictions, weights), k=k, class_id=class_id,
                      indices=False)


def precision_at_top_k(labels, predictions_idx, k=None, class_id=None, weights=None,
                       name=None) -> PrecisionAtK:
    """TF: `tf.compat.v1.metrics.precision_at_top_k` (predictions are the top-k
    class ids; `k` only names the metric)."""
    return _streaming(name or _at_k_name("precision", k, class_id), PrecisionAtK,
                      (labels, predictions_idx, weights), k=k, class_id=class_id,
                      indices=True)


def recall_at_top_k(labels, predictions_idx, k=None, class_id=None, weights=None,
                    name=None) -> RecallAtK:
    """TF: `tf.compat.v1.metrics.recall_at_top_k` (see `precision_at_top_k`)."""
    return _streaming(name or _at_k_name("recall", k, class_id), RecallAtK,
                      (labels, predictions_idx, weights), k=k, class_id=class_id,
                      indices=True)


def _count(condition: str, labels, predictions, weights, name) -> ConditionCount:
    return _streaming(name or condition, ConditionCount, (labels, predictions, weights),
                      condition=condition)


def true_positives(labels, predictions, weights=None, name=None) -> ConditionCount:
    """TF: `tf.compat.v1.metrics.true_positives` (inputs cast to bool)."""
    return _count("true_positives", labels, predictions, weights, name)


def false_positives(labels, predictions, weights=None, name=None) -> ConditionCount:
    """TF: `tf.compat.v1.metrics.false_positives` (inputs cast to bool)."""
    return _count("false_positives", labels, predictions, weights, name)


def true_negatives(labels, predictions, weights=None, name=None) -> ConditionCount:
    """TF: `tf.compat.v1.metrics.true_negatives` (inputs cast to bool)."""
    return _count("true_negatives", labels, predictions, weights, name)


def false_negatives(labels, predictions, weights=None, name=None) -> ConditionCount:
    """TF: `tf.compat.v1.metrics.false_negatives` (inputs cast to bool)."""
    return _count("false_negatives", labels, predictions, weights, name)


def _count_at(condition: str, labels, predictions, thresholds, weights,
              name) -> CountsAtThresholds:
    return _streaming(name or condition, CountsAtThresholds, (labels, predictions, weights),
                      thresholds=tuple(float(t) for t in thresholds), condition=condition)


def true_positives_at_thresholds(labels, predictions, thresholds, weights=None,
                                 name=None) -> CountsAtThresholds:
    """TF: `tf.compat.v1.metrics.true_positives_at_thresholds` (predictions in
    [0, 1], positive when above a threshold; TF's default name `true_positives`)."""
    return _count_at("true_positives", labels, predictions, thresholds, weights, name)


def false_positives_at_thresholds(labels, predictions, thresholds, weights=None,
                                  name=None) -> CountsAtThresholds:
    """TF: `tf.compat.v1.metrics.false_positives_at_thresholds`."""
    return _count_at("false_positives", labels, predictions, thresholds, weights, name)


def true_negatives_at_thresholds(labels, predictions, thresholds, weights=None,
                                 name=None) -> CountsAtThresholds:
    """TF: `tf.compat.v1.metrics.true_negatives_at_thresholds`."""
    return _count_at("true_negatives", labels, predictions, thresholds, weights, name)


def false_negatives_at_thresholds(labels, predictions, thresholds, weights=None,
                                  name=None) -> CountsAtThresholds:
    """TF: `tf.compat.v1.metrics.false_negatives_at_thresholds`."""
    return _count_at("false_negatives", labels, predictions, thresholds, weights, name)


def precision_at_thresholds(labels, predictions, thresholds, weights=None,
                            name=None) -> PrecisionAtThresholds:
    """TF: `tf.compat.v1.metrics.precision_at_thresholds`."""
    return _streaming(name or "precision_at_thresholds", PrecisionAtThresholds,
                      (labels, predictions, weights),
                      thresholds=tuple(float(t) for t in thresholds))


def recall_at_thresholds(labels, predictions, thresholds, weights=None,
                         name=None) -> RecallAtThresholds:
    """TF: `tf.compat.v1.metrics.recall_at_thresholds`."""
    return _streaming(name or "recall_at_thresholds", RecallAtThresholds,
                      (labels, predictions, weights),
                      thresholds=tuple(float(t) for t in thresholds))


def sensitivity_at_specificity(labels, predictions, specificity, weights=None,
                               num_thresholds=200, name=None) -> SensitivityAtSpecificity:
    """TF: `tf.compat.v1.metrics.sensitivity_at_specificity`."""
    return _streaming(name or "sensitivity_at_specificity", SensitivityAtSpecificity,
                      (labels, predictions, weights), specificity=specificity,
                      num_thresholds=num_thresholds)


def specificity_at_sensitivity(labels, predictions, sensitivity, weights=None,
                               num_thresholds=200, name=None) -> SpecificityAtSensitivity:
    """TF: `tf.compat.v1.metrics.specificity_at_sensitivity`."""
    return _streaming(name or "specificity_at_sensitivity", SpecificityAtSensitivity,
                      (labels, predictions, weights), sensitivity=sensitivity,
                      num_thresholds=num_thresholds)


def mean_per_class_accuracy(labels, predictions, num_classes, weights=None,
                            name=None) -> MeanPerClassAccuracy:
    """TF: `tf.compat.v1.metrics.mean_per_class_accuracy` (TF's default name
    `mean_accuracy`)."""
    return _streaming(name or "mean_accuracy", MeanPerClassAccuracy,
                      (labels, predictions, weights), num_classes=num_classes)


def mean_iou(labels, predictions, num_classes, weights=None, name=None) -> MeanIoU:
    """TF: `tf.compat.v1.metrics.mean_iou`."""
    return _streaming(name or "mean_iou", MeanIoU, (labels, predictions, weights),
                      num_classes=num_classes)


def mean_relative_error(labels, predictions, normalizer, weights=None,
                        name=None) -> MeanRelativeError:
    """TF: `tf.compat.v1.metrics.mean_relative_error`."""
    return _streaming(name or "mean_relative_error", MeanRelativeError,
                      (labels, predictions, normalizer, weights))


def mean_cosine_distance(labels, predictions, dim, weights=None,
                         name=None) -> MeanCosineDistance:
    """TF: `tf.compat.v1.metrics.mean_cosine_distance` (labels and predictions
    unit-normalised along `dim`)."""
    return _streaming(name or "mean_cosine_distance", MeanCosineDistance,
                      (labels, predictions, weights), dim=dim)


def percentage_below(values, threshold, weights=None, name=None) -> PercentageBelow:
    """TF: `tf.compat.v1.metrics.percentage_below` (TF's default name
    `percentage_below_threshold`)."""
    return _streaming(name or "percentage_below_threshold", PercentageBelow,
                      (values, weights), threshold=threshold)


def average_precision_at_k(labels, predictions, k, weights=None,
                           name=None) -> AveragePrecisionAtK:
    """TF: `tf.compat.v1.metrics.average_precision_at_k` (also
    `sparse_average_precision_at_k`). `labels`: int class ids (N,) or (N,
    num_labels); `predictions`: scores (N, C)."""
    return _streaming(name or f"average_precision_at_{k}", AveragePrecisionAtK,
                      (labels, predictions, weights), k=k)


sparse_average_precision_at_k = average_precision_at_k
