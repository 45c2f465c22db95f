"""The model scope: everything a model_fn creates through `get_module`,
`get_optimizer`, `get_grad_scaler` and the metrics.

TF analogue: the graph's variable collections plus `tf.compat.v1.get_variable`
(build on first call, return the same object afterwards) and the global step.
Creation goes through one interception point, the active strategy's
`extended.create_module/create_optimizer/create_metric`, as
`strategy.scope()` intercepts variable creation in TF. Restoring from a
checkpoint and warm starting happen at creation, before the strategy places
(and possibly wraps) the object.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import numbers
import re
from typing import Callable, Dict, Iterable, NamedTuple, Optional

import numpy as np
import torch
from torch.nn.parameter import is_lazy

from distribute import lookups
from distribute.loss_scaling import gradients_summed
from distribute.variable_names import var_name

from . import checkpoint
from ._factory_inputs import FactoryInputs
from .mode_keys import ModeKeys

logger = logging.getLogger(__name__)

_stack: list = []                         # active scopes, innermost last
_current: Optional["ModelScope"] = None   # _stack[-1], kept for the hot path


def _uncompiled(module: torch.nn.Module) -> torch.nn.Module:
    """The module `torch.compile` wrapped (its `_orig_mod`), else `module`."""
    original = getattr(module, "_orig_mod", None)
    return original if isinstance(original, torch.nn.Module) else module


def _uncompiled_state(state: dict) -> dict:
    """A module's state as its uncompiled module names it (checkpoints of
    compiled modules written before prefixed every key with `_orig_mod.`)."""
    prefix = "_orig_mod."
    if state and all(k.startswith(prefix) for k in state):
        return type(state)((k[len(prefix):], v) for k, v in state.items())
    return state


def _refuse_rounding(name: str, state: dict, module: torch.nn.Module, path) -> None:
    """Refuse to restore a checkpoint's values into a module of a narrower
    dtype (a float32 model_dir resumed by a bfloat16 model), which torch's
    load_state_dict would round without a word and the next save write back."""
    own = module.state_dict(keep_vars=True)
    for key, value in state.items():
        target = own.get(key)
        if isinstance(value, torch.Tensor) and isinstance(target, torch.Tensor) \
                and checkpoint.rounded_by_cast(value, target.dtype):   # (a lazy one's too)
            raise ValueError(
                f"get_module({name!r}): cannot restore {var_name(name, key)} from {path}: "
                f"the checkpoint holds it as {value.dtype}, the module as {target.dtype}, "
                "which would round its values (TF refuses a restore into another dtype). Build "
                "the module in the checkpoint's dtype; for lower-precision compute use "
                "torch.autocast, which keeps the weights in float32")


def _misfit(name: str, module: torch.nn.Module, state: dict) -> Optional[str]:
    """How a checkpoint's state does not fit `module` (a changed model), by
    variable names as `estimator inspect` shows them, with the fix; None
    where names and shapes fit (another error)."""
    own = module.state_dict()
    lines = []
    for key in sorted(set(own) | set(state)):
        var = f"{name}/{key.replace('.', '/')}"
        if key not in own:
            lines.append(f"{var} is in the checkpoint, not in the model")
        elif key not in state:
            lines.append(f"{var} is in the model, not in the checkpoint")
        elif isinstance(state[key], torch.Tensor) and state[key].shape != own[key].shape:
            lines.append(f"{var} is {list(state[key].shape)} in the checkpoint, "
                         f"{list(own[key].shape)} in the model")
    if not lines:
        return None
    shown = "; ".join(lines[:6]) + (f"; and {len(lines) - 6} more" if len(lines) > 6 else "")
    return (f"the model no longer fits the checkpoints of this model_dir ({shown}); train "
            f"the changed model in a new model_dir (warm_start_from=<this checkpoint> starts "
            f"it from the variables that still fit)")


def _by_variable_names(name: str, module: torch.nn.Module, saved: dict, path):
    """The checkpoint's state of module `name`; where it lacks some of the
    module's variables, or is not there, those gathered by variable name from
    modules of the checkpoint within it, as TF restores by name (an earlier
    version's `linear/linear_model/b` module holding `weights` is
    `linear/linear_model`'s `b/weights` now); what the module's own state
    holds, or None, unless every variable is there, under one name only."""
    own = saved.get(name)
    own = _uncompiled_state(own) if own is not None else None
    keys = list(module.state_dict(keep_vars=True))
    if own is not None and all(key in own for key in keys):
        return own
    flat: Dict[str, Optional[torch.Tensor]] = {}
    for owner, state in saved.items():
        if not owner.startswith(name + "/"):   # (only modules split from this one: never
            continue                           # an ancestor's own variables, `a`'s b.weight)
        for key, value in state.items():
            variable = var_name(owner, key)
            flat[variable] = None if variable in flat else value
    found = {key: own[key] if own is not None and key in own else
             flat.get(var_name(name, key)) for key in keys}
    if not keys or any(value is None for value in found.values()):
        return own
    logger.info("get_module(%r): restored from %s by variable names (the checkpoint holds "
                "them in modules within it: %s)", name, path, ", ".join(sorted(
                    o for o in saved if o.startswith(name + "/"))))
    return found


class _Rate(NamedTuple):
    """A learning rate a schedule computed (ModelScope.note_rate)."""
    step: int                                # the global step it was computed at
    value: float
    at: Optional[Callable[[int], float]]    # the rate at another step, or None
    in_factory: bool                         # computed inside an optimizer's factory


class _Unfollowed:
    """An optimizer built without the schedule model_fn computed (ModelScope._watch_unfollowed)."""

    def __init__(self, name: str, lrs: list, sites: dict):
        self.name, self.lrs, self.sites = name, lrs, sites   # sites: {call site: rate}
        self.moved, self.steps = False, 0


class Slots(torch.nn.Module):
    """The tensors kept for one variable of the model (TF's `slot_creator`:
    a moving average's shadow `hidden/kernel/ExponentialMovingAverage`),
    one per slot name, added when first needed. Saved with the model as the
    module named by the variable (so the checkpoint names them TF's way); a
    slot is restored from the checkpoint when it is added, or starts at
    `initial` where the checkpoint has none (`restored`). Not placed or
    wrapped by the strategy: each replica keeps its own, equal where the
    variables are."""

    def __init__(self, variable: str, saved: Optional[dict], path: Optional[str],
                 warm_start=None):
        super().__init__()
        self.variable, self._saved, self._path = variable, saved, path
        self._warm_start = warm_start   # (a fresh run's: `apply_slot` of the warm start)
        self.updates: Dict[str, list] = {}   # slot -> the after_update list updating it

    def get(self, name: str) -> Optional[torch.Tensor]:
        """The slot `name`, or None where it was not made."""
        return self._buffers.get(name)

    def slot(self, name: str, initial: torch.Tensor) -> torch.Tensor:
        """The slot `name`, made from `initial` (a copy) on first call."""
        found = self._buffers.get(name)
        if found is not None:
            return found
        value = initial.detach().clone()
        saved = None if self._saved is None else self._saved.get(name)
        if saved is not None:   # (a resumed run: the checkpoint's value)
            if saved.shape != value.shape:
                raise ValueError(
                    f"{self.variable}/{name}: the checkpoint {self._path} holds it of shape "
                    f"{list(saved.shape)}, the variable is of shape {list(value.shape)}")
            value.copy_(saved)
        elif self._warm_start is not None:
            self._warm_start.apply_slot(self.variable, name, value)
        self.register_buffer(name, value)
        return value

    def saved(self, name: str) -> bool:
        """Whether the restored checkpoint holds the slot `name`."""
        return self._saved is not None and name in self._saved

    def restored(self, name: str) -> bool:
        """Whether the slot `name` is (to be) the checkpoint's: False where a
        checkpoint was restored without it."""
        return self._saved is None or name in self._saved


class ModelScope:
    """Holds the modules, optimizers, metrics and global step of one model.

    `restore` is a loaded checkpoint (dict) whose entries are applied to each
    object when it is created; `warm_start` a `_WarmStarter` applied to modules
    that the checkpoint does not cover.
    """

    def __init__(self, mode: str, strategy, restore: Optional[dict] = None,
                 warm_start=None, restore_path: Optional[str] = None):
        self.mode = mode
        self.strategy = strategy
        self.modules: Dict[str, torch.nn.Module] = {}      # as model_fn sees them
        self.raw_modules: Dict[str, torch.nn.Module] = {}  # unwrapped, for saving
        self.optimizers: Dict[str, torch.optim.Optimizer] = {}
        self.optimizer_var_names: Dict[str, list] = {}
        # {name: [each param group's hyperparameters as the factory set them]}
        self.optimizer_built_with: Dict[str, list] = {}
        self.optimizer_var_lists: Dict[str, Optional[tuple]] = {}   # (get_optimizer's check)
        self._left_out: Dict[int, tuple] = {}   # id -> (parameter, name): frozen at a build
        self._made_late: Dict[int, tuple] = {}  # id -> (parameter, module): made after them
        # id -> (parameter, name, optimizer, its checkpoint's names): trainable,
        # left out of a resumed optimizer whose checkpoint did not hold it
        self._absent: Dict[int, tuple] = {}
        self.rates: Dict[tuple, _Rate] = {}   # a schedule's call site -> its latest rate
        self.followed: Dict[str, list] = {}   # optimizer -> [(group index, call site)]
        # optimizer -> (the step its followed rates were set at, the rates set)
        self._rates_set: Dict[str, tuple] = {}
        self.factory_inputs: Dict[str, FactoryInputs] = {}   # optimizer -> its factory's numbers
        self.step_in_factory = 0   # get_global_step() calls while a factory ran
        self._unfollowed: Optional[_Unfollowed] = None   # a rate no optimizer follows, watched
        self._building: Optional[str] = None  # the optimizer whose factory runs
        self.metrics: Dict[str, torch.nn.Module] = {}
        self.grad_scalers: Dict[str, torch.amp.GradScaler] = {}
        # ids of the optimizers whose step a grad scaler skipped (gradients not
        # finite) / whether it made one, since the Estimator's step last cleared them
        self.scaler_skipped: set = set()
        self.scaler_stepped = False
        self.step_uncounted = False   # set by a step the session must not count (its skip)
        # set by an uncounted step no hook sees, no summary records (TF's work
        # before the first step: k-means choosing its initial centers)
        self.step_hidden = False
        self.global_step = int(restore["global_step"]) if restore else 0
        self.named_tensors: Dict[str, torch.Tensor] = {}
        self.feed_dict: Optional[dict] = None   # this step's feeds (hooks.FeedFnHook)
        self.summaries_due = False
        self.summaries: list = []
        # whether the step's summaries include the training loss as `loss`:
        # TF's Estimator records it (summary.scalar), a custom loop does not
        self.loss_summary = False
        self.name_uses: Dict[str, int] = {}   # default names taken in this model_fn call
        self.collections: Dict[str, list] = {}   # [(name, value)] added in this call
        # TF1's last loss reduction (`get_loss_reduction`): the model_fn's last
        # `est.losses` loss was reduced with SUM (`note_loss_reduction`)
        self.loss_summed = False
        self._restore = restore
        self.initial = restore is None   # variables at their initial values (or warm-started)
        self._restore_path = restore_path
        self._warm_start = warm_start
        self.slots: Dict[str, Slots] = {}   # variable name -> its slots (also in raw_modules)
        self.after_update: list = []   # run once this training step's update is made
        # ids of the parameters an optimizer stepped in a fresh run's first step
        # (watched through that step only: `_note_first_updates`)
        self.updated_in_first_step: set = set()
        self._first_step_watches: list = []
        self.initial_buffers: Dict[str, torch.Tensor] = {}   # (a fresh run's first step's)
        self._first_step_over = False
        self._names: Dict[int, str] = {}
        self._names_of = 0   # the number of modules `_names` was made from
        self.averages_copied: Optional[tuple] = None   # (ExponentialMovingAverage.copy_to)

    @property
    def restore_path(self) -> Optional[str]:
        """The checkpoint this scope was restored from, or None."""
        return self._restore_path

    # -- creation (the interception point) ---------------------------------
    def create_module(self, name: str, factory: Callable[[], torch.nn.Module]):
        if not isinstance(name, str) or not name or name.startswith("/") \
                or name.endswith("/") or "//" in name:
            raise ValueError(f"get_module: the name must be a variable scope, as TF's "
                             f"(`net`, `encoder/layer_0`), got {name!r}")
        if name in self.slots:   # (a tensor's moving average was named so first)
            raise ValueError(f"get_module({name!r}): the name is taken by the slots (moving "
                             f"averages) named so earlier; give the module another name")
        if self._restore is None:
            module = factory()
        else:   # the checkpoint replaces its initial values: drawing them must not move
            with checkpoint.rng_preserved():   # the RNG restored with it (dropout
                module = factory()             # continues as in a run never stopped)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"get_module({name!r}): the factory must return a torch.nn.Module, "
                f"got {type(module).__name__}")
        others = [scope for scope in _stack if scope is not self]
        if others:
            held = {id(m) for scope in others for root in scope.raw_modules.values()
                    for m in root.modules()}
            if any(id(m) in held for m in _uncompiled(module).modules()):
                # A module made once, outside the model_fn (`NET = ...; get_module("net",
                # lambda: NET)`, or inside a new one), which training holds: an evaluation
                # inside the training (InMemoryEvaluatorHook) restores, sets modes on, runs
                # (batch norm) and may change (copy_to) its own copy.
                logger.info("get_module(%r): the factory returned a module the training "
                            "holds; this %s scope uses a copy of it", name, self.mode)
                module = copy.deepcopy(module)
        # torch.compile's module: its variables, checkpoints and exports are
        # the module it compiled (no `_orig_mod` in their names)
        original = _uncompiled(module)
        if self._restore is not None:
            state = _by_variable_names(name, original, self._restore["modules"],
                                       self._restore_path)
            if state is None:
                raise ValueError(
                    f"get_module({name!r}): the checkpoint {self._restore_path} has no "
                    f"module {name!r} (it has {sorted(self._restore['modules'])}); "
                    "a model_dir must keep the same model, use warm_start_from for a new one")
            state = _uncompiled_state(state)
            _refuse_rounding(name, state, original, self._restore_path)
            try:
                original.load_state_dict(state)
            except RuntimeError as e:
                raise ValueError(f"get_module({name!r}): cannot restore from "
                                 f"{self._restore_path}: "
                                 f"{_misfit(name, original, state) or e}") from None
        elif self._warm_start is not None:
            self._warm_start.apply(name, original)
        self._refuse_clashes(name, original)
        self.raw_modules[name] = original
        if self.optimizers and self.mode == ModeKeys.TRAIN:   # (checked after the step)
            self._made_late.update((id(p), (p, name)) for p in original.parameters()
                                   if p.requires_grad)
        placed = self.strategy.extended.create_module(name, module)
        placed.train(self.mode == ModeKeys.TRAIN)
        self.modules[name] = placed
        if self._fresh_first_step():
            self._keep_initial_statistics(name, original)
        return placed

    def _refuse_clashes(self, name: str, module: torch.nn.Module) -> None:
        """A module whose variables are named as another's other variables
        (`a` holding `b`, and a new `a/b`) would be one variable in a
        checkpoint's names, which TF refuses ("Variable ... already exists");
        a module holding another's very tensors (`a` made of `a/b`) is not."""
        names = {var_name(name, key): id(t)
                 for key, t in module.state_dict(keep_vars=True).items()}
        for owner, other in self.raw_modules.items():
            if owner in self.slots or not (owner.startswith(name + "/")
                                           or name.startswith(owner + "/")):
                continue
            clash = {n for key, t in other.state_dict(keep_vars=True).items()
                     if names.get(n := var_name(owner, key), id(t)) != id(t)}
            if clash:
                raise ValueError(
                    f"get_module({name!r}): its variable {min(clash)} is also module "
                    f"{owner!r}'s: give one of them another name (TF: Variable "
                    f"{min(clash)} already exists)")

    def _fresh_first_step(self) -> bool:
        """A training run's first step, not resumed (warm-started or not)."""
        return self._restore is None and not self._first_step_over \
            and self.mode == ModeKeys.TRAIN

    def _keep_initial_statistics(self, name: str, module: torch.nn.Module) -> None:
        """The initial values of the buffers that `module`'s training forward
        passes move (batch norm's statistics: TF's moving_mean and
        moving_variance), for moving averages begun after the first of them:
        TF's averages start from a variable's initialized value."""
        for prefix, sub in module.named_modules():
            if getattr(sub, "track_running_stats", False) is True \
                    or getattr(sub, "updates_buffers_in_forward", False) is True:
                for key, buffer in sub.named_buffers(prefix, recurse=False):
                    if buffer.is_floating_point() and not is_lazy(buffer):
                        self.initial_buffers[var_name(name, key)] = buffer.detach().clone()

    def get_slots(self, variable: str) -> Slots:
        """The slots of the variable named `variable` (made on first call)."""
        found = self.slots.get(variable)
        if found is None:
            if variable in self.raw_modules:
                raise ValueError(f"{variable!r} names both a module and a variable of the model; "
                                 "its slots (moving averages) need a name of their own")
            saved = None if self._restore is None else self._restore["modules"].get(variable, {})
            found = self.slots[variable] = self.raw_modules[variable] = Slots(
                variable, saved, self._restore_path,
                self._warm_start if self._restore is None else None)
        return found

    def variable_names(self) -> Dict[int, str]:
        """{id: variable name} of the parameters and buffers of the model's
        modules, as model_fn sees them and as they are saved."""
        if self._names_of != len(self.raw_modules):
            names = {}
            for modules in (self.raw_modules, self.modules):
                for owner, module in modules.items():
                    if owner in self.slots:
                        continue
                    for key, tensor in [*module.named_parameters(), *module.named_buffers()]:
                        names.setdefault(id(tensor), var_name(owner, key))
            self._names, self._names_of = names, len(self.raw_modules)
        return self._names

    def run_after_update(self) -> None:
        """Run what waits for this training step's update (`after_update`)."""
        todo, self.after_update = self.after_update, []
        for fn in todo:
            fn()

    def create_grad_scaler(self, name: str, factory) -> torch.amp.GradScaler:
        scaler = factory()
        if not isinstance(scaler, torch.amp.GradScaler):
            raise TypeError(f"get_grad_scaler({name!r}): the factory must return a "
                            f"torch.amp.GradScaler, got {type(scaler).__name__}")
        if scaler.is_enabled() and self.strategy.extended.reduces_in_optimizer_step:
            raise ValueError(
                f"get_grad_scaler({name!r}): this strategy (ReductionToOneDevice, "
                "CentralStorageStrategy) reduces the replicas' gradients in the optimizer's "
                "step, after a GradScaler has looked for infs in each replica's own: one "
                "replica would skip a step the others make, and they would wait for it for "
                "ever. Use MirroredStrategy's default cross_device_ops (gradients reduced in "
                "backward), or no loss scaler (bfloat16 needs none)")
        saved = self._restore.get("grad_scalers", {}).get(name) if self._restore else None
        if saved:   # (a disabled scaler saves {})
            scaler.load_state_dict(saved)
        elif self._restore is not None and self.mode == ModeKeys.TRAIN and scaler.is_enabled():
            logger.info("get_grad_scaler(%r): the checkpoint %s has no loss scale of that "
                        "name; it starts at %s", name, self._restore_path, scaler.get_scale())
        _note_skips(scaler, self)
        self.grad_scalers[name] = scaler
        return scaler

    def create_optimizer(self, name: str, factory, var_list=None):
        restoring = self._restore is not None and self.mode == ModeKeys.TRAIN
        saved = self._restore.get("optimizer_var_names", {}).get(name) if restoring else None
        if saved and any("/module/" in n for n in saved):
            saved = self._restore["optimizer_var_names"][name] = self._unwrapped_names(saved)
        params, var_names = self._trainable(var_list, name, saved)
        if not params and self._absent:   # (var_list moved to other variables)
            self._raise_absent()
        if not params:
            raise ValueError(f"get_optimizer(name={name!r}): there are no trainable "
                             "parameters; create the modules with get_module first")
        training = self.mode == ModeKeys.TRAIN
        self._building, self.step_in_factory = name, 0
        try:
            optimizer = self.strategy.extended.create_optimizer(name, factory, params)
        finally:
            self._building = None
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"get_optimizer(name={name!r}): the factory must return a "
                            f"torch.optim.Optimizer, got {type(optimizer).__name__}")
        followed = self._scheduled_groups(name, optimizer)
        inputs = FactoryInputs(name, factory, optimizer) if training else None
        schedules = sum(1 for _, site in followed if self.rates[site].in_factory)
        if training and self.step_in_factory > schedules:
            logger.warning(
                "get_optimizer(name=%r): its factory read est.get_global_step(), but it runs "
                "once, on the first step: what it computed from the step (but through "
                "est.learning_rate_decay's schedules, recomputed every step) stays that "
                "step's. Compute such a number in model_fn and give it to the factory (`lr = "
                "...; est.get_optimizer(lambda p: torch.optim.Adam(p, lr=lr))`: then followed "
                "at every step, as TF reads a rate tensor); a canned estimator's optimizer "
                "takes a changing rate from those schedules only", name)
        var_names = self._names_in_groups(optimizer, params, var_names)
        built_with = _hyperparameters(optimizer)
        for i, _ in followed:   # (a schedule's rate: set at every step)
            del built_with[i]["lr"]
        if restoring and name not in self._restore["optimizers"]:
            held = self._restore.get("optimizer_var_names")
            others = {n: o for o, names in (held or {}).items() for n in names}
            if held is None or any(n in others for n in var_names):
                taken = sorted({others[n] for n in var_names if n in others})
                raise ValueError(f"get_optimizer(name={name!r}): the checkpoint "
                                 f"{self._restore_path} has no optimizer {name!r}"
                                 + (f" (its optimizer {', '.join(map(repr, taken))} is over "
                                    "these variables: renamed?)" if taken else ""))
            # made after the checkpoint was written (an optimizer a later step
            # makes), over variables no optimizer there holds: a fresh one
            logger.warning("get_optimizer(name=%r): the checkpoint %s has no optimizer %r "
                           "(one made after it was written?): it starts fresh", name,
                           self._restore_path, name)
            restoring = False
        if restoring:
            state = self._restore["optimizers"][name]
            kind = self._restore.get("optimizer_kinds", {}).get(name)
            missing = checkpoint.missing_slots(optimizer, state, kind)
            if missing:
                if kind == checkpoint.optimizer_kind(optimizer):   # (set otherwise)
                    changes = checkpoint.setting_changes(optimizer, state)
                    was, now = (", ".join(f"{k}={v[i]!r}" for k, v in changes.items())
                                for i in (0, 1))
                    what = f"a {kind} with {was}, which has no {missing} that one with {now}"
                else:
                    what = (f"{'a ' + kind if kind else 'an optimizer (its class not recorded)'}"
                            f", which has no {missing} that a "
                            f"{checkpoint.optimizer_kind(optimizer)}")
                raise ValueError(
                    f"get_optimizer(name={name!r}): the checkpoint {self._restore_path} holds "
                    f"the state of {what} keeps: a model_dir keeps the same "
                    "model; use warm_start_from for a new one (there another kind of "
                    "optimizer's state starts fresh)")
            state, groups_from = _in_this_order(state, saved, var_names, optimizer)
            try:
                optimizer.load_state_dict(state)
            except ValueError as e:   # (torch's: groups of other sizes)
                sizes = [len(g["params"]) for g in state["param_groups"]]
                raise ValueError(
                    f"get_optimizer(name={name!r}): cannot restore its state from "
                    f"{self._restore_path}: the checkpoint's param groups hold {sizes} "
                    f"variables, these {[len(g['params']) for g in optimizer.param_groups]} "
                    f"({e}). A model_dir keeps the same model (a parameter frozen now, not a "
                    "module's, is left out by requires_grad); use warm_start_from for a new "
                    "one") from None
            self._keep_changed_hyperparameters(name, optimizer, built_with, state, groups_from)
            if any("initial_lr" in group for group in state["param_groups"]):
                logger.warning(
                    "get_optimizer(name=%r): a torch LR scheduler drove this optimizer (its "
                    "param groups hold 'initial_lr'), and a scheduler's state is not in the "
                    "checkpoint: one made anew restarts its schedule from its first step. Use "
                    "est.learning_rate_decay's schedules (rates of the global step, restored "
                    "exactly), or set the optimizer's rates from est.get_global_step()", name)
        elif self._warm_start is not None and self._restore is None \
                and self.mode == ModeKeys.TRAIN:
            self._warm_start.apply_optimizer(optimizer, var_names, name)
        self.optimizers[name] = optimizer
        if self._fresh_first_step():
            self._first_step_watches.append(
                optimizer.register_step_post_hook(self._note_first_updates))
        self.optimizer_var_names[name] = var_names
        self.optimizer_built_with[name] = built_with
        if inputs:
            self.factory_inputs[name] = inputs
        if followed:
            self.followed[name] = followed
            self.follow_rates(name, optimizer)   # (a restored rate is the last step's)
            optimizer.register_step_pre_hook(self._rates_at_step(name))
        elif self.mode == ModeKeys.TRAIN and self._unfollowed is None:
            sites = {site: rate.value for site, rate in self.rates.items()
                     if rate.step == self.global_step and not rate.in_factory}
            if sites:   # model_fn computed a schedule this optimizer does not take
                self._unfollowed = _Unfollowed(name, [g.get("lr") for g in
                                                      optimizer.param_groups], sites)
        return optimizer

    def _note_first_updates(self, optimizer, args, kwargs) -> None:
        self.updated_in_first_step.update(p for group in optimizer.param_groups
                                          for p in map(id, group["params"]))

    def _keep_changed_hyperparameters(self, name: str, optimizer, built_with: list,
                                      state: dict, groups_from: Optional[list]) -> None:
        """A hyperparameter the factory now sets otherwise than it did for the
        checkpoint's run (`params.learning_rate` changed for a resumed run) is
        the factory's, as TF's, whose rates are model_fn's and not in its
        checkpoints; one the factory sets as before keeps the checkpoint's
        value, as torch's load_state_dict (a rate the run changed by hand).
        A checkpoint that does not say what its factory gave (written before
        it was recorded) is held to its groups' values. `groups_from`: the
        checkpoint's group of each group here, where they were reordered."""
        before = self._restore.get("optimizer_built_with", {}).get(name)
        if before and groups_from is not None:
            before = [before[k] if k is not None else new
                      for k, new in zip(groups_from, built_with)]
        before = before or [
            {k: v for k, v in group.items() if k != "params"} for group in state["param_groups"]]
        if len(before) != len(built_with):
            return
        changed = []
        for i, (group, old, new) in enumerate(zip(optimizer.param_groups, before, built_with)):
            for key, value in new.items():
                if key not in old:   # it moved with the step in that run: this step's
                    group[key] = value
                elif not _same(old[key], value):
                    changed.append(f"{key} {group.get(key)!r} -> {value!r}" +
                                   (f" (param group {i})" if len(built_with) > 1 else ""))
                    group[key] = value
        if changed:
            logger.info("get_optimizer(name=%r): %s, as the factory now gives (the "
                        "checkpoint's run was given other values)", name, ", ".join(changed))

    def built_optimizer(self, name: str, factory=None) -> Optional[torch.optim.Optimizer]:
        """The optimizer `name` if built (its followed rates at this step, and
        the numbers this call's `factory` was given where they moved), else None."""
        optimizer = self.optimizers.get(name)
        if optimizer is not None and self.followed and name in self.followed:
            self.follow_rates(name, optimizer)
        if optimizer is not None and self.factory_inputs and name in self.factory_inputs:
            for i, key in self.factory_inputs[name].follow(factory, optimizer):
                # (not the factory's one value: a resumed run takes its own then)
                self.optimizer_built_with[name][i].pop(key, None)
        if self._unfollowed is not None and optimizer is not None:
            self._watch_unfollowed(name, optimizer)
        return optimizer

    def _watch_unfollowed(self, name: str, optimizer: torch.optim.Optimizer) -> None:
        """Warn, once, where model_fn computes a schedule that moves while the
        optimizer built without it keeps the rate its factory was given (BERT's
        warmup blended with `polynomial_decay` by arithmetic: another number,
        which no optimizer follows; the model then trains at the first step's
        rate, 0.0 in a warmup). A rate set by hand (a callable train_op setting
        `group["lr"]`) stops the watch, judged a step after the schedule moved."""
        watch = self._unfollowed
        if watch.name != name:
            return
        if [g.get("lr") for g in optimizer.param_groups] != watch.lrs or watch.steps > 10000:
            self._unfollowed = None   # its rates move: set each step by the user
            return
        watch.steps += 1
        if not watch.moved:
            watch.moved = any(site in self.rates and self.rates[site].value != value
                              for site, value in watch.sites.items())
            return
        self._unfollowed = None
        code = next(iter(watch.sites))[0]
        logger.warning(
            "get_optimizer(name=%r): model_fn (%s, in %s) computes a learning-rate schedule "
            "that moves, but the optimizer's rate stays at %s, the number its factory was "
            "given when it was built: a rate computed from the schedule by arithmetic (a "
            "warmup blended in, `2 * lr`) is another number, which the optimizer does not "
            "follow. Give the factory the schedule's own value, or set the rate each step in a "
            "callable train_op (`for group in optimizer.param_groups: group['lr'] = lr`)",
            name, code.co_filename, code.co_name, watch.lrs[0])

    # -- learning rates that follow their schedule ------------------------------
    def note_rate(self, rate: float, site: tuple, at: Optional[Callable[[int], float]]):
        """A schedule (`est.learning_rate_decay`) computed `rate` at `site`
        (its caller's code and instruction); `at(step)` recomputes it for
        another global step where its step argument was this one."""
        self.rates[site] = _Rate(self.global_step, rate, at, self._building is not None)

    def _scheduled_groups(self, name: str, optimizer) -> list:
        """[(group index, call site)] of the groups whose learning rate a
        schedule computed in this call."""
        out = []
        for i, group in enumerate(optimizer.param_groups):
            lr = group.get("lr")
            for site, rate in self.rates.items():
                if rate.value is lr:
                    if rate.in_factory and rate.at is None:
                        raise ValueError(
                            f"get_optimizer(name={name!r}): its factory's learning rate comes "
                            f"from a schedule given a step other than est.get_global_step() "
                            f"({site[0].co_filename}, in {site[0].co_name}); the factory "
                            "runs once, so the rate would never change. Compute the rate in "
                            "model_fn, outside the factory (`lr = ...; est.get_optimizer("
                            "lambda p: torch.optim.SGD(p, lr=lr))`): it is then given to the "
                            "optimizer at every step")
                    out.append((i, site))
                    break
        return out

    def follow_rates(self, name: str, optimizer: torch.optim.Optimizer,
                     by_hand_kept: bool = False) -> None:
        """Each followed group's rate at this step: what its schedule computed
        in this model_fn call; computed in the factory, or once before a
        custom loop from the global step, recomputed for this step.
        `by_hand_kept`: a rate set otherwise since the last one set here is
        left (the user's own, as set each step)."""
        step, groups = self.global_step, optimizer.param_groups
        _, last = self._rates_set.get(name, (None, {}))
        for i, site in self.followed[name]:
            rate = self.rates[site]
            if by_hand_kept and i in last and groups[i]["lr"] != last[i]:
                continue
            if rate.in_factory or (rate.at is not None and rate.step != step):
                groups[i]["lr"] = rate.at(step)
            elif rate.step == step:   # (not computed in this call: left as it was)
                groups[i]["lr"] = rate.value
        self._rates_set[name] = (step, {i: groups[i]["lr"] for i, _ in self.followed[name]})

    def _rates_at_step(self, name: str) -> Callable:
        """An optimizer step pre-hook: the followed rates at the step it makes
        where nothing set them for it. A custom loop computes its schedule
        once, before `while not sess.should_stop()` (TF's cifar10_train:
        `lr = exponential_decay(..., global_step, ...)`), and steps the
        optimizer it built then; TF reads the rate tensor at every step, and
        here the first step's rate stayed for the whole run."""
        def hook(optimizer, args, kwargs):
            if self._rates_set.get(name, (None,))[0] != self.global_step:
                self.follow_rates(name, optimizer, by_hand_kept=True)
        return hook

    def create_metric(self, name: str, factory):
        metric = self.strategy.extended.create_metric(factory())
        self.metrics[name] = metric
        return metric

    def reported_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss a training step reports (logs, summarizes) from this
        replica's `loss`: the replicas' mean, or, after a loss reduced with
        SUM, their sum, as TF1's Estimator reduces it for reporting."""
        reported = self.strategy.extended.reduce_loss(loss)
        replicas = self.strategy.num_replicas_in_sync
        return reported * replicas if self.loss_summed and replicas > 1 else reported

    def forget_call(self) -> None:
        """Before a new model_fn call: TF's unique names and the collections
        start again (the session calls it before each step that used them)."""
        self.name_uses.clear()
        self.collections.clear()

    @contextlib.contextmanager
    def records_discarded(self):
        """What model code records in this block (summaries, named tensors, the
        unique names it takes) is dropped after it: a strategy's extra forward
        (a lazy module's parameters made before DDP wraps it) leaves no trace."""
        due, self.summaries_due = self.summaries_due, False
        kept = (dict(self.name_uses), {k: list(v) for k, v in self.collections.items()},
                dict(self.named_tensors))
        try:
            yield
        finally:
            self.summaries_due = due
            for live, saved in zip((self.name_uses, self.collections, self.named_tensors), kept):
                live.clear()
                live.update(saved)

    def unique_name(self, name: str) -> str:
        """`name`, then `name_1`, `name_2`, ... for its later uses within one
        model_fn call, never a name already given (TF's `Graph.unique_name`:
        two `metrics.auc` give `auc`, `auc_1`, then `name="auc_1"` gives
        `auc_1_1`; names compared without case). The session forgets the
        uses before each step."""
        key = name.lower()
        uses = self.name_uses.get(key, 0)
        self.name_uses[key] = uses + 1
        if uses == 0:
            return name
        while f"{key}_{uses}" in self.name_uses:
            uses += 1
        self.name_uses[f"{key}_{uses}"] = 1
        return f"{name}_{uses}"

    def _apply_mode(self) -> None:
        """Modules in train() mode in TRAIN, eval() mode otherwise (dropout off,
        batch-norm on its running statistics)."""
        training = self.mode == ModeKeys.TRAIN
        for module in self.modules.values():
            if module.training != training:
                module.train(training)

    def _trainable(self, var_list, name: str, saved: Optional[list]):
        """Parameters for optimizer `name` and their variable names, in creation
        order: the trainable ones (`requires_grad`), as TF's `minimize` takes
        the variables trainable when it is built (no slots for a frozen
        embedding table; a frozen module unfrozen later given an optimizer of
        its own is stepped by that one alone). Resumed, those of the
        checkpoint's optimizer (`saved`): a layer frozen now, in a window of
        steps, keeps its state, and one unfrozen since its first run, which
        an optimizer of its own steps, stays out, as in a run never stopped.
        Those left out are checked after the step (`check_left_out`)."""
        names = {id(p): var_name(m, k)
                 for m, mod in self.raw_modules.items() for k, p in mod.named_parameters()}
        if var_list is None:
            params = [p for mod in self.raw_modules.values() for p in mod.parameters()]
        else:
            params = []
            for item in (var_list if isinstance(var_list, (list, tuple)) else [var_list]):
                params.extend(item.parameters() if isinstance(item, torch.nn.Module) else [item])
        seen, out = set(), []
        for p in params:
            if id(p) in seen:
                continue
            seen.add(id(p))
            by_name = saved and id(p) in names   # (a parameter not a module's: by requires_grad)
            if names.get(id(p)) in saved if by_name else p.requires_grad:
                out.append(p)
            elif by_name and p.requires_grad:   # (must be another optimizer's by the step's end)
                self._absent[id(p)] = (p, names[id(p)], name, saved)
            else:
                self._left_out.setdefault(id(p), (p, names.get(id(p), "a parameter")))
        return out, [names.get(id(p), f"param_{i}") for i, p in enumerate(out)]

    def check_left_out(self) -> None:
        """After a training step (the session's): a trainable parameter that a resumed
        optimizer's checkpoint did not hold must be held by another optimizer
        (one of its own), else the model is not the checkpoint's (an error);
        one left out for being frozen that is trainable now and no optimizer
        holds is said once (gradual unfreezing: nothing would step it). One
        test where nothing was left out, a `requires_grad` read of each frozen
        one else."""
        self._first_step_over = True
        if self.initial_buffers:
            self.initial_buffers.clear()
        if self._first_step_watches:   # (the first step is over)
            for watch in self._first_step_watches:
                watch.remove()
            self._first_step_watches.clear()
            self.updated_in_first_step.clear()
        if self._absent:
            self._forget_held(self._absent)
            if self._absent:
                self._raise_absent()
        if self._made_late:
            self._say_made_late()
        if not (self._left_out and any(p.requires_grad for p, _ in self._left_out.values())):
            return
        self._forget_held(self._left_out)
        unfrozen = [(key, name) for key, (p, name) in self._left_out.items() if p.requires_grad]
        for key, _ in unfrozen:   # (each said once; one frozen still is watched)
            del self._left_out[key]
        if unfrozen:
            logger.warning(
                "%s trainable now (requires_grad True), but no optimizer steps it: each was "
                "frozen when get_optimizer built its optimizer, over the parameters "
                "trainable then (TF's minimize: the trainable variables when it is built). "
                "To train a layer unfrozen later, give it an optimizer of its own when it is "
                "unfrozen: est.get_optimizer(..., name='backbone', var_list=...) (resumed "
                "from a checkpoint written before, it starts fresh)",
                ", ".join(name for _, name in unfrozen))

    def _unwrapped_names(self, saved: list) -> list:
        """Checkpoints written under a synchronous strategy before its
        wrapped modules (DDP) answered with their own names called the
        variables of one inside another module `outer/0/module/weight`:
        those names as they are now (`outer/0/weight`) where the model has
        them so."""
        current = {var_name(m, k) for m, mod in self.raw_modules.items()
                   for k, _ in mod.named_parameters()}
        return [n if n in current or n.replace("/module/", "/") not in current
                else n.replace("/module/", "/") for n in saved]

    def _say_made_late(self) -> None:
        """A module first made after the optimizers (a head added at a later
        step, one made in a callable train_op) that no optimizer holds by the
        end of that step: nothing steps it (its weights stay as made)."""
        self._forget_held(self._made_late)   # (and those frozen since: not to train)
        late = sorted({name for p, name in self._made_late.values() if p.requires_grad})
        self._made_late.clear()
        if late:
            logger.warning(
                "module %s was first made (get_module) after get_optimizer built %s over the "
                "parameters there were then (TF's minimize: the trainable variables when it "
                "is built), and no optimizer holds its parameters: it is not trained. Make it "
                "in every model_fn call before get_optimizer, or give it an optimizer of its "
                "own (est.get_optimizer(..., name=..., var_list=[module]))",
                ", ".join(repr(n) for n in late),
                ", ".join(repr(n) for n in self.optimizers))

    def _forget_held(self, left: dict) -> None:
        """Drop from `left` the parameters an optimizer holds."""
        held = {id(p) for opt in self.optimizers.values() for group in opt.param_groups
                for p in group["params"]}
        for key in [k for k in left if k in held]:
            del left[key]

    def _raise_absent(self) -> None:
        _, _, name, saved = next(iter(self._absent.values()))
        absent = [n for _, n, of, _ in self._absent.values() if of == name]
        self._absent.clear()
        raise ValueError(
            f"get_optimizer(name={name!r}): the checkpoint {self._restore_path} has no "
            f"optimizer state for {absent} (its optimizer {name!r} is over {saved}), and no "
            "other optimizer holds them: a model_dir keeps the same model (a layer frozen "
            "when the optimizer was built and trainable since needs an optimizer of its own: "
            "est.get_optimizer(..., name=..., var_list=...)); use warm_start_from for a new one")

    def _names_in_groups(self, optimizer, params, var_names) -> list:
        """The variable names of the optimizer's parameters in its param_groups'
        order, by which its state_dict indexes them (a factory building groups,
        BERT's decay and no-decay, reorders `params`)."""
        by_id = dict(zip(map(id, params), var_names))
        in_groups = [p for group in optimizer.param_groups for p in group["params"]]
        if any(id(p) not in by_id for p in in_groups):   # (a parameter from elsewhere)
            by_id = {**{id(p): var_name(m, k) for m, mod in self.raw_modules.items()
                        for k, p in mod.named_parameters()}, **by_id}
        return [by_id.get(id(p), f"param_{i}") for i, p in enumerate(in_groups)]

    # -- saving ----------------------------------------------------------------
    def state(self) -> dict:
        """The checkpoint contents, all tensors on the CPU. Not the metrics'
        running state: as TF's metric variables (local variables), they are
        neither saved nor restored, each session's start from zero."""
        return {
            "modules": {n: _cpu(m.state_dict()) for n, m in self.raw_modules.items()},
            "optimizers": {n: _cpu(o.state_dict()) for n, o in self.optimizers.items()},
            "optimizer_var_names": dict(self.optimizer_var_names),
            "optimizer_built_with": _cpu(self.optimizer_built_with),
            "optimizer_kinds": {n: checkpoint.optimizer_kind(o)
                                for n, o in self.optimizers.items()},
            "global_step": self.global_step,
            **({"grad_scalers": {n: _cpu(s.state_dict()) for n, s in self.grad_scalers.items()}}
               if self.grad_scalers else {}),
        }

    # -- activation --------------------------------------------------------------
    def __enter__(self):
        global _current
        _stack.append(self)
        _current = self
        self.strategy.extended.enter_scope(self)
        self._apply_mode()
        return self

    def __exit__(self, *exc):
        global _current
        _remove_last(_stack, self)   # (not pop: a predict generator closed late exits
        _current = _stack[-1] if _stack else None   # under scopes entered after it)
        self.strategy.extended.exit_scope(self)
        if _current is not None:   # an evaluation inside training: back to train()
            _current._apply_mode()


def _remove_last(stack: list, item) -> None:
    """Remove `item`'s last entry in `stack` (by identity)."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is item:
            del stack[i]
            return


def _in_this_order(state: dict, saved: Optional[list], names: list, optimizer) -> tuple:
    """(`state`, the checkpoint's optimizer state, arranged as `optimizer`'s
    param groups order its variables (`names`), where the checkpoint's
    (`saved`) are the same variables in another order (a factory building its
    groups otherwise), or more (a variable frozen since, whose state is left
    out, as TF's Saver leaves what the graph no longer has): torch's
    load_state_dict pairs them by position (Adam's
    moments of a [4] bias on a [5] one: a failed step; of equal shapes,
    swapped without a word); the checkpoint's group index of each group
    here (None: one made of several, which keeps its built values), or None
    where nothing moved."""
    if not saved or saved == names or not set(names) <= set(saved) \
            or len(set(names)) != len(names) or len(set(saved)) != len(saved):
        return state, None
    index = {n: i for i, n in enumerate(saved)}
    holder = {i: g for g, group in enumerate(state["param_groups"]) for i in group["params"]}
    groups, groups_from, start = [], [], 0
    for group in optimizer.param_groups:
        ids = [index[n] for n in names[start:start + len(group["params"])]]
        held = {holder.get(i) for i in ids}
        g = held.pop() if len(held) == 1 else None
        groups_from.append(g)
        source = state["param_groups"][g] if g is not None else group
        groups.append({**{k: v for k, v in source.items() if k != "params"},
                       "params": list(range(start, start + len(ids)))})
        start += len(ids)
    moved = {new: state["state"][index[n]] for new, n in enumerate(names)
             if index[n] in state["state"]}
    return {**state, "state": moved, "param_groups": groups}, groups_from


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list:
    """Each param group's settings but its parameters."""
    return [{k: v.detach().clone() if isinstance(v, torch.Tensor) else v
             for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except (RuntimeError, TypeError, ValueError):   # (tensors of several values)
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)


def _cpu(obj):
    """`obj` with its tensors on the CPU and numpy's numbers as Python's
    (`SGD(p, lr=np.float64(...))`: a checkpoint holding numpy scalars is not
    read back by torch.load(weights_only=True))."""
    if isinstance(obj, torch.Tensor):   # (a state_dict's are detached already)
        return obj if obj.device.type == "cpu" and not obj.requires_grad else obj.detach().cpu()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj


def current() -> ModelScope:
    if _current is None:
        raise RuntimeError("No model scope is active: get_module/get_optimizer/"
                           "get_global_step are called inside a model_fn (or a "
                           "MonitoredSession), as tf.get_variable is inside a graph")
    return _current


# -- public API (re-exported by `estimator`) ------------------------------------
def get_module(name: str, factory: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """Build the module `name` with `factory()` on first call; return it after.

    TF: `tf.compat.v1.get_variable` / a Keras layer built once in the graph.
    The returned module is placed (and, under a data-parallel strategy,
    wrapped) by the active strategy.
    """
    scope = _current or current()   # (called every step: no call when a scope is active)
    module = scope.modules.get(name)
    if module is None:
        module = scope.create_module(name, factory)
    return module


def get_optimizer(factory: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer],
                  name: str = "optimizer", var_list=None) -> torch.optim.Optimizer:
    """Build the optimizer `name` as `factory(params)` on first call; return it after.

    `params` are the trainable parameters of `var_list` (modules or
    parameters; default every module of the scope), as `minimize(var_list=)`.
    Return it as `EstimatorSpec(train_op=...)`: the framework computes the
    gradient of the loss, applies it and increments the global step. Two
    optimizers need two names (a call whose `var_list` differs from the one
    the named optimizer was built over is an error).

    The factory runs once, but TF reads a learning-rate tensor every step: a
    rate the factory was given from `est.learning_rate_decay` (computed in
    model_fn, or in the factory from `get_global_step()`) is given to the
    optimizer again at every step, as the schedule computes it then; so is
    a number model_fn computed by its own arithmetic (a warmup) and gave
    the factory as a variable (`lambda p: Adam(p, lr=lr)`, or a
    `functools.partial`), whenever this call's differs from the last.
    """
    scope = _current or current()
    if var_list is not None and not isinstance(var_list, (list, tuple, torch.nn.Module)):
        var_list = list(var_list)   # (net.parameters(), a generator)
    optimizer = scope.built_optimizer(name, factory)
    if optimizer is None:
        optimizer = scope.create_optimizer(name, factory, var_list)
        scope.optimizer_var_lists[name] = _var_list_key(var_list)
    elif var_list is not None or scope.optimizer_var_lists.get(name) is not None:
        if _var_list_key(var_list) != scope.optimizer_var_lists.get(name):
            raise ValueError(
                f"get_optimizer(name={name!r}) was built over other variables than this "
                f"call's var_list: it returns the optimizer of that name, so two optimizers "
                f"(TF1 makes a new one at each `tf.train.XOptimizer(...)`) need two names, "
                f"e.g. get_optimizer(..., var_list=..., name='d_optimizer')")
    return optimizer


def get_grad_scaler(factory: Callable[[], torch.amp.GradScaler],
                    name: str = "grad_scaler") -> torch.amp.GradScaler:
    """Build the loss scaler `name` with `factory()` on first call; return it after.

    TF: the dynamic loss scale of `enable_mixed_precision_graph_rewrite` /
    `MixedPrecisionLossScaleOptimizer`. Use it in a callable train_op
    (`scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`). Its
    state (the scale, the count of good steps) is checkpointed and restored,
    as TF's loss-scale variables are. A step in which it skipped every
    optimizer step it was asked to make (gradients not finite) is not counted
    in the global step, as TF's skipped update does not increment it (except
    under ParameterServerStrategy, whose workers take a step number before
    they compute), and the gradients it skipped are freed, as TF discards them.
    """
    scope = _current or current()
    scaler = scope.grad_scalers.get(name)
    if scaler is None:
        scaler = scope.create_grad_scaler(name, factory)
    return scaler


def _note_skips(scaler: torch.amp.GradScaler, scope: ModelScope) -> None:
    """Make `scaler.unscale_(optimizer)` (`step`'s too) find the infs of
    the gradients the strategy averages (those set by hand, see
    `average_gradients_set_by_hand`), and `scaler.step(optimizer)` note in
    `scope` whether it stepped `optimizer` or skipped its step: seen by the
    optimizer's step count, or,
    for one that skips in its own kernel (fused Adam, SGD: torch's
    `_step_supports_amp_scaling`, whose step is always called), by the
    scaler's inf count (a host sync, as the unfused path makes anyway)."""
    scaled_step, steps = scaler.step, {}

    def counted(optimizer, args, kwargs):
        steps[id(optimizer)] += 1

    def step(optimizer, *args, **kwargs):
        if id(optimizer) not in steps:
            steps[id(optimizer)] = 0
            optimizer.register_step_post_hook(counted)
        before = steps[id(optimizer)]
        out = scaled_step(optimizer, *args, **kwargs)
        if getattr(optimizer, "_step_supports_amp_scaling", False) and scaler.is_enabled():
            skipped = sum(v.item() for v in scaler._found_inf_per_device(optimizer).values()) > 0
        else:
            skipped = steps[id(optimizer)] == before
        if skipped:   # (the rows its tables' lookups read: gone with the step, as TF's)
            scope.scaler_skipped.add(id(optimizer))
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if lookups.noted(p):
                        lookups.clear(p)
        else:
            scope.scaler_stepped = True
        return out
    scaler.step = step
    unscale = scaler.unscale_

    def unscale_(optimizer):   # (the replicas' gradients alike first: the same infs found)
        scope.strategy.extended.average_gradients_set_by_hand(optimizer)
        return unscale(optimizer)
    scaler.unscale_ = unscale_


def _var_list_key(var_list) -> Optional[tuple]:
    """What a `var_list` names (its modules or parameters), to tell two apart:
    a ModuleList or ModuleDict by its modules (one made anew each call names
    what the last one did)."""
    if var_list is None:
        return None
    key = []
    for item in var_list if isinstance(var_list, (list, tuple)) else (var_list,):
        if isinstance(item, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            key.append(tuple(map(id, item.children())))
        else:
            key.append(id(item))
    return tuple(key)


def note_rate(rate: float, site: tuple, at: Optional[Callable[[int], float]] = None) -> None:
    """Called by a learning-rate schedule with the rate it computed (a new
    float object), its call site and, where its step argument was the global
    step, `at(step)`: an optimizer given that rate follows the schedule
    (`get_optimizer`). Nothing outside a model scope."""
    if _current is not None:
        _current.note_rate(rate, site, at)


def is_training() -> bool:
    """Whether the active model scope trains (TF: `mode == ModeKeys.TRAIN`, the
    `training=` argument of `tf.layers.dropout` / `batch_normalization`);
    False outside a model scope."""
    return _current is not None and _current.mode == ModeKeys.TRAIN


def current_step() -> Optional[int]:
    """The active model scope's global step; None outside one."""
    return None if _current is None else _current.global_step


def get_global_step() -> int:
    """The number of training steps done (TF: `tf.compat.v1.train.get_global_step`)."""
    scope = current()
    if scope._building is not None:
        scope.step_in_factory += 1
    return scope.global_step


def named_tensor(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Expose `tensor` under `name` for hooks to fetch (TF: naming a graph tensor
    so `LoggingTensorHook(tensors=[name])` can find it). Costs a dict store; the
    value is copied to the host only on steps where a hook asks for it. When a
    hook feeds `name` for this step (`hooks.FeedFnHook`, TF's feed_dict), the
    fed value is returned instead, with `tensor`'s dtype and device. A number
    is a 0-d tensor to hooks (TF's constant: a Python float is float32), and
    is returned as given when not fed; anything else is kept as given.
    "loss" fetches the step's own loss where it has one (its log, summary
    and NaN check, as TF's hooks fetch the loss tensor), "global_step" the
    global step, whatever is named so."""
    if _current is not None:
        value = tensor if isinstance(tensor, torch.Tensor) or not isinstance(
            tensor, numbers.Number) else torch.as_tensor(tensor)
        feed = _current.feed_dict
        if feed is not None and name in feed:
            tensor = value = torch.as_tensor(feed[name], dtype=value.dtype, device=value.device)
        _current.named_tensors[name] = value
    return tensor


def note_loss_reduction(loss: torch.Tensor, summed: bool) -> torch.Tensor:
    """`loss`, a `tf.compat.v1.losses`-style loss just reduced (`summed`: with
    SUM), noted as the model_fn's last loss reduction (TF1's
    `get_loss_reduction`). In training under N synchronous replicas, whose
    gradients the strategies average, a summed loss's gradient is made N
    times its own, so the replicas' gradients add up, as TF1's optimizer
    leaves them for a SUM loss; its value stays this replica's sum, and the
    step reports the replicas' sum (`ModelScope.reported_loss`)."""
    scope = _current
    if scope is None or scope.mode != ModeKeys.TRAIN or scope.strategy is None:
        return loss
    scope.loss_summed = summed
    replicas = scope.strategy.num_replicas_in_sync
    return gradients_summed(loss, replicas) if summed else loss


def add_to_collection(key: str, name: str, value) -> None:
    """Add `value`, named `name`, to the collection `key` of this model_fn call
    (TF: `tf.compat.v1.add_to_collection`, a graph's collections: the losses'
    `loss_collection`). The session empties the collections before each
    step's model_fn call; outside a model scope nothing is kept (as TF eager)."""
    if _current is not None:
        _current.collections.setdefault(key, []).append((name, value))


def get_collection(key: str, scope: Optional[str] = None) -> list:
    """The values in the collection `key` of this model_fn call, in the order
    added; with `scope`, those whose name `re.match`es it (TF's filter)."""
    if _current is None:
        return []
    items = _current.collections.get(key, ())
    return [value for name, value in items if scope is None or re.match(scope, name)]


def unique_name(name: str) -> str:
    """`name`, then `name_1`, ... for its later uses in this model_fn call (TF's
    name scopes); `name` itself outside a model scope."""
    return name if _current is None else _current.unique_name(name)


# -- for estimator.metrics ---------------------------------------------------------
def get_metric(name: str, factory):
    """The metric `name` of the active scope (made unique within one model_fn
    call, as TF's name scopes do), created on first use; a fresh metric when no
    scope is active (standalone use)."""
    if _current is None:
        return factory()
    name = _current.unique_name(name)
    metric = _current.metrics.get(name)
    if metric is None:
        metric = _current.create_metric(name, factory)
    return metric


def updates_metrics() -> bool:
    """Metrics update in TRAIN and EVAL (and with no scope active); PREDICT
    has no labels, and an export's program stays free of metric state."""
    return _current is None or _current.mode != ModeKeys.PREDICT


# -- for estimator.moving_averages ---------------------------------------------------
def get_slots(variable: str) -> Slots:
    """The slots of the active scope's variable named `variable` (TF's
    `slot_creator`), made on first call, saved with the model."""
    return current().get_slots(variable)


def variable_names() -> Dict[int, str]:
    """{id(tensor): variable name} of the active scope's parameters and buffers."""
    return current().variable_names()


def initial_value(name: str, variable: torch.Tensor) -> torch.Tensor:
    """In a fresh run's first training step, the value the model's variable
    `name` had when its module was made, where its module's forward pass
    moves it (batch norm's statistics: TF's `initialized_value()`); else
    `variable` itself."""
    initial = current().initial_buffers.get(name)
    if initial is None or initial.shape != variable.shape:
        return variable
    return initial.to(device=variable.device, dtype=variable.dtype)


def after_update(fn: Callable[[], None]) -> None:
    """Run `fn()` once this training step's update is made (TF: an op under
    `tf.control_dependencies([train_op])`): after the train_op (a custom
    loop's step function), before the global step is counted."""
    current().after_update.append(fn)
