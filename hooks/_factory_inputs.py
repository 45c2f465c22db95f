"""The numbers model_fn gives an optimizer's factory, followed at every step,
though the factory runs once.

TF1 builds `tf.train.AdamOptimizer(lr)` over a rate tensor of the global
step (official/r1 transformer's warmup, then rsqrt decay, by arithmetic)
and reads it at every step. Here model_fn runs every step and computes the
rate anew, while `est.get_optimizer(lambda p: torch.optim.Adam(p, lr=lr))`
builds the optimizer once, from the first step's `lr` (0.0 in a warmup).
Each later call's factory holds that step's `lr`: a hyperparameter that was
one of the factory's inputs when built (a closure variable, a default
argument, a `functools.partial` keyword) is set from it again whenever it
changes. Which input became which hyperparameter is told by identity (a
number that arithmetic made is an object of its own); where it cannot be
told (two variables given one literal, `lr = 1.0` and `eps = 1.0`, are one
object; an int `lr = 0` is every 0), the input is not followed, and a
warning says so when it moves. (Building the optimizer once more to tell
them apart repeats the factory's side effects: a gradient hook registered
twice, a random draw more.)
"""
from __future__ import annotations

import functools
import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)


def _origin(factory) -> Optional[object]:
    """What makes factories alike: a function's code, a partial's function."""
    if isinstance(factory, functools.partial):
        return factory.func
    return getattr(factory, "__code__", None)


def _places(factory) -> Dict[tuple, str]:
    """{where: its name} of the factory's inputs: ("cell", i) a closure
    variable, ("default", i) a default argument, ("kwdefault", name) a
    keyword-only one, ("keyword", name) a partial's keyword."""
    if isinstance(factory, functools.partial):
        return {("keyword", k): k for k in factory.keywords}
    code = getattr(factory, "__code__", None)
    if code is None:
        return {}
    out = {("cell", i): n for i, n in enumerate(code.co_freevars)} \
        if getattr(factory, "__closure__", None) else {}
    positional = code.co_varnames[:code.co_argcount]
    defaults = getattr(factory, "__defaults__", None) or ()
    out.update((("default", i), positional[len(positional) - len(defaults) + i])
               for i in range(len(defaults)))
    out.update((("kwdefault", k), k) for k in getattr(factory, "__kwdefaults__", None) or {})
    return out


def _get(factory, where: tuple):
    kind, key = where
    try:
        if kind == "cell":
            return factory.__closure__[key].cell_contents
        if kind == "default":
            return factory.__defaults__[key]
        return (factory.__kwdefaults__ if kind == "kwdefault" else factory.keywords)[key]
    except (AttributeError, TypeError, IndexError, KeyError, ValueError):
        return None


def _is_number(value) -> bool:
    """A float (numpy's too), an int (not a bool), or a one-number float tensor."""
    if isinstance(value, (float, np.floating)):
        return True
    if isinstance(value, (int, np.integer)):
        return not isinstance(value, (bool, np.bool_))
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point()


def _moved(value, last) -> bool:
    if value is last:
        return False
    if isinstance(value, torch.Tensor) or isinstance(last, torch.Tensor):
        if not (isinstance(value, torch.Tensor) and isinstance(last, torch.Tensor)):
            return True
        if value.device.type != "cpu" or last.device.type != "cpu":
            return True   # (another tensor: comparing would wait for the device)
        return not torch.equal(value, last)
    return value != last


_NOT_TARGETS = {"params", "initial_lr"}   # (initial_lr: an LR scheduler's base, not the rate)


class FactoryInputs:
    """The number inputs of the factory `optimizer` was built by, and the
    param-group hyperparameters each became; `follow` with each later
    call's factory."""

    def __init__(self, name: str, factory, optimizer):
        self._name, self._origin = name, _origin(factory)
        self._names = {where: n for where, n in _places(factory).items()
                       if _is_number(_get(factory, where))}
        self._last = {where: _get(factory, where) for where in self._names}
        self.targets: Dict[tuple, List[Tuple[int, str]]] = {}   # where -> [(group, key)]
        self._unclear: Dict[tuple, str] = {}   # where -> why its hyperparameter is unknown
        groups = optimizer.param_groups
        for where, value in self._last.items():
            shared = [self._names[w] for w, v in self._last.items() if v is value and w != where]
            if isinstance(value, (int, np.integer)) and not isinstance(value, float):
                if any(v == value and not isinstance(v, (bool, float, torch.Tensor))
                       for group in groups for k, v in group.items() if k not in _NOT_TARGETS):
                    self._unclear[where] = "an int, which is every int of its value"
                continue
            found = [(i, k) for i, group in enumerate(groups) for k, v in group.items()
                     if v is value and k not in _NOT_TARGETS]
            if found and shared:
                self._unclear[where] = (f"one object with `{'`, `'.join(shared)}` (one "
                                        "literal given to several variables)")
            elif found:
                self.targets[where] = found
        held = {(i, k) for found in self.targets.values() for i, k in found}
        self._stale: Dict[str, List[int]] = {}   # key -> groups holding none of the inputs
        for key in {k for _, k in held}:
            stale = [i for i in range(len(groups)) if (i, key) not in held]
            if stale:
                self._stale[key] = stale
        self._warned: set = set()

    def __bool__(self) -> bool:
        return bool(self._last)

    def follow(self, factory, optimizer) -> List[Tuple[int, str]]:
        """Set the hyperparameters whose input changed since the last call
        from this call's `factory`; returns them as [(group index, key)]."""
        if _origin(factory) is not self._origin:
            return []
        moved = []
        for where, last in self._last.items():
            value = _get(factory, where)
            if value is last or not _is_number(value) or not _moved(value, last):
                continue
            self._last[where] = value
            for i, key in self.targets.get(where, ()):
                optimizer.param_groups[i][key] = value
                moved.append((i, key))
            if where not in self._warned:
                self._warn(where, last, value, optimizer)
        return moved

    def _warn(self, where: tuple, last, value, optimizer) -> None:
        """Once an input: it moved, but it is no hyperparameter, or which one
        cannot be told, or groups hold a hyperparameter it is in others (a
        rate scaled per group)."""
        self._warned.add(where)
        name, targets = self._names[where], self.targets.get(where)
        if where in self._unclear:
            logger.warning(
                "get_optimizer(name=%r): its factory uses `%s` (%r, then %r), which changes "
                "from step to step, but which hyperparameter it became cannot be told: when "
                "the optimizer was built, it was %s. It keeps the first step's value: give "
                "`%s` a float of its own (`%s = 0.0 if ... else ...` with no other variable "
                "given that literal), or set it in a callable train_op", self._name, name,
                last, value, self._unclear[where], name, name)
        elif not targets:
            logger.warning(
                "get_optimizer(name=%r): its factory uses `%s` (%r, then %r), which changes "
                "from step to step, but no hyperparameter of the optimizer is `%s` itself: "
                "the factory ran once, on the first step, and what it computed from `%s` "
                "stays that step's. Give the factory `%s` itself as a hyperparameter (as "
                "`lr=%s`, not a number computed from it: then followed at every step, as TF "
                "reads a rate tensor), or set the hyperparameters from it in a callable "
                "train_op (`for group in optimizer.param_groups: group[...] = ...`)",
                self._name, name, last, value, *[name] * 4)
        for key in sorted({k for _, k in targets or ()} & set(self._stale) - self._warned):
            self._warned.add(key)
            groups = self._stale[key]
            logger.warning(
                "get_optimizer(name=%r): `%s` of param group %s follows `%s` (%r, then %r), "
                "but that of param group %s (%s) is not `%s` itself: if the factory computes "
                "it from `%s` (`%s * 10`), it stays the first step's; set it in a callable "
                "train_op (`optimizer.param_groups[i][%r] = ...`)", self._name, key,
                [i for i, k in targets if k == key], name, last, value, groups,
                ", ".join(repr(optimizer.param_groups[i].get(key)) for i in groups), name,
                name, name, key)
