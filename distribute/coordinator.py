"""TF2's parameter-server training (``tf.distribute.experimental.coordinator``):
a coordinator schedules functions onto workers; variables live on ps tasks.

    # every ps and worker task (TF_CONFIG names it):
    distribute.Server(cluster, job_name="ps" or "worker", task_index=i).join()

    # the coordinator (the cluster's chief):
    strategy = distribute.ParameterServerStrategy(resolver)
    coordinator = distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = coordinator.create_module("net", make_net)
        optimizer = coordinator.create_optimizer("sgd", model, make_sgd)
    iterator = iter(coordinator.create_per_worker_dataset(make_dataset))
    losses = [coordinator.schedule(train_step, args=(iterator, model, optimizer))
              for _ in range(steps)]
    coordinator.join()
    print(losses[-1].fetch())

What differs from TF, because torch ships code by reference: scheduled
functions, module and optimizer factories and dataset functions must be
importable (module-level functions of a module every task can import; not
``__main__``, not lambdas), as torch.distributed.rpc requires. Modules and
optimizers are created through the coordinator (TF intercepts variable
creation under ``strategy.scope()``; torch has no such hook): their
parameters are placed round-robin over the ps tasks, and the optimizer runs
there (its slots live there). In a scheduled function, a module argument is
the worker's copy, refreshed from the ps tasks when the function starts; an
optimizer argument's `step()` sends the gradients to the ps tasks, which
apply them, and takes the new values back (asynchronous training, as TF's).
A module's buffers (batch-norm statistics) live on the ps tasks too, as TF's
moving averages: what a function changes in them is added there (with its
optimizer's step, or when it returns; a function that raises sends none), so
`state_dict()` holds them trained. A buffer a function sets outright (a
running maximum) adds up over the workers instead: keep such state out of
the ps (`register_buffer(..., persistent=False)` stays on each worker, as
does a bool flag).

Failures, as TF promises: a worker that dies has the functions it was
running run again on another worker (at least once: its lease on them runs
out after `lease_secs` without its heartbeats), and a restarted worker
joins again (its per-worker dataset made anew); a ps task that dies makes
`schedule`, `join` and `fetch` raise a `ParameterServerError` naming it.
`state_dict()` / `load_state_dict()` gather and restore the ps tasks' values
and slots, for a checkpoint the coordinator writes (``hooks.checkpoint``)
and a restarted coordinator reads back.
"""
from __future__ import annotations

import atexit
import collections
import collections.abc
import concurrent.futures
import inspect
import itertools
import logging
import pickle
import threading
import time
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from . import _closure_queue as _cq
from . import _ps_rpc, lookups, ps_client
from .host_arrays import to_numpy_value
from .partitioners import num_partitions
from .strategy import InputContext, _map

logger = logging.getLogger(__name__)

_POLL_SECS = 0.05
_PS_CHECK_SECS = 1.0
_TAKE_WAIT_SECS = 1.0


# -- values and handles --------------------------------------------------------------------
class RemoteValue:
    """The result of a scheduled function (tf.distribute.experimental.coordinator.RemoteValue)."""

    def __init__(self):
        self._event = threading.Event()
        self._value = None
        self._error: Optional[BaseException] = None

    def _set(self, value=None, error: Optional[BaseException] = None) -> None:
        if not self._event.is_set():
            self._value, self._error = value, error
            self._event.set()

    def fetch(self):
        """Wait for the function; its return value with tensors as numpy (a
        scalar one a numpy scalar, as TF's `.numpy()`; a Python number as
        TF's tf.function returns it, a tensor: np.int32, np.float32), or its
        error raised."""
        return _map(_as_numpy, self.get())

    def get(self):
        """Wait for the function; its return value as it returned it (TF: the
        tensors), or its error raised."""
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


def _as_numpy(value):
    if isinstance(value, torch.Tensor):
        return to_numpy_value(value)
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, int):   # (TF's constant: int32 where it fits)
        return np.int32(value) if -2 ** 31 <= value < 2 ** 31 else \
            np.int64(value) if -2 ** 63 <= value < 2 ** 63 else value
    if isinstance(value, float):
        return np.float32(value)
    return value


class RemoteModule:
    """A module whose parameters live on the ps tasks: pass it to scheduled
    functions, which get the worker's copy."""

    def __init__(self, name: str, factory: Callable, layout: list):
        self.name, self.factory, self.layout = name, factory, layout

    def __repr__(self):
        return f"RemoteModule({self.name!r})"


class RemoteOptimizer:
    """An optimizer running on the ps tasks over a `RemoteModule`'s parameters."""

    def __init__(self, name: str, module: RemoteModule):
        self.name, self.module = name, module

    def __repr__(self):
        return f"RemoteOptimizer({self.name!r})"


class PerWorkerDataset:
    """`dataset_fn` made on each worker (tf.distribute's PerWorkerDataset);
    each `iter()` of it reads every worker's dataset from its start."""

    def __init__(self, dataset_fn: Callable, index: tuple):
        self.dataset_fn, self.index = dataset_fn, index
        self._iterators = itertools.count()

    def __iter__(self) -> "PerWorkerIterator":
        return PerWorkerIterator(self, next(self._iterators))

    def __getstate__(self):   # what a worker needs
        return {"dataset_fn": self.dataset_fn, "index": self.index}


class PerWorkerIterator:
    """An iterator over each worker's own dataset; in a scheduled function it
    is that worker's iterator (the `number`-th of `dataset`)."""

    def __init__(self, dataset: PerWorkerDataset, number: int):
        self.dataset, self.number = dataset, number

    def __iter__(self):
        return self

    def __next__(self):
        raise TypeError("a per-worker iterator is read in a scheduled function, on a worker "
                        "(pass it to coordinator.schedule)")


class OutOfRangeError(Exception):
    """A scheduled function read past the end of its per-worker iterator
    (tf.errors.OutOfRangeError, "End of sequence"): raised by `fetch()` and
    `join()` instead of the bare StopIteration the function raised."""


def _importable(fn, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {fn!r}")
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module == "__main__" or "<" in name:
        raise TypeError(f"{what} {fn!r} must be importable by every task: a module-level "
                        "function of an importable module (not __main__, not a lambda or a "
                        "nested function): torch.distributed.rpc ships functions by name")


# -- the coordinator --------------------------------------------------------------------------
class ClusterCoordinator:
    """Schedules functions onto the workers of a `ParameterServerStrategy`'s
    cluster (tf.distribute.experimental.coordinator.ClusterCoordinator); run
    it on the cluster's chief. `lease_secs`: how long a worker may go without
    a heartbeat before its functions run elsewhere."""

    def __init__(self, strategy, lease_secs: float = 10.0):
        extended = strategy.extended
        if not hasattr(extended, "_spec") or "ps" not in extended._spec.jobs:
            raise ValueError("ClusterCoordinator needs a ParameterServerStrategy over a cluster "
                             f"with ps tasks, got {strategy!r}")
        spec = extended._spec
        if "worker" not in spec.jobs:
            raise ValueError(f"ClusterCoordinator: the cluster {spec.as_dict()} has no workers")
        self.strategy = strategy
        self._lease = float(lease_secs)
        self._num_ps = spec.num_tasks("ps")
        self._client = ps_client.Client(spec, extended._task_type, extended._task_id,
                                        extended._timeout, extended._init_timeout)
        self._client.register()
        self._claim()
        self._ids = itertools.count()
        self._values: Dict[tuple, RemoteValue] = {}
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None     # the first function error
        self._raising = threading.Lock()
        self._ps_error: Optional[BaseException] = None
        self._modules: Dict[str, tuple] = {}     # name -> (module, layout)
        self._optimizers: Dict[str, tuple] = {}  # name -> (optimizer, module name)
        self._datasets = itertools.count()
        self.stats: dict = {}
        self._stopped = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="coordinator-results",
                                        daemon=True)
        self._poller.start()
        atexit.register(self.shutdown, end_training=False)

    def _claim(self) -> None:
        """Be the cluster's one coordinator: an earlier one's functions (a
        killed coordinator's, queued on ps 0) are dropped, and those workers
        still run are waited for, so that none updates this one's variables
        (bounded: a function stuck on a worker is said, not waited for)."""
        deadline = time.monotonic() + max(30.0, 3 * self._lease)
        said = False
        while True:
            running = self._client.call(0, _cq._claim, self._client.name,
                                        what="claiming the cluster's queue")
            if not running:
                return
            if time.monotonic() > deadline:
                logger.warning("coordinator: %d function(s) of an earlier coordinator still run "
                               "on the workers; their updates may reach this coordinator's "
                               "variables", running)
                return
            if not said:
                logger.info("coordinator: waiting for %d function(s) of an earlier coordinator "
                            "that workers still run", running)
                said = True
            time.sleep(_POLL_SECS)

    # -- variables on the ps tasks ------------------------------------------------------
    def create_module(self, name: str, factory: Callable[[], torch.nn.Module]) -> RemoteModule:
        """`factory()`'s parameters and buffers (those its state_dict holds)
        placed round-robin on the ps tasks (a module the ps tasks already
        hold under `name` is overwritten: a restarted coordinator then loads
        its checkpoint)."""
        _importable(factory, "create_module: factory")
        module = factory()
        self._say_unpartitioned(name, module)
        entries = collections.defaultdict(list)
        placed = []
        for i, (key, param) in enumerate(_placed_tensors(module)):
            ps = i % self._num_ps
            entries[ps].append((f"coordinator/{name}/{key}", param.detach().cpu()))
            placed.append((key, ps, len(entries[ps]) - 1))
        ids = self._client.create_shards(dict(entries), name)
        layout = [(key, ps, ids[ps][j]) for key, ps, j in placed]
        self._modules[name] = (module, layout)
        return RemoteModule(name, factory, layout)

    def _say_unpartitioned(self, name: str, module: torch.nn.Module) -> None:
        """The strategy's variable_partitioner is the Estimator's (TF1's
        partitioned variables); here every tensor is placed whole (TF2's
        ShardedVariable is not built): said where it would cut one."""
        partitioner = getattr(self.strategy.extended, "_partitioner", None)
        if partitioner is None:
            return
        cut = [key for key, t in module.named_parameters()
               if num_partitions(partitioner, key, t.shape, t.dtype) > 1]
        if cut:
            logger.warning(
                "create_module(%r): the strategy's variable_partitioner would cut %s, but the "
                "ClusterCoordinator places each parameter whole, on one ps task (TF2's "
                "ShardedVariable is not built here; the Estimator's parameter-server training "
                "partitions)", name, ", ".join(cut))

    def create_optimizer(self, name: str, module: RemoteModule,
                         factory: Callable) -> RemoteOptimizer:
        """`factory(parameters)` (an importable function) run on each ps task
        over the shards of `module` it holds."""
        _importable(factory, "create_optimizer: factory")
        local, layout = self._modules[module.name]
        optimizer = factory(list(local.parameters()))
        where = {id(p): (ps, i) for (_, p), (_, ps, i) in zip(local.named_parameters(), layout)}
        groups = collections.defaultdict(list)
        for g, group in enumerate(optimizer.param_groups):
            hparams = {k: v for k, v in group.items() if k != "params"}
            by_ps = collections.defaultdict(list)
            for p in group["params"]:
                ps, i = where[id(p)]
                by_ps[ps].append(i)
            for ps, ids in by_ps.items():
                groups[ps].append((g, hparams, ids))
        self._client.ensure_optimizer(name, type(optimizer), dict(optimizer.defaults),
                                      dict(groups))
        self._optimizers[name] = (optimizer, module.name)
        return RemoteOptimizer(name, module)

    def create_per_worker_dataset(self, dataset_fn: Callable) -> PerWorkerDataset:
        """`dataset_fn()` made on each worker when a function first iterates
        it there (`dataset_fn(input_context)` where its parameter is named so:
        the worker's `InputContext`)."""
        _importable(dataset_fn, "create_per_worker_dataset: dataset_fn")
        return PerWorkerDataset(dataset_fn, (self._client.name, next(self._datasets)))

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """{"modules": {name: state_dict}, "optimizers": {name: {param key: slots}}}
        gathered from the ps tasks."""
        ids = collections.defaultdict(list)
        for _, layout in self._modules.values():
            for _, ps, i in layout:
                ids[ps].append(i)
        gathered = self._client.gather(dict(ids), list(self._optimizers))
        values, slots = {}, collections.defaultdict(dict)
        for ps, (packed, by_opt) in gathered.items():
            values.update({(ps, i): t.clone() for i, t in _ps_rpc.unpack(packed)})
            for opt, states in by_opt.items():
                slots[opt].update({(ps, i): s for i, s in states.items()})
        out = {"modules": {}, "optimizers": {}}
        for name, (module, layout) in self._modules.items():
            state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            state.update({key: values[(ps, i)] for key, ps, i in layout})
            out["modules"][name] = state
        for opt, (_, module_name) in self._optimizers.items():
            layout = self._modules[module_name][1]
            out["optimizers"][opt] = {key: slots[opt][(ps, i)] for key, ps, i in layout
                                      if (ps, i) in slots[opt]}
        return out

    def load_state_dict(self, state: dict) -> None:
        """Put a `state_dict()` back on the ps tasks (values and slots)."""
        for name, values in state["modules"].items():
            module, layout = self._modules[name]
            entries = collections.defaultdict(list)
            for key, ps, _ in layout:
                entries[ps].append((f"coordinator/{name}/{key}", values[key].detach().cpu()))
            self._client.create_shards(dict(entries), name)
            module.load_state_dict(values)
        for opt, slots in state.get("optimizers", {}).items():
            layout = self._modules[self._optimizers[opt][1]][1]
            by_ps = collections.defaultdict(dict)
            for key, ps, i in layout:
                if key in slots:
                    by_ps[ps][i] = slots[key]
            self._client.set_optimizer_state(opt, dict(by_ps))

    # -- scheduling -------------------------------------------------------------------------
    def schedule(self, fn: Callable, args=(), kwargs=None) -> RemoteValue:
        """Run `fn(*args, **kwargs)` on a free worker; its `RemoteValue` now.
        Raises the first error of a function since the last one raised (the
        functions still waiting then are cancelled: reschedule them)."""
        self._raise_if_failed()
        _importable(fn, "schedule: fn")
        try:
            payload = pickle.dumps((fn, tuple(args), dict(kwargs or {})))
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise TypeError(f"schedule: {fn.__qualname__}'s arguments cannot be sent to a "
                            f"worker: {e}") from None
        cid = (self._client.name, next(self._ids))   # unique across coordinator restarts
        value = RemoteValue()
        with self._lock:
            self._values[cid] = value
        self._client.call(0, _cq._put, cid, payload, self._lease, what="scheduling a function")
        return value

    def join(self) -> None:
        """Wait for every scheduled function; raise the first error (a
        function's, or a ps task's)."""
        while not self.done():
            time.sleep(_POLL_SECS)

    def done(self) -> bool:
        """Whether every scheduled function has finished (raises as `join`)."""
        while True:
            self._raise_if_failed()
            with self._lock:   # (never a finished function without its error raised)
                if self._error is None and self._ps_error is None:
                    return not self._values

    def _raise_if_failed(self) -> None:
        """Raise a ps task's error, or the first function error not raised
        yet, as TF's coordinator raises it: first the functions no worker has
        taken are cancelled, and those running are waited for (their errors
        dropped: TF cancels them; here a Python function runs to its end,
        its RemoteValue its own outcome), so no later call raises an error
        of the work the first error ended."""
        if self._ps_error is not None:
            raise self._ps_error
        with self._raising:   # (one caller raises it; the others go on after)
            with self._lock:
                error = self._error
            if error is None:
                return
            while self._ps_error is None:
                self._cancel_waiting()   # (again: a dead worker's functions come back)
                with self._lock:
                    if not self._values:
                        break
                time.sleep(_POLL_SECS)
            with self._lock:
                self._error = None
            raise error

    def _poll(self) -> None:
        next_check = 0.0
        received: list = []
        while not self._stopped.is_set():
            try:
                results, self.stats = self._client.call(
                    0, _cq._collect, self._client.name, received, what="collecting results")
                if time.monotonic() > next_check:
                    next_check = time.monotonic() + _PS_CHECK_SECS
                    self._check_ps()
            except Exception as e:   # noqa: BLE001
                if self._stopped.is_set():
                    return
                try:   # (this process stalled past the RPC timeout, a suspend: ps 0 is there)
                    self._check_ps()
                    logger.warning("coordinator: a call to ps 0 failed (%s), but the ps tasks "
                                   "answer: going on", str(e).splitlines()[0] if str(e) else e)
                    continue
                except Exception:   # noqa: BLE001 (a ps task is gone: every function fails)
                    self._fail_all(e)
                    return
            gone = self.stats.pop("gone", None)
            if gone is not None:
                self._fail_all(RuntimeError(f"ClusterCoordinator {self._client.name}: ps 0 "
                                            f"dropped this coordinator's functions: {gone}"))
                return
            received = list(results)
            for cid, payload in results.items():
                kind, value = pickle.loads(payload)
                if kind == "dropped":   # (while this coordinator was silent: said by ps 0)
                    kind, value = "error", RuntimeError(value)
                with self._lock:
                    remote = self._values.pop(cid, None)
                    failed = remote is not None and kind != "ok"
                    if failed and self._error is None:
                        self._error = value
                if remote is None:
                    continue
                if failed:   # (the waiting ones are cancelled when it is raised, as TF's)
                    remote._set(error=value)
                else:
                    remote._set(value)
            time.sleep(_POLL_SECS)

    def _check_ps(self) -> None:
        self._client.on_each({ps: (_ps_rpc._status,) for ps in range(self._num_ps)},
                             "checking the ps tasks")

    def _fail_all(self, error: BaseException) -> None:
        """Every function not finished fails with `error`, and so does every
        later call (a ps task is gone, or this coordinator was replaced)."""
        self._ps_error = error
        with self._lock:
            pending, self._values = self._values, {}
        for value in pending.values():
            value._set(error=error)

    def _cancel_waiting(self) -> None:
        """When a function's error is raised: the functions no worker has
        taken yet are cancelled (TF's: their `fetch()` raises CancelledError;
        reschedule them)."""
        try:
            cancelled = self._client.call(0, _cq._cancel, self._client.name,
                                          what="cancelling the waiting functions")
        except Exception:   # noqa: BLE001 (ps 0 gone: the next poll fails them all)
            return
        with self._lock:
            remotes = [self._values.pop(cid) for cid in cancelled if cid in self._values]
        for remote in remotes:
            remote._set(error=concurrent.futures.CancelledError(
                "The corresponding function is cancelled (an earlier function failed). "
                "Please reschedule the function."))

    def shutdown(self, end_training: bool = True) -> None:
        """Stop the workers' loops and leave; `end_training`: the ps tasks
        may exit too (TF: the end of the coordinator program)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        # No call of ours may be in flight when the RPC agent shuts down (its
        # teardown under a thread still waiting on it can abort the process):
        # the poller's call ends within the RPC timeout.
        self._poller.join(timeout=self._client.timeout + 5.0)
        try:
            if end_training:
                self._client.call(0, _cq._stop, what="stopping the workers", timeout=5.0)
                self._client.end_training()
            else:   # (the program ends: its waiting functions end with it, as TF's)
                self._client.call(0, _cq._leave, self._client.name,
                                  what="dropping the waiting functions", timeout=5.0)
        except Exception as e:
            logger.warning("coordinator: could not %s on ps 0: %s", "end training" if end_training
                           else "drop its waiting functions", e)
        self._client.close()


# -- the worker side -------------------------------------------------------------------------
def _placed_tensors(module: torch.nn.Module) -> list:
    """(key, tensor) of the parameters and of the numeric buffers a
    state_dict holds (a bool flag, which no change adds up, stays on each
    worker)."""
    kept = module.state_dict(keep_vars=True)
    return list(module.named_parameters()) + [(k, b) for k, b in module.named_buffers()
                                              if k in kept and b.dtype != torch.bool]


class _LocalModule:
    """A worker's copy of a RemoteModule, refreshed from the ps tasks; its
    buffers' values at the last refresh kept, to send what changed."""

    def __init__(self, handle: RemoteModule):
        self.layout = handle.layout
        self.module = handle.factory()
        params = dict(self.module.named_parameters())
        self.tensors = {(ps, i): params[key] for key, ps, i in handle.layout if key in params}
        # buffers by name: a forward may replace one (`self.count = self.count + 1`)
        self.buffer_keys = {(ps, i): key for key, ps, i in handle.layout if key not in params}
        self.snaps: Dict[tuple, torch.Tensor] = {}
        self.ids = collections.defaultdict(list)
        for _, ps, i in handle.layout:
            self.ids[ps].append(i)
        self.since = {ps: -1 for ps in self.ids}

    def buffers(self) -> Dict[tuple, torch.Tensor]:
        named = dict(self.module.named_buffers())
        return {at: named[key] for at, key in self.buffer_keys.items()}

    def apply(self, answers: Dict[int, tuple]) -> None:
        buffers = self.buffers()
        with torch.no_grad():
            for ps, (clock, packed) in answers.items():
                for i, value in _ps_rpc.unpack(packed):
                    tensor = self.tensors.get((ps, i), buffers.get((ps, i)))
                    if tensor is not None:
                        tensor.copy_(value)
                self.since[ps] = clock
        self.snaps = {at: t.detach().clone() for at, t in buffers.items()}

    def discard_buffer_changes(self) -> None:
        """A function failed: its buffers' changes are not sent, so the
        worker's copy goes back to the ps tasks' values (the next refresh
        pulls only what changed there)."""
        with torch.no_grad():
            for at, tensor in self.buffers().items():
                if at in self.snaps:
                    tensor.copy_(self.snaps[at])

    def refresh(self, client) -> None:
        self.apply(client.on_each({ps: (_ps_rpc._pull, ids, self.since[ps])
                                   for ps, ids in self.ids.items()}, "pulling parameters"))

    def buffer_deltas(self) -> Dict[int, tuple]:
        """{ps: (ids, changes)} of the buffers changed since the last refresh
        (a batch norm's moving averages: added on the ps, TF's assign_sub)."""
        out = collections.defaultdict(lambda: ([], []))
        for (ps, i), tensor in self.buffers().items():
            snap = self.snaps[(ps, i)]
            if not torch.equal(tensor, snap):
                ids, changes = out[ps]
                ids.append(i)
                changes.append(tensor.detach() - snap)
        return dict(out)

    def push_buffers(self, client) -> None:
        """Send the buffers' changes a function made after its last step."""
        deltas = self.buffer_deltas()
        if deltas:
            self.apply(client.push({ps: ((), (), ids, changes, None, self.since[ps],
                                         ((), (), ()), ((), ()))
                                    for ps, (ids, changes) in deltas.items()}, None))


class _WorkerOptimizer:
    """In a scheduled function: `step()` sends the gradients to the ps tasks'
    optimizer and takes the new values back."""

    def __init__(self, name: str, local: _LocalModule, client):
        self.name, self._local, self._client = name, local, client

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._local.module.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        calls, tables = {}, []
        deltas = self._local.buffer_deltas()
        for ps, ids in self._local.ids.items():
            have = [(i, self._local.tensors.get((ps, i))) for i in ids]   # (None: a buffer)
            have = [(i, t, t.grad) for i, t in have if t is not None and t.grad is not None]
            dense = [(i, g.detach()) for i, _, g in have if not g.is_sparse]
            sparse = [(i, g.detach().coalesce()) for i, _, g in have   # (TF's IndexedSlices:
                      if g.is_sparse]                                 # applied as sparse there)
            # (a table whose lookups noted their rows: its dense gradient and those rows)
            read = [(i, t) for i, t, g in have if not g.is_sparse and lookups.noted(t)]
            tables += [t for _, t in read]
            calls[ps] = ([i for i, _ in dense], [g for _, g in dense], *deltas.get(ps, ([], [])),
                         None, self._local.since[ps], ([i for i, _ in sparse],
                                                 [g.indices()[0] for _, g in sparse],
                                                 [g.values() for _, g in sparse]),
                         ([i for i, _ in read], [lookups.rows(t) for _, t in read]))
        self._local.apply(self._client.push(calls, self.name))
        for table in tables:
            lookups.clear(table)


class _Worker:
    def __init__(self, client, index: int, num_workers: int):
        self.client, self.index, self.num_workers = client, index, num_workers
        self._modules: Dict[str, _LocalModule] = {}
        self._used: list = []   # the modules the running function was given
        self._datasets: Dict[tuple, list] = {}    # dataset index -> [made, iterated]
        self._iterators: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
        self._dropped: set = set()

    def resolve(self, value):
        return _map(self._resolve, value)

    def push_buffers(self, failed: bool = False) -> None:
        """After a function: the changes it made to its modules' buffers
        (`failed`: none sent, the worker's copy put back)."""
        for local in self._used:
            if failed:
                local.discard_buffer_changes()
            else:
                local.push_buffers(self.client)
        self._used = []

    def _resolve(self, value):
        if isinstance(value, RemoteModule):
            local = self._modules.get(value.name)
            if local is None or local.layout != value.layout:
                local = self._modules[value.name] = _LocalModule(value)
            local.refresh(self.client)
            if local not in self._used:
                self._used.append(local)
            return local.module
        if isinstance(value, RemoteOptimizer):
            self._resolve(value.module)
            return _WorkerOptimizer(value.name, self._modules[value.module.name], self.client)
        if isinstance(value, PerWorkerIterator):
            return self._iterator(value.dataset, value.number)
        return value

    def _iterator(self, dataset: PerWorkerDataset, number: int):
        """This worker's `number`-th iterator of `dataset`: a new one reads
        the dataset from its start (a one-shot dataset, a generator, is made
        again); the last `_KEPT_ITERATORS` are kept."""
        key = (dataset.index, number)
        if key in self._iterators:
            return self._iterators[key]
        if key in self._dropped:
            raise RuntimeError(
                f"per-worker iterator {number} of {dataset.dataset_fn.__qualname__} was dropped "
                f"on worker {self.index}: it keeps the last {_KEPT_ITERATORS} iterators of a "
                "dataset; schedule functions on a newer iterator")
        made = self._datasets.get(dataset.index)
        if made is None or made[1] and isinstance(made[0], collections.abc.Iterator):
            made = self._datasets[dataset.index] = [self._make(dataset.dataset_fn), False]
        made[1] = True
        iterator = self._iterators[key] = iter(made[0])
        mine = [k for k in self._iterators if k[0] == dataset.index]
        for old in mine[:-_KEPT_ITERATORS]:
            del self._iterators[old]
            self._dropped.add(old)
        return iterator

    def _make(self, dataset_fn: Callable):
        if "input_context" in inspect.signature(dataset_fn).parameters:
            return dataset_fn(input_context=InputContext(self.num_workers, self.index, 1))
        return dataset_fn()


_KEPT_ITERATORS = 8


def _detached(value):
    return _map(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, value)


def _result(kind: str, value) -> bytes:
    try:
        return pickle.dumps((kind, value))
    except Exception as e:   # an unpicklable result or error: say what it was
        return pickle.dumps(("error", RuntimeError(f"the function's {kind} could not be sent "
                                                   f"back: {value!r:.300} ({e})")))


def run_worker(cluster_spec, task_index: int, timeout: float, init_timeout: float,
               stop: Optional[threading.Event] = None) -> None:
    """A worker task: take scheduled functions from ps 0 and run them, until
    the coordinator stops (or ps 0 is gone: an error naming it)."""
    client = ps_client.Client(cluster_spec, "worker", task_index, timeout, init_timeout)
    client.register()
    worker = _Worker(client, task_index, cluster_spec.num_tasks("worker"))
    running = threading.Event()
    closing = threading.Event()

    def heartbeat():
        while not closing.is_set():
            if running.is_set():
                try:
                    client.call(0, _cq._beat, client.name, what="heartbeat")
                except Exception:   # noqa: BLE001 (the main loop sees ps 0 gone)
                    pass
            closing.wait(0.5)
    beats = threading.Thread(target=heartbeat, name="worker-heartbeat", daemon=True)
    beats.start()
    logger.info("worker %d: taking scheduled functions from ps 0", task_index)
    try:
        while stop is None or not stop.is_set():
            item = client.call(0, _cq._take, client.name, _TAKE_WAIT_SECS,
                               what="taking a scheduled function",
                               timeout=timeout + _TAKE_WAIT_SECS)
            if item == _cq.STOP:
                break
            if item is None:
                continue
            cid, payload = item
            running.set()
            try:
                fn, args, kwargs = pickle.loads(payload)
                value = fn(*worker.resolve(args), **worker.resolve(kwargs))
                worker.push_buffers()
                result = _result("ok", _detached(value))
            except StopIteration:
                worker.push_buffers(failed=True)
                result = _result("error", OutOfRangeError(
                    f"End of sequence: {getattr(fn, '__qualname__', fn)} on worker "
                    f"{task_index} read past the end of an iterator (StopIteration)"))
            except Exception as e:   # the coordinator raises it from join / fetch
                worker.push_buffers(failed=True)
                result = _result("error", e)
            finally:
                running.clear()
            client.call(0, _cq._done, client.name, cid, result, what="reporting a result")
    finally:
        closing.set()
        # No call of the heartbeat's in flight when the RPC agent shuts down
        # (as the coordinator's poller in shutdown()).
        beats.join(client.timeout + 5.0)
        client.close()


__all__ = ["ClusterCoordinator", "RemoteValue", "RemoteModule", "RemoteOptimizer",
           "PerWorkerDataset", "PerWorkerIterator", "OutOfRangeError", "run_worker"]
