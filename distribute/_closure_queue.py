"""The queue of scheduled functions of a `ClusterCoordinator`, kept by ps 0.

TF's coordinator pushes each function to a free worker over gRPC. Here
every task already talks to ps 0 (`_ps_rpc`: trainers call the ps tasks,
never each other), so ps 0 keeps the queue: the coordinator puts closures
(pickled: a function by reference, and its arguments) and collects results;
each worker takes one closure at a time, runs it, and reports back.

At least once: a closure taken by a worker is leased to it for `lease_secs`,
renewed by the worker's heartbeats while it runs; when a lease runs out (the
worker died, or its machine did) the closure goes back to the front of the
queue for another worker. A late result of a closure already re-run is
dropped (the first result counts).

One coordinator at a time, as TF's (whose functions live in the coordinator
process and die with it): one that left (its program ended) and an earlier
one when another starts (`claim`) are gone: their waiting closures are
dropped, their running ones finish but are not run again. One silent for
long (killed: it collects results every 50 ms) has its closures dropped
too, and is told which when it comes back (a stalled process). Without that
a killed coordinator's queue went on training the variables of the next
one, which has the same names.
"""
from __future__ import annotations

import collections
import logging
import pickle
import threading
import time
from typing import Dict, Optional, Tuple

logger = logging.getLogger(__name__)

STOP = "stop"


class ClosureQueue:
    def __init__(self):
        self._lock = threading.Condition()
        self._pending: collections.deque = collections.deque()   # (cid, payload)
        self._running: Dict[tuple, Tuple[str, bytes, float]] = {}   # cid -> (worker, payload, until)
        self._results: Dict[tuple, bytes] = {}
        self._finished: set = set()
        self._stopped = False
        self.lease_secs = 10.0
        self.rerun = 0
        self._seen: Dict[str, float] = {}   # coordinator -> when it last called
        self._gone: Dict[str, str] = {}     # coordinator -> why (ended, or replaced)
        self._silent: Dict[str, str] = {}   # coordinator -> why its closures were dropped

    def silent_secs(self) -> float:
        """How long a coordinator may go without a call before its functions
        are dropped (it calls every 50 ms; a stall of its process, a suspend
        or a long call holding the GIL, is not taken for its death)."""
        return 3 * self.lease_secs + 10.0

    def _heard(self, owner: str) -> None:
        if owner in self._gone:
            raise RuntimeError(f"ps 0 dropped this coordinator's functions: {self._gone[owner]}")
        self._seen[owner] = time.monotonic()

    def put(self, cid: tuple, payload: bytes, lease_secs: float) -> None:
        with self._lock:
            self._heard(cid[0])
            self.lease_secs = lease_secs
            self._stopped = False
            self._pending.append((cid, payload))
            self._lock.notify_all()

    def _drop(self, owner: str, why: str, final: bool = True) -> None:
        """`owner`'s waiting closures dropped; its running ones not run again.
        `final`: the coordinator ended or was replaced; else it was silent,
        and finds each dropped closure's result saying so when it comes back."""
        if final:
            self._gone[owner] = why
            self._silent.pop(owner, None)
            self._results = {cid: r for cid, r in self._results.items() if cid[0] != owner}
        else:
            self._silent[owner] = why
        self._seen.pop(owner, None)
        dropped = [cid for cid, _ in self._pending if cid[0] == owner]
        self._pending = collections.deque(p for p in self._pending if p[0][0] != owner)
        if not final:
            for cid in dropped:
                self._results[cid] = pickle.dumps(("dropped", f"ps 0 dropped this function "
                                                   f"without running it: this coordinator was "
                                                   f"{why}; reschedule it"))
        running = sum(cid[0] == owner for cid in self._running)
        (logger.warning if dropped or running else logger.info)(
            "ps 0: dropped %d waiting function(s) of coordinator %s (%d running are not "
            "run again): %s", len(dropped), owner, running, why)

    def _expire(self) -> None:
        now = time.monotonic()
        for owner, seen in list(self._seen.items()):
            if seen + self.silent_secs() < now:
                self._drop(owner, f"not heard from for {now - seen:.1f} s (more than 3 x "
                                  f"lease_secs + 10 = {self.silent_secs():g} s), so taken for "
                                  "killed, as TF's coordinator's functions end with its process",
                           final=False)
        for cid, (worker, payload, until) in list(self._running.items()):
            if until < now:
                del self._running[cid]
                if cid[0] in self._silent:   # (a late result of its worker still counts)
                    self._results[cid] = pickle.dumps(("dropped", (
                        f"ps 0 did not run this function again: its worker was not heard from "
                        f"while this coordinator was {self._silent[cid[0]]}; it may have run "
                        "in part")))
                elif cid[0] not in self._gone:
                    self._pending.appendleft((cid, payload))
                    self.rerun += 1

    def claim(self, owner: str) -> int:
        """`owner` is the cluster's coordinator now: the closures of earlier
        ones are dropped; how many of theirs workers still run."""
        with self._lock:
            others = ({cid[0] for cid, _ in self._pending} | {cid[0] for cid in self._running}
                      | set(self._seen) | set(self._silent))
            for other in others - {owner} - set(self._gone):   # (claim is asked again)
                self._drop(other, f"a new coordinator ({owner}) started")
            self._seen[owner] = time.monotonic()
            return sum(cid[0] != owner for cid in self._running)

    def leave(self, owner: str) -> None:
        """`owner`'s program ends without ending training (its functions end too)."""
        with self._lock:
            if owner not in self._gone:
                self._drop(owner, "its program ended")

    def take(self, worker: str, wait: float):
        """(cid, payload) for `worker`, None after `wait` seconds without
        work, or STOP once the coordinator stopped."""
        deadline = time.monotonic() + wait
        with self._lock:
            while True:
                self._expire()
                if self._stopped:
                    return STOP
                if self._pending:
                    cid, payload = self._pending.popleft()
                    self._running[cid] = (worker, payload, time.monotonic() + self.lease_secs)
                    return cid, payload
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(min(left, 0.5))

    def beat(self, worker: str) -> None:
        with self._lock:
            until = time.monotonic() + self.lease_secs
            for cid, (who, payload, _) in list(self._running.items()):
                if who == worker:
                    self._running[cid] = (who, payload, until)

    def done(self, worker: str, cid: tuple, result: bytes) -> None:
        with self._lock:
            if cid in self._finished:
                return   # re-run elsewhere and already answered
            self._running.pop(cid, None)
            self._pending = collections.deque(p for p in self._pending if p[0] != cid)
            self._finished.add(cid)
            if cid[0] not in self._gone:   # (nobody collects a gone coordinator's)
                self._results[cid] = result

    def collect(self, owner: str, received=()) -> Tuple[Dict[tuple, bytes], dict]:
        """`owner`'s results not yet `received` (the ids its last call got: an
        answer lost on the way is given again), and the queue's counts, with
        "gone" (why) for a coordinator ended or replaced."""
        with self._lock:
            self._expire()
            counts = {"pending": len(self._pending), "running": len(self._running),
                      "rerun": self.rerun}
            if owner in self._gone:
                return {}, dict(counts, gone=self._gone[owner])
            for cid in received:
                self._results.pop(tuple(cid), None)
            self._silent.pop(owner, None)
            self._heard(owner)
            return {cid: r for cid, r in self._results.items() if cid[0] == owner}, counts

    def cancel(self, owner: str) -> list:
        """Drop `owner`'s closures no worker has taken; their ids."""
        with self._lock:
            cancelled = [cid for cid, _ in self._pending if cid[0] == owner]
            self._pending = collections.deque(p for p in self._pending if p[0][0] != owner)
            return cancelled

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._pending.clear()
            self._running.clear()
            self._seen.clear()
            self._lock.notify_all()


_queue: Optional[ClosureQueue] = None
_queue_lock = threading.Lock()


def _local() -> ClosureQueue:
    global _queue
    with _queue_lock:
        if _queue is None:
            _queue = ClosureQueue()
        return _queue


# What the coordinator and the workers call on ps 0 (pickled by reference).
def _put(cid, payload, lease_secs):
    return _local().put(cid, payload, lease_secs)


def _take(worker, wait):
    return _local().take(worker, wait)


def _beat(worker):
    return _local().beat(worker)


def _done(worker, cid, result):
    return _local().done(worker, cid, result)


def _collect(owner, received=()):
    return _local().collect(owner, received)


def _claim(owner):
    return _local().claim(owner)


def _leave(owner):
    return _local().leave(owner)


def _cancel(owner):
    return _local().cancel(owner)


def _stop():
    return _local().stop()
