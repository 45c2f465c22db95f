"""Serving inputs and `export_saved_model` (tf.estimator.export).

TF writes a SavedModel: a graph from serving placeholders to predictions.
Here an export is a `torch.export` program of the PREDICT path: the model_fn
called in PREDICT mode on the modules restored from a checkpoint, traced from
the receiver tensors to the predictions, batch dimension dynamic. It is a
timestamped directory `export_dir_base/<timestamp>/` holding

    model.pt2        torch.export.save() of the program
    signature.json   inputs (name, dtype, shape; null = any size: the batch,
                     or a `placeholder`'s None),
                     outputs, global step, checkpoint
    assets.extra/    the files of `assets_extra`, when given
    model.txt        the program as text, when `as_text`

and it serves with nothing but torch:

    program = torch.export.load(export_dir + "/model.pt2").module()
    predictions = program(x=torch.tensor(...))   # keyword per receiver tensor

The program runs the modules in eval() mode (dropout off, batch-norm on its
running statistics). When the PREDICT spec gives `export_outputs`
({signature name: PredictOutput / ClassificationOutput / RegressionOutput}),
each is a serving signature (TF's SignatureDefs): the program returns
{signature name: {output key: tensor}} and `signature.json` lists them;
`load(export_dir).signatures[name](**inputs)` calls one. Without them the
program returns the predictions, served as `serving_default`.

`ServingInputReceiver(features, receiver_tensors)`: `receiver_tensors` are
example tensors (batch first) standing for TF's placeholders; they name the
program's inputs. `features` is what model_fn receives: the receiver tensors
themselves (or a dict of them), or a callable computing the features from the
dict of receiver tensors (the preprocessing TF would build into the graph).
"""
from __future__ import annotations

import copy
import errno
import itertools
import io
import json
import keyword
import logging
import os
import shutil
import time
import unicodedata
import uuid
import weakref
import zipfile
from typing import Any, Callable, Dict, NamedTuple, Optional

import numpy as np
import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

import distribute

from hooks import model_scope

from . import host_transform, io as tf_io
from ._dropout_check import DropoutWatch
from .feature_column import recorded
from .host_transform import EXAMPLES, HostTransform, is_host_value, template_examples
from hooks.mode_keys import ModeKeys
from .model_fn import EstimatorSpec

logger = logging.getLogger(__name__)

PROGRAM = "model.pt2"
SIGNATURE = "signature.json"
_SINGLE_FEATURE_DEFAULT_NAME = "feature"
_SINGLE_RECEIVER_DEFAULT_NAME = "input"


def _check_tensors(tensors, what: str, default_name: str) -> Dict[str, torch.Tensor]:
    """{name: tensor, or a host value (strings as a numpy array, rows as lists)}."""
    if isinstance(tensors, torch.Tensor):
        tensors = {default_name: tensors}
    if not isinstance(tensors, dict) or not tensors:
        raise ValueError(f"{what} must be a tensor or a non-empty dict of tensors, got "
                         f"{tensors!r:.200}")
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"{what} keys must be strings, got {name!r}")
        if not isinstance(value, torch.Tensor) and not is_host_value(value):
            raise ValueError(f"{what}[{name!r}] must be a tensor, or strings as a numpy "
                             f"array or rows as a list, got {type(value).__name__}")
    return dict(tensors)


# The dimensions past the first that a `placeholder` leaves of any size, by
# example tensor (the first, the batch, follows the receiver's dynamic_batch).
_any_size: Dict[int, tuple] = {}   # by id(tensor), dropped with the tensor
_ANY_SIZE_EXAMPLE = 8    # the size such a dimension is traced at (a conv's kernel fits)


def placeholder(dtype=torch.float32, shape=None, name: Optional[str] = None,
                fill_value=0) -> torch.Tensor:
    """An example serving input standing for TF's
    ``tf.compat.v1.placeholder(dtype, shape)``: `fill_value` (zeros) in
    `shape`, where each None is a dimension of any size in the export (the
    first, the batch, traced at 2 rows, the others at 8). Give it to
    `ServingInputReceiver` or `build_raw_serving_input_receiver_fn`:
    ``placeholder(torch.int64, [None, None])`` serves token ids of any
    length. ``placeholder(str, [None])`` (TF's ``tf.string``) is an example
    array of strings, ``fill_value`` each ("" for 0): give one the model
    takes (an encoded image where the receiver decodes one). The export runs
    model_fn's PREDICT path on it: where 0 is padding or a length (an
    all-padding sequence breaks a padding mask or pack_padded_sequence),
    trace with ``fill_value=1``. `name` is accepted
    for TF's signature (the receiver's key names the input). A numpy dtype
    (`np.float32`, "int64") or Python type (`float`: float32) is taken as
    TF takes it."""
    strings = dtype in (str, bytes, "string", np.str_, np.bytes_)
    empty = b"" if dtype in (bytes, np.bytes_) else ""
    dtype = None if strings else _torch_dtype(dtype)
    if shape is None:
        raise ValueError("placeholder: give a shape, a list with None for a dimension of any "
                         "size (an input of unknown rank cannot be exported)")
    dims = list(shape)
    for i, d in enumerate(dims):
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 1):
            raise ValueError(f"placeholder: shape[{i}] must be None or a positive int, "
                             f"got {d!r}")
    if not dims:
        raise ValueError("placeholder: a serving input needs a batch dimension, got shape []")
    if strings:
        if any(d is None for d in dims[1:]):
            raise ValueError("placeholder: a string input's dimensions past the batch are "
                             "given sizes (strings of any size past the batch are not exported)")
        text = empty if isinstance(fill_value, int) and fill_value == 0 else fill_value
        if not isinstance(text, (str, bytes)):
            raise ValueError(f"placeholder: a string input's fill_value is a string (or bytes), "
                             f"got {fill_value!r}")
        example = np.empty([2 if dims[0] is None else dims[0], *dims[1:]], dtype=object)
        example.fill(text)
        return example
    example = torch.full([(2 if i == 0 else _ANY_SIZE_EXAMPLE) if d is None else d
                          for i, d in enumerate(dims)], fill_value, dtype=dtype)
    _mark_any_size(example, tuple(i for i, d in enumerate(dims) if d is None and i > 0))
    return example


_PYTHON_DTYPES = {float: torch.float32, bool: torch.bool}   # (TF 2.15's as_dtype takes these)


def _torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, type) and dtype in _PYTHON_DTYPES:
        return _PYTHON_DTYPES[dtype]
    as_numpy = None
    if isinstance(dtype, (str, np.dtype)) or (
            isinstance(dtype, type) and issubclass(dtype, np.generic)):
        try:
            as_numpy = np.dtype(dtype)
        except TypeError:
            pass
    if as_numpy is not None and as_numpy.kind in "biufc":
        return torch.from_numpy(np.zeros(0, as_numpy.newbyteorder("="))).dtype
    raise ValueError(f"placeholder: dtype must be a torch.dtype (torch.float32, "
                     f"torch.int64, ...), a numeric numpy one, or str (TF's tf.string), got "
                     f"{dtype!r}")


def _mark_any_size(tensor, dims: tuple) -> None:
    if dims and isinstance(tensor, torch.Tensor):
        _any_size[id(tensor)] = dims
        weakref.finalize(tensor, _any_size.pop, id(tensor), None)


def _any_size_of(value) -> tuple:
    """The dimensions past the first that `value` (a placeholder) leaves of any size."""
    return _any_size.get(id(value), ()) if isinstance(value, torch.Tensor) else ()


class ServingInputReceiver:
    """What a `serving_input_receiver_fn` returns (tf.estimator.export.ServingInputReceiver).

    `receiver_tensors`: a tensor or {name: tensor} of example inputs, batch
    dimension first; each becomes a keyword input of the exported program
    (names must be Python identifiers). `features`: a tensor or dict of the
    receiver tensors (a single tensor is wrapped as {"feature": t}, as in TF),
    or a callable `features(receiver_tensors) -> features` for preprocessing.
    `dynamic_batch=False` keeps the example's batch size fixed in the program.
    """

    def __init__(self, features, receiver_tensors, receiver_tensors_alternatives=None,
                 dynamic_batch: bool = True):
        self.receiver_tensors = _check_tensors(receiver_tensors, "receiver_tensors",
                                               _SINGLE_RECEIVER_DEFAULT_NAME)
        for name in self.receiver_tensors:
            if not _parameter_name(name):
                raise ValueError(f"receiver_tensors name {name!r} must be a Python identifier "
                                 "(not a keyword, not `self`, as Python keeps it: NFKC): it is "
                                 "a keyword argument of the exported program")
        if not callable(features):
            features = self._wrap_features(features)
        self.features = features
        if receiver_tensors_alternatives:
            logger.warning("receiver_tensors_alternatives are not exported: an export has one "
                           "program, whose inputs are receiver_tensors")
        self.receiver_tensors_alternatives = receiver_tensors_alternatives
        self.dynamic_batch = bool(dynamic_batch)
        self.parse_spec: Optional[dict] = None   # set by the parsing receiver

    @property
    def _takes_host_values(self) -> bool:
        """Whether the export needs a host-side transform (strings, Examples)."""
        return self.parse_spec is not None or any(
            is_host_value(v) for v in self.receiver_tensors.values())

    def _wrap_features(self, features):
        return _check_tensors(features, "features", _SINGLE_FEATURE_DEFAULT_NAME)

    def _features_fn(self) -> Callable:
        """receiver tensors dict -> features, for tracing."""
        if callable(self.features):
            return self.features
        by_id = {id(t): name for name, t in self.receiver_tensors.items()}
        single = isinstance(self.features, torch.Tensor)
        leaves = {"": self.features} if single else self.features
        mapping = {}
        for key, tensor in leaves.items():
            if id(tensor) not in by_id:
                raise ValueError(
                    f"features[{key!r}] is not one of the receiver_tensors: in an export the "
                    "features are the receiver tensors themselves, or give `features` as a "
                    "callable computing them from the dict of receiver tensors (TF1's "
                    "`features = add_engineered(placeholders)` is "
                    "ServingInputReceiver(add_engineered, placeholders); a module-level "
                    "function where the receiver takes strings or columns cross)")
            mapping[key] = by_id[id(tensor)]
        if single:
            return lambda inputs: inputs[mapping[""]]
        return lambda inputs: {key: inputs[name] for key, name in mapping.items()}


class TensorServingInputReceiver(ServingInputReceiver):
    """A receiver whose single feature tensor is passed to model_fn as is, not
    wrapped in a dict (tf.estimator.export.TensorServingInputReceiver)."""

    def _wrap_features(self, features):
        if not isinstance(features, torch.Tensor):
            raise ValueError(f"TensorServingInputReceiver: features must be a tensor, got "
                             f"{type(features).__name__}")
        return features


def build_raw_serving_input_receiver_fn(features, default_batch_size: Optional[int] = None):
    """A `serving_input_receiver_fn` taking the raw feature tensors
    (tf.estimator.export.build_raw_serving_input_receiver_fn).

    `features`: a tensor or {name: tensor} of example features (batch
    first); only their dtypes and shapes past the batch dimension matter. The
    program accepts any batch size, or exactly `default_batch_size` when given.
    """
    templates = _check_tensors(features, "features", _SINGLE_FEATURE_DEFAULT_NAME)
    if default_batch_size is not None and (not isinstance(default_batch_size, int)
                                           or default_batch_size <= 0):
        raise ValueError(f"default_batch_size must be a positive int or None, got "
                         f"{default_batch_size!r}")
    single = isinstance(features, torch.Tensor)

    def serving_input_receiver_fn():
        receivers = {}
        for name, t in templates.items():
            if len(t) == 0 if not isinstance(t, torch.Tensor) else t.dim() == 0:
                raise ValueError(f"features[{name!r}] must have a batch dimension, got a scalar")
            batch = default_batch_size or max(len(t), 2)
            receivers[name] = _example(t, batch)
            _mark_any_size(receivers[name], _any_size_of(t))
        if single:
            return TensorServingInputReceiver(receivers[_SINGLE_FEATURE_DEFAULT_NAME],
                                              receivers, dynamic_batch=default_batch_size is None)
        return ServingInputReceiver(receivers, receivers,
                                    dynamic_batch=default_batch_size is None)
    return serving_input_receiver_fn


def build_parsing_serving_input_receiver_fn(feature_spec: dict,
                                            default_batch_size: Optional[int] = None, *,
                                            max_sequence_length: Optional[int] = None):
    """A `serving_input_receiver_fn` taking serialized tf.Examples
    (tf.estimator.export.build_parsing_serving_input_receiver_fn): one input,
    ``examples``, parsed by `feature_spec` (e.g.
    ``est.feature_column.make_parse_example_spec(columns)``) into the
    features. The export records the spec and the feature columns' work on
    the host (``transform.json``); `estimator serve` then answers ``:predict``
    with ``{"instances": [{"b64": ...}]}`` and ``:classify`` / ``:regress``
    with JSON examples, as TF Serving does.

    `max_sequence_length` (not TF's): the values of each VarLenFeature in the
    examples the export traces (2 by default); a model that fixes its steps
    when traced (an RNN over `sequence_input_layer`) serves sequences up to
    that long, padded, and needs it given."""
    if max_sequence_length is not None and (
            not isinstance(max_sequence_length, int) or max_sequence_length < 2):
        raise ValueError(f"max_sequence_length must be an int of 2 or more, got "
                         f"{max_sequence_length!r}")
    if not isinstance(feature_spec, dict) or not feature_spec:
        raise ValueError(f"feature_spec must be a non-empty dict {{key: FixedLenFeature or "
                         f"VarLenFeature}}, got {feature_spec!r:.200}")
    spec = dict(feature_spec)

    def serving_input_receiver_fn():
        examples = template_examples(spec, default_batch_size or 2, max_sequence_length or 2)
        receiver = ServingInputReceiver(
            lambda inputs: tf_io.parse_example(list(inputs[EXAMPLES]), spec),
            {EXAMPLES: examples}, dynamic_batch=default_batch_size is None)
        receiver.parse_spec = spec
        receiver.template_steps = max_sequence_length is None
        return receiver
    return serving_input_receiver_fn


def _example(template, batch: int):
    """`template` resized to `batch` rows (repeating rows); a tensor detached,
    on the CPU."""
    if not isinstance(template, torch.Tensor):
        if len(template) == 0:
            raise ValueError("an example serving input needs at least one row")
        rows = [template[i % len(template)] for i in range(batch)]
        return np.array(rows, dtype=template.dtype) if isinstance(
            template, np.ndarray) else rows
    t = template.detach().cpu()
    if t.shape[0] == 0:
        raise ValueError("an example serving input needs at least one row")
    reps = -(-batch // t.shape[0])
    return t.repeat(reps, *([1] * (t.dim() - 1)))[:batch].clone()


# -- export outputs: the serving signatures (tf.estimator.export.*Output) -------------
DEFAULT_SERVING_SIGNATURE_DEF_KEY = "serving_default"


class ExportOutput:
    """One serving signature of an export (tf.estimator.export.ExportOutput):
    `outputs` is {output key: tensor}, `method_name` TF Serving's method.

    Torch programs hold no strings, so TF's string classes are class ids
    here; `class_names` (the name of each id) and `named_outputs` ({string
    output: the id output it names, or None for every class name per
    example; or a pair (that, its own class names)}) are recorded with the
    export, and `estimator serve` answers with the names, as TF Serving
    answers with TF's string tensors. An output may also be a string
    feature itself (`features["key"]`, as `forward_features` adds it): the
    export records which feature, and serves each request's own values of
    it (TF's string output of the feature)."""

    method_name = ""

    def __init__(self, outputs: Dict[str, torch.Tensor], class_names=None,
                 named_outputs: Optional[Dict[str, Any]] = None):
        name = type(self).__name__
        for key, value in outputs.items():
            if not isinstance(value, torch.Tensor) and not is_host_value(value):
                raise ValueError(f"{name}: output {key!r} must be a tensor (or a string "
                                 f"feature, forwarded), got {type(value).__name__}")
        self.outputs = outputs
        self.class_names = _names(name, "class_names", class_names)
        self.named_outputs = {}   # {string output: {"ids": output or None, "names": [...]}}
        for new, spec in (named_outputs or {}).items():
            ids, names = spec if isinstance(spec, tuple) else (spec, self.class_names)
            if ids is not None and ids not in outputs:
                raise ValueError(f"{name}: named output {new!r} names the ids of output "
                                 f"{ids!r}, which it does not have ({sorted(outputs)})")
            names = _names(name, f"the class names of named output {new!r}", names)
            if names is None:
                raise ValueError(f"{name}: named output {new!r} has no class names: give "
                                 "class_names")
            self.named_outputs[new] = {"ids": ids, "names": names}

    def _with_outputs(self, more: Dict[str, Any]) -> "ExportOutput":
        """A copy holding `more` outputs too (its class names kept)."""
        copied = copy.copy(self)
        copied.outputs = {**self.outputs, **more}
        return copied


def _names(owner: str, what: str, names) -> Optional[list]:
    """`names` as a list of str (None stays None); an error naming `what` otherwise."""
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{owner}: {what} must be a list of str, got {names!r:.100}")
    return list(names)


class PredictOutput(ExportOutput):
    """Any tensors (TF: PredictOutput; a single tensor is keyed `output`).
    `class_names` and `named_outputs` (ours, see `ExportOutput`): e.g.
    ``{"classes": "class_ids"}`` serves TF's string ``classes``."""

    method_name = "tensorflow/serving/predict"

    def __init__(self, outputs, class_names=None, named_outputs=None):
        if isinstance(outputs, torch.Tensor):
            outputs = {"output": outputs}
        if not isinstance(outputs, dict) or not outputs:
            raise ValueError(f"PredictOutput: outputs must be a tensor or a non-empty dict "
                             f"of tensors, got {type(outputs).__name__}")
        super().__init__(dict(outputs), class_names, named_outputs)


class ClassificationOutput(ExportOutput):
    """`scores` [batch, classes] and/or `classes` (TF: ClassificationOutput,
    keys `scores` and `classes`; torch has no string tensors, so `classes`
    here is a tensor, such as class ids). `class_names` (ours): the name of
    each class id (see `ExportOutput`); `classes` are served as those names,
    and without `classes`, each score is labelled with its class's name."""

    method_name = "tensorflow/serving/classify"

    def __init__(self, scores=None, classes=None, class_names=None):
        if scores is None and classes is None:
            raise ValueError("ClassificationOutput: at least one of scores and classes "
                             "must be set")
        super().__init__({k: v for k, v in (("scores", scores), ("classes", classes))
                          if v is not None}, class_names,
                         {"classes": "classes"}
                         if classes is not None and class_names is not None else None)


class RegressionOutput(ExportOutput):
    """One float tensor of predicted values (TF: RegressionOutput, key `outputs`)."""

    method_name = "tensorflow/serving/regress"

    def __init__(self, value):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ValueError(f"RegressionOutput: value must be a float tensor, got "
                             f"{getattr(value, 'dtype', type(value).__name__)}")
        super().__init__({"outputs": value})


def _signatures(spec: EstimatorSpec) -> Optional[Dict[str, ExportOutput]]:
    """The spec's export outputs by signature name, with TF's default rule
    (export_lib.get_export_outputs): one output is also `serving_default`,
    several must name one so; None when the spec gives none."""
    outputs = spec.export_outputs
    if outputs is None:
        return None
    if not isinstance(outputs, dict) or not outputs:
        raise ValueError(f"EstimatorSpec.export_outputs must be a non-empty dict "
                         f"{{signature name: ExportOutput}}, got {outputs!r:.200}")
    for name, output in outputs.items():
        if not isinstance(name, str) or not isinstance(output, ExportOutput):
            raise ValueError(f"export_outputs[{name!r}] must be an est.export.PredictOutput, "
                             f"ClassificationOutput or RegressionOutput, got "
                             f"{type(output).__name__}")
    outputs = dict(outputs)
    if DEFAULT_SERVING_SIGNATURE_DEF_KEY not in outputs:
        if len(outputs) > 1:
            raise ValueError(
                f"Multiple export_outputs were provided ({sorted(outputs)}), but none of them "
                f"is specified as the default. Name one of them "
                f"{DEFAULT_SERVING_SIGNATURE_DEF_KEY!r}")
        outputs[DEFAULT_SERVING_SIGNATURE_DEF_KEY] = next(iter(outputs.values()))
    return outputs


# -- writing an export ---------------------------------------------------------------
class _ServingModule(torch.nn.Module):
    """The PREDICT path as one module: receiver tensors -> features -> model_fn
    -> predictions (or {signature: outputs}), owning the modules of the model
    scope. `signatures` is set by the first (eager) call."""

    def __init__(self, scope, call_model_fn, features_fn):
        super().__init__()
        self.scope_modules = torch.nn.ModuleList()   # filled once model_fn built them
        self._scope = scope
        self._call = call_model_fn
        self._features_fn = features_fn
        self.signatures: Optional[Dict[str, ExportOutput]] = None
        # {signature: {output: (feature, its value here)}}: string features
        # returned as they are, which the server adds from each request
        self.forwarded: Dict[str, Dict[str, tuple]] = {}

    def _serve(self, inputs: dict):
        scope = self._scope
        with scope, scope.strategy.scope():
            features = self._features_fn(dict(inputs))   # (a function may add to its dict)
            spec = self._call(features, None, ModeKeys.PREDICT)
        if not isinstance(spec, EstimatorSpec) or spec.mode != ModeKeys.PREDICT:
            raise ValueError(f"model_fn in mode 'infer' must return an EstimatorSpec for "
                             f"that mode, got {spec!r:.200}")
        scope.named_tensors.clear()
        self.signatures = _signatures(spec)
        if self.signatures is not None:
            return {name: self._tensors(output.outputs, features, name,
                                        f"export_outputs[{name!r}]")
                    for name, output in self.signatures.items()}
        predictions = spec.predictions
        single = not isinstance(predictions, dict)
        tensors = self._tensors({"predictions": predictions} if single else predictions,
                                features, DEFAULT_SERVING_SIGNATURE_DEF_KEY, "predictions")
        return tensors["predictions"] if single else tensors

    def _tensors(self, outputs: dict, features, signature: str, what: str) -> dict:
        """The tensors of `outputs`; its string features are noted in
        `forwarded` (TF serves them as string outputs; a torch program holds
        no strings), any other value is an error."""
        tensors, forwarded = {}, {}
        named = {id(v): k for k, v in features.items()} if isinstance(features, dict) else {}
        # (the values model_fn was given as _HostFeature: the transformation cache's)
        values = getattr(getattr(features, "transformation_cache", None), "features", {})
        for key, value in outputs.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif id(value) in named:
                forwarded[key] = (named[id(value)], values.get(named[id(value)], value))
            else:
                raise ValueError(f"{what}[{key!r}] is {type(value).__name__}, not a "
                                 "tensor: an export serves tensors, and string features as "
                                 "they came in (leave other string outputs out of the "
                                 "PREDICT spec for export; class names from ids, TF's "
                                 "tf.gather(names, ids): est.export.PredictOutput(outputs, "
                                 "class_names=names, named_outputs={name: ids' key}))")
        if not tensors:
            raise ValueError(f"{what} hold no tensor, only the string features "
                             f"{sorted(forwarded)}: an export needs a tensor to serve")
        if forwarded:
            self.forwarded[signature] = forwarded
        return tensors


def _serving_class(names) -> type:
    """A _ServingModule subclass whose forward takes the receiver tensors as
    named arguments (torch.export records them as the program's inputs)."""
    source = "def forward(self, {args}):\n    return self._serve({{{items}}})\n".format(
        args=", ".join(names), items=", ".join(f"{n!r}: {n}" for n in names))
    namespace: dict = {}
    exec(source, namespace)  # names are checked identifiers
    return type("ServingModule", (_ServingModule,), {"forward": namespace["forward"]})


def is_export_version(name: str) -> bool:
    """Whether a directory name is an export's timestamp (TF's exporters
    count only names of 10 digits as versions)."""
    return len(name) == 10 and name.isdigit()


def _timestamped_dir(export_dir_base: str) -> str:
    """`export_dir_base/<seconds since epoch>` (TF's get_timestamped_export_dir),
    always after every export already there (exporters keep the largest
    numbers), so two exports within a second still sort in order."""
    stamp = int(time.time())
    if os.path.isdir(export_dir_base):
        existing = [int(n) for n in os.listdir(export_dir_base) if is_export_version(n)]
        stamp = max([stamp] + [n + 1 for n in existing])
    return os.path.join(export_dir_base, str(stamp))


def _rename_to_new(temp: str, final: str, export_dir_base: str) -> str:
    """Rename `temp` to `final`, or to the next timestamp where another
    process took `final` meanwhile (TF's get_timestamped_export_dir also
    moves on to the next second); the path it got."""
    for _ in range(10):
        try:
            os.rename(temp, final)
            return final
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        final = _timestamped_dir(export_dir_base)
    raise FileExistsError(errno.EEXIST, "no free timestamped export directory after 10 tries "
                          "(other processes exporting there)", final)


def _describe(tensors: Dict[str, torch.Tensor], batch: Optional[int],
              any_size: Optional[dict] = None) -> list:
    """name, dtype and shape of each tensor; None for the batch and for the
    dimensions `any_size` names ({name: dims})."""
    out = []
    for name, t in tensors.items():
        shape = list(t.shape)
        if batch is not None and shape and shape[0] == batch:
            shape[0] = None
        for i in (any_size or {}).get(name, ()):
            shape[i] = None
        out.append({"name": name, "dtype": str(t.dtype).replace("torch.", ""), "shape": shape})
    return out


def _flat_outputs(outputs, signatures: bool) -> dict:
    """{name: tensor} of what the serving module returns: its predictions, or
    ``<signature>/<key>`` of each signature's outputs."""
    if signatures:
        return {f"{name}/{key}": t for name, sig in outputs.items() for key, t in sig.items()}
    return outputs if isinstance(outputs, dict) else {"predictions": outputs}


def _dynamic_shapes(inputs: dict, dynamic: bool, any_size: dict) -> Optional[dict]:
    """torch.export's dynamic_shapes: the batch, one Dim every input shares,
    and each placeholder's dimensions of any size (Dim.DYNAMIC: export finds
    which of them are equal, and fails where the model fixes one)."""
    if not dynamic and not any_size:
        return None
    batch = torch.export.Dim("batch") if dynamic else None
    shapes = {}
    for name, t in inputs.items():
        dims = {0: batch} if batch is not None and t.dim() else {}
        dims.update((i, torch.export.Dim.DYNAMIC) for i in any_size.get(name, ()))
        shapes[name] = dims or None
    return shapes


def _named_dims(any_size: dict) -> str:
    return ", ".join(f"{name} dimension {i}" for name, dims in any_size.items() for i in dims)


def _varying_dims(program, module, inputs: dict, outputs, any_size: dict) -> dict:
    """{output name: its dimensions that follow the inputs' dimensions of any
    size}: the program run once more with each of those one longer (which
    also proves it serves another size)."""
    if not any_size:
        return {}
    longer = {}
    for name, t in inputs.items():
        for i in any_size.get(name, ()):
            t = torch.cat([t, t.narrow(i, 0, 1)], i)
        longer[name] = t
    try:
        again = program.module()(**longer)
    except Exception as e:
        raise ValueError(f"the exported program does not run with {_named_dims(any_size)} "
                         f"of size {_ANY_SIZE_EXAMPLE + 1} (traced at {_ANY_SIZE_EXAMPLE}): "
                         f"{type(e).__name__}: {e}") from e
    signatures = module.signatures is not None
    before, after = _flat_outputs(outputs, signatures), _flat_outputs(again, signatures)
    return {name: tuple(i for i, (a, b) in enumerate(zip(t.shape, after[name].shape))
                        if a != b)
            for name, t in before.items() if isinstance(t, torch.Tensor)}


def _host_code(error: Exception) -> bool:
    """Whether torch.export failed on host code in the traced path (values
    read into Python or numpy), rather than on a shape."""
    text = str(error)
    return any(sign in text for sign in (
        "not supported for tensor subclasses", "FakeTensor", "data-dependent",
        "GuardOnDataDependentSymNode"))


class _Built(NamedTuple):
    """A serving module ready to trace, with what the export records of it."""
    module: torch.nn.Module
    outputs: Any            # of the module on `inputs`, eagerly
    inputs: dict            # the program's inputs (examples)
    trace_inputs: dict      # what torch.export traces with
    dynamic_shapes: Optional[dict]
    dynamic: bool           # whether the batch size is dynamic
    batch: Optional[int]
    transform: Optional[HostTransform] = None
    client: Optional[list] = None   # the client's inputs described, with a transform


def _tensor_program(receiver, scope, call, any_size: dict) -> _Built:
    """The module of an export whose receiver tensors are the program's inputs."""
    inputs = {n: t.detach().cpu() for n, t in receiver.receiver_tensors.items()}
    batch_sizes = {t.shape[0] for t in inputs.values() if t.dim()}
    dynamic = receiver.dynamic_batch and len(batch_sizes) == 1
    if receiver.dynamic_batch and len(batch_sizes) != 1:
        raise ValueError(f"receiver_tensors must share their first (batch) dimension "
                         f"to export a dynamic batch size; got shapes "
                         f"{ {n: tuple(t.shape) for n, t in inputs.items()} }")
    batch = batch_sizes.pop() if dynamic else None
    if dynamic and batch < 2:   # torch.export specializes sizes 0 and 1
        inputs = {n: _example(t, 2) for n, t in inputs.items()}
        batch = 2
    module = _serving_class(list(inputs))(scope, call, receiver._features_fn())
    try:
        outputs = module._serve(inputs)   # builds and restores the modules (in eval())
    except (RuntimeError, ValueError, IndexError) as e:
        zeros = sorted(n for n, t in inputs.items() if t.numel() and not t.any())
        if zeros:
            e.add_note(f"(raised by model_fn's PREDICT path run by the export on the "
                       f"receiver's example inputs: {', '.join(zeros)} all zeros. Where 0 is "
                       "padding or a length, give est.export.placeholder(..., fill_value=1) "
                       "or an example tensor of real values)")
        raise
    return _Built(module, outputs, inputs, inputs, _dynamic_shapes(inputs, dynamic, any_size),
                  dynamic, batch)


def _trace(built: _Built, scope) -> torch.export.ExportedProgram:
    module = built.module
    module.scope_modules.extend(m for n, m in scope.raw_modules.items()
                                if n not in scope.slots)   # (averages: copy_to'd, or unused)
    module.eval()
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return torch.export.export(module, (), dict(built.trace_inputs),
                               dynamic_shapes=built.dynamic_shapes)


class _HintedKeyError(KeyError):
    def __str__(self):   # (KeyError's shows its argument's repr)
        return str(self.args[0])


def _missing_feature(e: KeyError, receiver) -> Optional[KeyError]:
    """A KeyError from model_fn's PREDICT path whose key the receiver's
    features do not hold (a feature named otherwise than in training, most
    likely): the error with both sides named; None for another."""
    features = receiver.features
    if not isinstance(features, dict) or len(e.args) != 1 or e.args[0] in features:
        return None
    error = _HintedKeyError(
        f"model_fn's PREDICT path raised KeyError({e.args[0]!r}); the "
        f"serving_input_receiver_fn's features are {sorted(features)}. If {e.args[0]!r} is "
        "a feature, the receiver must name its features as the training input_fn names them")
    error.__cause__ = e
    return error


def _packs_a_sequence(e: Exception) -> bool:
    """Whether `e` was raised packing a sequence (`pack_padded_sequence`) or
    in an RNN module given a packed one."""
    rnn = os.path.join("nn", "modules", "rnn.py")
    tb = e.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in ("pack_padded_sequence", "pack_sequence") or (
                frame.f_code.co_filename.endswith(rnn)
                and frame.f_locals.get("batch_sizes") is not None):
            return True
        tb = tb.tb_next
    return False


def _trace_error(e: Exception, path: str, dynamic: bool, any_size: dict) -> ValueError:
    if _packs_a_sequence(e):
        hint = (" model_fn's PREDICT path packs a sequence (pack_padded_sequence), which "
                "torch.export cannot trace at any size: in PREDICT run the RNN on the padded "
                "batch instead (padding at the end: a unidirectional RNN's outputs up to each "
                "length are the packed ones, its last state the output at `lengths - 1`, "
                "`outputs.gather(1, ...)`; "
                "a bidirectional one's backward direction runs on each sequence reversed "
                "within its length).")
    elif _host_code(e):
        hint = (" model_fn's PREDICT path computes on a tensor's values in Python or "
                "numpy (`.numpy()`, `.item()`, `.tolist()`, a shape that depends on "
                "the values), which torch.export cannot trace; do it with torch ops, or "
                "in feature columns.")
    elif dynamic:
        hint = (" If model_fn depends on the batch size, export a fixed one with "
                "build_raw_serving_input_receiver_fn(..., default_batch_size=N) or "
                "ServingInputReceiver(..., dynamic_batch=False).")
    else:
        hint = ""
    if any_size:
        hint += (f" A placeholder's dimension given as None ({_named_dims(any_size)})"
                 f" must stay of any size in model_fn's PREDICT path; give its size "
                 f"where the model needs one.")
    return ValueError(f"torch.export could not trace model_fn's PREDICT path from "
                      f"{path}: {type(e).__name__}: {e}.{hint}")


def export_saved_model(estimator, export_dir_base: str, serving_input_receiver_fn: Callable,
                       assets_extra: Optional[dict] = None, as_text: bool = False,
                       checkpoint_path: Optional[str] = None) -> str:
    """Export the PREDICT path of `estimator` at `checkpoint_path` (the latest by
    default) to a new `export_dir_base/<timestamp>` directory; returns its path
    (tf.estimator.Estimator.export_saved_model)."""
    if not callable(serving_input_receiver_fn):
        raise TypeError(f"serving_input_receiver_fn must be callable, got "
                        f"{serving_input_receiver_fn!r}")
    export_dir_base = os.fsdecode(export_dir_base)
    if os.path.exists(export_dir_base) and not os.path.isdir(export_dir_base):
        raise ValueError(f"export_dir_base {export_dir_base!r} is a file, not a directory "
                         "(exports go into timestamped directories under it)")
    path, state = estimator._checkpoint_to_read(checkpoint_path, "export")
    if path is None and estimator._warm_start_settings is None:
        raise ValueError(f"Couldn't find trained model at {estimator.model_dir}.")
    receiver = serving_input_receiver_fn()
    if not isinstance(receiver, ServingInputReceiver):
        raise TypeError(f"serving_input_receiver_fn must return a ServingInputReceiver, got "
                        f"{type(receiver).__name__}")
    strategy = distribute.OneDeviceStrategy("cpu")
    if path is not None:
        scope = model_scope.ModelScope(ModeKeys.PREDICT, strategy, restore=state,
                                       restore_path=path)
        source = os.path.basename(path)
    else:   # TF exports what it warm-starts from when model_dir has no checkpoint
        scope, warm = estimator._initial_scope(ModeKeys.PREDICT, strategy)
        path = warm.path
        source = f"the model warm-started from {path}"
    call = estimator._call_model_fn
    any_size = {n: dims for n, t in receiver.receiver_tensors.items()
                if (dims := _any_size_of(t))}
    with torch.no_grad():
        host = receiver._takes_host_values
        if host and any_size:
            raise ValueError(f"receiver_tensors {sorted(any_size)}: a placeholder's "
                             f"dimensions of any size past the batch are not exported with "
                             f"string or tf.Example inputs")
        try:
            with DropoutWatch() as watch:   # (functional dropout left on: a random model)
                built = _host_program(receiver, scope, call) if host else _tensor_program(
                    receiver, scope, call, any_size)
        except KeyError as e:
            raise _missing_feature(e, receiver) or e
        watch.warn("The export (its served outputs would be random)")
        try:
            program = _trace(built, scope)
        except Exception as e:
            if host or any_size or not _host_code(e) or not isinstance(
                    receiver.features, dict) and not callable(receiver.features):
                raise _trace_error(e, path, built.dynamic, any_size) from e
            # Feature columns reading integer ids on the host (numpy): that work
            # moves to the host transform, as for rows or strings.
            logger.info("model_fn's PREDICT path reads the receiver tensors' values on the "
                        "host (feature columns on integer ids); the export runs that part "
                        "before the program, as for rows or strings")
            built = _host_program(receiver, scope, call)
            try:
                program = _trace(built, scope)
            except Exception as again:
                raise _trace_error(again, path, built.dynamic, any_size) from again
        module, outputs, inputs = built.module, built.outputs, built.inputs
        transform, client, dynamic, batch = (built.transform, built.client, built.dynamic,
                                             built.batch)
        if transform is not None:
            _fix_steps(program, built.trace_inputs, transform,
                       getattr(receiver, "template_steps", False))
        varying = _varying_dims(program, module, inputs, outputs, any_size)

    batch_dim = batch if dynamic else None
    predictions = _flat_outputs(outputs, module.signatures is not None)
    if module.signatures is None:
        signatures = {DEFAULT_SERVING_SIGNATURE_DEF_KEY: {
            "method_name": PredictOutput.method_name,
            "outputs": _describe(predictions, batch_dim, varying)}}
    else:
        signatures = {name: {"method_name": output.method_name,
                             "outputs": _describe(outputs[name], batch_dim, {
                                 key: varying.get(f"{name}/{key}", ())
                                 for key in outputs[name]}),
                             **({"class_names": output.class_names}
                                if output.class_names is not None else {}),
                             **({"named_outputs": output.named_outputs}
                                if output.named_outputs else {})}
                      for name, output in module.signatures.items()}
    for name, forwarded in module.forwarded.items():   # string features, served as given
        signatures[name]["outputs"] += [
            {"name": key, "dtype": "string", "shape": [None, *np.shape(value)[1:]]}
            for key, (_, value) in forwarded.items()]
        signatures[name]["forwarded"] = {key: feature for key, (feature, _) in forwarded.items()}
    signature = {
        "format": "torch.export",
        "program": PROGRAM,
        "call": "torch.export.load(program).module()(**inputs)",
        "inputs": client if client is not None else _describe(inputs, batch_dim, any_size),
        "program_inputs": _describe(inputs, batch_dim, any_size),
        "host_transform": transform is not None,
        "outputs": _describe(predictions, batch_dim, varying),
        "outputs_are_dict": isinstance(outputs, dict),
        "outputs_are_signatures": module.signatures is not None,
        "signatures": signatures,
        "dynamic_batch": dynamic,
        "global_step": scope.global_step,
        "checkpoint": os.path.basename(path),
        "torch_version": torch.__version__,
    }
    os.makedirs(export_dir_base, exist_ok=True)
    final = _timestamped_dir(export_dir_base)
    # This process's own temp directory: several processes (every rank of a
    # torchrun job) may export into one export_dir_base at once.
    temp = os.path.join(export_dir_base,
                        f"temp-{os.path.basename(final)}-{uuid.uuid4().hex[:12]}")
    os.makedirs(temp)
    try:
        serialized = io.BytesIO()   # (torch's archive writer, failing on a full disk,
        torch.export.save(program, serialized)   # aborts the process from its destructor)
        with open(os.path.join(temp, PROGRAM), "wb") as f:
            f.write(serialized.getbuffer())
        del serialized
        with open(os.path.join(temp, SIGNATURE), "w") as f:
            json.dump(signature, f, indent=2)
        if as_text:
            with open(os.path.join(temp, "model.txt"), "w") as f:
                f.write(str(program))
        if assets_extra:
            _copy_assets(assets_extra, os.path.join(temp, "assets.extra"))
        if transform is not None:
            transform.save(temp)
        final = _rename_to_new(temp, final, export_dir_base)
    except BaseException as e:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(e, OSError):   # a full disk, a file size limit: name the export
            where = f" ({e.filename})" if e.filename else ""
            raise OSError(e.errno, f"{e.strerror or e}{where} writing the export {final} "
                                   "(nothing was exported; the temp directory is "
                                   "removed)") from e
        raise
    logger.info("Exported %s (global step %d) to %s", source, scope.global_step, final)
    return final


class _ServingFeatures(dict):
    """The features model_fn gets in an export with a host transform: the
    feature dict, with the transformation cache (recording or replaying) the
    feature-column layers use, which read the strings (rows, Examples) per
    request; model_fn itself gets each such feature as a `_HostFeature`."""

    def __init__(self, cache):
        super().__init__((k, v if isinstance(v, torch.Tensor) else _HostFeature(k, v))
                         for k, v in cache.features.items())
        self.transformation_cache = cache
        self._given = {k: (v, _version(v)) for k, v in self.items()}

    def changed(self) -> dict:
        """The features model_fn set, replaced or changed in place since: the
        layers read these (the cache holds the receiver's), where torch
        computes them."""
        return {k: v for k, v in self.items() if k not in self._given
                or self._given[k][0] is not v or self._given[k][1] != _version(v)}


def _version(value) -> Optional[int]:
    """A tensor's count of in-place changes (`features["id"] -= 1` keeps the object)."""
    return value._version if isinstance(value, torch.Tensor) else None


class _HostFeatureUsed(TypeError):
    """model_fn used a `_HostFeature` (TF: a string tensor in Python code)."""


class _HostFeature:
    """A string (or row, or parsed Example) feature as model_fn sees it while
    an export records its PREDICT path: it may be forwarded as an output, and
    feature columns read it (per request, from the transformation cache);
    any other use is an error. An export runs model_fn once, so ids that
    Python computed from the example strings (`vocab.index(s) for s in ...`)
    were fixed into the program: every request answered as for the example."""

    __slots__ = ("_key", "_kind", "sparse")
    __hash__ = object.__hash__
    is_host_feature = True   # (EstimatorSpec and export outputs take it as strings: forwarded)

    def __init__(self, key, value):
        self._key, self._kind = key, type(value)
        self.sparse = isinstance(value, list) and bool(value) and isinstance(
            value[0], (list, tuple))   # rows of values (a VarLenFeature's)

    @property
    def __class__(self):   # (isinstance(feature, np.ndarray) answers for its value)
        return self._kind

    def __repr__(self):
        return f"<the string feature {self._key!r} of an export>"

    def _refuse(self, *args, **kwargs):
        raise _HostFeatureUsed(
            f"model_fn uses the string feature {self._key!r} itself while it is exported: "
            "an export runs model_fn once, so what Python computes from the example's "
            "strings (ids from a vocabulary, lengths) would be fixed into the program and "
            "every request answered as for the example. Map strings to ids with "
            "est.feature_column (categorical_column_with_vocabulary_list / _file / "
            "_hash_bucket, then embedding_column or indicator_column in input_layer), which "
            "an export redoes per request, or give the export the ids (a serving_input_"
            "receiver_fn of integer tensors); forwarding the feature as an output is fine. "
            "Text split into words in Python (TF's string_split in a receiver) cannot be "
            "exported: receive the words (a list of strings per example, for a vocabulary "
            "column) or their ids. "
            "(Feature columns given a new dict made from `features` read the strings here "
            "too: give them `features` itself)")

    def __getattr__(self, name):
        self._refuse()

    refuse = _refuse   # (feature columns given it in a dict of model_fn's own)
    __iter__ = __len__ = __getitem__ = __contains__ = __bool__ = __array__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __add__ = __radd__ = _refuse


_BATCH_KEYS = ("offsets", "scale", "value")   # record tensors with one row per example


def _host_program(receiver, scope, call):
    """An export whose inputs are strings, rows or serialized Examples (or
    integer ids that feature columns read on the host): the PREDICT path run
    once recording the feature columns' host-side work, then a module whose
    inputs are the numeric features and that work's tensors (replayed), and
    the `HostTransform` that redoes it per request."""
    features_fn = None   # a callable's path: the server computes the features per request
    if callable(receiver.features) and receiver.parse_spec is None:
        features_fn = recorded.function_path(receiver.features)
        if features_fn is not None and features_fn.startswith("__main__:"):
            logger.warning("the ServingInputReceiver's features %s is recorded from __main__: "
                           "only this program can import it; a server (estimator serve) needs "
                           "it in a module on its sys.path", features_fn)
        if features_fn is None:
            raise ValueError(
                f"the ServingInputReceiver's features {receiver.features!r} must be a "
                "module-level function (importable by module path, as TF1's add_engineered "
                "of a trainer package), not a lambda or a function made inside "
                "serving_input_fn: with strings, or feature columns that read the features "
                "on the host (crosses, lookups), the server computes the features from each "
                "request's receiver tensors by calling it")
    raw = {n: (t.detach().cpu() if isinstance(t, torch.Tensor) else t)
           for n, t in receiver.receiver_tensors.items()}
    if receiver.dynamic_batch:   # torch.export specializes sizes 0 and 1
        raw = {n: _example(v, 2) if isinstance(v, torch.Tensor) and len(v) < 2 else v
               for n, v in raw.items()}
    if receiver.dynamic_batch and any(len(v) < 2 for v in raw.values()):
        raise ValueError("the example serving inputs need at least 2 rows to export a "
                         "dynamic batch size (torch.export fixes sizes 0 and 1)")
    try:
        features = receiver._features_fn()(dict(raw))   # (a function may add to its dict)
    except Exception as e:
        if features_fn is not None:
            e.add_note(f"(raised by the receiver's features function {features_fn}, which the "
                       f"export runs on the receiver's example inputs "
                       f"({', '.join(sorted(raw))}): give examples it can take, an encoded "
                       "image where it decodes one)")
        raise
    if not isinstance(features, dict):
        raise ValueError("an export taking strings or serialized Examples needs features "
                         f"as a dict, got {type(features).__name__}")
    numeric = {}
    for key, value in features.items():
        if isinstance(value, torch.Tensor):
            numeric[key] = value.detach().cpu()
        elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            numeric[key] = torch.from_numpy(np.ascontiguousarray(value))
    host = {k: v for k, v in features.items() if k not in numeric}
    # a feature whose name is no Python parameter name (`marital-status`,
    # TF's feature keys) is a program input under another name
    renamed, taken = {}, set(numeric)
    for key in numeric:
        if not _parameter_name(key):
            renamed[key] = next(n for n in (f"feature_{i}" for i in itertools.count())
                                if n not in taken)
            taken.add(renamed[key])
    program = {renamed.get(k, k): k for k in numeric}   # program input -> feature
    recorder = recorded.Recorder({**host, **numeric})
    _ServingModule(scope, call, lambda _: _ServingFeatures(recorder))._serve({})
    records = [recorded.to_json(record) for record, _ in recorder.records]
    keys = [list(tensors) for _, tensors in recorder.records]
    inputs = {name: numeric[k] for name, k in program.items()}
    for i, (_, tensors) in enumerate(recorder.records):
        inputs.update((HostTransform.input_name(i, k), t) for k, t in tensors.items()
                      if t is not None)
    transform = HostTransform(receiver.parse_spec,
                              {k: str(t.dtype).replace("torch.", "") for k, t in numeric.items()},
                              records, keys, features_fn, renamed)
    _check_redone(transform, raw, inputs, recorder.records)

    def features_fn(program_inputs):
        tensors = [{k: program_inputs.get(HostTransform.input_name(i, k)) for k in record_keys}
                   for i, record_keys in enumerate(keys)]
        current = {**host, **{k: program_inputs[name] for name, k in program.items()}}
        return _ServingFeatures(recorded.Replayer(current, tensors, records))

    module = _serving_class(list(inputs))(scope, call, features_fn)
    outputs = module._serve(inputs)   # replayed eagerly: the same work is asked for
    batch = torch.export.Dim("batch") if receiver.dynamic_batch else None
    trace_inputs, shapes, id_dims = {}, {}, {}
    for name, t in inputs.items():
        key = name.split("_", 1)[1] if name not in program else None
        steps = key is not None and records[int(name[1:].split("_", 1)[0])]["kind"] == \
            "sequence" and key != "lengths" and t.dim() > 1   # ([batch, T, ...])
        if steps and t.shape[1] < 2:
            raise ValueError(
                "the example serving inputs need a sequence of at least 2 steps to export a "
                "sequence_input_layer (torch.export fixes sizes 0 and 1): give the receiver "
                "examples rows of 2 steps or more")
        if name in program or key in _BATCH_KEYS or key == "lengths" or steps:
            trace_inputs[name] = t
            dims = {0: batch} if t.dim() and batch is not None else {}
            if steps:   # (T: any number of steps, unless the model fixes it: _fix_steps)
                dims[1] = torch.export.Dim.AUTO
            shapes[name] = dims or None
        else:   # ids / weights: as many as the batch holds (traced from 2 at least)
            index = name.split("_", 1)[0]
            trace_inputs[name] = t if len(t) >= 2 else torch.ones(3, dtype=t.dtype)
            shapes[name] = {0: id_dims.setdefault(index, torch.export.Dim(f"ids_{index}"))}
    # (a list of rows: a variable number of strings per example, [batch, any])
    client = [{"name": n, **_client_dtype(v),
               "shape": [None] + (list(v.shape[1:]) if isinstance(v, (torch.Tensor, np.ndarray))
                                  else [None]),
               **({"python_type": kind} if receiver.parse_spec is None
                  and (kind := _string_kind(v)) else {})}
              for n, v in raw.items()]
    return _Built(module, outputs, inputs, trace_inputs, shapes, receiver.dynamic_batch,
                  len(next(iter(raw.values()))), transform, client)


def _fix_steps(program, inputs: dict, transform: HostTransform, template: bool) -> None:
    """The sequence records whose steps the traced model fixed (an RNN:
    torch.export keeps an nn.LSTM's length as traced) keep them: a server
    pads each request's sequences to the example's longest, and refuses
    longer ones (`sequence_input_layer`). Where the examples are a parsing
    receiver's made-up ones (`template`), that length was never chosen:
    an error asks for it."""
    shapes = {n.name: n.meta["val"].shape for n in program.graph.nodes
              if n.op == "placeholder" and "val" in n.meta}
    features = set(transform.numeric) | set(transform.program_names.values())
    for name, node in zip(inputs, program.graph_signature.user_inputs):
        index, _, key = name[1:].partition("_")
        if name in features or key == "lengths":
            continue
        record = transform.records[int(index)]
        shape = shapes.get(node, ())
        if record["kind"] == "sequence" and len(shape) > 1 and is_concrete_int(shape[1]):
            if template:
                raise ValueError(
                    "model_fn fixes the number of steps of its sequence_input_layer when "
                    "traced (an RNN does: torch.export keeps its length), so this export "
                    "would serve only the parsing receiver's made-up sequences of 2 values: "
                    "give build_parsing_serving_input_receiver_fn(..., max_sequence_length=N), "
                    "the longest sequence it serves (shorter ones are padded)")
            transform.fix_steps(int(index), int(shape[1]))


def _client_dtype(value) -> dict:
    """How a server takes a receiver input: its dtype, and for rows of
    numbers (a list of lists: a VarLenFeature's, a sequence's) "rows"."""
    if not is_host_value(value):
        return {"dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, (list, tuple)):
        leaves = list(_leaves_of(value))
        if leaves and all(isinstance(v, (int, float, np.integer, np.floating))
                          and not isinstance(v, (bool, np.bool_)) for v in leaves):
            floating = any(isinstance(v, (float, np.floating)) for v in leaves)
            return {"dtype": "float32" if floating else "int64", "rows": True}
    return {"dtype": "string"}


def _leaves_of(values):
    for value in values:
        if isinstance(value, (list, tuple, np.ndarray, torch.Tensor)):
            yield from _leaves_of(value.tolist() if isinstance(value, (np.ndarray, torch.Tensor))
                                  else value)
        else:
            yield value


def _parameter_name(name: str) -> bool:
    """Whether `name` can be a parameter of the program's generated
    `forward(self, ...)` as it is (Python rewrites `µg` to `μg`: NFKC)."""
    return (name.isidentifier() and not keyword.iskeyword(name) and name != "self"
            and unicodedata.normalize("NFKC", name) == name)


def _string_kind(value) -> Optional[str]:
    """"bytes" or "str": what a string input's example holds
    (``placeholder(bytes)``, ``placeholder(str)``), which a server hands
    the receiver's function whatever the request's JSON (TF's tf.string
    holds either); None for another input."""
    while isinstance(value, (list, tuple, np.ndarray)) and len(value):
        value = value[0]
    return "bytes" if isinstance(value, bytes) else "str" if isinstance(value, str) else None


def _check_redone(transform: HostTransform, raw: dict, inputs: dict, records) -> None:
    """What a server will compute from ``transform.json`` equals what the
    model computed, or the export fails naming the column (a function the
    record cannot keep, such as a lambda normalizer_fn a cross needs)."""
    try:
        redone = transform.program_inputs(raw)
    except Exception as e:
        raise ValueError(f"the export's feature transform cannot be redone from what it "
                         f"records: {type(e).__name__}: {e}") from e
    for name, tensor in inputs.items():
        if not torch.equal(redone[name], tensor):
            index = (int(name[1:].split("_", 1)[0]) if name not in transform.numeric
                     and name not in transform.program_names.values() else None)
            what = (", ".join(c.name for c in _record_columns(records[index][0]))
                    if index is not None else name)
            raise ValueError(f"the export's feature transform of {what} cannot be redone "
                             "from what it records (a normalizer_fn that is a lambda or a "
                             "local function? give a module-level function)")


def _record_columns(record) -> tuple:
    return record[1] if record[0] in ("linear", "sequence") else (record[1],)


def _copy_assets(assets_extra: dict, dest_dir: str) -> None:
    """{destination relative path: source path}, as TF's assets_extra."""
    if not isinstance(assets_extra, dict):
        raise TypeError(f"assets_extra must be a dict {{destination: source}}, got "
                        f"{type(assets_extra).__name__}")
    for dest, source in assets_extra.items():
        target = os.path.normpath(os.path.join(dest_dir, dest))
        if not target.startswith(os.path.normpath(dest_dir) + os.sep):
            raise ValueError(f"assets_extra destination {dest!r} leaves the export directory")
        if not os.path.isfile(source):
            raise ValueError(f"assets_extra[{dest!r}]: source file {source!r} does not exist")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)


# -- loading an export ---------------------------------------------------------------------
class LoadedExport:
    """An export loaded for serving (TF: `tf.saved_model.load(dir)`):
    `signatures[name](**inputs)` -> {output key: tensor}; calling the object
    runs the program as it is. An export taking strings or serialized
    Examples takes them here (its ``transform.json`` runs first, see
    `host_transform`); a numeric one needs torch alone."""

    def __init__(self, export_dir: str):
        def read(name: str, load: Callable):
            path = os.path.join(export_dir, name)
            try:
                return load(path)
            except (OSError, ValueError, KeyError, RuntimeError, zipfile.BadZipFile) as e:
                if "module '__main__'" in str(e):   # (export warned: a receiver's function)
                    raise ValueError(
                        f"{path} names a function the exporting program defined in its "
                        f"__main__ ({e}), which a server cannot import: define it in a module "
                        "on the server's sys.path and export the model again") from e
                raise ValueError(f"{path} cannot be read: it is damaged or not written by "
                                 f"export_saved_model ({type(e).__name__}: {e}); export the "
                                 "model again") from e
        self.signature = read(SIGNATURE, _read_signature)
        self.program = read(self.signature.get("program", PROGRAM),
                            lambda path: torch.export.load(path).module())
        self.transform = read(host_transform.TRANSFORM,
                              lambda path: HostTransform.load(export_dir))
        if self.signature.get("host_transform") and self.transform is None:
            raise ValueError(f"{os.path.join(export_dir, host_transform.TRANSFORM)} is "
                             f"missing: {SIGNATURE} says the program's inputs are made by it "
                             "(a copy of the export without it?); export the model again")
        described = self.signature.get("signatures") or {
            DEFAULT_SERVING_SIGNATURE_DEF_KEY: {"outputs": self.signature["outputs"]}}
        self.signatures = {name: self._signature_fn(name) for name in described}

    def _signature_fn(self, name: str) -> Callable:
        by_signature = self.signature.get("outputs_are_signatures", False)
        as_dict = self.signature.get("outputs_are_dict", True)
        described = (self.signature.get("signatures") or {}).get(name, {})
        forwarded = described.get("forwarded")
        # TF's classify and regress signatures name their serialized Examples
        # `inputs` (the receiver's name, `examples`, is the predict signature's)
        methods = (ClassificationOutput.method_name, RegressionOutput.method_name)
        takes_inputs = (described.get("method_name") in methods and self.transform is not None
                        and self.transform.parse_spec is not None)

        def serve(**inputs) -> Dict[str, Any]:
            """{output: tensor}; a string feature forwarded as it is: bytes."""
            if takes_inputs and set(inputs) == {"inputs"}:
                inputs = {EXAMPLES: inputs["inputs"]}
            outputs, features = self._run(inputs)
            if by_signature:
                outputs = outputs[name]
            elif not as_dict:
                outputs = {"output": outputs}
            if forwarded:
                outputs = {**outputs, **{key: host_transform.as_bytes(features[feature])
                                         for key, feature in forwarded.items()}}
            return outputs
        return serve

    def __call__(self, **inputs):
        """The program on `inputs`: for an export with a host transform, the
        client's inputs (strings, or ``examples`` to parse) go through it first."""
        return self._run(inputs)[0]

    def _run(self, inputs: dict) -> tuple:
        """(the program's outputs, the features it was given)."""
        if self.transform is None:
            inputs = _as_declared(inputs, self.signature["inputs"])
            return self.program(**inputs), inputs
        for spec in self.signature["inputs"]:
            if spec["dtype"] == "string" and spec["name"] in inputs:
                _check_nesting(spec["name"], inputs[spec["name"]], spec["shape"])
                if spec.get("python_type"):   # (str or bytes, as the receiver's example)
                    inputs = {**inputs, spec["name"]: _as_kind(
                        inputs[spec["name"]], spec["python_type"], spec["name"])}
        features = self.transform.features(inputs)
        return self.program(**self.transform.program_inputs(inputs, features)), features


def _as_declared(inputs: dict, specs: list) -> dict:
    """`inputs` as the signature declares them, as TF's signature function
    binds its TensorSpecs: numpy arrays and lists converted to the declared
    dtype; a tensor of another dtype, a shape that does not fit, or inputs
    named otherwise a TypeError naming them (torch's errors named none:
    "'int' object is not callable" for numpy, a matmul's dtypes)."""
    declared = {spec["name"]: spec for spec in specs}
    if set(inputs) != set(declared):
        raise TypeError(f"the signature takes the inputs {sorted(declared)}, got "
                        f"{sorted(inputs)}")
    out = {}
    for name, value in inputs.items():
        spec = declared[name]
        dtype = getattr(torch, spec["dtype"])
        if not isinstance(value, torch.Tensor):
            value = _converted(name, value, spec["dtype"], dtype)
        elif value.dtype != dtype:
            raise TypeError(f"input {name!r} was expected to be a {spec['dtype']} tensor but is "
                            f"a {str(value.dtype).replace('torch.', '')} tensor (numpy and "
                            "lists are converted)")
        shape = spec["shape"]
        if value.dim() != len(shape) or any(d is not None and d != n
                                            for d, n in zip(shape, value.shape)):
            raise TypeError(f"input {name!r} has shape {list(value.shape)}, where the signature "
                            f"takes {shape} (None: any size)")
        out[name] = value
    return out


def _converted(name: str, value, declared: str, dtype: torch.dtype) -> torch.Tensor:
    """numpy or a list as a tensor of the declared dtype; a TypeError naming
    the input for values it cannot hold: not numbers, a fraction, NaN or a
    number out of range for an integer, other than 0/1 for a bool, a finite
    number past a float's range (float64 rounding to float32 is taken, as
    TF takes it)."""
    try:
        source = torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"input {name!r} ({declared}) cannot be made a tensor: {e}") from None
    if source.is_complex():
        raise TypeError(f"input {name!r} ({declared}): expected real numbers, got {source.dtype}")
    converted = source.to(dtype)
    problem = None
    if source.numel() and dtype == torch.bool and source.dtype != torch.bool:
        problem = None if ((source == 0) | (source == 1)).all() else "a value not 0, 1 or a bool"
    elif source.numel() and not dtype.is_floating_point and dtype != torch.bool:
        info = torch.iinfo(dtype)
        if source.is_floating_point() and not (torch.isfinite(source).all()
                                               and (source == source.round()).all()):
            problem = "a fraction, NaN or infinity"
        elif source.is_floating_point() and (source.min() < info.min or source.max() >= float(
                info.max + 1)) or not source.is_floating_point() and (
                source.min() < info.min or source.max() > info.max):   # (2**k: exact floats)
            problem = f"a number outside [{info.min}, {info.max}]"
    elif source.numel() and dtype.is_floating_point and (
            torch.isfinite(source) & ~torch.isfinite(converted)).any():
        problem = f"a number past {declared}'s range"
    if problem is not None:
        raise TypeError(f"input {name!r} ({declared}) cannot hold its values without loss: "
                        f"{problem}")
    return converted


def _as_kind(values, kind: str, name: str):
    """A string input's values (rows of them too) as `kind`: str as utf-8
    bytes, or bytes as utf-8 text (a ValueError naming the input where they
    are not)."""
    if isinstance(values, list):
        return [_as_kind(v, kind, name) for v in values]
    if isinstance(values, np.ndarray):
        if values.dtype.kind == ("U" if kind == "str" else "S"):
            return values   # (all of that kind already)
        if kind == "str" and values.dtype.kind == "S":   # (decoded at once: 20k in 3 ms)
            try:
                return np.char.decode(values, "utf-8")
            except UnicodeDecodeError:
                pass   # (said, naming the input, by the conversion one by one)
        out = values.astype(object)   # (a copy: the caller's array is left as it was)
        flat = out.reshape(-1)
        for i, value in enumerate(flat):
            flat[i] = _as_kind(value, kind, name)
        return out
    if kind == "bytes" and isinstance(values, str):
        return values.encode("utf-8")
    if kind == "str" and isinstance(values, bytes):
        try:
            return values.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"input {name!r} is text (exported from a str placeholder), and a "
                             f"value given as bytes is not utf-8 ({e}); export it from "
                             "est.export.placeholder(bytes, ...) to take binary data") from None
    return values


def _check_nesting(name: str, values, shape: list) -> None:
    """A string input nested as its export declares (TF checks a signature's
    inputs against its TensorSpecs): one string per example for shape
    [batch], a list per example for [batch, n]. A sentence given where a list
    of words was declared was taken as one (unknown) word."""
    if type(values).__module__.startswith("pandas"):   # (a Series or Index: its values)
        values = values.to_numpy()
    if isinstance(values, np.ndarray) and values.dtype.kind in "US":
        if values.ndim != len(shape) or any(
                want is not None and want != got for want, got in zip(shape[1:], values.shape[1:])):
            raise ValueError(f"input {name!r}: expected shape {_shape_words(shape)}, got "
                             f"{list(values.shape)}")
        return
    if not isinstance(values, (list, tuple, np.ndarray)) or (
            isinstance(values, np.ndarray) and values.ndim == 0):
        raise ValueError(f"input {name!r}: expected a list of values, one per example "
                         f"(shape {_shape_words(shape)}), got {type(values).__name__}")
    for i, row in enumerate(values):
        found = _misnested(row, shape[1:], f"[{i}]")
        if found is not None:
            where, what = found
            raise ValueError(f"input {name!r}{where}: {what}; the input's shape is "
                             f"{_shape_words(shape)}")


def _misnested(value, shape: list, where: str) -> Optional[tuple]:
    """(where, how) `value` is not nested as `shape` (the dimensions under the
    batch's); None where it is."""
    is_list = isinstance(value, (list, tuple, np.ndarray))
    if not shape:
        if is_list:
            return where, ("expected one string per example, got a list"
                           if where.count("[") == 1 else "expected a string, got a list")
        return None
    if not is_list:
        return where, f"expected a list of values, got {type(value).__name__} {value!r:.60}"
    if shape[0] is not None and len(value) != shape[0]:
        return where, f"expected {shape[0]} values, got {len(value)}"
    for j, item in enumerate(value):
        found = _misnested(item, shape[1:], f"{where}[{j}]")
        if found is not None:
            return found
    return None


def _shape_words(shape: list) -> str:
    return "[" + ", ".join("batch" if i == 0 else "any" if d is None else str(d)
                           for i, d in enumerate(shape)) + "]"


def _read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _read_signature(path: str) -> dict:
    """signature.json, checked to hold what loading reads (ValueError else)."""
    signature = _read_json(path)
    if not isinstance(signature, dict) or not isinstance(signature.get("inputs"), list) or not (
            isinstance(signature.get("outputs"), list) or isinstance(
                signature.get("signatures"), dict)) or not all(
            isinstance(i, dict) and {"name", "dtype", "shape"} <= set(i)
            for i in signature["inputs"]):
        raise ValueError("it is not an export's signature (its inputs, each with name, "
                         "dtype and shape, and its outputs or signatures)")
    return signature


def load(export_dir: str) -> LoadedExport:
    """Load the export in `export_dir` (a directory `export_saved_model` wrote)."""
    if not os.path.isfile(os.path.join(export_dir, SIGNATURE)):
        raise ValueError(f"{export_dir!r} is not an export: it has no {SIGNATURE}")
    return LoadedExport(export_dir)
