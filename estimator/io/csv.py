"""CSV records (TF: ``tf.io.decode_csv``)."""
from __future__ import annotations

import csv
from typing import List, Optional, Sequence

import numpy as np


class DecodeCSVError(ValueError):
    """A bad CSV record, with TF's message (TF: ``InvalidArgumentError`` from
    ``decode_csv``); `record` (its index in the batch), `field` (the column,
    None for a wrong field count) and `problem` let a reader that knows where
    the record came from name its file and line."""

    def __init__(self, message: str, record: int, field: Optional[int], problem: str):
        super().__init__(message)
        self.record, self.field, self.problem = record, field, problem


def _column_kind(default, index: int):
    """(numpy dtype, default value or None when required) of a record_defaults entry."""
    if isinstance(default, (list, tuple, np.ndarray)):
        if len(default) == 0:
            raise ValueError(f"record_defaults[{index}] is empty: give a typed default "
                             "([0.0], [0], ['']) or a dtype for a required column")
        if len(default) != 1:
            raise ValueError(f"record_defaults[{index}] must hold one value, got {default!r}")
        value = default[0]
        return _dtype_of(value, index), value
    return _dtype_of_type(default, index), None


def _dtype_of(value, index):
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"record_defaults[{index}]: bool columns are not CSV types")
    if isinstance(value, (int, np.integer)):
        return np.dtype(np.int32) if isinstance(value, (int, np.int32)) and \
            -2**31 <= int(value) < 2**31 and not isinstance(value, np.int64) else np.dtype(np.int64)
    if isinstance(value, (float, np.floating)):
        return np.dtype(np.float64) if isinstance(value, np.float64) else np.dtype(np.float32)
    if isinstance(value, (str, bytes)):
        return np.dtype(object)
    raise ValueError(f"record_defaults[{index}]: unsupported default {value!r} (float, int "
                     "or str)")


def _dtype_of_type(dtype, index):
    if dtype in (str, bytes, "string"):
        return np.dtype(object)
    try:
        return np.dtype(getattr(dtype, "name", None) and str(dtype).replace("torch.", "")
                        or dtype)
    except TypeError:
        raise ValueError(f"record_defaults[{index}]: expected a default value in a list "
                         f"or a dtype, got {dtype!r}") from None


_TF_NAMES = {"int32": "int32", "int64": "int64", "float32": "float", "float64": "double"}


def _convert(text: str, dtype: np.dtype, field: int, record: int):
    if dtype == object:
        return text.encode("utf-8")
    try:
        if dtype.kind != "i":
            return dtype.type(float(text))
        value = int(text)
        if np.iinfo(dtype).min <= value <= np.iinfo(dtype).max:
            return dtype.type(value)
    except ValueError:
        pass
    problem = f"is not a valid {_TF_NAMES.get(dtype.name, dtype.name)}: {text}"   # TF's words
    raise DecodeCSVError(f"Field {field} in record {record} {problem}", record, field, problem)


def decode_csv(records, record_defaults: Sequence, field_delim: str = ",",
               use_quote_delim: bool = True, na_value: str = "",
               select_cols: Optional[Sequence[int]] = None) -> List[np.ndarray]:
    """Split each CSV line of `records` (a batch of str/bytes) into columns,
    one numpy array per column (TF: ``tf.io.decode_csv``). Each entry of
    `record_defaults` gives its column's type and default: ``[0.0]``
    float32, ``[0]`` int32, ``[""]`` string (bytes), or a dtype for a
    required column. An empty field (or `na_value`) takes the default; a
    required one missing, a bad number or a wrong field count is an error
    naming the field and the record. `select_cols`: the columns to read."""
    if isinstance(records, (str, bytes)):
        records = [records]
    kinds = [_column_kind(d, i) for i, d in enumerate(record_defaults)]
    if select_cols is not None:
        select_cols = list(select_cols)
        if select_cols != sorted(set(select_cols)):
            raise ValueError("select_cols is not strictly increasing.")
        if len(select_cols) != len(kinds):
            raise ValueError(f"Length of select_cols ({len(select_cols)}) and record_defaults "
                             f"({len(kinds)}) do not match.")
    columns: List[list] = [[] for _ in kinds]
    for r, record in enumerate(records):
        line = record.decode("utf-8") if isinstance(record, bytes) else str(record)
        reader = csv.reader([line], delimiter=field_delim,
                            quoting=csv.QUOTE_MINIMAL if use_quote_delim else csv.QUOTE_NONE)
        fields = next(reader, None) or [""]
        if select_cols is not None:
            if select_cols and select_cols[-1] >= len(fields):
                problem = f"Expect {select_cols[-1] + 1} fields but have {len(fields)}"
                raise DecodeCSVError(f"{problem} in record {r}", r, None, problem)
            fields = [fields[i] for i in select_cols]
        elif len(fields) != len(kinds):
            problem = f"Expect {len(kinds)} fields but have {len(fields)}"
            raise DecodeCSVError(f"{problem} in record {r}", r, None, problem)
        for c, (text, (dtype, default)) in enumerate(zip(fields, kinds)):
            if text == "" or text == na_value:
                if default is None:
                    raise DecodeCSVError(f"Field {c} is required but missing in record {r}!",
                                         r, c, "is required but missing")
                value = default.encode("utf-8") if isinstance(default, str) else default
                columns[c].append(value if dtype == object else dtype.type(value))
            else:
                columns[c].append(_convert(text, dtype, c, r))
    return [np.array(col, dtype=dtype) if dtype != object else _objects(col)
            for col, (dtype, _) in zip(columns, kinds)]


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
