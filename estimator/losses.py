"""TF1's losses (``tf.compat.v1.losses``): each takes `labels` and
`predictions` (or `logits`), weighs the per-element losses by `weights` (a
scalar, or a tensor of the losses' rank whose dimensions are 1 or theirs) and
reduces them as `reduction` says, by default TF1's SUM_BY_NONZERO_WEIGHTS:
the sum over the elements whose weight is not zero, divided by their number
(0 where there are none). The loss is added to the model_fn call's
`loss_collection`, and `get_total_loss()` sums that collection, as TF1's
`tf.losses.get_total_loss()` does after `tf.losses.*` calls.

As in TF, `labels` and `predictions` must have one shape (torch would
broadcast a `[batch, 1]` against a `[batch]` into `[batch, batch]`), and
`weights` broadcast only as TF's do. Unlike TF, which computes these in
float32, a torch tensor keeps its floating dtype (labels take the
predictions'); numpy float64 becomes float32, as every input here does.
``Reduction`` is also the canned estimators' ``loss_reduction=``.

Replicas: TF1 adds the replicas' gradients of a loss reduced with SUM (its
optimizer averages them for every other reduction), while the synchronous
strategies here always average; in training under N replicas a SUM loss's
gradient is therefore made N times its own (its value stays the replica's
sum, as TF's), so N replicas step as one process on the global batch, as
TF's do, and the step reports the replicas' sum, as TF's (the model_fn's
last loss decides, as TF's `get_loss_reduction`).
"""
from __future__ import annotations

import numbers
from typing import Optional

import numpy as np
import torch

from hooks.model_scope import (add_to_collection, get_collection, note_loss_reduction,
                               unique_name)


class GraphKeys:
    """The loss collections of ``tf.compat.v1.GraphKeys``."""

    LOSSES = "losses"
    REGULARIZATION_LOSSES = "regularization_losses"


class Reduction:
    """How a loss reduces its weighted per-element losses (TF:
    ``tf.compat.v1.losses.Reduction``)."""

    NONE = "none"
    SUM = "weighted_sum"
    SUM_OVER_BATCH_SIZE = "weighted_sum_over_batch_size"
    MEAN = "weighted_mean"
    SUM_BY_NONZERO_WEIGHTS = "weighted_sum_by_nonzero_weights"
    SUM_OVER_NONZERO_WEIGHTS = SUM_BY_NONZERO_WEIGHTS

    @classmethod
    def all(cls):
        return (cls.NONE, cls.SUM, cls.MEAN, cls.SUM_OVER_BATCH_SIZE,
                cls.SUM_OVER_NONZERO_WEIGHTS, cls.SUM_BY_NONZERO_WEIGHTS)

    @classmethod
    def validate(cls, key):
        if key not in cls.all():
            raise ValueError(f"Invalid Reduction Key {key!r}; one of {list(cls.all())}")


_DEFAULT = Reduction.SUM_BY_NONZERO_WEIGHTS
_IGNORE_NONE = torch.iinfo(torch.int64).min   # cross_entropy's ignore_index, never a label


def compute_weighted_loss(losses, weights=1.0, scope: Optional[str] = None,
                          loss_collection: Optional[str] = GraphKeys.LOSSES,
                          reduction: str = _DEFAULT) -> torch.Tensor:
    """`losses` times `weights`, reduced as `reduction` says, added to
    `loss_collection` (None: to none) under the name `scope` (default
    ``"weighted_loss"``)."""
    return _finish(_float(losses, "losses"), weights, reduction, loss_collection,
                   scope, "weighted_loss")


def absolute_difference(labels, predictions, weights=1.0, scope=None,
                        loss_collection=GraphKeys.LOSSES, reduction=_DEFAULT):
    """|predictions - labels|."""
    labels, predictions = _pair(labels, predictions)
    return _finish((predictions - labels).abs(), weights, reduction, loss_collection, scope,
                   "absolute_difference")


def mean_squared_error(labels, predictions, weights=1.0, scope=None,
                       loss_collection=GraphKeys.LOSSES, reduction=_DEFAULT):
    """(predictions - labels)^2."""
    labels, predictions = _pair(labels, predictions)
    return _finish((predictions - labels).square(), weights, reduction, loss_collection,
                   scope, "mean_squared_error")


def huber_loss(labels, predictions, weights=1.0, delta=1.0, scope=None,
               loss_collection=GraphKeys.LOSSES, reduction=_DEFAULT):
    """0.5 * error^2 where |error| <= delta, else 0.5 * delta^2 + delta * (|error| - delta)
    (delta 0: zero, as TF's; torch's refuses it)."""
    labels, predictions = _pair(labels, predictions)
    losses = torch.nn.functional.huber_loss(predictions, labels, reduction="none", delta=delta) \
        if delta != 0 else (predictions - labels) * 0.0
    return _finish(losses, weights, reduction, loss_collection, scope, "huber_loss")


def log_loss(labels, predictions, weights=1.0, epsilon=1e-7, scope=None,
             loss_collection=GraphKeys.LOSSES, reduction=_DEFAULT):
    """-labels * log(predictions + epsilon) - (1 - labels) * log(1 - predictions + epsilon)."""
    labels, predictions = _pair(labels, predictions)
    losses = (-labels * torch.log(predictions + epsilon)
              - (1 - labels) * torch.log(1 - predictions + epsilon))
    return _finish(losses, weights, reduction, loss_collection, scope, "log_loss")


def hinge_loss(labels, logits, weights=1.0, scope=None, loss_collection=GraphKeys.LOSSES,
               reduction=_DEFAULT):
    """max(0, 1 - (2 * labels - 1) * logits), labels 0 or 1."""
    labels, logits = _pair(labels, logits, ("labels", "logits"))
    losses = torch.relu(1 - (2 * labels - 1) * logits)
    return _finish(losses, weights, reduction, loss_collection, scope, "hinge_loss")


def cosine_distance(labels, predictions, axis=None, weights=1.0, scope=None,
                    loss_collection=GraphKeys.LOSSES, reduction=_DEFAULT, dim=None):
    """1 - sum(labels * predictions) along `axis` (kept, of size 1), for
    unit-normalized inputs. `dim`: TF's deprecated name of `axis`."""
    if dim is not None:
        if axis is not None:
            raise ValueError("Cannot specify both 'axis' and 'dim'")
        axis = dim
    if axis is None:
        raise ValueError("You must specify argument `axis`.")
    labels, predictions = _pair(labels, predictions)
    losses = 1 - (predictions * labels).sum(dim=axis, keepdim=True)
    return _finish(losses, weights, reduction, loss_collection, scope, "cosine_distance_loss")


def sigmoid_cross_entropy(multi_class_labels, logits, weights=1.0, label_smoothing=0,
                          scope=None, loss_collection=GraphKeys.LOSSES, reduction=_DEFAULT):
    """Sigmoid cross entropy of each logit; `label_smoothing` moves the
    labels towards 1/2: labels * (1 - label_smoothing) + 0.5 * label_smoothing."""
    labels, logits = _pair(multi_class_labels, logits, ("multi_class_labels", "logits"))
    if label_smoothing > 0:
        labels = labels * (1 - label_smoothing) + 0.5 * label_smoothing
    losses = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels,
                                                                  reduction="none")
    return _finish(losses, weights, reduction, loss_collection, scope,
                   "sigmoid_cross_entropy_loss")


def softmax_cross_entropy(onehot_labels, logits, weights=1.0, label_smoothing=0, scope=None,
                          loss_collection=GraphKeys.LOSSES, reduction=_DEFAULT):
    """Softmax cross entropy of each row of `logits` (`[batch, classes]`)
    against one-hot (or probability) labels; one loss per row, so `weights` is
    a scalar or `[batch]`. `label_smoothing`: labels * (1 - label_smoothing) +
    label_smoothing / classes."""
    labels, logits = _pair(onehot_labels, logits, ("onehot_labels", "logits"))
    if label_smoothing > 0:
        labels = labels * (1 - label_smoothing) + label_smoothing / labels.shape[-1]
    losses = -(labels.detach() * torch.log_softmax(logits, dim=-1)).sum(-1)
    return _finish(losses, weights, reduction, loss_collection, scope,
                   "softmax_cross_entropy_loss")


def sparse_softmax_cross_entropy(labels, logits, weights=1.0, scope=None,
                                 loss_collection=GraphKeys.LOSSES, reduction=_DEFAULT):
    """Softmax cross entropy of `logits` (`[batch, classes]`) against class ids
    `labels` (`[batch]`, or `[batch, 1]`, squeezed as TF squeezes it, as is a
    `[batch, 1]` weights). An id outside [0, classes) is an error, as on TF's
    CPU (torch's default would pass over an id of -100 silently)."""
    if labels is None:
        raise ValueError("Argument `labels` must not be None.")
    if logits is None:
        raise ValueError("Argument `logits` must not be None.")
    logits = _float(logits, "logits")
    labels = torch.as_tensor(labels, device=logits.device)
    if labels.dim() == logits.dim():   # TF's remove_squeezable_dimensions
        labels = labels.squeeze(-1)
    if not isinstance(weights, (torch.Tensor, np.ndarray, numbers.Number)):
        weights = np.asarray(weights)   # (a list: squeezed as an array)
    if isinstance(weights, (torch.Tensor, np.ndarray)) and weights.ndim == labels.dim() + 1:
        weights = weights.squeeze(-1)
    if labels.dim() != logits.dim() - 1 or labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels of shape {tuple(labels.shape)} do not match logits of shape "
                         f"{tuple(logits.shape)}: give one class id per row of logits")
    if labels.is_floating_point():
        raise ValueError(f"labels must be integer class ids, got {labels.dtype}")
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), reduction="none",
        ignore_index=_IGNORE_NONE).reshape(labels.shape)
    return _finish(losses, weights, reduction, loss_collection, scope,
                   "sparse_softmax_cross_entropy_loss")


def mean_pairwise_squared_error(labels, predictions, weights=1.0, scope=None,
                                loss_collection=GraphKeys.LOSSES):
    """For each example, the mean over pairs of its elements of the squared
    difference of their errors, times the example's weight, summed: TF's
    2 * sum(d^2) / (n - 1) - 2 * sum(d)^2 / (n (n - 1)), d = predictions -
    labels, with TF's n: the elements of nonzero weight of each example, or,
    for a nonzero scalar weight, every element of the batch."""
    labels, predictions = _pair(labels, predictions)
    diffs = predictions - labels
    w = _weights(weights, diffs)
    axis = tuple(range(1, diffs.dim()))
    if w.dim() == 0 and float(w) != 0:
        present = torch.tensor(float(diffs.numel()), dtype=diffs.dtype, device=diffs.device)
    else:
        present = (torch.ones_like(diffs) * (w != 0)).sum(dim=axis, keepdim=True)
    term1 = 2.0 * _div_no_nan(diffs.square().sum(dim=axis, keepdim=True),
                              (present - 1).clamp(min=0))
    term2 = 2.0 * _div_no_nan(diffs.sum(dim=axis, keepdim=True).square(),
                              (present * (present - 1)).clamp(min=0))
    loss = ((term1 - term2) * w).sum()
    loss = torch.where(present.sum() > 0, loss, torch.zeros_like(loss))
    return _collect(loss, loss_collection, scope, "mean_pairwise_squared_error")


def sequence_loss(logits, targets, weights, average_across_timesteps: bool = True,
                  average_across_batch: bool = True, sum_over_timesteps: bool = False,
                  sum_over_batch: bool = False, softmax_loss_function=None) -> torch.Tensor:
    """The weighted cross entropy of a sequence of logits (TF1:
    ``tf.contrib.seq2seq.sequence_loss``; TF 2: ``tfa.seq2seq.sequence_loss``).
    `logits` ``[batch, time, classes]``, `targets` ``[batch, time]`` (class
    ids), `weights` ``[batch, time]`` (0 on padding). Averaging divides the
    weighted sum by the sum of the weights, summing (``sum_over_*``) by the
    count of nonzero weights, over time, the batch, or both (0 where the
    divisor is 0); neither keeps ``[batch, time]``. Not added to a loss
    collection, as TF's. `softmax_loss_function(labels=, logits=)`, where
    given, replaces the cross entropy (flat ``[batch * time]`` targets,
    ``[batch * time, classes]`` logits)."""
    if average_across_timesteps and sum_over_timesteps:
        raise ValueError("average_across_timesteps and sum_over_timesteps cannot be set to "
                         "True at same time.")
    if average_across_batch and sum_over_batch:
        raise ValueError("average_across_batch and sum_over_batch cannot be set to True at "
                         "same time.")
    if average_across_batch and sum_over_timesteps:
        raise ValueError("average_across_batch and sum_over_timesteps cannot be set to True at "
                         "same time because of ambiguous order.")
    if sum_over_batch and average_across_timesteps:
        raise ValueError("sum_over_batch and average_across_timesteps cannot be set to True at "
                         "same time because of ambiguous order.")
    logits = _float(logits, "logits")
    targets = torch.as_tensor(targets, device=logits.device)
    weights = _float(weights, "weights").to(logits.device, logits.dtype)
    if logits.dim() != 3 or targets.dim() != 2 or weights.dim() != 2:
        raise ValueError(f"sequence_loss takes logits [batch, time, classes], targets and "
                         f"weights [batch, time]; got {tuple(logits.shape)}, "
                         f"{tuple(targets.shape)}, {tuple(weights.shape)}")
    batch, time, classes = logits.shape
    flat_logits, flat_targets = logits.reshape(-1, classes), targets.reshape(-1).long()
    if softmax_loss_function is None:
        crossent = torch.nn.functional.cross_entropy(flat_logits, flat_targets,
                                                     reduction="none")
    else:
        crossent = softmax_loss_function(labels=flat_targets, logits=flat_logits)
    crossent = crossent.reshape(batch, time) * weights
    if (average_across_timesteps and average_across_batch) or (
            sum_over_timesteps and sum_over_batch):
        divisor = weights.sum() if average_across_timesteps else (weights != 0).sum()
        return _div_no_nan(crossent.sum(), divisor.to(crossent.dtype))
    if average_across_timesteps or average_across_batch:
        axis = 0 if average_across_batch else 1
        return _div_no_nan(crossent.sum(axis), weights.sum(axis))
    if sum_over_timesteps or sum_over_batch:
        axis = 0 if sum_over_batch else 1
        return _div_no_nan(crossent.sum(axis), (weights != 0).sum(axis).to(crossent.dtype))
    return crossent


def add_loss(loss, loss_collection: Optional[str] = GraphKeys.LOSSES) -> None:
    """Add `loss` to `loss_collection` of this model_fn call (a regularization
    term: ``loss_collection=GraphKeys.REGULARIZATION_LOSSES``)."""
    if loss_collection:
        add_to_collection(loss_collection, "", loss)


def get_losses(scope: Optional[str] = None, loss_collection: str = GraphKeys.LOSSES) -> list:
    """The losses of `loss_collection` added in this model_fn call; with `scope`,
    those whose `scope` name (or default name) `re.match`es it (a loss given
    to `add_loss` has no name: it matches no scope)."""
    return get_collection(loss_collection, scope)


def get_regularization_losses(scope: Optional[str] = None) -> list:
    return get_collection(GraphKeys.REGULARIZATION_LOSSES, scope)


def get_regularization_loss(scope: Optional[str] = None,
                            name: str = "total_regularization_loss") -> torch.Tensor:
    """The sum of the regularization losses; 0.0 if there are none."""
    losses = get_regularization_losses(scope)
    return _sum(losses) if losses else torch.tensor(0.0)


def get_total_loss(add_regularization_losses: bool = True, name: str = "total_loss",
                   scope: Optional[str] = None) -> torch.Tensor:
    """The sum of this model_fn call's losses (and regularization losses)."""
    losses = get_losses(scope)
    if add_regularization_losses:
        losses += get_regularization_losses(scope)
    if not losses:
        raise ValueError("get_total_loss: no losses were added in this model_fn call (call "
                         "the est.losses functions, or add_loss, before it)")
    return _sum(losses)


# -- helpers ------------------------------------------------------------------------
def _float(x, name: str) -> torch.Tensor:
    """`x` as a floating tensor: a torch one keeps its floating dtype; numpy
    float64, Python numbers and integers become float32."""
    if x is None:
        raise ValueError(f"Argument `{name}` must not be None.")
    if isinstance(x, torch.Tensor):
        return x if x.is_floating_point() else x.float()
    t = torch.as_tensor(np.asarray(x))
    return t if t.dtype in (torch.float32, torch.float16, torch.bfloat16) else t.float()


def _pair(labels, predictions, names=("labels", "predictions")):
    """(labels, predictions) of one shape, labels in the predictions' dtype."""
    predictions = _float(predictions, names[1])
    labels = _float(labels, names[0]).to(predictions.dtype).to(predictions.device)
    if labels.shape != predictions.shape:
        raise ValueError(f"{names[1]} of shape {tuple(predictions.shape)} and {names[0]} of "
                         f"shape {tuple(labels.shape)} are incompatible: TF requires one shape "
                         "(torch would broadcast them)")
    return labels, predictions


def _weights(weights, losses: torch.Tensor):
    """`weights` as a tensor that broadcasts to `losses` as TF's do: a scalar,
    or of the losses' rank with each dimension 1 or theirs."""
    w = torch.as_tensor(1.0 if weights is None else weights).to(losses.device, losses.dtype)
    if w.dim() and (w.dim() != losses.dim()
                    or any(a not in (1, b) for a, b in zip(w.shape, losses.shape))):
        raise ValueError(f"weights can not be broadcast to values: weights of shape "
                         f"{tuple(w.shape)}, values of shape {tuple(losses.shape)} (weights: "
                         "a scalar, or of the values' rank with each dimension 1 or theirs)")
    return w


def _div_no_nan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(b != 0, a / torch.where(b != 0, b, torch.ones_like(b)),
                       torch.zeros_like(a))


def _reduce(losses: torch.Tensor, weights, reduction: str) -> torch.Tensor:
    Reduction.validate(reduction)
    w = _weights(weights, losses)
    weighted = losses * w
    if reduction == Reduction.NONE:
        reduced = weighted
    elif reduction == Reduction.SUM:
        reduced = weighted.sum()
    elif reduction == Reduction.SUM_OVER_BATCH_SIZE:   # (TF's div_no_nan: 0 for no rows)
        reduced = weighted.sum() / losses.numel() if losses.numel() else weighted.sum()
    elif reduction == Reduction.MEAN:
        reduced = _div_no_nan(weighted.sum(), (torch.ones_like(losses) * w).sum())
    else:   # the elements of nonzero weight
        reduced = _div_no_nan(weighted.sum(), (torch.ones_like(losses) * (w != 0)).sum())
    return note_loss_reduction(reduced, summed=reduction == Reduction.SUM)


def _finish(losses, weights, reduction, loss_collection, scope, default_name):
    return _collect(_reduce(losses, weights, reduction), loss_collection, scope, default_name)


def _collect(loss, loss_collection, scope, default_name):
    if loss_collection:
        add_to_collection(loss_collection, unique_name(scope or default_name), loss)
    return loss


def _sum(losses: list) -> torch.Tensor:
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return total
