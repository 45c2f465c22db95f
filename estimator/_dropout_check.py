"""Functional dropout left on outside TRAIN: a warning on the first call of a
model_fn in EVAL and PREDICT mode (and for an export).

`torch.nn.Dropout` follows the mode (the model scope puts modules in eval()
there), but `torch.nn.functional.dropout(x, p)` defaults to `training=True`:
a port of TF1's `tf.layers.dropout(x, rate, training=...)` or `tf.nn.dropout`
that drops the argument keeps dropping at evaluation and in the served model.
Warned, not refused: dropout at prediction can be meant (Monte Carlo dropout).
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

logger = logging.getLogger(__name__)

_DROPOUTS = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
             F.feature_alpha_dropout}
# torch's own: (input, p, train), positional (what F.dropout calls; also called directly)
_TORCH_DROPOUTS = {torch.dropout, torch.dropout_, torch.alpha_dropout, torch.alpha_dropout_,
                   torch.feature_dropout, torch.feature_dropout_, torch.feature_alpha_dropout,
                   torch.feature_alpha_dropout_}


def _applied(func, args: tuple, kwargs: dict):
    """(p) of a dropout applied in training mode with p > 0, else None."""
    if func in _DROPOUTS:
        p, training = kwargs.get("p", 0.5), kwargs.get("training", True)
    elif func in _TORCH_DROPOUTS:
        named = dict(zip(("input", "p", "train"), args), **kwargs)
        p, training = named.get("p", 0.5), named.get("train", True)
    else:
        return None
    return p if training and p > 0 else None


class DropoutWatch(TorchFunctionMode):
    """Counts functional dropouts applied with `training=True` and p > 0;
    `warn(mode)` after the call says so."""

    def __init__(self):
        super().__init__()
        self.applied = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        p = _applied(func, args, kwargs)
        if p is not None:
            self.applied.append(f"{func.__name__}(p={p})")
        return func(*args, **kwargs)

    def warn(self, what: str) -> None:
        if self.applied:
            logger.warning(
                "%s: the model_fn applies dropout (%s) with training=True: "
                "torch.nn.functional.dropout defaults to it, so its output is random "
                "here. Pass training=est.is_training() (TF's training=(mode == TRAIN)) or "
                "use torch.nn.Dropout in an est.get_module module, which follows the mode",
                what, ", ".join(sorted(set(self.applied))))
