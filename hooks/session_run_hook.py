"""The hook API (tf.estimator.SessionRunHook and friends).

A hook observes the training/evaluation/prediction loop. There is no TF
session here: `session` is the loop's `_Session` (the model scope, the global
step, the strategy, `model_dir`), and fetches name values the step exposes
(`"loss"`, `"global_step"`, prediction keys, `est.named_tensor` names,
`"summaries"`) instead of graph tensors. A fetched `"global_step"` in
training is the step's value before its update, as TF's fetch reads it;
`session.global_step` after the step is the new one.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple


class SessionRunHook:
    """Hook to extend calls to `MonitoredSession.run()` (tf.estimator.SessionRunHook)."""

    def begin(self) -> None:
        """Called once before the loop; the model may not exist yet."""

    def after_create_session(self, session, coord) -> None:
        """Called once the session exists (checkpoint found and global step known)."""

    def before_run(self, run_context: "SessionRunContext") -> Optional["SessionRunArgs"]:
        """Called before each step; return `SessionRunArgs(fetches)` to request
        values (names, a list or a dict of names) copied to the host for `after_run`."""
        return None

    def after_run(self, run_context: "SessionRunContext",
                  run_values: "SessionRunValues") -> None:
        """Called after each step with the requested values in `run_values.results`."""

    def end(self, session) -> None:
        """Called once at the end of the loop (not after an exception)."""

    def _idle(self, session) -> Optional[Tuple[float, float, float]]:
        """The session's fast path (private; the built-in hooks define it).

        None: call `before_run`/`after_run` on every step (any hook that does
        not define this). Otherwise `(step, run, secs)`: until the global step
        reaches `step`, the session's run count (`session._runs`, steps run
        in this session) reaches `run`, or `time.time()` reaches `secs`, both
        methods would do nothing, so the session skips them. Before a step
        the session compares `global_step + 1`, the run count and the time;
        after it the global step and the time again, and then calls only
        `after_run`. Asked after `after_create_session` and after each step
        the hook was called on; `NEVER` is a bound that does not apply.
        """
        return None


NEVER = float("inf")   # an `_idle` bound that never comes


class SessionRunArgs(NamedTuple):
    """What a hook asks of the next step (tf.estimator.SessionRunArgs).
    `feed_dict` and `options` are accepted for source compatibility."""

    fetches: Any
    feed_dict: Any = None
    options: Any = None


class SessionRunValues(NamedTuple):
    """The answers to a hook's fetches (tf.estimator.SessionRunValues)."""

    results: Any
    options: Any = None
    run_metadata: Any = None


class SessionRunContext:
    """Per-step context given to hooks (tf.estimator.SessionRunContext)."""

    __slots__ = ("original_args", "session", "_stop_requested")

    def __init__(self, original_args, session):
        self.original_args = original_args
        self.session = session
        self._stop_requested = False

    def request_stop(self) -> None:
        """Stop the loop after this step."""
        self._stop_requested = True

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested


def check_hooks(hooks, what: str = "hooks") -> list:
    """`hooks` (any iterable, or None) as a list, each a SessionRunHook, else a
    TypeError naming `what` (TF's check of every hooks argument)."""
    hooks = list(hooks or ())
    for hook in hooks:
        if not isinstance(hook, SessionRunHook):
            raise TypeError(f"All {what} must be `SessionRunHook` instances, given: {hook!r}")
    return hooks
