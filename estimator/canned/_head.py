"""The heads of the canned estimators: from logits and labels to the spec of
each mode (TF1: ``canned/head.py``'s binary logistic, multi-class softmax and
regression heads). TF2's heads (`heads`, `multi_label_head`) are these with
TF2's options (`Head`).

A head makes the predictions (TF's `PredictionKeys`), the loss (per-example
loss times the weight column, reduced with SUM, TF1's default), the
evaluation metrics (TF's `MetricKeys`; `evaluate` adds ``loss``, the mean of
the per-batch SUM losses, and ``global_step``), TF's training summary
``average_loss``, and the serving signatures (``serving_default``,
``classification``, ``regression``, ``predict``).

Replicas: TF1 adds the gradients of the replicas when the loss is reduced
with SUM, and our synchronous strategies average them; `compute_weighted_loss`
scales a SUM loss in training by the replicas in sync (`est.losses`), so
training on N replicas steps as one process on the whole global batch (and
the logged loss is the global batch's sum).

Strings: ``classes`` and ``all_classes`` are host arrays of bytes, as TF's
string tensors read back (``b"1"`` or the `label_vocabulary` entry); they are
made only in PREDICT, not in an export (a torch program holds no strings: the
``classification`` signature there gives ``classes`` as class ids). Labels
with a `label_vocabulary` are strings (a numpy array or a list).
"""
from __future__ import annotations

import inspect
import weakref
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from hooks import model_scope, summary
from hooks.mode_keys import ModeKeys

from .. import export, feature_column, metrics
from ..losses import Reduction, compute_weighted_loss
from ..model_fn import EstimatorSpec

SERVING_DEFAULT, CLASSIFY, REGRESS, PREDICT = (
    "serving_default", "classification", "regression", "predict")


_NAMES_AFTER = {"class_ids": "classes", "all_class_ids": "all_classes"}   # (TF's order)


class _AccuracyBaseline(metrics.Mean):
    """TF's ``accuracy_baseline``: max(label mean, 1 - label mean), the accuracy
    of always predicting the majority class."""

    def result(self):
        mean = super().result()
        return torch.maximum(mean, 1 - mean)


def _streaming(name: str, cls, *args) -> metrics.Metric:
    metric = model_scope.get_metric(name, cls)
    if model_scope.updates_metrics():
        metric.update_state(*args)
    return metric


def _check_classes(n_classes, label_vocabulary) -> Optional[tuple]:
    if not isinstance(n_classes, int) or isinstance(n_classes, bool) or n_classes < 2:
        raise ValueError(f"n_classes must be > 1: {n_classes}")
    if label_vocabulary is None:
        return None
    if not isinstance(label_vocabulary, (list, tuple)) or not all(
            isinstance(v, str) for v in label_vocabulary):
        raise ValueError("label_vocabulary should be a list or a tuple of str. Given type: "
                         f"{type(label_vocabulary)}")
    if len(label_vocabulary) != n_classes:
        raise ValueError(f"label_vocabulary has {len(label_vocabulary)} entries, but "
                         f"n_classes is {n_classes}: give one string per class")
    if len(set(label_vocabulary)) != len(label_vocabulary):
        raise ValueError(f"label_vocabulary has duplicates: {list(label_vocabulary)}")
    return tuple(label_vocabulary)


def _weight_column(weight_column):
    """TF's weight_column: a feature key or a numeric_column."""
    if weight_column is None or isinstance(weight_column, feature_column.NumericColumn):
        return weight_column
    if isinstance(weight_column, str):
        return feature_column.numeric_column(weight_column)
    raise ValueError("Weight column should be either a string or a numeric_column. "
                     f"Given type: {type(weight_column)}.")


def _is_strings(labels) -> bool:
    """Whether labels are strings: a numpy str/bytes/object array, or a
    (nested) list whose first value is a str or bytes."""
    if isinstance(labels, np.ndarray):
        return labels.dtype.kind in ("U", "S", "O")
    while isinstance(labels, (list, tuple)) and labels:
        labels = labels[0]
    return isinstance(labels, (str, bytes))


def _reduction(loss_reduction: str) -> str:
    """A TF1 loss reduction (`est.losses.Reduction`) or TF2's Keras name
    (``'sum_over_batch_size'``, ``'sum'``), as `compute_weighted_loss` takes it."""
    keras = {"sum_over_batch_size": Reduction.SUM_OVER_BATCH_SIZE, "sum": Reduction.SUM}
    if loss_reduction in keras:
        return keras[loss_reduction]
    if loss_reduction not in Reduction.all() or loss_reduction == Reduction.NONE:
        raise ValueError(f"Invalid loss_reduction: {loss_reduction!r}; one of "
                         f"'sum_over_batch_size', 'sum' or est.losses.Reduction's")
    return loss_reduction


def _check_thresholds(thresholds) -> tuple:
    thresholds = tuple(float(t) for t in thresholds or ())
    for t in thresholds:
        if not 0.0 < t < 1.0:
            raise ValueError(f"thresholds must be in (0, 1) range. Given: {t}")
    return thresholds


def _threshold_metrics(key, labels, probabilities, weights, thresholds) -> dict:
    """TF2's ``accuracy/positive_threshold_<t>``, ``precision/...`` and
    ``recall/...`` (Keras's BinaryAccuracy, Precision, Recall at `t`) over
    every (example, class) pair."""
    ops = {}
    for t in thresholds:
        above = (probabilities > t).to(labels.dtype)
        for name, fn in (("accuracy", metrics.accuracy), ("precision", metrics.precision),
                         ("recall", metrics.recall)):
            k = key(f"{name}/positive_threshold_{t:g}")
            ops[k] = fn(labels, above, weights, name=k)
    return ops


def _regularization_loss(regularization_losses) -> Optional[torch.Tensor]:
    """The sum of `regularization_losses` (scalar tensors or numbers), None
    for None or none (TF: ``tf.math.add_n``)."""
    if regularization_losses is None:
        return None
    if not isinstance(regularization_losses, (list, tuple)):
        raise ValueError(f"regularization_losses must be a list or tuple of scalars, got "
                         f"{type(regularization_losses).__name__}")
    total = None
    for i, term in enumerate(regularization_losses):
        if isinstance(term, torch.Tensor) and term.dim() != 0:
            raise ValueError(f"regularization_losses[{i}] must be a scalar, got a tensor of "
                             f"shape {list(term.shape)}")
        if not isinstance(term, (torch.Tensor, float, int)) or isinstance(term, bool):
            raise ValueError(f"regularization_losses[{i}] must be a scalar tensor, got "
                             f"{type(term).__name__}")
        total = term if total is None else total + term
    return total if total is None else torch.as_tensor(total, dtype=torch.float32)


# The trainable_variables found to be each optimizer's (as ids), checked once
_checked: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _train_op(optimizer, trainable_variables, train_op_fn, update_ops) -> Callable:
    """`loss -> train_op` from ``create_estimator_spec``'s arguments, checked
    as TF checks them (TF: ``create_estimator_spec_train_op``)."""
    if update_ops is not None and not isinstance(update_ops, (list, tuple)):
        raise ValueError(f"update_ops must be a list or tuple, given: "
                         f"{type(update_ops).__name__}")
    if update_ops:
        raise ValueError(
            "update_ops are not run here: PyTorch layers (batch norm) update their "
            "statistics in the forward pass, so TF's UPDATE_OPS have nothing to port; "
            "make any other update part of a callable train_op")
    if optimizer is None:
        if train_op_fn is None:
            raise ValueError("train_op_fn and optimizer cannot both be None.")
        return train_op_fn
    if train_op_fn is not None:
        raise ValueError("train_op_fn and optimizer cannot both be set.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer of the model's scope "
                         f"(est.get_optimizer(lambda params: torch.optim.SGD(params, lr=0.1)))"
                         f", got {type(optimizer).__name__}")
    if trainable_variables is not None:
        if not isinstance(trainable_variables, (list, tuple)):
            raise ValueError(f"trainable_variables must be a list or tuple, given: "
                             f"{type(trainable_variables).__name__}")
        key = tuple(map(id, trainable_variables))   # (checked once, not on every step)
        if _checked.get(optimizer) != key:
            _check_trainable_variables(optimizer, trainable_variables)
            _checked[optimizer] = key
    return lambda loss: optimizer



def _check_trainable_variables(optimizer, trainable_variables) -> None:
    """`trainable_variables` (parameters or modules) are what `optimizer`
    steps: TF's optimizer updates those alone."""
    given = set()
    for item in trainable_variables:
        params = item.parameters() if isinstance(item, torch.nn.Module) else [item]
        given.update(id(p) for p in params if isinstance(p, torch.Tensor) and p.requires_grad)
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]
               if p.requires_grad}
    if given != stepped:
        raise ValueError(
            f"trainable_variables ({len(given)} trainable tensors) are not the parameters "
            f"the optimizer steps ({len(stepped)}): build it over them, "
            f"est.get_optimizer(factory, var_list=trainable_variables)")


class Head:
    """What the heads share: weights, label shape, the loss and the spec.
    TF1's canned heads reduce with SUM; TF2's heads (`est.BinaryClassHead`,
    ...) add a `loss_fn`, a `name` suffixing their metric keys, and compute
    the precision-recall AUC by interpolation (Keras's AUC) where TF1's sums
    trapezoids."""

    logits_dimension = 1
    _PR_SUMMATION = "trapezoidal"
    _NAMED_SUMMARY = True   # TRAIN's regularization_loss summary suffixed with the name

    def __init__(self, weight_column=None, loss_reduction: str = Reduction.SUM, loss_fn=None,
                 name: Optional[str] = None):
        self._weight_column = _weight_column(weight_column)
        self._reduction = _reduction(loss_reduction)
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError(f"loss_fn must be callable, got {loss_fn!r}")
        self._loss_fn = loss_fn
        self._loss_fn_takes_features = (   # (asked once, not on every step)
            loss_fn is not None and "features" in inspect.signature(loss_fn).parameters)
        self._name = name

    @property
    def name(self) -> Optional[str]:
        return self._name

    def _key(self, key: str) -> str:
        """A metric key, suffixed with the head's name (TF2's ``auc/<name>``)."""
        return f"{key}/{self._name}" if self._name else key

    def _loss(self, labels, logits, features) -> torch.Tensor:
        """The unreduced loss [batch, n]: the head's own, or TF2's
        ``loss_fn(labels, logits[, features])``, checked to be [batch, n]
        ([batch] where n is 1)."""
        if self._loss_fn is None:
            return self._unreduced_loss(labels, logits)
        kwargs = {"features": features} if self._loss_fn_takes_features else {}
        loss = self._loss_fn(labels=labels, logits=logits, **kwargs)
        if not isinstance(loss, torch.Tensor):
            raise ValueError(f"loss_fn must return a tensor, got {type(loss).__name__}")
        n = self._loss_dimension
        if loss.dim() == 1 and n == 1:
            loss = loss.unsqueeze(-1)
        if list(loss.shape) != [logits.shape[0], n]:
            raise ValueError(f"loss_fn must return a Tensor of shape [batch_size, {n}]"
                             f"{' (or [batch_size])' if n == 1 else ''}, got "
                             f"{list(loss.shape)}")
        return loss

    @property
    def _loss_dimension(self) -> int:
        return 1

    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None,
                              trainable_variables=None, train_op_fn: Optional[Callable] = None,
                              update_ops=None, regularization_losses=None) -> EstimatorSpec:
        """TF's ``head.create_estimator_spec``, same arguments. In TRAIN the
        train_op is `optimizer` (the scope's, ``est.get_optimizer(...)``; TF:
        ``optimizer.get_updates(loss, trainable_variables)``) or
        `train_op_fn(loss)`, exactly one of them. `regularization_losses`
        (scalars) are added to the loss trained and evaluated, and reported
        as ``regularization_loss`` (summary and metric)."""
        self._check_logits(logits)
        if mode == ModeKeys.PREDICT:
            predictions = self._all_predictions(logits)
            return EstimatorSpec(mode, predictions=predictions,
                                 export_outputs=self._export_outputs(predictions))
        regularization = _regularization_loss(regularization_losses)
        labels, weights, unreduced, loss = self._losses(features, logits, labels, mode)
        if mode == ModeKeys.EVAL:
            predictions = self._predictions(logits)
            ops = self._metrics(labels, predictions, weights, unreduced)
            return EstimatorSpec(mode, predictions=predictions,
                                 loss=self._regularized(loss, regularization, ops),
                                 eval_metric_ops=ops)
        train_op = _train_op(optimizer, trainable_variables, train_op_fn, update_ops)
        loss = self._training_loss(loss, weights, unreduced)
        loss = self._regularized(loss, regularization)
        if self._name and summary.should_record_summaries():   # (TF: a named head's own)
            summary.scalar(self._key("loss"), loss.detach())
        # (no predictions in TRAIN: nothing reads them, and they would cost each step)
        return EstimatorSpec(mode, loss=loss, train_op=train_op(loss))

    def _regularized(self, loss, regularization, ops: Optional[dict] = None):
        """`loss` plus the regularization, if any, recorded as TF's
        ``regularization_loss``: into `ops` (EVAL's metrics, the mean over the
        batches) or as TRAIN's summary."""
        if regularization is None:
            return loss
        if ops is not None:
            key = self._key("regularization_loss")
            ops[key] = metrics.mean(regularization.detach(), name=key)
        elif summary.should_record_summaries():
            summary.scalar(self._key("regularization_loss") if self._NAMED_SUMMARY
                           else "regularization_loss", regularization.detach())
        return loss + regularization

    def _check_logits(self, logits) -> None:
        if logits.dim() != 2 or logits.shape[-1] != self.logits_dimension:
            raise ValueError(f"logits shape must be [batch, {self.logits_dimension}], "
                             f"got {list(logits.shape)}")

    def _all_predictions(self, logits) -> dict:
        """PREDICT's predictions: the strings too, except in an export (a torch
        program holds none)."""
        predictions = self._predictions(logits)
        if torch.compiler.is_exporting():
            return predictions
        strings = self._string_predictions(predictions)
        ordered = {}   # in TF's order: each class name key after its id key
        for key, value in predictions.items():
            ordered[key] = value
            named = _NAMES_AFTER.get(key)
            if named in strings:
                ordered[named] = strings.pop(named)
        return {**ordered, **strings}

    def _losses(self, features, logits, labels, mode) -> tuple:
        """(labels, weights, unreduced loss, loss reduced as the head says)."""
        if labels is None:
            raise ValueError(f"labels must not be None in mode {mode!r}: give the labels as "
                             "the second value of input_fn")
        labels = self._labels(labels, logits)
        weights = self._weights(features, logits)
        unreduced = self._loss(labels, logits, features)
        return labels, weights, unreduced, compute_weighted_loss(
            unreduced, weights, reduction=self._reduction, loss_collection=None)

    def _training_loss(self, loss, weights, unreduced) -> torch.Tensor:
        """TRAIN's loss, with TF1's ``average_loss`` summary of a SUM loss (the
        replica's own)."""
        if self._reduction == Reduction.SUM and summary.should_record_summaries():
            count = (unreduced.numel() if weights is None
                     else (weights * torch.ones_like(unreduced)).sum())
            summary.scalar(self._key("average_loss"),
                           loss.detach() / count)
        return loss

    def _weights(self, features, logits) -> Optional[torch.Tensor]:
        """The weight column as float32 [batch, 1] (TF:
        ``_get_weights_and_check_match_logits``)."""
        if self._weight_column is None:
            return None
        weights = feature_column.input_layer(features, [self._weight_column])
        if weights.shape[0] != logits.shape[0]:
            raise ValueError(f"weight_column {self._weight_column.key!r} has "
                             f"{weights.shape[0]} rows, the logits {logits.shape[0]}")
        return weights.to(logits.device)

    def _label_tensor(self, labels, logits) -> torch.Tensor:
        if _is_strings(labels):
            raise ValueError("Labels are strings, but the estimator has no label_vocabulary: "
                             "give label_vocabulary=[...] (one string per class) or integer "
                             "labels")
        labels = torch.as_tensor(labels)
        return labels.to(logits.device) if labels.device != logits.device else labels

    def _shaped(self, labels: torch.Tensor, logits: torch.Tensor, dimension: int):
        """Labels as [batch, dimension] (TF: ``_check_dense_labels_match_logits_and_reshape``)."""
        if labels.dim() == 1 and dimension == 1:
            labels = labels.unsqueeze(-1)
        if labels.dim() != 2 or labels.shape[-1] != dimension:
            raise ValueError(f"labels shape must be [batch, {dimension}]"
                             f"{' or [batch]' if dimension == 1 else ''}, got "
                             f"{list(labels.shape)}")
        if labels.shape[0] != logits.shape[0]:
            raise ValueError(f"labels have {labels.shape[0]} rows, the logits "
                             f"{logits.shape[0]} (the batch sizes of labels and features "
                             "differ)")
        return labels


class ClassificationHead(Head):
    """Binary (one logit, sigmoid cross entropy) or multi-class (softmax cross
    entropy) classification, with optional string labels."""

    def __init__(self, n_classes: int = 2, weight_column=None,
                 label_vocabulary: Optional[Sequence[str]] = None,
                 loss_reduction: str = Reduction.SUM, thresholds=None, loss_fn=None,
                 name: Optional[str] = None):
        super().__init__(weight_column, loss_reduction, loss_fn, name)
        self._thresholds = _check_thresholds(thresholds)   # (TF2's binary head's)
        self._vocabulary = _check_classes(n_classes, label_vocabulary)
        self._ids = None if self._vocabulary is None else {
            v: i for i, v in enumerate(self._vocabulary)}
        self._n_classes = n_classes
        self.logits_dimension = 1 if n_classes == 2 else n_classes
        names = self._vocabulary or [str(i) for i in range(n_classes)]
        self._class_names = np.array([n.encode() for n in names], dtype=object)

    # -- predictions ------------------------------------------------------------
    def _predictions(self, logits: torch.Tensor) -> dict:
        batch = logits.shape[0]
        all_ids = torch.arange(self._n_classes, dtype=torch.int32,
                               device=logits.device).expand(batch, -1)
        if self._n_classes == 2:
            logistic = torch.sigmoid(logits)
            probabilities = torch.cat([1 - logistic, logistic], -1)
            class_ids = (logits > 0).to(torch.int64)
            return {"logits": logits, "logistic": logistic, "probabilities": probabilities,
                    "class_ids": class_ids, "all_class_ids": all_ids}
        probabilities = torch.softmax(logits, -1)
        return {"logits": logits, "probabilities": probabilities,
                "class_ids": logits.argmax(-1, keepdim=True), "all_class_ids": all_ids}

    def _string_predictions(self, predictions: dict) -> dict:
        ids = predictions["class_ids"].cpu().numpy()
        batch = ids.shape[0]
        return {"classes": self._class_names[ids],
                "all_classes": np.tile(self._class_names, (batch, 1))}

    def _export_outputs(self, predictions: dict) -> dict:
        numeric = {k: v for k, v in predictions.items() if isinstance(v, torch.Tensor)}
        classification = export.ClassificationOutput(
            scores=predictions["probabilities"], classes=predictions["all_class_ids"],
            class_names=[n.decode() for n in self._class_names])
        outputs = {SERVING_DEFAULT: classification, CLASSIFY: classification,
                   PREDICT: export.PredictOutput(
                       numeric, classification.class_names,
                       {"classes": "class_ids", "all_classes": "all_class_ids"})}
        if self._n_classes == 2:
            outputs[REGRESS] = export.RegressionOutput(predictions["logistic"])
        return outputs

    # -- loss ---------------------------------------------------------------------
    def _labels(self, labels, logits) -> torch.Tensor:
        """Class ids [batch, 1] (int64), checked to lie in [0, n_classes)."""
        if self._vocabulary is not None:
            ids = self._lookup(labels)
            ids = torch.from_numpy(ids).to(logits.device)
        else:
            ids = self._label_tensor(labels, logits)
            if ids.is_floating_point() and self._n_classes > 2:
                raise ValueError(f"Labels dtype should be integer. Instead got {ids.dtype}.")
            if not ids.is_floating_point():   # (int8, int16, bool: torch's losses take int64)
                ids = ids.to(torch.int64)
            self._check_range(ids)
        return self._shaped(ids, logits, 1)

    def _lookup(self, labels) -> np.ndarray:
        if not _is_strings(labels):
            raise ValueError("Labels dtype should be string if there is a vocabulary. "
                             f"Instead got {getattr(labels, 'dtype', type(labels).__name__)}")
        values = np.asarray(labels, dtype=object)
        out = np.empty(values.shape, dtype=np.int64)
        flat, ids = values.ravel(), out.reshape(-1)
        table = self._ids
        for i, value in enumerate(flat):
            key = value.decode() if isinstance(value, bytes) else value
            index = table.get(key)
            if index is None:
                raise ValueError(f"Label {key!r} is not in label_vocabulary "
                                 f"{list(self._vocabulary)}")
            ids[i] = index
        return out

    def _check_range(self, ids: torch.Tensor) -> None:
        """TF's ``_assert_range``: labels in [0, n_classes - 1]; on the host for
        CPU labels, a device-side assertion elsewhere (no sync)."""
        high = self._n_classes - 1
        metrics.check_range(ids, high, f"Labels must be in [0, n_classes - 1] = [0, {high}]",
                            " (set n_classes, or label_vocabulary for string labels)")

    def _unreduced_loss(self, labels, logits) -> torch.Tensor:
        if self._n_classes == 2:
            return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype),
                                                      reduction="none")
        return F.cross_entropy(logits, labels.squeeze(-1), reduction="none").unsqueeze(-1)

    # -- metrics ------------------------------------------------------------------
    def _metrics(self, labels, predictions, weights, unreduced) -> dict:
        class_ids, key = predictions["class_ids"], self._key
        ops = {key("average_loss"): metrics.mean(unreduced, weights, name=key("average_loss")),
               key("accuracy"): metrics.accuracy(labels, class_ids, weights,
                                                 name=key("accuracy"))}
        if self._n_classes != 2:
            return ops
        logistic, pr = predictions["logistic"], self._PR_SUMMATION
        ops.update({
            key("precision"): metrics.precision(labels, class_ids, weights,
                                                name=key("precision")),
            key("recall"): metrics.recall(labels, class_ids, weights, name=key("recall")),
            key("prediction/mean"): metrics.mean(logistic, weights,
                                                 name=key("prediction/mean")),
            key("label/mean"): metrics.mean(labels, weights, name=key("label/mean")),
            key("accuracy_baseline"): _streaming(key("accuracy_baseline"), _AccuracyBaseline,
                                                 labels, weights),
            key("auc"): metrics.auc(labels, logistic, weights, name=key("auc")),
            key("auc_precision_recall"): metrics.auc(labels, logistic, weights, curve="PR",
                                                     summation_method=pr,
                                                     name=key("auc_precision_recall")),
        })
        ops.update(_threshold_metrics(key, labels.to(logistic.dtype), logistic, weights,
                                      self._thresholds))
        return ops


class RegressionHead(Head):
    """Mean squared error regression of `label_dimension` values per example."""

    def __init__(self, label_dimension: int = 1, weight_column=None,
                 loss_reduction: str = Reduction.SUM, loss_fn=None,
                 inverse_link_fn: Optional[Callable] = None, name: Optional[str] = None):
        super().__init__(weight_column, loss_reduction, loss_fn, name)
        if not isinstance(label_dimension, int) or label_dimension < 1:
            raise ValueError(f"Invalid label_dimension {label_dimension}.")
        if inverse_link_fn is not None and not callable(inverse_link_fn):
            raise ValueError(f"inverse_link_fn must be callable, got {inverse_link_fn!r}")
        self._inverse_link_fn = inverse_link_fn   # (TF2's: predictions from the logits)
        self.logits_dimension = label_dimension

    @property
    def _loss_dimension(self) -> int:
        return self.logits_dimension

    def _predictions(self, logits):
        if self._inverse_link_fn is None:
            return {"predictions": logits}
        return {"predictions": self._inverse_link_fn(logits), "logits": logits}

    def _string_predictions(self, predictions):
        return {}

    def _export_outputs(self, predictions):
        value = predictions["predictions"]
        regression = export.RegressionOutput(value)
        return {SERVING_DEFAULT: regression, REGRESS: regression,
                PREDICT: export.PredictOutput(predictions)}

    def _labels(self, labels, logits):
        labels = self._label_tensor(labels, logits)
        return self._shaped(labels.to(logits.dtype), logits, self.logits_dimension)

    def _unreduced_loss(self, labels, logits):
        return (logits - labels).square()

    def _metrics(self, labels, predictions, weights, unreduced):
        value, key = predictions["predictions"], self._key
        return {key(name): metrics.mean(values, weights, name=key(name)) for name, values in
                (("average_loss", unreduced), ("prediction/mean", value),
                 ("label/mean", labels))}
