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
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Dict, Optional, Tuple

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

    def put(self, cid: tuple, payload: bytes, lease_secs: float) -> None:
        with self._lock:
            self.lease_secs = lease_secs
            self._stopped = False
            self._pending.append((cid, payload))
            self._lock.notify_all()

    def _expire(self) -> None:
        now = time.monotonic()
        for cid, (worker, payload, until) in list(self._running.items()):
            if until < now:
                del self._running[cid]
                self._pending.appendleft((cid, payload))
                self.rerun += 1

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
            self._results[cid] = result

    def collect(self) -> Tuple[Dict[tuple, bytes], dict]:
        """The results since the last call, and the queue's counts."""
        with self._lock:
            self._expire()
            results, self._results = self._results, {}
            return results, {"pending": len(self._pending), "running": len(self._running),
                             "rerun": self.rerun}

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


def _collect():
    return _local().collect()


def _cancel(owner):
    return _local().cancel(owner)


def _stop():
    return _local().stop()
