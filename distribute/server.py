"""`distribute.Server`: a `ps` task serving parameters, or a `worker` task
running a ClusterCoordinator's functions (tf.distribute.Server).

    # on each ps task of the cluster (train_and_evaluate does this for you)
    server = distribute.Server(cluster_spec, job_name="ps", task_index=0)
    server.join()     # returns when the chief has ended training

A ps task hosts the shards ParameterServerStrategy placed on it, their
optimizer state, and (ps 0) the global step, and applies each trainer's
update as it arrives (see `distribute._ps_rpc`). `join()` returns once the
chief has signalled the end of training and every trainer has left (or has
been silent for `end_grace_secs`); ps 0 decides and tells the others.
`stop_when()` (train_and_evaluate: the chief's completion marker) counts
as the chief's end signal. A ps whose ps 0 disappears stops with an error
naming it. A `worker` Server's `join()` runs the functions a
`distribute.experimental.coordinator.ClusterCoordinator` schedules (TF2's
parameter-server training) until the coordinator stops them. TF's Server
serves any job; TF1-style trainers connect through the strategy instead.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Callable, Optional

from . import _ps_rpc, coordinator
from .cluster_resolver import ClusterSpec

logger = logging.getLogger(__name__)

_DEFAULT_TIMEOUT = 60.0
_DEFAULT_INIT_TIMEOUT = 600.0
_END_GRACE_SECS = 30.0
_EXIT_WAIT_SECS = 5.0
_POLL_SECS = 0.1
_PREEMPTED_KEY = "ps/preempted"   # a ps task > 0 that got SIGTERM/SIGINT, for ps 0


class Server:
    """A parameter-server task (tf.distribute.Server / tf.compat.v1.train.Server).

    `server_or_cluster_def`: a `ClusterSpec` or {job: [addresses]};
    `job_name` must be "ps"; `task_index` this ps's index. `timeout_secs`:
    the RPC timeout; `init_timeout_secs`: how long ps `i > 0` waits for ps 0,
and ps 0 for a first trainer (then it stops with an error).
    `protocol` and `config` are accepted for TF compatibility (the transport
    is torch.distributed.rpc over TensorPipe).
    """

    def __init__(self, server_or_cluster_def, job_name: Optional[str] = None,
                 task_index: Optional[int] = None, protocol=None, config=None,
                 start: bool = True, timeout_secs: float = _DEFAULT_TIMEOUT,
                 init_timeout_secs: float = _DEFAULT_INIT_TIMEOUT,
                 end_grace_secs: float = _END_GRACE_SECS):
        spec = ClusterSpec(server_or_cluster_def)
        if job_name not in ("ps", "worker"):
            raise ValueError(f"distribute.Server runs a 'ps' task (parameters) or a 'worker' "
                             f"task (a ClusterCoordinator's functions), got job_name "
                             f"{job_name!r} (the chief and TF1-style workers connect through "
                             "ParameterServerStrategy and need no Server)")
        if "ps" not in spec.jobs:
            raise ValueError(f"The cluster {spec.as_dict()} has no 'ps' job")
        if not isinstance(task_index, int) or task_index not in spec.task_indices(job_name):
            raise ValueError(f"task_index must be one of the {job_name} indices "
                             f"{spec.task_indices(job_name)}, got {task_index!r}")
        self._job = job_name
        if protocol not in (None, "grpc"):
            raise ValueError(f"protocol must be None or 'grpc', got {protocol!r}")
        for name, value in (("timeout_secs", timeout_secs),
                            ("init_timeout_secs", init_timeout_secs),
                            ("end_grace_secs", end_grace_secs)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Server: {name} must be a number > 0, got {value!r}")
        self._spec = spec
        self._task_index = task_index
        self._timeout = float(timeout_secs)
        self._init_timeout = float(init_timeout_secs)
        self._end_grace = float(end_grace_secs)
        self._params = None
        self._store = None
        self.preempted = None   # after join(): (who was preempted, global step), if training was
        if start:
            self.start()

    @property
    def target(self) -> str:
        """This task's address, TF style (`grpc://host:port`)."""
        return "grpc://" + self._spec.task_address(self._job, self._task_index)

    @property
    def server_def(self) -> dict:
        return {"cluster": self._spec.as_dict(), "job_name": self._job,
                "task_index": self._task_index, "protocol": "grpc"}

    def start(self) -> None:
        """Start serving (done by the constructor unless `start=False`; a
        worker starts in `join`)."""
        if self._job == "ps" and self._params is None:
            self._params, self._store = _ps_rpc.serve(self._spec, self._task_index,
                                                      self._timeout, self._init_timeout)

    def join(self, timeout: Optional[float] = None,
             stop_when: Optional[Callable[[], bool]] = None,
             signalled: Optional[Callable[[], Optional[str]]] = None) -> bool:
        """Serve until training ends (True), or `timeout` seconds (False);
        then stop serving. `stop_when()` is polled on ps 0 as another end signal.
        `signalled()`, polled, names a SIGTERM/SIGINT this task got (None
        before): the task is preempted, so training stops at one global step
        (no trainer gets another), the chief saves there, and this task
        serves until then; `preempted` then says who and the step.
        A worker runs a ClusterCoordinator's functions until it stops them."""
        if self._job == "worker":
            coordinator.run_worker(self._spec, self._task_index, self._timeout,
                                   self._init_timeout)
            return True
        self.start()
        self._signal_passed_on = False
        deadline = None if timeout is None else time.monotonic() + timeout
        index = self._task_index
        try:
            while True:
                name = signalled() if signalled is not None else None
                if name is not None and not self._signal_passed_on:
                    logger.warning("ps %d: %s received: training stops at one global step, the "
                                   "chief saves there; serving until then", index, name)
                    self._pass_on_preemption(f"ps:{index}")
                if self._done(stop_when):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    return False
                time.sleep(_POLL_SECS)
            if index == 0:
                params = self._params
                if params.preempted_by is not None:
                    self.preempted = (params.preempted_by, params.status()["global_step"])
                self._store.set("ps/done", json.dumps(self.preempted))
                self._wait_for_others()
            else:
                self.preempted = json.loads(self._store.get("ps/done"))
                self._store.set(f"ps/exited/{index}", "1")
            params = self._params
            logger.info("ps %d: training is over; applied %d updates (%.2f ms each on "
                        "average)%s; shutting down", index, params.pushes,
                        1e3 * params.push_secs / max(1, params.pushes),
                        "" if index else "; global steps by trainer: " + ", ".join(
                            f"{t} {n}" for t, n in sorted(params.steps_by_trainer.items()))
                        + (f"; {len(params.lost_steps)} counted without their update (their "
                           "trainers died in them)" if params.lost_steps else ""))
            return True
        finally:
            self._params = self._store = None
            _ps_rpc.stop_serving(grace_secs=0.5)

    def _pass_on_preemption(self, who: str) -> None:
        """Tell ps 0 (which hands out the global steps) of this task's signal."""
        self._signal_passed_on = True
        if self._task_index == 0:
            self._params.preempt(who)
        else:
            self._store.set(_PREEMPTED_KEY, who)

    def _done(self, stop_when) -> bool:
        if self._task_index == 0:
            params = self._params
            if (params.preempted_by is None and len(self._spec.task_indices("ps")) > 1
                    and self._store.check([_PREEMPTED_KEY])):
                params.preempt(self._store.get(_PREEMPTED_KEY).decode())
            if stop_when is not None and not params.end_requested.is_set() and stop_when():
                logger.info("ps 0: the chief's completion or failure marker is there: "
                            "training ended")
                params.end_training()
            if params.unattended(self._init_timeout):
                raise TimeoutError(
                    f"ps 0: no trainer ({', '.join(params._trainers)}) connected within "
                    f"{self._init_timeout:g} s of the start (Server(init_timeout_secs=...))")
            return params.finished(self._end_grace)
        try:
            return self._store.check(["ps/done"])
        except Exception as e:
            raise _ps_rpc.ParameterServerError(
                f"ps {self._task_index}: ps 0 at {self._spec.task_address('ps', 0)} is gone "
                f"(it hosts the rendezvous): {str(e).strip().splitlines()[0]}") from None

    def _wait_for_others(self) -> None:
        others = [i for i in self._spec.task_indices("ps") if i != 0]
        deadline = time.monotonic() + _EXIT_WAIT_SECS
        while others and time.monotonic() < deadline:
            others = [i for i in others if not self._store.check([f"ps/exited/{i}"])]
            time.sleep(_POLL_SECS)
