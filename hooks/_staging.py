"""Shared memory a background checkpoint save is staged in: on the step, the
state's tensors are copied into it and the rest of the state pickled around
them (`stage`); the writer process, a fork of this one that shares the
memory, rebuilds the state from it (`unstage`) and serializes it with
torch.save while training goes on (torch.distributed.checkpoint's async
save stages into host memory the same way).

Only plain dense CPU tensors are staged; a state holding any other kind
(sparse, quantized, a subclass) is saved as before, on the step."""
from __future__ import annotations

import io
import math
import mmap
import pickle
from typing import Optional

import torch

_ALIGN = 64   # (every dtype's items stay aligned in the flat byte view)


class Staging:
    """`nbytes` of memory shared with the processes forked after it is made."""

    def __init__(self, nbytes: int):
        self.nbytes = max(_ALIGN, nbytes)
        self._memory = mmap.mmap(-1, self.nbytes)   # (anonymous, MAP_SHARED)
        self._flat = torch.frombuffer(self._memory, dtype=torch.uint8)
        self._views = {}   # (offset, dtype, shape) -> a view of _flat (a state's layout stays)

    @staticmethod
    def size_of(obj) -> Optional[int]:
        """The bytes staging `obj` takes, or None where it holds a tensor
        that is not staged."""
        sizes, seen = [0], set()

        def visit(x):
            if isinstance(x, torch.Tensor):
                if not _stageable(x):
                    raise _NotStaged
                if id(x) not in seen:
                    seen.add(id(x))
                    sizes[0] += _aligned(x.numel() * x.element_size())
            elif isinstance(x, dict):
                for v in x.values():
                    visit(v)
            elif isinstance(x, (list, tuple)):
                for v in x:
                    visit(v)
        try:
            visit(obj)
        except _NotStaged:
            return None
        return sizes[0]

    def stage(self, obj) -> Optional[bytes]:
        """Copy `obj`'s tensors here and return the pickle of the rest, or
        None where a tensor is not stageable or they do not fit."""
        buffer = io.BytesIO()
        stager = _Stager(buffer, self)
        try:
            stager.dump(obj)
        except _NotStaged:
            return None
        torch._foreach_copy_(stager.targets, stager.sources)   # (one call for all)
        return buffer.getvalue()

    def unstage(self, skeleton: bytes):
        """The object `stage` was given, its tensors over this memory (in the
        writer process: valid until the parent stages the next save)."""
        global _unstaging
        _unstaging = self
        try:
            return pickle.loads(skeleton)
        finally:
            _unstaging = None

    def _target(self, offset: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
        key = (offset, dtype, shape)
        view = self._views.get(key)
        if view is None:
            nbytes = dtype.itemsize * math.prod(shape)
            view = self._views[key] = self._flat[offset:offset + nbytes].view(dtype).view(shape)
        return view

    def _own(self, offset: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
        """The tensor at `offset`, on a storage of its own (torch.save saves
        storages: views of one would save all of it, and refuses mixed types)."""
        count = math.prod(shape)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._memory, dtype=dtype, count=count,
                                offset=offset).view(shape)


_unstaging: Optional[Staging] = None   # the Staging `unstage` reads from


def _unstaged(offset: int, dtype: str, shape: tuple, requires_grad: bool) -> torch.Tensor:
    """A staged tensor, rebuilt by the unpickling of a skeleton."""
    tensor = _unstaging._own(offset, getattr(torch, dtype), shape)
    return tensor.requires_grad_() if requires_grad else tensor


class _NotStaged(Exception):
    pass


def _aligned(n: int) -> int:
    """The bytes `n` bytes take, a whole number of aligned blocks (at least one:
    an empty tensor has an offset of its own)."""
    return max(1, -(-n // _ALIGN)) * _ALIGN


def _stageable(t: torch.Tensor) -> bool:
    return (type(t) is torch.Tensor and t.layout == torch.strided and t.device.type == "cpu"
            and not t.is_quantized and not t.is_nested)


class _Stager(pickle.Pickler):
    """Pickles a state with each tensor (pickled once, as pickle memoizes
    it) replaced by its place in the staging memory, and lists the copies
    that put it there (`targets`, `sources`)."""

    def __init__(self, file, staging: Staging):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._staging, self._offset = staging, 0
        self.targets, self.sources = [], []

    def reducer_override(self, obj):
        if not isinstance(obj, torch.Tensor):
            return NotImplemented
        if not _stageable(obj):
            raise _NotStaged
        shape = tuple(obj.shape)
        nbytes = obj.numel() * obj.element_size()
        if self._offset + nbytes > self._staging.nbytes:
            raise _NotStaged
        self.targets.append(self._staging._target(self._offset, obj.dtype, shape))
        self.sources.append(obj.detach())
        args = (self._offset, str(obj.dtype).rpartition(".")[2], shape, obj.requires_grad)
        self._offset += _aligned(nbytes)
        return _unstaged, args
