"""Vocabulary lookups (TF: ``lookup_ops.index_table_from_tensor`` /
``index_table_from_file``, as the vocabulary columns build them).

A value's id is its position in the vocabulary. An out-of-vocabulary value
gets ``vocab_size + Fingerprint64(value) % num_oov_buckets`` when there are
OOV buckets (ints are hashed as their decimal string, as TF's
``IdTableWithHashBuckets`` does), else `default_value`.

Strings are looked up in a dict built once (holding both the str and the
UTF-8 bytes form of each entry, so numpy str and bytes arrays both work);
ints with a binary search over the sorted vocabulary.
"""
from __future__ import annotations

import os
import re
from typing import Optional, Sequence

import numpy as np

from .. import _hashing

_MISSING = -(2 ** 62)   # "not in the table" marker, never a real id


class Vocabulary:
    """An immutable value -> id table with OOV handling."""

    def __init__(self, entries: Sequence, is_string: bool, default_value: int,
                 num_oov_buckets: int):
        self.size = len(entries)
        self.is_string = is_string
        self.default_value = int(default_value)
        self.num_oov_buckets = int(num_oov_buckets)
        if is_string:
            table = {}
            for i, entry in enumerate(entries):
                if isinstance(entry, bytes):
                    table.setdefault(entry, i)
                    try:
                        table.setdefault(entry.decode("utf-8"), i)
                    except UnicodeDecodeError:
                        pass
                else:
                    table.setdefault(entry, i)
                    table.setdefault(entry.encode("utf-8"), i)
            self._table = table
        else:
            keys = np.asarray(entries, np.int64)
            order = np.argsort(keys, kind="stable")
            self._sorted_keys = keys[order]
            self._sorted_ids = order.astype(np.int64)

    def lookup(self, values: np.ndarray) -> np.ndarray:
        """Ids (int64) of a flat array of values of the table's kind."""
        n = len(values)
        if n == 0:
            return np.zeros(0, np.int64)
        if self.is_string:
            get = self._table.get
            if values.dtype.kind in "US" and n > 64:   # each distinct value once
                unique, inverse = np.unique(values, return_inverse=True)
                ids = np.fromiter((get(v, _MISSING) for v in unique.tolist()), np.int64,
                                  len(unique))[inverse.reshape(-1)]
            else:
                ids = np.fromiter((get(v, _MISSING) for v in values.tolist()), np.int64, n)
        else:
            values = values.astype(np.int64, copy=False)
            if self.size:
                pos = np.searchsorted(self._sorted_keys, values)
                pos = np.minimum(pos, self.size - 1)
                found = self._sorted_keys[pos] == values
                ids = np.where(found, self._sorted_ids[pos], _MISSING)
            else:
                ids = np.full(n, _MISSING, np.int64)
        oov = ids == _MISSING
        if oov.any():
            if self.num_oov_buckets:
                ids[oov] = self.size + _hashing.hash_bucket(values[oov], self.num_oov_buckets)
            else:
                ids[oov] = self.default_value
        return ids


_INT64_LINE = re.compile(rb"[ \t\n\v\f\r]*-?[0-9]+[ \t\n\v\f\r]*")


def read_vocabulary_file(path: str, key: str, vocabulary_size: Optional[int],
                         is_string: bool, what: Optional[str] = None) -> list:
    """The first `vocabulary_size` lines of `path` (all when None), one entry a
    line without its line ending, as TF's ``TextFileIndex.WHOLE_LINE`` keys;
    ints parsed for an integer column. Errors start with `what` (by default
    the vocabulary file column of `key`)."""
    what = what or f"categorical_column_with_vocabulary_file({key!r})"
    if not os.path.isfile(path):
        raise ValueError(f"{what}: the vocabulary file {path!r} does not exist")
    with open(path, "rb") as f:
        data = f.read()
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    lines = [line[:-1] if line.endswith(b"\r") else line for line in raw]
    if vocabulary_size is not None:
        if vocabulary_size > len(lines):
            raise ValueError(
                f"{what}: vocabulary_size "
                f"{vocabulary_size} is larger than the {len(lines)} lines of {path!r}")
        lines = lines[:vocabulary_size]
    if b"" in lines:   # (TF's words; its position: the byte after the empty line)
        i = lines.index(b"")
        position = sum(len(line) + 1 for line in raw[:i + 1])
        raise ValueError(f"{what}: Invalid content in {path}: empty line found at position "
                         f"{position} (line {i + 1}); TF's table refuses an empty line")
    if is_string:
        entries = []
        for line in lines:
            try:
                entries.append(line.decode("utf-8"))
            except UnicodeDecodeError:
                entries.append(line)
    else:
        entries = []
        for i, line in enumerate(lines):
            # TF's safe_strto64: ASCII digits, a minus sign, spaces around
            # (Python's int() also takes "+7", "1_000" and other scripts' digits)
            number = (int(line) if _INT64_LINE.fullmatch(line) and len(line.strip()) <= 20
                      else None)   # (past 20 characters no int64; int() refuses 4300 digits)
            if number is None or not -2 ** 63 <= number < 2 ** 63:
                text = line.decode(errors="replace")
                raise ValueError(f"{what}: line {i + 1} of {path!r}, {text!r}, is not a valid "
                                 "int64 (TF's table refuses it)")
            entries.append(number)
    seen = {}
    for i, entry in enumerate(entries):
        if entry in seen:
            raise ValueError(
                f"{what}: {path!r} lists "
                f"{entry!r} twice (lines {seen[entry] + 1} and {i + 1}); TF's table "
                "refuses a key with two values")
        seen[entry] = i
    return entries
