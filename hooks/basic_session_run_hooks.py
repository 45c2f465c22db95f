"""Step control and checkpoint hooks (tf.estimator's basic_session_run_hooks):
SecondOrStepTimer, StopAtStepHook, CheckpointSaverListener, CheckpointSaverHook."""
from __future__ import annotations

import logging
import time
from typing import Iterable, Optional

from estimator import checkpoint

from .session_run_hook import SessionRunArgs, SessionRunHook

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
        if session.global_step >= self._last_step:
            coord.request_stop()

    def after_run(self, run_context, run_values):
        if run_context.session.global_step >= self._last_step:
            run_context.request_stop()


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


class CheckpointSaverHook(SessionRunHook):
    """Saves checkpoints every N steps or seconds, and at the end
    (tf.estimator.CheckpointSaverHook). Only add it where this process should
    checkpoint (the chief); the Estimator does so."""

    def __init__(self, checkpoint_dir: str, save_secs: Optional[float] = None,
                 save_steps: Optional[int] = None, saver: Optional[checkpoint.Saver] = None,
                 checkpoint_basename: str = "model.ckpt", scaffold=None,
                 listeners: Iterable[CheckpointSaverListener] = (), save_graph_def: bool = True):
        if checkpoint_basename != checkpoint.PREFIX:
            raise ValueError(f"CheckpointSaverHook: checkpoint_basename must be "
                             f"{checkpoint.PREFIX!r}, got {checkpoint_basename!r}")
        self._saver = saver or checkpoint.Saver(checkpoint_dir)
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._listeners = list(listeners or ())
        self._last_saved = None

    def begin(self):
        for listener in self._listeners:
            listener.begin()

    def after_create_session(self, session, coord):
        self._last_saved = session.global_step
        self._timer.update_last_triggered_step(session.global_step)

    def after_run(self, run_context, run_values):
        step = run_context.session.global_step
        if self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            if self._save(run_context.session, step):
                run_context.request_stop()

    def end(self, session):
        step = session.global_step
        if step != self._last_saved:
            self._save(session, step)
        for listener in self._listeners:
            listener.end(session, step)

    def _save(self, session, step: int) -> bool:
        for listener in self._listeners:
            listener.before_save(session, step)
        self._saver.save(session.scope.state(), step)
        self._last_saved = step
        stop = False
        for listener in self._listeners:
            if listener.after_save(session, step):
                logger.info("A CheckpointSaverListener requested that training be stopped. "
                            "listener: %s", listener)
                stop = True
        return stop
