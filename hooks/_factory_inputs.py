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
number that arithmetic made is an object of its own); inputs that are one
object (two variables given one literal, `lr = 1.0` and `eps = 1.0`), or an
int that a hyperparameter equals (`lr = 0` in a warmup), are told apart by
building the optimizer once more, first, with each such input made an
object of its own.
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


def _set(factory, where: tuple, value) -> None:
    kind, key = where
    if kind == "cell":
        factory.__closure__[key].cell_contents = value
    elif kind == "default":
        values = list(factory.__defaults__)
        values[key] = value
        factory.__defaults__ = tuple(values)
    else:
        (factory.__kwdefaults__ if kind == "kwdefault" else factory.keywords)[key] = value


def _is_number(value) -> bool:
    """A float (numpy's too), an int (not a bool), or a one-number float tensor."""
    if isinstance(value, (float, np.floating)):
        return True
    if isinstance(value, (int, np.integer)):
        return not isinstance(value, (bool, np.bool_))
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point()


def _fresh(value):
    """`value` as an object of its own, equal to it (an int as a float)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, np.generic):
        return type(value)(value)
    return float.fromhex(float(value).hex())


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


class FactoryInputs:
    """The number inputs of the factory an optimizer was built by, and the
    param-group hyperparameters each became. `prepare(factory, params)`
    before the optimizer is built, `bind(optimizer)` after; then `follow`
    with each later call's factory."""

    def __init__(self, name: str, factory, params):
        self._name, self._origin = name, _origin(factory)
        self._names = {where: n for where, n in _places(factory).items()
                       if _is_number(_get(factory, where))}
        self._last = {where: _get(factory, where) for where in self._names}
        self.targets: Dict[tuple, List[Tuple[int, str]]] = {}   # where -> [(group, key)]
        self._told: Dict[tuple, List[Tuple[int, str]]] = {}     # found by a trial build
        self._trial = self._unclear()
        self._stale: Dict[str, List[int]] = {}   # key -> groups holding none of the inputs
        self._warned = False
        if self._trial:
            self._tell_apart(factory, params)

    def __bool__(self) -> bool:
        return bool(self._last)

    def _unclear(self) -> List[tuple]:
        """Inputs identity cannot tell apart: one object in several, or an int."""
        ids: Dict[int, list] = {}
        for where, value in self._last.items():
            ids.setdefault(id(value), []).append(where)
        return [where for where, value in self._last.items() if len(ids[id(value)]) > 1
                or (isinstance(value, (int, np.integer)) and not isinstance(value, float))]

    def _tell_apart(self, factory, params) -> None:
        """Build the optimizer once with the unclear inputs made objects of
        their own (before the real build: a factory's side effects are then
        the real one's), and see which hyperparameters hold them."""
        fresh = {where: _fresh(self._last[where]) for where in self._trial}
        try:
            for where, value in fresh.items():
                _set(factory, where, value)
            trial = factory(list(params))
        except Exception:   # noqa: BLE001 - (an int the factory needs as one): not followed
            return
        finally:
            for where in fresh:
                _set(factory, where, self._last[where])
        for i, group in enumerate(getattr(trial, "param_groups", ())):
            for key, v in group.items():
                for where, value in fresh.items():
                    if v is value and key != "params":
                        self._told.setdefault(where, []).append((i, key))

    def bind(self, optimizer) -> None:
        """The hyperparameters of the built `optimizer` each input became."""
        groups = optimizer.param_groups
        for where, value in self._last.items():
            if where in self._trial:
                found = [(i, k) for i, k in self._told.get(where, ()) if i < len(groups)]
            else:
                found = [(i, k) for i, group in enumerate(groups) for k, v in group.items()
                         if v is value and k != "params"]
            if found:
                self.targets[where] = found
        held = {(i, k) for found in self.targets.values() for i, k in found}
        for key in {k for _, k in held}:
            stale = [i for i in range(len(groups)) if (i, key) not in held]
            if stale:
                self._stale[key] = stale

    def follow(self, factory, optimizer) -> List[Tuple[int, str]]:
        """Set the hyperparameters whose input changed since the last call
        from this call's `factory`; returns them as [(group index, key)]."""
        if _origin(factory) is not self._origin:
            return []
        moved = []
        for where, last in self._last.items():
            value = _get(factory, where)
            if not _is_number(value) or not _moved(value, last):
                continue
            self._last[where] = value
            for i, key in self.targets.get(where, ()):
                optimizer.param_groups[i][key] = value
                moved.append((i, key))
            if not self._warned:
                self._warn(where, last, value, optimizer)
        return moved

    def _warn(self, where: tuple, last, value, optimizer) -> None:
        """Once: an input moved that no hyperparameter is, or groups hold a
        hyperparameter it is in others (a rate scaled per group)."""
        name, targets = self._names[where], self.targets.get(where)
        if not targets:
            self._warned = True
            logger.warning(
                "get_optimizer(name=%r): its factory uses `%s` (%r, then %r), which changes "
                "from step to step, but no hyperparameter of the optimizer is `%s` itself: "
                "the factory ran once, on the first step, and what it computed from `%s` "
                "stays that step's. Give the factory `%s` itself as a hyperparameter (as "
                "`lr=%s`, not a number computed from it: then followed at every step, as TF "
                "reads a rate tensor), or set the hyperparameters from it in a callable "
                "train_op (`for group in optimizer.param_groups: group[...] = ...`)",
                self._name, name, last, value, *[name] * 4)
            return
        for key in sorted({k for _, k in targets} & set(self._stale)):
            self._warned = True
            groups = self._stale[key]
            logger.warning(
                "get_optimizer(name=%r): `%s` of param group %s follows `%s` (%r, then %r), "
                "but that of param group %s (%s) is not `%s` itself: if the factory computes "
                "it from `%s` (`%s * 10`), it stays the first step's; set it in a callable "
                "train_op (`optimizer.param_groups[i][%r] = ...`)", self._name, key,
                [i for i, k in targets if k == key], name, last, value, groups,
                ", ".join(repr(optimizer.param_groups[i].get(key)) for i in groups), name,
                name, name, key)
