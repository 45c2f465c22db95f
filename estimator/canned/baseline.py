"""`BaselineClassifier` and `BaselineRegressor` (TF1: ``tf.compat.v1.estimator.Baseline*``):
one learned bias per logit, ``baseline/bias`` [logits], ignoring the features;
it learns the label distribution (the mean label), a floor any model should beat.
Default optimizer: ``'Ftrl'`` with learning rate 0.3.
"""
from __future__ import annotations

import torch

from hooks import model_scope

from ..losses import Reduction
from ._base import CannedEstimator, batch_size, check_optimizer_spec, make_optimizer
from ._head import ClassificationHead, RegressionHead

LEARNING_RATE = 0.3


class Bias(torch.nn.Module):
    """TF's ``baseline/bias`` variable (zeros); `forward(batch)` repeats it per example."""

    def __init__(self, units: int):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(units))

    def forward(self, batch: int):
        return self.bias.expand(batch, -1)


class _Baseline(CannedEstimator):
    def __init__(self, head, model_dir, optimizer, config):
        check_optimizer_spec(optimizer)
        self._optimizer = optimizer
        super().__init__(head, model_dir, config)

    def _logits(self, features, mode):
        units = self._head.logits_dimension
        module = model_scope.get_module("baseline", lambda: Bias(units))
        return module(batch_size(features.features))

    def _train_op_fn(self, loss):
        return make_optimizer(self._optimizer, LEARNING_RATE)


class BaselineClassifier(_Baseline):
    """Predicts the class distribution of the labels (TF:
    ``tf.compat.v1.estimator.BaselineClassifier``)."""

    def __init__(self, model_dir=None, n_classes=2, weight_column=None,
                 label_vocabulary=None, optimizer="Ftrl", config=None,
                 loss_reduction=Reduction.SUM):
        head = ClassificationHead(n_classes, weight_column, label_vocabulary, loss_reduction)
        super().__init__(head, model_dir, optimizer, config)


class BaselineEstimator(_Baseline):
    """One learned bias per logit under a given head (TF:
    ``tf.compat.v1.estimator.BaselineEstimator``), e.g. `MultiLabelHead`."""

    def __init__(self, head, model_dir=None, optimizer="Ftrl", config=None):
        super().__init__(head, model_dir, optimizer, config)


class BaselineRegressor(_Baseline):
    """Predicts the mean label (TF: ``tf.compat.v1.estimator.BaselineRegressor``)."""

    def __init__(self, model_dir=None, label_dimension=1, weight_column=None,
                 optimizer="Ftrl", config=None, loss_reduction=Reduction.SUM):
        head = RegressionHead(label_dimension, weight_column, loss_reduction)
        super().__init__(head, model_dir, optimizer, config)
