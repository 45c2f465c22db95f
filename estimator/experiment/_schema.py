"""The schema of an experiment file and the checker that walks it
(`estimator.experiment` loads, builds and runs; this module only judges).

Every mistake becomes a `Problem` with the file, the line, the key path and
the fix; `check()` collects them all before raising, so one run shows every
mistake in the file. Nothing here builds a strategy or runs user code beyond
importing the modules the file names.
"""
from __future__ import annotations

import difflib
import inspect
import os
import re
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence

from distribute import device_util

from . import _registry, _yaml
from ._yaml import ExperimentError, Location, Problem, format_path

_REQUIRED = object()
_NOT_SET = object()


# -- helpers ----------------------------------------------------------------------------
def _describe(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return f"{_yaml._kind(value)} {_short(value)}"
    return f"{_yaml._kind(value)} {value!r}"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _show_key(path) -> str:
    for part in reversed(path):
        if isinstance(part, str):
            return part
    return "-"


def _plural(name: str) -> str:
    for article in ("an ", "a "):
        if name.startswith(article):
            name = name[len(article):]
            break
    return name if name.endswith("s") else name + "s"



# -- value types ------------------------------------------------------------------------
class _Type:
    """A schema type: `check(value, ctx, path) -> value or _INVALID` (recording problems)."""

    name = "a value"
    example = "..."

    def check(self, value, ctx: "_Checker", path) -> Any:
        return value


_INVALID = object()


class _Scalar(_Type):
    def __init__(self, kinds, name, example, minimum=None, strict=False):
        self.kinds, self.name, self.example = kinds, name, example
        self.minimum, self.strict = minimum, strict

    def check(self, value, ctx, path):
        if isinstance(value, bool) and bool not in self.kinds or not isinstance(value, self.kinds):
            ctx.wrong_type(path, value, self)
            return _INVALID
        if self.minimum is not None and (value <= self.minimum if self.strict
                                         else value < self.minimum):
            op = ">" if self.strict else ">="
            ctx.problem(path, f"must be {op} {self.minimum}, got {value!r}; e.g. "
                              f"{_show_key(path)}: {self.example}")
            return _INVALID
        return value


class _Steps(_Scalar):
    """A positive step count: an int, or a float holding one (`250.0`, as TF
    and TrainSpec take it), as an int."""

    def __init__(self):
        super().__init__((int,), "a positive integer", "100", minimum=0, strict=True)

    def check(self, value, ctx, path):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return super().check(value, ctx, path)


class _Optional(_Type):
    def __init__(self, inner: _Type):
        self.inner = inner
        self.name = f"{inner.name} or null"
        self.example = inner.example

    def check(self, value, ctx, path):
        return None if value is None else self.inner.check(value, ctx, path)


class _ListOf(_Type):
    def __init__(self, inner: _Type, allow_single=False):
        self.inner = inner
        self.allow_single = allow_single
        self.name = f"a list of {getattr(inner, 'plural', None) or _plural(inner.name)}"
        self.example = f"[{inner.example}]"

    def check(self, value, ctx, path):
        if self.allow_single and not isinstance(value, list):
            return self.inner.check(value, ctx, path)
        if not isinstance(value, list):
            ctx.wrong_type(path, value, self)
            return _INVALID
        out = [self.inner.check(v, ctx, path + (i,)) for i, v in enumerate(value)]
        return _INVALID if any(v is _INVALID for v in out) else out


class _Mapping(_Type):
    name, example = "a mapping", "{key: value}"

    def check(self, value, ctx, path):
        if value is None:
            return {}
        if not isinstance(value, dict):
            ctx.wrong_type(path, value, self)
            return _INVALID
        return value


INT = _Scalar((int,), "an integer", "100")
POSITIVE_INT = _Scalar((int,), "a positive integer", "100", minimum=0, strict=True)
NON_NEGATIVE_INT = _Scalar((int,), "an integer >= 0", "2", minimum=0)
NUMBER = _Scalar((int, float), "a number", "0.5")
NON_NEGATIVE = _Scalar((int, float), "a number >= 0", "60", minimum=0)
STR = _Scalar((str,), "a string", "text")


class _FilePath(_Scalar):
    """A file or directory: a leading `~` is the home directory (as in a
    shell; it made a directory named `~`)."""

    def __init__(self):
        super().__init__((str,), "a path", "runs/x")

    def check(self, value, ctx, path):
        value = super().check(value, ctx, path)
        return os.path.expanduser(value) if isinstance(value, str) else value


PATH = _FilePath()
BOOL = _Scalar((bool,), "true or false", "true")
MAPPING = _Mapping()
ANY = _Type()


class _Ref(_Type):
    """An import path to a function; `role` decides the signature check."""

    name, example = "an import path", "package.module:function"

    def __init__(self, role: str):
        self.role = role

    def check(self, value, ctx, path):
        if not isinstance(value, str):
            ctx.wrong_type(path, value, self)
            return _INVALID
        return ctx.resolve_ref(path, value, self.role)


class _Component(_Type):
    """`Name`, `Name: null` or `Name: {argument: value}` of a registry kind."""

    def __init__(self, kind: str):
        self.kind = kind
        self.noun = _registry.KINDS[kind].noun
        self.name = f"a {self.noun} (Name or Name: {{argument: value}})"
        self.plural = f"{self.noun}s, each Name or Name: {{argument: value}}"
        self.example = {"strategy": "{MirroredStrategy: {devices: [cpu:0, cpu:1]}}",
                        "hook": "{LoggingTensorHook: {tensors: [loss], every_n_iter: 100}}",
                        "exporter": "{LatestExporter: {name: latest, serving_input_receiver_fn:"
                                    " pkg.mod:serving_fn}}",
                        "saving_listener": "{package.module:MyListener: {}}",
                        "estimator": "{DNNClassifier: {hidden_units: [10, 10], "
                                     "feature_columns: pkg.mod:feature_columns}}",
                        "cross_device_ops": "NcclAllReduce",
                        "head": "{MultiLabelHead: {n_classes: 3}}",
                        "optimizer": "{LinearSDCA: {example_id_column: id}}"}.get(kind, "Name")

    def check(self, value, ctx, path):
        return ctx.component(path, value, self)


# -- the schema ----------------------------------------------------------------------------
class _Field(NamedTuple):
    type: _Type
    default: Any = _NOT_SET      # _REQUIRED, _NOT_SET (omitted when absent) or a value


_HOOKS = _ListOf(_Component("hook"))
_STRATEGY = _Optional(_Component("strategy"))

# RunConfig arguments with a meaningful YAML form; the others in its signature
# are accepted as they are (`ANY`) and RunConfig itself checks them (and warns
# that TF-only ones, such as session_config, do nothing here).
_RUN_CONFIG_TYPES = {
    "model_dir": _Optional(PATH), "tf_random_seed": _Optional(INT), "random_seed": _Optional(INT),
    "save_summary_steps": _Optional(NON_NEGATIVE_INT),
    "save_checkpoints_steps": _Optional(POSITIVE_INT),
    "save_checkpoints_secs": _Optional(NON_NEGATIVE),
    "keep_checkpoint_max": _Optional(NON_NEGATIVE_INT),
    "keep_checkpoint_every_n_hours": NUMBER,
    "log_step_count_steps": _Optional(POSITIVE_INT),
    "train_distribute": _STRATEGY, "eval_distribute": _STRATEGY,
    "session_creation_timeout_secs": NUMBER,
    "experimental_max_worker_delay_secs": _Optional(INT),
    "protocol": _Optional(STR), "checkpoint_save_graph_def": BOOL,
    "device_fn": _Optional(_Ref("device_fn")),
}
_RUN_CONFIG_SHOWN = ("model_dir", "tf_random_seed", "save_summary_steps",
                     "save_checkpoints_steps", "save_checkpoints_secs", "keep_checkpoint_max",
                     "keep_checkpoint_every_n_hours", "log_step_count_steps",
                     "train_distribute", "eval_distribute")

_SPEC_TYPES = {
    "input_fn": _Ref("input_fn"), "max_steps": _Optional(_Steps()), "hooks": _HOOKS,
    "saving_listeners": _ListOf(_Component("saving_listener")),
    "steps": _Optional(_Steps()), "name": _Optional(STR),
    "exporters": _ListOf(_Component("exporter")),
    "start_delay_secs": NON_NEGATIVE, "throttle_secs": NON_NEGATIVE,
    "checkpoint_policy": STR,
}
def _spec_fields(spec) -> Dict[str, _Field]:
    """TrainSpec/EvalSpec fields, read from their signatures."""
    defaults = {}
    for name, p in inspect.signature(spec).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or name in ("cls", "self"):
            continue
        default = _REQUIRED if p.default is p.empty else p.default
        defaults[name] = [] if name in ("hooks", "exporters", "saving_listeners") \
            and default is None else default
    return {name: _Field(_SPEC_TYPES.get(name, ANY), default) for name, default in defaults.items()}


def _run_config_fields() -> Dict[str, _Field]:
    from ..run_config import RunConfig
    fields = {}
    for name, p in inspect.signature(RunConfig).parameters.items():
        if name == "self":
            continue
        default = p.default if isinstance(p.default, (int, float, str, bool, type(None))) \
            else None    # save_checkpoints_steps/secs: TF's rule fills them in (_check_run_config)
        fields[name] = _Field(_RUN_CONFIG_TYPES.get(name, ANY),
                              default if name in _RUN_CONFIG_SHOWN else _NOT_SET)
    return fields


def _warm_start_fields() -> Dict[str, _Field]:
    return {"ckpt_to_initialize_from": _Field(PATH, _REQUIRED),
            "vars_to_warm_start": _Field(_Optional(_ListOf(STR, allow_single=True)), ".*"),
            "var_name_to_prev_var_name": _Field(MAPPING, {}),
            "var_name_to_vocab_info": _Field(MAPPING, {})}


def _schema() -> Dict[str, Any]:
    """The top level: {key: _Field or (section fields, required?)}."""
    from ..training import EvalSpec, TrainSpec
    return {
        "model_fn": _Field(_Ref("model_fn"), _NOT_SET),       # this, or `estimator`
        "estimator": _Field(_Component("estimator"), _NOT_SET),
        "params": _Field(MAPPING, {}),
        "run_config": (_run_config_fields(), False),
        "train_spec": (_spec_fields(TrainSpec), False),
        "eval_spec": (_spec_fields(EvalSpec), False),
        "predict_spec": ({"input_fn": _Field(_Ref("input_fn"), _REQUIRED),
                          "predict_keys": _Field(_Optional(_ListOf(STR, allow_single=True)), None),
                          "checkpoint_path": _Field(_Optional(PATH), None),
                          "hooks": _Field(_HOOKS, [])}, False),
        "export": ({"serving_input_receiver_fn": _Field(_Ref("serving_input_receiver_fn"),
                                                        _REQUIRED),
                    "export_dir_base": _Field(_Optional(PATH), None),
                    "checkpoint_path": _Field(_Optional(PATH), None)}, False),
        "warm_start": "warm_start",
    }


# Arguments that name devices; their strings are checked and TF's spellings
# (/gpu:0, GPU:1, /device:CPU:0) turned into torch's (cuda:0, cpu:0).
_DEVICE_ARGS = ("device", "devices", "compute_devices", "parameter_device")
# Canned-estimator arguments holding feature columns: an import path to a
# function returning them (columns are Python objects, not YAML).
_COLUMN_ARGS = ("feature_columns", "linear_feature_columns", "dnn_feature_columns")
# Arguments filled in from the run when a hook takes them and the file does not set them.
_INJECTED = ("estimator", "checkpoint_dir", "output_dir")


class _Built(NamedTuple):
    """A component ready to build: `factory(**kwargs)` plus the injected names."""

    factory: Callable
    name: str
    kwargs: Dict[str, Any]
    inject: tuple
    path: tuple


# -- checking ------------------------------------------------------------------------
class _Checker:
    """Walks a Tree against the schema, collecting every problem."""

    def __init__(self, tree: _yaml.Tree, base_dir: str):
        self.tree = tree
        self.base_dir = base_dir
        self.problems: List[Problem] = []
        self.objects: Dict[tuple, Any] = {}      # path -> resolved function / _Built

    # reporting
    def problem(self, path, message):
        self.problems.append(Problem(self.tree.where(path), format_path(path), message))

    def wrong_type(self, path, value, expected: _Type):
        fix = f"e.g. {_show_key(path)}: {expected.example}"
        if isinstance(value, float) and value.is_integer() and \
                expected.check(int(value), _Checker(self.tree, self.base_dir), path) \
                is not _INVALID:
            fix = f"write it as an integer: {_show_key(path)}: {int(value)}"
        if isinstance(value, str) and not isinstance(expected, (_Ref, _Component)):
            try:
                parsed = _yaml.parse_scalar(value, "")
            except ExperimentError:
                parsed = value
            if not isinstance(parsed, str) and \
                    expected.check(parsed, _Checker(self.tree, self.base_dir), path) \
                    is not _INVALID:
                fix = f"remove the quotes: {_show_key(path)}: {value}"
        self.problem(path, f"expected {expected.name}, got {_describe(value)}; {fix}")

    # sections
    def section(self, path, value, fields: Dict[str, _Field]):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            self.problem(path, f"expected a mapping of keys ({', '.join(fields)}), got "
                               f"{_describe(value)}; indent its keys under {_show_key(path)}:")
            return None
        for key in value:
            if key not in fields:
                self.unknown_key(path, key, fields)
        out = {}
        for key, field in fields.items():
            if key in value:
                checked = field.type.check(value[key], self, path + (key,))
                if checked is not _INVALID:
                    out[key] = checked
            elif field.default is _REQUIRED:
                self.problem(path + (key,), f"missing required key {key!r}; add "
                                            f"{key}: {field.type.example} under "
                                            f"{_show_key(path) or 'the top level'}")
            elif field.default is not _NOT_SET:
                out[key] = field.default
        return out

    def unknown_key(self, path, key, valid: Iterable[str]):
        valid = list(valid)
        close = _registry.suggest(key, valid)
        where = f"under {_show_key(path)}" if path else "at the top level"
        if close:
            self.problem(path + (key,), f"unknown key {key!r}; did you mean {close!r}?")
        else:
            self.problem(path + (key,), f"unknown key {key!r}; valid keys {where}: "
                                        f"{', '.join(valid)}")

    # import paths
    def resolve_ref(self, path, ref: str, role: str):
        try:
            obj = _registry.import_ref(ref, self.base_dir)
        except _registry.RefError as e:
            self.problem(path, str(e))
            return _INVALID
        if not callable(obj):
            self.problem(path, f"{ref!r} is {type(obj).__name__}, not a function; name the "
                               f"{role} function itself")
            return _INVALID
        message = _signature_problem(obj, role)
        if message:
            self.problem(path, f"{ref}: {message}")
            return _INVALID
        self.objects[path] = obj
        return _absolute_ref(ref, self.base_dir)

    # strategies, hooks, exporters
    def component(self, path, value, ctype: _Component):
        if isinstance(value, str):
            name, args, at = value, None, path
        elif isinstance(value, dict) and len(value) == 1:
            name, args = next(iter(value.items()))
            at = path + (name,)
        else:
            if isinstance(value, dict):
                why = (f"it has {len(value)} keys ({', '.join(map(str, value))}); give each "
                       f"{ctype.noun} as its own list item") if value else "it is empty"
            else:
                why = f"got {_describe(value)}"
            self.problem(path, f"expected one {ctype.noun} written as Name or Name: "
                               f"{{argument: value}}; {why}; e.g. {ctype.example}")
            return _INVALID
        if not isinstance(name, str):
            self.problem(path, f"a {ctype.noun} name must be a string, got {_describe(name)}")
            return _INVALID
        try:
            factory = _registry.lookup(ctype.kind, name, self.base_dir)
        except _registry.RefError as e:
            self.problem(at, str(e))
            return _INVALID
        if args is None:
            args = {}
        if not isinstance(args, dict):
            self.problem(at, f"the arguments of {name} must be a mapping of argument: value, "
                             f"got {_describe(args)}; e.g. {ctype.example}")
            return _INVALID
        try:
            sig = inspect.signature(factory)
        except (TypeError, ValueError):
            sig = None
        kwargs, ok = {}, True
        out_args = {}
        for arg, val in args.items():
            apath = at + (arg,)
            shown = val
            if isinstance(arg, str) and arg.endswith("_fn") and isinstance(val, str):
                shown = self.resolve_ref(apath, val, arg)
                val = self.objects.get(apath, _INVALID)
            elif ctype.kind == "estimator" and arg in _COLUMN_ARGS and isinstance(val, str):
                shown = self.resolve_ref(apath, val, "feature_columns")
                fn = self.objects.pop(apath, None)
                val = _INVALID if fn is None else _Built(fn, val, {}, (), apath)
            elif ctype.kind == "estimator" and arg == "head":
                shown = self.component(apath, val, _Component("head"))
                val = self.objects.get(apath, _INVALID)
            elif ctype.kind == "estimator" and arg == "optimizer" and isinstance(val, dict):
                shown = self.component(apath, val, _Component("optimizer"))   # (LinearSDCA)
                val = self.objects.get(apath, _INVALID)
            elif ctype.kind == "head" and arg == "heads" and isinstance(val, list):
                shown = [self.component(apath + (i,), v, _Component("head"))
                         for i, v in enumerate(val)]   # (MultiHead's)
                val = [self.objects.get(apath + (i,), _INVALID) for i in range(len(val))]
                if _INVALID in shown or _INVALID in val:
                    val = _INVALID
            elif arg in _DEVICE_ARGS and val is not None:
                val = shown = self.devices(apath, val)
            elif arg == "cross_device_ops" and val is not None and "cross_device_ops" in \
                    _registry.KINDS:
                shown = self.component(apath, val, _Component("cross_device_ops"))
                val = self.objects.get(apath, _INVALID)
            if val is _INVALID or shown is _INVALID:
                ok = False
            kwargs[arg] = val
            out_args[arg] = shown
        inject = ()
        if sig is not None:
            params = sig.parameters
            var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
            names = [n for n, p in params.items()
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            for arg in args:
                if arg not in names and not var_kw:
                    close = _registry.suggest(arg, names)
                    hint = f"did you mean {close!r}?" if close else \
                        f"it takes: {', '.join(n for n in names if n not in _INJECTED)}"
                    self.problem(at + (arg,), f"{name} has no argument {arg!r}; {hint}")
                    ok = False
            if ctype.kind == "hook":
                inject = tuple(n for n in _INJECTED if n in names and n not in args)
            # (an estimator's config and warm start come from run_config and warm_start:
            # a trainer's build_estimator(nbuckets, ..., config) takes them as arguments)
            given = ("config", "warm_start_from") if ctype.kind == "estimator" else ()
            for n, p in params.items():
                if (p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                        and n not in args and n not in inject and n not in given):
                    self.problem(at, f"{name} needs argument {n!r}; add it: "
                                     f"{name}: {{{n}: ...}}")
                    ok = False
        if not ok:
            return _INVALID
        self.objects[path] = _Built(factory, name, kwargs, inject, at)
        return {_absolute_ref(name, self.base_dir): out_args} if args or \
            isinstance(value, dict) else _absolute_ref(name, self.base_dir)

    def devices(self, path, value):
        if isinstance(value, list):
            out = [self.devices(path + (i,), v) for i, v in enumerate(value)]
            return _INVALID if _INVALID in out else out
        if not isinstance(value, str):
            self.problem(path, f"expected a device string, got {_describe(value)}; e.g. "
                               "cpu:0, cuda:0")
            return _INVALID
        device, message = _normalize_device(value)
        if message:
            self.problem(path, message)
            return _INVALID
        return device


def _signature_problem(fn, role: str) -> Optional[str]:
    """Why `fn` cannot serve as `role` (model_fn, input_fn, ...), or None."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    required = [n for n, p in params.items() if p.default is p.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY, p.KEYWORD_ONLY)]
    if role == "model_fn":
        from ..model_fn import model_fn_caller
        try:
            model_fn_caller(fn, None, None)
        except (TypeError, ValueError) as e:
            return str(e)
        return None
    if role == "input_fn":
        passed = ("params", "mode", "config", "input_context")
        extra = [n for n in required if n not in passed]
        if extra:
            return (f"input_fn takes {', '.join(map(repr, extra))}, which the Estimator cannot "
                    f"pass (it passes {', '.join(passed)} by name); give it a default or read "
                    f"it from params")
        return None
    if required and role in ("serving_input_receiver_fn", "feature_columns"):
        return (f"{role} is called with no arguments but takes "
                f"{', '.join(map(repr, required))}; give them defaults")
    return None


def _normalize_device(text: str):
    """(torch device string, None) or (None, error message with the fix)."""
    device = device_util.torch_name(text) or text.strip()
    import torch
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        return None, (f"{text!r} is not a device; write cpu, cpu:N or cuda:N (TF's /cpu:0 and "
                      f"/gpu:N are accepted too)")
    if parsed.type == "cuda":
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count or count == 0:
            have = f"use cuda:0..cuda:{count - 1}" if count else "use cpu or cpu:N replicas"
            return None, f"{text!r}: this machine has {count} CUDA device(s); {have}"
    elif parsed.type not in ("cpu", "cuda", "mps", "xpu", "meta"):
        return None, f"{text!r} is not a device a strategy can use; write cpu, cpu:N or cuda:N"
    return device, None


def _absolute_ref(ref: str, base_dir: str) -> str:
    """A `path/file.py:fn` reference with the file made absolute (so the saved
    experiment runs from anywhere); others unchanged."""
    module_part, sep, attr = ref.rpartition(":")
    if sep and (module_part.endswith(".py") or "/" in module_part or os.sep in module_part):
        path = _registry.resolved_file(module_part, base_dir)
        if path:
            return f"{path}:{attr}"
    return ref


def _located(build: Callable, tree, path, what: str, keys=()):
    """Run `build()`; a ValueError/TypeError it raises becomes an ExperimentError at
    the key its message names (else at `path`): the longest key named, a
    plural one by its singular too ("An Exporter cannot have a name..." is
    `exporters`' problem, not `name`'s)."""
    try:
        return build()
    except (ValueError, TypeError) as e:
        message = str(e)
        at = tuple(path)
        for key in sorted((k for k in keys or () if isinstance(k, str)), key=len, reverse=True):
            stem = key[:-1] if key.endswith("s") and len(key) > 3 else None
            if re.search(rf"\b{re.escape(key)}\b", message) or (
                    stem and re.search(rf"\b{re.escape(stem)}", message, re.IGNORECASE)):
                at = tuple(path) + (key,)
                break
        if "TF_CONFIG" in message:
            raise ExperimentError([Problem(Location("TF_CONFIG (environment variable)"), "",
                                           message)]) from e
        raise ExperimentError([Problem(tree.where(at), format_path(at),
                                       f"{what} rejected it: {message}")]) from e


# -- the whole file ---------------------------------------------------------------------------
def check(tree: _yaml.Tree, base_dir: str, problems: Sequence[Problem] = ()):
    """(resolved config, {key path: imported function or _Built}) for an
    overridden tree; interpolates it first. Raises ExperimentError with every
    problem found: the tree's own (duplicate keys), `problems` (the
    overrides'), then the schema's and the references'."""
    problems = [*tree.problems, *problems]
    if not isinstance(tree.data, dict):
        what = "empty" if tree.data is None else f"{_describe(tree.data)}"
        raise ExperimentError(problems + [Problem(
            tree.where(()), "", f"an experiment is a mapping of keys (model_fn, params, "
            f"run_config, train_spec, eval_spec, ...), but this file is {what}; start with "
            f"model_fn: package.module:model_fn")])
    failed = _yaml.interpolate(tree, _suggest_path)
    checker = _Checker(tree, base_dir)
    config = _check(checker, tree.data)
    if failed:
        problems += _mistakes_and_references(tree, checker.problems, failed)
    else:
        problems += checker.problems
    if problems:
        raise ExperimentError(problems)
    return config, checker.objects


def _mistakes_and_references(tree: _yaml.Tree, found: List[Problem], failed) -> List[Problem]:
    """With references that did not resolve (their values left as written):
    the mistakes found in values holding none, then the references' errors
    but those a mistake explains. A reference to a missing key is often a
    key misspelt (`runconfig:`, an unknown key beside the one it names) or
    of the wrong kind (a list on its path): that mistake is the one to fix
    (the reference's error would say to use the typo)."""
    mistakes = [p for p in found if p.message.startswith("unknown key")
                or not _holds_reference(tree, p.path)]
    at = [(_parsed(p.path), p.message.startswith("unknown key")) for p in mistakes]

    def explained(missing) -> bool:   # (a wrong kind on its path, or its key misspelt)
        return missing is not None and any(
            missing[:len(path)] == path or unknown and len(missing) >= len(path) > 0
            and missing[:len(path) - 1] == path[:-1]
            and difflib.get_close_matches(str(missing[len(path) - 1]), [str(path[-1])])
            for path, unknown in at)
    return mistakes + [p for p, missing in failed if not explained(missing)]


def _parsed(path: str) -> tuple:
    try:
        return _yaml.parse_path(path) if path else ()
    except ValueError:
        return (None,)   # (explains nothing)


def _holds_reference(tree: _yaml.Tree, path: str) -> bool:
    try:
        value = tree.get(_yaml.parse_path(path)) if path else tree.data
    except ValueError:
        return True
    stack = [value]
    while stack:
        value = stack.pop()
        if isinstance(value, str) and "${" in value:
            return True
        stack.extend(value.values() if isinstance(value, dict) else
                     value if isinstance(value, list) else ())
    return False


def _check(checker: _Checker, data: dict) -> dict:
    schema = _schema()
    out: Dict[str, Any] = {}
    for key in data:
        if key not in schema and not str(key).startswith("x-"):
            checker.unknown_key((), key, schema)
    for key, entry in schema.items():
        path = (key,)
        if entry == "warm_start":
            if data.get(key) is not None:
                value = data[key]
                if isinstance(value, str):
                    value = {"ckpt_to_initialize_from": value}
                checked = checker.section(path, value, _warm_start_fields())
                if checked is not None:
                    out[key] = checked
            continue
        if isinstance(entry, _Field):
            if key in data:
                checked = entry.type.check(data[key], checker, path)
                if checked is not _INVALID:
                    out[key] = checked
            elif entry.default is _REQUIRED:
                checker.problem(path, f"missing required key {key!r}; add "
                                      f"{key}: {entry.type.example} at the top level")
            elif entry.default is not _NOT_SET:
                out[key] = entry.default
            continue
        fields, _required = entry
        if data.get(key) is not None or key == "run_config":   # (null: no such section)
            checked = checker.section(path, data.get(key), fields)
            if checked is not None:
                out[key] = checked
    _check_model(checker, data)
    run_config = out.get("run_config")
    if run_config is not None:
        _check_run_config(checker, run_config, data.get("run_config") or {})
    return out


def _check_model(checker: _Checker, data: dict) -> None:
    """Exactly one of model_fn and estimator; a canned estimator takes no params."""
    if "model_fn" in data and "estimator" in data:
        checker.problem(("estimator",), "give either model_fn or estimator, not both: "
                                        "estimator replaces model_fn (its model is built in)")
    elif "model_fn" not in data and "estimator" not in data:
        checker.problem(("model_fn",), "missing required key 'model_fn'; add model_fn: "
                                       "package.module:function at the top level, or a "
                                       "canned estimator: estimator: {DNNClassifier: "
                                       "{hidden_units: [10], feature_columns: "
                                       "package.module:feature_columns}}")
    elif "estimator" in data and data.get("params"):
        checker.problem(("params",), "a canned estimator takes no params; give its "
                                     "arguments under estimator: {Name: {argument: value}}")


def _check_run_config(checker: _Checker, resolved: dict, given: dict) -> None:
    """TF's save_checkpoints_steps/secs rule and RunConfig's own value checks,
    before any strategy is built."""
    from ..run_config import RunConfig
    steps, secs = given.get("save_checkpoints_steps"), given.get("save_checkpoints_secs")
    if steps is not None and secs is not None:
        checker.problem(("run_config", "save_checkpoints_secs"),
                        "save_checkpoints_steps and save_checkpoints_secs cannot both be set; "
                        "keep one (set the other to null)")
        return
    if "save_checkpoints_steps" in given and steps is not None:
        resolved["save_checkpoints_secs"] = None
    elif "save_checkpoints_secs" in given and secs is not None:
        resolved["save_checkpoints_steps"] = None
    elif "save_checkpoints_steps" not in given and "save_checkpoints_secs" not in given:
        resolved["save_checkpoints_steps"], resolved["save_checkpoints_secs"] = None, 600
    plain = {k: v for k, v in given.items()
             if k in resolved and k not in ("train_distribute", "eval_distribute")
             and ("run_config", k) not in checker.objects}
    if checker.problems:
        return
    try:   # (RunConfig's lines are said here, once: Experiment.run_config builds it quietly)
        _located(lambda: RunConfig(**plain), checker.tree, ("run_config",), "RunConfig",
                 keys=plain)
    except ExperimentError as e:
        checker.problems.extend(e.problems)


def _suggest_path(prefix, missing, node) -> str:
    """' did you mean X?' for a `${...}` that names a key that is not there."""
    if isinstance(node, dict):
        close = _registry.suggest(str(missing), [str(k) for k in node])
        if close:
            return f" did you mean ${{{format_path(tuple(prefix) + (close,))}}}?"
        return f" {format_path(prefix) or 'the top level'} has: {', '.join(map(str, node))}"
    return " check the key path"
