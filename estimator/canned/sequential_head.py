"""`SequentialHeadWrapper`: a head over logits at every step of a sequence
(TF2's ``tensorflow_estimator.python.estimator.head.sequential_head``, which
TF does not export; `RNNClassifier(return_sequences=True)` wraps its head in
one).

In TRAIN and EVAL the logits [batch, T, n], the labels and the features the
wrapper names (a weight at each step) are flattened to the steps the
sequence mask keeps (the feature `sequence_length_mask`, a boolean
[batch, T]) and handed to the wrapped head: the loss and the metrics count
every step of every sequence once, padding none. Labels and named features
are either padded [batch, T] arrays or rows of per-step values (a
``VarLenFeature``'s list of lists), whose lengths must be the sequences'.
In PREDICT each prediction is per step, [batch, T, ...] (``all_class_ids``
and ``all_classes`` per example, as TF's), plus the mask under its key.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from ..mode_keys import ModeKeys
from ..model_fn import EstimatorSpec
from ._head import Head

_PER_EXAMPLE = ("all_class_ids", "all_classes")   # (TF: tiled over the batch, not the steps)


class SequentialHeadWrapper(Head):
    """A sequential head wrapping `static_head` (TF's ``SequentialHeadWrapper``,
    same arguments): `sequence_length_mask` the features' key of the mask,
    `feature_columns` the keys of the features flattened with it for the
    wrapped head (its weight column)."""

    def __init__(self, static_head: Head, sequence_length_mask: str = "sequence_length_mask",
                 feature_columns=None):
        if not isinstance(sequence_length_mask, str):
            raise TypeError(f"`sequence_mask` column must be a string. Given type: "
                            f"{type(sequence_length_mask)}.")
        if isinstance(feature_columns, str):
            feature_columns = [feature_columns]
        elif feature_columns is None:
            feature_columns = []
        elif not isinstance(feature_columns, Iterable):
            raise TypeError(f"`feature_columns` must be either a string or an iterable of "
                            f"strings got {type(feature_columns)} instead.")
        feature_columns = list(feature_columns)
        for column in feature_columns:
            if not isinstance(column, str):
                raise TypeError(f"Column must a string. Given type: {type(column)}.")
        if not isinstance(static_head, Head):
            raise TypeError(f"static_head must be a head of this library "
                            f"(est.BinaryClassHead(...)), got {type(static_head).__name__}")
        if isinstance(static_head, SequentialHeadWrapper) or \
                type(static_head).__name__ == "MultiHead":
            raise ValueError(f"`{type(static_head).__name__}` is not supported with "
                             "`SequentialHeadWrapper`.")
        self._static_head = static_head
        self._sequence_length_mask = sequence_length_mask
        self._feature_columns = feature_columns

    @property
    def static_head(self) -> Head:
        return self._static_head

    @property
    def input_sequence_mask_key(self) -> str:
        return self._sequence_length_mask

    @property
    def logits_dimension(self) -> int:
        return self._static_head.logits_dimension

    @property
    def name(self):
        static = self._static_head.name
        return f"{static}_sequential" if static else None

    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None,
                              trainable_variables=None, train_op_fn=None, update_ops=None,
                              regularization_losses=None):
        """TF's: in PREDICT the wrapped head's predictions at every step and
        the mask; in TRAIN and EVAL the wrapped head's spec of the steps the
        mask keeps."""
        features = getattr(features, "features", features)   # (a canned model's builder)
        if not isinstance(features, dict):
            raise TypeError(f"features must be a dict holding the sequence mask "
                            f"{self._sequence_length_mask!r}, got {type(features).__name__}")
        mask = self._mask(features, logits)
        static = self._static_head
        if mode == ModeKeys.PREDICT:
            batch, steps, n = logits.shape
            predictions = {k: _unflattened(v, batch, steps)
                           for k, v in static._all_predictions(logits.reshape(-1, n)).items()}
            per_example = static._all_predictions(logits.new_zeros(batch, n))
            predictions.update({k: per_example[k] for k in _PER_EXAMPLE if k in predictions})
            predictions[self._sequence_length_mask] = mask
            return EstimatorSpec(mode, predictions=predictions,
                                 export_outputs=static._export_outputs(predictions))
        if labels is None:
            raise ValueError(f"labels must not be None in mode {mode!r}: give a label at each "
                             "step as the second value of input_fn")
        counts = mask.sum(1).tolist()
        flat_logits = logits[mask]
        strings = getattr(static, "_vocabulary", None) is not None   # (labels of no step)
        flat_labels = _flattened(labels, mask, counts, "labels", strings)
        flat_features = {}
        for column in self._feature_columns:
            if column not in features:
                raise ValueError(f"`{column}` column expected in features dictionary.")
            flat_features[column] = _flattened(features[column], mask, counts,
                                               f"feature {column!r}")
        if not flat_logits.shape[0] and mode == ModeKeys.TRAIN:   # (no step: the model's
            flat_logits = flat_logits + logits.sum() * 0.0   # parameters still reached)
        return static.create_estimator_spec(
            flat_features, mode, flat_logits, flat_labels, optimizer=optimizer,
            trainable_variables=trainable_variables, train_op_fn=train_op_fn,
            update_ops=update_ops, regularization_losses=regularization_losses)

    def _mask(self, features: dict, logits: torch.Tensor) -> torch.Tensor:
        key = self._sequence_length_mask
        if key not in features:
            raise ValueError(f"The provided sequence_length_mask key `{key}` should be "
                             f"included in the features dictionary, but was not found. "
                             f"Found keys: {list(features)}.")
        try:
            mask = torch.as_tensor(features[key])
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"features[{key!r}], the sequence mask, must be a [batch, T] "
                             f"array of booleans: {e}") from None
        if mask.dim() != 2:
            raise ValueError(f"Mask is expected to have two dimensions, got {mask.dim()} "
                             "instead.")
        if logits.dim() < 3 or tuple(logits.shape[:2]) != tuple(mask.shape):
            raise ValueError(f"features[{key!r}], the sequence mask, is {list(mask.shape)}; "
                             f"the logits at every step are {list(logits.shape)} ([batch, T, "
                             "n]): the mask must be [batch, T]")
        return mask.to(device=logits.device, dtype=torch.bool)


def _flattened(values, mask: torch.Tensor, counts: list, what: str, strings: bool = False):
    """`values` at the steps `mask` keeps, [steps, ...] ([steps, 1] for one
    value a step): a padded [batch, T, ...] array masked, or rows of per-step
    values (a list of lists) joined, each row as long as its sequence.
    `strings`: no step gives strings (an empty object array), else int64."""
    batch, steps = mask.shape
    if _padded(values):
        if values.ndim < 2 or tuple(values.shape[:2]) != (batch, steps):
            raise ValueError(f"{what} must hold a value at each step: [batch, T] = "
                             f"[{batch}, {steps}] as the sequences, or rows of per-step values, "
                             f"got shape {list(values.shape)}")
        if isinstance(values, np.ndarray):
            flat = values[mask.cpu().numpy()]
            if flat.dtype.kind in "SUO":
                return flat[:, None] if flat.ndim == 1 else flat
            flat = torch.from_numpy(flat)
        else:
            flat = values[mask.to(values.device)]
        return flat.unsqueeze(-1) if flat.dim() == 1 else flat
    rows = list(values)
    if len(rows) != batch:
        raise ValueError(f"{what} have {len(rows)} rows, the sequences {batch}")
    for i, (row, count) in enumerate(zip(rows, counts)):
        if not hasattr(row, "__len__") or isinstance(row, (str, bytes)):
            raise ValueError(f"{what}: example {i} is {row!r}, not a row of per-step values "
                             f"(a value at each step of its sequence)")
        if len(row) != count:
            raise ValueError(f"{what}: example {i} has {len(row)} values, its sequence "
                             f"{count} steps (a value at each step)")
    joined = [value for row in rows for value in row]
    if not joined:
        return np.zeros((0, 1), object) if strings else torch.zeros(0, 1, dtype=torch.int64)
    flat = np.asarray(joined, dtype=object if any(
        isinstance(v, (str, bytes)) for v in joined) else None)
    if flat.dtype == object:
        return flat.reshape(len(joined), -1)
    flat = torch.as_tensor(flat)
    return flat.unsqueeze(-1) if flat.dim() == 1 else flat


def _padded(values) -> bool:
    """Whether `values` is a padded [batch, T, ...] array (strings too, as
    parse_example's FixedLenSequenceFeature gives them), not rows."""
    if not isinstance(values, (torch.Tensor, np.ndarray)):
        return False
    if values.dtype != object:
        return True
    return values.ndim >= 2 and not any(isinstance(v, (list, tuple, np.ndarray))
                                        for v in values.reshape(-1)[:1])


def _unflattened(value, batch: int, steps: int):
    """A prediction of the [batch * T] steps as [batch, T, ...]."""
    return value.reshape(batch, steps, *value.shape[1:])
