"""Feature columns as JSON (TF2: ``tf.__internal__.feature_column.serialize_feature_column``
/ ``deserialize_feature_column``), what an export records of its feature
transform so that a server can redo it.

A column becomes ``{"class_name": ..., "config": {field: value}}``; nested
columns nest, dtypes are their names, tuples lists. A function field
(``normalizer_fn``) is kept as ``"module:qualname"`` when it can be imported
again, else as None; `deserialize_feature_column` imports it back. An
embedding's ``initializer`` is never kept (a served model's variables come
from its checkpoint).
"""
from __future__ import annotations

import importlib
from typing import Any

from . import _columns, _sequence
from ._inputs import STRING, as_dtype, dtype_name

_CLASSES = {cls.__name__: cls for cls in (
    _columns.NumericColumn, _columns.BucketizedColumn, _columns.HashedCategoricalColumn,
    _columns.VocabularyListCategoricalColumn, _columns.VocabularyFileCategoricalColumn,
    _columns.IdentityCategoricalColumn, _columns.WeightedCategoricalColumn,
    _columns.CrossedColumn, _columns.EmbeddingColumn, _columns.SharedEmbeddingColumn,
    _columns.IndicatorColumn, _sequence.SequenceNumericColumn,
    _sequence.SequenceCategoricalColumn)}
_DROPPED = {"initializer"}


def function_path(fn) -> Any:
    """"module:qualname" of a function that import finds again, else None."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in name:
        return None
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{name}" if found is fn else None


def import_function(path: str):
    """The function at "module:qualname"."""
    module, _, name = path.partition(":")
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def _encode(field: str, value, column, strict: bool):
    if isinstance(value, _columns.FeatureColumn):
        return serialize_feature_column(value, strict)
    if field in _DROPPED:
        return None
    if field == "dtype":
        return dtype_name(value)
    if callable(value):
        path = function_path(value)
        if path is None and strict:
            raise ValueError(f"column {column.name!r}: its {field} {value!r} cannot be "
                             "recorded (only a function importable by module path can): "
                             "give a module-level function")
        return None if path is None else {"function": path}
    if isinstance(value, (tuple, list)):
        return [_encode("", v, column, strict) for v in value]
    return value


def _decode(field: str, value):
    if isinstance(value, dict) and "class_name" in value:
        return deserialize_feature_column(value)
    if isinstance(value, dict) and "function" in value:
        return import_function(value["function"])
    if field == "dtype":
        return STRING if value == "string" else as_dtype(value, field)
    if isinstance(value, list):
        return tuple(_decode("", v) for v in value)
    return value


def serialize_feature_column(column, strict: bool = False) -> dict:
    """`column` as a JSON-able dict; `strict`: a function that cannot be kept
    is an error, not None."""
    cls = type(column)
    if _CLASSES.get(cls.__name__) is not cls:
        raise ValueError(f"cannot serialize {column!r}: not a feature column of "
                         "est.feature_column")
    return {"class_name": cls.__name__,
            "config": {f: _encode(f, getattr(column, f), column, strict)
                       for f in cls._fields}}


def deserialize_feature_column(config: dict):
    """The column `serialize_feature_column` gave `config` for."""
    cls = _CLASSES.get(config.get("class_name"))
    if cls is None:
        raise ValueError(f"unknown feature column class {config.get('class_name')!r}; known: "
                         f"{sorted(_CLASSES)}")
    return cls(**{f: _decode(f, v) for f, v in config["config"].items()})


__all__ = ["serialize_feature_column", "deserialize_feature_column"]
