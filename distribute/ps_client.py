"""The trainer side of the parameter-server protocol (`distribute._ps_rpc`):
a connection to the ps tasks whose methods are the protocol's verbs."""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Tuple

import torch.distributed.rpc as rpc

from . import _ps_rpc
from .cluster_resolver import split_address

logger = logging.getLogger(__name__)


class Client:
    """A trainer's connection to the ps tasks. Each verb is one RPC (or one
    per ps, in parallel) to the functions of `distribute._ps_rpc`; a failure
    names the ps task and what the call was doing."""

    def __init__(self, cluster_spec, task_type: str, task_id: int, timeout: float,
                 init_timeout: float):
        self.task = f"{task_type}:{task_id}"
        self.timeout = timeout
        self.num_ps = cluster_spec.num_tasks("ps")
        self.addresses = [cluster_spec.task_address("ps", i) for i in range(self.num_ps)]
        host, port = split_address(self.addresses[0], "ps 0")
        store = _ps_rpc._connect_store(host, port, init_timeout, self.task)
        deadline = time.monotonic() + init_timeout
        while True:
            missing = [i for i in range(self.num_ps) if not store.check([f"ps/ready/{i}"])]
            if not missing:
                break
            if time.monotonic() > deadline:
                names = ", ".join(f"ps {i} at {self.addresses[i]}" for i in missing)
                raise TimeoutError(f"{self.task}: {names} did not start serving within "
                                   f"{init_timeout:g} s")
            time.sleep(_ps_rpc._POLL_SECS)
        rank = self.num_ps - 1 + int(store.add("ps/rank", 1))
        self.name = f"{task_type}:{task_id}:{rank}"
        _ps_rpc._start_agent(self.name, rank, host, port, timeout)
        self._store = store
        self._closed = False
        logger.info("%s: connected to %d ps task(s) (%s) over torch.distributed.rpc as %s",
                    self.task, self.num_ps, ", ".join(self.addresses), self.name)

    def call_async(self, ps: int, fn, *args, timeout: Optional[float] = None):
        try:
            return rpc.rpc_async(f"ps:{ps}", fn, args=args,
                                 timeout=self.timeout if timeout is None else timeout)
        except RuntimeError as e:   # could not even send
            raise self.explain(e, ps, f"sending {fn.__name__.lstrip('_')}") from None

    def result(self, future, ps: int, what: str):
        try:
            return future.wait()
        except RuntimeError as e:
            raise self.explain(e, ps, what) from None

    def call(self, ps: int, fn, *args, what: str, timeout: Optional[float] = None):
        return self.result(self.call_async(ps, fn, *args, timeout=timeout), ps, what)

    def explain(self, exc: BaseException, ps: int, what: str) -> BaseException:
        """A ParameterServerError naming ps `ps` for a transport failure;
        `exc` itself for an error the ps raised."""
        text = str(exc).strip()
        if "On WorkerInfo(" in text[:200]:   # (the remote's own error, its traceback after)
            return exc
        first = text.splitlines()[0] if text else type(exc).__name__
        return _ps_rpc.ParameterServerError(
            f"{self.task}: ps {ps} at {self.addresses[ps]} failed while {what}: it died, or "
            f"did not answer within {self.timeout:g} s ({first})")

    # -- the verbs ---------------------------------------------------------------------------
    def on_each(self, calls: Dict[int, tuple], what: str) -> Dict[int, object]:
        """Run {ps: (fn, *args)} in parallel; their results by ps."""
        futures = {ps: self.call_async(ps, fn, *args) for ps, (fn, *args) in calls.items()}
        return {ps: self.result(f, ps, what) for ps, f in futures.items()}

    def register(self) -> None:
        self.call(0, _ps_rpc._register, self.task, what="registering")

    def status(self, what: str = "reading the ps status") -> dict:
        """ps 0's {"ready", "global_step", ...}."""
        return self.call(0, _ps_rpc._status, what=what)

    def lookup(self, module: str) -> Optional[list]:
        """The layout the chief published for `module`, or None."""
        return self.call(0, _ps_rpc._lookup, module, what=f"reading module {module!r}")

    def publish(self, module: str, layout: list) -> None:
        self.call(0, _ps_rpc._publish, module, layout, what=f"publishing module {module!r}")

    def create_shards(self, entries: Dict[int, list], module: str) -> Dict[int, list]:
        """Store initial values on each ps; the new shard ids by ps."""
        return self.on_each({ps: (_ps_rpc._create_shards, e) for ps, e in entries.items()},
                            f"storing the initial values of module {module!r}")

    def pull(self, ids: Dict[int, list], since: int, what: str) -> Dict[int, tuple]:
        """(clock, packed values) by ps of the shards `ids` changed since `since`."""
        return self.on_each({ps: (_ps_rpc._pull, i, since) for ps, i in ids.items()}, what)

    def push(self, calls: Dict[int, tuple], name: str) -> Dict[int, tuple]:
        """Apply one step: {ps: (grad ids, grads, delta ids, deltas, hparams, since,
        (sparse grad ids, their rows, their values), (table ids, masks of the
        rows read))} of optimizer `name`; (clock, packed changed values) by ps."""
        return self.on_each({ps: (_ps_rpc._push, name, _ps_rpc.pack(gi, g), _ps_rpc.pack(di, d),
                                  hparams, since, (_ps_rpc.pack(si, rows), _ps_rpc.pack(si, v)),
                                  _ps_rpc.pack(*read))
                             for ps, (gi, g, di, d, hparams, since, (si, rows, v), read)
                             in calls.items()},
                            "applying a step")

    def ensure_optimizer(self, name: str, cls, defaults: dict, groups: Dict[int, list]) -> None:
        self.on_each({ps: (_ps_rpc._ensure_optimizer, name, cls, defaults, g)
                      for ps, g in groups.items()}, f"creating optimizer {name!r}")

    def set_optimizer_state(self, name: str, states: Dict[int, dict]) -> None:
        self.on_each({ps: (_ps_rpc._set_optimizer_state, name, s) for ps, s in states.items()},
                     f"restoring optimizer {name!r}")

    def gather(self, ids: Dict[int, list], optimizers: list) -> Dict[int, tuple]:
        """(packed values, optimizer slots) by ps, for a checkpoint."""
        return self.on_each({ps: (_ps_rpc._gather, i, optimizers) for ps, i in ids.items()},
                            "gathering a checkpoint")

    def set_ready(self, global_step: int) -> None:
        self.call(0, _ps_rpc._set_ready, global_step, what="marking the parameters initialized")

    def next_ticket_async(self, limit: Optional[int], done: int):
        """A future of (the next global step (None past `limit`, or once
        training ended or was preempted), the global step, who was preempted)."""
        return self.call_async(0, _ps_rpc._next_ticket, self.task, limit, done)

    def preempt(self, who: str) -> int:
        """Stop every trainer after its step in flight (a preemption); the
        global step training stops at."""
        return self.call(0, _ps_rpc._preempt, who, what="stopping training for a preemption")

    def wait_completed(self, timeout: float) -> Tuple[int, List[str]]:
        return self.call(0, _ps_rpc._wait_completed, self.task, timeout,
                         what="waiting for the steps in flight", timeout=timeout + self.timeout)

    def complete(self, done: int) -> None:
        self.call(0, _ps_rpc._complete, self.task, done, what="finishing training")

    def end_training(self) -> None:
        self.call(0, _ps_rpc._end_training, what="ending training", timeout=5.0)

    def stats(self, num_ps: int) -> Dict[int, dict]:
        return self.on_each({ps: (_ps_rpc._stats,) for ps in range(num_ps)}, "stats")

    def close(self, done: int = 0) -> None:
        """Tell ps 0 this trainer leaves, and shut the agent down."""
        if self._closed:
            return
        self._closed = True
        try:
            self.call(0, _ps_rpc._leave, self.task, done, what="leaving", timeout=5.0)
        except Exception as e:   # ps 0 gone: nothing to tell
            logger.debug("%s: could not say goodbye to ps 0: %s", self.task, e)
        try:
            rpc.shutdown(graceful=False)
        except Exception as e:   # said: an agent left half shut down can abort the exit
            logger.warning("%s: the RPC agent did not shut down cleanly: %s", self.task, e)
