"""Variable partitioners for ParameterServerStrategy
(tf.distribute.experimental.partitioners).

A partitioner is called as `partitioner(shape, dtype)` and returns how many
pieces to cut each axis into, e.g. `[2, 1]`: the variable is split into 2
shards along axis 0, placed on ps tasks like separate variables. Only axis 0
is cut here (TF's partitioners only ever cut one axis). Any callable with that
signature works (TF1's `fixed_size_partitioner(num_shards)` is
`FixedShardsPartitioner(num_shards)`).
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch


def _bytes(shape, dtype) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * torch.empty((), dtype=dtype).element_size()


def _axis0(shape, count: int) -> List[int]:
    out = [1] * len(shape)
    if out:
        out[0] = max(1, min(int(count), int(shape[0])))
    return out


class Partitioner:
    """Base class: `__call__(shape, dtype, axis=0)` -> pieces per axis."""

    def __call__(self, shape, dtype, axis: int = 0) -> List[int]:
        raise NotImplementedError


class FixedShardsPartitioner(Partitioner):
    """Cut every variable into `num_shards` pieces along axis 0 (fewer if it
    has fewer rows)."""

    def __init__(self, num_shards: int):
        if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
            raise ValueError(f"FixedShardsPartitioner: num_shards must be an int >= 1, got "
                             f"{num_shards!r}")
        self._num_shards = num_shards

    def __call__(self, shape, dtype, axis: int = 0) -> List[int]:
        _check_axis(axis)
        return _axis0(shape, self._num_shards)


class MinSizePartitioner(Partitioner):
    """As many pieces as keep each at least `min_shard_bytes`, at most
    `max_shards` (TF's default: 256 KiB, 1 shard)."""

    def __init__(self, min_shard_bytes: int = 256 << 10, max_shards: int = 1,
                 bytes_per_string: int = 16):
        if min_shard_bytes < 1 or max_shards < 1:
            raise ValueError(f"MinSizePartitioner: min_shard_bytes and max_shards must be >= 1, "
                             f"got {min_shard_bytes!r}, {max_shards!r}")
        self._min, self._max = min_shard_bytes, max_shards

    def __call__(self, shape, dtype, axis: int = 0) -> List[int]:
        _check_axis(axis)   # (TF's min_max_variable_partitioner: the bytes' ceiling)
        return _axis0(shape, min(self._max, max(1, math.ceil(_bytes(shape, dtype) / self._min))))


class MaxSizePartitioner(Partitioner):
    """As few pieces as keep each at most `max_shard_bytes` (at least a row a
    piece), capped at `max_shards` (None: no cap)."""

    def __init__(self, max_shard_bytes: int, max_shards: Optional[int] = None,
                 bytes_per_string: int = 16):
        if max_shard_bytes < 1 or (max_shards is not None and max_shards < 1):
            raise ValueError(f"MaxSizePartitioner: max_shard_bytes and max_shards must be >= 1, "
                             f"got {max_shard_bytes!r}, {max_shards!r}")
        self._max_bytes, self._max = max_shard_bytes, max_shards

    def __call__(self, shape, dtype, axis: int = 0) -> List[int]:
        _check_axis(axis)   # (TF's variable_axis_size_partitioner: whole rows a shard)
        if not shape:
            return []
        rows_a_shard = max(1, math.floor(self._max_bytes / (_bytes(shape, dtype) / shape[0])))
        count = math.ceil(shape[0] / rows_a_shard)
        if self._max is not None:
            count = min(count, self._max)
        return _axis0(shape, max(1, count))


def _check_axis(axis: int) -> None:
    if axis != 0:
        raise ValueError(f"Only axis 0 can be partitioned, got axis={axis}")


def num_partitions(partitioner, name: str, shape, dtype) -> int:
    """How many row slices `partitioner` asks for `name`, checked."""
    if partitioner is None or len(shape) == 0:
        return 1
    result = partitioner(tuple(shape), dtype)
    if isinstance(result, int):
        result = [result] + [1] * (len(shape) - 1)
    try:
        result = [int(r) for r in result]
    except TypeError:
        raise TypeError(f"variable_partitioner returned {result!r} for {name}; expected a list "
                        "of pieces per axis such as [2, 1]") from None
    if len(result) != len(shape) or any(r < 1 for r in result):
        raise ValueError(f"variable_partitioner returned {result} for {name} of shape "
                         f"{list(shape)}: expected {len(shape)} counts >= 1")
    if any(r != 1 for r in result[1:]):
        raise ValueError(f"variable_partitioner returned {result} for {name}: only axis 0 can "
                         "be partitioned")
    return max(1, min(result[0], int(shape[0])))
