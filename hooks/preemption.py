"""Preemption: SIGTERM (what Kubernetes and SLURM send before they kill a
task) or SIGINT (Ctrl-C) during training saves a checkpoint at one step all
trainers agree on, then exits with `PREEMPTION_EXIT_CODE` (TF's
`PreemptionCheckpointHandler`, done by the training session itself).

A training session watches for the two signals while it runs (main thread
only; the handler just sets a flag). The step during which a signal arrives
completes; the session then stops as if a hook had asked it to (under a
synchronous strategy the replicas' per-step stop agreement makes every
replica stop at the same global step, and tells them it was a preemption;
a launcher that forked the replicas passes the signal on to them),
the chief's CheckpointSaverHook saves at that step when the session ends, and
`Estimator.train` raises `TrainingPreempted`, a `SystemExit` with
`PREEMPTION_EXIT_CODE`, on every trainer. A restart resumes from that
checkpoint: no step runs twice and none is lost. A signal as training
ends (its last step reached: during the final save's evaluation, say) is
no preemption: training is complete, and `train` returns, with a warning.
A second signal while the session is stopping, a second later or more, is
not caught (Ctrl-C twice interrupts at once).
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Optional

logger = logging.getLogger(__name__)

PREEMPTION_EXIT_CODE = 42
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SAME_EVENT_SECS = 1.0


class TrainingPreempted(SystemExit):
    """Training stopped on SIGTERM/SIGINT after saving a checkpoint at the
    agreed step; exits the program with PREEMPTION_EXIT_CODE unless caught."""

    def __init__(self, global_step: int, signal_name: str = "a peer's signal",
                 rejoins: bool = False):
        super().__init__(PREEMPTION_EXIT_CODE)
        self.global_step = global_step
        self.signal_name = signal_name
        self.rejoins = rejoins   # a worker leaving asynchronous training that goes on

    def __reduce__(self):   # crosses process boundaries (replicas report it)
        return type(self), (self.global_step, self.signal_name, self.rejoins)

    def __str__(self):
        if self.rejoins:
            return (f"training preempted by {self.signal_name} after global step "
                    f"{self.global_step}: this worker's updates are on the ps tasks; "
                    f"restarted, it rejoins the training, or resumes from the chief's "
                    f"checkpoint where the whole job was stopped too (exit code "
                    f"{PREEMPTION_EXIT_CODE})")
        return (f"training preempted by {self.signal_name} at global step "
                f"{self.global_step}; a restart resumes there (exit code "
                f"{PREEMPTION_EXIT_CODE})")


class Watcher:
    """Catches SIGTERM and SIGINT while entered (in the main thread; elsewhere
    it watches nothing): `signalled` is then the signal's name."""

    def __init__(self):
        self.signalled: Optional[str] = None
        self._previous = {}

    def __enter__(self) -> "Watcher":
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signalled is not None:
            if time.monotonic() - self._first < _SAME_EVENT_SECS:
                return   # one event delivered twice (a terminal's Ctrl-C and a launcher's)
            self.__exit__()   # a second signal: no more grace
            signal.raise_signal(signum)
            return
        self.signalled, self._first = name, time.monotonic()
        logger.warning("%s received: stopping training after this step, at a step every "
                       "trainer agrees on, and saving a checkpoint there", name)

    def __exit__(self, *exc) -> None:
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)
