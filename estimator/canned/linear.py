"""`LinearClassifier` and `LinearRegressor` (TF1: ``tf.compat.v1.estimator.Linear*``).

The model is `feature_column.linear_model` under the variable scope
``linear``: ``linear/linear_model/<column>/weights`` and
``linear/linear_model/bias_weights``, all starting at zero. Optimizer: a
name (default ``'Ftrl'``) at learning rate 0.2; ``optimizer=None``: Ftrl at
``min(0.2, 1 / sqrt(number of columns))`` (TF's rules); or
``est.experimental.LinearSDCA(...)``, TF's SDCA (`linear_sdca`). Training summaries
as TF's: ``linear/bias`` and ``linear/fraction_of_zero_weights``, on steps
that write summaries.
"""
from __future__ import annotations

import math

import torch

from hooks import summary

from .. import feature_column
from ..losses import Reduction
from ..mode_keys import ModeKeys
from . import linear_sdca
from ._base import (CannedEstimator, check_optimizer_spec, column_tuple, features_cache,
                    make_optimizer)
from ._head import ClassificationHead, RegressionHead
from .heads import BinaryClassHead, RegressionHead as RegressionHeadV2
from .linear_sdca import LinearSDCA

LEARNING_RATE = 0.2
_COMBINERS = ("mean", "sqrtn", "sum")


def learning_rate(num_columns: int, cap: float = LEARNING_RATE) -> float:
    """TF1's linear learning rate for a default optimizer (LinearClassifier's
    `optimizer=None`, wide & deep's linear part): min(cap, 1 / sqrt(num_columns))."""
    return min(cap, 1.0 / math.sqrt(num_columns))


def linear_logits(features, units: int, feature_columns, sparse_combiner: str,
                  scope: str = "linear", cols_to_vars=None) -> torch.Tensor:
    """TF1's ``linear_logit_fn``: `linear_model` logits plus its summaries
    (`cols_to_vars`: as `linear_model`'s)."""
    record = summary.should_record_summaries()
    variables = {} if record or cols_to_vars is not None else None
    logits = feature_column.linear_model(features, feature_columns, units=units,
                                         sparse_combiner=sparse_combiner,
                                         cols_to_vars=variables, scope=scope)
    if cols_to_vars is not None:
        cols_to_vars.update(variables)
    if record:
        variables = dict(variables)
        bias = variables.pop("bias")[0]
        if units > 1:
            summary.histogram(f"{scope}/bias", bias)
        else:
            summary.scalar(f"{scope}/bias", bias.reshape(-1)[0])
        weights = [p for params in variables.values() for p in params]
        zeros = sum((w == 0).sum() for w in weights)
        summary.scalar(f"{scope}/fraction_of_zero_weights",
                       zeros / sum(w.numel() for w in weights))
    return logits


def check_combiner(sparse_combiner: str) -> str:
    if sparse_combiner not in _COMBINERS:
        raise ValueError(f"sparse_combiner must be one of {list(_COMBINERS)}, got "
                         f"{sparse_combiner!r}")
    return sparse_combiner


class _Linear(CannedEstimator):
    def __init__(self, head, feature_columns, model_dir, optimizer, config,
                 warm_start_from, sparse_combiner):
        self._feature_columns = column_tuple(feature_columns, "feature_columns")
        if not self._feature_columns:
            raise ValueError("feature_columns must not be empty.")
        if isinstance(optimizer, LinearSDCA):
            if sparse_combiner != "sum":
                raise ValueError('sparse_combiner must be "sum" when optimizer is a LinearSDCA '
                                 'object.')
            linear_sdca.check_columns(self._feature_columns)
            self._sdca_loss = _sdca_loss(head)
        elif optimizer is not None:
            check_optimizer_spec(optimizer)
        self._optimizer = optimizer
        self._sparse_combiner = check_combiner(sparse_combiner)
        super().__init__(head, model_dir, config, warm_start_from)

    def _canned_model_fn(self, features, labels, mode):
        if mode != ModeKeys.TRAIN or not isinstance(self._optimizer, LinearSDCA):
            return super()._canned_model_fn(features, labels, mode)
        cache = features_cache(features)
        variables = {}
        logits = linear_logits(cache, 1, self._feature_columns, "sum", cols_to_vars=variables)
        ids = features.get(self._optimizer._example_id_column)
        step = linear_sdca.train_op(
            self._optimizer, self._sdca_loss, cache, ids, variables, self._feature_columns,
            self._head._labels(labels, logits) if labels is not None else None,
            self._head._weights(cache, logits))
        return self._head.create_estimator_spec(cache, mode, logits, labels,
                                                train_op_fn=lambda loss: step)

    def _logits(self, features, mode):
        return linear_logits(features, self._head.logits_dimension, self._feature_columns,
                             self._sparse_combiner)

    def _train_op_fn(self, loss):
        if self._optimizer is None:   # TF's _get_default_optimizer
            return make_optimizer("Ftrl", learning_rate(len(self._feature_columns)))
        return make_optimizer(self._optimizer, LEARNING_RATE)   # by name: 0.2, any columns


def _sdca_loss(head) -> str:
    """LinearSDCA's loss for `head` (TF's `_sdca_model_fn`): logistic for two
    classes, squared for one regression label."""
    if type(head) in (ClassificationHead, BinaryClassHead):
        if head.logits_dimension != 1:
            raise ValueError("LinearSDCA cannot be used in a multi-class setting.")
        return linear_sdca.LOGISTIC_LOSS
    if type(head) in (RegressionHead, RegressionHeadV2):
        if head.logits_dimension != 1:
            raise ValueError("LinearSDCA can only be used with one-dimensional label.")
        return linear_sdca.SQUARED_LOSS
    raise ValueError(f"LinearSDCA: unsupported head type {type(head).__name__}: a binary "
                     "classification head (logistic loss) or a regression head (squared loss) "
                     "(TF trains a Poisson or logistic regression head with the squared loss, "
                     "not its own)")


class LinearClassifier(_Linear):
    """A linear classifier (TF: ``tf.compat.v1.estimator.LinearClassifier``, same
    arguments and defaults). `partitioner` is accepted for TF's signature:
    placement is the strategy's."""

    def __init__(self, feature_columns, model_dir=None, n_classes=2, weight_column=None,
                 label_vocabulary=None, optimizer="Ftrl", config=None, partitioner=None,
                 warm_start_from=None, loss_reduction=Reduction.SUM, sparse_combiner="sum"):
        del partitioner
        head = ClassificationHead(n_classes, weight_column, label_vocabulary, loss_reduction)
        super().__init__(head, feature_columns, model_dir, optimizer, config,
                         warm_start_from, sparse_combiner)


class LinearEstimator(_Linear):
    """A linear model under a given head (TF: ``tf.compat.v1.estimator.LinearEstimator``),
    e.g. `MultiLabelHead`."""

    def __init__(self, head, feature_columns, model_dir=None, optimizer="Ftrl", config=None,
                 partitioner=None, sparse_combiner="sum", warm_start_from=None):
        del partitioner
        super().__init__(head, feature_columns, model_dir, optimizer, config,
                         warm_start_from, sparse_combiner)


class LinearRegressor(_Linear):
    """A linear regressor (TF: ``tf.compat.v1.estimator.LinearRegressor``)."""

    def __init__(self, feature_columns, model_dir=None, label_dimension=1,
                 weight_column=None, optimizer="Ftrl", config=None, partitioner=None,
                 warm_start_from=None, loss_reduction=Reduction.SUM, sparse_combiner="sum"):
        del partitioner
        head = RegressionHead(label_dimension, weight_column, loss_reduction)
        super().__init__(head, feature_columns, model_dir, optimizer, config,
                         warm_start_from, sparse_combiner)
