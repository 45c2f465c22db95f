"""Session-style hooks (tf.estimator.SessionRunHook and the built-ins) and
MonitoredSession for custom loops."""
import estimator as _estimator  # noqa: F401  (the loop runs on the estimator's scope; fixes import order)

from .basic_session_run_hooks import (CheckpointSaverHook, CheckpointSaverListener,
                                      SecondOrStepTimer, StopAtStepHook)
from .monitored_session import MonitoredSession
from .session_run_hook import SessionRunArgs, SessionRunContext, SessionRunHook, SessionRunValues

__all__ = [
    "SessionRunHook", "SessionRunArgs", "SessionRunContext", "SessionRunValues",
    "MonitoredSession", "StopAtStepHook", "CheckpointSaverHook", "CheckpointSaverListener",
    "SecondOrStepTimer",
]
