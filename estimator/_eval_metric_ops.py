"""What `evaluate` reports for a spec's `eval_metric_ops`, exact over every
batch and replica (TF: running each `(value, update_op)` pair's update op per
batch, then reading the value tensors).

Each key's value, every step, is one of:
- a metric of the model scope (`est.metrics.*`): it streams by itself; its
  state is read at the end;
- a new `est.metrics.Metric` made and updated in this model_fn call: its state
  (sums and counts) is added into an accumulator of the same class in the scope;
- a scalar tensor: averaged over all evaluated examples (each batch weighted by
  its number of examples) in a `metrics.Mean` of the scope.
Accumulators live in the scope under `eval_metric_ops/<key>`, so the strategy
all-reduces them with the other metrics. Anything else is an error naming the key.
"""
from __future__ import annotations

import copy

import torch

from . import metrics

_PREFIX = "eval_metric_ops/"


def _batch_size(features, labels) -> int:
    """Examples in the batch: the first dimension of the labels, else of the
    first feature that has one."""
    for value in ([labels] if labels is not None else []) + (
            list(features.values()) if isinstance(features, dict) else [features]):
        if isinstance(value, torch.Tensor) and value.dim():
            return value.shape[0]
        if hasattr(value, "__len__") and not isinstance(value, (str, bytes)):
            return len(value)
    raise ValueError("eval_metric_ops: a scalar-tensor metric is averaged over examples, "
                     "but the batch has no labels or features with a batch dimension")


class EvalMetricOps:
    """Accumulates one evaluation's `eval_metric_ops` in `scope`."""

    def __init__(self, scope):
        self._scope = scope
        self._metrics = {}   # key -> the metric whose result is reported
        self._last = {}      # key -> the value of the last step (a per-call Metric)

    def update(self, eval_metric_ops: dict, features, labels) -> None:
        _check_reserved(eval_metric_ops)
        scope = self._scope
        for key, value in eval_metric_ops.items():
            if self._metrics.get(key) is value:
                continue   # a metric of the scope, seen on an earlier step
            if isinstance(value, metrics.Metric):
                if any(value is m for m in scope.metrics.values()):
                    self._metrics[key] = value   # est.metrics.*: streams by itself
                    continue
                self._fold(key, value)
            elif isinstance(value, torch.Tensor) and value.numel() == 1:
                mean = self._accumulator(key, metrics.Mean, value)
                n = _batch_size(features, labels)
                mean.update_state(value.detach().reshape(()),
                                  torch.tensor(float(n), dtype=torch.float64))
            else:
                raise TypeError(
                    f"eval_metric_ops[{key!r}] must be an est.metrics metric, an "
                    f"est.metrics.Metric, or a scalar tensor; got {_describe(value)}"
                    + (". For TF's (value, update_op) pair give the metric object itself"
                       if isinstance(value, tuple) else ""))

    def declare(self, eval_metric_ops: dict) -> None:
        """Report every key of `eval_metric_ops` (the first batch's spec) over no
        batch: a hook stopped the evaluation before its first step, and TF's
        metrics, whose update ops never ran, read 0. The scope's own metrics
        are reset (the model_fn call that made the spec updated them)."""
        _check_reserved(eval_metric_ops)
        scope = self._scope
        for key, value in eval_metric_ops.items():
            if isinstance(value, metrics.Metric) and any(
                    value is m for m in scope.metrics.values()):
                value.reset_state()
                self._metrics[key] = value
            elif isinstance(value, metrics.Metric):
                self._accumulator(key, type(value), value)
            elif isinstance(value, torch.Tensor) and value.numel() == 1:
                self._accumulator(key, metrics.Mean, value)

    def _fold(self, key: str, metric) -> None:
        """Add this call's `metric` (made and updated with this batch) into the
        scope's accumulator for `key`."""
        if self._last.get(key) is metric:
            raise ValueError(
                f"eval_metric_ops[{key!r}]: the same {type(metric).__name__} object was "
                "returned for two batches but is not a metric of the model scope. Make a "
                "new one in each model_fn call (its state is added up over the batches), "
                "or use est.metrics.* functions, which stream")
        self._last[key] = metric
        accumulator = self._accumulator(key, type(metric), metric)
        for total, part in zip(accumulator.buffers(), metric.buffers()):
            total += part.to(total.device)

    def _accumulator(self, key: str, cls, example):
        metric = self._metrics.get(key)
        if metric is None:
            name = _PREFIX + key
            metric = self._scope.metrics.get(name)
            if metric is None:
                metric = self._scope.create_metric(name, lambda: _zeroed(cls, example))
            self._metrics[key] = metric
        if type(metric) is not cls:
            raise TypeError(f"eval_metric_ops[{key!r}] changed from {type(metric).__name__} "
                            f"to {cls.__name__} between batches")
        return metric

    def results(self) -> dict:
        """{key: result tensor}, once the scope's metrics are reduced."""
        return {key: metric.result() for key, metric in self._metrics.items()}


def _check_reserved(eval_metric_ops: dict) -> None:
    for reserved in ("loss", "global_step"):
        if reserved in eval_metric_ops:   # (TF's words)
            raise ValueError(
                f'Metric with name "{reserved}" is not allowed, because Estimator '
                f"already defines a default metric with the same name "
                f"(eval_metric_ops[{reserved!r}]; rename it)")


def _zeroed(cls, example):
    """A zeroed metric with `example`'s configuration (a copy of it)."""
    if cls is metrics.Mean:
        return metrics.Mean()
    metric = copy.deepcopy(example).cpu()
    metric.reset_state()
    return metric


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__
