"""Where the variables of ParameterServerStrategy live: which ps task holds
each variable (or each row slice of a partitioned one), and how a variable's
value is cut into its shards and joined back (TF1: `replica_device_setter`'s
round-robin placement, `GreedyLoadBalancingStrategy`, partitioned variables)."""
from __future__ import annotations

from typing import List

import torch


def ps_device(index: int) -> str:
    return f"/job:ps/replica:0/task:{index}/device:CPU:0"


class Part:
    """One shard of a variable as a trainer sees it: on ps `ps` under `id`,
    rows [start, start + length) (start None: the whole variable)."""

    __slots__ = ("ps", "id", "start", "length")

    def __init__(self, ps, id, start, length):
        self.ps, self.id, self.start, self.length = ps, id, start, length

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.start is None else tensor.narrow(0, self.start, self.length)


class Variable:
    """A parameter or buffer of a module placed on the ps tasks."""

    __slots__ = ("name", "key", "tensor", "is_param", "parts", "snap", "version")

    def __init__(self, name, key, tensor, is_param, parts):
        self.name, self.key, self.tensor = name, key, tensor
        self.is_param, self.parts = is_param, parts
        self.snap = None if is_param else tensor.detach().clone()   # value at the last pull
        self.version = tensor._version


class Placer:
    """Chooses a ps task for each shard, in creation order."""

    def __init__(self, num_ps: int, placement: str):
        self._num_ps, self._placement = num_ps, placement
        self._next = 0
        self.load = [0] * num_ps

    def place(self, nbytes: int) -> int:
        if self._placement == "round_robin":
            ps = self._next % self._num_ps
            self._next += 1
        else:   # greedy: the least loaded, lowest index first (GreedyLoadBalancingStrategy)
            ps = min(range(self._num_ps), key=lambda i: (self.load[i], i))
        self.load[ps] += nbytes
        return ps


def split_rows(rows: int, count: int) -> List[tuple]:
    """(start, length) of `count` row slices, the first ones one longer (as TF)."""
    base, extra = divmod(rows, count)
    out, start = [], 0
    for i in range(count):
        length = base + (1 if i < extra else 0)
        out.append((start, length))
        start += length
    return out


def join(pieces: List[torch.Tensor], var: Variable) -> torch.Tensor:
    """A variable's (or slot's) full value from its shards' values: row
    slices concatenated; a slot that is not per-element (Adam's step) taken once."""
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    if isinstance(first, torch.Tensor) and first.dim() == var.tensor.dim() and \
            first.shape[1:] == var.tensor.shape[1:] and first.shape[0] == var.parts[0].length:
        return torch.cat(pieces)
    return first


def slice_of(value, part: Part, var: Variable):
    """The shard `part` of a restored optimizer slot, on the CPU."""
    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach().cpu()
    if part.start is not None and value.dim() == var.tensor.dim() and \
            value.shape == var.tensor.shape:
        return value.narrow(0, part.start, part.length).clone()
    return value.clone()
