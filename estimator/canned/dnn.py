"""`DNNClassifier` and `DNNRegressor` (TF1: ``tf.compat.v1.estimator.DNN*``).

The network is TF1's ``_DNNModel``, with its variables under TF's names:

    dnn/input_from_feature_columns/input_layer/...   the feature columns
    dnn/hiddenlayer_<i>/kernel [in, units], bias     Glorot-uniform kernel, zero bias,
                                                     then activation_fn
    (dropout, rate `dropout`, in TRAIN only)
    dnn/hiddenlayer_<i>/batchnorm_<i>/gamma, beta, moving_mean, moving_variance
                                                     (batch_norm=True: momentum 0.999,
                                                     epsilon 0.001, as TF's)
    dnn/logits/kernel, bias                          no activation

Default optimizer: ``'Adagrad'`` with learning rate 0.05 (accumulators start
at 0.1). Training summaries under TF's tags (its name scope doubles the
``dnn/``): ``dnn/dnn/hiddenlayer_<i>/fraction_of_zero_values`` and
``.../activation`` histograms, for ``dnn/dnn/logits`` too, computed only on
steps that write summaries.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from hooks import model_scope, summary
from hooks.mode_keys import ModeKeys

from .. import feature_column
from ..layers import BatchNormalization
from ..losses import Reduction
from ._base import CannedEstimator, check_optimizer_spec, column_tuple, make_optimizer
from ._head import ClassificationHead, RegressionHead

LEARNING_RATE = 0.05


class Dense(torch.nn.Module):
    """TF's ``layers.Dense`` variables: `kernel` [in, units] (Glorot uniform),
    `bias` [units] (zeros); ``x @ kernel + bias``."""

    def __init__(self, in_features: int, units: int):
        super().__init__()
        self.kernel = torch.nn.Parameter(torch.empty(in_features, units))
        self.bias = torch.nn.Parameter(torch.zeros(units))
        limit = math.sqrt(6.0 / (in_features + units))
        torch.nn.init.uniform_(self.kernel, -limit, limit)

    def forward(self, x):
        return torch.addmm(self.bias, x, self.kernel)


def layer_summary(net: torch.Tensor, tag: str) -> None:
    """TF's ``_add_hidden_layer_summary``, on steps that write summaries."""
    if summary.should_record_summaries():
        summary.scalar(f"{tag}/fraction_of_zero_values", (net == 0).float().mean())
        summary.histogram(f"{tag}/activation", net)


def dnn_logits(features, mode, units: int, hidden_units: Sequence[int], feature_columns,
               activation_fn, dropout: Optional[float], batch_norm: bool,
               scope: str = "dnn") -> torch.Tensor:
    """TF1's ``dnn_logit_fn``: [batch, units] logits of the network above."""
    net = feature_column.input_layer(features, feature_columns,
                                     scope=f"{scope}/input_from_feature_columns")
    training = mode == ModeKeys.TRAIN
    for i, width in enumerate(hidden_units):
        name = f"{scope}/hiddenlayer_{i}"
        layer = model_scope.get_module(name, lambda n=net.shape[-1], w=width: Dense(n, w))
        net = layer(net)
        if activation_fn is not None:
            net = activation_fn(net)
        if dropout is not None and training:
            net = F.dropout(net, dropout, training=True)
        if batch_norm:
            norm = model_scope.get_module(f"{name}/batchnorm_{i}", lambda w=width: (
                BatchNormalization(w, momentum=0.999)))
            net = norm(net)
        layer_summary(net, f"{scope}/{name}")
    layer = model_scope.get_module(f"{scope}/logits",
                                   lambda n=net.shape[-1]: Dense(n, units))
    logits = layer(net)
    layer_summary(logits, f"{scope}/{scope}/logits")
    return logits


def _units(value) -> Optional[int]:
    """A layer's units as TF's Dense takes them (int(value): "32" and 32.0
    too, as a task.py splitting "32 8 4" gives), else None; 3.5, which TF
    truncates to 3 without a word, is refused."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if number.is_integer() else None   # (np.float32(3.5) too)


def check_dnn_args(hidden_units, feature_columns, dropout, activation_fn) -> tuple:
    units = [_units(u) for u in (list(hidden_units) if hidden_units is not None else [])]
    if not units or not all(u is not None and u > 0 for u in units):
        raise ValueError(f"hidden_units must be a non-empty list of positive ints, got "
                         f"{hidden_units!r}")
    if dropout is not None and not 0 <= dropout < 1:
        raise ValueError(f"dropout must be None or in [0, 1), got {dropout!r}")
    if activation_fn is not None and not callable(activation_fn):
        raise TypeError(f"activation_fn must be callable, got {activation_fn!r}")
    return tuple(units), column_tuple(feature_columns, "feature_columns")


class _DNN(CannedEstimator):
    def __init__(self, head, hidden_units, feature_columns, model_dir, optimizer,
                 activation_fn, dropout, config, warm_start_from, batch_norm):
        self._hidden_units, self._feature_columns = check_dnn_args(
            hidden_units, feature_columns, dropout, activation_fn)
        if not self._feature_columns:
            raise ValueError("feature_columns must not be empty.")
        check_optimizer_spec(optimizer)
        self._optimizer, self._activation_fn = optimizer, activation_fn
        self._dropout, self._batch_norm = dropout, bool(batch_norm)
        super().__init__(head, model_dir, config, warm_start_from)

    def _logits(self, features, mode):
        return dnn_logits(features, mode, self._head.logits_dimension, self._hidden_units,
                          self._feature_columns, self._activation_fn, self._dropout,
                          self._batch_norm)

    def _train_op_fn(self, loss):
        return make_optimizer(self._optimizer, LEARNING_RATE)


class DNNClassifier(_DNN):
    """A feed-forward classifier (TF: ``tf.compat.v1.estimator.DNNClassifier``,
    same arguments and defaults). `input_layer_partitioner` is accepted for
    TF's signature: placement is the strategy's."""

    def __init__(self, hidden_units, feature_columns, model_dir=None, n_classes=2,
                 weight_column=None, label_vocabulary=None, optimizer="Adagrad",
                 activation_fn=torch.relu, dropout=None, input_layer_partitioner=None,
                 config=None, warm_start_from=None, loss_reduction=Reduction.SUM,
                 batch_norm=False):
        del input_layer_partitioner
        head = ClassificationHead(n_classes, weight_column, label_vocabulary, loss_reduction)
        super().__init__(head, hidden_units, feature_columns, model_dir, optimizer,
                         activation_fn, dropout, config, warm_start_from, batch_norm)


class DNNEstimator(_DNN):
    """A feed-forward network under a given head (TF:
    ``tf.compat.v1.estimator.DNNEstimator``), e.g. `MultiLabelHead`."""

    def __init__(self, head, hidden_units, feature_columns, model_dir=None,
                 optimizer="Adagrad", activation_fn=torch.relu, dropout=None,
                 input_layer_partitioner=None, config=None, warm_start_from=None,
                 batch_norm=False):
        del input_layer_partitioner
        super().__init__(head, hidden_units, feature_columns, model_dir, optimizer,
                         activation_fn, dropout, config, warm_start_from, batch_norm)


class DNNRegressor(_DNN):
    """A feed-forward regressor (TF: ``tf.compat.v1.estimator.DNNRegressor``)."""

    def __init__(self, hidden_units, feature_columns, model_dir=None, label_dimension=1,
                 weight_column=None, optimizer="Adagrad", activation_fn=torch.relu,
                 dropout=None, input_layer_partitioner=None, config=None,
                 warm_start_from=None, loss_reduction=Reduction.SUM, batch_norm=False):
        del input_layer_partitioner
        head = RegressionHead(label_dimension, weight_column, loss_reduction)
        super().__init__(head, hidden_units, feature_columns, model_dir, optimizer,
                         activation_fn, dropout, config, warm_start_from, batch_norm)
