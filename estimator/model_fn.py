"""EstimatorSpec: what a model_fn returns (tf.estimator.EstimatorSpec).

Validated at construction, as TF's namedtuple is, so a wrong spec fails at the
line that built it, before the framework applies or writes anything.
"""
from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Callable, Dict, Optional, Sequence

import torch

from hooks.mode_keys import ModeKeys
from hooks.scaffold import check_scaffold

from ._checks import is_host_feature

_Tensor, _Optimizer, _TRAIN = torch.Tensor, torch.optim.Optimizer, ModeKeys.TRAIN


class EstimatorSpec:
    """The ops and objects a `model_fn` returns.

    - `predictions`: a tensor or dict of tensors (PREDICT needs it); a value
      may also be strings (a numpy str array or a list of str/bytes: class
      names from a label vocabulary, a forwarded key).
    - `loss`: a scalar tensor (TRAIN and EVAL need it; one of shape [1] or
      [1, 1] is made a scalar, as TF's).
    - `train_op`: an optimizer from `est.get_optimizer` (the framework
      back-propagates `loss`, steps it and increments the global step) or a
      callable doing a custom step (several optimizers, a GAN); TRAIN needs it.
    - `eval_metric_ops`: {name: metric from `est.metrics`}.
    - `training_hooks`, `training_chief_hooks`, `evaluation_hooks`,
      `prediction_hooks`: SessionRunHooks for that mode.
    - `export_outputs`: {signature name: `est.export.PredictOutput` /
      `ClassificationOutput` / `RegressionOutput`}, the serving signatures of
      an export (see `estimator.export`).
    - `scaffold`: accepted for source compatibility, empty (there is no
      graph or tf.Session to initialize); one with an `init_fn`, `saver`
      or ops set is refused, naming them and the way round.
    """

    __slots__ = ("mode", "predictions", "loss", "train_op", "eval_metric_ops",
                 "export_outputs", "training_chief_hooks", "training_hooks",
                 "scaffold", "evaluation_hooks", "prediction_hooks")

    def __init__(self, mode: str, predictions=None, loss: Optional[torch.Tensor] = None,
                 train_op=None, eval_metric_ops: Optional[Dict[str, Any]] = None,
                 export_outputs=None, training_chief_hooks: Sequence = (),
                 training_hooks: Sequence = (), scaffold=None,
                 evaluation_hooks: Sequence = (), prediction_hooks: Sequence = ()):
        if not (mode == _TRAIN and isinstance(train_op, _Optimizer)   # the usual spec,
                and isinstance(loss, _Tensor) and loss.dim() == 0     # checked first
                and eval_metric_ops is None and export_outputs is None):
            _validate(mode, predictions, loss, train_op, eval_metric_ops, export_outputs)
            if isinstance(loss, _Tensor) and loss.dim():   # one element: TF reshapes it to []
                loss = loss.reshape(())
        self.mode = mode
        self.predictions = predictions
        self.loss = loss
        self.train_op = train_op
        self.eval_metric_ops = eval_metric_ops or {}
        self.export_outputs = export_outputs
        self.training_chief_hooks = tuple(training_chief_hooks) if training_chief_hooks else ()
        self.training_hooks = tuple(training_hooks) if training_hooks else ()
        if scaffold is not None:
            check_scaffold(scaffold, "EstimatorSpec")
        self.scaffold = scaffold
        self.evaluation_hooks = tuple(evaluation_hooks) if evaluation_hooks else ()
        self.prediction_hooks = tuple(prediction_hooks) if prediction_hooks else ()

    def _replace(self, **kwargs) -> "EstimatorSpec":
        if "mode" in kwargs and kwargs["mode"] != self.mode:
            raise ValueError("mode of EstimatorSpec cannot be changed.")   # TF's words
        fields = {k: getattr(self, k) for k in self.__slots__}
        fields.update(kwargs)
        return EstimatorSpec(**fields)


_CALLED_BARE_OK: set = set()   # code objects of train_op callables seen taking no arguments


def _check_called_bare(train_op) -> None:
    """A callable `train_op` is called with no arguments; one that needs some
    (an optimizer factory `lambda params: SGD(params)`) is an error saying so."""
    code = getattr(train_op, "__code__", None)
    if code is not None and code in _CALLED_BARE_OK:
        return
    try:
        inspect.signature(train_op).bind()
    except TypeError:
        raise TypeError(
            f"EstimatorSpec(mode='train'): a callable `train_op` is called with no "
            f"arguments to run the step, but {getattr(train_op, '__name__', train_op)!s}"
            f"{inspect.signature(train_op)} takes some. To build an optimizer give "
            f"train_op=est.get_optimizer(lambda params: torch.optim.SGD(params, ...))") from None
    except ValueError:   # (no signature to read: a builtin)
        return
    if code is not None:
        _CALLED_BARE_OK.add(code)


def _validate(mode, predictions, loss, train_op, eval_metric_ops, export_outputs) -> None:
    """Raise on a spec TF would reject, naming the mode and the field."""
    if mode not in ModeKeys.ALL:
        raise ValueError(f"EstimatorSpec: mode must be one of {ModeKeys.ALL}, got {mode!r}")
    if mode != ModeKeys.PREDICT:
        if loss is None:
            raise ValueError(f"EstimatorSpec(mode={mode!r}): missing field `loss`; "
                             "TRAIN and EVAL need a scalar loss tensor")
        if not isinstance(loss, _Tensor) or loss.numel() != 1:
            what = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, _Tensor)
                    else type(loss).__name__)
            raise ValueError(f"EstimatorSpec(mode={mode!r}): field `loss` must be a "
                             f"scalar tensor (or one of one element), got {what}")
    if mode == ModeKeys.TRAIN and train_op is None:
        raise ValueError("EstimatorSpec(mode='train'): missing field `train_op`; give "
                         "est.get_optimizer(...) or a callable doing the step")
    if train_op is not None and not (isinstance(train_op, _Optimizer) or callable(train_op)):
        raise TypeError(f"EstimatorSpec(mode={mode!r}): field `train_op` must be an "
                        f"optimizer or a callable, got {type(train_op).__name__}")
    if mode == ModeKeys.TRAIN and not isinstance(train_op, _Optimizer):
        _check_called_bare(train_op)
    if mode == ModeKeys.PREDICT:
        if predictions is None:
            raise ValueError("EstimatorSpec(mode='infer'): missing field `predictions`; "
                             "PREDICT needs a tensor or a dict of tensors (or strings)")
        _check_predictions(predictions)
    if export_outputs is not None and not isinstance(export_outputs, dict):
        raise TypeError(f"EstimatorSpec(mode={mode!r}): field `export_outputs` must be a "
                        f"dict {{signature name: est.export.PredictOutput/"
                        f"ClassificationOutput/RegressionOutput}}, got "
                        f"{type(export_outputs).__name__}")
    if eval_metric_ops is not None and not isinstance(eval_metric_ops, dict):
        raise TypeError(f"EstimatorSpec(mode={mode!r}): field `eval_metric_ops` must be "
                        f"a dict of metrics, got {type(eval_metric_ops).__name__}")


def _check_predictions(predictions) -> None:
    if not isinstance(predictions, dict):
        if not (isinstance(predictions, torch.Tensor) or _is_strings(predictions)):
            several = isinstance(predictions, (list, tuple))
            raise TypeError(f"EstimatorSpec(mode='infer'): predictions must be a tensor or a "
                            f"dict of tensors (or strings), got {type(predictions).__name__}"
                            + ("; name them: {'name': tensor, ...}" if several else ""))
        return
    for key, value in predictions.items():
        if not (isinstance(value, torch.Tensor) or _is_strings(value)):
            raise TypeError(f"EstimatorSpec(mode='infer'): predictions[{key!r}] must be a "
                            f"tensor or strings (a numpy str/bytes array, a list of str "
                            f"or bytes), got {type(value).__name__}")


def _is_strings(value) -> bool:
    """Host strings a PREDICT spec may return (class names, forwarded keys;
    while an export records, a string feature stands for its strings)."""
    if is_host_feature(value):
        return True
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if type(value).__module__ == "numpy" and kind in ("U", "S", "O"):
        return kind != "O" or all(isinstance(v, (str, bytes)) for v in value.ravel())
    return isinstance(value, (list, tuple)) and all(isinstance(v, (str, bytes)) for v in value)


def model_fn_caller(model_fn: Callable, params: Optional[dict], config) -> Callable:
    """A `call(features, labels, mode)` that passes what `model_fn` declares
    after its first (features) argument: labels, mode, params, config.

    TF calls a model_fn once per graph with its own copy of `params`, so a
    model_fn may rewrite them (`params["hidden_units"] = [int(u) for u in
    params["hidden_units"].split(",")]`, `params["learning_rate"] *= 2`).
    Here it runs every step: each call gets a fresh shallow copy (a new dict,
    about 0.1 us), so a rewritten key does not carry into the next step or the
    next `train`/`evaluate`. Values changed in place (a list appended to)
    still do.

    As TF's Estimator: `params` given (not None) to a model_fn that takes no
    `params` is an error, and so are labels from the input_fn for a
    model_fn that takes no `labels` (each call)."""
    if not callable(model_fn):
        raise TypeError(f"model_fn must be callable, got {type(model_fn).__name__}")
    declared = _declared(model_fn)
    if not declared:
        raise ValueError("model_fn must take at least `features`")
    # TF passes every argument by name, `features` too (in any order); a
    # model_fn naming no `features` takes them first.
    by_name = "features" in declared and declared[0] != "features"
    names = set(declared) - {"features"} if by_name else set(declared[1:])
    unknown = names - {"labels", "mode", "params", "config"}
    if unknown:
        raise ValueError(f"model_fn has unexpected arguments {sorted(unknown)}; it may take "
                         "features, labels, mode, params, config")
    if params is not None and "params" not in names:
        raise ValueError(f"model_fn ({describe(model_fn)}) does not include params argument, "
                         f"but params ({params!r}) is passed to Estimator.")   # (TF's words)
    params = {} if params is None else params
    fresh = params.copy if type(params) is dict else lambda: copy.copy(params)
    takes_labels, takes_mode = "labels" in names, "mode" in names
    rest = declared[1:]
    if not by_name and rest == ["labels", "mode", "params", "config"][:len(rest)]:
        # The usual signatures: called positionally, no kwargs built per step.
        if len(rest) == 4:
            return lambda features, labels, mode: model_fn(features, labels, mode, fresh(),
                                                           config)
        if len(rest) == 3:
            return lambda features, labels, mode: model_fn(features, labels, mode, fresh())
        if len(rest) == 2 and not inspect.isclass(model_fn):
            return model_fn   # (features, labels, mode): called directly
        if len(rest) == 2:
            return lambda features, labels, mode: model_fn(features, labels, mode)
        if len(rest) == 1:
            return lambda features, labels, mode: model_fn(features, labels)

        def features_only(features, labels, mode):
            if labels is not None:
                raise ValueError(_NO_LABELS)
            return model_fn(features)
        return features_only

    def call(features, labels, mode):
        extra: Dict[str, object] = {}
        if takes_labels:
            extra["labels"] = labels
        elif labels is not None:
            raise ValueError(_NO_LABELS)
        if takes_mode:
            extra["mode"] = mode
        if "params" in names:
            extra["params"] = fresh()
        if "config" in names:
            extra["config"] = config
        if by_name:
            return model_fn(features=features, **extra)
        return model_fn(features, **extra)
    return call


_NO_LABELS = "model_fn does not take labels, but input_fn returns labels."   # (TF's words)


def describe(fn: Callable) -> str:
    """`fn` as an error names it: its qualified name and where it is defined."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__qualname__", None) or type(target).__name__
    try:
        where = f" at {inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (OSError, TypeError):
        where = ""
    return f"{getattr(target, '__module__', None) or '?'}.{name}{where}"


def _declared(model_fn: Callable) -> list:
    """The names a model_fn takes, as TF's `fn_args`: not *args/**kwargs, nor
    what a functools.partial has bound already."""
    bound = set(model_fn.keywords) if isinstance(model_fn, functools.partial) else set()
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in inspect.signature(model_fn).parameters.values()
            if p.name != "self" and p.kind not in variadic and p.name not in bound]
