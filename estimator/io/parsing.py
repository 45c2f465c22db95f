"""Parsing tf.Example records (TF: ``tf.io.parse_example``,
``parse_single_example`` and the feature specs ``FixedLenFeature``,
``VarLenFeature``, ``FixedLenSequenceFeature``).

``tf.SequenceExample`` records (``tf.io.parse_sequence_example``,
``parse_single_sequence_example``) hold context features, parsed as an
Example's, and feature lists, one Feature a frame (a time step).

Results are what the feature columns and the input pipeline take: a
`FixedLenFeature` gives a numpy array ``[batch] + shape`` (float32, int64,
or an object array of bytes for strings, as TF's string tensors read back);
a `VarLenFeature` gives one list of values per example (TF's SparseTensor,
the "list of lists" form of the feature columns); a `FixedLenSequenceFeature`
gives ``[batch, longest] + shape``, padded with its default value. dtypes are
``str`` (or ``bytes``) for strings, torch or numpy dtypes (or their names) for
numbers: float32 reads a ``float_list``, int64 an ``int64_list``, strings a
``bytes_list``, as in TF. Errors name the key and the example, as TF's do.
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from ._example_pb import Example, SequenceExample

_KINDS = {"float": "float_list", "int": "int64_list", "string": "bytes_list"}
_NUMPY = {"float": np.float32, "int": np.int64, "string": object}
_NAMES = {"float": "float", "int": "int64", "string": "string"}


class FixedLenFeature(NamedTuple):
    """A fixed-shape feature (TF: ``tf.io.FixedLenFeature(shape, dtype, default_value)``)."""
    shape: Tuple[int, ...]
    dtype: object
    default_value: Optional[Any] = None


class VarLenFeature(NamedTuple):
    """A variable-length feature (TF: ``tf.io.VarLenFeature(dtype)``)."""
    dtype: object


class FixedLenSequenceFeature(NamedTuple):
    """Any number of values of `shape` per example, padded to the longest
    (TF: ``tf.io.FixedLenSequenceFeature(shape, dtype, allow_missing, default_value)``)."""
    shape: Tuple[int, ...]
    dtype: object
    allow_missing: bool = False
    default_value: Optional[Any] = None


def _kind(dtype, key: str) -> str:
    """"float", "int" or "string": what a tf.Example holds. As TF's parsing,
    float32 (Python's float too) and int64 (Python's int too) only: another
    width was parsed into these silently (float64 read as float32)."""
    if dtype in (str, bytes, np.str_, np.bytes_, np.object_) or dtype in ("string", "str"):
        return "string"
    named = dtype if isinstance(dtype, str) else None   # (TF's "float" is float32, numpy's 64)
    if dtype is float or named == "float":
        return "float"
    if dtype is int or named == "int":
        return "int"
    if isinstance(dtype, torch.dtype):
        kind = {torch.float32: "float", torch.int64: "int"}.get(dtype)
    else:
        try:
            kind = {np.dtype(np.float32): "float", np.dtype(np.int64): "int"}.get(
                np.dtype(dtype))
        except TypeError:
            kind = None
    if kind is None:
        raise ValueError(f"Key: {key}: unsupported dtype {dtype!r}; a tf.Example holds "
                         "float32, int64 and string values, and TF's parse_example takes "
                         "only those (cast the parsed feature)")
    return kind


def _values(feature, kind: str, key: str, index: int) -> Optional[list]:
    """The feature's values; None for a Feature holding no list at all, which
    TF takes as missing (a default applies), unlike an empty list."""
    present = feature.WhichOneof("kind")
    if present is None:
        return None
    if present != _KINDS[kind]:
        have = {"float_list": "float", "int64_list": "int64", "bytes_list": "string"}[present]
        raise ValueError(f"Name: example {index}, Key: {key}, Index: 0. Data types don't "
                         f"match. Data type: {have} but expected type: {_NAMES[kind]}")
    return list(getattr(feature, present).value)


def _size(shape) -> int:
    return int(np.prod(shape)) if len(shape) else 1


def parse_example(serialized, features: Dict[str, Any]) -> Dict[str, Any]:
    """Parse a batch of serialized ``tf.Example``s (bytes) by `features`
    ({key: FixedLenFeature / VarLenFeature / FixedLenSequenceFeature}, e.g.
    ``est.feature_column.make_parse_example_spec(columns)``)."""
    if isinstance(serialized, (bytes, str)):
        raise ValueError("parse_example takes a batch (a list of serialized Examples); use "
                         "parse_single_example for one")
    specs = [(key, spec, _kind(spec.dtype, key)) for key, spec in features.items()]
    maps = [example.features.feature for example in _decode(serialized, Example)]
    return {key: _parse_key(maps, key, spec, kind) for key, spec, kind in specs}


def _decode(serialized, message) -> list:
    """The records of a batch as `message`s (Example or SequenceExample)."""
    decoded = []
    for index, record in enumerate(serialized):
        if isinstance(record, str):
            record = record.encode("latin-1")
        try:
            decoded.append(message.FromString(bytes(record)))
        except Exception as e:   # DecodeError, and anything protobuf raises on junk
            raise ValueError(f"Could not parse example input, value: example {index} is not "
                             f"a serialized tf.{message.__name__} ({type(e).__name__}: "
                             f"{e})") from None
    return decoded


def parse_single_example(serialized, features: Dict[str, Any]) -> Dict[str, Any]:
    """One serialized ``tf.Example``: as `parse_example`, without the batch
    dimension (a VarLenFeature gives its list of values)."""
    parsed = parse_example([serialized], features)
    return {key: value[0] for key, value in parsed.items()}


def _parse_key(examples: Sequence, key: str, spec, kind: str):
    rows = [_values(ex[key], kind, key, i) if key in ex else None
            for i, ex in enumerate(examples)]
    if isinstance(spec, VarLenFeature):
        return [row or [] for row in rows]
    if isinstance(spec, FixedLenFeature):
        return _fixed(rows, key, spec, kind)
    if isinstance(spec, FixedLenSequenceFeature):
        return _sequence(rows, key, spec, kind)
    raise ValueError(f"Key: {key}: unsupported feature spec {spec!r}; use FixedLenFeature, "
                     "VarLenFeature or FixedLenSequenceFeature")


def _fixed(rows, key, spec: FixedLenFeature, kind: str) -> np.ndarray:
    shape = tuple(spec.shape)
    size = _size(shape)
    default = None if spec.default_value is None else _default(spec.default_value, kind, key,
                                                               shape)
    out = []
    for i, row in enumerate(rows):
        if row is None:   # missing (a feature present with no values is TF's size error)
            if default is None:
                raise ValueError(f"Name: example {i}, Feature: {key} (data type: "
                                 f"{_NAMES[kind]}) is required but could not be found.")
            row = default
        if len(row) != size:
            raise ValueError(f"Name: example {i}, Key: {key}, Index: 0. Number of "
                             f"{_NAMES[kind]} values != expected. Values size: {len(row)} "
                             f"but output shape: {list(shape)}")
        out.append(row)
    array = np.array(out, dtype=_NUMPY[kind]) if out else np.zeros((0, size), _NUMPY[kind])
    return array.reshape((len(rows),) + shape)


def _default(value, kind: str, key: str, shape: tuple) -> list:
    """A FixedLenFeature's default_value as TF takes it: of the feature's
    type (strings as bytes) and reshaped to `shape` (as many values)."""
    array = np.asarray(_as_bytes(value) if kind == "string" else value,
                       dtype=object if kind == "string" else None)
    if kind == "int" and array.dtype.kind not in "iub":
        raise ValueError(f"Key: {key}: default_value {value!r} is not an int64 (TF: cannot "
                         "convert it to an int64 tensor)")
    if array.size != _size(shape):
        raise ValueError(f"Key: {key}: default_value {value!r} has {array.size} value(s); "
                         f"shape {list(shape)} takes {_size(shape)} (TF reshapes the default "
                         "to the shape)")
    return array.astype(_NUMPY[kind]).reshape(-1).tolist()


def _as_bytes(value):
    """str (in nested lists too) as utf-8 bytes, as TF's string tensors hold them."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_as_bytes(v) for v in value]
    return value


def _sequence(rows, key, spec: FixedLenSequenceFeature, kind: str) -> np.ndarray:
    shape = tuple(spec.shape)
    size = _size(shape)
    pad = spec.default_value if spec.default_value is not None else (
        b"" if kind == "string" else 0)
    if kind == "string":
        pad = _as_bytes(pad)
    if not spec.allow_missing:   # (TF's words: its parse_example refuses the spec)
        raise ValueError(f"Unsupported: FixedLenSequenceFeature requires allow_missing to be "
                         f"True (key {key!r})")
    lengths = []
    for i, row in enumerate(rows):
        row = row or []
        if len(row) % size:
            raise ValueError(f"Name: example {i}, Key: {key}, Index: 0. Number of "
                             f"{_NAMES[kind]} values is not a multiple of the element "
                             f"size {size} (shape {list(shape)}); got {len(row)}")
        lengths.append(len(row) // size)
    longest = max(lengths, default=0)
    out = np.full((len(rows), longest * size), pad, dtype=_NUMPY[kind])
    for i, row in enumerate(rows):
        if row:
            out[i, :len(row)] = row
    return out.reshape((len(rows), longest) + shape)


def parse_sequence_example(serialized, context_features: Optional[Dict[str, Any]] = None,
                           sequence_features: Optional[Dict[str, Any]] = None):
    """Parse a batch of serialized ``tf.SequenceExample``s (TF:
    ``tf.io.parse_sequence_example``): returns ``(context, feature_lists,
    lengths)``. `context_features` ({key: FixedLenFeature / VarLenFeature})
    parse the context as `parse_example` parses an Example.
    `sequence_features` ({key: FixedLenSequenceFeature / VarLenFeature})
    parse the feature lists: a FixedLenSequenceFeature gives
    ``[batch, longest] + shape``, padded with zeros (b"" for strings), and its
    frames per example in `lengths` (int64 ``[batch]``); a VarLenFeature gives
    per example a list of frames, each a list of values (TF's SparseTensor
    ``[batch, frames, values]``). As TF's, a feature list missing from an
    example is an error unless ``allow_missing=True`` (a present list may
    have no frames), a frame holds ``prod(shape)`` values, and a
    FixedLenSequenceFeature takes no `default_value`."""
    if isinstance(serialized, (bytes, str)):
        raise ValueError("parse_sequence_example takes a batch (a list of serialized "
                         "SequenceExamples); use parse_single_sequence_example for one")
    if not context_features and not sequence_features:   # (TF's words)
        raise ValueError("Both `context_features` and `sequence_features` argument are None, "
                         "but at least one should have values.")
    context_specs = _specs(context_features, (FixedLenFeature, VarLenFeature))
    sequence_specs = _specs(sequence_features, (FixedLenSequenceFeature, VarLenFeature))
    records = _decode(serialized, SequenceExample)
    maps = [record.context.feature for record in records]
    context = {key: _parse_key(maps, key, spec, kind) for key, spec, kind in context_specs}
    lists = [record.feature_lists.feature_list for record in records]
    feature_lists, lengths = {}, {}
    for key, spec, kind in sequence_specs:
        rows = [_frames(fl[key].feature, kind, key, i) if key in fl else None
                for i, fl in enumerate(lists)]
        if isinstance(spec, VarLenFeature):
            feature_lists[key] = [row or [] for row in rows]
        else:
            feature_lists[key], lengths[key] = _frames_dense(rows, key, spec, kind)
    return context, feature_lists, lengths


def parse_single_sequence_example(serialized, context_features: Optional[Dict[str, Any]] = None,
                                  sequence_features: Optional[Dict[str, Any]] = None):
    """One serialized ``tf.SequenceExample`` (TF:
    ``tf.io.parse_single_sequence_example``): ``(context, feature_lists)``
    as `parse_sequence_example`'s, without the batch dimension (a
    FixedLenSequenceFeature gives ``[frames] + shape``, a sequence
    VarLenFeature its list of frames)."""
    context, feature_lists, _ = parse_sequence_example(
        [serialized], context_features, sequence_features)
    return ({key: value[0] for key, value in context.items()},
            {key: value[0] for key, value in feature_lists.items()})


def _specs(features: Optional[Dict[str, Any]], allowed: tuple) -> list:
    """(key, spec, kind) of each spec, refusing those TF refuses there."""
    specs = []
    for key, spec in (features or {}).items():
        if not isinstance(spec, allowed):
            raise ValueError(f"Unsupported {type(spec).__name__} {spec!r} for key {key!r}: "
                             f"{' or '.join(t.__name__ for t in allowed)} here, as TF's")
        specs.append((key, spec, _kind(spec.dtype, key)))
    return specs


def _frames(frames, kind: str, key: str, index: int) -> list:
    """A feature list's frames, each a list of values (a frame holding no
    list at all: no values, as TF reads it)."""
    out = []
    for j, frame in enumerate(frames):
        present = frame.WhichOneof("kind")
        if present not in (None, _KINDS[kind]):
            raise ValueError(f"Name: example {index}, Feature list: {key}, Index: {j}. Data "
                             f"types don't match. Expected type: {_NAMES[kind]}")
        out.append(list(getattr(frame, present).value) if present else [])
    return out


def _frames_dense(rows, key: str, spec: FixedLenSequenceFeature, kind: str):
    shape = tuple(spec.shape)
    size = _size(shape)
    if spec.default_value is not None:   # (TF's words)
        raise ValueError(f"Value feature_list.dense_defaults[{key}] must be None: a "
                         "FixedLenSequenceFeature of a feature list takes no default_value "
                         "(its padding is zeros, as TF's)")
    lengths = []
    for i, frames in enumerate(rows):
        if frames is None:
            if not spec.allow_missing:
                raise ValueError(f"Name: example {i}, Feature list '{key}' is required but "
                                 "could not be found (give its FixedLenSequenceFeature "
                                 "allow_missing=True for no frames)")
            frames = []
        total = sum(len(frame) for frame in frames)
        if size and total % size:
            raise ValueError(f"Name: example {i}, Feature list '{key}' has an unexpected "
                             f"number of values. Total values size: {total} is not "
                             f"consistent with output shape: {['?'] + list(shape)}")
        for j, frame in enumerate(frames):
            if len(frame) != size:
                raise ValueError(f"Name: example {i}, Key: {key}, Index: {j}. Number of values "
                                 f"!= expected. values size: {len(frame)} but output shape: "
                                 f"{list(shape)}")
        lengths.append(len(frames))
    longest = max(lengths, default=0)
    out = np.full((len(rows), longest * size), b"" if kind == "string" else 0,
                  dtype=_NUMPY[kind])
    for i, frames in enumerate(rows):
        values = [value for frame in frames or [] for value in frame]
        out[i, :len(values)] = values
    return out.reshape((len(rows), longest) + shape), np.array(lengths, dtype=np.int64)
