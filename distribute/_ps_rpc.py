"""The parameter-server protocol, on `torch.distributed.rpc` (TensorPipe).

TF analogue: the gRPC runtime between TF1's workers and `ps` tasks, and the
variables, optimizer slots and global step living on the ps tasks.

Who is who. Every ps task and every trainer (chief, workers) is an RPC agent
(PyTorch's `TensorPipeAgent`). ps 0 hosts the rendezvous store at its
TF_CONFIG address. The group is dynamic: ps tasks join first, each trainer
joins when it starts, and a trainer that dies and is restarted joins again
under a new rank. PyTorch's stock dynamic-group join calls every member,
which fails for good once one member died; so the agent is built by a
backend registered here (`torch.distributed.rpc.backend_registry`) that
skips that handshake: trainers only ever call the ps tasks, and a ps only
answers on the connection a call came in on, so no member needs to know the
others beyond the ps tasks each trainer finds in the store at start.

What a ps holds (`ParameterStore`): its shards (whole parameters and
buffers, or row slices of partitioned ones), one optimizer per trainer
optimizer over the shards it has, and a clock: every update ticks it and
stamps the shards it changed, so a trainer asks for "what changed since
clock c" and gets only that. ps 0 also coordinates: the module layouts the
chief published, whether the chief has initialized the parameters
(`ready`), the global step, and the end of training.

The global step: before pushing a step's gradients a trainer takes a ticket
from ps 0 (`next_ticket`), the new global step, and none once `max_steps`
is reached, so the last step is exactly `max_steps` and every trainer stops
there. Each ticket request also reports the trainer's previous ticket as
done, so the chief can wait for every ticket handed out before a checkpoint
to be applied (`wait_completed`, bounded: a dead trainer's ticket is
abandoned after the wait).

Every RPC function here runs on a ps, called by a trainer or the chief
through `distribute.ps_client.Client`, the trainer side, which names each
call as a verb and turns a failed call into a `ParameterServerError` that
names the ps task and its address.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import threading
import time
import urllib.parse
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.distributed.rpc import backend_registry

from . import lookups
from ._process_group import host_store
from .cluster_resolver import split_address

logger = logging.getLogger(__name__)

_BACKEND = "PARAMETER_SERVER_TENSORPIPE"
_POLL_SECS = 0.05


class ParameterServerError(RuntimeError):
    """A ps task died or did not answer within the RPC timeout (TF raises
    UnavailableError / DeadlineExceededError)."""


# -- the RPC backend ----------------------------------------------------------------
def _construct_options(rpc_timeout, init_method, **kwargs):
    return rpc.TensorPipeRpcBackendOptions(rpc_timeout=rpc_timeout, init_method=init_method,
                                           **kwargs)


def _init_agent(store, name, rank, world_size, rpc_backend_options):
    """TensorPipe's own agent in a dynamic group, minus the join handshake
    with every member (see the module docstring)."""
    with _join_token(store, name):
        return rpc.TensorPipeAgent(store, name, rank, world_size, rpc_backend_options, {}, [])


_JOIN_TOKEN = "ps/join_token"
_STALE_TOKEN_SECS = 30.0


@contextlib.contextmanager
def _join_token(store, name: str):
    """Hold the group's join token while the agent adds its name to the
    group's list in the store, as torch's stock dynamic join does: the list
    is read, extended and written back, so two agents starting at once
    (ps 0 and ps 1) could each write it without the other, and a trainer
    would then not find that ps. A token held past `_STALE_TOKEN_SECS` (its
    holder died while joining) is taken over."""
    me = f"{name} (pid {os.getpid()})"
    start = since = time.monotonic()
    holder, said = None, False
    while True:
        got = store.compare_set(_JOIN_TOKEN, "", me).decode()
        if got == me:
            break
        now = time.monotonic()
        if got != holder:
            holder, since = got, now
        elif now - since > _STALE_TOKEN_SECS:
            logger.warning("%s: %s has held the RPC join token for %g s (it died while "
                           "joining?); taking it over", name, holder, _STALE_TOKEN_SECS)
            if store.compare_set(_JOIN_TOKEN, holder, me).decode() == me:
                break
        if not said and now - start > 1.0:
            logger.info("%s: waiting for %s to finish joining the RPC group", name, holder)
            said = True
        time.sleep(_POLL_SECS / 10)
    try:
        yield
    finally:
        store.set(_JOIN_TOKEN, "")


def _backend():
    if not backend_registry.backend_registered(_BACKEND):
        return backend_registry.register_backend(_BACKEND, _construct_options, _init_agent)
    return backend_registry.BackendType[_BACKEND]


_RENDEZVOUS = "estimator-tcp"
_rendezvous_registered = False


def _rendezvous(url: str, timeout: datetime.timedelta = datetime.timedelta(seconds=300),
                **kwargs):
    """torch's tcp:// rendezvous, except that ps 0 (rank 0) hosts the store at
    its own address only (`_process_group.listening_socket`), not on every interface."""
    parsed = urllib.parse.urlparse(url)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    rank = int(query.get("rank", -1))
    world_size = int(query.get("world_size", -1))
    if rank == 0:
        store = host_store(parsed.hostname, parsed.port, timeout.total_seconds())
    else:
        store = dist.TCPStore(parsed.hostname, parsed.port, None, False, timeout,
                              wait_for_workers=False)
    yield store, rank, world_size
    raise RuntimeError("the parameter servers' rendezvous cannot be repeated")


def _options(host: str, port: int, timeout: float) -> rpc.TensorPipeRpcBackendOptions:
    global _rendezvous_registered
    if not _rendezvous_registered:
        dist.register_rendezvous_handler(_RENDEZVOUS, _rendezvous)
        _rendezvous_registered = True
    return rpc.TensorPipeRpcBackendOptions(
        init_method=f"{_RENDEZVOUS}://{host}:{port}", rpc_timeout=timeout,
        num_worker_threads=16, _transports=["uv"], _channels=["basic"])


def _connect_store(host: str, port: int, timeout: float, what: str) -> dist.TCPStore:
    try:
        return dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout),
                             wait_for_workers=False)
    except (RuntimeError, dist.DistError) as e:
        raise TimeoutError(f"{what}: ps 0 at {host}:{port} (it hosts the rendezvous) could "
                           f"not be reached within {timeout:g} s: "
                           f"{str(e).strip().splitlines()[0]}") from None


def _start_agent(name: str, rank: int, host: str, port: int, timeout: float) -> None:
    try:
        rpc.init_rpc(name, backend=_backend(), rank=rank,
                     rpc_backend_options=_options(host, port, timeout))
    except OSError as e:   # (ps 0's port in use: said by our listening socket, not torch's)
        if e.errno != errno.EADDRINUSE:
            raise
        raise OSError(e.errno, e.strerror) from None


# -- packing tensors (one flat tensor per dtype per message) ---------------------------
def pack(ids: Sequence[int], tensors: Sequence[torch.Tensor]) -> list:
    """[(ids, shapes, flat CPU tensor)] per dtype: few contiguous RPC payloads
    (a view would send its whole storage), copied (safe to send after a lock
    is released)."""
    groups: Dict[torch.dtype, Tuple[list, list, list]] = {}
    for i, t in zip(ids, tensors):
        g = groups.get(t.dtype)
        if g is None:
            g = groups[t.dtype] = ([], [], [])
        g[0].append(i)
        g[1].append(tuple(t.shape))
        g[2].append(t.reshape(-1))
    out = []
    for gids, shapes, ts in groups.values():
        flat = torch.cat(ts) if len(ts) > 1 else ts[0].clone()
        out.append((gids, shapes, flat if flat.is_cpu else flat.cpu()))
    return out


def unpack(packed: list) -> list:
    """[(id, view)] of what `pack` made."""
    out = []
    for ids, shapes, flat in packed:
        offset = 0
        for i, shape in zip(ids, shapes):
            n = 1
            for s in shape:
                n *= s
            out.append((i, flat[offset:offset + n].view(shape)))
            offset += n
    return out


# -- the ps side --------------------------------------------------------------------------
class _Shard:
    __slots__ = ("key", "value", "clock")

    def __init__(self, key: str, value: torch.Tensor, clock: int):
        self.key, self.value, self.clock = key, value, clock


class ParameterStore:
    """What one ps task holds and does (the ps's variables, slots and the
    update ops TF ran there). RPC calls run on several threads; one lock
    serializes updates on this ps (TF's `use_locking=True`)."""

    def __init__(self, task_index: int, trainers: Sequence[str]):
        self.task_index = task_index
        self._lock = threading.Condition()
        self._shards: List[_Shard] = []
        self._ids: Dict[str, int] = {}
        self._clock = 0
        self._optimizers: Dict[str, torch.optim.Optimizer] = {}
        self._groups: Dict[str, List[int]] = {}   # optimizer -> trainer group index per group
        self.pushes = 0
        self.push_secs = 0.0
        # coordination (ps 0)
        self._modules: Dict[str, list] = {}
        self._ready = False
        self._global_step = 0
        self._issued: Dict[str, int] = {}
        self.steps_by_trainer: Dict[str, int] = {}
        self._completed: Dict[str, int] = {}
        self.lost_steps: List[Tuple[str, int]] = []   # (trainer, step) died in, not applied
        self._trainers = list(trainers)
        self._seen: Dict[str, float] = {}
        self._left: set = set()
        self._ended_at: Optional[float] = None
        self.preempted_by: Optional[str] = None   # who was preempted: no more tickets
        self._started_at = time.monotonic()
        self.end_requested = threading.Event()

    # -- shards ---------------------------------------------------------------------
    def create_shards(self, entries) -> List[int]:
        """(key, tensor) -> shard ids; an existing key is overwritten in place
        (a chief re-initializing after a restart)."""
        ids = []
        with self._lock:
            self._clock += 1
            for key, value in entries:
                i = self._ids.get(key)
                if i is None:
                    i = len(self._shards)
                    self._ids[key] = i
                    self._shards.append(_Shard(key, value.detach().contiguous(), self._clock))
                else:
                    shard = self._shards[i]
                    if shard.value.shape != value.shape or shard.value.dtype != value.dtype:
                        raise ValueError(
                            f"ps {self.task_index}: {key} has shape {list(shard.value.shape)} "
                            f"({shard.value.dtype}) here, {list(value.shape)} ({value.dtype}) "
                            "in the chief's model")
                    shard.value.copy_(value)
                    shard.clock = self._clock
                ids.append(i)
        return ids

    def _changed_since(self, since: int, only=None) -> list:
        ids = range(len(self._shards)) if only is None else only
        ids = [i for i in ids if self._shards[i].clock > since]
        return pack(ids, [self._shards[i].value for i in ids]) if ids else []

    def pull(self, ids: Optional[Sequence[int]], since: int):
        with self._lock:
            return self._clock, self._changed_since(since, ids)

    def push(self, optimizer: Optional[str], packed_grads, packed_deltas, hparams, since: int,
             packed_sparse=((), ()), packed_read=()):
        """Apply one trainer step: the gradients (dense, and sparse as packed
        (rows, values)) through this ps's optimizer, the buffer deltas by
        addition; return (clock, what changed since `since`). `packed_read`:
        masks of the rows the step's lookups read, of tables with dense
        gradients (a feature column's): the optimizer's sparse apply takes
        them as it does in one process."""
        start = time.perf_counter()
        read = unpack(packed_read)
        grads = unpack(packed_grads)
        deltas = unpack(packed_deltas)
        rows, values = (unpack(p) for p in packed_sparse)
        grads += [(i, torch.sparse_coo_tensor(r.unsqueeze(0), v, self._shards[i].value.shape,
                                              check_invariants=False, is_coalesced=True))
                  for (i, r), (_, v) in zip(rows, values)]   # (rows of a coalesced one)
        with self._lock:
            self._clock += 1
            clock = self._clock
            if grads:
                opt = self._optimizers.get(optimizer)
                if opt is None:
                    raise ValueError(f"ps {self.task_index} has no optimizer {optimizer!r}: "
                                     "the chief did not create it (same model_fn everywhere?)")
                if hparams is not None:
                    for group, index in zip(opt.param_groups, self._groups[optimizer]):
                        group.update(hparams[index])
                for i, g in grads:
                    self._shards[i].value.grad = g
                for i, mask in read:
                    lookups.received(self._shards[i].value, mask)
                opt.step()
                for i, _ in grads:
                    shard = self._shards[i]
                    shard.value.grad = None
                    shard.clock = clock
                for i, _ in read:   # (an optimizer that does not ask for them)
                    lookups.clear(self._shards[i].value)
            for i, d in deltas:
                shard = self._shards[i]
                shard.value.add_(d)
                shard.clock = clock
            out = self._changed_since(since)
            self.pushes += 1
            self.push_secs += time.perf_counter() - start
        return clock, out

    # -- optimizers ---------------------------------------------------------------------
    def ensure_optimizer(self, name: str, cls, defaults: dict, groups) -> None:
        """Build optimizer `name` (the trainers' class and hyperparameters) over
        this ps's shards, once. `groups`: [(trainer group index, hparams, ids)]."""
        with self._lock:
            if name in self._optimizers:
                return
            param_groups = [dict(hparams, params=[self._shards[i].value for i in ids])
                            for _, hparams, ids in groups]
            try:
                try:
                    opt = cls(param_groups, **defaults)
                except TypeError:
                    opt = cls(param_groups)
            except Exception as e:
                raise ValueError(f"ps {self.task_index}: cannot build optimizer {name!r} "
                                 f"({cls.__name__}) over its shards: {e}") from None
            self._optimizers[name] = opt
            self._groups[name] = [index for index, _, _ in groups]

    def set_optimizer_state(self, name: str, states: Dict[int, dict]) -> None:
        with self._lock:
            opt = self._optimizers[name]
            for i, slots in states.items():
                opt.state[self._shards[i].value] = slots

    def gather(self, ids: Sequence[int], optimizers: Sequence[str]):
        """The values of shards `ids` and the optimizer slots, copied under the lock."""
        with self._lock:
            values = pack(ids, [self._shards[i].value for i in ids]) if ids else []
            index = {id(s.value): i for i, s in enumerate(self._shards)}
            slots = {}
            for name in optimizers:
                opt = self._optimizers.get(name)
                if opt is None:
                    continue
                slots[name] = {index[id(p)]: {k: v.clone() if isinstance(v, torch.Tensor)
                                              else v for k, v in state.items()}
                               for p, state in opt.state.items()}
            return values, slots

    # -- coordination (ps 0) -----------------------------------------------------------------
    def status(self) -> dict:
        with self._lock:
            return {"ready": self._ready, "global_step": self._global_step,
                    "ended": self._ended_at is not None}

    def publish(self, module: str, layout: list) -> None:
        with self._lock:
            self._modules[module] = layout

    def lookup(self, module: str) -> Optional[list]:
        with self._lock:
            return self._modules.get(module)

    def set_ready(self, global_step: int) -> None:
        with self._lock:
            self._ready = True
            self._global_step = global_step
            logger.info("ps %d: the chief initialized the parameters; global step %d",
                        self.task_index, global_step)

    def register(self, task: str) -> dict:
        """A trainer (re)starts: a ticket its previous incarnation held is void
        (its step counted in the global step without its update: warned)."""
        with self._lock:
            if task in self._seen:
                logger.info("ps %d: %s rejoined at global step %d", self.task_index, task,
                            self._global_step)
            void = self._issued.get(task, 0)
            if void > self._completed.get(task, 0):
                self.lost_steps.append((task, void))
                logger.warning(
                    "ps %d: %s died in global step %d before applying it: that step is "
                    "counted in the global step without its update (%d such so far; TF counts "
                    "a step with its update, so TF's job would have trained one step more)",
                    self.task_index, task, void, len(self.lost_steps))
            self._completed[task] = self._issued.get(task, 0)
            self._seen[task] = time.monotonic()
            self._left.discard(task)
            self._lock.notify_all()
        return self.status()

    def next_ticket(self, task: str, limit: Optional[int], done: int):
        """(ticket, global step, preempted_by): the next global step for
        `task`, or None once training ended, was preempted or reached `limit`;
        `done` is its previous ticket."""
        with self._lock:
            self._seen[task] = time.monotonic()
            if done > self._completed.get(task, 0):
                self._completed[task] = done
                self._lock.notify_all()
            if (self._ended_at is not None or self.preempted_by is not None
                    or (limit is not None and self._global_step >= limit)):
                return None, self._global_step, self.preempted_by
            self._global_step += 1
            self._issued[task] = self._global_step
            self.steps_by_trainer[task] = self.steps_by_trainer.get(task, 0) + 1
            return self._global_step, self._global_step, None

    def preempt(self, who: str) -> int:
        """A preemption (SIGTERM/SIGINT on the chief or a ps task): hand out
        no more global steps, so every trainer stops after the step it is in
        and the chief saves the state once those are applied; returns the
        global step training stops at."""
        with self._lock:
            if self.preempted_by is None:
                self.preempted_by = who
                logger.warning("ps %d: %s was preempted: no more global steps are handed out; "
                               "training stops at global step %d, where the chief saves",
                               self.task_index, who, self._global_step)
            return self._global_step

    def wait_completed(self, caller: str, timeout: float) -> Tuple[int, List[str]]:
        """Wait until every ticket handed out so far (but the caller's) is
        done; (global step, [trainers whose ticket was abandoned after `timeout`])."""
        deadline = time.monotonic() + timeout
        with self._lock:
            snapshot = {t: n for t, n in self._issued.items()
                        if t != caller and n > self._completed.get(t, 0)}
            while True:
                missing = [t for t, n in snapshot.items() if self._completed.get(t, 0) < n]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    break
                self._lock.wait(min(left, 0.5))
            for t in missing:
                self._completed[t] = max(self._completed.get(t, 0), snapshot[t])
            return self._global_step, missing

    def complete(self, task: str, done: int) -> None:
        with self._lock:
            if done > self._completed.get(task, 0):
                self._completed[task] = done
                self._lock.notify_all()

    def end_training(self) -> None:
        with self._lock:
            if self._ended_at is None:
                self._ended_at = time.monotonic()
                logger.info("ps %d: the chief ended training at global step %d",
                            self.task_index, self._global_step)
        self.end_requested.set()

    def leave(self, task: str, done: int) -> None:
        with self._lock:
            self._left.add(task)
            if done > self._completed.get(task, 0):
                self._completed[task] = done
            self._lock.notify_all()

    def unattended(self, timeout: float) -> bool:
        """No trainer has come within `timeout` seconds of the start."""
        with self._lock:
            return not self._seen and time.monotonic() - self._started_at > timeout

    def finished(self, grace_secs: float) -> bool:
        """Training ended and every trainer has left (or has been silent,
        or never came, for `grace_secs` since)."""
        with self._lock:
            if self._ended_at is None:   # (preempted before any trainer came: none will save)
                return self.preempted_by is not None and not self._seen
            now = time.monotonic()
            for task in self._trainers:
                if task in self._left:
                    continue
                last = max(self._seen.get(task, self._ended_at), self._ended_at)
                if now - last < grace_secs:
                    return False
            return True


_store: Optional[ParameterStore] = None   # the one this ps process serves


def _local() -> ParameterStore:
    if _store is None:
        raise RuntimeError("This process serves no parameters: it is not a running ps task")
    return _store


# Module-level functions: what trainers call on a ps (pickled by reference).
def _create_shards(entries):
    return _local().create_shards(entries)


def _pull(ids, since):
    return _local().pull(ids, since)


def _push(optimizer, packed_grads, packed_deltas, hparams, since, packed_sparse=((), ()),
          packed_read=()):
    return _local().push(optimizer, packed_grads, packed_deltas, hparams, since, packed_sparse,
                         packed_read)


def _ensure_optimizer(name, cls, defaults, groups):
    return _local().ensure_optimizer(name, cls, defaults, groups)


def _set_optimizer_state(name, states):
    return _local().set_optimizer_state(name, states)


def _gather(ids, optimizers):
    return _local().gather(ids, optimizers)


def _status():
    return _local().status()


def _publish(module, layout):
    return _local().publish(module, layout)


def _lookup(module):
    return _local().lookup(module)


def _set_ready(global_step):
    return _local().set_ready(global_step)


def _register(task):
    return _local().register(task)


def _next_ticket(task, limit, done):
    return _local().next_ticket(task, limit, done)


def _wait_completed(caller, timeout):
    return _local().wait_completed(caller, timeout)


def _complete(task, done):
    return _local().complete(task, done)


def _end_training():
    return _local().end_training()


def _preempt(who):
    return _local().preempt(who)


def _leave(task, done):
    return _local().leave(task, done)


def _stats():
    s = _local()
    return {"pushes": s.pushes, "push_secs": s.push_secs,
            "steps_by_trainer": dict(s.steps_by_trainer)}


# -- serving (a ps task) -------------------------------------------------------------------
def trainers_of(cluster_spec) -> List[str]:
    """"chief:0", "worker:1", ... : the trainers of a cluster."""
    out = []
    for job in ("chief", "master", "worker"):
        if job in cluster_spec.jobs:
            out += [f"{job}:{i}" for i in cluster_spec.task_indices(job)]
    return out


def serve(cluster_spec, task_index: int, timeout: float, init_timeout: float):
    """Start serving as ps `task_index`: the RPC agent (ps 0 hosts the
    rendezvous store), then the `ps/ready/<i>` flag trainers wait for.
    Returns (ParameterStore, a client of the rendezvous store)."""
    global _store
    num_ps = cluster_spec.num_tasks("ps")
    host, port = split_address(cluster_spec.task_address("ps", 0), "ps 0")
    if _store is not None:
        raise RuntimeError("This process already serves as a ps task")
    _store = ParameterStore(task_index, trainers_of(cluster_spec))
    what = f"ps {task_index}"
    if task_index != 0:
        _connect_store(host, port, init_timeout, what)   # bounded wait for ps 0
    _start_agent(f"ps:{task_index}", task_index, host, port, timeout)
    store = _connect_store(host, port, init_timeout, what)
    store.set(f"ps/ready/{task_index}", "1")
    logger.info("ps %d of %d: serving parameters (RPC rendezvous at ps 0, %s:%d)",
                task_index, num_ps, host, port)
    return _store, store


def stop_serving(grace_secs: float = 1.0) -> None:
    """Shut the RPC agent down after the last answers have left."""
    global _store
    time.sleep(grace_secs)
    try:
        rpc.shutdown(graceful=False)
    finally:
        _store = None
