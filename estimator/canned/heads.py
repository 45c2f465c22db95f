"""TF2's single-task heads for the head-taking estimators (`DNNEstimator`, ...) or a
model_fn's ``head.create_estimator_spec`` (TF: ``tf.estimator.BinaryClassHead``,
``MultiClassHead``, ``RegressionHead``, ``PoissonRegressionHead``,
``LogisticRegressionHead``, also under ``tf.compat.v1.estimator``; TF1 programs:
``tf.contrib.estimator.binary_classification_head`` and the others).

Each is the canned classifier's or regressor's head (`_head`) with TF2's
arguments and defaults: the loss reduced ``'sum_over_batch_size'`` (or
``'sum'``), an optional ``loss_fn(labels, logits[, features])`` giving the
unreduced loss, a `name` suffixing every metric key (``auc/<name>``), and the
precision-recall AUC interpolated as Keras's AUC computes it. Their
evaluation and prediction keys are the canned estimators'; `BinaryClassHead`
adds ``accuracy/positive_threshold_<t>``, ``precision/...`` and
``recall/...`` for each of its `thresholds`.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from . import _head


class BinaryClassHead(_head.ClassificationHead):
    """Binary classification: one logit, sigmoid cross entropy (TF:
    ``tf.estimator.BinaryClassHead``, same arguments and defaults)."""

    _PR_SUMMATION = "careful_interpolation"

    def __init__(self, weight_column=None, thresholds: Optional[Sequence[float]] = None,
                 label_vocabulary: Optional[Sequence[str]] = None,
                 loss_reduction: str = "sum_over_batch_size", loss_fn=None,
                 name: Optional[str] = None):
        super().__init__(2, weight_column, label_vocabulary, loss_reduction, thresholds,
                         loss_fn, name)


class MultiClassHead(_head.ClassificationHead):
    """Multi-class classification: a logit per class, softmax cross entropy
    (TF: ``tf.estimator.MultiClassHead``, same arguments and defaults)."""

    def __init__(self, n_classes: int, weight_column=None,
                 label_vocabulary: Optional[Sequence[str]] = None,
                 loss_reduction: str = "sum_over_batch_size", loss_fn=None,
                 name: Optional[str] = None):
        if not isinstance(n_classes, int) or isinstance(n_classes, bool) or n_classes <= 2:
            raise ValueError(f"n_classes must be > 2: {n_classes} (BinaryClassHead for two)")
        super().__init__(n_classes, weight_column, label_vocabulary, loss_reduction, None,
                         loss_fn, name)


class RegressionHead(_head.RegressionHead):
    """Regression of `label_dimension` values, mean squared error of the logits
    (TF: ``tf.estimator.RegressionHead``, same arguments and defaults).
    `inverse_link_fn(logits)` gives the ``predictions`` (then ``logits`` are
    predicted too); the loss is still the logits'."""

    def __init__(self, label_dimension: int = 1, weight_column=None,
                 loss_reduction: str = "sum_over_batch_size", loss_fn=None,
                 inverse_link_fn: Optional[Callable] = None, name: Optional[str] = None):
        super().__init__(label_dimension, weight_column, loss_reduction, loss_fn,
                         inverse_link_fn, name)


class PoissonRegressionHead(RegressionHead):
    """Poisson regression of counts: predictions ``exp(logits)``, the loss
    TF's ``log_poisson_loss(labels, logits, compute_full_loss=True)`` (TF:
    ``tf.estimator.PoissonRegressionHead``)."""

    def __init__(self, label_dimension: int = 1, weight_column=None,
                 loss_reduction: str = "sum_over_batch_size",
                 compute_full_loss: bool = True, name: Optional[str] = None):
        self._full = compute_full_loss
        super().__init__(label_dimension, weight_column, loss_reduction, None, torch.exp,
                         name)

    def _unreduced_loss(self, labels, logits):
        return F.poisson_nll_loss(logits, labels, log_input=True, full=self._full,
                                  reduction="none")


class LogisticRegressionHead(RegressionHead):
    """Regression of values in [0, 1]: predictions ``sigmoid(logits)``, the loss
    the sigmoid cross entropy (TF: ``tf.estimator.LogisticRegressionHead``)."""

    def __init__(self, weight_column=None, loss_reduction: str = "sum_over_batch_size",
                 name: Optional[str] = None):
        super().__init__(1, weight_column, loss_reduction, None, torch.sigmoid, name)

    def _labels(self, labels, logits):
        labels = super()._labels(labels, logits)
        if labels.device.type == "cpu" and labels.numel() and (
                labels.min().item() < 0 or labels.max().item() > 1):
            bad = labels[(labels < 0) | (labels > 1)].reshape(-1)[0].item()
            raise ValueError(f"Labels must be in range [0, 1]; got {bad}")
        return labels

    def _unreduced_loss(self, labels, logits):
        return F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
