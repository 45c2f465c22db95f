"""The collective engine: synchronous data parallelism over a torch.distributed
process group, shared by MirroredStrategy, MultiWorkerMirroredStrategy and
CentralStorageStrategy (TF: MirroredExtended / CollectiveAllReduceExtended).

TF runs a machine's replicas as threads of one process and mirrors each
variable on every device. PyTorch does data parallelism with one process per
device, so here each replica is a process in a torch.distributed group
(gloo on CPUs, NCCL on GPUs):

- modules built through the model scope while gradients are on are wrapped
  in `DistributedDataParallel` (its bucketed gradient all-reduce overlaps
  the backward pass; it broadcasts rank 0's weights at wrap, so every replica
  starts from the chief's state) and average the gradients; the buffers a
  step changes (batch-norm statistics) are averaged after each forward pass
  (`_moving_buffers`: what TF reads from its per-replica moving averages);
- each replica takes its own batch from the input (one step of N replicas
  consumes N batches; an `input_fn` that ignores `input_context` is sharded
  for it, see `input_lib`), the logged loss is the mean over replicas, and
  evaluation metrics (sums) are all-reduced at the end, so they are exact;
- the replicas agree to stop at the same global step, whatever stops one
  (a hook, early stopping on the chief, a NaN loss, its input running out),
  in one small all-reduce per step that rides along with the gradient
  all-reduce (see "agreeing, once per step" below);
- only rank 0 (the chief) writes checkpoints and summaries.

A strategy on this engine, in a plain `python train.py`, starts its replica
processes itself, through `extended.launcher` (`distribute.launcher`):
`Estimator.train`/`evaluate` (and `extended.call_for_each_replica` in a
custom loop) fork one process per device and run the call's body there; what
comes back is each replica's return value (the Estimator's: rank 0's
evaluation results and the state of the call's hooks). `predict` runs in the
calling process on the first device. On GPUs the forking process must not
have initialized CUDA (predict does: train and evaluate first, or use
torchrun). An evaluation started inside training (a saving listener of
`train_and_evaluate` on the chief) runs on the chief alone, unsharded, while
the other replicas wait for it in their next collective.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import logging
import os
import random
import socket
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import device_util, input_lib, lookups
from ._moving_buffers import MovingBuffers
from ._process_group import (_SUM as _SUM_OPTIONS, ProcessGroup, host_store,
                             listening_socket)
from ._random_streams import InputStream
from .cross_device_ops import CrossDeviceOps, _DefaultAllReduce
from .launcher import ForkLauncher, InProcessLauncher, Launcher, in_replica_process
from .strategy import (InputContext, ReduceOp, ReplicaContext, Strategy, StrategyExtended,
                       _checked_axis, _stack, free_gradients)

logger = logging.getLogger(__name__)

_DEFAULT_TIMEOUT = 1800.0
_MAX_DIMS = 8   # of a value strategy.reduce or gather compares across the replicas
_AT_COLLECTIVE, _AT_END = 1.0, 2.0   # where a replica is in a sharded evaluation
_TRAIN, _EVAL, _PREDICT = "train", "eval", "infer"   # estimator.ModeKeys


class _StopAgreed(StopIteration):
    """The replicas agreed to stop before this step's update: it ends the
    training loop as the end of the input does (the session's StopIteration)."""


def _local_devices(devices) -> Tuple[List[torch.device], List[str]]:
    """`devices` parsed, with their names, or every local GPU, or the CPU."""
    if devices is None:
        n = torch.cuda.device_count()  # NVML-based: does not initialize CUDA
        parsed = [torch.device("cuda", i) for i in range(n)] or [torch.device("cpu")]
        return parsed, [str(d) for d in parsed]
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    names = list(devices)
    if not names:
        raise ValueError("MirroredStrategy(devices=...) needs at least one device")
    parsed = [device_util.canonicalize(d) for d in names]
    spelled = [device_util.torch_name(d) if isinstance(d, str) else str(d) for d in names]
    spelled = [n if ":" in n else n + ":0" for n in spelled]   # ("cpu" is TF's CPU:0)
    if len(set(spelled)) != len(spelled):   # (TF's words; every cpu:N is one device here)
        raise ValueError(f"No duplicates allowed in `devices` argument: {names}")
    kinds = {d.type for d in parsed}
    if len(kinds) > 1:
        raise ValueError(f"The devices {names} mix CPUs and GPUs; a strategy's replicas must "
                         "all be on the same kind of device")
    gpus = [d for d in parsed if d.type == "cuda"]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"The devices {names} name a GPU twice")
    count = torch.cuda.device_count() if gpus else 0
    for name, d in zip(names, parsed):
        if d.type == "cuda" and d.index >= count:
            raise ValueError(f"Device {name!r} does not exist: this machine has {count} GPU(s)")
    return parsed, [str(n) for n in names]


class _AnswersForModule:
    """A wrapper that also answers for the module it wraps (`self.module`), as
    that module does in one process: `net[0]`, `net.head.weight`, `len(net)`
    (a TF variable is the same object under a strategy), `bool(net)`."""

    _OWN = frozenset({"module", "buffer_hook"})   # the wrapper's, never the module's

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or name in self._OWN:
                raise
            return getattr(self.module, name)

    def __getitem__(self, index):
        return self.module[index]

    def __len__(self) -> int:
        return len(self.module)

    def __bool__(self) -> bool:   # torch.compile asks (a Linear has no len())
        try:
            return bool(self.module)
        except TypeError:   # a compiled module's len() raises: DDP itself is true
            return True

    def __iter__(self):
        return iter(self.module)

    # Names as the module's own (no "module." prefix): a factory grouping
    # parameters by name (BERT's decay and no-decay groups), a state_dict
    # saved by hand, `dict(net.named_parameters())["0.weight"]`.
    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True):
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True):
        return self.module.named_buffers(prefix, recurse, remove_duplicate)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        return self.module.named_modules(memo, prefix, remove_duplicate)

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict, assign)

    def _read_own_names(self) -> None:
        """Inside another module (get_module of a get_module's result), whose
        state_dict holds this one's keys without "module.": its load, which
        walks `_modules`, finds them under "module." (a key written so
        before, by a state_dict of this wrapper's own, stays as it is)."""
        def add_module(state_dict, prefix, *args):
            for key in [k for k in state_dict
                        if k.startswith(prefix) and not k.startswith(prefix + "module.")]:
                state_dict[prefix + "module." + key[len(prefix):]] = state_dict.pop(key)
        self._register_load_state_dict_pre_hook(add_module)


class _Replicated(_AnswersForModule, torch.nn.parallel.DistributedDataParallel):
    """DDP answering for its module. Calling a submodule this way bypasses
    DDP's forward, so its gradients would not be averaged: the first training
    step refuses that (`_CollectiveExtended._check_used`). DDP's error for
    parameters that got no gradient in the step before ("Expected to have
    finished reduction") is said as `_frozen_since(ddp)` finds it: frozen
    after the module was made (a freeze window starting at a later step)."""

    _first_forward = None   # (`_watch_first_use`: called by a training forward)
    _explain = None         # (the engine's: a transport failure named)

    def forward(self, *args, **kwargs):
        if self._first_forward is not None and torch.is_grad_enabled():
            self._first_forward()   # (here, not in a pre-hook: `ddp.forward(x)` counts)
        try:
            return super().forward(*args, **kwargs)
        except RuntimeError as e:
            frozen = "Expected to have finished reduction" in str(e) and self._frozen_since(self)
            if frozen:
                raise frozen from e
            explained = self._explain(e, "DDP's forward") if self._explain else e
            if explained is not e:   # (a transport failure: who did not respond, and why)
                raise explained from e
            raise


class _MadeAtFirstCall(_AnswersForModule, torch.nn.Module):
    """A module with lazy parameters (`LazyLinear`, made by its first batch:
    DDP cannot wrap it before), wrapped at its first call: a forward in eval
    mode without gradients makes them (no dropout drawn, no batch-norm
    statistics moved; each submodule's mode put back after; in `quiet()`,
    the model scope's `records_discarded`, no summary recorded), then
    `wrap(module)` (DDP starts every replica from rank 0's values, as for
    any module) takes this call and the next ones. What the module's forward
    does by itself beyond that (a call counter of its own) it does once more."""

    def __init__(self, wrap: Callable, module: torch.nn.Module, quiet: Callable):
        super().__init__()
        self.module = module
        self._read_own_names()
        object.__setattr__(self, "_made", None)   # (not a submodule: `module` is)
        object.__setattr__(self, "_wrap_it", wrap)
        object.__setattr__(self, "_quiet", quiet)

    def forward(self, *args, **kwargs):
        if self._made is None:
            modes = [(m, m.training) for m in self.module.modules()]
            self.module.eval()
            try:
                with torch.no_grad(), self._quiet():
                    self.module(*args, **kwargs)
            finally:
                for m, training in modes:
                    m.training = training
            object.__setattr__(self, "_made", self._wrap_it(self.module))
        return self._made(*args, **kwargs)


@dataclasses.dataclass
class _Topology:
    """Where this process's replicas sit: its local devices (one replica
    each), its task among `num_tasks`, the rendezvous address (None: a free
    port on 127.0.0.1 held by this process), and names for messages."""

    devices: List[torch.device]
    device_names: Sequence[str]
    num_tasks: int = 1
    task_rank: int = 0
    host: Optional[str] = None
    port: int = 0
    task_names: Sequence[str] = ("this process",)
    role: str = ""                 # this task in the cluster ("worker:0"); "" alone
    env_rendezvous: bool = False   # torchrun: use its env:// store

    @property
    def world_size(self) -> int:
        return self.num_tasks * len(self.devices)

    def describe(self, rank: int) -> str:
        task, local = divmod(rank, len(self.devices))
        device = self.device_names[local]
        if self.num_tasks == 1:
            return f"replica {rank} ({device})"
        where = self.task_names[task]
        return f"{where} (rank {rank})" if len(self.devices) == 1 else \
            f"{where} replica {local} (rank {rank}, {device})"


class _CollectiveExtended(StrategyExtended):
    """Synchronous replicas in a torch.distributed group
    (TF: MirroredExtended / CollectiveAllReduceExtended)."""

    def __init__(self, strategy, topology: _Topology,
                 cross_device_ops: Optional[CrossDeviceOps] = None,
                 timeout: Optional[float] = None):
        super().__init__(strategy, topology.devices[0])
        if cross_device_ops is not None and not isinstance(cross_device_ops, CrossDeviceOps):
            raise TypeError(f"cross_device_ops must be a CrossDeviceOps instance such as "
                            f"NcclAllReduce(), got {cross_device_ops!r}")
        self._topology = topology
        self._ops = cross_device_ops or _DefaultAllReduce()
        self._backend = self._ops._backend(self._device.type)
        self._timeout = float(timeout or _DEFAULT_TIMEOUT)
        self._group: Optional[ProcessGroup] = None
        # User code steps its optimizers (a callable train_op, a custom loop's
        # strategy.run): under ReductionToOneDevice and central storage their
        # steps reduce the gradients first, as apply_gradients does.
        self._user_step = False
        self._synchronized = weakref.WeakSet()   # the optimizers get_optimizer made
        # The trainable parameters DDP wraps, and (from the first user step)
        # the ids of those whose gradient a backward accumulated in the user
        # step: DDP averaged those; the others were set by hand
        # (torch.autograd.grad), which user steps' optimizers average.
        self._ddp_params: List[torch.Tensor] = []
        self._tracked: set = set()
        self._tracked_upto = 0   # (the first of _ddp_params not tracked yet)
        self._accumulated: set = set()
        self._averaged: Dict[int, tuple] = {}   # id(param) -> its gradient's (id, version)
        # The ids of the parameters whose next backward DDP averages: those of
        # a module run forward with gradients since their last backward (a
        # second backward through that graph, retain_graph=True, is local)
        self._armed: set = set()
        # (name, {parameter id: key}) of each DDP module's trainable parameters
        self._wrapped: List[tuple] = []
        # id(parameter) -> its name, for parameters frozen when their module was
        # made: DDP (or no DDP, for a module all frozen) never averages theirs
        self._frozen_at_wrap: Dict[int, str] = {}
        self._reset_step_state()

    def _reset_step_state(self):
        self._training = False       # between the start of a training input and its end
        self._eval_input = None      # the sharded evaluation's batches (evaluates_nothing)
        self._train_input = None     # input_lib.TrainBatches of the current training
        # [loss, vote, no next batch, preempted, moving buffers joined late]
        self._step_flags = torch.zeros(5, dtype=torch.float64)
        self._step_work = None       # its all-reduce, in flight during backward
        self._step_loss = None       # the loss it carries
        self._loss_total = 0.0       # the sum of the last agreed step's losses (CPU)
        self._vote = False           # a hook asked to stop: carried by the next step
        self._preempt_vote = False   # ... because of SIGTERM/SIGINT here
        self._stop_after = False     # a replica has no next batch: stop after this step
        self._left_untrained = 0     # ... and this one has: how many replicas ran out
        self._step_agreed = False    # this step agreed in _finish_step
        self._stop_flag = torch.zeros(1)
        self._pending_stop = None    # a custom loop's async vote (all-reduce of _stop_flag)
        self._loss_sum = None        # on GPUs, the loss all-reduce's buffer
        self._pending_loss = None
        self._loss_src = self._loss_mean = None
        self._moving_buffers = MovingBuffers()   # batch-norm statistics: the replicas' mean
        self._first_used = []        # [(name, DDP module)] called for the first time in TRAIN
        self._not_called = {}        # {name: DDP module} not called in TRAIN yet
        self._check_due = True       # the next step checks (_check_used)
        self._called_due = False     # a callable train_op's optimizer step checks (_check_called)
        self._tables_of, self._tables = None, []   # (scope, modules), its tables (lookups)

    # -- TF's public surface ---------------------------------------------------------
    @property
    def worker_devices(self):
        return tuple(self._topology.device_names)

    @property
    def parameter_devices(self):
        return self.worker_devices

    def _rank(self) -> int:
        if self._group is not None:
            return self._group.rank
        return self._topology.task_rank * len(self._topology.devices)

    _replica_id = _rank

    @property
    def should_checkpoint(self) -> bool:
        return self._rank() == 0

    @property
    def should_save_summary(self) -> bool:
        return self._rank() == 0

    def call_for_each_replica(self, fn: Callable, args=(), kwargs=None) -> tuple:
        """Run `fn(*args, **kwargs)` once per replica (TF1's
        `extended.call_for_each_replica`); returns the results of this
        process's replicas. Called where the replicas are not running yet
        (MirroredStrategy in `python train.py`), it starts one process per
        device, runs `fn` in each (the whole custom training loop, say) and
        returns all their results; inside a replica, it runs `fn` there."""
        launcher = self.launcher
        if launcher is None:
            return (fn(*args, **(kwargs or {})),)
        return tuple(launcher.launch(fn, *args, **(kwargs or {})))

    # -- processes ---------------------------------------------------------------------
    @property
    def _num_replicas(self) -> int:
        return self._topology.world_size

    @property
    def launcher(self) -> Optional[Launcher]:
        """None once this process is a replica (or there is one); else how to
        run a call on this task's replicas: here after joining the group (the
        task's only replica), or in one forked process per device."""
        if self._group is not None or self._num_replicas == 1 or in_replica_process():
            return None
        topo = self._topology
        if len(topo.devices) == 1:
            return InProcessLauncher(lambda: self._join(0))
        names = [topo.describe(topo.task_rank * len(topo.devices) + i)
                 for i in range(len(topo.devices))]
        return ForkLauncher(names, setup=lambda i: self._join(i, self._launch_port, forked=True),
                            timeout=self._timeout, before_fork=self._open_rendezvous,
                            after_fork=self._host_rendezvous)

    def _open_rendezvous(self) -> Optional[socket.socket]:
        """Before forking: when this task is the first, open the rendezvous's
        listening socket (the replicas connect to its port at once)."""
        topo = self._topology
        sock = None
        if topo.task_rank == 0 and not topo.env_rendezvous:
            sock = listening_socket(topo.host or "127.0.0.1", topo.port)
        self._launch_port = sock.getsockname()[1] if sock is not None else topo.port
        logger.info("%s: starting %d replica processes on %s", type(self._container_strategy)
                    .__name__, len(topo.devices), ", ".join(topo.device_names))
        import torch._dynamo  # noqa: F401,E501  (DDP imports it: once here, not in every replica)
        return sock

    def _host_rendezvous(self, sock: Optional[socket.socket]):
        """Once the replicas are forked: serve the store on that socket
        (returned to be held: it outlives the replicas). Not before: the
        store's thread, naming a replica that connects, holds glibc's
        resolver lock for a moment, and a replica forked then hangs on it."""
        if sock is not None:
            return host_store(self._topology.host or "127.0.0.1", 0, self._timeout, sock=sock)
        return None

    def _join(self, local_index: int, port: Optional[int] = None, forked: bool = False) -> None:
        """Join the process group as local replica `local_index` of this task."""
        topo = self._topology
        rank = topo.task_rank * len(topo.devices) + local_index
        self._set_device(topo.devices[local_index])
        if self._device.type == "cuda":
            os.environ.update(self._ops._nccl_env)
            torch.cuda.set_device(self._device)
        elif forked:  # share the cores between the local replicas, as torchrun does
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // len(topo.devices)))
        store_host = "the launching process" if topo.num_tasks == 1 else topo.task_names[0]
        store = None
        if topo.env_rendezvous:   # torchrun's store (its agent's, or rank 0's)
            store, _, _ = next(dist.rendezvous("env://", rank, topo.world_size,
                                               timeout=datetime.timedelta(seconds=self._timeout)))
            host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        else:
            host = topo.host or "127.0.0.1"
            port = topo.port if port is None else port
        self._group = ProcessGroup.join(rank, topo.world_size, self._backend, host, port,
                                        topo.describe, self._timeout, store=store,
                                        is_host=rank == 0 and not forked, store_host=store_host)
        self._reset_step_state()
        logger.info("%s: %s, rank %d of %d, device %s, backend %s, rendezvous %s:%s",
                    type(self._container_strategy).__name__,
                    topo.role or ("chief" if rank == 0 else "replica"), rank, topo.world_size,
                    topo.device_names[local_index], self._backend, host, port)

    def _explain(self, exc: BaseException, what: str) -> BaseException:
        return self._group.explain(exc, what) if self._group is not None else exc

    # -- creation ----------------------------------------------------------------------
    def create_module(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        module = module.to(self._device)
        if self._group is None:
            return module
        try:
            if torch.is_grad_enabled():
                return self._wrap(name, module)
            scope = self.current_scope   # evaluation, prediction: nothing to synchronize
            if scope is not None and scope.initial and scope.mode == _EVAL:   # but the
                self._share_initial(module)   # initial values evaluated by every replica
            return module
        except RuntimeError as e:
            raise self._explain(e, f"setting up module {name!r}") from e

    def _share_initial(self, module: torch.nn.Module) -> None:
        """Rank 0's initial values on every replica, as TF initializes a
        mirrored variable once (the initial model evaluated on replicas, each
        of which would draw its own). A lazy layer's, once its first batch
        makes them (each replica's forward reaches them in the same order)."""
        lazy = [m for m in module.modules() if isinstance(m, torch.nn.modules.lazy.LazyModuleMixin)
                and m.has_uninitialized_params()]
        made = [t for m in module.modules() if not any(m is n for n in lazy)
                for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))]
        self._broadcast(made)
        for layer in lazy:
            self._share_when_made(layer)

    def _share_when_made(self, layer: torch.nn.Module) -> None:
        def share(layer, args):   # (after the lazy layer's own hook made its parameters)
            handle.remove()
            self._broadcast([*layer.parameters(recurse=False), *layer.buffers(recurse=False)])
        handle = layer.register_forward_pre_hook(share)

    def _wrap(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        if any(isinstance(p, torch.nn.parameter.UninitializedParameter)
               for p in module.parameters()):
            scope = self.current_scope
            wrapper = _MadeAtFirstCall(functools.partial(self._wrap_made, name), module,
                                       getattr(scope, "records_discarded", contextlib.nullcontext))
            self._not_called[name] = wrapper   # (its submodules called past it: refused)
            return wrapper
        if not self._ops._reduce_to_one:   # (reduced by hand there: every gradient)
            self._frozen_at_wrap.update((id(p), f"{name}/{k.replace('.', '/')}")
                                        for k, p in module.named_parameters()
                                        if not p.requires_grad)
        if self._ops._reduce_to_one or not any(p.requires_grad for p in module.parameters()):
            # No DDP (gradients reduced by hand; or nothing to train: frozen,
            # or buffers alone, as BatchNorm(affine=False)): start from rank
            # 0's state, as DDP does, and average the moving buffers as well.
            self._broadcast(list(module.parameters()) + list(module.buffers()))
            self._moving_buffers.watch(module)
            return module
        size = sum(p.numel() * p.element_size() for p in module.parameters())
        cap = self._ops._bucket_cap_mb(size)
        # Buffers are broadcast from rank 0 at wrap, not before each forward
        # (DDP's default): the Estimator's steps average the moving ones.
        ddp = _Replicated(
            module, device_ids=[self._device.index] if self._device.type == "cuda" else None,
            forward_sync_buffers=False, **({"bucket_cap_mb": cap} if cap else {}))
        ddp._read_own_names()
        self._ddp_params += [p for p in module.parameters() if p.requires_grad]
        ddp._param_ids = tuple(id(p) for p in module.parameters() if p.requires_grad)
        self._wrapped.append((name, {id(p): k for k, p in module.named_parameters()
                                     if p.requires_grad}))
        if self._tracked_upto:   # (made after the first user step)
            self._track_accumulation()
        self._moving_buffers.watch(module)
        # A custom loop's vote to stop is awaited before the next forward;
        # the Estimator's steps leave none pending.
        ddp.register_forward_pre_hook(self._before_forward)
        ddp._frozen_since = functools.partial(self._frozen_since, name)
        ddp._explain = self._explain
        self._watch_first_use(name, ddp)
        return ddp

    def _wrap_made(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        """`_wrap` of a lazy module its first call has made (called now)."""
        self._not_called.pop(name, None)
        return self._wrap(name, module)

    def _watch_first_use(self, name: str, ddp) -> None:
        """Have the first training step that calls `ddp` check that its loss
        reached every trainable parameter (`_check_used`); the hook is removed
        after that forward."""
        def first_forward():
            ddp._first_forward = None
            self._not_called.pop(name, None)
            self._first_used.append((name, ddp))
            self._check_due = True
        self._not_called[name] = ddp
        ddp._first_forward = first_forward

    def _check_used(self) -> None:
        """After the backward pass of a module's first training step: a
        trainable parameter without a gradient (an output computed in TRAIN
        but left out of the loss) is an error here, before the optimizer steps
        on gradients DDP never averaged (it reduces a module's parameters
        together and would fail only at the next forward); so are gradients
        in a module not called (a submodule called directly, past DDP, whose
        gradients DDP would silently leave unaveraged)."""
        self._check_called()
        strategy = type(self._container_strategy).__name__
        self._check_due = False
        used, self._first_used = self._first_used, []
        for name, ddp in used:
            frozen = self._frozen_since(name, ddp)
            if frozen:
                raise frozen
            unused = [n for n, p in ddp.module.named_parameters()
                      if p.requires_grad and p.grad is None]
            if unused:
                raise ValueError(
                    f"module {name!r}: the loss does not reach its parameters "
                    f"{', '.join(unused)} (no gradient in this training step). Under "
                    f"{strategy} (DDP, which averages a module's gradients together) "
                    "every trainable parameter of a module a training step calls must be "
                    "in the loss: make the part the loss does not use (a head only "
                    "predictions need) a module of its own, another est.get_module, that "
                    "the training step does not call (`if mode != est.ModeKeys.TRAIN`)")

    def _check_called(self) -> None:
        """Gradients in a module not called (`_check_used`): an error."""
        strategy = type(self._container_strategy).__name__
        for name, ddp in self._not_called.items():
            bypassed = [n for n, p in ddp.module.named_parameters() if p.grad is not None]
            if bypassed:
                raise ValueError(
                    f"module {name!r}: its parameters {', '.join(bypassed)} have gradients "
                    "but the module was not called in this training step (a submodule "
                    f"called directly, as `{name}.head(x)`, or a parameter read as "
                    f"`{name}.weight[ids]`?). Under {strategy} the replicas' gradients are "
                    "averaged by the module's own call: call the module (its forward "
                    "doing the reading), or make the part a module of its own (another "
                    "est.get_module)")

    def _check_called_in_user_step(self, optimizer, args, kwargs) -> None:
        """Before the first optimizer step of a callable train_op's first
        training step: `_check_called` (DDP's own error stands for the rest)."""
        if self._user_step and self._called_due:
            self._called_due = False
            self._check_called()

    def _frozen_since(self, name: str, ddp) -> Optional[ValueError]:
        """The error for `ddp`'s parameters frozen (requires_grad False) after
        it wrapped them, if any."""
        frozen = [n for n, p in ddp.module.named_parameters()
                  if not p.requires_grad and id(p) not in self._frozen_at_wrap]
        if not frozen:
            return None
        return ValueError(
            f"module {name!r}: its parameters {', '.join(frozen)} were frozen "
            f"(requires_grad False) after the module was made. Under "
            f"{type(self._container_strategy).__name__} DDP, which averages the gradients "
            "of the parameters trainable when it wraps a module, waits for theirs and "
            "fails at the next step: freeze them in the module's factory, or, to keep "
            "them from training for some steps only, leave them trainable and set their "
            ".grad to None before the optimizer's step in a callable train_op")

    def _broadcast(self, tensors: List[torch.Tensor]) -> None:
        """Rank 0's values into `tensors` on every replica: one broadcast per
        dtype (a flat copy of them), so integer buffers stay exact."""
        groups = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t.data)
        for group in groups.values():
            flat = torch._utils._flatten_dense_tensors(group)
            dist.broadcast(flat, 0)
            for t, r in zip(group, torch._utils._unflatten_dense_tensors(flat, group)):
                t.copy_(r)

    def _before_forward(self, module, args):
        self._await_agreement()
        if torch.is_grad_enabled():   # (DDP prepares to average the next backward)
            self._armed.update(module._param_ids)

    def create_optimizer(self, name: str, factory, params):
        optimizer = super().create_optimizer(name, factory, params)
        self._synchronized.add(optimizer)
        if self._group is not None:
            self._hook_user_steps(optimizer)
            if not self._ops._reduce_to_one:
                optimizer.register_step_pre_hook(
                    lambda opt, args, kwargs: self.average_gradients_set_by_hand(opt))
            optimizer.register_step_pre_hook(self._check_called_in_user_step)
            frozen = [p for group in optimizer.param_groups for p in group["params"]
                      if id(p) in self._frozen_at_wrap]
            if frozen:   # (one check a step, only for such an optimizer)
                optimizer.register_step_pre_hook(
                    lambda opt, args, kwargs: self._refuse_unaveraged(name, frozen))
        return optimizer

    def _refuse_unaveraged(self, name: str, frozen: list) -> None:
        """A parameter frozen when its module was made and trained now
        (unfrozen later: gradual unfreezing) would step on this replica's
        gradient alone, and the replicas' weights drift apart."""
        trained = [self._frozen_at_wrap[id(p)] for p in frozen if p.grad is not None]
        if trained:
            raise ValueError(
                f"get_optimizer(name={name!r}): {', '.join(trained)} has a gradient, but was "
                f"frozen (requires_grad False) when its module was made: under "
                f"{type(self._container_strategy).__name__} (DDP, which averages the "
                "gradients of the parameters trainable when it wraps a module) the replicas' "
                "gradients of it are not averaged. Leave it trainable in the module's "
                "factory, and keep it from training until then in a callable train_op "
                "(its .grad set to None before the optimizer's step)")

    @property
    def reduces_in_optimizer_step(self) -> bool:
        return self._group is not None and self._ops._reduce_to_one

    def _hook_user_steps(self, optimizer) -> None:
        """Make `optimizer`'s steps in user code reduce as `apply_gradients`
        does: under ReductionToOneDevice (no DDP: see _wrap) before the step."""
        if self._ops._reduce_to_one:
            optimizer.register_step_pre_hook(self._reduce_in_user_step)

    def begin_user_step(self) -> None:
        """A callable train_op or a custom loop's step starts: note from now
        which parameters' gradients a backward accumulates (DDP averages
        those), once per parameter."""
        self._track_accumulation()
        self._accumulated.clear()
        self._averaged.clear()

    def _track_accumulation(self) -> None:
        for p in self._ddp_params[self._tracked_upto:]:   # (those wrapped since: per step)
            if id(p) not in self._tracked:
                self._tracked.add(id(p))
                p.register_post_accumulate_grad_hook(self._note_accumulated)
        self._tracked_upto = len(self._ddp_params)

    def _note_accumulated(self, param: torch.Tensor) -> None:
        """A backward accumulated `param`'s gradient: DDP averaged it where
        it is the first backward since its module's forward; a later one
        (`retain_graph=True`: a GAN's generator loss through the graph the
        discriminator's loss went back through) added this replica's own."""
        if id(param) in self._armed:
            self._armed.discard(id(param))
            self._accumulated.add(id(param))
        else:
            self._accumulated.discard(id(param))
        self._averaged.pop(id(param), None)

    def _set_by_hand(self, p: torch.Tensor) -> bool:
        """Whether `p`'s gradient may differ between the replicas: one DDP
        averaged (a backward accumulated it this user step) or this engine
        averaged (the same tensor, unchanged since) does not."""
        if p.grad is None or id(p) not in self._tracked:
            return False
        averaged = self._averaged.get(id(p))
        if averaged is not None:
            return averaged != (id(p.grad), p.grad._version)
        return id(p) not in self._accumulated

    def _refuse_half_reduced(self, optimizer) -> None:
        """An optimizer step on parameters of a DDP module whose last backward
        reached only part of it (one head of a module, its optimizer stepping
        before the other head's backward): DDP averages a module's gradients
        once all of them arrive, so these are still each replica's own, and
        averaging them here would race DDP's own reduction. Refused."""
        armed = self._armed
        if not armed:
            return
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]
                   if p.grad is not None and id(p) not in armed}
        for name, keys in self._wrapped:
            if stepped.isdisjoint(keys):
                continue
            waiting = [k for i, k in keys.items() if i in armed]
            if waiting:
                raise ValueError(
                    f"module {name!r}: an optimizer steps its parameters after a backward that "
                    f"reached only part of the module ({', '.join(waiting[:4])}"
                    f"{' ...' if len(waiting) > 4 else ''} wait for theirs). Under "
                    f"{type(self._container_strategy).__name__}, DDP averages a module's "
                    "gradients once all of them arrive, so these are still this replica's "
                    "own: make each head a module of its own (est.get_module), or run every "
                    "backward of the module before its optimizers step; a part no loss of "
                    "the training step reaches (a head for EVAL or PREDICT alone, a part "
                    "under torch.no_grad) belongs in a module of its own too")

    def average_gradients_set_by_hand(self, optimizer) -> None:
        """Before an optimizer step in user code (and before a loss scaler's
        unscale, so every replica finds the same infs): the gradients of
        wrapped parameters that no backward of the user step made (set by
        hand from `torch.autograd.grad`, as a TF1 GAN's two `minimize` calls
        port), or set anew since they were averaged (a second step of the
        optimizer), averaged over the replicas, dense and sparse alike, as
        TF's `apply_gradients` in a replica context averages whatever
        gradients it is given (DDP, which averages in backward, never saw
        them: each replica stepped on its own). A gradient a backward made
        and user code then changed in place (`p.grad += ...`) is taken as
        DDP averaged it."""
        if not self._user_step or self._group is None or self._ops._reduce_to_one:
            return
        self._refuse_half_reduced(optimizer)
        by_hand = [p for group in optimizer.param_groups for p in group["params"]
                   if self._set_by_hand(p)]
        if not by_hand:
            return
        try:
            for dtype in dict.fromkeys(p.dtype for p in by_hand):
                params = [p for p in by_hand if p.dtype == dtype]
                local = _gradient_kinds(params)
                flat = _flat_gradients(params)
                dist.all_reduce(flat)
                flat.div_(self._group.world_size)
                _set_gradients(params, flat, local)
        except RuntimeError as e:
            raise self._explain(e, "averaging gradients set by hand") from e
        self._averaged.update((id(p), (id(p.grad), p.grad._version)) for p in by_hand
                              if p.grad is not None)

    def _reduce_in_user_step(self, optimizer, args, kwargs) -> None:
        """Before an optimizer step of user code (a callable train_op,
        `strategy.run`), its gradients reduced as `apply_gradients` reduces
        them (DDP's all-reduce in backward does it for the other strategies;
        TF2's `apply_gradients` in a replica context does it in TF)."""
        if self._user_step:
            self._reduce_gradients_to_one(optimizer)

    # -- the step ----------------------------------------------------------------------
    def apply_gradients(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer):
        if self._group is None:
            return super().apply_gradients(loss, optimizer)
        self._start_step(loss)
        free_gradients(optimizer)
        try:
            loss.backward()
            if self._check_due:   # the first step of a training, or of a module's use
                self._check_used()
            if self._ops._reduce_to_one:
                self._reduce_gradients_to_one(optimizer)
            self._finish_step()
        except RuntimeError as e:
            raise self._explain(e, "the gradient all-reduce") from e
        optimizer.step()

    def run_train_op(self, train_op: Callable, loss: Optional[torch.Tensor] = None) -> None:
        if self._group is None:
            return train_op()
        self._start_step(loss)   # (logged as the mean over replicas, as an optimizer's)
        _watch_user_optimizers(self)
        try:
            # The agreement before the train_op, which makes the step's update;
            # the moving buffers' mean after it: its backward needs them as
            # the forward pass left them.
            moved_late = self._finish_step(buffers=False)
            self._called_due = self._check_due   # (the rest: DDP's own error stands)
            self._first_used, self._check_due = [], False
            self._user_step = True
            self.begin_user_step()
            try:
                train_op()
            finally:
                self._user_step = self._called_due = False
            self._moving_buffers.finish(self._group, step_made=True, moved_late=moved_late)
        except RuntimeError as e:
            raise self._explain(e, "the train_op") from e

    def _reduce_gradients_to_one(self, optimizer) -> None:
        """ReductionToOneDevice: sum onto one replica, average, broadcast back."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        local = _gradient_kinds(params)
        flat = _flat_gradients(params)
        dst = self._reduce_rank()
        dist.reduce(flat, dst)
        flat.div_(self._group.world_size)
        dist.broadcast(flat, dst)
        _set_gradients(params, flat, local)

    def _reduce_rank(self) -> int:
        device = getattr(self._ops, "reduce_to_device", None)
        if device is None:
            return 0
        target = device_util.canonicalize(device)
        for i, d in enumerate(self._topology.devices):
            if d == target:
                return i
        raise ValueError(f"ReductionToOneDevice(reduce_to_device={device!r}) is not one of "
                         f"the strategy's devices {self.worker_devices}")

    # -- agreeing, once per step -----------------------------------------------------------
    # A training step of the Estimator agrees with the other replicas in one
    # small all-reduce, started after the forward pass and awaited after the
    # backward pass (so it rides along with the gradient all-reduce): the sum
    # of [loss, "a hook of mine asked to stop after the last step", "I have no
    # batch after this one"]. A stop asked by a hook is carried by the next
    # step, which then makes no update on any replica (its forward and
    # backward are wasted, once per training; the batch-norm statistics its
    # forward moved are put back); a replica whose input runs out
    # says so one step ahead, and every replica stops after that step. On
    # GPUs the loss is summed on the device in an all-reduce of its own.
    def _start_step(self, loss: Optional[torch.Tensor]) -> None:
        self._await_agreement()   # a custom loop's vote, still pending
        scope = self.current_scope
        modules = getattr(scope, "raw_modules", {})
        if (scope, len(modules)) != self._tables_of:   # (a new training, or a new module:
            self._tables_of = (scope, len(modules))    # their feature-column tables)
            self._tables = lookups.tables(modules.values())
            self._step_flags = torch.zeros(5 + len(self._tables), dtype=torch.float64)
        flags = self._step_flags
        if self._tables:   # the rows every replica read, for the optimizers' sparse apply
            lookups.agree(self._tables, self._group.main)
            flags[5:] = torch.tensor(lookups.asks(self._tables), dtype=torch.float64)
        flags[1] = 1.0 if self._vote else 0.0
        flags[2] = 1.0 if self._train_input is not None and self._train_input.exhausted else 0.0
        flags[3] = 1.0 if self._preempt_vote else 0.0
        flags[4] = 1.0 if self._moving_buffers.moved_late() else 0.0
        self._step_loss = loss
        if loss is not None and self._device.type == "cpu":
            flags[0].copy_(loss.detach())
        else:
            flags[0] = 0.0
            if loss is not None:
                self._start_loss_sum(loss)
        self._step_work = self._group.start_sum(flags) if self._device.type == "cpu" \
            else self._group.control.allreduce([flags], _SUM_OPTIONS)
        self._moving_buffers.start(self._group)

    def _finish_step(self, buffers: bool = True) -> bool:
        """The step's agreement: raises _StopAgreed when a replica asked to stop
        after the last step (this step makes no update). `buffers=False`: the
        moving buffers are left for the caller to finish after the backward
        pass (batch norm saved them for it); returns their `moved_late`."""
        work, self._step_work = self._step_work, None
        work.wait()
        flags = self._step_flags
        if self._tables:   # (whether any replica's optimizer asked for their rows)
            lookups.asked(self._tables, flags[5:].tolist())
        stop = bool(flags[1].item())
        moved_late = bool(flags[4].item())
        if buffers or stop:
            self._moving_buffers.finish(self._group, step_made=not stop, moved_late=moved_late)
        if flags[3].item():
            self.preempted = True   # some replica got SIGTERM/SIGINT
        if stop:
            self._vote = self._preempt_vote = False
            if self._pending_loss is not None:   # this step's loss: not one to log
                self._pending_loss.wait()
                self._pending_loss = None
            raise _StopAgreed()
        ran_out = int(flags[2].item())   # (the replicas with no batch for the next step)
        self._stop_after = bool(ran_out)
        # this replica's input has batches the others' stop leaves (said unless it stops anyway)
        self._left_untrained = ran_out if ran_out and self._train_input is not None and \
            not self._train_input.exhausted else 0
        self._step_agreed = True
        if self._step_loss is not None:
            self._loss_src, self._loss_mean = self._step_loss, None
            self._loss_total = flags[0].item()   # (0 on GPUs: the loss is summed there)
        return moved_late

    def _start_loss_sum(self, loss: torch.Tensor) -> None:
        """Sum the loss on its device (GPUs), awaited only if a hook fetches it
        (a device-side wait: no host sync)."""
        src = loss.detach()
        if self._pending_loss is not None:
            self._settle_loss()   # the last step's mean, before its buffer is reused
        buf = self._loss_sum
        if buf is None or buf.dtype != src.dtype or buf.device != src.device \
                or buf.shape != src.shape:
            buf = self._loss_sum = torch.empty_like(src)
        buf.copy_(src)
        self._pending_loss = self._group.start_sum(buf)

    def _settle_loss(self) -> None:
        work, self._pending_loss = self._pending_loss, None
        try:
            work.wait()
        except RuntimeError as e:
            raise self._explain(e, "the loss all-reduce") from e
        if self._loss_src is not None and self._loss_mean is None:
            self._loss_mean = self._loss_sum / self._group.world_size

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        if loss is not self._loss_src or self._group is None:
            return loss
        if self._loss_mean is None:
            if self._pending_loss is not None:
                self._settle_loss()
            else:
                self._loss_mean = (torch.tensor(self._loss_total, dtype=loss.dtype)
                                   / self._group.world_size)
        return self._loss_mean

    def stop_before_first_step(self) -> bool:
        if self._group is None:
            return True
        self._vote = True   # (carried by the first step, as a hook's stop: no update)
        return False

    def all_agree_to_stop(self, stop: bool, preempted: bool = False) -> bool:
        """Called after every training step: True when this replica stops now,
        and then every replica does at the same global step."""
        if self._group is None:
            return stop
        if self._step_agreed:   # the Estimator's step: agreed during its backward pass
            self._step_agreed = False
            if self._stop_after:
                if self._left_untrained and not stop:   # (not max_steps, a hook's stop)
                    logger.warning(
                        "Replica %d stops with batches of its input left, not trained: the "
                        "input of %d replica(s) ran out, and every step takes a batch from "
                        "each. Give the replicas the same number of batches, or repeat the "
                        "input and set max_steps", self._rank(), self._left_untrained)
                return True
            self._vote, self._preempt_vote = bool(stop), bool(preempted)
            return False
        # A custom loop: this replica's vote goes into an all-reduce awaited at
        # the next step's first collective (a DDP forward), where a replica that
        # continues learns that another stopped, and stops too.
        if self._pending_stop is not None:   # no collective since the last vote
            try:
                self._await_agreement()
            except _StopAgreed:
                return True
        local = bool(stop) or (self._train_input is not None and self._train_input.exhausted)
        self._stop_flag.fill_(1.0 if local else 0.0)
        self._pending_stop = self._group.start_max(self._stop_flag)
        if local:   # complete the vote before leaving: the others are waiting for it
            try:
                self._drain()
            except RuntimeError as e:
                raise self._explain(e, "the stop agreement") from e
        return local

    def _await_agreement(self) -> None:
        work = self._pending_stop
        if work is None:
            return
        self._pending_stop = None
        try:
            work.wait()
        except RuntimeError as e:
            raise self._explain(e, "the stop agreement") from e
        if self._stop_flag.item():
            raise _StopAgreed()

    def _drain(self) -> None:
        """Finish the last collectives of a training before new ones."""
        if self._pending_loss is not None:
            self._settle_loss()
        for work in (self._pending_stop, self._step_work):
            if work is not None:
                work.wait()
        self._pending_stop = self._step_work = None
        self._moving_buffers.finish(self._group, step_made=False)
        self._vote = self._preempt_vote = self._stop_after = self._step_agreed = False

    def report_failure(self, error: BaseException) -> None:
        if self._group is not None:
            self._group.report_failure(error)

    def end_training(self) -> None:
        """Every replica returns from training once all have closed their
        session, so the chief's final checkpoint exists when they go on."""
        if self._group is None:
            return
        self._training = False
        try:
            self._drain()
            dist.barrier(group=self._group.control)
        except RuntimeError as e:
            raise self._explain(e, "the end of training") from e

    def _gather(self, values: List[float]) -> List[List[float]]:
        """Every replica's `values` (float64; a blocking all-gather on the
        control group)."""
        mine = torch.tensor(values, dtype=torch.float64)
        out = [torch.zeros_like(mine) for _ in range(self._group.world_size)]
        try:
            dist.all_gather(out, mine, group=self._group.control)
        except RuntimeError as e:
            raise self._explain(e, "checking the input of every replica") from e
        return [t.tolist() for t in out]

    def _share(self, obj) -> list:
        """Every replica's `obj` (picklable; an all-gather on the control group)."""
        out = [None] * self._group.world_size
        try:
            dist.all_gather_object(out, obj, group=self._group.control)
        except RuntimeError as e:
            raise self._explain(e, "checking the input of every replica") from e
        return out

    def _flags(self, flag: bool) -> List[bool]:
        """Every replica's `flag`."""
        return [bool(values[0]) for values in self._gather([1.0 if flag else 0.0])]

    def _all_have(self, flag: bool) -> bool:
        return all(self._flags(flag))

    def _first_batches(self, batch, reader: str = "an input_fn that takes input_context") -> bool:
        """`_all_have` for the first training batch (None: none) of an
        input_fn that takes the input_context (or a custom loop's
        dataset_fn), warning (rank 0) when every replica's is the same: it
        reads everything on every replica, where TF's one-machine
        MirroredStrategy splits its batches among them."""
        have = batch is not None
        gathered = self._gather([1.0 if have else 0.0,
                                 float(input_lib.batch_digest(batch)) if have else 0.0])
        if all(h for h, _ in gathered) and len({d for _, d in gathered}) == 1 \
                and self._group.rank == 0:
            n = len(gathered)
            logger.warning(
                "The first training batch is the same on all %d replicas: %s but reads the "
                "whole input on every replica trains %d copies of each batch a step (TF's "
                "one-machine MirroredStrategy would split the input's batches among the "
                "replicas). Read only input_context.input_pipeline_id's part (e.g. one batch or "
                "record in %d: DataLoader's DistributedSampler, est.data datasets' "
                "input_context=, a dataset's .shard()), or leave input_context out of an "
                "input_fn and the strategy keeps one batch in %d", n, reader, n, n, n)
        return all(h for h, _ in gathered)

    def _agree_on_randomness(self) -> int:
        """A seed drawn on rank 0 (shuffling, epochs, the random streams);
        every replica also takes rank 0's torch state, so the input's first
        batch is drawn alike everywhere (`_random_streams`)."""
        # (drawn on every replica, rank 0's kept: Python's generator stays alike)
        seed = torch.tensor([random.randrange(2 ** 31)])
        state = torch.get_rng_state()
        try:
            dist.broadcast(seed, 0, group=self._group.control)
            dist.broadcast(state, 0, group=self._group.control)
        except RuntimeError as e:
            raise self._explain(e, "agreeing on the random seeds") from e
        torch.set_rng_state(state)
        return int(seed.item())

    # -- input and metrics -----------------------------------------------------------------
    def _input_context(self) -> InputContext:
        if self._group is None:
            return InputContext(1, 0, 1)
        n = self._group.world_size
        return InputContext(n, self._group.rank, n)

    def distribute_input(self, call_input_fn: Callable, input_fn: Callable, mode: str,
                         read: Callable = iter):
        """`read` of the shard, on the step's thread inside the replicas'
        agreements on the input (a read-ahead thread is not a step ahead)."""
        self._eval_input = None
        if self._group is None or mode == _PREDICT or self._training:
            # alone; or an evaluation inside training (a saving listener on the
            # chief), while the other replicas wait in training: unsharded, here
            return read(call_input_fn(InputContext(1, 0, 1)))
        self._drain()
        context = self._input_context()
        seed = self._agree_on_randomness()
        dataset = call_input_fn(context)
        shards_itself = input_lib.takes_input_context(input_fn)
        if shards_itself:
            input_lib.set_epoch(dataset, seed)
        else:
            dataset = input_lib.shard(dataset, context.num_input_pipelines,
                                      context.input_pipeline_id, seed, by_batch=mode == _EVAL)
        stream = InputStream(seed, self._group.rank, not input_lib.ordered_by_sampler(dataset))
        dataset = read(stream.iterate(dataset, input_lib._iterate))
        if mode == _TRAIN:
            self._training = True
            self._moving_buffers = MovingBuffers()   # this training's modules, created next
            self._first_used, self._not_called, self._check_due = [], {}, True
            self.preempted = False
            self._train_input = input_lib.TrainBatches(
                dataset, self._all_have, self._first_batches if shards_itself else None)
            return self._train_input
        self._eval_input = input_lib.EvalBatches(dataset, self._flags, self._topology.describe,
                                                 self._share, self.to_device)
        return self._eval_input

    @property
    def evaluates_nothing(self) -> bool:
        """Whether this replica's shard of the evaluation in progress had no
        batch: its model_fn ran on an empty one, for the metrics alone."""
        return self._eval_input is not None and self._eval_input.placeholder

    def reduce_metrics(self, metrics) -> None:
        """Sum every metric's state (all float64 sums) over the replicas, in one
        all-reduce."""
        if self._group is None or self._training:
            return
        self._agree_on_evaluation_collective(_AT_END)
        if not metrics:
            return
        buffers = [b for m in metrics for b in m.buffers()]
        if not buffers:
            return
        flat = torch._utils._flatten_dense_tensors(buffers)
        try:
            dist.all_reduce(flat)
        except RuntimeError as e:
            raise self._explain(e, "the metric all-reduce") from e
        for b, r in zip(buffers, torch._utils._unflatten_dense_tensors(flat, buffers)):
            b.copy_(r)

    def _model_fn_collective(self, mode: str) -> bool:
        """Training steps the replicas together, so a model_fn's collective
        pairs up. An evaluation inside training (the chief's, alone) keeps it
        to itself. A sharded evaluation runs each replica through its own
        shard with no agreement per step: the replicas first agree that each
        is at a collective, not past the end of its shard (one flag each)."""
        if self._group is None or mode == _TRAIN:
            return True
        if self._model_fn_alone(mode):
            return False
        self._agree_on_evaluation_collective(_AT_COLLECTIVE)
        return True

    def _model_fn_alone(self, mode: str) -> bool:
        """Whether a model_fn called in `mode` runs on this replica alone: the
        chief's evaluation inside training; a prediction (in the caller's
        process, as TF's Estimator predicts without the strategy)."""
        return mode == _PREDICT or (self._group is not None and mode != _TRAIN
                                    and self._training)

    def _agree_on_evaluation_collective(self, kind: float) -> None:
        """In a sharded evaluation, before the model_fn's collectives and the
        metric all-reduce at the end: every replica must be at the same kind,
        or each raises naming which replicas finished their shard."""
        mine = torch.tensor([kind])
        every = [torch.zeros(1) for _ in range(self._group.world_size)]
        try:
            dist.all_gather(every, mine, group=self._group.control)
        except RuntimeError as e:
            raise self._explain(e, "agreeing on a collective of the evaluation") from e
        kinds = [t.item() for t in every]
        if len(set(kinds)) > 1:
            done = ", ".join(self._topology.describe(r) for r, k in enumerate(kinds)
                             if k == _AT_END)
            raise RuntimeError(
                f"An all_reduce or all_gather in model_fn during evaluation was reached after "
                f"{done} had evaluated all of its shard: the replicas evaluate their own "
                f"shards, each example once, so a collective of the model_fn pairs up only "
                f"while every replica has batches left. Give each replica as many batches "
                f"(a multiple of {len(kinds)}), or compute the value as an eval metric")

    def _reduce_across(self, reduce_op: ReduceOp, value, check_shape: bool = True,
                       differentiable: bool = False):
        """`value` combined over the replicas, elementwise; a non-scalar's
        shapes are compared first (`check_shape`), since replicas giving
        different shapes to one all-reduce would wait on each other forever.
        `differentiable` (a replica context's all_reduce): a value with a
        gradient keeps one, the replicas' gradients all-reduced (TF's)."""
        if self._group is None:
            return value
        grad = differentiable and isinstance(value, torch.Tensor) and value.requires_grad
        tensor = value if grad else value.detach().clone() if isinstance(value, torch.Tensor) \
            else torch.tensor(value, device=self._device)
        try:
            if check_shape and tensor.dim():
                shapes = self._shapes(tensor, "strategy.reduce")
                if len(set(shapes)) > 1:
                    raise ValueError(
                        f"strategy.reduce: the replicas' values have different shapes "
                        f"{shapes} (by replica): give `axis` (the batch dimension) to reduce "
                        f"each replica's value along it first, or concatenate them with "
                        f"strategy.gather")
            if grad:
                from torch.distributed.nn.functional import all_reduce   # (0.8 s to import)
                tensor = all_reduce(tensor)
            else:
                dist.all_reduce(tensor)
        except RuntimeError as e:
            raise self._explain(e, "strategy.reduce") from e
        if reduce_op == ReduceOp.MEAN:
            tensor = tensor / self._group.world_size
        return tensor

    def _gather_across(self, value: torch.Tensor, axis: int) -> torch.Tensor:
        """The replicas' `value`s concatenated along `axis`: each padded to the
        longest along it, all-gathered, trimmed (no gradient flows back)."""
        value = _checked_axis(value, axis)
        if self._group is None:
            return value
        axis %= value.dim()
        try:
            shapes = self._shapes(value, "strategy.gather")
            if len({s[:axis] + s[axis + 1:] for s in shapes}) > 1:
                raise ValueError(f"strategy.gather: the replicas' values differ in shape other "
                                 f"than along axis {axis}: {shapes} (by replica)")
            value = value.detach()
            longest = max(s[axis] for s in shapes)
            if value.shape[axis] < longest:
                pad = list(value.shape)
                pad[axis] = longest - value.shape[axis]
                value = torch.cat([value, value.new_zeros(pad)], axis)
            parts = [torch.empty_like(value) for _ in shapes]
            dist.all_gather(parts, value.contiguous())
        except RuntimeError as e:
            raise self._explain(e, "strategy.gather") from e
        return torch.cat([part.narrow(axis, 0, s[axis]) for part, s in zip(parts, shapes)],
                         axis)

    def _shapes(self, tensor: torch.Tensor, what: str) -> list:
        """Every replica's shape of `tensor`, by replica (one small all-gather)."""
        if tensor.dim() > _MAX_DIMS:
            raise ValueError(f"{what}: a value of more than {_MAX_DIMS} dimensions: "
                             f"{list(tensor.shape)}")
        mine = torch.full((_MAX_DIMS + 1,), -1, dtype=torch.int64)
        mine[0] = tensor.dim()
        mine[1:tensor.dim() + 1] = torch.tensor(tensor.shape, dtype=torch.int64)
        mine = mine.to(self._device)
        every = [torch.empty_like(mine) for _ in range(self._group.world_size)]
        dist.all_gather(every, mine)
        return [tuple(t[1:int(t[0]) + 1].tolist()) for t in (t.cpu() for t in every)]


# A custom loop's module made under strategy.scope() is not mirrored here (each
# replica is a process; TF mirrors its variables): the first optimizer step of
# user code with an optimizer get_optimizer did not make says so, once a process.
_watched = None      # weakref to the extended whose user steps are watched
_watch_hook = None   # the global optimizer step pre-hook
_unwrapped_said = False


def _watch_user_optimizers(extended: _CollectiveExtended) -> None:
    global _watched, _watch_hook
    if extended._group is None or extended.uses_parameter_servers:
        return
    _watched = weakref.ref(extended)
    if _watch_hook is None:
        _watch_hook = register_optimizer_step_pre_hook(_say_unwrapped)


def _say_unwrapped(optimizer, args, kwargs) -> None:
    global _unwrapped_said
    extended = _watched() if _watched is not None else None
    if _unwrapped_said or extended is None or not extended._user_step \
            or extended._group is None or optimizer in extended._synchronized:
        return
    _unwrapped_said = True
    logger.warning(
        "User code (strategy.run, a callable train_op) steps a %s that est.get_optimizer "
        "did not make: its gradients are "
        "averaged over the replicas only where its module's are (est.get_module, or your own "
        "DistributedDataParallel). Each replica is a process here, so a module made under "
        "strategy.scope() is not mirrored as TF's variables are: each replica would train it "
        "on its own gradients (see examples/custom_loop_mirrored.py). An optimizer meant to "
        "be per replica (an adversarial perturbation's) is fine. (Said once.)",
        type(optimizer).__name__)


class _CollectiveStrategy(Strategy):
    """The Strategy API over a `_CollectiveExtended`: one replica per process."""

    @property
    def num_replicas_in_sync(self) -> int:
        return self._extended._num_replicas

    def run(self, fn: Callable, args=(), kwargs=None, options=None):
        """`fn(*args, **kwargs)` in this replica's context; `options` (TF's
        RunOptions, for TPUs) is accepted and unused."""
        extended = self._extended
        if extended._group is None and extended._num_replicas > 1:
            raise RuntimeError(
                f"{type(self).__name__} runs each of its {extended._num_replicas} replicas in "
                "its own process: call strategy.run inside the function you give to "
                "strategy.extended.call_for_each_replica(fn), or train with the Estimator")
        _watch_user_optimizers(extended)
        with self.scope():
            _stack().append(ReplicaContext(self, extended._replica_id()))
            user_step, extended._user_step = extended._user_step, extended._group is not None
            if extended._user_step and not user_step:
                extended.begin_user_step()
            try:
                return fn(*args, **(kwargs or {}))
            finally:
                extended._user_step = user_step
                _stack().pop()

    def _reduce_across(self, reduce_op, value, check_shape: bool = True,
                       differentiable: bool = False):
        return self._extended._reduce_across(reduce_op, value, check_shape, differentiable)

    def _gather_across(self, value, axis):
        return self._extended._gather_across(value, axis)

    def experimental_distribute_dataset(self, dataset, options=None):
        """The global batches of `dataset`, each split along its first
        dimension across the replicas (TF2); this replica's part, on its device."""
        extended = self._extended
        if extended._group is None:
            return super().experimental_distribute_dataset(dataset, options)
        move = self._input_mover(options, "experimental_distribute_dataset", False)
        seed = extended._agree_on_randomness()
        return input_lib.SplitBatches(dataset, extended._group.world_size,
                                      extended._group.rank, move,
                                      InputStream(seed, extended._group.rank))

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        """`dataset_fn(input_context)` on each replica; iteration goes on
        while any replica's dataset has batches (those that ran out get
        empty ones, as TF's partial batches)."""
        extended = self._extended
        if extended._group is None:
            return super().distribute_datasets_from_function(dataset_fn, options)
        move = self._input_mover(options, "distribute_datasets_from_function")
        seed = extended._agree_on_randomness()
        dataset = dataset_fn(extended._input_context())
        return input_lib.AgreedBatches(dataset, extended._gather, move,
                                       InputStream(seed, extended._group.rank,
                                                   not input_lib.ordered_by_sampler(dataset)),
                                       lambda batch: extended._first_batches(
                                           batch, "a dataset_fn given input_context"))

    def __repr__(self):
        return f"{type(self).__name__}(devices={list(self._extended.worker_devices)})"


def _gradient_kinds(params: List[torch.Tensor]) -> List[int]:
    """Per parameter, its gradient here: 0 none, 1 dense, 2 sparse."""
    return [0 if p.grad is None else 2 if p.grad.is_sparse else 1 for p in params]


def _rows(p: torch.Tensor) -> int:
    return p.shape[0] if p.dim() else 1


def _flat_gradients(params: List[torch.Tensor]) -> torch.Tensor:
    """`params`' gradients (zeros where a parameter has none) in one flat
    tensor for a reduction over the replicas, followed by a flag per row of
    each parameter, 1 where a sparse gradient (`nn.Embedding(sparse=True)`)
    has the row, then two flags per parameter: 1 where it has a gradient, 1
    where that is sparse. After the sum a parameter no replica's loss reached
    is known, and keeps no gradient, as in one process (an optimizer skips
    it: no weight decay, no momentum moves it); a sparse one is made sparse
    again over the rows any replica had (TF's IndexedSlices, reduced)."""
    kinds = _gradient_kinds(params)
    dtype, device = params[0].dtype, params[0].device
    grads = [p.grad if kind == 1 else torch.zeros_like(p) if kind == 0
             else p.grad.to_dense() for p, kind in zip(params, kinds)]
    rows = torch.zeros(sum(_rows(p) for p in params), dtype=dtype, device=device)
    if 2 in kinds:
        offset = 0
        for p, kind in zip(params, kinds):
            if kind == 2:
                rows[offset + p.grad.coalesce().indices()[0]] = 1.0
            offset += _rows(p)
    flags = torch.tensor([kind > 0 for kind in kinds] + [kind == 2 for kind in kinds],
                         dtype=dtype, device=device)
    return torch._utils._flatten_dense_tensors(grads + [rows, flags])


def _set_gradients(params: List[torch.Tensor], flat: torch.Tensor, local: List[int]) -> None:
    """`flat` (from `_flat_gradients`, reduced) as `params`' gradients, None
    where no replica had one, sparse where they were. `local`: their kinds
    here before (`_gradient_kinds`); only a replica missing one, or with a
    sparse one, reads the flags (a host sync, off the usual path)."""
    n = len(params)
    if all(kind == 1 for kind in local):
        reached, sparse = [True] * n, [False] * n
    else:
        flags = flat[-2 * n:].tolist()
        reached, sparse = [f > 0 for f in flags[:n]], [f > 0 for f in flags[n:]]
    offset, row = 0, sum(p.numel() for p in params)
    for p, has, is_sparse in zip(params, reached, sparse):
        size = p.numel()
        g = flat[offset:offset + size].view_as(p).to(p.device, p.dtype) if has else None
        if is_sparse:
            ids = flat[row:row + _rows(p)].nonzero().squeeze(1).to(p.device)
            g = torch.sparse_coo_tensor(ids.unsqueeze(0), g.index_select(0, ids), p.shape,
                                        check_invariants=False, is_coalesced=True)
        p.grad = g
        offset += size
        row += _rows(p)
