"""Tensors as numpy arrays on the host (TF: `tensor.numpy()`, `session.run`'s
values).

numpy has no bfloat16, float8 or complex32: such tensors come back in the
narrowest numpy dtype that holds each value exactly (float32, complex64), as
a bfloat16 variable read from a TF checkpoint does here. TF returns
`ml_dtypes.bfloat16` arrays, which this project does not depend on.
"""
from __future__ import annotations

import numpy as np
import torch

_WIDER = {torch.bfloat16: torch.float32, torch.complex32: torch.complex64}
_WIDER.update({getattr(torch, name): torch.float32 for name in (
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)})


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """`tensor` (detached, copied to the host) as a numpy array: a sparse one
    dense, a conjugate or negative view resolved."""
    tensor = tensor.detach().cpu()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    tensor = tensor.resolve_conj().resolve_neg()
    wider = _WIDER.get(tensor.dtype)
    return (tensor if wider is None else tensor.to(wider)).numpy()


def to_numpy_value(tensor: torch.Tensor):
    """`to_numpy`, with a 0-d tensor a numpy scalar (`np.float32`), as TF's
    `session.run` and `.numpy()` give a scalar."""
    value = to_numpy(tensor)
    return value[()] if value.ndim == 0 else value
