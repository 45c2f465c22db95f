"""The numbers model_fn gives an optimizer's factory through its variables,
followed at every step, though the factory runs once.

TF1 builds `tf.train.AdamOptimizer(lr)` over a rate tensor of the global
step (official/r1 transformer's warmup, then rsqrt decay, by arithmetic)
and reads it at every step. Here model_fn runs every step and computes the
rate anew, while `est.get_optimizer(lambda p: torch.optim.Adam(p, lr=lr))`
builds the optimizer once, from the first step's `lr` (0.0 in a warmup).
Each later call's lambda closes over that step's `lr`: a hyperparameter
that, when built, was one of the factory's closure variables (or a
`functools.partial`'s keywords) is set from it again whenever it changes.
"""
from __future__ import annotations

import functools
import logging
from typing import Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)


def _origin(factory) -> Optional[object]:
    """What makes factories alike: a function's code, a partial's function."""
    if isinstance(factory, functools.partial):
        return factory.func
    return getattr(factory, "__code__", None)


def _value(factory, where: tuple):
    """The input of `factory` at `where` (("cell", index) or ("keyword", name))."""
    kind, key = where
    try:
        return factory.keywords.get(key) if kind == "keyword" \
            else factory.__closure__[key].cell_contents
    except (AttributeError, TypeError, IndexError, ValueError):
        return None


def _numbers(factory) -> Dict[tuple, Tuple[str, float]]:
    """{where: (its name, its value)} of the factory's inputs that are floats."""
    if isinstance(factory, functools.partial):
        return {("keyword", k): (k, v) for k, v in factory.keywords.items()
                if isinstance(v, float)}
    code, cells = getattr(factory, "__code__", None), getattr(factory, "__closure__", None)
    out = {}
    for i, name in enumerate(code.co_freevars if code is not None and cells else ()):
        value = _value(factory, ("cell", i))
        if isinstance(value, float):
            out[("cell", i)] = (name, value)
    return out


class FactoryInputs:
    """The float inputs of the factory an optimizer was built by, and the
    param-group hyperparameters each became (the very object: a float that
    arithmetic made is a new one)."""

    def __init__(self, name: str, factory, optimizer, skip=frozenset()):
        self._name, self._origin = name, _origin(factory)
        numbers = _numbers(factory)
        self._names = {where: n for where, (n, _) in numbers.items()}
        self._last = {where: value for where, (_, value) in numbers.items()}
        self.targets: Dict[tuple, List[Tuple[int, str]]] = {}   # where -> [(group, key)]
        for where, value in self._last.items():
            for i, group in enumerate(optimizer.param_groups):
                for key, v in group.items():
                    if v is value and key != "params" and (i, key) not in skip:
                        self.targets.setdefault(where, []).append((i, key))
        self._warned = False

    def __bool__(self) -> bool:
        return bool(self._last)

    def follow(self, factory, optimizer) -> List[Tuple[int, str]]:
        """Set the hyperparameters whose input changed since the last call
        from this call's `factory`; returns them as [(group index, key)]."""
        if _origin(factory) is not self._origin:
            return []
        moved = []
        for where, last in self._last.items():
            value = _value(factory, where)
            if value is last or not isinstance(value, float) or value == last:
                continue
            self._last[where] = value
            for i, key in self.targets.get(where, ()):
                optimizer.param_groups[i][key] = value
                moved.append((i, key))
            if where not in self.targets and not self._warned:
                self._warned = True
                logger.warning(
                    "get_optimizer(name=%r): its factory uses `%s` (%r, then %r), which "
                    "changes from step to step, but no hyperparameter of the optimizer is "
                    "`%s` itself: the factory ran once, on the first step, and what it "
                    "computed from `%s` stays that step's. Give `%s` to the factory as the "
                    "hyperparameter (`lr=%s`: then followed at every step, as TF reads a rate "
                    "tensor), or set it in a callable train_op (`for group in "
                    "optimizer.param_groups: group['lr'] = ...`)", self._name,
                    self._names[where], last, value, *[self._names[where]] * 4)
        return moved
