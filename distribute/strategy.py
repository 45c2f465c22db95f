"""The Strategy API (tf.distribute.Strategy) and the single-device strategies.

A strategy is the only thing that knows about devices and processes. The
Estimator and the model scope talk to it through `strategy.extended`'s private
methods (`create_module`, `to_device`, `apply_gradients`, ...); every
strategy plugs into the same points.
"""
from __future__ import annotations

import contextlib
import copy
import enum
import threading
from typing import Callable, Optional

import torch

from .input_options import fetch_to_device


_TORCH_ZERO_GRAD = torch.optim.Optimizer.zero_grad


def free_gradients(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.zero_grad(set_to_none=True)`: every parameter's `.grad` set
    to None. Where the optimizer keeps torch's `zero_grad`, done here without
    that method's profiler record (`record_function`: 15-25 us a call on a
    2-core CPU, more than the rest of a small model's per-step overhead); an
    optimizer with a `zero_grad` of its own has it called."""
    if type(optimizer).zero_grad is not _TORCH_ZERO_GRAD or "zero_grad" in vars(optimizer):
        optimizer.zero_grad(set_to_none=True)
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


class ValueContext:
    """What `experimental_distribute_values_from_function`'s function learns
    (tf.distribute.experimental.ValueContext)."""

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1):
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self.num_replicas_in_sync = num_replicas_in_sync

    def __repr__(self):
        return (f"ValueContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
                f"num_replicas_in_sync={self.num_replicas_in_sync})")


class ReduceOp(enum.Enum):
    """How to combine values across replicas (tf.distribute.ReduceOp)."""

    SUM = "SUM"
    MEAN = "MEAN"


class InputContext:
    """What an `input_fn(input_context)` learns about the input pipelines
    (tf.distribute.InputContext)."""

    def __init__(self, num_input_pipelines: int = 1, input_pipeline_id: int = 0,
                 num_replicas_in_sync: int = 1):
        self.num_input_pipelines = num_input_pipelines
        self.input_pipeline_id = input_pipeline_id
        self.num_replicas_in_sync = num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(
                f"The `global_batch_size` {global_batch_size} is not divisible by "
                f"`num_replicas_in_sync` {self.num_replicas_in_sync}")
        return global_batch_size // self.num_replicas_in_sync

    def __repr__(self):
        return (f"InputContext(num_input_pipelines={self.num_input_pipelines}, "
                f"input_pipeline_id={self.input_pipeline_id}, "
                f"num_replicas_in_sync={self.num_replicas_in_sync})")


def _mover(device: torch.device):
    """A function moving a batch (tensors, numpy arrays, dicts/lists/tuples of
    them) to `device`: numpy converted once (float64 to float32, TF's default
    float), tensors copied without a host sync, nothing done for what is
    already there. Strings (numpy str/bytes/object arrays of strings, lists of
    str or bytes) stay host values for the model_fn to map. The usual batches
    (`(features, labels)`, a dict of CPU tensors on a CPU device) take the
    shortest path: this runs on every step."""
    cpu = device.type == "cpu"
    Tensor = torch.Tensor

    def there(obj) -> bool:   # a dict of tensors, or a tensor, needing no move
        if type(obj) is dict:
            for value in obj.values():
                if not (type(value) is Tensor and value.is_cpu):
                    return False
            return True
        return type(obj) is Tensor and obj.is_cpu

    def move(obj, where: str = "batch"):
        if cpu and type(obj) is tuple and len(obj) == 2 and there(obj[0]) and there(obj[1]):
            return obj   # (features, labels) already on the CPU: the usual batch
        if type(obj) is tuple and len(obj) == 2 and where == "batch":
            return move(obj[0], "features"), move(obj[1], "labels")
        if isinstance(obj, Tensor):
            if cpu:
                return obj if obj.is_cpu else obj.cpu()
            return obj.to(device, non_blocking=True)
        if isinstance(obj, dict):
            return {k: move(v, f"{where}[{k!r}]") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            if obj and all(isinstance(v, (str, bytes)) for v in obj):
                return obj   # strings: host values
            moved = [move(v, f"{where}[{i}]") for i, v in enumerate(obj)]
            if type(obj) is tuple:
                return tuple(moved)
            return moved if isinstance(obj, list) else type(obj)(*moved)   # a namedtuple
        module = type(obj).__module__
        if module == "numpy":
            tensor = _numpy_to_tensor(obj, where)
            return move(tensor) if isinstance(tensor, Tensor) else tensor
        if module.startswith("pandas"):   # a Series or DataFrame column
            return move(obj.to_numpy(), where)
        return obj
    return move


def _numpy_to_tensor(obj, where: str):
    """A numpy array or scalar as a tensor (float64 as float32, unless
    `torch.set_default_dtype(torch.float64)` made float64 torch's default),
    or the array itself when it holds strings."""
    import numpy as np
    dtype = getattr(obj, "dtype", None)
    if dtype is not None:
        if dtype.kind in "US":
            return obj
        if dtype.kind == "O":
            if all(isinstance(v, (str, bytes)) for v in np.ravel(obj)):
                return obj
            kinds = sorted({type(v).__name__ for v in np.ravel(obj)})
            raise TypeError(f"{where}: a numpy object array holding {', '.join(kinds)} cannot "
                            "become a tensor; give numbers (a numeric dtype) or strings only")
        if dtype == np.float64 and torch.get_default_dtype() != torch.float64:
            obj = obj.astype(np.float32)   # (a float64 default: the user's model is float64)
    try:
        return torch.as_tensor(obj)
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"{where}: a numpy {type(obj).__name__} of dtype {dtype} cannot "
                        f"become a tensor ({e})") from None


class StrategyExtended:
    """Per-strategy mechanics (tf.distribute.StrategyExtended): the one
    interface between a strategy and the layers above it.

    This base class is the whole contract and the single-device
    implementation. A new strategy subclasses it and overrides what differs;
    the session layer (`hooks`) and the Estimator call nothing else:

    - TF's surface: `worker_devices`, `parameter_devices`, `should_checkpoint`,
      `should_save_summary`, `should_init`.
    - capabilities: `uses_parameter_servers`, `reduces_in_optimizer_step`,
      `in_multi_worker_mode()`,
      `launcher` (None, or a `distribute.Launcher` when calls run in replica
      processes the strategy starts).
    - the model scope: `enter_scope(scope)` / `exit_scope(scope)` around a
      training, evaluation or prediction (`scope.mode`, `scope.global_step`),
      `current_scope`.
    - creation (TF's `strategy.scope()` interception): `create_module`,
      `create_optimizer`, `create_metric`.
    - input: `distribute_input`, `to_device` (a function, called every step).
    - the model_fn: `in_replica_context(fn)`.
    - the step: `apply_gradients`, `run_train_op`, `reduce_loss`,
      `all_agree_to_stop` (None on one replica), `stop_before_first_step`,
      `preempted`, `set_last_step`, `end_training`, `report_failure`,
      `average_gradients_set_by_hand` (user code's optimizer steps).
    - evaluation: `reduce_metrics`.
    - a ps task: `serve(stop_when)` (parameter-server strategies).
    """

    uses_parameter_servers = False   # variables live on the cluster's ps tasks
    # the replicas' gradients are reduced in the optimizer's step (a pre-hook),
    # not in backward: a loss scaler would judge each replica's unreduced ones
    reduces_in_optimizer_step = False

    def __init__(self, container_strategy: "Strategy", device):
        self._container_strategy = container_strategy
        self._scopes: list = []
        self._set_device(device)

    def _set_device(self, device) -> None:
        """Place this replica on `device`; `to_device(batch)` then moves batches there."""
        self._device = torch.device(device)
        self.to_device = _mover(self._device)   # an attribute: called on every step

    # -- TF's public surface -------------------------------------------------
    @property
    def worker_devices(self):
        return (str(self._device),)

    @property
    def parameter_devices(self):
        return (str(self._device),)

    @property
    def should_checkpoint(self) -> bool:
        """Whether this process writes checkpoints (the chief)."""
        return True

    @property
    def should_save_summary(self) -> bool:
        """Whether this process writes summaries (the chief)."""
        return True

    @property
    def should_init(self) -> bool:
        return True

    # Whether this replica's shard of the evaluation in progress had no batch,
    # so that its model_fn ran on an empty one to build the metrics alone
    # (strategies sharding evaluation over replicas define it).
    evaluates_nothing = False

    # -- capabilities ------------------------------------------------------------
    def in_multi_worker_mode(self) -> bool:
        """Whether this task trains together with other tasks of a cluster
        (TF: `extended._in_multi_worker_mode()`)."""
        return False

    # None, or a `distribute.launcher.Launcher`: the caller hands its work to
    # it when the strategy runs replicas in processes of its own.
    launcher = None

    # -- the model scope ----------------------------------------------------------
    def enter_scope(self, scope) -> None:
        """A model scope (a training, evaluation or prediction) becomes active."""
        self._scopes.append(scope)

    def exit_scope(self, scope) -> None:
        self._scopes.remove(scope)

    @property
    def current_scope(self):
        """The innermost active model scope (its `mode`, `global_step`, and
        `initial`: whether its variables keep their initial values, no
        checkpoint restored), or None."""
        return self._scopes[-1] if self._scopes else None

    # -- creation (the strategy.scope() interception points) --------------------------
    def create_module(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(self._device)

    def create_optimizer(self, name: str, factory, params):
        optimizer = factory(params)
        free_gradients(optimizer)   # steps start without gradients
        return optimizer

    def create_metric(self, metric: torch.nn.Module) -> torch.nn.Module:
        return metric.to(self._device)

    def apply_gradients(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer):
        """One optimizer step on `loss` (TF: `optimizer.minimize(loss)`).
        The gradients are freed after the step, not before the backward pass:
        the next forward pass then reuses their memory, as in a plain loop
        that zeroes first (measured: 3.5-4.5% of an MLP step with two threads)."""
        loss.backward()
        optimizer.step()
        free_gradients(optimizer)

    def reduce_metrics(self, metrics) -> None:
        """Sum metric state across replicas in place (nothing to do on one)."""

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to log: the mean over replicas."""
        return loss

    # After each training step, `all_agree_to_stop(stop, preempted) -> bool`:
    # True if any replica stops, the same answer on every replica (and
    # `preempted` becomes True on every replica when one was preempted).
    # Strategies with several replicas define it; one replica has nothing to
    # agree on.
    all_agree_to_stop: Optional[Callable[[bool, bool], bool]] = None
    preempted = False   # a replica got SIGTERM/SIGINT: training stopped at the agreed step
    # A trainer stopped by its own signal while the others go on (a worker of
    # asynchronous ps training): restarted, it rejoins rather than resumes.
    preemption_rejoins = False

    def _input_context(self) -> InputContext:
        return InputContext(1, 0, self._container_strategy.num_replicas_in_sync)

    def in_replica_context(self, fn: Callable, mode: Optional[str] = None) -> Callable:
        """`fn`, called in this replica's context: TF1's Estimator calls its
        model_fn through `call_for_each_replica`, so `get_replica_context()`
        answers there (`replica_id_in_sync_group`, `num_replicas_in_sync`,
        `all_reduce`), with or without a strategy. `mode` (a ModeKeys value):
        the model_fn's, which says whether its collectives can pair up across
        the replicas (`_model_fn_collective`)."""
        context = ReplicaContext(self._container_strategy, self._replica_id(), mode)

        def call(*args):
            stack = _stack()
            stack.append(context)
            try:
                return fn(*args)
            finally:
                stack.pop()
        return call

    def _model_fn_collective(self, mode: str) -> bool:
        """Whether an all_reduce or all_gather of a model_fn called in `mode`
        runs across the replicas (else on this replica alone)."""
        return True

    def _model_fn_alone(self, mode: str) -> bool:
        """Whether a model_fn called in `mode` runs on this replica alone
        (its context then counts one replica); no collective is made."""
        return False

    def _replica_id(self) -> int:
        return 0

    def distribute_input(self, call_input_fn: Callable, input_fn: Callable, mode: str,
                         read: Callable = iter):
        """This replica's batches for `mode`: `read` (how the batches are
        read: moved to the device, read ahead) of `call_input_fn(input_context)`,
        sharded by the strategy when `input_fn` ignores its context (TF's
        AutoShardPolicy). One replica: what the input_fn returned."""
        return read(call_input_fn(self._input_context()))

    def end_training(self) -> None:
        """After the training session has closed (the chief's last checkpoint
        is written): replicas wait here for each other."""

    def report_failure(self, error: BaseException) -> None:
        """This replica's session ends on `error`, its own (its input_fn, its
        model_fn, a hook): tell the other replicas, whose collectives then
        fail at once naming it (nothing to tell on one replica)."""

    def average_gradients_set_by_hand(self, optimizer) -> None:
        """Before `optimizer` steps in user code (a loss scaler's unscale
        first): the gradients its replicas set by hand, not by a backward
        pass (torch.autograd.grad), averaged over them as TF's
        apply_gradients averages any gradients (nothing to do on one replica)."""

    def set_last_step(self, last_step: Optional[int]) -> None:
        """The global step training stops at (StopAtStepHook tells it), for
        strategies whose trainers share one global step (parameter servers)."""

    def stop_before_first_step(self) -> bool:
        """A stop asked before the first training step (a hook's
        `coord.request_stop()` in `after_create_session`, maybe on the chief
        alone): True if this trainer stops at once; a strategy whose replicas
        agree on each step carries it in the first one (no update made)."""
        return True

    def run_train_op(self, train_op: Callable, loss: Optional[torch.Tensor] = None) -> None:
        """Run a custom `train_op` callable (several optimizers, a GAN step);
        `loss`, the step's, is the one `reduce_loss` then reduces."""
        train_op()


_state = threading.local()


def _stack():
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


class Strategy:
    """Base of every distribution strategy (tf.distribute.Strategy)."""

    def __init__(self, extended: StrategyExtended):
        self._extended = extended

    @property
    def extended(self) -> StrategyExtended:
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        return 1

    @property
    def cluster_resolver(self):
        return None

    @contextlib.contextmanager
    def scope(self):
        """Make this the current strategy (`get_strategy()` returns it)."""
        stack = _stack()
        stack.append(self)
        try:
            yield self
        finally:   # (this entry, not the last: a predict generator closed late exits
            for i in range(len(stack) - 1, -1, -1):   # under scopes entered after it)
                if stack[i] is self:
                    del stack[i]
                    break

    def run(self, fn: Callable, args=(), kwargs=None, options=None):
        """Run `fn` on each local replica (here: once) in a replica context.
        `options` (TF's RunOptions, for TPUs) is accepted and unused."""
        with self.scope():
            ctx = ReplicaContext(self, 0)
            _stack().append(ctx)
            try:
                return fn(*args, **(kwargs or {}))
            finally:
                _stack().pop()

    def reduce(self, reduce_op, value, axis=None):
        """Combine a per-replica `value` (a tensor, number, or a dict, list or
        tuple of them) across the replicas (tf.distribute.Strategy.reduce).
        With `axis` (an int or ints, usually the batch dimension) each
        replica's tensor is first reduced along it, as TF does: MEAN is then
        the mean over every replica's elements (uneven batches count each
        example once), not a mean of the replicas' means. Without `axis`
        every replica's value must have the same shape."""
        reduce_op = _reduce_op(reduce_op)
        return _map(lambda v: self._reduce_along(reduce_op, v, axis), value)

    def _reduce_along(self, reduce_op, value, axis):
        if axis is None:
            return self._reduce_across(reduce_op, value)
        value = torch.as_tensor(value)
        axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
        total = value.sum(axes)
        if reduce_op == ReduceOp.SUM:
            return self._reduce_across(ReduceOp.SUM, total)
        count = 1
        for a in axes:
            count *= value.shape[a]
        dtype = total.dtype if total.is_floating_point() else torch.float64
        # (the sum and the count over the replicas in one collective)
        both = torch.cat([total.reshape(-1).to(dtype), total.new_tensor([count], dtype=dtype)])
        both = self._reduce_across(ReduceOp.SUM, both, total.dim() > 0)
        return (both[:-1] / both[-1]).reshape(total.shape)

    def _reduce_across(self, reduce_op, value, check_shape: bool = True,
                       differentiable: bool = False):
        """`value` combined over the replicas, elementwise (here: itself).
        `check_shape=False`: the caller knows every replica's shape agrees."""
        return value

    def gather(self, value, axis):
        """The replicas' `value`s (tensors, or a dict, list or tuple of them)
        concatenated along `axis` in replica order, on every replica
        (tf.distribute.Strategy.gather); their sizes along `axis` may differ
        (a short last batch)."""
        return _map(lambda v: self._gather_across(torch.as_tensor(v), axis), value)

    def _gather_across(self, value: torch.Tensor, axis: int) -> torch.Tensor:
        return _checked_axis(value, axis)

    def experimental_distribute_dataset(self, dataset, options=None):
        """Batches of `dataset`, moved to the device (split per replica when
        there are several, as TF2); `options`: a `distribute.InputOptions`."""
        move = self._input_mover(options, "experimental_distribute_dataset", False)
        return (move(batch) for batch in dataset)

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        move = self._input_mover(options, "distribute_datasets_from_function")
        return (move(b) for b in dataset_fn(self._extended._input_context()))

    def experimental_distribute_values_from_function(self, value_fn):
        """`value_fn(ValueContext)` of this replica (TF calls it once per local
        replica and makes a per-replica value of the results; here each
        replica is a process holding its own)."""
        return value_fn(ValueContext(self._extended._replica_id(), self.num_replicas_in_sync))

    def _input_mover(self, options, what: str, per_replica_allowed: bool = True) -> Callable:
        """What moves a batch where `options` says: to the replica's device,
        or (`experimental_fetch_to_device=False`) to host tensors."""
        if fetch_to_device(options, what, per_replica_allowed):
            return self._extended.to_device
        return _mover(torch.device("cpu"))

    def experimental_local_results(self, value):
        return (value,)

    def __repr__(self):
        return f"{type(self).__name__}(device={self._extended._device})"


class ReplicaContext:
    """The context `fn` runs in under `strategy.run`, and the Estimator's
    model_fn (tf.distribute.ReplicaContext)."""

    def __init__(self, strategy: Strategy, replica_id_in_sync_group: int,
                 mode: Optional[str] = None):
        self.strategy = strategy
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self._mode = mode   # a model_fn's mode; None under strategy.run

    @property
    def num_replicas_in_sync(self) -> int:
        """The strategy's; 1 in a model_fn running on this replica alone (the
        chief's evaluation inside training), whose all_reduce is its own."""
        if self._mode is not None and self.strategy.extended._model_fn_alone(self._mode):
            return 1
        return self.strategy.num_replicas_in_sync

    def all_reduce(self, reduce_op, value, options=None):
        """`value` (a tensor, or a dict, list or tuple of them) combined over
        the replicas, elementwise. `options` is accepted and unused."""
        reduce_op = _reduce_op(reduce_op)
        if not self._across():
            return value
        return _map(lambda v: self.strategy._reduce_across(reduce_op, v, differentiable=True),
                    value)

    def all_gather(self, value, axis, options=None):
        """The replicas' `value`s concatenated along `axis` in replica order
        (tf.distribute.ReplicaContext.all_gather; sizes along `axis` may
        differ). `options` is accepted and unused."""
        if not self._across():   # this replica's own values
            return _map(lambda v: _checked_axis(torch.as_tensor(v), axis), value)
        return self.strategy.gather(value, axis)

    def _across(self) -> bool:
        """Whether a collective here runs across the replicas: always under
        strategy.run; in a model_fn, as its mode allows (an evaluation the
        chief runs alone inside training keeps it to itself)."""
        return self._mode is None or self.strategy.extended._model_fn_collective(self._mode)


def _reduce_op(reduce_op) -> ReduceOp:
    return ReduceOp(reduce_op.value if isinstance(reduce_op, ReduceOp) else reduce_op)


def _map(fn: Callable, value):
    """`fn` on each leaf of a dict, list or tuple of values, their types kept
    (namedtuples, OrderedDict, defaultdict; TF: nest.map_structure)."""
    if isinstance(value, dict):
        items = [(k, _map(fn, v)) for k, v in value.items()]
        if type(value) is dict:
            return dict(items)
        out = copy.copy(value)   # a subclass: its own attributes (default_factory) kept
        out.clear()
        out.update(items)
        return out
    if isinstance(value, (list, tuple)):
        items = [_map(fn, v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return fn(value)


def _checked_axis(value: torch.Tensor, axis) -> torch.Tensor:
    """`value`, once `axis` is found to be one of its dimensions."""
    if not isinstance(axis, int) or isinstance(axis, bool) or not (
            -value.dim() <= axis < value.dim()):
        raise ValueError(f"gather: axis {axis!r} is not a dimension of a value of shape "
                         f"{list(value.shape)}")
    return value


class OneDeviceStrategy(Strategy):
    """Everything on one device, input prefetched to it (tf.distribute.OneDeviceStrategy)."""

    def __init__(self, device):
        super().__init__(StrategyExtended(self, device))


class _DefaultStrategy(Strategy):
    """No strategy: one process, the first GPU when there is one, else the CPU."""

    def __init__(self):
        super().__init__(StrategyExtended(
            self, "cuda:0" if torch.cuda.is_available() else "cpu"))


_default: Optional[_DefaultStrategy] = None


def _default_strategy() -> _DefaultStrategy:
    global _default
    if _default is None:
        _default = _DefaultStrategy()
    return _default


def get_strategy() -> Strategy:
    """The current strategy: the innermost `scope()`, else the default one."""
    for item in reversed(_stack()):
        if isinstance(item, Strategy):
            return item
    return _default_strategy()


def has_strategy() -> bool:
    """Whether a non-default strategy is current."""
    return not isinstance(get_strategy(), _DefaultStrategy)


def get_replica_context() -> Optional[ReplicaContext]:
    """The replica context inside `strategy.run`; None in cross-replica context
    (inside a `scope()` but outside `run`); the default one otherwise."""
    stack = _stack()
    if stack and isinstance(stack[-1], ReplicaContext):
        return stack[-1]
    if stack:
        return None
    return ReplicaContext(_default_strategy(), 0)


def in_cross_replica_context() -> bool:
    return get_replica_context() is None


def get_loss_reduction() -> ReduceOp:
    """How replicas' losses combine (tf.distribute.get_loss_reduction): MEAN,
    since gradients are averaged over the replicas (DDP's rule), so a
    model_fn returns its per-replica mean loss."""
    return ReduceOp.MEAN


def experimental_set_strategy(strategy: Optional[Strategy]) -> None:
    """Set (or clear with None) the current strategy outside a `with` block."""
    stack = _stack()
    stack.clear()
    if strategy is not None:
        stack.append(strategy)
