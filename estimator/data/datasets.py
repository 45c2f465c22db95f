"""`TFRecordDataset` and `TextLineDataset` (TF: ``tf.data.TFRecordDataset``,
``tf.data.TextLineDataset``), sharded by record (see the package doc)."""
from __future__ import annotations

import glob
import os
import random
from typing import Iterator, Optional, Sequence, Union

import torch

from ..io._records import check_compression, open_stream, read_records

Files = Union[str, Sequence[str]]


def _files(filenames: Files) -> list:
    if isinstance(filenames, (str, os.PathLike)):
        filenames = [filenames]
    files = [os.fspath(f) for f in filenames]
    if not files:
        raise ValueError("filenames is empty: give at least one file")
    for f in files:
        if not os.path.isfile(f):
            hint = ("; a dataset takes file names, as TF's: for a pattern, "
                    "est.data.list_files(pattern)") if glob.has_magic(f) else ""
            raise ValueError(f"{f}: no such file{hint}")
    return files


def list_files(file_pattern: Files, shuffle: Optional[bool] = None,
               seed: Optional[int] = None) -> list:
    """The files a glob pattern (or a list of them) names (TF:
    ``tf.data.Dataset.list_files``), as a list: each pattern's sorted, in
    the patterns' order (a file two patterns match twice, as TF's), unless
    `shuffle` (then in an order drawn once, from `seed`, or without one from
    a seed drawn from torch's generator: repeatable with `tf_random_seed`,
    and one order on every replica, so that their shards of it do not
    overlap). TF's `shuffle` defaults to True, a new order each pass; here
    to not shuffled."""
    patterns = [file_pattern] if isinstance(file_pattern, (str, os.PathLike)) else file_pattern
    files = [f for p in patterns for f in sorted(glob.glob(os.fspath(p)))]
    if not files:
        raise ValueError(f"No files match {file_pattern!r}")
    if shuffle:
        random.Random(int(torch.randint(2**31 - 1, ())) if seed is None else seed).shuffle(files)
    return files


class _ShardedFiles(torch.utils.data.IterableDataset):
    """Records of several files, in order (interleaved `num_parallel_reads`
    at a time, as TF's), keeping this shard's."""

    def __init__(self, filenames: Files, compression_type: Optional[str] = None,
                 input_context=None, num_shards: int = 1, index: int = 0,
                 num_parallel_reads=None):
        self.filenames = _files(filenames)
        self.cycle_length = cycle_length(num_parallel_reads)
        self.compression_type = check_compression(compression_type)
        if input_context is not None:
            num_shards = num_shards * input_context.num_input_pipelines
            index = index * input_context.num_input_pipelines + input_context.input_pipeline_id
        if not 0 <= index < num_shards:
            raise ValueError(f"shard index {index} is not in [0, {num_shards})")
        self.num_shards, self.index = num_shards, index

    def shard(self, num_shards: int, index: int):
        """Every `num_shards`-th record from the `index`-th (TF: ``Dataset.shard``)."""
        if not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
        if not 0 <= index < num_shards:
            raise ValueError(f"index {index} is not in [0, {num_shards})")
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.num_shards, clone.index = self.num_shards * num_shards, \
            self.index * num_shards + index
        return clone

    def _records(self) -> Iterator[bytes]:
        return _interleave(self.filenames, self._file_records, self.cycle_length)

    def _file_records(self, path: str) -> Iterator[bytes]:
        raise NotImplementedError

    def __iter__(self):
        shards, index = self.num_shards, self.index
        worker = torch.utils.data.get_worker_info()
        if worker is not None:
            shards, index = shards * worker.num_workers, index + shards * worker.id
        for i, record in enumerate(self._records()):
            if i % shards == index:
                yield record


class TFRecordDataset(_ShardedFiles):
    """The serialized records of TFRecord files, in order (TF:
    ``tf.data.TFRecordDataset(filenames, compression_type)``), each a bytes
    object; every record's CRCs are checked, and a damaged or truncated one
    raises ``estimator.io.DataLossError`` naming the file and offset.
    `num_parallel_reads` files are read interleaved, a record from each in
    turn, as TF's (deterministic) order; `buffer_size` is accepted for TF's
    signature."""

    def __init__(self, filenames: Files, compression_type: Optional[str] = None,
                 buffer_size=None, num_parallel_reads=None, *, input_context=None):
        del buffer_size
        super().__init__(filenames, compression_type, input_context,
                         num_parallel_reads=num_parallel_reads)

    def _file_records(self, path: str):
        for _, data in read_records(path, self.compression_type):
            yield data


class TextLineDataset(_ShardedFiles):
    """The lines of text files, as bytes, split at "\n" and without any "\r"
    (TF's line reader drops every one, not only a CRLF's), files interleaved
    as TFRecordDataset's (TF: ``tf.data.TextLineDataset``)."""

    def __init__(self, filenames: Files, compression_type: Optional[str] = None,
                 buffer_size=None, num_parallel_reads=None, *, input_context=None):
        del buffer_size
        super().__init__(filenames, compression_type, input_context,
                         num_parallel_reads=num_parallel_reads)

    def _file_records(self, path: str):
        with open_stream(path, self.compression_type) as f:
            for line in f:
                text = line.rstrip(b"\n").replace(b"\r", b"")
                if text or line.endswith(b"\n"):   # (a last line of only "\r"s: none)
                    yield text


def cycle_length(num_parallel_reads) -> int:
    """How many files are read in turn for TF's `num_parallel_reads` (None:
    one; TF's AUTOTUNE, -1, picks a number by the machine: read here in order)."""
    return num_parallel_reads if isinstance(num_parallel_reads, int) \
        and num_parallel_reads > 1 else 1


def _interleave(sources, read, cycle: int) -> Iterator:
    """TF's deterministic interleave (cycle, block_length 1): a record
    from each of `cycle` open sources in turn; a source that ends
    gives its place to the next one when the turn comes back to it."""
    sources = iter(sources)
    slots: list = [None] * cycle
    more, opened, i = True, 0, 0
    while more or opened:
        if slots[i] is not None:
            item = next(slots[i], _END)
            if item is _END:
                slots[i], opened = None, opened - 1
            else:
                yield item
            i = (i + 1) % cycle
        elif more:
            source = next(sources, _END)
            if source is _END:
                more = False
            else:
                slots[i], opened = iter(read(source)), opened + 1
        else:
            i = (i + 1) % cycle


_END = object()
