"""Launchers: how a strategy runs a call in the replica processes it starts
(as Lightning's `strategy.launcher.launch(fn)`).

`strategy.extended.launcher` is None where the caller runs its work in this
process (one replica; a process that already is a replica). Otherwise it is
a `Launcher`, and the caller hands it the work, once:

    launcher = strategy.extended.launcher
    if launcher is not None:
        results = launcher.launch(fn, *args)   # fn(*args) on every replica
    else:
        result = fn(*args)

`fn` is the body of the work, not the call that chose to launch it (the
replicas never decide again). What a replica sends back is its return value,
pickled: that is the channel, so `fn` returns what the caller needs (the
Estimator returns rank 0's evaluation results and the state of the call's
hooks), and nothing else comes back.
"""
from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence

from . import _processes

logger = logging.getLogger(__name__)


class Launcher:
    """Runs `fn(*args, **kwargs)` once on each replica of this process and
    returns their results in replica order (rank 0's first)."""

    def launch(self, fn: Callable, *args, **kwargs) -> List:
        raise NotImplementedError


class InProcessLauncher(Launcher):
    """This process is its task's only replica: `setup()` joins the replicas
    of the other tasks (once), then `fn` runs here."""

    def __init__(self, setup: Callable[[], None]):
        self._setup = setup

    def launch(self, fn: Callable, *args, **kwargs) -> List:
        self._setup()
        return [fn(*args, **kwargs)]


class ForkLauncher(Launcher):
    """One forked process per local replica (`distribute._processes`):
    `setup(i)` in replica i, then `fn`; the first failure stops them all and is
    raised here, naming the replica. `before_fork()` runs here first;
    `after_fork(what it returned)` runs here once every replica is forked and
    returns an object kept alive while they run (the rendezvous store they
    meet at: started only then, since no thread may run here during a fork)."""

    def __init__(self, names: Sequence[str], setup: Callable[[int], None], timeout: float,
                 before_fork: Optional[Callable[[], object]] = None,
                 after_fork: Optional[Callable[[object], object]] = None):
        self._names, self._setup, self._timeout = list(names), setup, timeout
        self._before_fork, self._after_fork = before_fork, after_fork

    def launch(self, fn: Callable, *args, **kwargs) -> List:
        prepared = self._before_fork() if self._before_fork is not None else None
        forked = (lambda: self._after_fork(prepared)) if self._after_fork is not None else None
        return _processes.run_replicas(fn, args, kwargs, self._names, self._setup,
                                       self._timeout, forked)


def in_replica_process() -> bool:
    """Whether this process is a replica a `ForkLauncher` started."""
    return _processes.in_replica_process()
