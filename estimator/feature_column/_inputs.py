"""Feature values as the columns read them, and dtype names.

A feature arrives in the `features` dict in one of the forms the input
pipeline produces (`distribute.strategy._mover`): a torch tensor (numbers), a
numpy array (numbers, or str / bytes / object arrays of strings), a list of
scalars, or a list of lists. They map onto what TF would have been given:

* a tensor, a numpy array or a list of scalars is a dense `Tensor`: rank 1 is
  read as ``[batch, 1]`` (TF's ``expand_dims``), rank 0 is an error. A
  categorical column drops its missing cells, ``''`` for strings and ``-1``
  for ints (TF's ``_to_sparse_input_and_drop_ignore_values``);
* a list of lists (rows of any lengths, lists / tuples / arrays) is a
  `SparseTensor`, what ``parse_example`` gives for a ``VarLenFeature``: each
  row holds its values, and every value counts, ``''`` and ``-1`` included,
  as in TF. Numeric columns read a rectangular list of lists as dense;
* a list of lists of lists (rows of frames, each frame a list of values, as
  `est.io.parse_sequence_example` gives a ``VarLenFeature`` feature list) is
  TF's 3-D SparseTensor ``[batch, frames, values]``: only the sequence
  columns take it (each frame one step).

`Builder` is TF's ``_LazyBuilder``: one per `input_layer` / `linear_model`
call, it converts each raw feature once and caches each column's transform
(a bucketized column used alone and in a cross is bucketized once).
"""
from __future__ import annotations

import unicodedata
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np
import torch

from distribute.host_arrays import to_numpy

from .._checks import is_host_feature
from ._memo import StringCodes, codes_of

STRING = str   # the dtype of string features and columns (TF: tf.string)

_INT_NAMES = {"int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
              "int64": torch.int64, "uint8": torch.uint8}
_FLOAT_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                "float32": torch.float32, "float64": torch.float64,
                "float": torch.float32, "double": torch.float64, "half": torch.float16}
_STRING_NAMES = {"string", "str", "bytes", "object"}


def as_dtype(dtype, what: str):
    """`dtype` as `STRING`, a torch integer dtype or a torch floating dtype.

    Accepts `str` / `bytes` / ``"string"``, Python `int` / `float`, names
    (``"int64"``, ``"float32"``), numpy dtypes and torch dtypes."""
    if dtype is None:
        return None
    if dtype in (str, bytes, np.str_, np.bytes_, np.object_):
        return STRING
    if dtype is int:
        return torch.int64
    if dtype is float:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype.is_floating_point or dtype in _INT_NAMES.values():
            return dtype
        raise ValueError(f"{what}: unsupported dtype {dtype}")
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None)
    if not isinstance(name, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise ValueError(f"{what}: unsupported dtype {dtype!r}") from None
    name = name.lower()
    if name in _STRING_NAMES or name.startswith(("str", "bytes", "<u", "|s")):
        return STRING
    if name in _INT_NAMES:
        return _INT_NAMES[name]
    if name in _FLOAT_NAMES:
        return _FLOAT_NAMES[name]
    raise ValueError(f"{what}: unsupported dtype {dtype!r}")


def is_integer(dtype) -> bool:
    return isinstance(dtype, torch.dtype) and not dtype.is_floating_point


def is_floating(dtype) -> bool:
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point


def dtype_name(dtype) -> str:
    return "string" if dtype is STRING else str(dtype).replace("torch.", "")


class Ids(NamedTuple):
    """A batch of id bags (TF: the rank-2 id SparseTensor and its weights).

    `values` and `rows` are int64 numpy arrays, row-major (rows ascending);
    `weights` float32 or None; `positions` (columns reading one raw feature)
    the index of each value in the feature's row-major values, which pairs
    it with its weight."""
    values: np.ndarray
    rows: np.ndarray
    batch: int
    weights: Optional[np.ndarray] = None
    positions: Optional[np.ndarray] = None


_ARANGE = np.arange(0, dtype=np.int64)


def arange(n: int) -> np.ndarray:
    """0, 1, ..., n - 1 (int64), a read-only view of one shared array (row
    numbers are asked for on every step)."""
    global _ARANGE
    if len(_ARANGE) < n:
        _ARANGE = np.arange(max(n, 2 * len(_ARANGE)), dtype=np.int64)
        _ARANGE.flags.writeable = False
    return _ARANGE[:n]


def is_arange(rows: np.ndarray, n: int) -> bool:
    """Whether `rows` is 0, 1, ..., n - 1 (at once for `arange`'s own views)."""
    if len(rows) != n:
        return False
    if rows.base is _ARANGE and n and rows[0] == 0 and rows.strides == (8,):
        return True
    return bool((rows == arange(n)).all())


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _kind_of_array(arr: np.ndarray, key: str) -> str:
    kind = arr.dtype.kind
    if kind in "iu":
        return "int"
    if kind == "f":
        return "float"
    if kind in "US":
        return "string"
    if kind == "b":
        return "bool"
    if kind == "O":
        flat = arr.ravel().tolist()
        if all(isinstance(v, (str, bytes)) for v in flat):
            return "string"
        if all(_is_int(v) for v in flat):
            return "int"
        if all(isinstance(v, (int, float, np.integer, np.floating)) and
               not isinstance(v, (bool, np.bool_)) for v in flat):
            return "float"
        is_missing = [v is None or (isinstance(v, float) and v != v) for v in flat]
        missing = [v for v, m in zip(flat, is_missing) if m]
        if missing and all(m or isinstance(v, (str, bytes)) for v, m in zip(flat, is_missing)):
            raise TypeError(f"Feature {key!r}: {len(missing)} missing value(s) among its "
                            f"strings ({missing[0]}: pandas gives NaN for an empty cell); "
                            f"fill them first, e.g. df[{key!r}].fillna('') (TF: 'Expected "
                            f"binary or unicode string, got {missing[0]}')")
        kinds = sorted({type(v).__name__ for v in flat})
        raise TypeError(f"Feature {key!r}: values of mixed or unsupported types "
                        f"({', '.join(kinds)})")
    raise TypeError(f"Feature {key!r}: unsupported dtype {arr.dtype}")


def _tensor_kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    return "float" if t.dtype.is_floating_point or t.dtype.is_complex else "int"


class Feature:
    """One raw feature of the batch: dense (a tensor / array) or sparse (rows)."""

    def __init__(self, key: str, value: Any):
        self.key = key
        self.sparse = False
        self.tensor: Optional[torch.Tensor] = None   # dense numbers
        self.array: Optional[np.ndarray] = None      # dense strings (or numbers from lists)
        if not isinstance(value, (torch.Tensor, np.ndarray)) and \
                type(value).__module__.startswith("pandas"):
            value = value.to_numpy()
        if isinstance(value, torch.Tensor):
            self.tensor = self._expand(value)
            self.kind = _tensor_kind(value)
        elif isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 1 \
                and value.size and isinstance(value[0], (list, tuple, np.ndarray)):
            self._set_rows(list(value))   # (a pandas column of lists: rows)
        elif isinstance(value, np.ndarray) or np.isscalar(value):
            arr = np.asarray(value)
            self.kind = _kind_of_array(arr, key)
            self._set_array(arr)
        elif isinstance(value, (list, tuple)):
            # (no value at all, an empty batch's: no rows, of any column's type)
            if not len(value) or any(isinstance(v, (list, tuple, np.ndarray, torch.Tensor))
                                     for v in value):
                self._set_rows(value)
            else:
                arr = np.asarray(value, dtype=object)
                self.kind = _kind_of_array(arr, key) if arr.size else "float"
                if self.kind == "string":
                    self._set_array(arr)
                else:
                    self._set_array(np.asarray(value))
        elif is_host_feature(value):   # (an export's stand-in)
            value.refuse()
        else:
            raise TypeError(f"Feature {key!r}: unsupported value of type "
                            f"{type(value).__name__} (give a tensor, a numpy array, a list "
                            "of values or a list of rows)")

    # -- construction ---------------------------------------------------------------
    def _expand(self, t):
        if t.dim() == 0:
            raise ValueError(f"Feature (key: {self.key}) cannot have rank 0. Given: {t!r}")
        return t.unsqueeze(-1) if t.dim() == 1 else t

    def _set_array(self, arr: np.ndarray) -> None:
        if arr.ndim == 0:
            raise ValueError(f"Feature (key: {self.key}) cannot have rank 0. Given: {arr!r}")
        if arr.ndim == 1:
            arr = arr[:, None]
        if self.kind == "string":
            self.array = arr
        elif self.kind in ("int", "float", "bool"):
            if arr.dtype == object:
                arr = arr.astype(np.int64 if self.kind == "int" else np.float64)
            self.tensor = torch.from_numpy(np.ascontiguousarray(arr))

    def _set_rows(self, rows) -> None:
        self.sparse = True
        rows = [row.detach().cpu().reshape(-1).tolist() if isinstance(row, torch.Tensor) else
                row.reshape(-1).tolist() if isinstance(row, np.ndarray) else
                row if isinstance(row, (list, tuple)) else [row] for row in rows]
        if any(len(row) and isinstance(row[0], (list, tuple, np.ndarray, torch.Tensor))
               for row in rows):
            rows = self._set_frames(rows)
        flat, lengths = [], []
        for row in rows:
            flat.extend(row)
            lengths.append(len(row))
        lengths = np.asarray(lengths, np.int64)
        self.rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        self.lengths = lengths
        values = np.asarray(flat, dtype=object)
        # rows without a value (a VarLenFeature no example of the batch has)
        # fit any column, as TF's empty SparseTensor of the spec's dtype
        self.kind = _kind_of_array(values, self.key) if values.size else "empty"
        if self.kind == "int":
            values = values.astype(np.int64)
        elif self.kind in ("float", "bool"):
            values = values.astype(np.float64)
        self.values = values

    steps: Optional[np.ndarray] = None    # rows of frames: each value's frame
    frame_counts: Optional[np.ndarray] = None   # ... and each row's number of frames

    def _set_frames(self, rows) -> list:
        """Rows of frames (TF's 3-D SparseTensor): each row's values in one
        list, each value's frame noted in `steps`."""
        flat_rows, steps, counts = [], [], []
        for i, row in enumerate(rows):
            values = []
            for j, frame in enumerate(row):
                if isinstance(frame, torch.Tensor):
                    frame = to_numpy(frame)
                if isinstance(frame, np.ndarray):
                    frame = frame.reshape(-1).tolist()
                elif not isinstance(frame, (list, tuple)):
                    raise ValueError(
                        f"Feature {self.key!r}: its rows mix frames (lists of values) and "
                        f"single values (row {i} holds {frame!r} at {j}); give each example "
                        "a list of values, or a list of frames each a list of values")
                values.extend(frame)
                steps.extend([j] * len(frame))
            flat_rows.append(values)
            counts.append(len(row))
        self.steps = np.asarray(steps, np.int64)
        self.frame_counts = np.asarray(counts, np.int64)
        return flat_rows

    def refuse_frames(self) -> None:
        """Only the sequence columns read rows of frames (TF: a 3-D SparseTensor
        in a non-sequence column fails when the layer reshapes it)."""
        if self.steps is not None:
            raise ValueError(
                f"Feature {self.key!r} holds rows of frames (a list of lists of values per "
                "example, TF's 3-D SparseTensor, as a VarLenFeature feature list parses), "
                "which only the sequence columns (sequence_numeric_column, "
                "sequence_categorical_column_with_*) read; give a non-sequence column one "
                "list of values per example")

    # -- views -------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        if self.sparse:
            return len(self.lengths)
        return int((self.tensor if self.tensor is not None else self.array).shape[0])

    def dense_tensor(self) -> torch.Tensor:
        """The numbers as a tensor of rank >= 2 (numeric columns)."""
        self.refuse_frames()
        if self.kind == "string":
            raise ValueError(f"Feature {self.key!r} holds strings; a numeric column needs "
                             "numbers")
        if self.sparse:
            if len(set(self.lengths.tolist())) > 1:
                raise ValueError(
                    f"The corresponding Tensor of numerical column must be a Tensor. "
                    f"SparseTensor is not supported. key: {self.key} (its rows have "
                    f"different lengths: {self.lengths.tolist()})")
            width = int(self.lengths[0]) if len(self.lengths) else 1
            values = self.values.astype(np.float64) if self.kind == "empty" else self.values
            return torch.from_numpy(values.reshape(len(self.lengths), width))
        return self.tensor

    def flat(self, drop_missing: bool, frames: bool = False
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, rows, positions) in row-major order, as numpy. A dense
        feature must have rank 2 (after expanding rank 1); with `drop_missing`
        its '' / -1 cells are dropped (a sparse feature keeps every value, as
        TF does); `positions` index the values kept among all of them. Rows
        of frames only with `frames` (a sequence column's)."""
        if not frames:
            self.refuse_frames()
        cache = self.__dict__.setdefault("_flats", {})   # (columns on one feature ask again)
        if drop_missing not in cache:
            cache[drop_missing] = self._flat(drop_missing)
        return cache[drop_missing]

    def codes(self, positions: np.ndarray) -> Tuple[Optional[np.ndarray], StringCodes]:
        """The codes (`_memo.StringCodes`) of a dense string feature's values at
        `positions` of `flat`, and its table; codes None when the table is full."""
        entry = self.__dict__.get("_codes")
        if entry is None:
            entry = self._codes = codes_of(self.key, self.array.reshape(-1))
        codes, table = entry
        if codes is not None and len(positions) != len(codes):
            codes = codes[positions]
        return codes, table

    def _flat(self, drop_missing: bool) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.sparse:
            return self.values, self.rows, np.arange(len(self.values), dtype=np.int64)
        if self.kind in ("float", "bool"):
            raise ValueError(f"Feature {self.key!r}: a categorical column needs string or "
                             f"integer values, got {self._dtype_text()}")
        if self.array is not None:
            arr = self.array
        else:
            arr = to_numpy(self.tensor)
        if arr.ndim != 2:
            raise ValueError(f"Feature {self.key!r}: a categorical column takes values of "
                             f"shape [batch] or [batch, n], got shape {list(arr.shape)}")
        if drop_missing:
            if self.kind == "string":
                keep = arr != "" if arr.dtype.kind == "U" else (
                    arr != b"" if arr.dtype.kind == "S" else (arr != "") & (arr != b""))
            else:
                keep = arr != -1
            if not keep.all():
                flat_keep = keep.reshape(-1)
                positions = np.flatnonzero(flat_keep).astype(np.int64)
                rows = positions // max(arr.shape[1], 1)
                return arr.reshape(-1)[flat_keep], rows, positions
        width = arr.shape[1]
        rows = arange(arr.shape[0]) if width == 1 else np.repeat(arange(arr.shape[0]), width)
        return arr.reshape(-1), rows, arange(arr.size)

    def weights(self) -> Tuple[np.ndarray, tuple, bool]:
        """Weights (float32, row-major) of a weighted column, their layout (the
        row lengths of a sparse feature, the shape of a dense one) and whether
        the feature is dense (TF then drops its 0.0 cells)."""
        self.refuse_frames()
        if self.kind == "string":
            raise ValueError(f"Feature {self.key!r}: weights must be numbers, got strings")
        if self.sparse:
            return self.values.astype(np.float32), ("rows", tuple(self.lengths.tolist())), False
        arr = to_numpy(self.tensor)
        if arr.ndim != 2:
            raise ValueError(f"Feature {self.key!r}: weights take shape [batch] or "
                             f"[batch, n], got shape {list(arr.shape)}")
        return arr.reshape(-1).astype(np.float32), ("shape", arr.shape), True

    def layout(self) -> tuple:
        """What `weights` must match: ("rows", lengths) or ("shape", shape)."""
        if self.sparse:
            return ("rows", tuple(self.lengths.tolist()))
        arr = self.array if self.array is not None else self.tensor
        return ("shape", tuple(arr.shape))

    def _dtype_text(self) -> str:
        if self.tensor is not None:
            return str(self.tensor.dtype).replace("torch.", "")
        return self.kind


class Builder:
    """TF's `_LazyBuilder`: raw features converted once, column transforms cached.

    The host-side work of the layers (strings to ids, id bags to lookup
    inputs) goes through `prepared`, which an export overrides: it records
    that work so a server can redo it, and traces the rest (torch only) with
    the results as the program's inputs. `general`: make lookup inputs of
    one form whatever the batch holds (an exported program has one)."""

    general = False

    def __init__(self, features):
        if not isinstance(features, dict):
            raise TypeError(f"features must be a dict of feature name -> values, got "
                            f"{type(features).__name__}")
        self.features = features
        self._raw: Dict[str, Feature] = {}
        self._cache: Dict[Any, Any] = {}
        # An export's: the features model_fn set or replaced ({key: value}) in the
        # dict it gave the layers, and whether host-side work is running.
        self.edited: Dict[str, Any] = {}
        self._on_host = False

    def prepared(self, record: tuple, make) -> Dict[str, torch.Tensor]:
        """`make()`: the tensors a layer computes on the host for `record`
        (("embedding" | "indicator" | "ids" | "sequence", column) or ("linear", columns,
        combiner)), once per builder."""
        def on_host():
            self._on_host = True
            try:
                return make()
            finally:
                self._on_host = False
        return self.get(record[1], on_host, ("prepared",) + record[:1] + record[2:])

    def raw(self, key: str) -> Feature:
        if key in self.edited:   # (an export: model_fn's own value, where torch computes it)
            if self._on_host:
                raise ValueError(
                    f"model_fn changed the feature {key!r} before a feature column read it on "
                    "the host (bucketizing for a cross or a linear model, a vocabulary, hash "
                    "or identity lookup, a weight): "
                    f"an export redoes that per request from {key!r} as the client sends it, "
                    "so the change would be lost and the export serve another model than "
                    "predict's. Make the change in the column (numeric_column(..., "
                    "normalizer_fn=a module-level function)), or in the serving receiver's "
                    "features (a module-level function of the receiver tensors)")
            return Feature(key, self.edited[key])
        feature = self._raw.get(key)
        if feature is None:
            if key not in self.features:
                raise ValueError(f"Feature {key!r} is not in features dictionary; the "
                                 f"features are {sorted(self.features, key=str)}"
                                 + _lookalike(key, self.features))
            feature = self._raw[key] = Feature(key, self.features[key])
        return feature

    def get(self, column, transform, tag=None):
        """`transform()` of `column` (`tag` naming which of its transforms),
        computed once per builder. Keyed by identity, the column kept alive
        beside the value (a column's hash would hash its whole vocabulary)."""
        key = (id(column), tag)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = (column, transform())
        return entry[1]

    def device(self) -> Optional[torch.device]:
        """The device of the features' tensors (where the strategy put the batch)."""
        for value in self.features.values():
            if isinstance(value, torch.Tensor):
                return value.device
        return None


def transformation_cache(features) -> Builder:
    """The `Builder` of `features`: itself when it is one, the one an export
    attached to its features, else a new one."""
    if isinstance(features, Builder):
        return features
    attached = getattr(features, "transformation_cache", None)
    if attached is None:
        return Builder(features)
    changed = getattr(features, "changed", None)   # (an export's features: model_fn's edits)
    if changed is not None:
        edited = changed()
        if _edits(edited) != _edits(attached.edited):   # (columns read before: again)
            attached._cache.clear()
        attached.edited = edited
    return attached


def _edits(edited: dict) -> set:
    return {(k, id(v), getattr(v, "_version", None)) for k, v in edited.items()}


def _lookalike(key, features) -> str:
    """What tells `key` from a feature that looks like it: a number where
    the column names a string (a DataFrame's columns 0, 1), or another
    Unicode normalization of the same text (NFD from a file, NFC typed)."""
    for name in features:
        if str(name) == str(key):
            return (f" ({name!r} is a {type(name).__name__}, the column's key "
                    f"{type(key).__name__}: rename the DataFrame's columns to strings)")
        if isinstance(name, str) and isinstance(key, str) and \
                unicodedata.normalize("NFC", name) == unicodedata.normalize("NFC", key):
            return (f" ({name!r} is the same text in another Unicode normalization: "
                    f"normalize the names, unicodedata.normalize('NFC', ...))")
    return ""
