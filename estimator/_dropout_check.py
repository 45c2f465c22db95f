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

import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

logger = logging.getLogger(__name__)

_DROPOUTS = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
             F.feature_alpha_dropout}


class DropoutWatch(TorchFunctionMode):
    """Counts functional dropouts applied with `training=True` and p > 0;
    `warn(mode)` after the call says so."""

    def __init__(self):
        super().__init__()
        self.applied = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUTS and kwargs.get("training", True) and kwargs.get("p", 0.5) > 0:
            self.applied.append(f"{func.__name__}(p={kwargs.get('p', 0.5)})")
        return func(*args, **kwargs)

    def warn(self, what: str) -> None:
        if self.applied:
            logger.warning(
                "%s: the model_fn applies dropout (%s) with training=True: "
                "torch.nn.functional.dropout defaults to it, so its output is random "
                "here. Pass training=est.is_training() (TF's training=(mode == TRAIN)) or "
                "use torch.nn.Dropout in an est.get_module module, which follows the mode",
                what, ", ".join(sorted(set(self.applied))))
