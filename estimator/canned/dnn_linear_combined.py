"""`DNNLinearCombinedClassifier` / `Regressor`: wide & deep (TF1:
``tf.compat.v1.estimator.DNNLinearCombined*``).

Logits are the sum of a linear model (``linear/linear_model/...``, see
`linear`) and a DNN (``dnn/...``, see `dnn`). Each part has its own optimizer
over its own variables, both stepped on the same loss, then the global step
counts one (TF's ``_train_op_fn``). Defaults differ from the single models:
``'Ftrl'`` at ``min(0.005, 1 / sqrt(number of linear columns))`` and
``'Adagrad'`` at 0.001. TF's ``linear/linear/fraction_of_zero_values`` and
``linear/linear/activation`` summaries of the linear logits are written too.
"""
from __future__ import annotations

import torch

from hooks.mode_keys import ModeKeys

from ..losses import Reduction
from ._base import CannedEstimator, check_optimizer_spec, column_tuple, make_optimizer, \
    modules_under
from ._head import ClassificationHead, RegressionHead
from .dnn import layer_summary, check_dnn_args, dnn_logits
from .linear import check_combiner, learning_rate, linear_logits

DNN_LEARNING_RATE = 0.001
LINEAR_LEARNING_RATE = 0.005


class _DNNLinearCombined(CannedEstimator):
    def __init__(self, head, model_dir, linear_feature_columns, linear_optimizer,
                 dnn_feature_columns, dnn_optimizer, dnn_hidden_units, dnn_activation_fn,
                 dnn_dropout, config, warm_start_from, batch_norm, linear_sparse_combiner):
        self._linear_columns = column_tuple(linear_feature_columns, "linear_feature_columns")
        self._dnn_columns = column_tuple(dnn_feature_columns, "dnn_feature_columns")
        if not self._linear_columns and not self._dnn_columns:
            raise ValueError("Either linear_feature_columns or dnn_feature_columns must be "
                             "defined.")
        if self._dnn_columns:
            if not dnn_hidden_units:
                raise ValueError("dnn_hidden_units must be defined when dnn_feature_columns "
                                 "is specified.")
            self._hidden_units, _ = check_dnn_args(dnn_hidden_units, (), dnn_dropout,
                                                   dnn_activation_fn)
        check_optimizer_spec(linear_optimizer)
        check_optimizer_spec(dnn_optimizer)
        self._linear_optimizer, self._dnn_optimizer = linear_optimizer, dnn_optimizer
        self._activation_fn, self._dropout = dnn_activation_fn, dnn_dropout
        self._batch_norm = bool(batch_norm)
        self._sparse_combiner = check_combiner(linear_sparse_combiner)
        super().__init__(head, model_dir, config, warm_start_from)

    def _logits(self, features, mode):
        units, logits = self._head.logits_dimension, None
        if self._dnn_columns:
            logits = dnn_logits(features, mode, units, self._hidden_units, self._dnn_columns,
                                self._activation_fn, self._dropout, self._batch_norm)
        if self._linear_columns:
            linear = linear_logits(features, units, self._linear_columns,
                                   self._sparse_combiner)
            if mode == ModeKeys.TRAIN:
                layer_summary(linear, "linear/linear")
            logits = linear if logits is None else logits + linear.to(logits.device)
        return logits

    def _train_op_fn(self, loss):
        optimizers = []
        if self._dnn_columns:
            optimizers.append(make_optimizer(self._dnn_optimizer, DNN_LEARNING_RATE,
                                             "dnn_optimizer", lambda: modules_under("dnn")))
        if self._linear_columns:
            rate = learning_rate(len(self._linear_columns), LINEAR_LEARNING_RATE)
            optimizers.append(make_optimizer(self._linear_optimizer, rate,
                                             "linear_optimizer",
                                             lambda: modules_under("linear")))

        def train_op():
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in optimizers:
                opt.step()
        return train_op


class DNNLinearCombinedClassifier(_DNNLinearCombined):
    """Wide & deep classifier (TF: ``tf.compat.v1.estimator.DNNLinearCombinedClassifier``,
    same arguments and defaults)."""

    def __init__(self, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=torch.relu, dnn_dropout=None, n_classes=2,
                 weight_column=None, label_vocabulary=None, input_layer_partitioner=None,
                 config=None, warm_start_from=None, loss_reduction=Reduction.SUM,
                 batch_norm=False, linear_sparse_combiner="sum"):
        del input_layer_partitioner
        head = ClassificationHead(n_classes, weight_column, label_vocabulary, loss_reduction)
        super().__init__(head, model_dir, linear_feature_columns, linear_optimizer,
                         dnn_feature_columns, dnn_optimizer, dnn_hidden_units,
                         dnn_activation_fn, dnn_dropout, config, warm_start_from, batch_norm,
                         linear_sparse_combiner)


class DNNLinearCombinedEstimator(_DNNLinearCombined):
    """Wide & deep under a given head (TF:
    ``tf.compat.v1.estimator.DNNLinearCombinedEstimator``), e.g. `MultiLabelHead`.
    `warm_start_from`, after TF's arguments, is ours (TF's has none)."""

    def __init__(self, head, model_dir=None, linear_feature_columns=None,
                 linear_optimizer="Ftrl", dnn_feature_columns=None, dnn_optimizer="Adagrad",
                 dnn_hidden_units=None, dnn_activation_fn=torch.relu, dnn_dropout=None,
                 input_layer_partitioner=None, config=None, batch_norm=False,
                 linear_sparse_combiner="sum", warm_start_from=None):
        del input_layer_partitioner
        super().__init__(head, model_dir, linear_feature_columns, linear_optimizer,
                         dnn_feature_columns, dnn_optimizer, dnn_hidden_units,
                         dnn_activation_fn, dnn_dropout, config, warm_start_from, batch_norm,
                         linear_sparse_combiner)


class DNNLinearCombinedRegressor(_DNNLinearCombined):
    """Wide & deep regressor (TF: ``tf.compat.v1.estimator.DNNLinearCombinedRegressor``)."""

    def __init__(self, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=torch.relu, dnn_dropout=None, label_dimension=1,
                 weight_column=None, input_layer_partitioner=None, config=None,
                 warm_start_from=None, loss_reduction=Reduction.SUM, batch_norm=False,
                 linear_sparse_combiner="sum"):
        del input_layer_partitioner
        head = RegressionHead(label_dimension, weight_column, loss_reduction)
        super().__init__(head, model_dir, linear_feature_columns, linear_optimizer,
                         dnn_feature_columns, dnn_optimizer, dnn_hidden_units,
                         dnn_activation_fn, dnn_dropout, config, warm_start_from, batch_norm,
                         linear_sparse_combiner)
