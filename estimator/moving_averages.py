"""Moving averages of the model's variables (TF1: `tf.compat.v1.train.ExponentialMovingAverage`).

    def model_fn(features, labels, mode):
        net = est.get_module("net", ...)
        ema = est.moving_averages.ExponentialMovingAverage(
            0.999, num_updates=est.get_global_step())
        if mode != est.ModeKeys.TRAIN:
            ema.copy_to()          # evaluate and serve on the averages
        ...
        ema.apply()                # updated after this step's update
        return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)

The averages are slots of their variables, saved in the checkpoint under
TF's names (`net/0/weight/ExponentialMovingAverage`) and restored with them.
"""
from __future__ import annotations

import logging
import numbers
import weakref
from typing import Dict, List, Optional, Tuple

import torch

import distribute
from hooks import model_scope
from hooks.mode_keys import ModeKeys

logger = logging.getLogger(__name__)


class ExponentialMovingAverage:
    """TF1's `tf.compat.v1.train.ExponentialMovingAverage(decay, num_updates,
    zero_debias, name)`, for a model_fn (or a custom loop's step) that runs
    every step: build it there, as TF builds it in the graph.

    `apply(var_list)` updates each variable's average after the step's
    training update, wherever in the step it is called: TF's
    `with tf.control_dependencies([train_op]): train_op = ema.apply(...)`
    (after the forward pass of a lazy module, which makes its parameters).
    An average starts at its variable's value when `apply` first sees it: the
    initial value, as TF's, when that is in the first step before the update
    (a buffer's, batch norm's statistics, from before the forward pass).
    Each update is TF's: `decay = min(decay, (1 + n) / (10 + n))` where
    `num_updates` is given, then `average -= (1 - decay) * (average - variable)`.
    `num_updates=est.get_global_step()` reads, as TF's under that dependency,
    the global step after the update, at every update (a number equal to the
    global step when the average is built is taken as the global step: built
    once before a custom loop, it follows the step as TF's tensor does).

    `copy_to(var_list)` in EVAL and PREDICT (and so in exports) gives the
    variables their averages' values: TF1's `Scaffold(saver=Saver(
    ema.variables_to_restore()))`. Not under ParameterServerStrategy's
    training (TF keeps the averages on the ps tasks).

    Averages of other tensors (TF's `apply(losses + [total_loss])`,
    cifar10's loss summaries) take a dict naming each, as TF names them by
    their ops: `apply({"cross_entropy": ce, "total_loss": total})`, saved as
    `cross_entropy/<name>`. As TF's, such an average starts at zero, moves
    towards the mean of the replicas' values, with `num_updates` the global
    step before the update (cifar10 applies them before the gradients), and
    with `zero_debias=True` is divided by `1 - decay ** t` (its `biased` and
    `local_step` kept beside it); `average(ce)` (or `average("cross_entropy")`)
    is its value before this step's update, as TF's summaries read it.
    """

    def __init__(self, decay: float, num_updates: Optional[int] = None,
                 zero_debias: bool = False, name: str = "ExponentialMovingAverage"):
        if isinstance(decay, bool) or not isinstance(decay, (numbers.Real, torch.Tensor)):
            raise TypeError(f"ExponentialMovingAverage: decay must be a number, got {decay!r}")
        if num_updates is not None and (isinstance(num_updates, bool) or not isinstance(
                num_updates, (numbers.Integral, torch.Tensor))):
            raise TypeError(f"ExponentialMovingAverage: num_updates must be an integer (the "
                            f"global step), got {num_updates!r}")
        if not isinstance(name, str) or not name or "/" in name or "." in name:
            raise ValueError(f"ExponentialMovingAverage: name must be a non-empty string "
                             f"without '/' or '.', got {name!r}")
        self._decay = float(decay)
        self._num_updates = None if num_updates is None else int(num_updates)
        self._zero_debias = zero_debias
        self._name = name
        # num_updates=est.get_global_step(): the global step, read at each update
        self._follows_step = (self._num_updates is not None
                              and self._num_updates == model_scope.current_step())
        # apply's {name: (a weak reference to the tensor, its value)}, the last ones
        self._tensors: Dict[str, Tuple[weakref.ref, torch.Tensor]] = {}

    @property
    def name(self) -> str:
        return self._name

    def apply(self, var_list=None) -> None:
        """Update the averages of `var_list` (the model's parameters and
        buffers, modules for their parameters; by default every trainable
        parameter, TF's `tf.trainable_variables()`) after this step's update.
        A dict {name: tensor} averages tensors (see the class). Outside TRAIN
        nothing is updated (TF runs no train_op there)."""
        scope = model_scope.current()
        if isinstance(var_list, dict):
            return self._apply_tensors(scope, var_list)
        if scope.mode != ModeKeys.TRAIN:
            return
        variables, slots = self._slots(scope, var_list, "apply")
        if not variables:   # (TF: apply([]) is a no-op)
            return
        _refuse_parameter_servers(scope)
        if scope.updated_in_first_step:
            _check_not_updated(scope, variables, slots, self._name)
        shadows = self._made(scope, variables, slots)
        self._note_updated(scope, slots)
        model_scope.after_update(lambda: _move(shadows, [v.detach() for v in variables],
                                               self._decay_at(scope, after=True)))

    def _apply_tensors(self, scope, tensors: dict) -> None:
        values = _tensors(scope, tensors)
        self._tensors = {n: (weakref.ref(tensors[n]), v) for n, v in values.items()}
        if scope.mode != ModeKeys.TRAIN or not values:
            return
        _refuse_parameter_servers(scope)
        slots = [scope.get_slots(name) for name in values]
        self._note_updated(scope, slots)
        means = _replica_means(list(values.values()))
        decay = self._decay_at(scope, after=False)
        shadows = [self._tensor_average(scope, s, v) for s, v in zip(slots, means)]
        if not self._zero_debias:
            return model_scope.after_update(lambda: _move(shadows, means, decay))
        biased = [_zeros_slot(s, self._name + "/biased", v) for s, v in zip(slots, means)]
        counts = [_zeros_slot(s, self._name + "/local_step", v, scalar=True)
                  for s, v in zip(slots, means)]

        def debiased():   # (TF's _zero_debias: biased / (1 - decay ** local_step))
            _move(biased, means, decay)
            with torch.no_grad():
                for shadow, value, count in zip(shadows, biased, counts):
                    count.add_(1)
                    kept = 1 - torch.tensor(1.0 - decay, dtype=value.dtype)
                    shadow.copy_(value / (1 - kept ** count))
        model_scope.after_update(debiased)

    def _tensor_average(self, scope, slots, like: torch.Tensor) -> torch.Tensor:
        """The average of a tensor `like`: restored, or from zero (said where
        a restored checkpoint lacks it)."""
        if slots.get(self._name) is None and not slots.restored(self._name):
            logger.warning(
                "ExponentialMovingAverage(%r): the checkpoint %s holds no average of %s (it "
                "was written before it began): it starts from zero now", self._name,
                scope.restore_path, slots.variable)
        return _zeros_slot(slots, self._name, like)

    def _note_updated(self, scope, slots: list) -> None:
        for slot in slots:   # (TF: "Moving average already computed for")
            if slot.updates.get(self._name) is scope.after_update:
                raise ValueError(f"ExponentialMovingAverage({self._name!r}).apply: "
                                 f"{slot.variable} is averaged twice in one step")
            slot.updates[self._name] = scope.after_update

    def _decay_at(self, scope, after: bool) -> float:
        """This step's decay; `num_updates=est.get_global_step()` is the global
        step after the update (`after`) or before it."""
        if self._num_updates is None:
            return self._decay
        n = self._num_updates
        if self._follows_step:
            n = scope.global_step + (after and not scope.step_uncounted)
        return min(self._decay, (1.0 + n) / (10.0 + n))

    def average(self, var) -> Optional[torch.Tensor]:
        """The average of `var`, or None where none was made (TF's `average`);
        of a tensor given to `apply` (or its name there), its value before
        this step's update (from zero where no checkpoint holds it, as TF's
        zeros slot, in EVAL and PREDICT too)."""
        scope = model_scope.current()
        name = self._tensor_name(var)
        if name is not None:   # (TF's zeros slot, made in EVAL and PREDICT too)
            return self._tensor_average(scope, scope.get_slots(name),
                                        self._tensors[name][1]).clone()
        name = _name_of(scope, var, "average")
        slots = scope.get_slots(name)
        if slots.get(self._name) is None and slots.saved(self._name):   # (no step ran yet)
            return slots.slot(self._name, var)
        return slots.get(self._name)

    def average_name(self, var) -> str:
        """The checkpoint name of `var`'s average: `<variable>/<name>`, TF's."""
        name = self._tensor_name(var) or _name_of(model_scope.current(), var, "average_name")
        return f"{name}/{self._name}"

    def _tensor_name(self, var) -> Optional[str]:
        """The name `apply` gave the tensor `var` (or `var`, one of those names)."""
        if isinstance(var, str):
            return var if var in self._tensors else None
        return next((n for n, (t, _) in self._tensors.items() if t() is var), None)

    def copy_to(self, var_list=None) -> None:
        """Give the variables of `var_list` (as `apply`'s) their averages'
        values, in EVAL and PREDICT: evaluate, predict and export on the
        averages (TF1: restoring them with `Saver(ema.variables_to_restore())`
        in the scaffold). In an export the program holds the averages."""
        scope = model_scope.current()
        if scope.mode == ModeKeys.TRAIN:
            raise ValueError(
                "ExponentialMovingAverage.copy_to replaces the variables with their "
                "averages: call it in EVAL and PREDICT only (in TRAIN the model would "
                "train on from the averages)")
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return   # (an export's trace: the program's variables, copied before it)
        if isinstance(var_list, dict):
            raise TypeError("ExponentialMovingAverage.copy_to: the averages of tensors (a dict) "
                            "have no variables to copy to; read them with average()")
        variables, slots = self._slots(scope, var_list, "copy_to")
        done = (self._name, tuple(map(id, variables)))
        if scope.averages_copied == done:   # (every batch of an evaluation)
            return
        with torch.no_grad():
            for variable, average in zip(variables, self._made(scope, variables, slots)):
                variable.copy_(average)
        scope.averages_copied = done

    def _made(self, scope, variables: list, slots: list) -> list:
        """The averages of `variables`, made where they are not: restored, or
        from the variables' values (said where a checkpoint lacks them)."""
        absent = [s.variable for s in slots
                  if s.get(self._name) is None and not s.restored(self._name)]
        if absent:
            logger.warning(
                "ExponentialMovingAverage(%r): the checkpoint %s holds no averages of %s (it "
                "was written before they began, or by a model without them): they start "
                "from the variables' values now", self._name, scope.restore_path,
                ", ".join(absent))
        return [s.slot(self._name, model_scope.initial_value(s.variable, v))
                for v, s in zip(variables, slots)]

    def _slots(self, scope, var_list, method: str) -> Tuple[List[torch.Tensor], list]:
        variables = _variables(scope, var_list, method)
        names = scope.variable_names()
        return variables, [scope.get_slots(names[id(v)]) for v in variables]


def _zeros_slot(slots, name: str, like: torch.Tensor, scalar: bool = False) -> torch.Tensor:
    """The slot `name`, made where it is not from zeros shaped as `like` (a
    0-d tensor of its dtype where `scalar`)."""
    found = slots.get(name)
    if found is not None:
        return found
    return slots.slot(name, like.new_zeros(()) if scalar else torch.zeros_like(like))


def _move(shadows: list, values: list, decay: float) -> None:
    """TF's assign_moving_average, in its order of operations:
    `shadow -= (shadow - value) * (1 - decay)`."""
    with torch.no_grad():
        deltas = torch._foreach_sub(shadows, values)
        torch._foreach_mul_(deltas, 1.0 - decay)
        torch._foreach_sub_(shadows, deltas)


def _refuse_parameter_servers(scope) -> None:
    if scope.strategy.extended.uses_parameter_servers:
        raise ValueError(
            "ExponentialMovingAverage.apply: not built for ParameterServerStrategy's "
            "training (TF keeps the averages on the ps tasks, updated by every worker); "
            "train under a synchronous strategy, or average in a custom loop of your own")


def _tensors(scope, tensors: dict) -> Dict[str, torch.Tensor]:
    """apply's {name: tensor}, checked: names a scope can hold, floating-point
    tensors that are not the model's variables; their values detached."""
    names = scope.variable_names()
    taken, out, seen = set(names.values()), {}, {}
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name or name != name.strip("/") or "//" in name:
            raise ValueError(f"ExponentialMovingAverage.apply: {name!r} cannot name an average "
                             f"(a non-empty name like 'cross_entropy' or 'losses/total')")
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            what = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"ExponentialMovingAverage.apply: {name!r} is {what}; an average's "
                            f"tensor must be half, float or double (TF's rule)")
        if id(tensor) in names:
            raise TypeError(f"ExponentialMovingAverage.apply: {name!r} is the model's variable "
                            f"{names[id(tensor)]}: give variables in a list, tensors in the dict")
        if name in taken:
            raise ValueError(f"ExponentialMovingAverage.apply: {name!r} names a variable of the "
                             f"model: name the tensor otherwise (its average would be saved "
                             f"as that variable's)")
        if id(tensor) in seen:   # (TF: "Moving average already computed")
            raise ValueError(f"ExponentialMovingAverage.apply: {name!r} is the tensor "
                             f"{seen[id(tensor)]!r} names already: give it one name")
        seen[id(tensor)] = name
        out[name] = tensor.detach()
    return out


def _replica_means(values: list) -> list:
    """The replicas' mean of each of `values` (TF's merge_call reducing an
    average's value across the replicas), in one all-reduce."""
    context = distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return values
    flat = context.all_reduce(distribute.ReduceOp.MEAN, torch.cat([v.reshape(-1) for v in values]))
    parts = flat.split([v.numel() for v in values])
    return [p.reshape(v.shape).to(v.dtype) for p, v in zip(parts, values)]


def _variables(scope, var_list, method: str) -> List[torch.Tensor]:
    """The variables `var_list` names, each once, each a floating-point
    parameter or buffer of the model (TF: half, float or double)."""
    names = scope.variable_names()
    if var_list is None:
        out = [p for module in scope.modules.values() for p in module.parameters()
               if p.requires_grad]
    else:
        items = [var_list] if isinstance(var_list, (torch.Tensor, torch.nn.Module)) else var_list
        try:
            items = list(items)
        except TypeError:
            raise TypeError(f"ExponentialMovingAverage.{method}: var_list must be the model's "
                            f"parameters, buffers or modules, got {var_list!r}") from None
        out = []
        for item in items:
            out.extend(item.parameters() if isinstance(item, torch.nn.Module) else [item])
    seen, unique = set(), []
    for variable in out:
        _name_of(scope, variable, method, names)
        if isinstance(variable, torch.nn.parameter.UninitializedTensorMixin):
            raise ValueError(
                f"ExponentialMovingAverage.{method}: {names[id(variable)]} is not made yet (a "
                f"lazy module makes its parameters in its first forward pass): call {method} "
                f"after the forward pass")
        if not variable.is_floating_point():
            raise TypeError(f"ExponentialMovingAverage.{method}: {names[id(variable)]} is "
                            f"{variable.dtype}; the variables must be half, float or double "
                            f"(TF's rule)")
        if id(variable) not in seen:
            seen.add(id(variable))
            unique.append(variable)
    return unique


def _name_of(scope, variable, method: str, names=None) -> str:
    names = scope.variable_names() if names is None else names
    name = names.get(id(variable)) if isinstance(variable, torch.Tensor) else None
    if name is None:
        what = (f"a tensor of shape {list(variable.shape)}" if isinstance(variable, torch.Tensor)
                else repr(variable))
        raise TypeError(
            f"ExponentialMovingAverage.{method}: {what} is not a variable of the model (a "
            f"parameter or buffer of a module made with est.get_module); name other tensors "
            f"in a dict to average them (TF's apply([loss])): apply({{'loss': loss}})")
    return name


def _check_not_updated(scope, variables: list, slots: list, name: str) -> None:
    """A fresh run's first apply must see the variables before the step's
    update, or the averages would start from the updated values."""
    for variable, slot in zip(variables, slots):
        if id(variable) in scope.updated_in_first_step and slot.get(name) is None:
            raise ValueError(
                f"ExponentialMovingAverage.apply first called after {slot.variable} was "
                f"updated in the first step: its average would start from the updated "
                f"value, TF's from the initial one. Call apply before the optimizer steps "
                f"(in the model_fn, or before opt.step() in a custom loop): the averages "
                f"are updated after the step's update wherever apply is called")
