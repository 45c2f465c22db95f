"""What a column's map gave each string, remembered across batches.

A categorical column sees the same strings batch after batch (education
levels, occupations, countries). Each string feature gets a `StringCodes`
table numbering the distinct strings seen so far (in order of arrival; a
batch of known strings costs one binary search), and each column keeps what
its map gave each code (`ResultMemo`), so several columns reading one feature
(a vocabulary, a hash bucket and a cross) cost one search and a gather each,
no sort, hash or dict lookup per value. TF gets the same from its hash tables
living in the graph.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Tuple

import numpy as np

LIMIT = 1 << 16        # distinct strings numbered per feature; past it, none are
BYTES_LIMIT = 8 << 20  # nor past this size (numpy stores each string at the longest's width)


class StringCodes:
    """Codes (int64, in order of arrival) of the strings of one feature."""

    def __init__(self, limit: Optional[int] = None):
        self._limit = LIMIT if limit is None else limit
        self._lock = threading.Lock()
        # (strings sorted, their codes, strings by code); replaced whole, never changed
        self._state: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None
        self.full = False   # past the limit: codes() gives None from then on

    def __len__(self) -> int:
        state = self._state
        return 0 if state is None else len(state[2])

    def strings(self, start: int) -> np.ndarray:
        """The strings of codes `start`, `start + 1`, ..."""
        return self._state[2][start:]

    def codes(self, values: np.ndarray) -> Optional[np.ndarray]:
        """The code of each of `values` (a flat str or bytes array), new strings
        numbered; None once the feature has more distinct strings than the limit."""
        if self.full:
            return None
        found = self._find(self._state, values)
        return found if found is not None else self._learn(values)

    @staticmethod
    def _find(state, values) -> Optional[np.ndarray]:
        if state is None:
            return None
        keys, codes, _ = state
        pos = np.searchsorted(keys, values)
        np.minimum(pos, len(keys) - 1, out=pos)
        return codes[pos] if (keys[pos] == values).all() else None

    def _learn(self, values: np.ndarray) -> Optional[np.ndarray]:
        if not len(values):
            return np.zeros(0, np.int64)
        with self._lock:
            if self.full:
                return None
            state = self._state
            new = np.unique(values)
            if state is not None:
                new = new[~np.isin(new, state[2])]
                new = np.concatenate([state[2], new])
            if len(new) > self._limit or new.nbytes > BYTES_LIMIT:
                self.full = True   # (the state stays: codes given before still read it)
                return None
            order = np.argsort(new, kind="stable")
            self._state = (new[order], order.astype(np.int64), new)
            return self._find(self._state, values)


_TABLES: Dict[tuple, StringCodes] = {}
_TABLES_LOCK = threading.Lock()


def codes_of(key: str, values: np.ndarray) -> Tuple[Optional[np.ndarray], StringCodes]:
    """`values`' codes in the table of feature `key` (one per key and str /
    bytes kind, shared by every column reading it), and the table."""
    name = (key, values.dtype.kind)
    table = _TABLES.get(name)
    if table is None:
        with _TABLES_LOCK:
            table = _TABLES.setdefault(name, StringCodes())
    return table.codes(values), table


class ResultMemo:
    """A column's `fn` of each string of a `StringCodes` table, by code. `fn`
    must give a string the same result whatever the batch (a vocabulary id,
    a hash)."""

    def __init__(self):
        self._results: Dict[int, np.ndarray] = {}   # id(table) -> results by code

    def lookup(self, codes: np.ndarray, table: StringCodes,
               fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        results = self._results.get(id(table))
        if results is None or len(results) < len(table):
            # Extended to the table as it is now, which holds every code given
            # before; two threads racing here both get results covering their codes.
            done = results if results is not None else np.zeros(0, np.int64)
            more = fn(table.strings(len(done)))
            results = self._results[id(table)] = np.concatenate([done, more]) \
                if len(done) else more
        return results[codes]


class KeyMemo:
    """Ids remembered by int64 key: a cross of string features keys each row by
    its inputs' codes packed into one number (`pack`), so a batch of known
    combinations is crossed with one binary search, no hashing."""

    def __init__(self, limit: Optional[int] = None):
        self._limit = LIMIT if limit is None else limit
        self._state: Optional[Tuple[np.ndarray, np.ndarray]] = None   # sorted keys, ids
        self.full = False

    def find(self, keys: np.ndarray) -> Optional[np.ndarray]:
        state = self._state
        if state is None or not len(keys):
            return None
        known, ids = state
        pos = np.searchsorted(known, keys)
        np.minimum(pos, len(known) - 1, out=pos)
        return ids[pos] if (known[pos] == keys).all() else None

    def learn(self, keys: np.ndarray, ids: np.ndarray) -> None:
        if self.full:
            return
        state = self._state
        if state is not None:
            keys, ids = np.concatenate([state[0], keys]), np.concatenate([state[1], ids])
        keys, first = np.unique(keys, return_index=True)
        if len(keys) > self._limit:
            self.full, self._state = True, None
        else:
            self._state = (keys, ids[first])   # (replaced whole: readers see old or new)


def pack(codes) -> Optional[np.ndarray]:
    """Codes of a few features (each < LIMIT) as one int64 per row; None when
    they need more than 63 bits (four features or more)."""
    bits = max(LIMIT - 1, 1).bit_length()
    if bits * len(codes) > 63:
        return None
    packed = codes[0]
    for more in codes[1:]:
        packed = (packed << bits) | more
    return packed


def memo_of(column, name: str = "", kind=ResultMemo):
    """The memo `column` keeps (one per `name`: a cross keeps one per input key,
    and a `KeyMemo` of its own)."""
    memos = column.__dict__.setdefault("_memos", {})
    memo = memos.get(name)
    if memo is None:
        memo = memos[name] = kind()
    return memo


def mapped(column, key: str, values: np.ndarray, codes: Optional[np.ndarray],
           table: StringCodes, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """`fn` of each of `values` through `column`'s memo (`codes`: theirs in
    `table`), or of each distinct value once when the table is full."""
    if codes is None:
        unique, inverse = np.unique(values, return_inverse=True)
        return fn(unique)[inverse.reshape(-1)]
    return memo_of(column, key).lookup(codes, table, fn)
