"""The basic hooks (tf.estimator's basic_session_run_hooks): SecondOrStepTimer,
StopAtStepHook, CheckpointSaverListener, CheckpointSaverHook, LoggingTensorHook,
NanTensorHook, GlobalStepWaiterHook, FinalOpsHook, FeedFnHook."""
from __future__ import annotations

import contextlib
import logging
import numbers
import time
from typing import Callable, Iterable, List, Optional

import numpy as np
import torch

from distribute.host_arrays import to_numpy

from . import checkpoint, model_scope

from .scaffold import check_scaffold
from .session_run_hook import NEVER, SessionRunArgs, SessionRunHook

logger = logging.getLogger(__name__)


class SecondOrStepTimer:
    """Triggers every N seconds or every N steps (tf.estimator.SecondOrStepTimer)."""

    def __init__(self, every_secs: Optional[float] = None, every_steps: Optional[int] = None):
        if (every_secs is None) == (every_steps is None):
            raise ValueError("SecondOrStepTimer: exactly one of every_secs and every_steps "
                             f"must be given, got every_secs={every_secs}, every_steps={every_steps}")
        if every_secs is not None and every_secs < 0:
            raise ValueError(f"SecondOrStepTimer: every_secs must be >= 0, got {every_secs}")
        if every_steps is not None and every_steps <= 0:
            raise ValueError(f"SecondOrStepTimer: every_steps must be > 0, got {every_steps}")
        self._every_secs = every_secs
        self._every_steps = every_steps
        self.reset()

    def reset(self) -> None:
        self._last_time = None
        self._last_step = None

    def should_trigger_for_step(self, step: int) -> bool:
        """True on the first call and once the interval has passed since the last trigger."""
        if self._last_step is None:
            return True
        if self._last_step == step:
            return False
        if self._every_steps is not None:
            return step >= self._last_step + self._every_steps
        return time.time() >= self._last_time + self._every_secs

    def update_last_triggered_step(self, step: int):
        """Record a trigger at `step`; returns (elapsed secs, elapsed steps) or (None, None)."""
        now = time.time()
        elapsed = (None, None) if self._last_time is None else (
            now - self._last_time, step - self._last_step)
        self._last_time, self._last_step = now, step
        return elapsed

    def last_triggered_step(self) -> Optional[int]:
        return self._last_step

    def _due(self):
        """(step, time.time()) before which `should_trigger_for_step` is False
        (0, 0 before the first trigger): for hooks' `_idle`."""
        if self._last_step is None:
            return 0, 0.0
        if self._every_steps is not None:
            return self._last_step + self._every_steps, NEVER
        return NEVER, self._last_time + self._every_secs

    def _idle(self):
        """`SessionRunHook._idle` of a hook that acts when this timer, fed
        global steps, triggers."""
        step, secs = self._due()
        return step, NEVER, secs


class StopAtStepHook(SessionRunHook):
    """Stops after `num_steps` more steps or at global step `last_step`
    (tf.estimator.StopAtStepHook)."""

    def __init__(self, num_steps: Optional[int] = None, last_step: Optional[int] = None):
        if num_steps is None and last_step is None:
            raise ValueError("StopAtStepHook: one of num_steps or last_step must be specified.")
        if num_steps is not None and last_step is not None:
            raise ValueError("StopAtStepHook: only one of num_steps or last_step can be specified.")
        if num_steps is not None and num_steps < 0:
            raise ValueError(f"StopAtStepHook: num_steps must be >= 0, got {num_steps}")
        self._num_steps = num_steps
        self._last_step = last_step

    def after_create_session(self, session, coord):
        if self._last_step is None:
            self._last_step = session.global_step + self._num_steps
        session.strategy.extended.set_last_step(self._last_step)   # a shared global step
        if session.global_step >= self._last_step:
            coord.request_stop()

    def after_run(self, run_context, run_values):
        if run_context.session.global_step >= self._last_step:
            run_context.request_stop()

    def _idle(self, session):
        return self._last_step, NEVER, NEVER


# Called before each checkpoint save: summary_hooks' writing of every summary
# so far to the event files (the hooks' scalars are held a few seconds, event
# files flushed every 120 s), so that a crash after the save loses none that
# its restart does not write again.
BEFORE_SAVE: List[Callable[[], None]] = []


class CheckpointSaverListener:
    """Called around checkpoint saves (tf.estimator.CheckpointSaverListener).
    `after_save` returning True stops training."""

    def begin(self) -> None:
        pass

    def before_save(self, session, global_step_value: int) -> None:
        pass

    def after_save(self, session, global_step_value: int) -> Optional[bool]:
        pass

    def end(self, session, global_step_value: int) -> None:
        pass


_FIRST_POLL_SECS = 1e-3


class CheckpointSaverHook(SessionRunHook):
    """Saves checkpoints every N steps or seconds, and at the end
    (tf.estimator.CheckpointSaverHook). It saves, and calls its listeners,
    only in the process that checkpoints (the session's chief: replica 0 of
    a MirroredStrategy, which TF runs as one process); elsewhere it does
    nothing. Given to an Estimator, it saves instead of RunConfig's saver
    and takes `saving_listeners`, as in TF. `scaffold` is accepted empty
    (its `saver`: give `saver=checkpoint.Saver(dir, max_to_keep=...)`);
    `save_graph_def` does nothing (no graph)."""

    def __init__(self, checkpoint_dir: str, save_secs: Optional[float] = None,
                 save_steps: Optional[int] = None, saver: Optional[checkpoint.Saver] = None,
                 checkpoint_basename: str = "model.ckpt", scaffold=None,
                 listeners: Iterable[CheckpointSaverListener] = (), save_graph_def: bool = True):
        if checkpoint_basename != checkpoint.PREFIX:
            raise ValueError(f"CheckpointSaverHook: checkpoint_basename must be "
                             f"{checkpoint.PREFIX!r}, got {checkpoint_basename!r}")
        check_scaffold(scaffold, "CheckpointSaverHook")
        self._saver = saver or checkpoint.Saver(checkpoint_dir)
        self._own_saver = saver is None   # a session shares one per directory
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._listeners = list(listeners or ())
        self._last_saved = None
        self._chief = False
        self._poll_secs = _FIRST_POLL_SECS   # when to look again at a save in flight

    def after_create_session(self, session, coord):
        self._chief = session.is_chief
        if not self._chief:
            return
        for listener in self._listeners:
            listener.begin()
        # What is on disk already: a session that makes no step (a warm start
        # past max_steps, a hook stopping at once) still leaves its state
        # saved at the end, as TF's saver at session start does; one that
        # restored an older checkpoint than the latest (damaged, passed over)
        # saves at its end the step the latest claims.
        latest = checkpoint.latest_checkpoint(self._saver.model_dir)
        restored = latest and checkpoint.step_of(latest) == session.global_step
        self._last_saved = session.global_step if restored else None
        self._timer.update_last_triggered_step(session.global_step)

    def after_run(self, run_context, run_values):
        if not self._chief:
            return
        with self._stopping_if_diverged():
            self._saver.check()   # a background save that failed fails the step after it
            step = run_context.session.global_step
            if self._timer.should_trigger_for_step(step):
                self._timer.update_last_triggered_step(step)
                if self._save(run_context.session, step):
                    run_context.request_stop()

    def _idle(self, session):
        # While a background save is in flight, after_run looks at it again
        # after 1 ms, then after twice the time each time it is still
        # writing: its error fails a step within twice the time it took to
        # fail (the next save and the end wait for it anyway), and a save's
        # ~5 ms of writing takes the hooks' slow path on 3 steps, not on each.
        if not self._chief:
            return NEVER, NEVER, NEVER
        step, runs, secs = self._timer._idle()
        if not self._saver.in_flight:
            self._poll_secs = _FIRST_POLL_SECS
            return step, runs, secs
        poll, self._poll_secs = self._poll_secs, 2 * self._poll_secs
        return step, runs, min(secs, time.time() + poll)

    def end(self, session):
        if not self._chief:
            return
        step = session.global_step
        with self._stopping_if_diverged():
            if step != self._last_saved:   # waited for: on the step (no writer started for it)
                self._save(session, step, background=False)
            self._saver.close()   # the last save is complete when training returns
        for listener in self._listeners:
            listener.end(session, step)

    def settle(self) -> None:
        """Training ended with an error: the save in flight still completes,
        so a healthy checkpoint already taken is on disk when train raises."""
        with self._stopping_if_diverged():
            self._saver.close()

    @contextlib.contextmanager
    def _stopping_if_diverged(self):
        """A save refused as not finite stops training as NanTensorHook does."""
        try:
            yield
        except checkpoint.NotFiniteError as e:
            latest = checkpoint.latest_checkpoint(self._saver.model_dir)
            logger.error("Model diverged: %s holds NaN or inf at global step %d; no checkpoint "
                         "saved (the latest stays %s)", e.name, e.global_step, latest or "none")
            raise NanLossDuringTrainingError(e.global_step, f"{e.name} is not finite") from None

    def _save(self, session, step: int, background: Optional[bool] = None) -> bool:
        if session.diverged_at_step is not None:  # NanTensorHook(fail_on_nan_loss=False)
            logger.warning("Not saving a checkpoint at step %d: the loss went NaN at step "
                           "%d.", step, session.diverged_at_step)
            return False
        state = session.scope.state()
        for listener in self._listeners:
            listener.before_save(session, step)
        for before_save in BEFORE_SAVE:
            before_save()
        # Never a checkpoint of a diverged model: the saver refuses one (a
        # background save: the writer process, on the copy it writes), and
        # training stops, as with NanTensorHook.
        buffers = {n: {k for k, _ in m.named_buffers()}
                   for n, m in session.scope.raw_modules.items()}
        self._saver.save(state, step, background=background, finite=buffers)
        self._last_saved = step
        if self._listeners:   # they may read the checkpoint: it must be on disk
            self._saver.wait()
        stop = False
        for listener in self._listeners:
            if listener.after_save(session, step):
                logger.info("A CheckpointSaverListener requested that training be stopped. "
                            "listener: %s", listener)
                stop = True
        return stop


# -- logging, NaN checks, waiting, final values, feeds --------------------------
# (tf.estimator.LoggingTensorHook, NanTensorHook, GlobalStepWaiterHook,
# FinalOpsHook, FeedFnHook)

def _check_names(what: str, names) -> None:
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what}: tensors are named by strings (what a step exposes: "
                            f"'loss', 'global_step', prediction keys, est.named_tensor "
                            f"names), or given as tensors inside a model_fn; got {name!r}")


def _names(what: str, tensors: dict) -> dict:
    """{tag: name} for {tag: name or tensor}. A tensor (TF's
    `LoggingTensorHook({"loss": loss})` in a model_fn) is exposed under a name
    of the hook's: the model_fn builds the hook again at every step, exposing
    that step's tensor, and the session's hook (the first step's) fetches it,
    as TF's fetches the graph's tensor every step."""
    out = {}
    for tag, value in tensors.items():
        if isinstance(value, torch.Tensor) and model_scope.current_step() is not None:
            name = f"{what}:{tag}"
            model_scope.named_tensor(name, value)
            value = name
        out[tag] = value
    _check_names(what, out.values())
    return out


def _format_value(value) -> str:
    """Floats as the float32 TF would print when exact in float32 (`0.12`,
    not `0.11999999731779099`); arrays without scientific noise."""
    if isinstance(value, float) and float(np.float32(value)) == value:
        return str(np.float32(value))
    if isinstance(value, np.ndarray):
        with np.printoptions(suppress=True):
            return str(value)
    return str(value)


class _NeverTriggerTimer(SecondOrStepTimer):
    """A timer that never triggers (TF's NeverTriggerTimer), for `at_end` only."""

    def __init__(self):
        self.reset()

    def should_trigger_for_step(self, step: int) -> bool:
        return False

    def update_last_triggered_step(self, step: int):
        return None, None

    def _due(self):
        return NEVER, NEVER


class LoggingTensorHook(SessionRunHook):
    """Logs named values every N steps, every N seconds and/or at the end
    (tf.estimator.LoggingTensorHook), at INFO, as TF does:

        loss = 0.12, step = 100 (0.250 sec)

    `tensors` is a list of names or a dict `{tag: name}` (a dict's tags are
    logged in sorted order); a name is what a step exposes: `"loss"`,
    `"global_step"`, a prediction key or an `est.named_tensor` name. Only the
    due steps copy the values to the host. `formatter(dict tag -> value)`
    returns the line to log (called on every due step, logged or not, as
    TF's). `at_end` logs the values of the last step (no
    extra step is run, unlike TF's `session.run` in `end`).
    """

    def __init__(self, tensors, every_n_iter: Optional[int] = None,
                 every_n_secs: Optional[float] = None, at_end: bool = False,
                 formatter=None):
        only_log_at_end = at_end and every_n_iter is None and every_n_secs is None
        if not only_log_at_end and (every_n_iter is None) == (every_n_secs is None):
            raise ValueError("either at_end and/or exactly one of every_n_iter and "
                             "every_n_secs must be provided.")
        if every_n_iter is not None and (not isinstance(every_n_iter, numbers.Integral)
                                         or isinstance(every_n_iter, bool) or every_n_iter <= 0):
            raise ValueError(f"invalid every_n_iter={every_n_iter!r}.")
        if every_n_secs is not None and not every_n_secs > 0:
            raise ValueError(f"invalid every_n_secs={every_n_secs!r}.")
        if formatter is not None and not callable(formatter):
            raise TypeError(f"LoggingTensorHook: formatter must be callable, got {formatter!r}")
        if isinstance(tensors, (str, torch.Tensor)):
            tensors = [tensors]
        if isinstance(tensors, dict):
            self._tensors = _names("LoggingTensorHook", tensors)
            self._tag_order = sorted(tensors)
        else:   # tags: the names; a tensor's its place in the list (TF: its graph name)
            tensors = list(tensors)
            self._tag_order = [t if isinstance(t, str) else f"tensor_{i}"
                               for i, t in enumerate(tensors)]
            self._tensors = _names("LoggingTensorHook", dict(zip(self._tag_order, tensors)))
        self._args = SessionRunArgs(self._tensors)
        self._formatter = formatter
        self._timer = (_NeverTriggerTimer() if only_log_at_end else
                       SecondOrStepTimer(every_secs=every_n_secs, every_steps=every_n_iter))
        self._log_at_end = at_end
        self._should_trigger = False

    # The iteration count is the session's run count (TF's _iter_count: steps
    # since `begin`), so steps the session skips (see `_idle`) still count.
    def begin(self):
        self._timer.reset()

    def before_run(self, run_context):
        self._should_trigger = self._timer.should_trigger_for_step(run_context.session._runs)
        return self._args if self._should_trigger else None

    def after_run(self, run_context, run_values):
        if self._should_trigger:
            self._should_trigger = False
            self._log_tensors(run_values.results, run_context.session._runs)

    def end(self, session):
        if self._log_at_end and session._runs:
            self._log_tensors(session.run(self._tensors), session._runs)

    def _idle(self, session):
        run, secs = self._timer._due()
        return NEVER, run, secs

    def _log_tensors(self, values: dict, iteration: int) -> None:
        elapsed_secs, _ = self._timer.update_last_triggered_step(iteration)
        if self._formatter is not None:   # called whatever the level, as TF's (it may
            logger.info(self._formatter(values))   # record the values itself)
            return
        if not logger.isEnabledFor(logging.INFO):   # nothing would be shown: format nothing
            return
        stats = ", ".join(f"{tag} = {_format_value(values[tag])}" for tag in self._tag_order)
        if elapsed_secs is not None:
            logger.info("%s (%.3f sec)", stats, elapsed_secs)
        else:
            logger.info("%s", stats)


class NanLossDuringTrainingError(RuntimeError):
    """The loss went NaN (tf.estimator.NanLossDuringTrainingError), or a
    checkpoint about to be saved holds NaN or inf (`detail` says where)."""

    def __init__(self, global_step: Optional[int] = None, detail: Optional[str] = None):
        super().__init__(global_step)
        self.global_step = global_step
        self.detail = detail

    def __str__(self):
        where = "" if self.global_step is None else f" (global step {self.global_step})"
        if self.detail:   # (found at a save, maybe steps after the loss went NaN)
            return (f"The model diverged: at the save of global step {self.global_step}, "
                    f"{self.detail}; no checkpoint of it was saved.")
        return f"NaN loss during training{where}."


class NanTensorHook(SessionRunHook):
    """Stops training when the loss is NaN (tf.estimator.NanTensorHook).

    With `fail_on_nan_loss` it raises `NanLossDuringTrainingError`, which
    propagates out of the session: no hook's `end` runs, so no checkpoint of
    the diverged state is written. Otherwise it logs a warning, requests a stop
    and marks the session diverged (`session.diverged_at_step`), so that
    `CheckpointSaverHook` saves nothing from that step on while the other
    hooks' `end` still run. Either way the latest checkpoint is the last one
    before the NaN, provided this hook is listed before any checkpoint saver
    (the Estimator's defaults are).

    Checking needs the loss on the host: with `every_n_iter=1` (the default,
    TF's behaviour) that is a device sync every step. `every_n_iter=N` checks
    only every N-th step; the Estimator installs its default NanTensorHook
    that way, on the steps where LoggingTensorHook fetches the loss anyway
    (`RunConfig.log_step_count_steps`), so a NaN is caught up to N-1 steps
    late and a checkpoint saved in between may hold the diverged state. Add
    `NanTensorHook()` yourself to check every step. One with
    `fail_on_nan_loss=False` in a session that also has one that fails (the
    Estimator's) raises on its behalf: in TF both see the NaN at that step.
    """

    def __init__(self, loss_tensor: str = "loss", fail_on_nan_loss: bool = True,
                 every_n_iter: int = 1):
        loss_tensor = _names("NanTensorHook", {"loss": loss_tensor})["loss"]
        if not isinstance(every_n_iter, numbers.Integral) or isinstance(every_n_iter, bool) \
                or every_n_iter <= 0:
            raise ValueError(f"invalid every_n_iter={every_n_iter!r}.")
        self._loss_tensor = loss_tensor
        self._fail_on_nan_loss = fail_on_nan_loss
        self._every_n_iter = every_n_iter
        self._args = SessionRunArgs(loss_tensor)
        self._due = False

    def after_create_session(self, session, coord):
        if self._fail_on_nan_loss:
            session.fails_on_nan = True

    def before_run(self, run_context):   # steps counted by the session, as in LoggingTensorHook
        self._due = run_context.session._runs % self._every_n_iter == 0
        return self._args if self._due else None

    def after_run(self, run_context, run_values):
        if not self._due:
            return
        self._due = False
        loss = run_values.results
        if not (loss != loss if isinstance(loss, float) else np.isnan(loss).any()):
            return
        session = run_context.session
        step = session.global_step
        failure_message = f"Model diverged with loss = NaN (global step {step})."
        if self._fail_on_nan_loss or session.fails_on_nan:   # (the other one's, checking
            logger.error(failure_message)                     # less often: it returned)
            raise NanLossDuringTrainingError(step)
        logger.warning(failure_message)
        session.diverged_at_step = step
        run_context.request_stop()

    def _idle(self, session):
        every = self._every_n_iter
        return NEVER, -(-session._runs // every) * every, NEVER


class GlobalStepWaiterHook(SessionRunHook):
    """Delays this worker's first step until the global step reaches
    `wait_until_step` (tf.estimator.GlobalStepWaiterHook), to start workers
    gradually, e.g. `wait_until_step=int(K * math.log(task_id + 1))` (0 on
    the chief).

    There is no shared global step variable to poll: a worker reads the
    global step from the chief's latest checkpoint in `model_dir` (a file
    system every task sees, as in TF), so the wait resolves only as fast as
    the chief saves checkpoints. Meant for asynchronous workers (TF's
    parameter-server training): under a synchronous strategy a waiting
    worker holds back the others. The chief writes those checkpoints itself,
    so a chief that would have to wait is an error. After `timeout_secs`
    (None: forever, as TF) it raises `TimeoutError`.
    """

    def __init__(self, wait_until_step: int, timeout_secs: Optional[float] = 7200.0,
                 poll_secs: float = 0.5):
        if not isinstance(wait_until_step, numbers.Integral) or isinstance(wait_until_step, bool):
            raise TypeError(f"GlobalStepWaiterHook: wait_until_step must be an int, got "
                            f"{wait_until_step!r}")
        if timeout_secs is not None and not timeout_secs >= 0:
            raise ValueError(f"GlobalStepWaiterHook: timeout_secs must be >= 0 or None, got "
                             f"{timeout_secs!r}")
        if not poll_secs > 0:
            raise ValueError(f"GlobalStepWaiterHook: poll_secs must be > 0, got {poll_secs!r}")
        self._wait_until_step = wait_until_step
        self._timeout_secs = timeout_secs
        self._poll_secs = poll_secs
        self._worker_is_started = False

    def begin(self):
        self._worker_is_started = False

    def _idle(self, session):
        return (NEVER, NEVER, NEVER) if self._worker_is_started else None

    def _global_step(self, session) -> int:
        latest = checkpoint.latest_checkpoint(session.model_dir) if session.model_dir else None
        return max(session.global_step, checkpoint.step_of(latest) if latest else 0)

    def before_run(self, run_context):
        if self._worker_is_started:
            return None
        session = run_context.session
        if self._wait_until_step <= 0 or session.global_step >= self._wait_until_step:
            self._worker_is_started = True
            return None
        if session.is_chief or not session.model_dir:
            reason = ("this is the chief, which writes the checkpoints it would wait for"
                      if session.is_chief else "the session has no model_dir to read the "
                      "chief's checkpoints from")
            raise ValueError(f"GlobalStepWaiterHook(wait_until_step={self._wait_until_step}) "
                             f"would wait forever at global step {session.global_step}: "
                             f"{reason}. Give the chief wait_until_step=0 "
                             "(e.g. int(K * math.log(task_id + 1))).")
        logger.info("Waiting for global step %d before starting training.",
                    self._wait_until_step)
        start = time.monotonic()
        last_logged_step = 0
        while True:
            current_step = self._global_step(session)
            if current_step >= self._wait_until_step:
                self._worker_is_started = True
                return None
            waited = time.monotonic() - start
            if self._timeout_secs is not None and waited >= self._timeout_secs:
                raise TimeoutError(
                    f"GlobalStepWaiterHook: waited {waited:.1f} s (timeout_secs="
                    f"{self._timeout_secs}) for global step {self._wait_until_step}, but the "
                    f"latest checkpoint in {session.model_dir!r} is at step {current_step}; "
                    "the global step is read from the chief's checkpoints, so it advances "
                    "only as often as the chief saves (save_checkpoints_steps/secs)")
            if current_step - last_logged_step > 1000:
                logger.info("Waiting for global step %d before starting training. Current "
                            "step is %d.", self._wait_until_step, current_step)
                last_logged_step = current_step
            time.sleep(self._poll_secs)


def _host(value):
    """Tensors (also in lists, tuples, dicts) as Python numbers / numpy arrays."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value.item() if value.dim() == 0 else to_numpy(value)
    if isinstance(value, dict):
        return {k: _host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host(v) for v in value)
    return value


class FinalOpsHook(SessionRunHook):
    """Evaluates `final_ops` at the end of the session and keeps their values
    in `final_ops_values` (tf.estimator.FinalOpsHook).

    `final_ops` is a name, a list or a dict of names (the values the last
    step exposed: `"loss"`, `"global_step"`, `est.named_tensor` names), or a
    callable run at `end` inside the model scope, e.g.
    `lambda: est.get_module("net").weight.norm()`; tensors in its result
    are copied to the host. Names need a step to have run in the session. `final_ops_feed_dict` maps names to values that
    replace them (TF's feed): a fed name is returned as fed, and inside the
    callable `est.named_tensor(name, t)` returns the fed value.
    """

    def __init__(self, final_ops, final_ops_feed_dict: Optional[dict] = None):
        if not callable(final_ops):
            names = ([final_ops] if isinstance(final_ops, str) else
                     list(final_ops.values()) if isinstance(final_ops, dict) else
                     list(final_ops) if isinstance(final_ops, (list, tuple)) else None)
            if names is None:
                raise TypeError(f"FinalOpsHook: final_ops must be a name, a list or dict of "
                                f"names, or a callable, got {final_ops!r}")
            _check_names("FinalOpsHook", names)
        if final_ops_feed_dict is not None and not isinstance(final_ops_feed_dict, dict):
            raise TypeError(f"FinalOpsHook: final_ops_feed_dict must be a dict, got "
                            f"{final_ops_feed_dict!r}")
        self._final_ops = final_ops
        self._final_ops_feed_dict = final_ops_feed_dict
        self._final_ops_values = None

    @property
    def final_ops_values(self):
        """The values of `final_ops` once the session has ended; None before."""
        return self._final_ops_values

    def end(self, session):
        feed = self._final_ops_feed_dict
        if not callable(self._final_ops):
            self._final_ops_values = session.run(self._final_ops, feed_dict=feed)
            return
        scope = session.scope
        previous, scope.feed_dict = scope.feed_dict, feed or None
        try:
            self._final_ops_values = _host(self._final_ops())
        finally:
            scope.feed_dict = previous


class FeedFnHook(SessionRunHook):
    """Calls `feed_fn()` before each step and feeds the dict it returns
    (tf.estimator.FeedFnHook).

    TF's feed replaces the value of graph tensors for one step; here a fed
    name replaces the tensor the step names with `est.named_tensor(name,
    tensor)`, which returns the fed value instead (converted to that tensor's
    dtype and device), e.g. a learning-rate or dropout schedule computed on
    the host. Two hooks feeding the same name is an error, as in TF.
    Note: `Estimator.train/evaluate/predict` call `model_fn` on the first
    batch before the session starts (as TF builds its graph first), so the
    feed applies from the second batch on; in a `MonitoredSession` loop it
    applies from the first step.
    """

    def __init__(self, feed_fn):
        if not callable(feed_fn):
            raise TypeError(f"FeedFnHook: feed_fn must be callable, got {feed_fn!r}")
        self.feed_fn = feed_fn

    def before_run(self, run_context):
        feed_dict = self.feed_fn()
        if not isinstance(feed_dict, dict):
            raise TypeError(f"FeedFnHook: feed_fn must return a dict of name -> value, got "
                            f"{type(feed_dict).__name__}")
        _check_names("FeedFnHook", feed_dict)
        return SessionRunArgs(fetches=None, feed_dict=feed_dict)
