"""Argument checks shared by the Estimator, RunConfig and the specs."""
from __future__ import annotations

from typing import Optional

import numpy as np


def is_host_feature(value) -> bool:
    """Whether `value` is an export's stand-in for a string feature (while
    the export records model_fn: estimator.export's `_HostFeature`)."""
    return getattr(type(value), "is_host_feature", False)


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def steps(value, name: str) -> Optional[int]:
    """None, or an int > 0 given as an int or an integral float (TF's checks of
    `steps`/`max_steps`; TF takes `250.0`), as an int."""
    if value is None:
        return None
    if not (is_int(value) or is_number(value) and float(value).is_integer()):
        raise TypeError(f"`{name}` must be an int or None, given: {value!r}")
    if value <= 0:
        raise ValueError(f"Must specify {name} > 0, given: {value}")
    return int(value)
