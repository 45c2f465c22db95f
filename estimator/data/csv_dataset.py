"""`make_csv_dataset` (TF: ``tf.data.experimental.make_csv_dataset``)."""
from __future__ import annotations

import collections
import copy
import csv
import io
import logging
from typing import Optional, Sequence

import numpy as np
import torch

from ..io._records import open_stream
from ..io.csv import DecodeCSVError, _decode, check_field_delim
from .datasets import _interleave, cycle_length, list_files

_INFERENCE_ROWS = 100
logger = logging.getLogger(__name__)


def _reader(lines, delim: str, quoted: bool):
    """Python's csv reader as TF's make_csv_dataset reads the header and the
    rows it infers types from (quotes as text without `use_quote_delim`)."""
    return csv.reader(lines, delimiter=delim,
                      quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE)


def _header(path: str, delim: str, quoted: bool, compression_type) -> list:
    with open_stream(path, compression_type) as f:
        first = f.readline().decode("utf-8", "surrogateescape").rstrip("\r\n")
    return next(_reader([first], delim, quoted))


def _infer_default(name: str, values: Sequence[str], na_value: str):
    """TF's type inference (`_infer_type`) over the first rows: the least
    permissive of int32, int64, float32, float64 (a finite value: "nan" and
    "inf" are strings) and string that every value fits; string for a column
    with no value; a warning when a few values make a column of numbers strings."""
    kind = None
    for v in values:
        if v not in ("", na_value):   # the first type at least as permissive that fits
            kind = next(i for i in range(kind or 0, _STRING + 1) if _VALID[i](v))
    if kind == _STRING:
        _warn_if_mostly_numbers(name, values, na_value)
    return [[0], [np.int64(0)], [0.0], [np.float64(0.0)], [""]][_STRING if kind is None else kind]


def _fits(cast, value: str) -> bool:
    try:
        with np.errstate(over="ignore"):   # ("1e39" as float32: inf, so not a float32)
            return bool(cast(value))
    except (ValueError, OverflowError):
        return False


# TF's validations, in order of permissiveness (numpy's parsing, as TF's)
_VALID = (lambda v: _fits(lambda x: np.int32(x) == np.int64(x), v),
          lambda v: _fits(lambda x: np.int64(x) is not None, v),
          lambda v: _fits(lambda x: np.float32(x) < np.inf, v),
          lambda v: _fits(lambda x: np.float64(x) < np.inf, v),
          lambda v: True)
_STRING = len(_VALID) - 1


def _warn_if_mostly_numbers(name: str, values: Sequence[str], na_value: str) -> None:
    odd = [v for v in values if v not in ("", na_value) and not _VALID[_STRING - 1](v)]
    numbers = sum(v not in ("", na_value) for v in values) - len(odd)
    if numbers > len(odd):
        logger.warning(
            "make_csv_dataset: column %r is read as strings, as TF reads it: %d of its first "
            "%d values are numbers, but not %s. Give column_defaults to read it as numbers (a "
            "bad value is then an error naming its line), or na_value for a missing-value mark",
            name, numbers, len(values), ", ".join(repr(v) for v in sorted(set(odd))[:3]))


def _open_quote(record: str, delim: str) -> bool:
    """Whether `record` ends inside a quoted field (one that starts with a
    quote, whose line breaks are its own: RFC 4180, TF's CsvDataset). A quote
    elsewhere in a field opens nothing (decoding refuses it, that record
    alone: it joined the lines after it to it, and ignore_errors lost them)."""
    if '"' not in record:
        return False
    i, n = 0, len(record)
    while i < n:
        if record[i] == '"':   # to the closing quote: one followed by the delimiter, a
            i += 1             # line break or the end, as TF's ("" is a quote; "a"x goes on)
            while True:
                j = record.find('"', i)
                if j < 0:
                    return True
                if record.startswith('"', j + 1):
                    i = j + 2
                    continue
                i = j + 1
                if i == n or record[i] in (delim, "\n", "\r"):
                    break
        j = record.find(delim, i)   # the rest of the field
        if j < 0:
            return False
        i = j + 1
    return False


class _CsvBatches(torch.utils.data.IterableDataset):
    """What `make_csv_dataset` returns: batches of the files' rows, parsed."""

    def __init__(self, files, batch_size, column_names, defaults, label_name, select,
                 csv_format, header, num_epochs, shuffling, compression_type,
                 drop_final_batch, cycle_length=1, shard=(1, 0), ignore_errors=False):
        self.files, self.batch_size, self.column_names = files, batch_size, column_names
        self.defaults, self.label_name, self.select = defaults, label_name, select
        self.field_delim, self.use_quote_delim, self.na_value = csv_format
        self.header, self.num_epochs, self.compression_type = header, num_epochs, \
            compression_type
        self.shuffle, self.shuffle_buffer_size, self.shuffle_seed = shuffling
        self.drop_final_batch = drop_final_batch
        self.ignore_errors = ignore_errors   # rows that cannot be read left out
        self.cycle_length = cycle_length   # files read in turn (TF's num_parallel_reads)
        self.sharding = shard   # (input pipelines, this one's id): its every n-th batch
        self._iterations = 0   # of the dataset here, each shuffled otherwise

    def _lines(self):
        """(record, file, line number) of each data record, the files read
        `num_parallel_reads` at a time, interleaved as TF's."""
        return _interleave(self.files, self._file_lines, self.cycle_length)

    def _file_lines(self, path: str):
        """(record, file, line number) of each data record of `path`: a line
        (a blank one too, as TF's CsvDataset reads it), or the lines a quoted
        field with line breaks spans (RFC 4180, as TF's), numbered by its
        first; with `ignore_errors`, only those that can be read."""
        records = self._file_records(path)
        if not self.ignore_errors:
            return records
        return (r for r in records if self._readable(r[0]))

    def _readable(self, record: str) -> bool:
        try:
            self._decode([record])
        except DecodeCSVError:
            return False
        return True

    def _decode(self, records):
        return _decode(records, self.defaults, self.field_delim, self.use_quote_delim,
                       self.na_value, self.select, blank_line=True)

    def _file_records(self, path: str):
        with open_stream(path, self.compression_type) as f:
            lines = io.TextIOWrapper(f, encoding="utf-8", errors="surrogateescape",
                                     newline="")
            if self.header:
                next(lines, None)
            record, first = None, None
            for number, line in enumerate(lines, 1 + self.header):
                if record is not None:   # inside a quoted field: its line break too
                    record += line
                else:
                    record, first = line, number
                if self.use_quote_delim and _open_quote(record, self.field_delim):
                    continue
                yield record.rstrip("\r\n"), path, first
                record = None
            if record is not None and not self.ignore_errors:   # (TF's CsvDataset fails too)
                raise ValueError(f"make_csv_dataset: {path}, line {first}: a quoted field "
                                 "opened on this line is not closed before the end of "
                                 "the file")

    def _ordered(self):
        """The rows of `num_epochs` passes over the files, shuffled (TF's
        `reshuffle_each_iteration`: each iteration of the dataset, and each
        epoch within one, another order, alike on every DataLoader worker:
        a worker's iteration is told by its DataLoader's base seed). A
        sharded dataset (input pipelines, `.shard`) shuffles each iteration
        alike: its pipelines agree on the order whatever their workers and
        torch seeds (with the base seed, pipelines of other worker counts,
        or processes of other torch seeds with a shuffle_seed, read rows
        twice and others never; an Estimator's input_fn makes its dataset
        anew for each train call, as TF's, and sees no difference)."""
        epoch = 0
        worker = torch.utils.data.get_worker_info()
        if self.sharding != (1, 0):
            iteration = 0
        elif worker is not None:
            iteration = worker.seed - worker.id
        else:
            iteration, self._iterations = self._iterations, self._iterations + 1
        rng = np.random.RandomState(np.random.SeedSequence(
            [self.shuffle_seed or 0, iteration % 2**64]).generate_state(1)[0])
        while self.num_epochs is None or epoch < self.num_epochs:
            rows = 0
            buffer = []   # TF's shuffle(buffer_size): a random pick from a sliding buffer
            for row in self._lines():
                rows += 1
                if not self.shuffle:
                    yield row
                    continue
                buffer.append(row)
                if len(buffer) >= self.shuffle_buffer_size:
                    yield buffer.pop(rng.randint(len(buffer)))
            while buffer:
                yield buffer.pop(rng.randint(len(buffer)))
            if not rows:   # no rows at all: repeating would loop for ever (TF's repeat ends)
                logger.warning("make_csv_dataset: %s hold(s) no data rows", ", ".join(self.files))
                return
            epoch += 1

    def shard(self, num_shards: int, index: int) -> "_CsvBatches":
        """Every `num_shards`-th batch from the `index`-th (TF: ``Dataset.shard``)."""
        if not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
        if not 0 <= index < num_shards:
            raise ValueError(f"index {index} is not in [0, {num_shards})")
        clone = copy.copy(self)
        shards, own = self.sharding
        clone.sharding = (shards * num_shards, own * num_shards + index)
        return clone

    def __iter__(self):
        """This pipeline's (and DataLoader worker's) batches: every n-th of
        the one order, parsed (only its own)."""
        shards, index = self.sharding
        worker = torch.utils.data.get_worker_info()
        if worker is not None:
            shards, index = shards * worker.num_workers, index + shards * worker.id
        for i, batch in enumerate(self._batches()):
            if i % shards == index:
                yield self._parse(batch)

    def _batches(self):
        batch = []
        for row in self._ordered():
            batch.append(row)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_final_batch:
            yield batch

    def _parse(self, batch):
        names = ([self.column_names[i] for i in self.select] if self.select is not None
                 else self.column_names)
        try:
            columns = self._decode([line for line, _, _ in batch])
        except DecodeCSVError as e:   # TF names the record in the batch; here its line
            line, path, number = batch[e.record]
            where = f"column {names[e.field]!r} {e.problem}" if e.field is not None \
                else e.problem.replace("quotes/CRLFs", "quotes")   # (TF's CsvDataset's words:
            # a line break ends a record not quoted)
            raise ValueError(f"make_csv_dataset: {path}, line {number}: {where}\n"
                             f"  {line}") from None
        features = collections.OrderedDict(zip(names, columns))
        if self.label_name is None:
            return features
        return features, features.pop(self.label_name)


def make_csv_dataset(file_pattern, batch_size: int, column_names: Optional[Sequence] = None,
                     column_defaults: Optional[Sequence] = None,
                     label_name: Optional[str] = None, select_columns=None,
                     field_delim: str = ",", use_quote_delim: bool = True, na_value: str = "",
                     header: bool = True, num_epochs: Optional[int] = None,
                     shuffle: bool = True, shuffle_buffer_size: int = 10000,
                     shuffle_seed: Optional[int] = None, prefetch_buffer_size=None,
                     num_parallel_reads=None, sloppy=False, num_rows_for_inference: int = 100,
                     compression_type: Optional[str] = None, ignore_errors: bool = False,
                     drop_final_batch: bool = False, *, input_context=None):
    """Batches of CSV rows as ({column: numpy array}, label array) (or the
    features alone without `label_name`), as TF's ``make_csv_dataset``:
    column names from the header unless given (every file's the same);
    column types from `column_defaults` or inferred as TF infers them from
    the first `num_rows_for_inference` rows of the files (int32, int64,
    float32, float64 for finite numbers, else string); `select_columns` by name or
    index; `num_epochs` None repeats forever; `shuffle` with a buffer of
    `shuffle_buffer_size` rows and `shuffle_seed` (a different order than
    TF's: its shuffling algorithm is not reproducible outside TF), without
    one a seed drawn from torch's generator here (as TF's op seed comes from
    the graph's: repeatable with `tf_random_seed`, and alike on every
    replica and DataLoader worker, which each keep every n-th batch of the
    one order). Strings are bytes, as TF's. `num_parallel_reads` files are
    read in turn, a row from each, as TF's interleave. `input_context` (not
    TF's): keep this input pipeline's batches. A blank line is a row of one
    empty field, as TF reads it (the default in a file of one column, an
    error in one of more); `ignore_errors` leaves out the rows that cannot
    be read (each is read once more on its own to know: slower), as TF's.
    `prefetch_buffer_size` and `sloppy` are accepted for TF's signature."""
    del prefetch_buffer_size, sloppy
    check_field_delim(field_delim)
    files = sorted(list_files(file_pattern))   # (TF's _get_file_names: sorted, as matched)
    if column_names is None:
        if not header:
            raise ValueError("Cannot infer column names without a header line.")
        column_names = _header(files[0], field_delim, use_quote_delim, compression_type)
        if not column_names:
            raise ValueError(f"make_csv_dataset: {files[0]} has no header line to name the "
                             "columns (it is empty, or its first line is)")
        for path in files[1:]:   # (each file is read by the first one's header)
            other = _header(path, field_delim, use_quote_delim, compression_type)
            if other != column_names:
                raise ValueError(
                    f"make_csv_dataset: all input CSV files should have the same column names "
                    f"in the header row (TF's rule): {path} has {other}, {files[0]} has "
                    f"{column_names}")
    column_names = list(column_names)
    if len(set(column_names)) != len(column_names):
        raise ValueError(f"Cannot have duplicate column names: {column_names}")
    select = None
    if select_columns is not None:
        select = sorted({column_names.index(c) if isinstance(c, str) else int(c)
                         for c in _check_selected(select_columns, column_names)})
    wanted = select if select is not None else list(range(len(column_names)))
    if label_name is not None and label_name not in [column_names[i] for i in wanted]:
        raise ValueError(f"`label_name` provided must be one of the columns: "
                         f"{[column_names[i] for i in wanted]}; got {label_name!r}")
    if column_defaults is None:
        sample = _sample_rows(files, header, (field_delim, use_quote_delim),
                              num_rows_for_inference, len(column_names), compression_type)
        column_defaults = [_infer_default(column_names[i], [row[i] for row in sample], na_value)
                           for i in wanted]
    elif select is not None and len(column_defaults) == len(column_names):
        column_defaults = [column_defaults[i] for i in select]
    column_defaults = [d if isinstance(d, (list, tuple)) or not isinstance(
        d, (str, bytes, int, float, np.number)) else [d] for d in column_defaults]
    if len(column_defaults) != len(wanted):
        raise ValueError(f"column_defaults has {len(column_defaults)} entries for "
                         f"{len(wanted)} columns")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if shuffle and shuffle_seed is None:
        shuffle_seed = int(torch.randint(2**31 - 1, ()))
    shard = (1, 0) if input_context is None else (input_context.num_input_pipelines,
                                                  input_context.input_pipeline_id)
    return _CsvBatches(files, batch_size, column_names, list(column_defaults), label_name,
                       select, (field_delim, use_quote_delim, na_value), header, num_epochs,
                       (shuffle, shuffle_buffer_size, shuffle_seed), compression_type,
                       drop_final_batch, cycle_length(num_parallel_reads), shard, ignore_errors)


def _check_selected(select_columns, column_names):
    for c in select_columns:
        if isinstance(c, str) and c not in column_names:
            raise ValueError(f"select_columns: {c!r} is not a column; the columns are "
                             f"{column_names}")
        if not isinstance(c, str) and not 0 <= int(c) < len(column_names):
            raise ValueError(f"select_columns: index {c} is out of range for "
                             f"{len(column_names)} columns")
    return select_columns


def _sample_rows(files, header, csv_format, n, columns, compression_type) -> list:
    """The first `n` rows of the files, in order (TF's inference reads on
    into the next file); a row of another number of fields (a blank line:
    none) is TF's error, with its file and line."""
    rows = []
    for path in files:
        with open_stream(path, compression_type) as f:
            lines = io.TextIOWrapper(f, encoding="utf-8", errors="surrogateescape",
                                     newline="")
            if header:
                next(lines, None)
            reader, line = _reader(lines, *csv_format), 1 + header
            for number, row in enumerate(reader, 1 + header):   # (TF's row numbers)
                if len(rows) >= n:
                    return rows
                if len(row) != columns:
                    raise ValueError(
                        f"make_csv_dataset: {path}, line {line}: Problem inferring types: CSV "
                        f"row {number} has {len(row)} number of fields. Expected: {columns}. "
                        "(Give column_defaults to read the file without inferring its types)")
                rows.append(row)
                line = reader.line_num + 1 + header
    return rows
