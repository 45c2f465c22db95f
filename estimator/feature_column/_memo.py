"""What a column's map gave each string, remembered across batches.

A categorical column sees the same strings batch after batch (education
levels, occupations, countries). `ValueMemo` keeps the distinct strings seen
so far, sorted, beside what the map gave each: a batch whose strings are all
known costs one binary search (numpy), no sort, hash or dict lookup per
value. TF gets the same from its hash tables living in the graph.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

LIMIT = 1 << 16   # distinct strings remembered per column and feature; past it, none


class ValueMemo:
    """`lookup(values, fn)`: ``fn(distinct values)`` spread over a flat str / bytes
    array, `fn` called only for strings not seen before. `fn` must give each
    value the same result whatever the batch (a vocabulary, a hash)."""

    def __init__(self, limit: int = LIMIT):
        self._limit = limit
        self._known: dict = {}   # dtype kind ("U" / "S") -> (sorted keys, results), or None

    def lookup(self, values: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        kind = values.dtype.kind
        known = self._known.get(kind, ())
        if known and len(values):
            keys, results = known
            pos = np.searchsorted(keys, values)
            np.minimum(pos, len(keys) - 1, out=pos)
            if (keys[pos] == values).all():
                return results[pos]
        unique, inverse = np.unique(values, return_inverse=True)
        mapped = fn(unique)
        if known is not None and len(unique):
            self._learn(kind, known, unique, mapped)
        return mapped[inverse.reshape(-1)]

    def _learn(self, kind: str, known, unique: np.ndarray, mapped: np.ndarray) -> None:
        if known:
            merged, first = np.unique(np.concatenate([known[0], unique]), return_index=True)
            unique, mapped = merged, np.concatenate([known[1], mapped])[first]
        # (a new tuple, never the old one changed: a reader in another thread sees either)
        self._known[kind] = (unique, mapped) if len(unique) <= self._limit else None


def memo_of(column, name: str = "") -> ValueMemo:
    """The memo `column` keeps (one per `name`: a cross keeps one per input key)."""
    memos = column.__dict__.setdefault("_memos", {})
    memo = memos.get(name)
    if memo is None:
        memo = memos[name] = ValueMemo()
    return memo
