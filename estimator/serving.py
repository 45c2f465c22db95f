"""TF Serving's REST API over an export (`estimator serve`), so a TF Serving
client works unchanged.

    GET  /v1/models/NAME                      version status
    GET  /v1/models/NAME/metadata             the signatures (TF's TensorInfo JSON)
    POST /v1/models/NAME[/versions/V]:predict {"signature_name": ..., "instances": [...]}
                                              or {"inputs": {...}}
    POST /v1/models/NAME:classify / :regress  {"signature_name": ..., "examples": [{...}]}

`instances` are rows: a dict {input: value} per example (or a plain value
when the export has one input), answered by ``{"predictions": [...]}`` (a
dict per example when the signature has several outputs); `inputs` are
columns, answered by ``{"outputs": ...}``. `examples` are feature dicts,
matched to the export's inputs by name; `:classify` answers
``{"results": [[[class, score], ...], ...]}`` (the class names the export
recorded, or its classes as strings; "" where it has neither, as TF Serving)
and `:regress` ``{"results": [value, ...]}`` (the key TF Serving's server
writes; a section of its REST docs says "result"); `:predict` answers the
`classes` an export names with those names too, as TF Serving gives TF's
string classes. A bad request gets a 400 with ``{"error": "..."}`` naming
the field; an unknown model or version a 404. JSON numbers are taken by TF
Serving's rules (json_tensor.cc): a float input takes NaN and infinities but
no number it would lose (an integer past 2**24 - 1 or a decimal past
float32's range for float32), an integer input integers in its range, a bool
input true or false.

Given a base directory of timestamped exports, the newest version is
served. Inputs are what the export's receiver took: numbers; strings (a raw
receiver with string features); or, for a parsing receiver, serialized
tf.Examples as ``{"b64": ...}`` at ``:predict``, while ``:classify`` and
``:regress`` take JSON examples, each made a tf.Example and parsed by the
recorded spec, as TF Serving does. An export with strings runs its
``transform.json`` before the program (`host_transform`).

The server is the standard library's ``ThreadingHTTPServer``: one thread
per connection (HTTP/1.1: connections are kept alive, bodies may be
chunked), no dependency, requests answered concurrently (the program runs
under ``torch.inference_mode``); it binds 127.0.0.1 unless told otherwise.
A request body is at most 64 MiB (413 beyond). Under a base directory a
version exported later is served once it loads (looked for every second,
TF Serving's ``--file_system_poll_wait_seconds``; the version before is then
a 404, as TF Serving's latest-version policy); no version labels are
assigned.
"""
from __future__ import annotations

import base64
import glob
import json
import logging
import os
import re
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from distribute.host_arrays import to_numpy

from . import export, host_transform

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
           "int32": torch.int32, "bool": torch.bool, "float16": torch.float16,
           "bfloat16": torch.bfloat16, "uint8": torch.uint8, "int8": torch.int8,
           "int16": torch.int16}
_MAX_BODY = 64 << 20


class RequestError(ValueError):
    """A request the model cannot answer; `status` is the HTTP status."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


def _version_dir(path: str) -> Tuple[str, str]:
    """(export dir, version) of an export dir or of the newest export under a base."""
    if os.path.isfile(os.path.join(path, export.SIGNATURE)):
        name = os.path.basename(os.path.normpath(path))
        return path, name if _ascii_digits(name) else "1"
    names = os.listdir(path) if os.path.isdir(path) else []
    versions = sorted((int(d), d) for d in names if _ascii_digits(d) and os.path.isfile(
        os.path.join(path, d, export.SIGNATURE)))
    if not versions:
        if not os.path.exists(path):
            raise ValueError(f"{path}: no such directory (an export directory, or a base of "
                             "timestamped exports)")
        below = sorted(os.path.relpath(os.path.dirname(os.path.dirname(p)), path)
                       for p in glob.glob(os.path.join(glob.escape(path), "export", "*", "*",
                                                       export.SIGNATURE)))
        hint = f"; exports under it: {', '.join(sorted(set(below)))}" if below else ""
        raise ValueError(f"{path}: neither an export (no {export.SIGNATURE}) nor a directory "
                         f"of timestamped exports{hint}")
    return os.path.join(path, versions[-1][1]), versions[-1][1]


def _ascii_digits(name: str) -> bool:
    return name.isascii() and name.isdigit()


class Model:
    """One loaded export and what its signatures need and give."""

    def __init__(self, path: str, name: str = "default"):
        self.dir, self.version = _version_dir(path)
        self.name = name
        self.loaded = export.load(self.dir)
        self.transform = self.loaded.transform
        signature = self.loaded.signature
        self.inputs = {i["name"]: i for i in signature["inputs"]}
        described = signature.get("signatures") or {
            export.DEFAULT_SERVING_SIGNATURE_DEF_KEY: {"outputs": signature["outputs"]}}
        try:
            self.signatures = {name: {"method_name": s.get(
                                          "method_name", "tensorflow/serving/predict"),
                                      "outputs": _with_named(s),
                                      "class_names": s.get("class_names"),
                                      "named_outputs": s.get("named_outputs", {})}
                               for name, s in described.items()}
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{os.path.join(self.dir, export.SIGNATURE)}: its signatures "
                             f"are not an export's ({type(e).__name__}: {e}); export the "
                             "model again") from None

    # -- answers -------------------------------------------------------------------
    def status(self) -> dict:
        return {"model_version_status": [{"version": self.version, "state": "AVAILABLE",
                                          "status": {"error_code": "OK",
                                                     "error_message": ""}}]}

    def metadata(self) -> dict:
        """TF Serving's GetModelMetadataResponse as JSON: each signature's
        inputs and outputs as TensorInfo (dtype, shape, name)."""
        return {"model_spec": {"name": self.name, "signature_name": "",
                               "version": self.version},
                "metadata": {"signature_def": {"signature_def": {
                    name: {"inputs": {n: _tensor_info(i)
                                      for n, i in self._inputs_of(name).items()},
                           "outputs": {o["name"]: _tensor_info(o) for o in s["outputs"]},
                           "method_name": s["method_name"]}
                    for name, s in self.signatures.items()}}}}

    def predict(self, body: dict) -> dict:
        name = self._signature(body)
        if ("instances" in body) == ("inputs" in body):
            raise RequestError("the request must have exactly one of 'instances' (rows) or "
                               "'inputs' (columns)")
        inputs = self._inputs_of(name)
        if "instances" in body:
            outputs = self._run(name, self._rows(body["instances"], "instances", inputs))
            return {"predictions": _rows_of(outputs, len(body["instances"]))}
        outputs = self._run(name, self._columns(body["inputs"], inputs))
        if len(outputs) == 1:
            return {"outputs": next(iter(outputs.values())).tolist()}
        return {"outputs": {k: v.tolist() for k, v in outputs.items()}}

    def classify(self, body: dict) -> dict:
        name = self._signature(body, "tensorflow/serving/classify")
        outputs = self._run(name, self._examples(body))
        scores, classes = outputs.get("scores"), outputs.get("classes")
        if scores is None:
            raise RequestError(f"signature {name!r} has no 'scores' to classify with")
        if scores.ndim != 2:   # (TF Serving's classifier: a score per class per example)
            raise RequestError(f"Expected Tensor shape: [batch_size num_classes] but got "
                               f"{list(scores.shape)} (scores at every step of a sequence: "
                               ":predict answers with them)")
        if classes is not None:
            labels = classes.reshape(len(classes), -1)
        elif self.signatures[name]["class_names"]:   # each score labelled with its name
            labels = _named(self.signatures[name]["class_names"],
                            np.tile(np.arange(scores.shape[1]), (len(scores), 1)))
        else:   # (TF Serving's: a score without a class has the label "")
            labels = np.full(scores.shape, "", dtype=object)
        return {"results": [[[str(c), float(s)] for c, s in zip(row_c, row_s)]
                            for row_c, row_s in zip(labels.tolist(), scores.tolist())]}

    def regress(self, body: dict) -> dict:
        name = self._signature(body, "tensorflow/serving/regress")
        outputs = self._run(name, self._examples(body))
        if "outputs" not in outputs:
            raise RequestError(f"signature {name!r} has no regression 'outputs'")
        values = outputs["outputs"]
        if values.ndim not in (1, 2) or values.ndim == 2 and values.shape[1] != 1:
            # (TF Serving's regressor: a value per example; label_dimension > 1 is
            # for :predict, whose "predictions" keep each example's values)
            raise RequestError(f"Expected output Tensor shape to be either [batch_size] or "
                               f"[batch_size, 1] but got {list(values.shape)}; :predict "
                               "answers with every value of each example")
        return {"results": values.reshape(-1).tolist()}

    # -- helpers ---------------------------------------------------------------------
    def _inputs_of(self, signature: str) -> Dict[str, dict]:
        """A signature's inputs: the export's, but TF's classify and regress
        signatures over serialized Examples call theirs `inputs` (the
        receiver's name, `examples`, is the predict signature's)."""
        if (self.signatures[signature]["method_name"] in _EXAMPLE_METHODS
                and self.transform is not None and self.transform.parse_spec is not None
                and set(self.inputs) == {host_transform.EXAMPLES}):
            return {"inputs": dict(self.inputs[host_transform.EXAMPLES], name="inputs")}
        return self.inputs

    def _signature(self, body: dict, method: Optional[str] = None) -> str:
        if not isinstance(body, dict):
            raise RequestError(f"the request body must be a JSON object, got "
                               f"{type(body).__name__}")
        name = body.get("signature_name", "")
        if not isinstance(name, str):   # (TF Serving's words)
            raise RequestError(f"JSON Value: {json.dumps(name)} not formatted correctly. "
                               "'signature_name' key must be a string value.")
        name = name or export.DEFAULT_SERVING_SIGNATURE_DEF_KEY
        if name not in self.signatures:
            raise RequestError(f"signature_name: {name!r} is not a signature of this model; "
                               f"it has {sorted(self.signatures)}")
        if method and self.signatures[name]["method_name"] != method:
            wanted = [n for n, s in self.signatures.items() if s["method_name"] == method]
            raise RequestError(f"signature_name: {name!r} is a "
                               f"{self.signatures[name]['method_name']} signature; "
                               + (f"this request needs one of {wanted}" if wanted else
                                  f"this model has no {method} signature"))
        return name

    def _rows(self, instances, field: str, inputs: Dict[str, dict]) -> Dict[str, list]:
        if not isinstance(instances, list) or not instances:
            raise RequestError(f"{field} must be a non-empty list, got " + (
                "an empty list" if isinstance(instances, list) else type(instances).__name__))
        names = list(inputs)
        columns: Dict[str, list] = {n: [] for n in names}
        for i, row in enumerate(instances):
            if isinstance(row, dict) and not (len(names) == 1 and set(row) == {"b64"}):
                missing = [n for n in names if n not in row]
                extra = [k for k in row if k not in inputs]
                if missing or extra:
                    raise RequestError(f"{field}[{i}]: " + "; ".join(
                        ([f"missing input(s) {missing}"] if missing else [])
                        + ([f"unknown input(s) {extra}; the inputs are {names}"]
                           if extra else [])))
                for n in names:
                    columns[n].append(row[n])
            elif len(names) == 1:
                columns[names[0]].append(row)
            else:
                raise RequestError(f"{field}[{i}]: the model has inputs {names}: give each "
                                   "instance as an object {input: value}")
        return columns

    def _columns(self, given, inputs: Dict[str, dict]) -> Dict[str, Any]:
        names = list(inputs)
        if not isinstance(given, dict) or set(given) == {"b64"}:   # (TF's: {"b64"} a value)
            if len(names) != 1:
                raise RequestError(f"inputs: the model has inputs {names}: give an object "
                                   "{input: values}")
            given = {names[0]: given}
        missing = [n for n in names if n not in given]
        if missing:   # (keys it does not take are ignored, as TF Serving's)
            raise RequestError(f"inputs: missing input(s) {missing}; the inputs are {names}")
        return {n: given[n] for n in names}

    def _examples(self, body: dict) -> Dict[str, list]:
        examples = body.get("examples")
        context = body.get("context") or {}
        if not isinstance(context, dict):
            raise RequestError("context must be an object {feature: value}")
        if not isinstance(examples, list) or not examples:
            raise RequestError("examples must be a non-empty list of objects {feature: value}")
        rows = []
        for i, example in enumerate(examples):
            if not isinstance(example, dict):
                raise RequestError(f"examples[{i}] must be an object {{feature: value}}")
            rows.append({**context, **example})
        spec = self.transform.parse_spec if self.transform is not None else None
        if spec is not None:   # as TF Serving: each example made a tf.Example, then parsed
            try:
                return {host_transform.EXAMPLES: [host_transform.example_of(r, spec)
                                                  for r in rows]}
            except ValueError as e:
                raise RequestError(f"examples: {e}") from None
        # Features the model does not take are ignored, as parsing an Example ignores them.
        return self._rows([{k: v for k, v in r.items() if k in self.inputs} for r in rows],
                          "examples", self.inputs)

    def _tensor(self, name: str, values) -> torch.Tensor:
        spec = self.inputs[name]
        if spec["dtype"] == "string":
            return _strings(name, values)   # (nested as declared: the export checks)
        dtype = _DTYPES.get(spec["dtype"])
        if dtype is None:
            raise RequestError(f"input {name!r} has dtype {spec['dtype']}, which a JSON "
                               "request cannot give")
        try:
            plainly_fine = _plainly_fine(dtype)   # (the common case, quickly: 20k rows)
            for value in _leaves(values):
                if not plainly_fine(value):
                    problem = _number_problem(value, spec["dtype"], dtype)
                    if problem is not None:
                        raise ValueError(problem)
            if spec.get("rows"):   # (rows of numbers, any lengths: the model's feature)
                if not isinstance(values, list) or not all(isinstance(r, list)
                                                           for r in values):
                    raise ValueError("expected a list of values (a list) per example")
                return values
            integer = not dtype.is_floating_point and dtype is not torch.bool
            # (ints made one array with integral floats were float64: 2**63 - 1 wrapped)
            array = np.array(values, dtype=np.int64 if integer else np.float64
                             if dtype.is_floating_point else None)
            tensor = torch.as_tensor(array, dtype=dtype)
        except (TypeError, ValueError) as e:
            raise RequestError(f"input {name!r}: cannot make a {spec['dtype']} tensor of "
                               f"the values given ({e})") from None
        shape = spec.get("shape") or []
        want = [None] + list(shape[1:]) if shape else []
        if tensor.dim() != len(want) or any(w is not None and w != g
                                            for w, g in zip(want, tensor.shape)):
            expected = [("batch" if i == 0 else "any") if w is None else w
                        for i, w in enumerate(want)]
            raise RequestError(f"input {name!r}: expected shape {expected} per request, "
                               f"got {list(tensor.shape)}")
        return tensor

    def _run(self, signature: str, columns: Dict[str, Any]) -> Dict[str, np.ndarray]:
        if set(columns) == {"inputs"} and "inputs" not in self.inputs:   # (_inputs_of)
            columns = {host_transform.EXAMPLES: columns["inputs"]}
        tensors = {n: self._tensor(n, v) for n, v in columns.items()}
        sizes = {n: len(t) for n, t in tensors.items()
                 if not isinstance(t, torch.Tensor) or t.dim()}
        if len(set(sizes.values())) > 1:
            raise RequestError(f"inputs have different batch sizes: {sizes}")
        with torch.inference_mode():
            try:
                outputs = self.loaded.signatures[signature](**tensors)
            except Exception as e:   # the program's own checks (shapes, dtypes)
                raise RequestError(f"the model rejected the inputs: {e}") from None
        outputs = {k: to_numpy(v) if isinstance(v, torch.Tensor)
                   else _json_strings(k, v) for k, v in outputs.items()}
        described = self.signatures[signature]
        for new, spec in described["named_outputs"].items():   # TF's string classes
            if spec["ids"] is None:   # every class name, per example
                batch = len(next(iter(outputs.values())))
                ids = np.tile(np.arange(len(spec["names"])), (batch, 1))
            else:
                ids = outputs[spec["ids"]]
            outputs[new] = _named(spec["names"], ids)
        return outputs


def _plainly_fine(dtype: torch.dtype):
    """A quick test passing most JSON values `_number_problem` would pass."""
    if dtype is torch.bool:
        return lambda value: type(value) is bool
    if dtype.is_floating_point:
        top = float(torch.finfo(dtype).max)
        return lambda value: type(value) is float and -top <= value <= top
    info = torch.iinfo(dtype)
    return lambda value: type(value) is int and info.min <= value <= info.max


def _number_problem(value, name: str, dtype: torch.dtype) -> Optional[str]:
    """What is wrong with a JSON value for a number input of `dtype` (TF
    Serving's AddValueToTensor), or None."""
    if isinstance(value, np.generic):   # (numpy's numbers, given in process)
        value = value.item()
    if dtype is torch.bool:
        return None if isinstance(value, bool) else (
            f"{_as_json(value)} is not of expected type bool: give true or false")
    if value is None or not isinstance(value, (int, float)):
        return f"{_as_json(value)} is not of expected type {name}"
    if dtype.is_floating_point:
        if isinstance(value, bool):
            return "expected numbers; it would take true as 1.0"
        return host_transform.lossy_float(value, name)
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        return "expected integers; it would truncate or take true as 1"
    info = torch.iinfo(dtype)   # (exactly: 2.0**63 is past int64's range, not its top)
    if not info.min <= int(value) <= info.max:
        return (f"{_as_json(value)} is out of the range of {name} "
                f"[{info.min}, {info.max}]")
    return None


def _as_json(value) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _named(names: Optional[list], ids: np.ndarray) -> np.ndarray:
    """Class ids as their names; the ids themselves where there are none."""
    if not names:
        return ids
    return np.asarray(names, dtype=object)[ids.astype(np.int64)]


def _with_named(signature: dict) -> list:
    """A signature's output descriptions, with the string outputs the server
    adds (`named_outputs`): shaped as the ids they name, or [batch, classes]."""
    outputs = list(signature["outputs"])
    shapes = {o["name"]: o["shape"] for o in outputs}
    for new, spec in signature.get("named_outputs", {}).items():
        shape = (shapes[spec["ids"]] if spec["ids"] is not None
                 else [None, len(spec["names"])])
        outputs = [o for o in outputs if o["name"] != new] + [
            {"name": new, "dtype": "string", "shape": shape}]
    return outputs


_EXAMPLE_METHODS = ("tensorflow/serving/classify", "tensorflow/serving/regress")
_TF_DTYPES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF",
              "bfloat16": "DT_BFLOAT16", "int64": "DT_INT64", "int32": "DT_INT32",
              "int16": "DT_INT16", "int8": "DT_INT8", "uint8": "DT_UINT8", "bool": "DT_BOOL",
              "string": "DT_STRING"}


def _tensor_info(description: dict) -> dict:
    """A TensorInfo as TF Serving's metadata gives it: TF's dtype name, the
    shape with -1 for the batch, and a tensor name."""
    dims = [{"size": str(-1 if d is None else d), "name": ""}
            for d in description.get("shape") or []]
    return {"dtype": _TF_DTYPES.get(description["dtype"], "DT_INVALID"),
            "tensor_shape": {"dim": dims, "unknown_rank": False},
            "name": f"{description['name']}:0"}


def _leaves(values):
    """The values of a request's nested JSON lists, in order."""
    for value in values if isinstance(values, list) else [values]:
        if isinstance(value, list):
            yield from _leaves(value)
        else:
            yield value


def _strings(name: str, values):
    """A string input of a request: str values, or ``{"b64": ...}`` for bytes
    (serialized tf.Examples), as TF Serving takes them; a row may be a list
    (a variable-length feature)."""
    def one(value, where):
        if isinstance(value, dict):
            try:
                return host_transform.b64_bytes(value)
            except ValueError as e:
                raise RequestError(f"input {name!r}{where}: {e}") from None
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # (TF Serving's 400 too: as text, 12.0 would be "12.0" and 2134 would
            # not be "02134", another vocabulary entry or hash bucket, said nowhere)
            raise RequestError(f"input {name!r}{where}: expected a string, got the number "
                               f"{value!r}: send it as a JSON string, as it was in training "
                               f"(e.g. \"{value}\")")
        raise RequestError(f"input {name!r}{where}: expected a string, got "
                           f"{type(value).__name__}")
    if not isinstance(values, list):
        raise RequestError(f"input {name!r}: expected a list of values, one per example")
    rows = [[one(v, f"[{i}][{j}]") for j, v in enumerate(row)] if isinstance(row, list)
            else one(row, f"[{i}]") for i, row in enumerate(values)]
    if any(isinstance(row, list) for row in rows):
        return rows
    return np.array(rows, dtype=object)


def _json_strings(name: str, values: np.ndarray) -> np.ndarray:
    """A string output (bytes) as JSON gives it, as TF Serving does: text,
    or {"b64": ...} for an output named ``*_bytes`` or bytes not utf-8."""
    out = np.empty(values.shape, dtype=object)
    for i, value in np.ndenumerate(values):
        try:
            if name.endswith("_bytes"):
                raise UnicodeDecodeError("utf-8", value, 0, 0, "binary by name")
            out[i] = value.decode("utf-8")
        except UnicodeDecodeError:
            out[i] = {"b64": base64.b64encode(value).decode("ascii")}
    return out


def _rows_of(outputs: Dict[str, np.ndarray], batch: int) -> list:
    """The row format's predictions: every output must have a row per example
    (TF Serving checks that they agree; an output of one row for a batch of 7
    gave 1 prediction there, misaligned with the instances)."""
    for key, value in outputs.items():
        if value.ndim == 0:
            raise RequestError(f"Tensor name: {key} has no shape information; the row "
                               "format (\"instances\") needs a row per example: ask for "
                               "\"inputs\" (columns)")
        if len(value) != batch:
            raise RequestError(f"Tensor name: {key} has inconsistent batch size: "
                               f"{len(value)} expecting: {batch}; the row format "
                               "(\"instances\") needs a row per example: ask for \"inputs\" "
                               "(columns)")
    if len(outputs) == 1:
        return next(iter(outputs.values())).tolist()
    keys = list(outputs)
    columns = [outputs[k].tolist() for k in keys]
    return [dict(zip(keys, row)) for row in zip(*columns)]


_ROUTE = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)"
                    r"|/labels/(?P<label>[^/:]+))?"
                    r"(?P<rest>/metadata|:predict|:classify|:regress)?$", re.IGNORECASE)


_CLIENT_TIMEOUT_SECS = 60.0
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


class _Handler(BaseHTTPRequestHandler):
    server_version = "estimator-serving"
    protocol_version = "HTTP/1.1"   # connections kept alive, as TF Serving's
    timeout = _CLIENT_TIMEOUT_SECS   # a stalled client holds its thread no longer

    def log_message(self, fmt, *args):
        logger.debug("%s - %s", self.address_string(), fmt % args)

    def handle_one_request(self):
        self.server.waiting(self.connection, True)   # (a stop closes it: nothing in flight)
        super().handle_one_request()

    def parse_request(self):
        self.server.waiting(self.connection, False)   # (a request line came: in flight)
        return super().parse_request()

    def handle_expect_100(self):
        """A body over the limit is refused before the client sends it."""
        length = self.headers.get("Content-Length", "")
        if _ascii_digits(length.strip()) and int(length) > _MAX_BODY:
            self.close_connection = True
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {
                "error": f"request body of {int(length)} bytes is over the limit of "
                         f"{_MAX_BODY}"})
            return False
        return super().handle_expect_100()

    def finish(self):
        self.server.waiting(self.connection, False)
        super().finish()

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError as e:   # (the client left: nothing to tell it)
            self.close_connection = True
            logger.debug("%s left before its answer (%s)", self.address_string(), e)

    def send_error(self, code, message=None, explain=None):
        """The standard library's errors (a bad request line, headers too
        large, a method without a do_*) as TF Serving's JSON, not HTML."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":   # (no request line read: answer in HTTP/1.0)
            self.request_version = "HTTP/1.0"
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = HTTPStatus.BAD_REQUEST, f"Malformed request: {self.command} {self.path}"
        self._reply(code, {"error": message or HTTPStatus(code).phrase})

    def _route(self, method: str):
        match = _ROUTE.match(self.path.split("?", 1)[0])
        model = self.server.model
        if match is None:
            raise RequestError(f"Malformed request: {method} {self.path}")
        if match["name"] != model.name:
            raise RequestError(f"Servable not found for request: Latest({match['name']})",
                               HTTPStatus.NOT_FOUND)
        if match["label"] is not None:   # (TF Serving's words; labels come from its config)
            raise RequestError(f"Unrecognized servable version label: {match['label']}; "
                               "estimator serve assigns no labels: ask for "
                               f"/versions/{model.version} or leave the version out")
        if match["version"] is not None and (not model.version.isdigit() or int(
                match["version"]) != int(model.version)):
            raise RequestError(f"Servable not found for request: Specific({match['name']}, "
                               f"{int(match['version'])})", HTTPStatus.NOT_FOUND)
        return model, (match["rest"] or "").lower()

    def do_GET(self):
        if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length",
                                                                     "0").strip() != "0":
            self.close_connection = True   # (a body nobody reads would be the next request)
        try:
            model, rest = self._route("GET")
            if rest == "":
                return self._reply(HTTPStatus.OK, model.status())
            if rest == "/metadata":
                return self._reply(HTTPStatus.OK, model.metadata())
            raise RequestError(f"Malformed request: GET {self.path}; use POST")
        except RequestError as e:
            self._reply(e.status, {"error": str(e)})

    def do_POST(self):
        keep_alive, self.close_connection = self.close_connection, True   # till the body is read
        try:
            model, rest = self._route("POST")
            verbs = {":predict": model.predict, ":classify": model.classify,
                     ":regress": model.regress}
            if rest not in verbs:
                raise RequestError(f"Malformed request: POST {self.path}")
            raw = self._body()
            self.close_connection = keep_alive
            try:
                body = json.loads(raw or b"null")
            except (ValueError, UnicodeDecodeError) as e:
                raise RequestError(f"JSON Parse error: {e}") from None
            except RecursionError:
                raise RequestError("JSON Parse error: nested too deeply") from None
            if body is None:
                raise RequestError("JSON Parse error: The document is empty")
            self._reply(HTTPStatus.OK, verbs[rest](body))
        except RequestError as e:
            self._reply(e.status, {"error": str(e)})
        except Exception as e:   # never let a request take the server down
            logger.exception("request %s failed", self.path)
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"})

    def do_OTHER(self):
        self.send_error(HTTPStatus.NOT_IMPLEMENTED)

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_OTHER

    def _body(self) -> bytes:
        """The request's body: Content-Length bytes, or chunked."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked()
        length = self.headers.get("Content-Length")
        if length is None:
            raise RequestError("the request has no Content-Length (nor Transfer-Encoding: "
                               "chunked): send the JSON body with its length",
                               HTTPStatus.LENGTH_REQUIRED)
        if not _ascii_digits(length.strip()):   # (ASCII digits: "²" is a digit to str)
            raise RequestError(f"Content-Length: {length!r} is not a number of bytes")
        length = int(length)
        self._check_size(length)
        return self._read(length, f"its Content-Length of {length} bytes")

    def _chunked(self) -> bytes:
        parts, size = [], 0
        while True:
            line = self._read_line()
            digits = line.split(b";", 1)[0].strip()
            if not _HEX.fullmatch(digits):   # (int(_, 16) takes -5, 0x62, 6_2)
                raise RequestError(f"a chunked body's chunk size {line[:40]!r} is not hex "
                                   "digits")
            chunk = int(digits, 16)
            if chunk == 0:
                while self._read_line().strip():   # (trailers, up to the blank line)
                    pass
                return b"".join(parts)
            size += chunk
            self._check_size(size)
            parts.append(self._read(chunk, "its chunk"))
            if self._read_line().strip():
                raise RequestError(f"a chunk of the request body is longer than its size "
                                   f"({chunk} bytes)")

    def _read_line(self) -> bytes:
        try:
            line = self.rfile.readline(1 << 16)
        except TimeoutError:
            raise RequestError(f"the request body stalled for {_CLIENT_TIMEOUT_SECS:.0f} s",
                               HTTPStatus.REQUEST_TIMEOUT) from None
        if not line:
            raise RequestError("the chunked request body ended before its last chunk")
        return line

    def _read(self, length: int, what: str) -> bytes:
        data = bytearray()
        try:
            while len(data) < length:
                part = self.rfile.read1(length - len(data))
                if not part:
                    break
                data += part
        except TimeoutError:
            raise RequestError(f"the request body stalled after {len(data)} bytes of {what} "
                               f"for {_CLIENT_TIMEOUT_SECS:.0f} s",
                               HTTPStatus.REQUEST_TIMEOUT) from None
        if len(data) < length:
            raise RequestError(f"the request body ended after {len(data)} bytes of {what}")
        return bytes(data)

    @staticmethod
    def _check_size(size: int) -> None:
        if size > _MAX_BODY:
            raise RequestError(f"request body of {size} bytes is over the limit of "
                               f"{_MAX_BODY}", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)


class _Server(ThreadingHTTPServer):
    # The listen backlog: the standard library's 5 reset connections when 20
    # clients called at once (each is answered on its own thread once accepted).
    request_queue_size = 128

    def __init__(self, *args, **kwargs):
        self._waiting = set()   # connections waiting for a request (idle, kept alive)
        self._waiting_lock = threading.Lock()
        self._closing = False
        self._stop_polling = threading.Event()
        self._poller = None
        super().__init__(*args, **kwargs)

    def waiting(self, connection, waiting: bool) -> None:
        with self._waiting_lock:
            if waiting and self._closing:
                _shut(connection)
            elif waiting:
                self._waiting.add(connection)
            else:
                self._waiting.discard(connection)

    def poll_versions(self, base: str, every: float) -> None:
        """Serve each newer version exported under `base` once it loads (a
        thread looking every `every` seconds; a request takes the model
        served when it arrives); where the one served is deleted, the newest
        left, as TF Serving's latest-version policy (none left: the one
        served stays, as while a base is replaced)."""
        def poll():
            failed = {}   # version: its files when it failed to load
            while not self._stop_polling.wait(every):
                try:
                    path, version = _version_dir(base)
                except (OSError, ValueError):   # (the base removed for a while)
                    continue
                served = self.model
                if int(version) <= int(served.version) and (
                        version == served.version
                        or os.path.isfile(os.path.join(served.dir, export.SIGNATURE))):
                    continue
                files = _files_of(path)
                if failed.get(version) == files:
                    continue
                try:
                    model = Model(path, self.model.name)
                except Exception as e:   # (TF Serving keeps the one it has, and polls on)
                    if version not in failed:
                        logger.error("version %s cannot be served, version %s stays (tried "
                                     "again when its files change: a copy still going on?): "
                                     "%s", version, self.model.version, e)
                    failed[version] = files
                    continue
                logger.info("Serving version %s of %r (was %s%s): %s", model.version,
                            model.name, served.version, "" if int(version) > int(
                                served.version) else ", deleted", model.dir)
                self.model = model
        self._poller = threading.Thread(target=poll, name="version-poller", daemon=True)
        self._poller.start()

    def server_close(self):
        """Stops: connections waiting for a request are closed at once (a
        kept-alive idle one held Ctrl-C 60 s); requests in flight are answered."""
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join()
        with self._waiting_lock:
            self._closing = True
            idle = list(self._waiting)
        for connection in idle:
            _shut(connection)
        super().server_close()

    def handle_error(self, request, client_address):
        """A client gone mid-request is one debug line, not a traceback on stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            logger.debug("connection from %s: %s", client_address, error)
            return
        super().handle_error(request, client_address)


def _files_of(path: str) -> Optional[tuple]:
    """(name, size, mtime) of each file under `path`: what a copy in progress changes."""
    try:
        return tuple(sorted((os.path.join(root, name), entry.st_size, entry.st_mtime_ns)
                            for root, _, names in os.walk(path) for name in names
                            for entry in [os.stat(os.path.join(root, name))]))
    except OSError:
        return None


def _shut(connection) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:   # (already closed by the client)
        pass


def make_server(path: str, host: str = "127.0.0.1", port: int = 8501,
                model_name: str = "default",
                file_system_poll_wait_seconds: float = 1.0) -> ThreadingHTTPServer:
    """A server (not yet serving) for the export at `path` (an export dir or
    a base of timestamped exports); `server.serve_forever()` runs it. Under
    a base, a newer version is looked for every `file_system_poll_wait_seconds`
    (TF Serving's flag; <= 0: never) and served once loaded, as TF Serving's
    latest-version policy does (the older one is then a 404)."""
    model = Model(path, model_name)
    try:
        server = _Server((host, port), _Handler)
    except OSError as e:   # (in use, not this machine's address, a privileged port)
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    except OverflowError:
        raise ValueError(f"port {port}: a port is 0-65535") from None
    # The requests in flight are answered before server_close() returns (Ctrl-C):
    # a thread still running the model while the interpreter exits aborts the
    # process (-6, "terminate called without an active exception",
    # pytorch/pytorch#38228), as every Ctrl-C under load did.
    server.daemon_threads = False
    server.block_on_close = True
    server.model = model
    if file_system_poll_wait_seconds > 0 and not os.path.isfile(
            os.path.join(path, export.SIGNATURE)):
        server.poll_versions(path, file_system_poll_wait_seconds)
    return server
