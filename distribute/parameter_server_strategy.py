"""ParameterServerStrategy: asynchronous training with parameter servers
(TF1's tf.compat.v1.distribute.experimental.ParameterServerStrategy, the
between-graph Estimator with `replica_device_setter`).

In a cluster (TF_CONFIG with `ps` tasks):

- **placement**: every parameter and buffer a model_fn creates through
  `est.get_module` lives on a ps task: round-robin over the ps tasks in
  creation order (TF's `replica_device_setter`), or `placement="by_size"`,
  on the least loaded ps (TF's `GreedyLoadBalancingStrategy`). A
  `variable_partitioner` (see `distribute.partitioners`) cuts large
  parameters into row slices placed like separate variables.
  `extended.parameter_placement` says where each lives.
- **the chief** places the parameters and puts their initial values (fresh,
  restored from model_dir, or warm-started) and the optimizer state on the
  ps tasks before any worker starts; workers wait for it (at most
  `init_timeout_secs`, then a clear error). A chief restarted while the ps
  tasks live takes their values, as TF's chief did.
- **each step** a trainer (chief or worker) computes its gradients locally on
  its own batch, takes the next global step from ps 0 (the step counts every
  trainer's steps; none is handed out past `max_steps`, so every trainer
  stops there and the last step is exactly `max_steps`), pushes the gradients
  (and its buffers' changes, TF's moving-average `assign_sub`) to the ps
  tasks holding them in one RPC per ps, in parallel, and gets back the
  values that changed since its last step. The ps tasks apply each push as
  it arrives with the trainers' optimizer (its class and hyperparameters;
  learning-rate changes are forwarded), so the optimizer's slots live there.
- **checkpoints** (chief): the modules' and optimizers' `state_dict()` gather
  the values and slots from the ps tasks into the usual format, so a
  checkpoint restores into any other strategy, and vice versa. Only the
  chief writes checkpoints and summaries.
- **faults**: a worker that dies and is restarted rejoins (a new RPC rank)
  and goes on from the ps tasks' current values; a ps that dies or does not
  answer within `timeout_secs` fails every trainer with an error naming it
  (restart the job: it resumes from the last checkpoint).

The transport is `torch.distributed.rpc` (TensorPipe); see `_ps_rpc` (the
protocol), `ps_client` (its verbs) and `ps_placement`. The worker-side
module is a plain `nn.Module` on the trainer's device (its first GPU, else
the CPU; run one worker task per GPU to use more) whose parameters
are local copies refreshed at each step. Evaluation and prediction use the
checkpoint, on the local device, as in TF. There is no synchronous mode
(TF's SyncReplicasOptimizer). A sparse gradient is pushed as its rows, a
table whose lookups note their rows (`lookups`) as its dense gradient with
the mask of the rows read: the ps's optimizer applies both as TF's sparse
apply.

No cluster: TF's local case, variables on the CPU and compute on the local
devices (every GPU, else the CPU), synchronous: CentralStorageStrategy's
behaviour. Optimizers must be elementwise (SGD, Adam, Adagrad, RMSprop, ...)
for partitioned parameters.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import logging
import time
import types
from typing import Callable, Dict, List, Optional

import torch

from . import _ps_rpc, input_lib, lookups
from . import cluster_resolver as cr
from .central_storage_strategy import _CentralStorageExtended
from .collective_engine import _CollectiveStrategy, _local_devices, _MadeAtFirstCall, _Topology
from . import ps_client, ps_placement
from .partitioners import num_partitions
from .strategy import InputContext, StrategyExtended, free_gradients
from .variable_names import var_name

logger = logging.getLogger(__name__)

_TRAIN = "train"
_PLACEMENTS = ("round_robin", "by_size")
_DRAIN_SECS = 10.0    # how long a checkpoint waits for the steps in flight
_POLL_SECS = 0.2


class _ParameterServerExtended(StrategyExtended):
    """Trainer-side mechanics of ParameterServerStrategy in a cluster
    (TF: ParameterServerStrategyExtended)."""

    uses_parameter_servers = True
    _group = None            # the _CollectiveStrategy surface: no process group here
    _num_replicas = 1

    def __init__(self, strategy, resolver: cr.ClusterResolver, partitioner, placement: str,
                 timeout: float, init_timeout: float):
        devices, _ = _local_devices(None)
        super().__init__(strategy, devices[0])
        spec = resolver.cluster_spec()
        self._spec = spec
        self._task_type, self._task_id = resolver.task_type, resolver.task_id
        if self._task_type is None or self._task_id is None:
            raise ValueError(f"ParameterServerStrategy: the cluster resolver names no task "
                             f"(task_type={self._task_type!r}, task_id={self._task_id!r})")
        self._num_ps = spec.num_tasks("ps")
        self._trainers = _ps_rpc.trainers_of(spec)
        chief_job = "chief" if "chief" in spec.jobs else "master" if "master" in spec.jobs \
            else None
        self._is_chief = (self._task_type == chief_job if chief_job
                          else (self._task_type, self._task_id) == ("worker", 0))
        self._partitioner = partitioner
        self._placer = ps_placement.Placer(self._num_ps, placement)
        self._timeout, self._init_timeout = timeout, init_timeout
        self._client: Optional[ps_client.Client] = None
        self._initializing: Optional[bool] = None    # the chief puts the initial values
        self._placement: Dict[str, tuple] = {}
        self._since = [-1] * self._num_ps
        self._views: List[Dict[int, tuple]] = [{} for _ in range(self._num_ps)]
        self._params: Dict[int, ps_placement.Variable] = {}     # id(parameter) -> its variable
        self._buffers: List[ps_placement.Variable] = []
        self._mutable: Optional[set] = None          # buffers a step changes
        self._modules: Dict[str, List[ps_placement.Variable]] = {}
        self._aliases: Dict[str, Dict[str, str]] = {}   # module -> {tied key: first key}
        self._optimizers: Dict[str, tuple] = {}     # name -> (optimizer, [variables])
        self._sent_hparams: Dict[str, list] = {}
        self._gathered: Optional[dict] = None
        self._scope = None
        self._trained = False
        self._reset_training()
        self.rpc_secs = 0.0       # wall time of the steps' RPCs (tickets, push and pull)
        self.rpc_steps = 0        # global steps this trainer did

    def _reset_training(self) -> None:
        self._limit: Optional[int] = None
        self._ticket: Optional[int] = None
        self._ticket_future = None
        self._done = 0
        self._exhausted = False
        self._buffers_pushed = False
        self.preempted = False

    # -- TF's public surface ---------------------------------------------------------
    @property
    def worker_devices(self):
        kind = "GPU" if self._device.type == "cuda" else "CPU"
        return (f"/job:{self._task_type}/replica:0/task:{self._task_id}/device:{kind}:0",)

    @property
    def parameter_devices(self):
        return tuple(ps_placement.ps_device(i) for i in range(self._num_ps))

    @property
    def parameter_placement(self) -> Dict[str, tuple]:
        """Variable name (`net/0/weight`) -> the ps device of each of its shards."""
        return dict(self._placement)

    @property
    def should_checkpoint(self) -> bool:
        return self._is_chief

    @property
    def should_save_summary(self) -> bool:
        return self._is_chief or self._task_type == "evaluator"

    @property
    def should_init(self) -> bool:
        return self._is_chief

    def in_multi_worker_mode(self) -> bool:
        return True

    def _rank(self) -> int:
        return self._trainer_index()

    def _all_have(self, flag: bool) -> bool:
        return flag

    def _trainer_index(self) -> int:
        task = f"{self._task_type}:{self._task_id}"
        return self._trainers.index(task) if task in self._trainers else 0

    # -- input --------------------------------------------------------------------------
    def _input_context(self) -> InputContext:
        if f"{self._task_type}:{self._task_id}" not in self._trainers:
            return InputContext(1, 0, 1)
        return InputContext(len(self._trainers), self._trainer_index(), 1)

    def distribute_input(self, call_input_fn: Callable, input_fn: Callable, mode: str,
                         read: Callable = iter):
        """Each trainer reads its own pipeline (InputContext(number of
        trainers, its index)); an input_fn that ignores its context is
        sharded for it (TF's AUTO policy). Evaluation reads everything."""
        if mode != _TRAIN:
            return read(call_input_fn(InputContext(1, 0, 1)))
        context = self._input_context()
        dataset = call_input_fn(context)
        if context.num_input_pipelines > 1 and not input_lib.takes_input_context(input_fn):
            dataset = input_lib.shard(dataset, context.num_input_pipelines,
                                      context.input_pipeline_id)
        return read(dataset)

    # -- connecting ------------------------------------------------------------------------
    def _connect(self) -> ps_client.Client:
        if self._client is None:
            client = ps_client.Client(self._spec, self._task_type, self._task_id, self._timeout,
                                    self._init_timeout)
            self._client = client
            atexit.register(self._close)
            client.register()
        return self._client

    def _close(self) -> None:
        """At exit: the chief, if its training finished, ends training (a
        chief that failed does not: restarted, it goes on); every trainer says
        goodbye, so the ps tasks know when to exit."""
        client, self._client = self._client, None
        if client is None:
            return
        if self._is_chief and self._trained:
            try:
                client.end_training()
            except Exception as e:
                logger.warning("%s: could not tell ps 0 that training ended: %s", client.task, e)
        client.close(self._done if self._ticket is None else self._ticket)

    # -- creation -----------------------------------------------------------------------------
    def _training(self) -> bool:
        scope = self.current_scope
        return (f"{self._task_type}:{self._task_id}" in self._trainers and scope is not None
                and scope.mode == _TRAIN and torch.is_grad_enabled())

    def create_module(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        module = module.to(self._device)
        if not self._training():
            return module   # evaluation, prediction: the checkpoint's values, here
        if any(isinstance(p, torch.nn.parameter.UninitializedParameter)
               for p in module.parameters()):   # (LazyLinear: placed once its first call
            scope = self.current_scope          # has made its parameters)
            return _MadeAtFirstCall(functools.partial(self._hold, name), module,
                                    getattr(scope, "records_discarded", contextlib.nullcontext))
        return self._hold(name, module)

    def _hold(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        """`module`'s variables held by the ps tasks: placed there by the
        chief (initializing, or a module new to them), else its values taken
        from there."""
        client = self._connect()
        scope = self.current_scope
        if scope is not self._scope:   # a new Estimator.train / MonitoredSession
            self._scope = scope
            self._trained = False
            self._reset_training()
            self._reset_modules()
        self._gathered = None
        layout = None
        if self._is_chief:
            status = self._client.status()
            if self._initializing is None:
                self._initializing = not status["ready"]
                if not self._initializing:
                    logger.info("%s: the ps tasks already hold the parameters (global step "
                                "%d); taking them, not model_dir's checkpoint (TF's restarted "
                                "chief restores its checkpoint into them)", client.task,
                                status["global_step"])
            if not self._initializing:   # a module the ps tasks hold, or a new one
                layout = self._client.lookup(name)
                scope.global_step = status["global_step"]
        else:
            layout, scope.global_step = self._wait_for_layout(name)
        placed = layout is None
        if placed:
            layout = self._place(name, module)
        self._attach(name, module, layout)
        if not placed:
            self._pull(name)
        return module

    def _reset_modules(self) -> None:
        """Forget the modules of an earlier training call (a new scope builds new ones)."""
        self._views = [{} for _ in range(self._num_ps)]
        self._params, self._buffers, self._mutable = {}, [], None
        self._modules, self._aliases, self._optimizers, self._sent_hparams = {}, {}, {}, {}

    def _place(self, name: str, module: torch.nn.Module) -> list:
        """Decide where each variable of `module` lives, put the values there,
        and publish the layout on ps 0 (the chief: initializing, or a module
        new to the ps tasks)."""
        params = {id(p) for p in module.parameters()}
        seen: Dict[int, str] = {}
        entries = collections.defaultdict(list)   # ps -> [(shard key, value)]
        layout = []
        for key, tensor in module.state_dict(keep_vars=True).items():
            if id(tensor) in seen:   # a tied weight: the same variable under another key
                layout.append((key, "alias", seen[id(tensor)]))
                continue
            seen[id(tensor)] = key
            var = var_name(name, key)
            is_param = id(tensor) in params
            count = num_partitions(self._partitioner, var, tensor.shape, tensor.dtype) \
                if is_param else 1
            slices = [(None, None)] if count == 1 else ps_placement.split_rows(tensor.shape[0], count)
            parts = []
            value = tensor.detach().cpu()
            for i, (start, length) in enumerate(slices):
                piece = value if start is None else value.narrow(0, start, length)
                ps = self._placer.place(piece.numel() * piece.element_size())
                shard = var if count == 1 else f"{var}/part_{i}"
                entries[ps].append((shard, piece.contiguous()))
                parts.append([ps, len(entries[ps]) - 1, start, length])
            layout.append((key, "param" if is_param else "buffer", tuple(tensor.shape),
                           tensor.dtype, parts))
        ids = self._client.create_shards(entries, name)
        for entry in layout:
            if entry[1] != "alias":
                for part in entry[4]:
                    part[1] = ids[part[0]][part[1]]
        self._client.publish(name, layout)
        loads = ", ".join(f"ps {i}: {b / 1024:.1f} KiB" for i, b in enumerate(self._placer.load))
        logger.info("Placed module %r on the ps tasks (%s so far)", name, loads)
        return layout

    def _wait_for_layout(self, name: str):
        """The layout of module `name` once the chief has initialized the ps
        tasks (and the global step), waiting at most `init_timeout_secs`."""
        deadline = time.monotonic() + self._init_timeout
        logged = False
        while True:
            status = self._client.status("waiting for the chief")
            if status["ready"]:
                layout = self._client.lookup(name)
                if layout is not None:
                    return layout, status["global_step"]
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self._client.task}: the chief did not put the parameters of module "
                    f"{name!r} on the ps tasks within {self._init_timeout:g} s. Is the chief "
                    "running, with the same model_fn? (ParameterServerStrategy("
                    "init_timeout_secs=...) sets this wait.)")
            if not logged:
                logger.info("%s: waiting for the chief to initialize the parameters on the "
                            "ps tasks", self._client.task)
                logged = True
            time.sleep(_POLL_SECS)

    def _attach(self, name: str, module: torch.nn.Module, layout: list) -> None:
        """Map `module`'s tensors to their shards; hook its state_dict."""
        local = module.state_dict(keep_vars=True)
        variables, aliases = [], {}
        for entry in layout:
            key = entry[0]
            if key not in local:
                raise ValueError(f"Module {name!r} on {self._client.task} has no {key!r}, which "
                                 "the chief's has: every task must build the same model")
            if entry[1] == "alias":
                aliases[key] = entry[2]
                continue
            _, kind, shape, dtype, parts = entry
            tensor = local[key]
            if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                raise ValueError(
                    f"{var_name(name, key)} has shape {list(tensor.shape)} ({tensor.dtype}) on "
                    f"{self._client.task} but {list(shape)} ({dtype}) on the ps tasks: every "
                    "task must build the same model")
            var = ps_placement.Variable(var_name(name, key), key, tensor, kind == "param",
                            [ps_placement.Part(*p) for p in parts])
            for part in var.parts:
                snap = None if var.snap is None else part.of(var.snap)
                self._views[part.ps][part.id] = (part.of(tensor.detach()), snap)
            if var.is_param:
                self._params[id(tensor)] = var
            else:
                self._buffers.append(var)
            self._placement[var.name] = tuple(ps_placement.ps_device(p.ps) for p in var.parts)
            variables.append(var)
        extra = sorted(set(local) - {entry[0] for entry in layout})
        if extra:
            raise ValueError(f"Module {name!r} on {self._client.task} has {extra}, which the "
                             "chief's has not: every task must build the same model")
        self._modules[name] = variables
        self._aliases[name] = aliases
        self._mutable = None
        module.register_state_dict_post_hook(self._module_state_hook(name))

    def _pull(self, name: str) -> None:
        """Copy module `name`'s current values from the ps tasks."""
        ids = collections.defaultdict(list)
        for var in self._modules[name]:
            for part in var.parts:
                ids[part.ps].append(part.id)
        results = self._client.pull(ids, -1, f"reading module {name!r}")
        for ps, (_, packed) in results.items():
            self._apply(ps, packed)

    def _apply(self, ps: int, packed: list) -> None:
        views = self._views[ps]
        with torch.no_grad():
            for i, value in _ps_rpc.unpack(packed):
                target = views.get(i)
                if target is not None:
                    target[0].copy_(value)
                    if target[1] is not None:
                        target[1].copy_(value)

    def create_optimizer(self, name: str, factory, params):
        optimizer = factory(params)
        if not self._training() or not isinstance(optimizer, torch.optim.Optimizer):
            return optimizer
        variables = []
        groups = collections.defaultdict(list)   # ps -> [(group index, hparams, ids)]
        for index, group in enumerate(optimizer.param_groups):
            hparams = {k: v for k, v in group.items() if k != "params"}
            ids = collections.defaultdict(list)
            for p in group["params"]:
                var = self._params.get(id(p))
                if var is None:
                    raise ValueError(f"get_optimizer(name={name!r}): a parameter was not "
                                     "created through est.get_module, so it has no place on "
                                     "the ps tasks")
                variables.append(var)
                for part in var.parts:
                    ids[part.ps].append(part.id)
            for ps, i in ids.items():
                groups[ps].append((index, hparams, i))
        self._client.ensure_optimizer(name, type(optimizer), optimizer.defaults, groups)
        self._optimizers[name] = (optimizer, variables)
        self._gathered = None   # (a snapshot without it)
        self._sent_hparams[name] = _hparams(optimizer)
        optimizer.step = types.MethodType(_pushing_step(self, name), optimizer)
        optimizer.register_state_dict_post_hook(self._optimizer_state_hook(name))
        optimizer.register_load_state_dict_post_hook(self._optimizer_loaded_hook(name))
        return optimizer

    # -- checkpoints: gathering from the ps tasks ------------------------------------------------
    def _snapshot(self) -> dict:
        """Every module's and optimizer's state as on the ps tasks, once the
        steps in flight are applied (cached until the next push)."""
        if self._gathered is not None:
            return self._gathered
        client = self._client
        _, abandoned = client.wait_completed(_DRAIN_SECS)
        if abandoned:
            logger.warning("Checkpoint: %s did not finish their step within %g s (dead?); "
                           "saving without it", ", ".join(abandoned), _DRAIN_SECS)
        ids = collections.defaultdict(list)
        for variables in self._modules.values():
            for var in variables:
                for part in var.parts:
                    ids[part.ps].append(part.id)
        results = self._client.gather(ids, list(self._optimizers))
        values = {(ps, i): v for ps, (packed, _) in results.items()
                  for i, v in _ps_rpc.unpack(packed)}
        slots = {(ps, name, i): s for ps, (_, by_opt) in results.items()
                 for name, by_id in by_opt.items() for i, s in by_id.items()}
        modules = {}
        for name, variables in self._modules.items():
            modules[name] = {var: ps_placement.join([values[(p.ps, p.id)] for p in var.parts], var)
                             for var in variables}
        optimizers = {}
        for name, (optimizer, variables) in self._optimizers.items():
            state = {}
            for index, var in enumerate(variables):
                parts = [slots.get((p.ps, name, p.id)) for p in var.parts]
                if any(p is None for p in parts):
                    continue
                state[index] = {k: ps_placement.join([p[k] for p in parts], var) for k in parts[0]}
            optimizers[name] = state
        self._gathered = {"modules": modules, "optimizers": optimizers}
        return self._gathered

    def _module_state_hook(self, name: str):
        def hook(module, state_dict, prefix, local_metadata):
            if self._client is None:
                return
            values = self._snapshot()["modules"][name]
            by_key = {var.key: var for var in self._modules[name]}
            for key in list(state_dict):
                if key.startswith(prefix):
                    key_here = key[len(prefix):]
                    var = by_key.get(self._aliases[name].get(key_here, key_here))
                    if var is not None:
                        state_dict[key] = values[var]
        return hook

    def _optimizer_state_hook(self, name: str):
        def hook(optimizer, state_dict):
            if self._client is None:
                return state_dict
            state_dict["state"] = self._snapshot()["optimizers"][name]
            return state_dict
        return hook

    def _optimizer_loaded_hook(self, name: str):
        """After a restore into the local optimizer: the chief, initializing,
        puts the slots on the ps tasks; the local copy is dropped."""
        def hook(optimizer):
            _, variables = self._optimizers[name]
            params = [p for g in optimizer.param_groups for p in g["params"]]
            if self._is_chief and self._initializing:
                per_ps = collections.defaultdict(dict)
                for p, var in zip(params, variables):
                    state = optimizer.state.get(p)
                    if not state:
                        continue
                    for part in var.parts:
                        per_ps[part.ps][part.id] = {k: ps_placement.slice_of(v, part, var)
                                                    for k, v in state.items()}
                self._client.set_optimizer_state(name, per_ps)
                self._gathered = None
            optimizer.state.clear()
        return hook

    # -- the step --------------------------------------------------------------------------------
    def set_last_step(self, last_step: Optional[int]) -> None:
        if last_step is not None:
            self._limit = last_step if self._limit is None else min(self._limit, last_step)

    def _prefetch_ticket(self) -> None:
        if self._ticket is not None or self._ticket_future is not None:
            return
        client = self._client
        if self._is_chief and self._initializing:
            client.set_ready(self._scope.global_step)
            self._initializing = False   # from now on the ps tasks hold the truth
        self._ticket_future = client.next_ticket_async(self._limit, self._done)

    def _step_ticket(self) -> int:
        if self._ticket is not None:
            return self._ticket
        self._prefetch_ticket()
        future, self._ticket_future = self._ticket_future, None
        ticket, step, preempted_by = self._client.result(future, 0, "taking the next global step")
        if ticket is None:   # max_steps reached (by others), the chief ended training, or
            self._exhausted = True   # a preemption stopped it
            self._scope.global_step = step
            if preempted_by is not None:
                self.preempted = True
                logger.warning("%s: %s was preempted: stopping at global step %d",
                               self._client.task, preempted_by, step)
            else:
                logger.info("%s: global step %d reached; stopping", self._client.task, step)
            raise StopIteration
        self._ticket = ticket
        self.rpc_steps += 1
        self._scope.global_step = ticket - 1   # the session adds this step
        return ticket

    def apply_gradients(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer):
        if self._client is None or self._scope is None:
            return super().apply_gradients(loss, optimizer)
        start = time.perf_counter()
        self._prefetch_ticket()   # answered while the backward pass runs
        self.rpc_secs += time.perf_counter() - start
        free_gradients(optimizer)
        loss.backward()
        optimizer.step()

    def _optimizer_step(self, name: str, optimizer, closure=None):
        """What the optimizer's `step()` does here: push this trainer's
        gradients (and buffer changes) to the ps tasks, take the new values."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._client is None or self._scope is None:
            raise RuntimeError(f"Optimizer {name!r} of ParameterServerStrategy steps only "
                               "during training")
        start = time.perf_counter()
        self._step_ticket()
        grads = collections.defaultdict(lambda: ([], []))
        sparse = collections.defaultdict(lambda: ([], [], []))   # ps -> (ids, rows, values)
        read = collections.defaultdict(lambda: ([], []))   # ps -> (ids, masks of rows read)
        tables = []
        for var in self._optimizers[name][1]:
            g = var.tensor.grad
            if g is None:
                continue
            if not g.is_sparse and lookups.noted(var.tensor):   # (a feature column's table)
                tables.append(var.tensor)
                mask = lookups.rows(var.tensor)
                for part in var.parts:
                    ids, masks = read[part.ps]
                    ids.append(part.id)
                    masks.append(part.of(mask))
            if g.is_sparse:   # (an embedding's rows: applied as sparse on the ps, as here)
                g = g.coalesce()
                rows, values = g.indices()[0], g.values()
                for part in var.parts:
                    ids, part_rows, part_values = sparse[part.ps]
                    ids.append(part.id)
                    if part.start is None:
                        part_rows.append(rows)
                        part_values.append(values)
                    else:
                        inside = (rows >= part.start) & (rows < part.start + part.length)
                        part_rows.append(rows[inside] - part.start)
                        part_values.append(values[inside])
                continue
            for part in var.parts:
                ids, tensors = grads[part.ps]
                ids.append(part.id)
                tensors.append(part.of(g))
        deltas = {} if self._buffers_pushed else self._buffer_deltas()
        self._buffers_pushed = True
        hparams = _hparams(optimizer)
        if _same(hparams, self._sent_hparams[name]):
            hparams = None   # unchanged: nothing to send (a scheduler changes lr: sent)
        else:
            self._sent_hparams[name] = hparams
        calls = {}
        for ps in set(grads) | set(deltas) | set(sparse):
            g_ids, g_tensors = grads.get(ps, ((), ()))
            d_ids, d_tensors = deltas.get(ps, ((), ()))
            calls[ps] = (g_ids, g_tensors, d_ids, d_tensors, hparams, self._since[ps],
                         sparse.get(ps, ((), (), ())), read.get(ps, ((), ())))
        for ps, (clock, packed) in self._client.push(calls, name).items():
            self._since[ps] = clock
            self._apply(ps, packed)
        for table in tables:
            lookups.clear(table)
        self._gathered = None
        self.rpc_secs += time.perf_counter() - start
        return loss

    def _buffer_deltas(self) -> dict:
        """{ps: (ids, deltas)} of the buffers this step changed (TF's moving
        averages: the change is added on the ps). Which buffers change is
        learnt on the first step (and from in-place version bumps after)."""
        if self._mutable is None:
            self._mutable = {b for b in self._buffers if b.tensor._version != b.version
                             or not torch.equal(b.tensor, b.snap)}
        candidates = [b for b in self._buffers
                      if b in self._mutable or b.tensor._version != b.version]
        out = collections.defaultdict(lambda: ([], []))
        for var in candidates:
            delta = var.tensor.detach() - var.snap
            for part in var.parts:
                ids, tensors = out[part.ps]
                ids.append(part.id)
                tensors.append(part.of(delta))
            var.version = var.tensor._version
        return out

    def run_train_op(self, train_op: Callable, loss=None) -> None:
        if self._client is None or self._scope is None:
            return train_op()
        self._prefetch_ticket()
        train_op()
        if self._ticket is None:   # no optimizer stepped (gradient accumulation): the
            self._step_ticket()    # global step counts the call all the same

    def all_agree_to_stop(self, stop: bool, preempted: bool = False) -> bool:
        """After each step: the step's ticket is done; stop when the global
        step is used up (max_steps) or a hook asks. A SIGTERM/SIGINT on the
        chief (`preempted`) stops every trainer: ps 0 hands out no more global
        steps, and the chief's checkpoint, at the last one handed out, waits
        for the steps in flight. A worker's own signal stops that worker alone
        (its updates are on the ps tasks; restarted, it rejoins), as a TF1
        worker leaving asynchronous training."""
        if self._ticket is not None:
            self._done, self._ticket = self._ticket, None
        self._buffers_pushed = False
        if preempted and self._is_chief and self._client is not None and not self.preempted:
            self.preempted = True
            self._scope.global_step = self._client.preempt(self._client.task)
        return stop or self._exhausted

    @property
    def preemption_rejoins(self) -> bool:
        """A worker stopped by its own signal: training goes on without it."""
        return not self._is_chief and not self.preempted

    def end_training(self) -> None:
        if self._client is None:
            return
        if self._ticket_future is not None:   # a ticket taken for a step never run
            try:
                ticket, _, _ = self._client.result(self._ticket_future, 0, "ending a step")
                self._done = ticket or self._done
            finally:
                self._ticket_future = None
        self._client.complete(self._done)
        self._trained = True
        logger.info("%s: did %d of the global steps; %.2f ms of each in RPCs", self._client.task,
                    self.rpc_steps, 1e3 * self.rpc_secs / max(1, self.rpc_steps))

    def rpc_stats(self) -> dict:
        """What the training steps spent in RPCs (and the ps tasks applying
        updates): for benchmarks."""
        out = {"steps": self.rpc_steps,
               "rpc_ms_per_step": 1e3 * self.rpc_secs / max(1, self.rpc_steps)}
        if self._client is not None:
            stats = self._client.stats(self._num_ps)
            out["ps_apply_ms"] = {ps: 1e3 * s["push_secs"] / max(1, s["pushes"])
                                  for ps, s in stats.items()}
            out["steps_by_trainer"] = stats[0]["steps_by_trainer"]
        return out

    # -- the ps role ------------------------------------------------------------------------------
    def serve(self, stop_when: Optional[Callable[[], bool]] = None,
              signalled: Optional[Callable[[], Optional[str]]] = None) -> Optional[tuple]:
        """Run this ps task's Server until training ends (train_and_evaluate's
        `ps` role); (who was preempted, the global step) if training was
        (see `Server.join`), else None."""
        from .server import Server
        if self._task_type != "ps":
            raise ValueError(f"This task is {self._task_type}:{self._task_id}, not a ps task")
        server = Server(self._spec, job_name="ps", task_index=self._task_id,
                        timeout_secs=self._timeout, init_timeout_secs=self._init_timeout)
        server.join(stop_when=stop_when, signalled=signalled)
        return server.preempted


def _pushing_step(extended: _ParameterServerExtended, name: str):
    """The optimizer's `step`, pushing to the ps tasks, with its step hooks
    run as torch's own `step` runs them (the Estimator's, which free a
    callable train_op's gradients after the step, among them)."""
    def step(optimizer, closure=None):
        return extended._optimizer_step(name, optimizer, closure)
    return torch.optim.Optimizer.profile_hook_step(step)


def _hparams(optimizer) -> list:
    """Each param group's hyperparameters, copied (tensors cloned: a scheduler
    may change them in place)."""
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v
             for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def _same(a: list, b: list) -> bool:
    """Whether two optimizers' hyperparameters are equal (tensors compared by value)."""
    try:
        return a == b
    except RuntimeError:   # a tensor hyperparameter (lr=torch.tensor(...)) with several values
        return False


class ParameterServerStrategy(_CollectiveStrategy):
    """Asynchronous training with parameter servers
    (tf.compat.v1.distribute.experimental.ParameterServerStrategy).

        # every task runs the same program with its own TF_CONFIG
        # (cluster: chief, workers, ps); the ps tasks serve inside
        # train_and_evaluate, or with distribute.Server(...).join()
        strategy = distribute.ParameterServerStrategy(
            variable_partitioner=distribute.partitioners.MinSizePartitioner(
                min_shard_bytes=1 << 20, max_shards=2))
        config = est.RunConfig(train_distribute=strategy)

    `cluster_resolver`: default TF_CONFIG's. `variable_partitioner`: a
    `distribute.partitioners` object or any `(shape, dtype) -> [pieces per
    axis]` callable (None: no partitioning). `placement`: "round_robin"
    (TF1's replica_device_setter) or "by_size" (greedy by bytes).
    `timeout_secs`: a ps that does not answer an RPC within it is taken for
    dead; `init_timeout_secs`: how long trainers wait for the ps tasks and
    the chief's initial values. With no cluster: variables on the CPU,
    compute on the local devices (see the module docstring).
    """

    def __init__(self, cluster_resolver: Optional[cr.ClusterResolver] = None,
                 variable_partitioner=None, placement: str = "round_robin",
                 timeout_secs: float = 60.0, init_timeout_secs: float = 600.0):
        if cluster_resolver is not None and not isinstance(cluster_resolver, cr.ClusterResolver):
            raise TypeError(f"cluster_resolver must be a ClusterResolver, got "
                            f"{cluster_resolver!r}")
        if placement not in _PLACEMENTS:
            raise ValueError(f"placement must be one of {_PLACEMENTS}, got {placement!r}")
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise TypeError(f"variable_partitioner must be callable (shape, dtype) -> pieces "
                            f"per axis, got {variable_partitioner!r}")
        for name, value in (("timeout_secs", timeout_secs),
                            ("init_timeout_secs", init_timeout_secs)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ParameterServerStrategy: {name} must be a number > 0, got "
                                 f"{value!r}")
        self._cluster_resolver = cluster_resolver or cr.TFConfigClusterResolver()
        spec = self._cluster_resolver.cluster_spec()
        self._variable_partitioner = variable_partitioner
        if not spec:
            devices, names = _local_devices(None)
            parameter = torch.device("cpu") if len(devices) > 1 else devices[0]
            super().__init__(_CentralStorageExtended(self, _Topology(devices, names), parameter,
                                                     timeout_secs))
            return
        if "ps" not in spec.jobs:
            raise ValueError(f"ParameterServerStrategy needs 'ps' tasks in the cluster; its jobs "
                             f"are {spec.jobs}: {spec.as_dict()}")
        super().__init__(_ParameterServerExtended(
            self, self._cluster_resolver, variable_partitioner, placement, float(timeout_secs),
            float(init_timeout_secs)))

    @property
    def cluster_resolver(self) -> cr.ClusterResolver:
        return self._cluster_resolver

    def __repr__(self):
        e = self._extended
        if isinstance(e, _ParameterServerExtended):
            return (f"ParameterServerStrategy(task='{e._task_type}:{e._task_id}', "
                    f"ps={e._num_ps}, workers={len(e._trainers)})")
        return (f"ParameterServerStrategy(local: compute_devices={list(e.worker_devices)}, "
                f"parameter_device={e._parameter_device})")
