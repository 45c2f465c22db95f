"""The host side of an export that takes strings or serialized tf.Examples
(TF: the parsing and string ops a SavedModel's graph holds before the model).

A torch program holds no strings, so such an export is two parts: the
program (numbers in, predictions out) and ``transform.json``, what runs
before it on each request: parsing the serialized Examples by the recorded
spec (`build_parsing_serving_input_receiver_fn`), then the feature columns'
host-side work (vocabulary lookups, hash buckets, crosses, id bags; see
`feature_column.recorded`), whose results are the program's inputs along
with the numeric features. Vocabulary files are copied into the export's
``assets/``. `HostTransform.program_inputs(inputs)` does it all; the export
loader and ``estimator serve`` call it, so a client sends what it sent to TF
Serving.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import os
import shutil
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from . import io as tf_io
from ._checks import is_host_feature
from .feature_column import recorded

TRANSFORM = "transform.json"
EXAMPLES = "examples"   # the receiver tensor of a parsing receiver (TF's name)


def is_host_value(value) -> bool:
    """Whether a feature value cannot enter a torch program: strings (numpy
    str / bytes / object arrays), or rows of values (lists); an export's
    stand-in for one (while it records model_fn)."""
    if is_host_feature(value):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "USO"
    return isinstance(value, (list, tuple))


def as_bytes(value) -> np.ndarray:
    """Host strings (a numpy str/object array, or a list) as an object array
    of bytes (utf-8), as TF's string tensors come out (b"a")."""
    if isinstance(value, np.ndarray):
        out = value.astype(object)   # (a copy: the caller's array is left as it was)
    else:
        out = np.empty(len(value), dtype=object)
        out[:] = list(value)
    flat = out.reshape(-1)   # (a view)
    for i, item in enumerate(flat):
        if isinstance(item, str):
            flat[i] = item.encode("utf-8")
    return out


# -- parsing specs as JSON ---------------------------------------------------------------
def _is_string(dtype) -> bool:
    return dtype in (str, bytes, "string", np.str_, np.bytes_, np.object_)


def _dtype_name(dtype) -> str:
    if _is_string(dtype):
        return "string"
    if isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    return np.dtype(dtype).name


def _spec_to_json(spec) -> dict:
    out = {"type": type(spec).__name__, "dtype": _dtype_name(spec.dtype)}
    for field in ("shape", "default_value", "allow_missing"):
        if hasattr(spec, field):
            value = getattr(spec, field)
            if isinstance(value, bytes):
                value = value.decode("utf-8")
            out[field] = list(value) if isinstance(value, tuple) else value
    return out


def _spec_from_json(config: dict):
    kw = {k: v for k, v in config.items() if k != "type"}
    kw["dtype"] = str if kw["dtype"] == "string" else getattr(torch, kw["dtype"])
    if "shape" in kw:
        kw["shape"] = tuple(kw["shape"])
    if isinstance(kw.get("default_value"), list):
        kw["default_value"] = tuple(kw["default_value"])
    return getattr(tf_io, config["type"])(**kw)


def example_of(values: Dict[str, Any], spec: Dict[str, Any]) -> bytes:
    """A serialized tf.Example of `values` ({feature: value or list of values}),
    each typed by its parsing spec (features the spec lacks are left out, as
    parsing would ignore them). What TF Serving makes of a JSON example."""
    example = tf_io.Example()
    for key, value in values.items():
        if key not in spec:
            continue
        kind = _dtype_name(spec[key].dtype)
        items = value if isinstance(value, (list, tuple)) else [value]
        feature = example.features.feature[key]
        try:
            if kind == "string":
                feature.bytes_list.value.extend(_text(v) for v in items)
            elif kind.startswith(("float", "bfloat", "half", "double")):
                feature.float_list.value.extend(_number(v) for v in items)
            else:
                feature.int64_list.value.extend(_integer(v) for v in items)
        except (TypeError, ValueError) as e:
            raise ValueError(f"feature {key!r}: {value!r} is not a {kind} value ({e})"
                             ) from None
    return example.SerializeToString()


def b64_bytes(value) -> bytes:
    """The bytes of TF Serving's JSON for binary strings, ``{"b64": "<base64>"}``;
    ValueError naming what is wrong with another object or bad base64."""
    if set(value) != {"b64"} or not isinstance(value["b64"], str):
        raise ValueError('an object must be {"b64": "<base64>"}')
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"bad base64 ({e})") from None


def _text(value) -> bytes:
    """A string feature's value: str or bytes, never a number made text (as
    TF Serving, whose JSON number makes an int64 or float feature that the
    string spec then refuses: 12.0 would be "12.0", 2134 not "02134")."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, dict):
        return b64_bytes(value)   # (TF Serving's bytes)
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}; send it as a JSON "
                        'string, as it was in training, or bytes as {"b64": "<base64>"}')
    return value.encode("utf-8")


def _number(value) -> float:
    """A float feature's value: a JSON number, never a bool or a string (TF
    Serving makes those features of another kind, which the spec refuses),
    nor one float32 would lose (`lossy_float`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("expected a number")
    lossy = lossy_float(value, "float32")
    if lossy is not None:
        raise ValueError(lossy)
    return float(value)


def _integer(value) -> int:
    """An int64 feature's value: an integer (2.0 too) in int64's range, never
    a truncated 2.7, a bool or a string (TF Serving rejects them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise ValueError("expected an integer")
    if not -2 ** 63 <= int(value) < 2 ** 63:
        raise ValueError("out of the range of int64")
    return int(value)


_MANTISSA_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def lossy_float(value, dtype: str) -> Optional[str]:
    """TF Serving's words where a JSON number (int or float) cannot be a
    `dtype` value without loss (its IsLosslessDecimal), else None: NaN and
    infinities pass, an integer must be below 2**mantissa bits (2**24 for
    float32), a decimal within the type's range (1e39 was inf for float32)."""
    if isinstance(value, float):
        limit = float(torch.finfo(getattr(torch, dtype)).max)
        if not math.isfinite(value) or -limit <= value <= limit:
            return None
    elif abs(value) < 2 ** _MANTISSA_BITS[dtype]:
        return None
    elif abs(value) >= 2 ** 64:   # (JSON's parser reads such an integer as a double)
        try:
            return lossy_float(float(value), dtype)
        except OverflowError:
            pass
    return f"Cannot convert JSON value: {value!r} to {dtype} without loss of precision"


def template_examples(spec: Dict[str, Any], batch: int, var_len: int = 2) -> np.ndarray:
    """`batch` serialized Examples with a value for each feature of `spec`
    (`var_len` for a VarLenFeature), to trace an export with."""
    rows = []
    for i in range(batch):
        values = {}
        for key, s in spec.items():
            kind = _dtype_name(s.dtype)
            value = (f"{key}_{i}" if kind == "string" else
                     0.5 + i if kind.startswith(("float", "bfloat", "half", "double")) else i)
            size = int(np.prod(s.shape)) if hasattr(s, "shape") else var_len
            values[key] = [value] * max(size, 1)
        rows.append(example_of(values, spec))
    return np.array(rows, dtype=object)


# -- the transform -----------------------------------------------------------------------------
def _vocabulary_files(config, found: list):
    """The vocabulary_file fields in serialized columns (dicts), in place."""
    if isinstance(config, dict):
        if config.get("class_name") == "VocabularyFileCategoricalColumn":
            found.append(config["config"])
        for value in config.values():
            _vocabulary_files(value, found)
    elif isinstance(config, list):
        for value in config:
            _vocabulary_files(value, found)
    return found


class HostTransform:
    """What runs before an export's program: parse (optional), then the
    recorded feature-column work. `numeric` names the features the program
    takes as they are (with their dtypes), under their names or, where a
    name is not a Python identifier (`marital-status`), `program_names`';
    `records` the feature-column work (JSON) whose tensors follow them as
    inputs ``t<i>_<key>``."""

    def __init__(self, parse_spec: Optional[dict], numeric: Dict[str, str], records: list,
                 record_keys: List[List[str]], features_fn: Optional[str] = None,
                 program_names: Optional[Dict[str, str]] = None):
        self.parse_spec = parse_spec
        self.numeric = numeric
        self.program_names = program_names or {}
        self.records = records
        self.record_keys = record_keys
        # "module:qualname" of the receiver's `features(receiver_tensors)`, run per request
        self.features_fn = features_fn
        try:
            self._decoded = [recorded.from_json(r) for r in records]
            self._features_fn = None if features_fn is None else recorded.import_function(
                features_fn)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"a function the export's feature transform calls cannot be "
                             f"imported ({type(e).__name__}: {e}): its module must be on "
                             "this program's sys.path (PYTHONPATH), as where it was "
                             "exported") from None

    @staticmethod
    def input_name(index: int, key: str) -> str:
        return f"t{index}_{key}"

    def features(self, inputs: Dict[str, Any]) -> Dict[str, Any]:
        """The features model_fn saw: `inputs` parsed (a parsing export takes
        {"examples": serialized Examples}) or as they are."""
        if self.parse_spec is None:
            if self._features_fn is None:
                return dict(inputs)
            inputs = {k: torch.from_numpy(v) if isinstance(v, np.ndarray)   # (as at export)
                      and v.dtype.kind in "biuf" else v for k, v in inputs.items()}
            with torch.no_grad():   # (the receiver's features, computed as at export)
                features = self._features_fn(inputs)
            if not isinstance(features, dict):
                raise ValueError(f"the receiver's features function {self.features_fn} gave "
                                 f"{type(features).__name__}, not a dict of features")
            return features
        if set(inputs) != {EXAMPLES}:
            raise ValueError(f"this export parses serialized tf.Examples: give "
                             f"{{{EXAMPLES!r}: [...]}}, not {sorted(inputs)}")
        return tf_io.parse_example(list(inputs[EXAMPLES]), self.parse_spec)

    def program_inputs(self, inputs: Dict[str, Any],
                       features: Optional[Dict[str, Any]] = None) -> Dict[str, torch.Tensor]:
        """The program's inputs for a request's inputs (whose `features`,
        when given, are those already made of them)."""
        if features is None:
            features = self.features(inputs)
        out = {}
        for name, dtype in self.numeric.items():
            if name not in features:
                raise ValueError(f"missing feature {name!r}")
            out[self.program_names.get(name, name)] = torch.as_tensor(
                np.asarray(features[name]) if not isinstance(
                features[name], torch.Tensor) else features[name],
                dtype=getattr(torch, dtype))
        builder = recorded.general_builder(features)
        for i, record in enumerate(self._decoded):
            for key, tensor in recorded.redo(builder, record).items():
                if tensor is not None:
                    out[self.input_name(i, key)] = tensor
        return out

    # -- files -------------------------------------------------------------------------
    def fix_steps(self, index: int, steps: int) -> None:
        """Record `index` (a sequence column's) makes `steps` steps, padding
        shorter sequences: the traced model fixed them."""
        self.records[index] = {**self.records[index], "steps": steps}
        self._decoded[index] = recorded.from_json(self.records[index])

    def save(self, export_dir: str) -> None:
        """Write ``transform.json``, vocabulary files copied into ``assets/``."""
        records = json.loads(json.dumps(self.records))
        copied: Dict[str, str] = {}
        for config in _vocabulary_files(records, []):
            source = config["vocabulary_file"]
            if source not in copied:
                copied[source] = os.path.join(
                    "assets", f"{len(copied)}_{os.path.basename(source)}")
                os.makedirs(os.path.join(export_dir, "assets"), exist_ok=True)
                shutil.copyfile(source, os.path.join(export_dir, copied[source]))
            config["vocabulary_file"] = copied[source]
        spec = None if self.parse_spec is None else {
            k: _spec_to_json(v) for k, v in self.parse_spec.items()}
        with open(os.path.join(export_dir, TRANSFORM), "w") as f:
            json.dump({"parse_spec": spec, "numeric": self.numeric, "records": records,
                       "record_keys": self.record_keys, "features_fn": self.features_fn,
                       **({"program_names": self.program_names} if self.program_names
                          else {})}, f, indent=1)

    @classmethod
    def load(cls, export_dir: str) -> Optional["HostTransform"]:
        """The export's transform, None when it has none (a numeric export)."""
        path = os.path.join(export_dir, TRANSFORM)
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            data = json.load(f)
        for config in _vocabulary_files(data["records"], []):
            config["vocabulary_file"] = os.path.join(export_dir, config["vocabulary_file"])
        spec = None if data["parse_spec"] is None else {
            k: _spec_from_json(v) for k, v in data["parse_spec"].items()}
        return cls(spec, data["numeric"], data["records"], data["record_keys"],
                   data.get("features_fn"), data.get("program_names"))
