"""A list warm start from a TF checkpoint carries the optimizer's slots, as
TF's (tests/support/fixtures/record_tf_warm_start_slots.py, TF 2.15): Adam's
moments and powers of beta, SGD's momentum, in the layout of their variable
(a torch Linear's weight is TF's kernel transposed, so are its slots).
Before, the global step came over but Adam's moments started fresh without
a word (the NCF port's continued run reached HR 0.38 where TF's 0.47)."""
import io
import itertools
import json
import logging
import os

import numpy as np
import pytest
import torch

import estimator as est
from estimator.experiment.launch import launch
from linear_port import BATCHES, dense
from paths import FIXTURES, SUPPORT

with open(os.path.join(FIXTURES, "tf_warm_start_slots.json"), encoding="utf-8") as _f:
    TF = json.load(_f)

OPTIMIZERS = {"adam": lambda p: est.optimizers.Adam(p, 0.1),
              "momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
              "est_momentum": lambda p: est.optimizers.Momentum(p, 0.1, 0.9),
              "torch_adam": lambda p: torch.optim.Adam(p, lr=0.1),
              "rmsprop": lambda p: est.optimizers.RMSProp(p, 0.1),
              "centered": lambda p: est.optimizers.RMSProp(p, 0.1, momentum=0.9, centered=True),
              "proximal": lambda p: est.optimizers.ProximalAdagrad(
                  p, 0.1, l1_regularization_strength=0.01),
              "torch_rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.1)}


def two_adams_model_fn(features, labels, mode):
    """The recorder's two Adams: the kernel's (0.1), the bias's (0.1, beta1 0.5, beta2 0.9)."""
    pred = dense(features)
    layer = est.get_module("dense", None)
    kernel = est.get_optimizer(lambda p: est.optimizers.Adam(p, 0.1), name="kernel",
                               var_list=[layer.weight])
    bias = est.get_optimizer(lambda p: est.optimizers.Adam(p, 0.1, beta1=0.5, beta2=0.9),
                             name="bias", var_list=[layer.bias])
    loss = est.losses.mean_squared_error(labels, pred)

    def train_op():
        kernel.zero_grad()
        bias.zero_grad()
        loss.backward()
        kernel.step()
        bias.step()
    return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


def warm_started(tmp_path, name, recorded):
    def model_fn(features, labels, mode):
        if name == "two_adams":
            return two_adams_model_fn(features, labels, mode)
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, dense(features)),
                                 train_op=est.get_optimizer(OPTIMIZERS[name]))
    settings = est.WarmStartSettings(
        os.path.join(FIXTURES, "tf_ckpt", f"slots_{recorded}"), vars_to_warm_start=[".*"],
        var_name_to_prev_var_name={"dense/weight": "dense/kernel"})
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path)),
                      warm_start_from=settings)
    e.train(lambda: itertools.cycle(BATCHES), steps=2)
    return e


@pytest.mark.parametrize("optimizer, name", [
    ("adam", "adam"), ("momentum", "momentum"), ("est_momentum", "momentum"),
    ("two_adams", "two_adams"), ("adam", "adam_1200"), ("rmsprop", "rmsprop"),
    ("centered", "centered"), ("proximal", "proximal")])
def test_a_list_warm_start_carries_the_slots_as_tf(tmp_path, optimizer, name):
    """two_adams: the second Adam's powers are `beta1_power_1` (it took the
    first's: 2-5% off TF after 20 steps); adam_1200: beta1^1201 is 0;
    RMSProp's slots (they started fresh: a canned DNN continued from TF's
    checkpoint was 10-23% off in its slots at the next step); TF's Momentum
    into torch's SGD and into est.optimizers.Momentum."""
    e = warm_started(tmp_path, optimizer, name)
    assert e.get_variable_value("global_step") == TF[name]["global_step"]
    np.testing.assert_allclose(e.get_variable_value("dense/weight").ravel(), TF[name]["kernel"],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(e.get_variable_value("dense/bias"), TF[name]["bias"],
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("recorded", ["adam", "adam_1200"])
def test_torch_adam_takes_tf_adams_moments_and_step(tmp_path, recorded):
    """torch's Adam adds epsilon after the bias correction: near TF's, not
    equal. Its step is counted from beta2's power (beta1's is 0 after 1200:
    "math domain error")."""
    e = warm_started(tmp_path, "torch_adam", recorded)
    np.testing.assert_allclose(e.get_variable_value("dense/weight").ravel(),
                               TF[recorded]["kernel"], rtol=1e-4)
    assert e.get_variable_value("optimizer/dense/weight/exp_avg").shape == (1, 2)
    assert e.get_variable_value("optimizer/dense/weight/step") == TF[recorded]["global_step"]


def test_slots_an_optimizer_cannot_take_are_said(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        warm_started(tmp_path, "torch_rmsprop", "adam")
    said = [r.getMessage() for r in caplog.records if "optimizer slots" in r.getMessage()]
    assert said == ["Warm-start: the checkpoint's optimizer slots ['dense/kernel/Adam', "
                    "'dense/kernel/Adam_1', 'dense/bias/Adam', 'dense/bias/Adam_1'] are not "
                    "warm-started into RMSprop, whose state starts fresh (TF's list warm start "
                    "restores them; slots are taken by torch's Adagrad, Adam and SGD with "
                    "momentum, and est.optimizers' Adam, Ftrl, RMSProp, Momentum and "
                    "ProximalAdagrad)"]


# -- from this library's own checkpoints ------------------------------------------
OWN = {"torch_adam": lambda p: torch.optim.Adam(p, lr=0.05),
       "adam": lambda p: est.optimizers.Adam(p, 0.05),
       "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
       "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1)}


def own_model_fn(optimizer):
    def model_fn(features, labels, mode, params):
        net = est.get_module("net", lambda: torch.nn.Sequential(
            torch.nn.Linear(2, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(),
            torch.nn.Linear(4, 1)))
        pred = net(torch.as_tensor(features["x"]))
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                                 train_op=est.get_optimizer(OWN[optimizer]))
    return model_fn


def own_run(model_dir, optimizer, steps, warm_start_from=None):
    torch.manual_seed(0)
    e = est.Estimator(own_model_fn(optimizer), model_dir=str(model_dir),
                      warm_start_from=warm_start_from)
    e.train(lambda: iter(BATCHES * 2), steps=steps)
    return e


@pytest.mark.parametrize("optimizer", sorted(OWN))
def test_a_list_warm_start_from_our_checkpoint_continues_as_a_resumed_run(tmp_path, optimizer):
    """TF's list warm start takes every global variable, the slots and the
    step included: from a checkpoint of the same model it continues as a
    resumed run. Before, the state started fresh (torch's Adam: the first
    layer's weight up to 0.16 off the resumed run's after 3 steps)."""
    own_run(tmp_path / "first", optimizer, 3)
    resumed = own_run(tmp_path / "first", optimizer, 3)   # 3 more: steps 4-6
    warm = own_run(tmp_path / "warm", optimizer, 3, est.WarmStartSettings(
        str(tmp_path / "first" / "model.ckpt-3"),
        vars_to_warm_start=[".*"]))
    assert warm.get_variable_value("global_step") == 6
    for name in resumed.get_variable_names():
        np.testing.assert_array_equal(warm.get_variable_value(name),
                                      resumed.get_variable_value(name), err_msg=name)


def test_a_list_warm_start_takes_the_state_of_an_optimizer_that_gained_a_setting(tmp_path):
    """A checkpoint of an earlier version of this library (no recorded
    optimizer kinds; est.optimizers.Ftrl without its later `beta` setting):
    the slots are still taken (before: started fresh as "another kind of
    optimizer's", and Ftrl, whose weights follow its slots, threw the
    warm-started weights away at the first step)."""
    from hooks.checkpoint import Saver
    OWN["ftrl"] = lambda p: est.optimizers.Ftrl(p, 0.05)
    try:
        own_run(tmp_path / "first", "ftrl", 3)
        state = est.checkpoint.load(str(tmp_path / "first" / "model.ckpt-3"))
        state.pop("optimizer_kinds")
        for group in state["optimizers"]["optimizer"]["param_groups"]:
            del group["beta"]
        state.pop("rng")
        Saver(str(tmp_path / "older")).save(state, 3)
        resumed = own_run(tmp_path / "first", "ftrl", 3)
        warm = own_run(tmp_path / "warm", "ftrl", 3, est.WarmStartSettings(
            str(tmp_path / "older"), vars_to_warm_start=[".*"]))
    finally:
        del OWN["ftrl"]
    for name in resumed.get_variable_names():
        np.testing.assert_array_equal(warm.get_variable_value(name),
                                      resumed.get_variable_value(name), err_msg=name)


def test_a_regex_warm_start_leaves_our_checkpoints_state(tmp_path):
    """A regex reaches trainable variables only (TF's TRAINABLE_VARIABLES):
    the optimizer starts fresh, and the step at 0."""
    own_run(tmp_path / "first", "torch_adam", 3)
    warm = own_run(tmp_path / "warm", "torch_adam", 1, est.WarmStartSettings(
        str(tmp_path / "first"), vars_to_warm_start=".*"))
    assert warm.get_variable_value("global_step") == 1
    assert warm.get_variable_value("optimizer/net/0/weight/step") == 1


def test_our_checkpoints_state_another_optimizer_cannot_take_is_said(tmp_path, caplog):
    own_run(tmp_path / "first", "momentum", 3)
    with caplog.at_level(logging.WARNING):
        warm = own_run(tmp_path / "warm", "torch_adam", 1, est.WarmStartSettings(
            str(tmp_path / "first"), vars_to_warm_start=[".*"]))
    assert warm.get_variable_value("optimizer/net/0/weight/step") == 1
    said = [r.getMessage() for r in caplog.records if "optimizer state" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "Warm-start: the checkpoint's optimizer state ['optimizer/net/0/weight/momentum_buffer',"
        " 'optimizer/net/0/bias/momentum_buffer', 'optimizer/net/1/weight/momentum_buffer', "
        "'optimizer/net/1/bias/momentum_buffer'] ... is not warm-started into Adam"), said


@pytest.mark.slow
def test_a_list_warm_start_on_ps_tasks_puts_tfs_slots_there(tmp_path):
    """Under a ParameterServerStrategy the optimizer steps on the ps tasks:
    the warm-started slots go there (before, they stayed in the chief's
    local optimizer, and the ps tasks' Adam started fresh)."""
    status = launch([os.path.join(SUPPORT, "ps_warm_start_task.py"), str(tmp_path),
                     os.path.join(FIXTURES, "tf_ckpt", "slots_adam"), "--max-steps",
                     str(TF["adam"]["global_step"])], output=io.StringIO(), workers=0, ps=2,
                    timeout=120, stop_grace_secs=5)
    assert status == 0
    e = est.Estimator(lambda features, labels, mode: None, model_dir=str(tmp_path))
    assert e.get_variable_value("global_step") == TF["adam"]["global_step"]
    np.testing.assert_allclose(e.get_variable_value("dense/weight").ravel(), TF["adam"]["kernel"],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(e.get_variable_value("dense/bias"), TF["adam"]["bias"],
                               rtol=1e-6, atol=1e-7)
