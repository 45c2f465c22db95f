"""TF1's learning-rate schedules (``tf.compat.v1.train.exponential_decay`` and
the rest) as functions of the global step, with TF's formulas: each returns
the learning rate (a float) for the step it is given.

    def model_fn(features, labels, mode, params):
        ...
        lr = est.learning_rate_decay.exponential_decay(
            0.1, est.get_global_step(), decay_steps=1000, decay_rate=0.96, staircase=True)
        optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
        return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)

In a `model_fn`, `est.get_global_step()` is the step before this one's
update, the value TF's graph reads, so the same step gets the same rate.
`get_optimizer`'s factory runs once, but TF reads its learning-rate tensor
every step: a rate from these functions, given to the factory, is given to
the optimizer again at every step as this step's call computed it (a canned
estimator's `optimizer=lambda p: ...(p, lr=exponential_decay(...,
est.get_global_step(), ...))`, computed inside the factory, is recomputed
for each step). A rate `model_fn` changes by its own arithmetic (a warmup
blended in) and gives the factory as a variable is followed too, whenever it
moves; what the factory itself computes from it (`lr=2 * lr`) stays as the
first step made it (warned when it moves). See docs/migration.md,
"Learning-rate schedules". TF computes in float32; these in float64 (they
agree to float32's precision).
"""
from __future__ import annotations

import functools
import math
import sys
from typing import Sequence

import torch

from hooks.model_scope import current_step, note_rate

from ._checks import is_number


def _followed(schedule, position: int = 1, key: str = "global_step"):
    """`schedule` (its step the argument `key`, at `position`) telling the
    model scope each rate it computes, so an optimizer built with the rate
    can follow it (`get_optimizer`); with `at(step)` where the step given was
    the global step."""
    @functools.wraps(schedule)
    def rate(*args, **kwargs):
        value = schedule(*args, **kwargs) + 0.0   # a new float: its identity marks it
        caller = sys._getframe(1)
        given = args[position] if len(args) > position else kwargs.get(key)
        step = current_step()
        is_step = step is not None and is_number(given) and given == step

        def at(new_step):
            if len(args) > position:
                return schedule(*args[:position], new_step, *args[position + 1:], **kwargs)
            return schedule(*args, **dict(kwargs, **{key: new_step}))
        note_rate(value, (caller.f_code, caller.f_lasti), at if is_step else None)
        return value
    return rate


def _step(global_step, name: str) -> float:
    if global_step is None:
        raise ValueError(f"global_step is required for {name}.")
    if isinstance(global_step, torch.Tensor):
        global_step = global_step.item()
    if not is_number(global_step):
        raise TypeError(f"{name}: global_step must be a number (est.get_global_step()), got "
                        f"{type(global_step).__name__}")
    return float(global_step)


def _positive(value, what: str, name: str) -> float:
    if not is_number(value) or value <= 0:
        raise ValueError(f"{name}: {what} must be a positive number, got {value!r}")
    return float(value)


def _progress(global_step, decay_steps, staircase: bool, name: str) -> float:
    p = _step(global_step, name) / _positive(decay_steps, "decay_steps", name)
    return math.floor(p) if staircase else p


@_followed
def exponential_decay(learning_rate, global_step, decay_steps, decay_rate,
                      staircase: bool = False, name=None) -> float:
    """`learning_rate * decay_rate ** (global_step / decay_steps)`, the
    exponent floored when `staircase`."""
    return learning_rate * decay_rate ** _progress(global_step, decay_steps, staircase,
                                                   "exponential_decay")


@_followed
def natural_exp_decay(learning_rate, global_step, decay_steps, decay_rate,
                      staircase: bool = False, name=None) -> float:
    """`learning_rate * exp(-decay_rate * global_step / decay_steps)`, the
    ratio floored when `staircase`."""
    return learning_rate * math.exp(-decay_rate * _progress(global_step, decay_steps, staircase,
                                                            "natural_exp_decay"))


@_followed
def inverse_time_decay(learning_rate, global_step, decay_steps, decay_rate,
                       staircase: bool = False, name=None) -> float:
    """`learning_rate / (1 + decay_rate * global_step / decay_steps)`, the
    ratio floored when `staircase`."""
    return learning_rate / (1.0 + decay_rate * _progress(global_step, decay_steps, staircase,
                                                         "inverse_time_decay"))


@functools.partial(_followed, position=0, key="x")
def piecewise_constant(x, boundaries: Sequence, values: Sequence, name=None):
    """`values[0]` while `x <= boundaries[0]`, `values[i]` while
    `boundaries[i-1] < x <= boundaries[i]`, `values[-1]` after the last."""
    if len(values) != len(boundaries) + 1:
        raise ValueError("The length of boundaries should be 1 less than the length of values "
                         f"(got {len(boundaries)} boundaries and {len(values)} values)")
    if list(boundaries) != sorted(boundaries):
        raise ValueError(f"piecewise_constant: boundaries must be increasing, got {boundaries}")
    x = _step(x, "piecewise_constant")
    for boundary, value in zip(boundaries, values):
        if x <= boundary:
            return value
    return values[-1]


@_followed
def polynomial_decay(learning_rate, global_step, decay_steps, end_learning_rate=0.0001,
                     power=1.0, cycle: bool = False, name=None) -> float:
    """From `learning_rate` to `end_learning_rate` over `decay_steps` along
    `(1 - step / decay_steps) ** power`; then `end_learning_rate`, or with
    `cycle` again from the top over the next multiple of `decay_steps`."""
    step = _step(global_step, "polynomial_decay")
    decay_steps = _positive(decay_steps, "decay_steps", "polynomial_decay")
    if cycle:
        decay_steps *= 1.0 if step == 0 else math.ceil(step / decay_steps)
    else:
        step = min(step, decay_steps)
    return (learning_rate - end_learning_rate) * (1.0 - step / decay_steps) ** power \
        + end_learning_rate


@_followed
def cosine_decay(learning_rate, global_step, decay_steps, alpha=0.0, name=None) -> float:
    """A half cosine from `learning_rate` down to `alpha * learning_rate` over
    `decay_steps`, then flat."""
    decay_steps = _positive(decay_steps, "decay_steps", "cosine_decay")
    step = min(_step(global_step, "cosine_decay"), decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * step / decay_steps))
    return learning_rate * ((1.0 - alpha) * cosine + alpha)


@_followed
def cosine_decay_restarts(learning_rate, global_step, first_decay_steps, t_mul=2.0,
                          m_mul=1.0, alpha=0.0, name=None) -> float:
    """SGDR: cosine decays restarting at `learning_rate` (times `m_mul` more
    each restart), each period `t_mul` times the one before, the first
    `first_decay_steps` long."""
    fraction = _step(global_step, "cosine_decay_restarts") / _positive(
        first_decay_steps, "first_decay_steps", "cosine_decay_restarts")
    if t_mul == 1.0:
        restart = math.floor(fraction)
        fraction -= restart
    else:
        if 1.0 - fraction * (1.0 - t_mul) <= 0.0:   # (t_mul < 1: TF's rate is NaN from here)
            raise ValueError(
                f"cosine_decay_restarts: with t_mul={t_mul} < 1 the periods add up to "
                f"{first_decay_steps / (1.0 - t_mul):g} steps, and step {global_step} is past "
                "their end")
        restart = math.floor(math.log(1.0 - fraction * (1.0 - t_mul)) / math.log(t_mul))
        done = (1.0 - t_mul ** restart) / (1.0 - t_mul)
        fraction = (fraction - done) / t_mul ** restart
    cosine = 0.5 * m_mul ** restart * (1.0 + math.cos(math.pi * fraction))
    return learning_rate * ((1.0 - alpha) * cosine + alpha)


@_followed
def linear_cosine_decay(learning_rate, global_step, decay_steps, num_periods=0.5, alpha=0.0,
                        beta=0.001, name=None) -> float:
    """`learning_rate * ((alpha + linear) * cosine + beta)`: `linear` from 1
    to 0 over `decay_steps`, `cosine` over `num_periods` periods."""
    decay_steps = _positive(decay_steps, "decay_steps", "linear_cosine_decay")
    step = min(_step(global_step, "linear_cosine_decay"), decay_steps)
    linear = (decay_steps - step) / decay_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_periods * step / decay_steps))
    return learning_rate * ((alpha + linear) * cosine + beta)


@_followed
def noisy_linear_cosine_decay(learning_rate, global_step, decay_steps, initial_variance=1.0,
                              variance_decay=0.55, num_periods=0.5, alpha=0.0, beta=0.001,
                              name=None) -> float:
    """`linear_cosine_decay` with Gaussian noise of variance `initial_variance
    / (1 + step) ** variance_decay` added to `linear`. A step's noise comes
    from a generator seeded by torch's seed (`tf_random_seed`) and the step,
    not from torch's stream (dropout draws as without it): the same however
    often the step's rate is computed, another at each step."""
    decay_steps = _positive(decay_steps, "decay_steps", "noisy_linear_cosine_decay")
    given = _step(global_step, "noisy_linear_cosine_decay")
    step = min(given, decay_steps)
    linear = (decay_steps - step) / decay_steps
    seed = (torch.initial_seed() * 1_000_003 + int(given)) % 2**63
    noise = torch.randn((), dtype=torch.float64,
                        generator=torch.Generator().manual_seed(seed)).item()
    linear += noise * math.sqrt(initial_variance / (1.0 + step) ** variance_decay)
    cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_periods * step / decay_steps))
    return learning_rate * ((alpha + linear) * cosine + beta)
