"""YAML-configured experiments: one file names the model_fn and input_fns by
import path and sets params, RunConfig (strategies included), TrainSpec and
EvalSpec (hooks, exporters); `estimator run file.yaml` runs it. TF has no
such file; it stands for the Python a TF1 user wrote around
`tf.estimator.train_and_evaluate`.

    model_fn: ../examples/iris.py:model_fn        # or package.module:function
    params: {hidden_units: [16, 16], learning_rate: 0.1}
    run_config:
      model_dir: runs/iris
      save_checkpoints_steps: 200
      train_distribute: {MirroredStrategy: {devices: [cpu:0, cpu:1]}}
    train_spec:
      input_fn: ../examples/iris.py:input_fn
      max_steps: 1000
      hooks:
        - LoggingTensorHook: {tensors: [loss], every_n_iter: 100}
    eval_spec:
      input_fn: ../examples/iris.py:input_fn
      steps: null
      throttle_secs: 0
      exporters:
        - BestExporter: {name: best, serving_input_receiver_fn: my.module:serving_fn}

    exp = experiment.load("configs/iris.yaml", overrides=["train_spec.max_steps=10"])
    estimator = exp.estimator()
    est.train_and_evaluate(estimator, exp.train_spec(estimator), exp.eval_spec(estimator))

- File paths in import paths are relative to the experiment file's
  directory, else to the current directory. Strategies, hooks, exporters and
  saving listeners are `Name: {argument: value}` (or a bare `Name`), looked
  up by name in the `distribute`, `hooks` and `estimator` packages, or given
  by import path. An argument whose name ends in `_fn` takes an import path.
  Hooks get `estimator`, `checkpoint_dir` and `output_dir` (model_dir) filled
  in when they take them and the file does not set them.
- `${a.b}` is replaced by the value at key path a.b (`${env:NAME}`,
  `${env:NAME:-default}` by an environment variable); overrides
  `key.path=value` are read as YAML and applied before interpolation.
- Everything is checked before anything runs, and every mistake is reported
  with the file, the line, the key path and the fix (`ExperimentError`).
"""
from __future__ import annotations

import copy
import datetime
import difflib
import inspect
import logging
import os
import shlex
import time
from typing import Any, Callable, Dict, Optional, Sequence

from hooks.files import atomic_write_bytes
from hooks.session_run_hook import SessionRunHook

from ..run_config import writes_checkpoints
from . import _yaml
from ._yaml import ExperimentError, Problem
from ._schema import _Built, _located, check

logger = logging.getLogger(__name__)

__all__ = ["Experiment", "ExperimentError", "load", "EXPERIMENT_FILE"]

EXPERIMENT_FILE = "experiment.yaml"


# -- the experiment ------------------------------------------------------------------------
class Experiment:
    """A loaded and checked experiment: `config` is the resolved YAML as plain
    data; the methods build the Estimator and the specs it describes."""

    def __init__(self, path: str, config: dict, objects: Dict[tuple, Any],
                 tree: _yaml.Tree):
        self.path = path
        self.config = config
        self._objects = objects
        self._tree = tree

    def __repr__(self):
        return f"Experiment({self.path!r})"

    # -- reading -----------------------------------------------------------------
    @property
    def params(self) -> dict:
        return dict(self.config.get("params") or {})

    @property
    def model_fn(self) -> Callable:
        """The model_fn (a canned estimator's built-in one under `estimator:`)."""
        if ("model_fn",) in self._objects:
            return self._objects[("model_fn",)]
        return self.estimator().model_fn

    @property
    def model_dir(self) -> Optional[str]:
        return (self.config.get("run_config") or {}).get("model_dir")

    def section(self, name: str) -> Optional[dict]:
        return self.config.get(name)

    def function(self, *path) -> Callable:
        """The function an import path at `path` names (e.g. "train_spec", "input_fn")."""
        return self._objects[tuple(path)]

    def require(self, *sections: str, command: str) -> None:
        """An ExperimentError unless every section is present (`estimator run`
        needs train_spec and eval_spec, ...)."""
        missing = [s for s in sections if self.config.get(s) is None]
        if missing:
            examples = {"train_spec": "train_spec: {input_fn: package.module:input_fn, "
                                      "max_steps: 1000}",
                        "eval_spec": "eval_spec: {input_fn: package.module:input_fn}",
                        "export": "export: {serving_input_receiver_fn: package.module:fn}",
                        "predict_spec": "predict_spec: {input_fn: package.module:input_fn}"}
            raise ExperimentError([Problem(self._tree.where(()), s,
                                           f"missing; {command} needs it: add "
                                           f"{examples.get(s, s + ': ...')}")
                                   for s in missing])

    def check_receivers(self, section: str) -> None:
        """Call each `serving_input_receiver_fn` of `section` (eval_spec's
        exporters, export) once, before the work that exports with it: an
        ExperimentError at its key where one returns no ServingInputReceiver
        (said after training otherwise). One that raises is left to the
        export, which may need what training makes."""
        problems, seen = [], {}
        for path, fn in self._objects.items():
            if path[0] != section or path[-1] != "serving_input_receiver_fn":
                continue
            if id(fn) not in seen:
                seen[id(fn)] = _receiver_problem(fn)
            if seen[id(fn)]:
                problems.append(Problem(self._tree.where(path), _yaml.format_path(path),
                                        f"{self._tree.get(path)}: {seen[id(fn)]}"))
        if problems:
            raise ExperimentError(problems)

    def to_yaml(self) -> str:
        """The resolved experiment as YAML (what `--print-config` shows and
        `experiment.yaml` holds)."""
        return _yaml.dump(self.config)

    # -- building -------------------------------------------------------------------
    def run_config(self):
        """The RunConfig, strategies built."""
        from ..run_config import RunConfig
        kwargs = {}
        for key, value in (self.config.get("run_config") or {}).items():
            path = ("run_config", key)
            if path in self._objects:
                built = self._objects[path]
                value = self._build(built, {}) if isinstance(built, _Built) else built
            elif key in ("save_checkpoints_steps", "save_checkpoints_secs") and \
                    key not in (self._tree.get(("run_config",)) or {}):
                continue      # TF's rule decides (600 s unless steps are given)
            kwargs[key] = value
        quiet = logging.getLogger("estimator.run_config")   # (said by the check at load)
        was, quiet.disabled = quiet.disabled, True
        try:
            return _located(lambda: RunConfig(**kwargs), self._tree, ("run_config",),
                            "RunConfig", keys=kwargs)
        finally:
            quiet.disabled = was

    def warm_start_settings(self):
        settings = self.config.get("warm_start")
        if settings is None:
            return None
        from ..warm_start import VocabInfo, WarmStartSettings

        def build():   # each VocabInfo a mapping of its arguments
            infos = settings.get("var_name_to_vocab_info") or {}
            for name, info in infos.items():
                if not isinstance(info, dict):
                    raise TypeError(f"var_name_to_vocab_info[{name!r}] must be a mapping of "
                                    "VocabInfo's arguments (new_vocab, new_vocab_size, "
                                    f"num_oov_buckets, old_vocab, ...), got {info!r}")
            return WarmStartSettings(**dict(settings, var_name_to_vocab_info={
                name: VocabInfo(**info) for name, info in infos.items()}))
        return _located(build, self._tree, ("warm_start",), "WarmStartSettings", keys=settings)

    def estimator(self):
        """The Estimator: model_fn, RunConfig, params, warm start; or the canned
        estimator named under `estimator:` with its arguments, RunConfig and
        warm start."""
        from ..estimator import Estimator
        canned = self._objects.get(("estimator",))
        if canned is None:
            # (no `params:`: None, as TF's default, for a model_fn taking none)
            return Estimator(self.model_fn, config=self.run_config(), params=self.params or None,
                             warm_start_from=self.warm_start_settings())
        extra = {"config": self.run_config()}
        parameters = inspect.signature(canned.factory).parameters
        takes_any = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
        if "config" not in parameters and not takes_any:
            raise ExperimentError([Problem(
                self._tree.where(("estimator",)), "estimator",
                f"{canned.name} takes no config: give it a `config` argument, the RunConfig "
                "that run_config makes (pass it to the Estimator it builds)")])
        settings = self.warm_start_settings()
        if settings is not None:
            if "warm_start_from" not in parameters and not takes_any:
                raise ExperimentError([Problem(
                    self._tree.where(("warm_start",)), "warm_start",
                    f"{canned.name} takes no warm_start_from (as in TF); remove warm_start")])
            extra["warm_start_from"] = settings
        built = self._build(canned._replace(kwargs={**canned.kwargs, **extra}), {})
        if not isinstance(built, Estimator):   # (a build_estimator function's result)
            raise ExperimentError([Problem(
                self._tree.where(("estimator",)), "estimator",
                f"{canned.name} returned {type(built).__name__}, not an Estimator (a "
                "build_estimator function must return the Estimator it builds)")])
        return built

    def hooks(self, section: str, estimator, key: str = "hooks") -> list:
        return [self._build(self._objects[(section, key, i)], _context(estimator))
                for i in range(len((self.config.get(section) or {}).get(key) or []))]

    def train_spec(self, estimator):
        """est.TrainSpec with its hooks and saving listeners built."""
        import estimator as est
        kwargs = self._spec_kwargs("train_spec", estimator)
        return _located(lambda: est.TrainSpec(**kwargs), self._tree, ("train_spec",),
                        "TrainSpec", keys=kwargs)

    def eval_spec(self, estimator):
        """est.EvalSpec with its hooks and exporters built."""
        import estimator as est
        kwargs = self._spec_kwargs("eval_spec", estimator)
        return _located(lambda: est.EvalSpec(**kwargs), self._tree, ("eval_spec",),
                        "EvalSpec", keys=kwargs)

    def _spec_kwargs(self, section: str, estimator) -> dict:
        self.require(section, command=f"building {section}")
        kwargs = {}
        for key, value in self.config[section].items():
            path = (section, key)
            if path in self._objects:
                value = self._objects[path]
            elif isinstance(value, list) and any((section, key, i) in self._objects
                                                 for i in range(len(value))):
                value = [self._build(self._objects[(section, key, i)], _context(estimator))
                         for i in range(len(value))]
            kwargs[key] = value
        return kwargs

    def _build(self, built: _Built, context: dict):
        kwargs = dict(built.kwargs)
        for key, value in kwargs.items():
            if isinstance(value, _Built):
                kwargs[key] = self._build(value, context)
            elif isinstance(value, list) and any(isinstance(v, _Built) for v in value):
                kwargs[key] = [self._build(v, context) if isinstance(v, _Built) else v
                               for v in value]   # (MultiHead's heads)
        for name in built.inject:
            if name in context:
                kwargs[name] = context[name]
        return _located(lambda: built.factory(**kwargs), self._tree, built.path, built.name,
                        keys=built.kwargs)

    # -- saving ----------------------------------------------------------------------
    def save_hook(self, estimator, command: str = "run") -> Optional["SaveExperimentHook"]:
        """A hook writing the resolved experiment to `model_dir/experiment.yaml`
        when training starts: after a checkpoint in model_dir was restored
        into this experiment's model, so that a rerun that cannot resume (a
        changed model) leaves the file of the run that wrote the checkpoints.
        On the chief only (no other task writes to model_dir); None elsewhere."""
        config = estimator.config
        if not writes_checkpoints(config):
            return None
        path = os.path.join(estimator.model_dir, EXPERIMENT_FILE)
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        model_dir = os.path.abspath(estimator.model_dir)
        resolved = _absolute_paths(dict(self.config), model_dir)
        resolved["run_config"] = dict(resolved.get("run_config") or {}, model_dir=model_dir)
        text = (f"# Resolved experiment, written by `estimator {command}` from "
                f"{os.path.abspath(self.path)} at {stamp}.\n"
                f"# Run it again with: estimator {command} {shlex.quote(path)}\n"
                + _yaml.dump(resolved))
        return SaveExperimentHook(path, text)


# The keys naming files or directories (relative ones: to the current
# directory), made absolute in model_dir/experiment.yaml so that it reruns
# from anywhere, those in model_dir written as in it (`${run_config.model_dir}/
# export`), so that a rerun given another model_dir moves them too ("*": each
# key of a mapping).
_PATH_KEYS = (("predict_spec", "checkpoint_path"), ("export", "export_dir_base"),
              ("export", "checkpoint_path"), ("warm_start", "ckpt_to_initialize_from"),
              ("warm_start", "var_name_to_vocab_info", "*", "new_vocab"),
              ("warm_start", "var_name_to_vocab_info", "*", "old_vocab"))


def _absolute_paths(config: dict, model_dir: str) -> dict:
    """`config` (a copy where changed) with the paths of _PATH_KEYS absolute,
    or in `model_dir` (absolute) relative to it."""
    def path(text: str):
        text = os.path.abspath(text)
        if text == model_dir or text.startswith(model_dir + os.sep):
            return _yaml.Reference("${run_config.model_dir}" + text[len(model_dir):])
        return text

    def walk(node, keys):
        if not keys or not isinstance(node, dict):
            return path(node) if not keys and isinstance(node, str) else node
        names = list(node) if keys[0] == "*" else [keys[0]] if keys[0] in node else []
        return dict(node, **{name: walk(node[name], keys[1:]) for name in names})
    for keys in _PATH_KEYS:
        config = walk(config, keys)
    return config


def _receiver_problem(fn) -> Optional[str]:
    """Why a serving_input_receiver_fn, called now with no arguments (and
    again at the export), returns no ServingInputReceiver, or None (one
    that raises is left to the export: it may need what training makes)."""
    from ..export import ServingInputReceiver
    try:
        receiver = fn()
    except Exception:
        return None
    if isinstance(receiver, ServingInputReceiver):
        return None
    return (f"returned {type(receiver).__name__}, not a ServingInputReceiver; return "
            f"est.export.ServingInputReceiver(features, receiver_tensors) (or "
            f"build_raw_serving_input_receiver_fn(...)())")


class SaveExperimentHook(SessionRunHook):
    """Writes an experiment's record (`Experiment.save_hook`), atomically,
    when the training session is created. A record there of another
    experiment (a rerun with other settings) is kept beside it as
    `experiment.<its time>.yaml`: the checkpoints may be its run's (one
    failing before its first save writes none)."""

    def __init__(self, path: str, text: str):
        self.path, self.text = path, text

    def after_create_session(self, session, coord) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        kept = self._keep_other_record()
        atomic_write_bytes(self.path, self.text.encode("utf-8"))
        logger.info("Saved the resolved experiment to %s%s", self.path,
                    f" (the earlier one, of other settings, kept as {kept})" if kept else "")

    def _keep_other_record(self) -> Optional[str]:
        try:
            with open(self.path, encoding="utf-8") as f:
                old = f.read()
            when = time.strftime("%Y%m%dT%H%M%S", time.localtime(os.path.getmtime(self.path)))
        except (OSError, UnicodeDecodeError):
            return None   # (none yet, or unreadable: written over as before)
        if _body(old) == _body(self.text):
            return None
        base, ext = os.path.splitext(self.path)
        kept, n = f"{base}.{when}{ext}", 1
        while os.path.exists(kept):
            n += 1
            kept = f"{base}.{when}-{n}{ext}"
        os.replace(self.path, kept)
        return kept


def _body(record: str) -> str:
    """An experiment record without its header comments (time, command)."""
    return "".join(line for line in record.splitlines(True) if not line.startswith("#"))


def _context(estimator) -> dict:
    return {"estimator": estimator, "checkpoint_dir": estimator.model_dir,
            "output_dir": estimator.model_dir}


# -- loading -------------------------------------------------------------------------------
def load(path: str, overrides: Sequence[str] = ()) -> Experiment:
    """Read, override, interpolate and check an experiment file. Raises
    ExperimentError listing every problem (file, line, key path, fix)."""
    tree = _yaml.load_file(path)
    problems = []   # (all said at once, with the file's)
    for override in overrides:
        _warn_if_new_param(tree.data, override)
        kept = copy.deepcopy((tree.data, tree.marks))
        try:
            _yaml.apply_override(tree, override)
        except ExperimentError as e:   # (the file as it was: no half-made keys)
            tree.data, tree.marks = kept
            problems += e.problems
    config, objects = check(tree, os.path.dirname(os.path.abspath(path)), problems)
    return Experiment(path, config, objects, tree)


def _warn_if_new_param(data, override: str) -> None:
    """`params` are free-form (TF's), so `--set params.learnin_rate=0.3` adds
    a key model_fn never reads: a sweep of such runs trains one model. Said
    where the file's mapping there has other keys."""
    key = override.partition("=")[0].strip()
    try:
        path = _yaml.parse_path(key)
    except ValueError:
        return   # (apply_override says what is wrong)
    node = data
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if path[0] == "params" and len(path) > 1 and isinstance(node, dict) and node \
            and path[-1] not in node:
        close = difflib.get_close_matches(str(path[-1]), [str(k) for k in node], n=1)
        logger.warning("--set %s: %s has no key %r, so it is added%s", override,
                       _yaml.format_path(path[:-1]), path[-1],
                       f" (did you mean {close[0]!r}?)" if close else
                       f" (it has {', '.join(map(str, node))})")
