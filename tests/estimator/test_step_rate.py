"""A learning rate model_fn computes from the global step by its own
arithmetic (official/r1 transformer's warmup, then rsqrt decay) and gives
the optimizer's factory, against TF 2.15's recording
(tests/support/fixtures/record_tf_step_rate.py): TF reads the rate tensor
at every step, so the optimizer follows it here too, through a resumed run.
Before, the factory's first rate (0.0 in a warmup) stayed for the whole
`train` call without a word (the transformer port did not train at all)."""
import functools
import itertools
import json
import logging
import math
import os

import numpy as np
import pytest
import torch

import estimator as est
from linear_port import BATCHES, assert_weights, dense
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_step_rate.json"), encoding="utf-8") as _f:
    TF = json.load(_f)

OPTIMIZERS = {"adam": est.optimizers.Adam,
              "momentum": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9)}
RATES = []   # the rate the optimizer holds at each step


def rate(step):
    """The recorder's schedule: a warmup over 3 steps, then 1/sqrt."""
    step = step + 1.0
    return 0.5 * min(step / 3.0, math.sqrt(3.0 / step))


def model_fn(features, labels, mode, params):
    pred = dense(features)
    lr = rate(est.get_global_step())
    make = OPTIMIZERS[params["optimizer"]]
    if params["form"] == "lambda":
        opt = est.get_optimizer(lambda p: make(p, lr=lr))
    else:
        opt = est.get_optimizer(functools.partial(make, lr=lr))
    RATES.append(opt.param_groups[0]["lr"])
    return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                             train_op=opt)


def train(model_dir, steps, **params):
    e = est.Estimator(model_fn, model_dir=str(model_dir), params=params)
    e.train(lambda: itertools.cycle(BATCHES), steps=steps)
    return e


@pytest.mark.parametrize("form", ["lambda", "partial"])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_a_rate_of_the_step_by_arithmetic_is_followed_as_tf(tmp_path, optimizer, form, caplog):
    RATES.clear()
    with caplog.at_level(logging.INFO, logger="hooks"):
        assert_weights(train(tmp_path, 6, optimizer=optimizer, form=form),
                       TF[optimizer]["first"], rtol=1e-5, atol=1e-6)
        assert_weights(train(tmp_path, 3, optimizer=optimizer, form=form),
                       TF[optimizer]["resumed"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(RATES, TF["rates"], rtol=1e-6)
    assert not [r for r in caplog.records if "factory" in r.getMessage()], caplog.text


def test_a_rate_set_by_hand_stays_while_the_factorys_does_not_move(tmp_path):
    """Only a change is followed: a rate the run lowers itself (a plateau
    rule) is not put back to the factory's at the next step."""
    seen = []

    def model_fn(features, labels, mode):
        pred = dense(features)
        lr = sum([0.05, 0.05])   # (a new float each call, the same value)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
        if est.get_global_step() == 2:
            opt.param_groups[0]["lr"] = 0.01
        seen.append(opt.param_groups[0]["lr"])
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                                 train_op=opt)
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(lambda: itertools.cycle(BATCHES), steps=5)
    assert seen == [0.1, 0.1, 0.01, 0.01, 0.01]


def test_a_rate_the_factory_computes_from_its_input_is_said(tmp_path, caplog):
    """`lr=2 * lr`: the optimizer's rate is another number than the input,
    which moves; it cannot be followed, and a warning says so, once."""
    def model_fn(features, labels, mode):
        pred = dense(features)
        warm = min(1.0, (est.get_global_step() + 1) / 3.0)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1 * warm))
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                                 train_op=opt)
    with caplog.at_level(logging.WARNING):
        est.Estimator(model_fn, model_dir=str(tmp_path)).train(
            lambda: itertools.cycle(BATCHES), steps=4)
    said = [r.getMessage() for r in caplog.records if "changes from step" in r.getMessage()]
    assert len(said) == 1 and said[0] == (
        "get_optimizer(name='optimizer'): its factory uses `warm` (0.3333333333333333, then "
        "0.6666666666666666), which changes from step to step, but no hyperparameter of the "
        "optimizer is `warm` itself: the factory ran once, on the first step, and what it "
        "computed from `warm` stays that step's. Give the factory `warm` itself as a "
        "hyperparameter (as `lr=warm`, not a number computed from it: then followed at every "
        "step, as TF reads a rate tensor), or set the hyperparameters from it in a callable "
        "train_op (`for group in optimizer.param_groups: group[...] = ...`)"), said


def test_a_factory_reading_the_step_is_said(tmp_path, caplog):
    def model_fn(features, labels, mode):
        pred = dense(features)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(
            p, lr=0.1 * min(1.0, (est.get_global_step() + 1) / 3.0)))
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                                 train_op=opt)
    with caplog.at_level(logging.WARNING):
        est.Estimator(model_fn, model_dir=str(tmp_path)).train(
            lambda: itertools.cycle(BATCHES), steps=2)
    said = [r.getMessage() for r in caplog.records if "read est.get_global_step()" in
            r.getMessage()]
    assert said == [
        "get_optimizer(name='optimizer'): its factory read est.get_global_step(), but it runs "
        "once, on the first step: what it computed from the step (but through "
        "est.learning_rate_decay's schedules, recomputed every step) stays that step's. "
        "Compute such a number in model_fn and give it to the factory (`lr = ...; "
        "est.get_optimizer(lambda p: torch.optim.Adam(p, lr=lr))`: then followed at every "
        "step, as TF reads a rate tensor); a canned estimator's optimizer takes a changing "
        "rate from those schedules only"]


def _hyperparameters(make, steps, model_dir):
    """[(lr, other hyperparameters of group 0)] of each step, `make(step, params)`
    returning the optimizer from get_optimizer."""
    seen = []

    def model_fn(features, labels, mode):
        pred = dense(features)
        opt = make(est.get_global_step())
        seen.append({k: v for k, v in opt.param_groups[0].items() if k != "params"})
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                                 train_op=opt)
    est.Estimator(model_fn, model_dir=str(model_dir)).train(
        lambda: itertools.cycle(BATCHES), steps=steps)
    return seen


def _int_first(step):
    lr = 0 if step < 2 else 0.05
    return est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr, momentum=0.0))


def _numpy32(step):
    lr = np.float32(0.1) * np.float32(min(1.0, (step + 1) / 3))
    return est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))


def _default_argument(step):
    lr = 0.1 * min(1.0, (step + 1) / 3)
    return est.get_optimizer(lambda p, lr=lr: torch.optim.SGD(p, lr=lr))


def _tensor(step):
    lr = torch.where(torch.tensor(step) < 2, torch.tensor(0.1), torch.tensor(0.02))
    return est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))


@pytest.mark.parametrize("make, lrs", [
    (_numpy32, [0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1]),
    (_default_argument, [0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1]),
    (_tensor, [0.1, 0.1, 0.02, 0.02, 0.02]),
], ids=["numpy_float32", "default_argument", "tensor"])
def test_each_way_of_giving_a_number_is_followed(tmp_path, caplog, make, lrs):
    """(Found by probing: each of these kept the first step's rate without
    a word.)"""
    with caplog.at_level(logging.WARNING):
        seen = _hyperparameters(make, 5, tmp_path)
    np.testing.assert_allclose([float(s["lr"]) for s in seen], lrs, rtol=1e-6)
    assert not [r for r in caplog.records if "get_optimizer" in r.getMessage()], caplog.text


CALLS = []


def _literals(step):
    """Two variables given one literal are one object: which hyperparameter
    `lr` became cannot be told (the first version moved Adam's epsilon with
    the rate: 0.5 at step 3; building once more to tell them apart repeated
    the factory's side effects)."""
    lr = 1.0 if step < 3 else 0.5
    eps = 1.0

    def factory(p):
        CALLS.append(1)
        return est.optimizers.Adam(p, lr, epsilon=eps)
    return est.get_optimizer(factory)


@pytest.mark.parametrize("make, why", [
    (_literals, "one object with `eps` (one literal given to several variables)"),
    (_int_first, "an int, which is every int of its value"),
], ids=["one_literal", "int_first"])
def test_a_number_whose_hyperparameter_cannot_be_told_is_said_and_moves_nothing(
        tmp_path, caplog, make, why):
    CALLS.clear()
    with caplog.at_level(logging.WARNING):
        seen = _hyperparameters(make, 5, tmp_path)
    first = {k: v for k, v in seen[0].items()}
    assert all(s == first for s in seen)
    assert len(CALLS) == (1 if make is _literals else 0)
    said = [r.getMessage() for r in caplog.records if "cannot be told" in r.getMessage()]
    assert len(said) == 1 and f"when the optimizer was built, it was {why}." in said[0], said


def test_a_rate_scaled_per_group_is_said(tmp_path, caplog):
    """`{"params": ..., "lr": lr * 10}`: group 0's rate is another number,
    which is not followed (the factory ran once); a warning names it."""
    def make(step):
        lr = 0.1 * min(1.0, (step + 1) / 3)
        layer = est.get_module("dense", None)
        return est.get_optimizer(lambda p: torch.optim.SGD(
            [{"params": [layer.weight], "lr": lr * 10}, {"params": [layer.bias]}], lr=lr))
    with caplog.at_level(logging.WARNING):
        _hyperparameters(make, 3, tmp_path)
    said = [r.getMessage() for r in caplog.records if "param group" in r.getMessage()]
    assert said == [
        "get_optimizer(name='optimizer'): `lr` of param group [1] follows `lr` "
        "(0.03333333333333333, then 0.06666666666666667), but that of param group [0] "
        "(0.3333333333333333) is not `lr` itself: if the factory computes it from `lr` "
        "(`lr * 10`), it stays the first step's; set it in a callable train_op "
        "(`optimizer.param_groups[i]['lr'] = ...`)"]


def test_a_factory_with_a_schedule_and_its_own_arithmetic_on_the_step_is_said(tmp_path, caplog):
    """The schedule's rate is recomputed every step; the momentum made from
    the step by arithmetic is not (it said nothing: a schedule was there)."""
    def make(step):
        return est.get_optimizer(lambda p: torch.optim.SGD(
            p, lr=est.learning_rate_decay.exponential_decay(0.1, est.get_global_step(), 2, 0.5),
            momentum=0.5 + 0.4 * min(1.0, est.get_global_step() / 5)))
    with caplog.at_level(logging.WARNING):
        _hyperparameters(make, 2, tmp_path)
    assert [r for r in caplog.records if "read est.get_global_step()" in r.getMessage()]


def test_a_blended_warmup_resumed_after_it_says_nothing(tmp_path, caplog):
    """BERT's rate (a schedule, its warmup blended in by arithmetic) given to
    the factory and resumed after the warmup: the optimizer then follows the
    schedule itself; nothing to say (it warned that no hyperparameter was
    `lr`)."""
    def make(step):
        lr = est.learning_rate_decay.polynomial_decay(0.1, step, 100, end_learning_rate=0.0)
        if step < 3:
            lr = 0.1 * step / 3
        return est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
    with caplog.at_level(logging.WARNING):
        _hyperparameters(make, 4, tmp_path)
        seen = _hyperparameters(make, 3, tmp_path)
    np.testing.assert_allclose([s["lr"] for s in seen], [0.1 * (1 - s / 100) for s in (4, 5, 6)])
    assert not [r for r in caplog.records if "get_optimizer" in r.getMessage()], caplog.text
