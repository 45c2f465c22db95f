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
from linear_port import BATCHES, dense
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


def assert_weights(e, recorded):
    np.testing.assert_allclose(e.get_variable_value("dense/weight").ravel(),
                               recorded["kernel"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e.get_variable_value("dense/bias"), recorded["bias"],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["lambda", "partial"])
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_a_rate_of_the_step_by_arithmetic_is_followed_as_tf(tmp_path, optimizer, form, caplog):
    RATES.clear()
    with caplog.at_level(logging.INFO, logger="hooks"):
        assert_weights(train(tmp_path, 6, optimizer=optimizer, form=form), TF[optimizer]["first"])
        assert_weights(train(tmp_path, 3, optimizer=optimizer, form=form),
                       TF[optimizer]["resumed"])
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
    assert len(said) == 1 and said[0].startswith(
        "get_optimizer(name='optimizer'): its factory uses `warm` (0.3333333333333333, then "
        "0.6666666666666666), which changes from step to step"), said


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
        "once, on the first step: what it computed from the step stays that step's. Compute "
        "the rate in model_fn and give it to the factory (`lr = ...; est.get_optimizer(lambda "
        "p: torch.optim.Adam(p, lr=lr))`: then followed at every step, as TF reads a rate "
        "tensor)"]
