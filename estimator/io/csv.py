"""CSV records (TF: ``tf.io.decode_csv``)."""
from __future__ import annotations

import re
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


# The numbers TF's kernel reads (strto32/64, strtof/d): ASCII digits, space
# around; integers with no '+'; floats also as hex integers, inf and nan (any case),
# not "infinity", and nothing Python adds ('1_000', other scripts' digits).
_INTEGER = re.compile(r"\s*(-?[0-9]+)\s*", re.ASCII)
_DECIMAL = re.compile(r"\s*([+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
                      r"|[+-]?(inf|nan))\s*", re.ASCII | re.IGNORECASE)
_HEX = re.compile(r"\s*([+-]?0x[0-9a-f]+)\s*", re.ASCII | re.IGNORECASE)   # no '.', no 'p'


def _convert(text: str, dtype: np.dtype, field: int, record: int):
    if dtype == object:
        return text.encode("utf-8", "surrogateescape")   # (bytes not utf-8 kept as they were)
    if dtype.kind == "i":
        match = _INTEGER.fullmatch(text)
        if match and np.iinfo(dtype).min <= int(match[1]) <= np.iinfo(dtype).max:
            return dtype.type(int(match[1]))
    else:
        decimal, hexadecimal = _DECIMAL.fullmatch(text), _HEX.fullmatch(text)
        if decimal or hexadecimal:
            value = float(decimal[1]) if decimal else float.fromhex(hexadecimal[1])
            with np.errstate(over="ignore"):   # (as TF's float: 1e40 is inf)
                return dtype.type(value)
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
    return _decode(records, record_defaults, field_delim, use_quote_delim, na_value,
                   select_cols, blank_line=False)


def check_field_delim(field_delim) -> None:
    if not isinstance(field_delim, str) or len(field_delim) != 1:
        raise ValueError(f"field_delim should be only 1 char, got {field_delim!r}")   # (TF's)


def _decode(records, record_defaults, field_delim, use_quote_delim, na_value, select_cols,
            blank_line: bool) -> List[np.ndarray]:
    """`decode_csv`; an empty record has no field (TF's decode_csv) or, with
    `blank_line`, one empty field (a CSV file's blank line, as TF's
    CsvDataset reads it: the default in a file of one column)."""
    check_field_delim(field_delim)
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
        line = record.decode("utf-8", "surrogateescape") if isinstance(record, bytes) \
            else str(record)
        fields = _fields(line, field_delim, use_quote_delim, r) if line or blank_line else []
        if select_cols is not None:
            if select_cols and select_cols[-1] >= len(fields):   # (TF's count: those selected)
                problem = (f"Expect {len(select_cols)} fields but have "
                           f"{sum(c < len(fields) for c in select_cols)}")
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


# TF's words (decode_csv's kernel) for a record it cannot split
_QUOTE_NOT_CLOSED = "Quoted field has to end with quote followed by delim or end"
_QUOTE_INSIDE = "Quote inside a string has to be escaped by another quote"
_QUOTE_UNQUOTED = "Unquoted fields cannot have quotes/CRLFs inside"


def _fields(line: str, delim: str, quoted: bool, record: int) -> List[str]:
    """The fields of one record, split as TF's decode_csv kernel splits it:
    with `quoted`, a field that starts with a quote ends at a quote followed
    by the delimiter or the end (`""` inside it is a quote); a quote anywhere
    else, or a line break in a field not quoted, is an error (Python's csv
    module reads `"ab"c` as `abc`, and an unclosed quote as closed)."""
    if "\r" not in line and "\n" not in line and not (quoted and '"' in line):
        return line.split(delim)   # (the usual record, at str.split's speed)
    fields, i, n = [], 0, len(line)
    while True:
        if quoted and line.startswith('"', i):
            pieces, i = [], i + 1
            while True:
                j = line.find('"', i)
                if j < 0:
                    raise _malformed(_QUOTE_NOT_CLOSED, len(fields), record)
                pieces.append(line[i:j])
                if line.startswith('"', j + 1):   # "" is a quote
                    pieces.append('"')
                    i = j + 2
                    continue
                i = j + 1
                if i < n and line[i] != delim:
                    raise _malformed(_QUOTE_INSIDE, len(fields), record)
                break
            fields.append("".join(pieces))
        else:
            j = line.find(delim, i)
            j = n if j < 0 else j
            field = line[i:j]
            if "\r" in field or "\n" in field or (quoted and '"' in field):
                raise _malformed(_QUOTE_UNQUOTED, len(fields), record)
            fields.append(field)
            i = j
        if i >= n:
            return fields
        i += 1   # the delimiter


def _malformed(words: str, field: int, record: int) -> DecodeCSVError:
    problem = f"{words} (field {field})"
    return DecodeCSVError(f"{problem} in record {record}", record, None, problem)


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
