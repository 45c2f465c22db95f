"""train_and_evaluate, TrainSpec and EvalSpec (tf.estimator.training).

`train_and_evaluate(estimator, train_spec, eval_spec)` is the one call every
task of a cluster makes; what it does follows from the task's TF_CONFIG:

- no cluster (local): train, and after a checkpoint is saved and at least
  `throttle_secs` since the last evaluation, evaluate and export; once more
  at the end. Returns `(eval_result, export_results)` as TF does.
- `chief` (or legacy `master`, which also evaluates as local mode does) and
  `worker`: train. The chief alone writes checkpoints and summaries, and at
  the end a completion marker `model_dir/training_complete.json` with the
  final step.
- `evaluator`: never joins the training process group. Polls `model_dir` for
  new checkpoints, evaluates each new one (with `eval_distribute`), runs the
  exporters, and stops after the checkpoint at `max_steps` (or the final one
  the completion marker names). Checkpoints it evaluated are recorded in a
  ledger, `<eval dir>/evaluated_checkpoints.jsonl`, so a restarted evaluator
  neither repeats nor skips one.
- `ps`: parameter servers come with ParameterServerStrategy; under any other
  strategy a cluster with ps tasks is an error.

Early stopping across processes: when the evaluator's evaluation makes one of
TrainSpec's early-stopping hooks (hooks.stop_if_no_decrease_hook, ...) decide
to stop, it writes `model_dir/stop_training.json`; every trainer polls for it
(a file check every few seconds; a synchronous strategy's stop agreement
makes its replicas stop on the same step) and stops. Markers name the run's
`max_steps`; one from a run with other max_steps is ignored. To train on
after an early stop with the same max_steps, delete `stop_training.json`.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import threading
import time
from typing import Optional

import numpy as np

import hooks as hooks_lib
# Base classes come from the submodules: `hooks` may be half-imported here.
from hooks.basic_session_run_hooks import CheckpointSaverHook, CheckpointSaverListener
from hooks.event_files import EVENT_FILE_PATTERN, read_scalar_events
from hooks import files
from hooks.session_run_hook import NEVER, SessionRunHook, check_hooks
from hooks.training_lock import EvaluationLock

from . import _checks, checkpoint, remote
from ._checks import is_number
from .exporter import Exporter
from .run_config import remote_cluster

logger = logging.getLogger(__name__)

_DELAY_SECS_PER_WORKER = 5
COMPLETION_MARKER = "training_complete.json"
FAILURE_MARKER = "training_failed.json"
# The chief touches this file every _HEARTBEAT_SECS while it trains (a quarter
# of the timeout when that is shorter); a ps task
# or an evaluator that sees it older than the timeout (environment variable
# ESTIMATOR_CHIEF_TIMEOUT_SECS, default 600 s) takes the chief for dead (kill -9
# leaves no failure marker) and stops.
HEARTBEAT = "chief_heartbeat"
_HEARTBEAT_SECS = 5.0
STOP_MARKER = "stop_training.json"
LEDGER = "evaluated_checkpoints.jsonl"
_PIN_DIR = ".checkpoints_in_evaluation"   # in the eval dir: hard links held while evaluating
_UNSEEN_SECS = 60.0         # evaluator: no chief's trace in model_dir so long is said
_POLL_SECS = 0.5            # evaluator: how often to look at model_dir
_STOP_POLL_SECS = 2.0       # trainers: how often to look for the stop marker
_CHECKPOINT_POLICIES = ("latest", "every")


# -- specs ------------------------------------------------------------------------
def _validate_input_fn(input_fn) -> None:
    if not callable(input_fn):
        raise TypeError(f"`input_fn` must be callable, given: {input_fn!r}")


def _validate_saving_listeners(listeners) -> tuple:
    listeners = tuple(listeners or ())
    for listener in listeners:
        if not isinstance(listener, hooks_lib.CheckpointSaverListener):
            raise TypeError("All saving_listeners must be `CheckpointSaverListener` "
                            f"instances, given: {listener!r}")
    return listeners


def _validate_exporters(exporters) -> tuple:
    if not exporters:
        return ()
    if isinstance(exporters, Exporter):
        exporters = [exporters]
    try:
        exporters = list(exporters)
    except TypeError:
        raise TypeError(f"`exporters` must be an Exporter, an iterable of Exporter, or "
                        f"`None`, found {exporters!r}.") from None
    names = []
    for exporter in exporters:
        if not isinstance(exporter, Exporter):
            raise TypeError(f"`exporters` must be an Exporter, an iterable of Exporter, or "
                            f"`None`, found {exporters!r}.")
        if not exporter.name:
            raise ValueError("An Exporter cannot have a name that is `None` or empty. All "
                             f"exporter names: {[e.name for e in exporters]}")
        if not isinstance(exporter.name, str):
            raise ValueError(f"An Exporter must have a string name. Given: "
                             f"{type(exporter.name)}")
        if exporter.name in names:
            raise ValueError("`exporters` must have unique names. Such a name cannot be "
                             f"`None`. All exporter names: {[e.name for e in exporters]}")
        names.append(exporter.name)
    return tuple(exporters)


class TrainSpec(collections.namedtuple("TrainSpec",
                                       ["input_fn", "max_steps", "hooks", "saving_listeners"])):
    """The training part of `train_and_evaluate` (tf.estimator.TrainSpec):
    `input_fn`, `max_steps` (None trains forever), `hooks` (every trainer),
    `saving_listeners` (the chief)."""

    def __new__(cls, input_fn, max_steps=None, hooks=None, saving_listeners=None):
        _validate_input_fn(input_fn)
        max_steps = _checks.steps(max_steps, "max_steps")
        return super().__new__(cls, input_fn=input_fn, max_steps=max_steps,
                               hooks=tuple(check_hooks(hooks)),
                               saving_listeners=_validate_saving_listeners(saving_listeners))


class EvalSpec(collections.namedtuple("EvalSpec", [
        "input_fn", "steps", "name", "hooks", "exporters", "start_delay_secs",
        "throttle_secs", "checkpoint_policy"])):
    """The evaluation and export part of `train_and_evaluate` (tf.estimator.EvalSpec).

    `steps` batches per evaluation (None: the whole input); `name` picks the
    eval directory (`eval_<name>`); `exporters` run after each evaluation;
    the evaluator task waits `start_delay_secs` before its first evaluation
    and starts one no more often than every `throttle_secs`.

    `checkpoint_policy` (not in TF) says what a separate evaluator does when
    it falls behind: "latest" evaluates only the newest checkpoint (TF's way;
    the final one is never skipped), "every" evaluates each checkpoint in
    order, and the chief then keeps every checkpoint the evaluator has not
    yet recorded in its ledger beyond `keep_checkpoint_max` (so with "every",
    run an evaluator).
    """

    def __new__(cls, input_fn, steps=100, name=None, hooks=None, exporters=None,
                start_delay_secs=120, throttle_secs=600, checkpoint_policy="latest"):
        _validate_input_fn(input_fn)
        steps = _checks.steps(steps, "steps")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"`name` must be string, given: {name!r}")
        hooks = tuple(check_hooks(hooks))
        exporters = _validate_exporters(exporters)
        if not is_number(start_delay_secs):
            raise TypeError(f"`start_delay_secs` must be a number, given: {start_delay_secs!r}")
        if start_delay_secs < 0:
            raise ValueError(f"Must specify start_delay_secs >= 0, given: {start_delay_secs}")
        if not is_number(throttle_secs):
            raise TypeError(f"`throttle_secs` must be a number, given: {throttle_secs!r}")
        if throttle_secs < 0:
            raise ValueError(f"Must specify throttle_secs >= 0, given: {throttle_secs}")
        if checkpoint_policy not in _CHECKPOINT_POLICIES:
            raise ValueError(f"`checkpoint_policy` must be one of {_CHECKPOINT_POLICIES}, "
                             f"given: {checkpoint_policy!r}")
        return super().__new__(cls, input_fn=input_fn, steps=steps, name=name, hooks=hooks,
                               exporters=exporters, start_delay_secs=start_delay_secs,
                               throttle_secs=throttle_secs, checkpoint_policy=checkpoint_policy)


# -- the entry point -----------------------------------------------------------------
def train_and_evaluate(estimator, train_spec: TrainSpec, eval_spec: EvalSpec):
    """Train and evaluate `estimator` as this task's role says
    (tf.estimator.train_and_evaluate).

    Returns `(eval_result, export_results)` locally (the last evaluation and
    what its exporters returned; `(None, None)` when nothing was trained), the
    same for the evaluator task, and None for the training tasks.
    """
    from .estimator import Estimator
    if not isinstance(estimator, Estimator):
        raise TypeError(f"`estimator` must have type `estimator.Estimator`. Got: "
                        f"{type(estimator)}")
    if not isinstance(train_spec, TrainSpec):
        raise TypeError(f"`train_spec` must have type `estimator.TrainSpec`. Got: "
                        f"{type(train_spec)}")
    if not isinstance(eval_spec, EvalSpec):
        raise TypeError(f"`eval_spec` must have type `estimator.EvalSpec`. Got: "
                        f"{type(eval_spec)}")
    config = estimator.config
    cluster = remote_cluster(config)
    if cluster is not None and not remote.is_remote_role():
        logger.info("train_and_evaluate: the standalone client, running each task of %s on "
                    "its estimator server", cluster)
        remote.run_remote(cluster)
        return None
    if not config.cluster_spec and config.task_type != "evaluator":
        logger.info("Running training and evaluation locally (non-distributed).")
        return _run_local(estimator, train_spec, eval_spec)
    task_type = config.task_type
    if not task_type:
        raise ValueError("`estimator.config` must have task_type set. This usually means "
                         "TF_CONFIG environment is not set correctly.")
    if task_type == "local":
        raise ValueError("`task.type` in TF_CONFIG cannot be `local`. Leaving `cluster` and "
                         "`task` properties in TF_CONFIG absent triggers train and evaluate "
                         "`Estimator` locally (non-distributed).")
    if task_type == "evaluator" and config.task_id:
        raise ValueError("For distributed training, there can only be one `evaluator` task "
                         f"(with task id 0).  Given task id {config.task_id}")
    role = _ROLES.get(task_type)
    if task_type == "worker" and config.is_chief:   # worker 0 of a chief-less cluster
        role = _run_chief
    if role is None:
        raise ValueError(f"Task type {task_type!r} (TF_CONFIG task {task_type}:"
                         f"{config.task_id}) is not supported. Supported task types are "
                         f"{sorted(_ROLES)}")
    logger.info("train_and_evaluate: running as %s %s%s", task_type, config.task_id,
                " (the chief)" if role is _run_chief and task_type != "chief" else "")
    return role(estimator, train_spec, eval_spec)


# -- local mode ------------------------------------------------------------------------
def _run_local(estimator, train_spec, eval_spec):
    """Train, evaluating after checkpoints (TF's _TrainingExecutor.run_local)."""
    c = estimator.config
    logger.info("Start train and evaluate loop. The evaluate will happen after every "
                "checkpoint. Checkpoint frequency is determined based on RunConfig "
                "arguments: save_checkpoints_steps %s or save_checkpoints_secs %s.",
                c.save_checkpoints_steps, c.save_checkpoints_secs)
    evaluator = _Evaluator(estimator, eval_spec, train_spec.max_steps)
    listener = _NewCheckpointListenerForEvaluate(evaluator, eval_spec.throttle_secs)
    estimator.train(train_spec.input_fn, hooks=list(train_spec.hooks),
                    max_steps=train_spec.max_steps,
                    saving_listeners=list(train_spec.saving_listeners) + [listener])
    metrics = listener.eval_result.metrics if listener.eval_result else None
    return metrics, listener.export_results


class _NewCheckpointListenerForEvaluate(CheckpointSaverListener):
    """Evaluates (and exports) after a save, at most once every `throttle_secs`,
    and at the end of training if the last step was not evaluated (TF's
    _NewCheckpointListenerForEvaluate). Our CheckpointSaverHook writes no
    step-0 checkpoint, so the first save is evaluated too."""

    def __init__(self, evaluator: "_Evaluator", eval_throttle_secs: float):
        self._evaluator = evaluator
        self._eval_throttle_secs = eval_throttle_secs
        self.eval_result, self.export_results = None, None

    def begin(self):
        self._timer = hooks_lib.SecondOrStepTimer(every_secs=self._eval_throttle_secs)

    def after_save(self, session, global_step_value):
        if self._timer.should_trigger_for_step(global_step_value):
            self._timer.update_last_triggered_step(global_step_value)
            self._evaluate()
            return self._evaluator.stop_requested
        logger.info("Skip the current checkpoint eval due to throttle secs (%s secs).",
                    self._eval_throttle_secs)

    def end(self, session, global_step_value):
        latest = self._evaluator.estimator.latest_checkpoint()
        evaluated = self.eval_result.checkpoint_path if self.eval_result else None
        if latest is not None and latest != evaluated:
            self._timer.update_last_triggered_step(global_step_value)
            self._evaluate()

    def _evaluate(self):
        path = self._evaluator.estimator.latest_checkpoint()
        if path is None:
            raise RuntimeError("There was no new checkpoint after the training.")
        with checkpoint.rng_preserved():   # training goes on as if it had not evaluated
            self.eval_result, self.export_results = (   # (TF evaluates in a graph of its own)
                self._evaluator.evaluate_and_export(path, *self._evaluator.hold(path)))


# -- evaluation shared by every mode -----------------------------------------------------
_EvalResult = collections.namedtuple("_EvalResult", ["metrics", "checkpoint_path"])


class _Ledger:
    """The checkpoints evaluated so far: one JSON line per checkpoint in
    `<eval dir>/evaluated_checkpoints.jsonl` (checkpoint name, global step,
    metrics), appended and fsynced after the evaluation and its exports."""

    def __init__(self, eval_dir: str):
        self.path = os.path.join(eval_dir, LEDGER)

    def entries(self) -> list:
        if not os.path.exists(self.path):
            return []
        out = []
        with open(self.path) as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    entry = json.loads(line)
                    int(entry["global_step"])
                except (ValueError, KeyError, TypeError):
                    logger.warning("%s:%d: ignoring an unreadable ledger line (a crash "
                                   "mid-write?): %.80s", self.path, lineno, line)
                    continue
                out.append(entry)
        return out

    def evaluated(self) -> dict:
        """{global step: what was seen of the checkpoint evaluated at it
        (`_seen`'s digest and mtime_ns: None in lines of earlier versions) and
        when (time)}."""
        return {int(e["global_step"]): {"digest": e.get("digest"),
                                        "mtime_ns": e.get("mtime_ns"), "time": e.get("time")}
                for e in self.entries()}

    def record(self, checkpoint_path: str, metrics: dict, seen: dict) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        entry = {"checkpoint": os.path.basename(checkpoint_path),
                 "global_step": checkpoint.step_of(checkpoint_path), **seen,
                 "metrics": {k: _jsonable(v) for k, v in metrics.items()},
                 "time": time.time()}
        line = json.dumps(entry) + "\n"
        with files.naming(self.path), open(self.path, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":      # a torn last line: start a fresh one
                    line = "\n" + line
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.floating) and value.dtype.itemsize < 8:
        return float(str(value))   # float32's shortest digits, as `estimator evaluate` prints
    if isinstance(value, np.generic):
        return value.item()
    return value


def _eval_dir(estimator, name: Optional[str]) -> str:
    return os.path.join(estimator.model_dir, "eval" if not name else "eval_" + name)


class _Evaluator:
    """Calls `Estimator.evaluate` on a checkpoint, runs the exporters, records
    the ledger and asks TrainSpec's early-stopping predicates (TF's
    _TrainingExecutor._Evaluator)."""

    def __init__(self, estimator, eval_spec: EvalSpec, max_training_steps: Optional[int],
                 should_stop_fns=(), pin_dir: Optional[str] = None):
        self.estimator = estimator
        self._pin_dir = pin_dir   # another process's checkpoints: hold them while in use
        self._eval_spec = eval_spec
        self._max_training_steps = max_training_steps
        self._should_stop_fns = list(should_stop_fns)
        eval_dir = _eval_dir(estimator, eval_spec.name)
        self.ledger = _Ledger(eval_dir)
        # Evaluations whose summaries reached the event files before a crash
        # kept their ledger line from being written: recorded, not repeated.
        self._summarized = read_scalar_events(os.path.join(eval_dir, EVENT_FILE_PATTERN))
        self.stop_requested = False

    def hold(self, checkpoint_path: str) -> tuple:
        """(held path, contents, `_seen` of it) of `checkpoint_path`: linked
        in the pin dir (kept while the chief's Saver deletes it) and read.
        FileNotFoundError if it was deleted before it could be held,
        DataLossError if damaged. `evaluate_and_export` lets it go."""
        held = checkpoint.pin(checkpoint_path, self._pin_dir) if self._pin_dir else checkpoint_path
        try:
            return held, checkpoint.load(held), _seen(held)
        except checkpoint.DataLossError as e:   # (named by its own path, not the link's)
            checkpoint.unpin(held, checkpoint_path)
            raise checkpoint.DataLossError(str(e).replace(held, checkpoint_path)) from None
        except BaseException:
            checkpoint.unpin(held, checkpoint_path)
            raise

    def _keys_recorded(self) -> set:
        """The metric keys of the last evaluation the ledger holds: an
        evaluation whose summaries a crash cut short (some of its scalars
        never flushed) lacks some, and is evaluated again."""
        entries = self.ledger.entries()
        return set(entries[-1].get("metrics", {})) - {"global_step"} if entries else set()

    def evaluate_and_export(self, checkpoint_path: str, held: str, state: dict, seen: dict):
        """Evaluate `checkpoint_path` (`hold`'s `held`, `state` and `seen`),
        export, record. The export is final (FinalExporter exports) where the
        step reached max_steps, as TF's: never for a run that ended before it
        (early stopping, the input ran out, no max_steps). A checkpoint
        already evaluated by an evaluator that died before its ledger line is
        not evaluated again (no duplicate TensorBoard points): its metrics are
        read back from the event files (those written after the checkpoint:
        older ones at its step are of a checkpoint that training started over
        replaced), and it is exported and recorded."""
        spec = self._eval_spec
        step = checkpoint.step_of(checkpoint_path)
        written, summarized = self._summarized.pop(step, (None, None))
        if summarized is not None and written < os.stat(held).st_mtime:
            summarized = None
        try:
            if summarized is not None and "loss" in summarized and \
                    self._keys_recorded() <= set(summarized):
                logger.info("%s was evaluated before this evaluator restarted (its summaries "
                            "are in %s): recording it without evaluating it again",
                            checkpoint_path, os.path.dirname(self.ledger.path))
                metrics = dict(summarized, global_step=step)
            else:   # (named by its own path in the eval dir, not the link's)
                metrics = self.estimator._evaluate_checkpoint(
                    spec.input_fn, spec.steps, list(spec.hooks), spec.name, checkpoint_path,
                    state)
            if not isinstance(metrics, dict) or "global_step" not in metrics:
                raise ValueError(f"Internal error: `Estimator.evaluate` result should have "
                                 f"`global_step` in result. Given {metrics!r}")
            final = bool(self._max_training_steps
                         and metrics["global_step"] >= self._max_training_steps)
            export_results = self.export(_EvalResult(metrics, held), final)
        finally:
            checkpoint.unpin(held, checkpoint_path)
        result = _EvalResult(metrics, checkpoint_path)
        self.ledger.record(checkpoint_path, metrics, seen)
        self.stop_requested = any(fn() for fn in self._should_stop_fns)
        return result, export_results

    def export(self, result: _EvalResult, final: bool) -> list:
        export_dir_base = os.path.join(self.estimator.model_dir, "export")
        results = [exporter.export(self.estimator, os.path.join(export_dir_base, exporter.name),
                                   result.checkpoint_path, result.metrics, final)
                   for exporter in self._eval_spec.exporters]
        return results


# -- markers in model_dir -------------------------------------------------------------
def _write_json(path: str, data: dict) -> None:
    """Atomically (temp file, fsync, rename) write `data` as JSON."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = json.dumps(data).encode()
    files.atomic_write_bytes(path, text)


def _read_marker(model_dir: str, name: str, max_steps: Optional[int]) -> Optional[dict]:
    """The marker `name` if it belongs to a run with these `max_steps` (a
    marker left by a run with other max_steps is stale), else None."""
    path = os.path.join(model_dir, name)
    try:
        with open(path) as f:
            marker = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.warning("Ignoring unreadable marker %s: %s", path, e)
        return None
    if marker.get("max_steps") != max_steps:
        return None
    return marker


def _completion(model_dir: str, max_steps: Optional[int]) -> Optional[dict]:
    """The chief's completion marker for this run: {"global_step": final step, ...}."""
    return _read_marker(model_dir, COMPLETION_MARKER, max_steps)


def _failure(model_dir: str, max_steps: Optional[int], since: float) -> Optional[dict]:
    """The chief's failure marker, written since `since` (this task's start: an
    older one belongs to a run a restart replaced): {"error": ..., ...}; or,
    with no marker, a chief silent for longer than the heartbeat timeout
    (killed without a word) since its last heartbeat or `since`, whichever is later."""
    marker = _read_marker(model_dir, FAILURE_MARKER, max_steps)
    if marker is not None and marker.get("time", 0) >= since:
        return marker
    try:
        beat = os.stat(os.path.join(model_dir, HEARTBEAT)).st_mtime
    except OSError:
        return None   # no chief has trained here yet: the start-up wait applies
    timeout = _chief_timeout()
    silent = time.time() - max(beat, since)
    if silent > timeout:
        return {"error": f"the chief has not trained for {silent:.0f} s (no heartbeat in "
                         f"{os.path.join(model_dir, HEARTBEAT)} for over "
                         f"ESTIMATOR_CHIEF_TIMEOUT_SECS={timeout:g}): killed, or preempted "
                         "and not restarted?"}
    return None


def _chief_timeout() -> float:
    return float(os.environ.get("ESTIMATOR_CHIEF_TIMEOUT_SECS", 600))


class _Heartbeat:
    """A thread touching `path` every _HEARTBEAT_SECS (a quarter of the
    timeout when that is shorter) until `stop()`, which removes it."""

    def __init__(self, path: str):
        self._path, self._stop = path, threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="chief-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            with open(self._path, "a"):
                os.utime(self._path)
        except OSError as e:
            logger.warning("Could not write the chief's heartbeat %s: %s", self._path, e)

    def _run(self) -> None:
        while not self._stop.wait(min(_HEARTBEAT_SECS, _chief_timeout() / 4)):
            self._beat()

    def stop(self, remove: bool = True) -> None:
        self._stop.set()
        self._thread.join()
        if remove:
            try:
                os.remove(self._path)
            except OSError:
                pass


class TrainingFailedError(RuntimeError):
    """The chief's training failed: a ps task or the evaluator stops too."""


class _StopMarkerHook(SessionRunHook):
    """Stops a trainer when the evaluator has written the stop marker: one
    file check every `_STOP_POLL_SECS` seconds. Under a synchronous strategy
    the session's stop agreement makes every replica stop on the step where
    the first one saw it."""

    def __init__(self, model_dir: str, max_steps: Optional[int]):
        self._model_dir = model_dir
        self._max_steps = max_steps
        self._next = 0.0

    def after_create_session(self, session, coord):
        self._next = time.time() + _STOP_POLL_SECS
        if self._found():
            coord.request_stop()

    def after_run(self, run_context, run_values):
        now = time.time()
        if now >= self._next:
            self._next = now + _STOP_POLL_SECS
            if self._found():
                run_context.request_stop()

    def _idle(self, session):
        return NEVER, NEVER, self._next

    def _found(self) -> bool:
        if _read_marker(self._model_dir, STOP_MARKER, self._max_steps) is None:
            return False
        logger.info("Stopping: the evaluator requested early stopping (%s)",
                    os.path.join(self._model_dir, STOP_MARKER))
        return True


class _ProtectUnevaluated(CheckpointSaverListener):
    """Makes the chief's checkpoint clean-up keep every checkpoint newer than
    the last one the evaluator's ledger has of these checkpoints (EvalSpec
    checkpoint_policy="every"). hooks' training_hooks hands
    `protect_checkpoint` to the Saver."""

    def __init__(self, ledger: _Ledger, model_dir: str):
        self._ledger = ledger
        self._model_dir = model_dir
        self._last = (None, -1)   # (the ledger's and index's stat, the last step evaluated)

    def protect_checkpoint(self, path: str) -> bool:
        return checkpoint.step_of(path) > self._last_evaluated()

    def _last_evaluated(self) -> int:
        """Read again only when the ledger or the index changed (a save asks
        for each checkpoint it may delete)."""
        key = tuple(_stat_key(p) for p in (self._ledger.path,
                                           os.path.join(self._model_dir, checkpoint.INDEX)))
        if key != self._last[0]:
            done = _current(self._ledger.evaluated(), self._model_dir)
            self._last = (key, max(done, default=-1))
        return self._last[1]


def _stat_key(path: str) -> Optional[tuple]:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


# -- distributed roles ----------------------------------------------------------------
def _train_strategy(config):
    import distribute
    return config.train_distribute or distribute.get_strategy()


def _synchronises_state(strategy) -> bool:
    """Whether `strategy` gives every trainer the chief's state itself (a
    process group broadcast, parameter servers) rather than through a checkpoint."""
    return strategy.cluster_resolver is not None or strategy.extended.in_multi_worker_mode()


def _check_cluster_strategy(config):
    strategy = _train_strategy(config)
    if config.num_ps_replicas and not strategy.extended.uses_parameter_servers:
        raise ValueError(
            f"The cluster in TF_CONFIG has {config.num_ps_replicas} 'ps' task(s), but "
            f"train_distribute is {strategy!r}, which does not use parameter servers. Use "
            "ParameterServerStrategy, or remove the 'ps' job from the cluster.")
    return strategy


def _trainer_hooks(estimator, train_spec) -> list:
    return list(train_spec.hooks) + [_StopMarkerHook(estimator.model_dir, train_spec.max_steps)]


def _worker_start_delay(config) -> float:
    """TF's (task_id + 1) * 5 s worker delay, capped, when
    RunConfig(experimental_max_worker_delay_secs=cap) asks for it (off by default)."""
    cap = config.experimental_max_worker_delay_secs
    if cap is None or config.task_type != "worker":
        return 0
    return min(int(cap), (config.task_id + 1) * _DELAY_SECS_PER_WORKER)


def _run_chief(estimator, train_spec, eval_spec, extra_listeners=()):
    """Train as the chief; write the completion marker at the end."""
    config = estimator.config
    _check_cluster_strategy(config)
    model_dir = estimator.model_dir
    os.makedirs(model_dir, exist_ok=True)
    for name in (COMPLETION_MARKER, FAILURE_MARKER):
        stale = os.path.join(model_dir, name)
        if os.path.exists(stale):
            os.remove(stale)
    listeners = list(train_spec.saving_listeners) + list(extra_listeners)
    train_hooks = _trainer_hooks(estimator, train_spec)
    if eval_spec.checkpoint_policy == "every" and (
            config.save_checkpoints_steps or config.save_checkpoints_secs
            or any(isinstance(h, CheckpointSaverHook) for h in train_hooks)):
        listeners.append(_ProtectUnevaluated(_Ledger(_eval_dir(estimator, eval_spec.name)),
                                             model_dir))
    heartbeat = _Heartbeat(os.path.join(model_dir, HEARTBEAT))
    # the heartbeat left to go stale: training failed and no marker could say
    # so, or was preempted (should the job not restart, the evaluator and ps
    # tasks stop after ESTIMATOR_CHIEF_TIMEOUT_SECS)
    untold = False
    try:
        estimator.train(train_spec.input_fn, hooks=train_hooks, max_steps=train_spec.max_steps,
                        saving_listeners=listeners)
        latest = estimator.latest_checkpoint()
        final_step = checkpoint.step_of(latest) if latest else 0
        _write_json(os.path.join(model_dir, COMPLETION_MARKER),
                    {"global_step": final_step, "max_steps": train_spec.max_steps,
                     "time": time.time()})
    except hooks_lib.TrainingPreempted:
        untold = True
        raise
    except Exception as e:   # (not a preemption, a SystemExit: the job restarts)
        marker = os.path.join(model_dir, FAILURE_MARKER)
        try:
            _write_json(marker, {"max_steps": train_spec.max_steps, "time": time.time(),
                                 "error": f"{type(e).__name__}: {str(e)[:500]}"})
            logger.error("Training failed; wrote %s so that the ps tasks, the workers and the "
                         "evaluator stop", marker)
        except OSError as marking:
            untold = True
            logger.error("Training failed, and %s could not be written (%s): the ps tasks, "
                         "the workers and the evaluator stop once the chief's heartbeat is "
                         "older than ESTIMATOR_CHIEF_TIMEOUT_SECS=%g", marker, marking,
                         _chief_timeout())
        raise
    finally:
        # removed (a marker says how training ended, or a preemption's exit
        # code), or left to go stale
        heartbeat.stop(remove=not untold)
    logger.info("Training complete at global step %d; wrote %s", final_step,
                os.path.join(model_dir, COMPLETION_MARKER))


def _run_master(estimator, train_spec, eval_spec):
    """Legacy `master`: the chief, also evaluating after checkpoints in-process
    (TF's run_master)."""
    evaluator = _Evaluator(estimator, eval_spec, train_spec.max_steps)
    listener = _NewCheckpointListenerForEvaluate(evaluator, eval_spec.throttle_secs)
    _run_chief(estimator, train_spec, eval_spec, extra_listeners=[listener])


def _run_worker(estimator, train_spec, eval_spec):
    """Train as a non-chief worker: no checkpoints, no summaries."""
    config = estimator.config
    strategy = _check_cluster_strategy(config)
    if not _synchronises_state(strategy):
        # (TF's worker would wait for ever for the chief to make its variables)
        raise ValueError(
            f"{config.task_type} {config.task_id} has no model to train with: the cluster in "
            f"TF_CONFIG has no 'ps' tasks and train_distribute {strategy!r} does not span "
            "workers, so its updates would reach neither the chief's model nor a checkpoint. "
            "Give train_distribute=MultiWorkerMirroredStrategy() (synchronous), add 'ps' tasks "
            "(ParameterServerStrategy, asynchronous), or leave the workers out")
    delay = _worker_start_delay(config)
    if delay:
        logger.info("Waiting %d secs before starting training.", delay)
        time.sleep(delay)
    estimator.train(train_spec.input_fn, hooks=_trainer_hooks(estimator, train_spec),
                    max_steps=train_spec.max_steps)
    # Under parameter servers, ps 0 hands out no more global steps once the
    # chief's marker says training ended: a failure too, which is this
    # worker's as well (it exits non-zero, as the ps tasks and the evaluator).
    # Any marker there now is this chief's (a chief removes them as it starts).
    failed = _read_marker(estimator.model_dir, FAILURE_MARKER, train_spec.max_steps) \
        if strategy.extended.uses_parameter_servers else None
    if failed is not None:
        raise TrainingFailedError(f"worker {config.task_id}: training failed on the chief "
                                  f"({failed['error']}); this worker stops")


def _run_ps(estimator, train_spec, eval_spec):
    """Serve parameters until training ends (ParameterServerStrategy)."""
    strategy = _train_strategy(estimator.config)
    if not strategy.extended.uses_parameter_servers:
        raise ValueError(
            f"This task is 'ps' {estimator.config.task_id}, but train_distribute is "
            f"{strategy!r}, which does not use parameter servers. Use "
            "ParameterServerStrategy, or remove the 'ps' job from the cluster.")
    model_dir, max_steps, start = estimator.model_dir, train_spec.max_steps, time.time()
    # SIGTERM/SIGINT (Kubernetes stops every pod of a job at once): serve on
    # until the chief has saved at the step training stops at, then exit as
    # the trainers do, PREEMPTION_EXIT_CODE, so restart policies restart it too.
    with hooks_lib.preemption.Watcher() as watcher:
        preempted = strategy.extended.serve(
            stop_when=lambda: _completion(model_dir, max_steps) is not None
            or _failure(model_dir, max_steps, start) is not None,
            signalled=lambda: watcher.signalled)
    failed = _failure(model_dir, max_steps, start)
    if failed is not None:
        raise TrainingFailedError(f"ps {estimator.config.task_id}: training failed on the "
                                  f"chief ({failed['error']}); stopped serving")
    if preempted is not None:
        who, step = preempted
        raise hooks_lib.TrainingPreempted(step, f"{who}'s signal")


def _early_stopping_fns(train_spec) -> list:
    """The predicates of TrainSpec's early-stopping hooks (hooks.early_stopping)."""
    fns = []
    for hook in train_spec.hooks:
        fn = getattr(hook, "should_stop_fn", None)
        if callable(fn):
            fns.append(fn)
    return fns


def _run_evaluator(estimator, train_spec, eval_spec):
    """Evaluate new checkpoints until the one at max_steps (or the final one)
    has been evaluated (TF's run_evaluator / _start_continuous_evaluation),
    holding the eval dir's lock (one evaluator per eval dir)."""
    with EvaluationLock(_eval_dir(estimator, eval_spec.name)):
        return _evaluate_continuously(estimator, train_spec, eval_spec)


def _evaluate_continuously(estimator, train_spec, eval_spec):
    model_dir, max_steps = estimator.model_dir, train_spec.max_steps
    pin_dir = os.path.join(_eval_dir(estimator, eval_spec.name), _PIN_DIR)
    shutil.rmtree(pin_dir, ignore_errors=True)   # links left by a killed evaluator
    evaluator = _Evaluator(estimator, eval_spec, max_steps, _early_stopping_fns(train_spec),
                           pin_dir=pin_dir)
    ledger = evaluator.ledger
    evaluated = ledger.evaluated()   # of these checkpoints, or of older ones (`_current`)
    done = _current(evaluated, model_dir)
    if done:
        logger.info("Evaluator resuming: %d checkpoint(s) already evaluated (last: step %d) "
                    "per %s", len(done), max(done), ledger.path)
    if eval_spec.start_delay_secs:
        logger.info("Waiting %f secs before starting eval.", eval_spec.start_delay_secs)
        time.sleep(eval_spec.start_delay_secs)
    last = (None, None)
    last_start = None
    last_warning = None   # not 0.0: the monotonic clock starts at boot, maybe <600 s ago
    start, told_unseen = time.time(), False
    while True:
        done = _current(evaluated, model_dir)
        complete = _completion(model_dir, max_steps)
        final_step = complete["global_step"] if complete else None
        if _finished(done, max_steps, final_step):
            logger.info("Exiting evaluation, global_step=%s, train max_steps=%s",
                        max(done, default=None), max_steps)
            return last
        pending = _pending_checkpoints(model_dir, done, eval_spec.checkpoint_policy)
        is_final = [final_step is not None and checkpoint.step_of(p) >= final_step
                    or bool(max_steps and checkpoint.step_of(p) >= max_steps) for p in pending]
        throttled = (last_start is not None
                     and time.monotonic() < last_start + eval_spec.throttle_secs)
        if not pending:
            failed = _failure(model_dir, max_steps, start)
            if failed is not None:
                raise TrainingFailedError(f"The evaluator stops: training failed on the chief "
                                          f"({failed['error']}); restart the job to go on")
        if not pending and not done and not told_unseen and time.time() - start > _UNSEEN_SECS \
                and not os.path.exists(os.path.join(model_dir, HEARTBEAT)):
            logger.warning(
                "No chief has trained in %s after %.0f s (no checkpoint, no %s there): is it "
                "the model_dir the chief writes? A relative model_dir is taken in each task's "
                "working directory (this one's: %s); give every task one path they all see",
                os.path.abspath(model_dir), time.time() - start, HEARTBEAT, os.getcwd())
            told_unseen = True
        if not pending or (throttled and not any(is_final)):
            if not pending and (last_warning is None or time.monotonic() - last_warning > 600):
                logger.info("No new checkpoint ready for evaluation in %s%s.", model_dir,
                            "" if done else " (the estimator is not trained yet)")
                last_warning = time.monotonic()
            time.sleep(_POLL_SECS)
            continue
        last_start = time.monotonic()
        for path, final in zip(pending, is_final):
            try:   # (only the checkpoint's own read: errors of input_fn or hooks stop)
                held, state, seen = evaluator.hold(path)
            except FileNotFoundError:
                logger.warning("Checkpoint %s was deleted before it could be evaluated "
                               "(keep_checkpoint_max on the chief; use EvalSpec("
                               "checkpoint_policy='every') to keep unseen ones)", path)
                continue
            except checkpoint.DataLossError as e:
                if final:   # (the last of the training: none comes after it)
                    raise checkpoint.DataLossError(
                        f"The final checkpoint {path} is damaged, so it is not evaluated or "
                        f"exported: {e}. Train again (training resumes from the newest good "
                        "checkpoint), then restart the evaluator") from None
                logger.warning("Checkpoint %s is not evaluated: %s", path, e)
                evaluated[checkpoint.step_of(path)] = dict(_seen(path), time=time.time())
                continue
            result, exports = evaluator.evaluate_and_export(path, held, state, seen)
            evaluated[checkpoint.step_of(path)] = dict(seen, time=time.time())
            last = (result.metrics, exports)
            if evaluator.stop_requested and not _read_marker(model_dir, STOP_MARKER, max_steps):
                _write_json(os.path.join(model_dir, STOP_MARKER),
                            {"global_step": int(result.metrics["global_step"]),
                             "max_steps": max_steps, "time": time.time(),
                             "reason": "an early-stopping hook decided on this evaluation"})
                logger.info("Early stopping requested at global step %d; trainers stop "
                            "on %s", result.metrics["global_step"], STOP_MARKER)


def _seen(path: str) -> dict:
    """What tells checkpoint `path` from another saved at its step: its
    content digest (None without one) and its file's mtime (ns; a checkpoint
    saved again, even with the same content, has another)."""
    return {"digest": checkpoint.digest(path), "mtime_ns": os.stat(path).st_mtime_ns}


def _current(evaluated: dict, model_dir: str) -> dict:
    """The evaluations of `evaluated` (`_Ledger.evaluated`'s) that are of the
    training whose checkpoints are now in model_dir. Where training started
    over (its checkpoints deleted, the index rolled back), the checkpoint at
    an evaluated step is another, or one at or before it was written after
    it (the file mtimes compared, one clock; a line of an earlier version
    has only the evaluation's time), or the latest is older: those
    evaluations were of checkpoints no longer there, and count as not made
    (as TF's evaluator, which evaluates each new latest path, would make
    them)."""
    latest = checkpoint.latest_checkpoint(model_dir)
    if latest is None:   # (none yet: none of this training's was evaluated)
        return {}
    now = {}
    for path in checkpoint.all_checkpoints(model_dir) + [latest]:
        try:
            now[checkpoint.step_of(path)] = _seen(path)
        except FileNotFoundError:   # (deleted since the index was read)
            continue
    last = checkpoint.step_of(latest)
    current = {}
    for step, was in evaluated.items():
        if step > last:
            continue
        same = now.get(step)
        if same is not None and any(was[k] is not None and same[k] is not None
                                    and was[k] != same[k] for k in ("digest", "mtime_ns")):
            continue
        written = was["mtime_ns"] if was["mtime_ns"] is not None else (was["time"] or 0) * 1e9
        if any(s <= step and seen["mtime_ns"] > written for s, seen in now.items()):
            continue
        current[step] = was
    return current


def _finished(done: dict, max_steps: Optional[int], final_step: Optional[int]) -> bool:
    last = max(done, default=None)
    if last is None:
        return False
    if max_steps and last >= max_steps:
        return True
    return final_step is not None and last >= final_step


def _pending_checkpoints(model_dir: str, done: dict, policy: str) -> list:
    """Checkpoints to evaluate now, oldest first: the latest one if not yet
    evaluated ("latest"), or every one newer than the last evaluated ("every")."""
    last = max(done, default=-1)
    if policy == "latest":
        latest = checkpoint.latest_checkpoint(model_dir)
        return [latest] if latest and checkpoint.step_of(latest) > last else []
    paths = checkpoint.all_checkpoints(model_dir)
    latest = checkpoint.latest_checkpoint(model_dir)
    if latest and latest not in paths:
        paths.append(latest)
    return sorted((p for p in paths if checkpoint.step_of(p) > last), key=checkpoint.step_of)


_ROLES = {
    "chief": _run_chief,
    "master": _run_master,
    "worker": _run_worker,
    "ps": _run_ps,
    "evaluator": _run_evaluator,
}
