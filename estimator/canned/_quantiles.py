"""TF's weighted quantile sketch for the boosted trees' numeric columns (the
``BoostedTreesMakeQuantileSummaries`` / ``QuantileAccumulator`` kernels): a
summary per batch, merged into a stream of summary levels, flushed into at
most about `num_quantiles` bucket boundaries. Weights and ranks are float32,
as TF's; with no more distinct values than `num_quantiles` the boundaries
are those values, TF's exactly; beyond it the summaries are compressed within
the error bound `epsilon` as TF compresses them, and the boundaries picked
from the final summary are TF's but in some cases one (see `boundaries`).
"""
from __future__ import annotations

import math
from typing import List, Tuple

import numpy as np

_F = np.float32
MAX_ELEMENTS = 1 << 40   # (TF's accumulator's default)
# An entry: (value, weight, min rank, max rank), float32 each
Entry = Tuple[np.float32, np.float32, np.float32, np.float32]


def quantile_specs(eps: float, max_elements: int) -> Tuple[int, int]:
    """TF's ``GetQuantileSpecs``: (levels, block size) for `max_elements`."""
    level, block = 1, 2
    while (1 << level) * block < max_elements:
        block = int(math.ceil(level / eps)) + 1
        level += 1
    return level, max(block, 2)


class Summary:
    """TF's ``WeightedQuantilesSummary``: sorted entries with rank bounds."""

    def __init__(self, entries: List[Entry] = None):
        self.entries: List[Entry] = list(entries or [])

    @classmethod
    def of_buffer(cls, values: List[Tuple[np.float32, np.float32]]) -> "Summary":
        entries, cumulative = [], _F(0)
        for value, weight in values:
            entries.append((value, weight, cumulative, _F(cumulative + weight)))
            cumulative = _F(cumulative + weight)
        return cls(entries)

    def total_weight(self) -> np.float32:
        return self.entries[-1][3] if self.entries else _F(0)

    def merge(self, other: "Summary") -> None:
        """TF's ``Merge``: the two summaries' entries in order, ranks added."""
        theirs = other.entries
        if not theirs:
            return
        if not self.entries:
            self.entries = list(theirs)
            return
        mine, out = self.entries, []
        i = j = 0
        next1 = next2 = _F(0)
        while i < len(mine) and j < len(theirs):
            a, b = mine[i], theirs[j]
            if a[0] < b[0]:
                out.append((a[0], a[1], _F(a[2] + next2), _F(a[3] + _F(b[3] - b[1]))))
                next1 = _F(a[2] + a[1])
                i += 1
            elif b[0] < a[0]:
                out.append((b[0], b[1], _F(b[2] + next1), _F(b[3] + _F(a[3] - a[1]))))
                next2 = _F(b[2] + b[1])
                j += 1
            else:
                out.append((a[0], _F(a[1] + b[1]), _F(a[2] + b[2]), _F(a[3] + b[3])))
                next1, next2 = _F(a[2] + a[1]), _F(b[2] + b[1])
                i += 1
                j += 1
        for a in mine[i:]:
            out.append((a[0], a[1], _F(a[2] + next2), _F(a[3] + theirs[-1][3])))
        for b in theirs[j:]:
            out.append((b[0], b[1], _F(b[2] + next1), _F(b[3] + mine[-1][3])))
        self.entries = out

    def compress(self, size_hint: int, min_eps: float = 0.0) -> None:
        """TF's ``Compress``: to about `size_hint` entries (the first and the
        last kept), the error growing by at most max(1 / size_hint, min_eps)."""
        size_hint = max(size_hint, 2)
        entries = self.entries
        if len(entries) <= size_hint:
            return
        eps_delta = float(self.total_weight()) * max(1.0 / size_hint, min_eps)
        accumulator, step = 0, len(entries)
        out = [entries[0]]
        read, last = 0, 1
        while read + 1 != len(entries):
            nxt = read + 1
            while nxt != len(entries) and accumulator < step and \
                    float(_F(_F(entries[nxt][3] - entries[nxt][1])
                             - _F(entries[read][2] + entries[read][1]))) <= eps_delta:
                accumulator += size_hint
                nxt += 1
            read = read + 1 if read == nxt - 1 else nxt - 1
            out.append(entries[read])
            last = read
            accumulator -= step
        if last + 1 != len(entries):
            out.append(entries[-1])
        # (TF writes from the second slot on: the first entry's slot keeps entries[0])
        self.entries = out

    def approximation_error(self) -> float:
        if not self.entries:
            return 0.0
        gap = _F(0)
        for previous, entry in zip(self.entries, self.entries[1:]):
            gap = max(gap, _F(_F(entry[3] - entry[2]) - entry[1]),
                      _F(_F(entry[3] - entry[1]) - _F(previous[2] + previous[1])))
        return float(gap) / float(self.total_weight())

    def boundaries(self, num_boundaries: int) -> List[float]:
        """TF's ``GenerateBoundaries`` then ``std::unique``. TF 2.8's kernels
        keep at most `num_boundaries` there, where its source's compression
        keeps one or two more: here the one before the last goes, which
        gives TF's boundaries in 29 of the 32 recorded cases (11 without);
        in the others one boundary differs (tests/estimator/test_quantiles.py)."""
        if not self.entries:
            return []
        compressed = Summary(self.entries)
        eps = float(_F(self.approximation_error() + 1.0 / num_boundaries))
        compressed.compress(num_boundaries, eps)
        if len(compressed.entries) > num_boundaries:
            compressed.entries = (compressed.entries[:max(num_boundaries, 2) - 1]
                                  + compressed.entries[-1:])
        out: List[float] = []
        for entry in compressed.entries:
            if not out or out[-1] != float(entry[0]):
                out.append(float(entry[0]))
        return out


class Stream:
    """TF's ``WeightedQuantilesStream``: a buffer, then levels of summaries
    merged and compressed as they fill."""

    def __init__(self, eps: float, max_elements: int):
        self.eps = float(_F(eps))   # (TF: a float attribute, widened)
        _, self.block = quantile_specs(self.eps, max_elements)
        self.buffer_size = min(self.block * 2, max_elements)
        self.buffer: List[Tuple[np.float32, np.float32]] = []
        self.levels: List[Summary] = []
        self.local = Summary()

    def push_entry(self, value, weight) -> None:
        if weight <= 0:
            return
        self.buffer.append((_F(value), _F(weight)))
        if len(self.buffer) >= self.buffer_size:
            self._push_buffer()

    def push_summary(self, entries: List[Entry]) -> None:
        self.local = Summary(entries)
        self.local.compress(self.block, self.eps)
        self._propagate()

    def _push_buffer(self) -> None:
        ordered = sorted(self.buffer, key=lambda e: e[0])
        self.buffer = []
        deduped: List[Tuple[np.float32, np.float32]] = []
        for value, weight in ordered:
            if deduped and deduped[-1][0] == value:
                deduped[-1] = (value, _F(deduped[-1][1] + weight))
            else:
                deduped.append((value, weight))
        self.local = Summary.of_buffer(deduped)
        self.local.compress(self.block, self.eps)
        self._propagate()

    def _propagate(self) -> None:
        if not self.local.entries:
            return
        level = 0
        while True:
            if len(self.levels) <= level:
                self.levels.append(Summary())
            current = self.levels[level]
            self.local.merge(current)
            if not current.entries or len(self.local.entries) <= self.block + 1:
                self.levels[level], self.local = self.local, Summary()
                return
            self.local.compress(self.block, self.eps)
            current.entries = []
            level += 1

    def finalize(self) -> Summary:
        self._push_buffer()
        final = Summary()
        for summary in self.levels:
            final.merge(summary)
        self.levels = []
        return final


def batch_summary(values: np.ndarray, weights: np.ndarray, eps: float) -> List[Entry]:
    """TF's ``BoostedTreesMakeQuantileSummaries`` of one feature's batch."""
    stream = Stream(eps, len(values) + 1)
    single = len(weights) == 1
    for i, value in enumerate(values):
        stream.push_entry(value, weights[0] if single else weights[i])
    return stream.finalize().entries


def bucketize(values: np.ndarray, boundaries: List[float]) -> np.ndarray:
    """TF's ``BoostedTreesBucketize``: the first boundary not below the value
    (the last for larger ones; 0 without boundaries or for NaN)."""
    if not boundaries:
        return np.zeros(len(values), np.int64)
    index = np.searchsorted(np.asarray(boundaries, np.float32), values, side="left")
    index = np.minimum(index, len(boundaries) - 1)
    return np.where(np.isnan(values), 0, index)
