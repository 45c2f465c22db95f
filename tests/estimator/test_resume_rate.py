"""The learning rate of a resumed run, against TF 2.15's recording
(tests/support/fixtures/record_tf_resume_rate.py): the rate model_fn gives
now, the momentum slots the checkpoint's. Before, a resumed optimizer took
the checkpoint's rate (torch's load_state_dict): a sweep continuing earlier
runs with `--set params.learning_rate=...` trained at the old rates while
experiment.yaml said the new ones."""
import functools
import itertools
import json
import logging
import os

import numpy as np
import pytest
import torch

import estimator as est
from linear_port import BATCHES, assert_weights, dense
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_resume_rate.json"), encoding="utf-8") as _f:
    TF = json.load(_f)

RATES = []   # the rate of each step's optimizer


def model_fn(features, labels, mode, params):
    pred = dense(features)
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=params["learning_rate"],
                                                      momentum=0.9))
    if "by_hand" in params and est.get_global_step() == params["by_hand"]:
        opt.param_groups[0]["lr"] = 0.001   # a rate the run changes itself, once
    RATES.append(opt.param_groups[0]["lr"])
    return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                             train_op=opt)


def train(model_dir, **params):
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(model_dir)), params=params)
    e.train(lambda: itertools.cycle(BATCHES), steps=2)
    return e


@pytest.mark.parametrize("case, second", [("changed", 0.5), ("same", 0.01)])
def test_a_resumed_run_trains_at_the_rate_model_fn_gives_as_tf(tmp_path, case, second, caplog):
    assert_weights(train(tmp_path, learning_rate=0.01), TF[case]["first"])
    with caplog.at_level(logging.INFO, logger="hooks"):
        assert_weights(train(tmp_path, learning_rate=second), TF[case]["resumed"])
    said = [r.getMessage() for r in caplog.records if "as the factory now gives" in r.getMessage()]
    assert said == (["get_optimizer(name='optimizer'): lr 0.01 -> 0.5, as the factory now "
                     "gives (the checkpoint's run was given other values)"]
                    if case == "changed" else [])


def test_a_rate_the_run_set_by_hand_is_restored_where_model_fn_gives_the_same(tmp_path):
    """torch's rule where TF has none: the checkpoint's value, when the factory
    gives what it gave that run."""
    train(tmp_path, learning_rate=0.01, by_hand=1)
    RATES.clear()
    train(tmp_path, learning_rate=0.01)
    assert RATES == [0.001, 0.001]
    RATES.clear()
    train(tmp_path, learning_rate=0.02)   # changed: model_fn's
    assert RATES == [0.02, 0.02]


def test_a_checkpoint_from_before_the_record_takes_model_fns_rate(tmp_path, monkeypatch):
    """A checkpoint written before `optimizer_built_with` was: the rate model_fn
    gives now, and again at the next resume (it stuck at the checkpoint's)."""
    from hooks import model_scope
    state = model_scope.ModelScope.state
    monkeypatch.setattr(model_scope.ModelScope, "state", lambda self: {
        k: v for k, v in state(self).items() if k != "optimizer_built_with"})
    train(tmp_path, learning_rate=0.01)
    monkeypatch.undo()
    for _ in range(2):
        RATES.clear()
        train(tmp_path, learning_rate=0.5)
        assert RATES == [0.5, 0.5]


def _two_layers_model_fn(features, labels, mode, params):
    """Two layers of one shape, each its param group with its own rate, in
    the order params["order"] gives."""
    layers = {k: est.get_module(k, lambda: torch.nn.Linear(2, 2)) for k in "ab"}
    pred = layers["b"](torch.tanh(layers["a"](torch.as_tensor(features["x"])))).sum(1, True)
    rates = {"a": 0.1, "b": 0.01}
    opt = est.get_optimizer(lambda p: torch.optim.Adam(
        [{"params": list(layers[k].parameters()), "lr": rates[k]} for k in params["order"]]))
    return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                             train_op=opt)


def test_a_resumed_optimizer_whose_groups_come_in_another_order_takes_each_its_own(tmp_path):
    """torch's load_state_dict pairs the checkpoint's state with the
    parameters by position: groups built in another order gave one layer
    the other's Adam moments and rate, without a word where their shapes
    are one (of other shapes, a failed step). They are paired by variable
    name now."""
    def train(model_dir, order, steps):
        torch.manual_seed(0)
        e = est.Estimator(_two_layers_model_fn, model_dir=str(model_dir),
                          params={"order": order})
        e.train(lambda: itertools.cycle(BATCHES), steps=steps)
        return e
    train(tmp_path / "same", "ab", 3)
    train(tmp_path / "other", "ab", 3)
    same, other = train(tmp_path / "same", "ab", 2), train(tmp_path / "other", "ba", 2)
    for name in same.get_variable_names():
        if not name.startswith("optimizer/"):
            np.testing.assert_array_equal(same.get_variable_value(name),
                                          other.get_variable_value(name), err_msg=name)
    lrs = {g["lr"] for g in est.checkpoint.load(other.latest_checkpoint())["optimizers"][
        "optimizer"]["param_groups"]}
    assert lrs == {0.1, 0.01}


def test_numpy_hyperparameters_resume(tmp_path):
    """`SGD(p, lr=np.float64(...), weight_decay=np.int64(0))`: the checkpoint
    held numpy scalars, which torch.load(weights_only=True) refuses: the
    resumed run took it for a foreign file and trained from step 0 (the
    probe of this stop's changes). They are saved as Python numbers."""
    def model_fn(features, labels, mode):
        pred = dense(features)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(
            p, lr=np.float64(0.05), momentum=np.float32(0.5), weight_decay=np.int64(0)))
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                                 train_op=opt)

    def train(model_dir, steps):
        e = est.Estimator(model_fn, model_dir=str(model_dir))
        e.train(lambda: itertools.cycle(BATCHES), steps=steps)
        return e
    train(tmp_path / "resumed", 2)   # (the input starts again: two batches a run)
    resumed, whole = train(tmp_path / "resumed", 2), train(tmp_path / "whole", 4)
    assert resumed.get_variable_value("global_step") == 4
    for name in whole.get_variable_names():
        np.testing.assert_array_equal(resumed.get_variable_value(name),
                                      whole.get_variable_value(name), err_msg=name)


def test_a_resumed_optimizer_over_other_variables_is_refused_and_one_over_fewer_resumes(
        tmp_path, caplog):
    """var_list switched from layer a to layer b of one shape handed a's Adam
    state to b without a word (TF: the slots of b are not in the
    checkpoint); a layer frozen since the checkpoint failed with torch's
    bare "loaded state dict contains a parameter group that doesn't match
    the size" (TF's Saver restores what the graph has)."""
    def model_fn(features, labels, mode, params):
        layers = {k: est.get_module(k, lambda: torch.nn.Linear(2, 2)) for k in "ab"}
        pred = layers["b"](layers["a"](torch.as_tensor(features["x"]))).sum(1, True)
        opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.1), var_list=[
            layers[k] for k in params["train"]])
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                                 train_op=opt)

    def train(model_dir, layers):
        torch.manual_seed(0)
        e = est.Estimator(model_fn, model_dir=str(model_dir), params={"train": layers})
        e.train(lambda: itertools.cycle(BATCHES), steps=2)
        return e
    train(tmp_path, "a")
    with pytest.raises(ValueError, match=r"get_optimizer\(name='optimizer'\): the checkpoint "
                       r".*model.ckpt-2 has no optimizer state for \['b/weight', 'b/bias'\] "
                       r"\(its optimizer 'optimizer' is over \['a/weight', 'a/bias'\]\)"):
        train(tmp_path, "b")
    train(tmp_path / "both", "ab")
    e = train(tmp_path / "both", "b")   # a frozen since
    assert e.get_variable_value("global_step") == 4
    assert e.get_variable_value("optimizer/b/weight/step") == 4


def _kind_model_fn(features, labels, mode, params):
    pred = dense(features)
    opt = est.get_optimizer(lambda p: params["kind"](p, lr=0.1))
    return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                             train_op=opt)


def _train_with(model_dir, kind, **kwargs):
    """2 steps of `dense` with the optimizer `kind(params, lr=0.1)` makes."""
    e = est.Estimator(_kind_model_fn, model_dir=str(model_dir), params={"kind": kind}, **kwargs)
    e.train(lambda: itertools.cycle(BATCHES), steps=2)
    return e

def test_a_resumed_optimizer_of_another_kind_is_refused_and_a_warm_start_starts_it_fresh(
        tmp_path, caplog):
    """Adam's state into NAdam failed at the first step with a bare
    KeyError: 'mu_product' (a resume); checkpoints now record each
    optimizer's class, and where it differs the state is checked (an AdamW
    takes an Adam's, as TF's AdamW its slots); a list warm start starts
    another kind fresh."""
    train = _train_with
    train(tmp_path / "adam", torch.optim.Adam)
    with pytest.raises(ValueError, match=r"get_optimizer\(name='optimizer'\): the checkpoint "
                       r".*model.ckpt-2 holds the state of a torch.optim.adam.Adam, which has "
                       r"no \['mu_product'\] that a torch.optim.nadam.NAdam keeps"):
        train(tmp_path / "adam", torch.optim.NAdam)
    assert train(tmp_path / "adam", torch.optim.AdamW).get_variable_value("global_step") == 4
    with caplog.at_level(logging.WARNING):
        warm = train(tmp_path / "warm", torch.optim.Adamax, warm_start_from=est.WarmStartSettings(
            str(tmp_path / "adam"), vars_to_warm_start=[".*"]))
    assert warm.get_variable_value("global_step") == 6   # (AdamW's 4, then 2)
    assert "is not warm-started into Adamax" in caplog.text


def test_a_setting_that_keeps_more_state_is_refused_on_resume_and_warm_starts_fresh(
        tmp_path, caplog):
    """Adam resumed with amsgrad=True from an amsgrad=False checkpoint (the
    same class: its state was not checked) failed at the first step with a
    bare KeyError: 'max_exp_avg_sq'; a list warm start did the same."""
    def train(model_dir, ams, **kwargs):
        return _train_with(model_dir, functools.partial(torch.optim.Adam, amsgrad=ams), **kwargs)
    train(tmp_path / "adam", False)
    with pytest.raises(ValueError, match=r"get_optimizer\(name='optimizer'\): the checkpoint "
                       r".*model.ckpt-2 holds the state of a torch.optim.adam.Adam with "
                       r"amsgrad=False, which has no \['max_exp_avg_sq'\] that one with "
                       r"amsgrad=True keeps"):
        train(tmp_path / "adam", True)
    train(tmp_path / "ams", True)
    assert train(tmp_path / "ams", False).get_variable_value("global_step") == 4   # (less)
    with caplog.at_level(logging.WARNING):
        warm = train(tmp_path / "warm", True, warm_start_from=est.WarmStartSettings(
            str(tmp_path / "adam"), vars_to_warm_start=[".*"]))
    assert warm.get_variable_value("global_step") == 4
    assert "is not warm-started into Adam, whose state starts fresh" in caplog.text
    assert warm.get_variable_value("optimizer/dense/weight/step") == 2


def test_an_earlier_versions_checkpoint_without_optimizer_classes_is_checked_by_its_state(
        tmp_path):
    """A checkpoint of an earlier version records no optimizer class: Adam's
    state resumed by an amsgrad Adam failed with a bare KeyError at the first
    step, and by an SGD with momentum trained on, its next checkpoint holding
    Adam's moments beside SGD's buffer. Now its state is checked."""
    from hooks.checkpoint import Saver
    _train_with(tmp_path / "new", torch.optim.Adam)
    state = est.checkpoint.load(str(tmp_path / "new" / "model.ckpt-2"))
    state.pop("optimizer_kinds")
    state.pop("rng")
    Saver(str(tmp_path / "older")).save(state, 2)
    momentum = functools.partial(torch.optim.SGD, momentum=0.9)
    for kind, missing in ((functools.partial(torch.optim.Adam, amsgrad=True), "max_exp_avg_sq"),
                          (momentum, "momentum_buffer")):
        with pytest.raises(ValueError, match=r"holds the state of an optimizer \(its class not "
                           rf"recorded\), which has no \['{missing}'\] that a torch\.optim\."):
            _train_with(tmp_path / "older", kind)
    assert _train_with(tmp_path / "older", torch.optim.Adam).get_variable_value(
        "global_step") == 4


def test_state_checks_take_the_variables_shape_and_group_and_adamws_settings(tmp_path):
    """The state a class keeps is found by a step on a copy of the variable
    of the checkpoint's first state entry (Adafactor keeps a matrix's row and
    column variances, a vector's variance: an earlier version's Adafactor
    checkpoint was refused), with AdamW's own settings (its defaults hold one
    its constructor refuses: no copy was made, and an amsgrad AdamW resumed
    from Adam's state failed with a bare KeyError at the first step)."""
    from hooks.checkpoint import Saver
    _train_with(tmp_path / "new", torch.optim.Adafactor)
    state = est.checkpoint.load(str(tmp_path / "new" / "model.ckpt-2"))
    state.pop("optimizer_kinds")
    state.pop("rng")
    Saver(str(tmp_path / "older")).save(state, 2)
    assert _train_with(tmp_path / "older", torch.optim.Adafactor).get_variable_value(
        "global_step") == 4
    _train_with(tmp_path / "adam", torch.optim.Adam)
    with pytest.raises(ValueError, match=r"holds the state of a torch\.optim\.adam\.Adam, which "
                       r"has no \['max_exp_avg_sq'\] that a torch\.optim\.adamw\.AdamW keeps"):
        _train_with(tmp_path / "adam", functools.partial(torch.optim.AdamW, amsgrad=True))


def test_a_setting_changed_by_hand_resumes_with_the_state_it_kept(tmp_path):
    """RMSprop(momentum=0.9) whose momentum model_fn turns off from step 1 (a
    cool-down): the checkpoint's group says 0.0 but its state holds the
    momentum buffer; the same program's resume was refused for lacking it."""
    def model_fn(features, labels, mode):
        pred = dense(features)
        opt = est.get_optimizer(lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9))
        if est.get_global_step() >= 1:
            opt.param_groups[0]["momentum"] = 0.0
        return est.EstimatorSpec(mode, loss=est.losses.mean_squared_error(labels, pred),
                                 train_op=opt)
    for steps in (4, 8):
        e = est.Estimator(model_fn, model_dir=str(tmp_path))
        e.train(lambda: itertools.cycle(BATCHES), max_steps=steps)
        assert e.get_variable_value("global_step") == steps


def _late_model_fn(features, labels, mode, params):
    """A second optimizer made from step 2 on (over `b`, which none held
    before), or a renamed one (`params["rename"]`)."""
    a = est.get_module("a", lambda: torch.nn.Linear(2, 2))
    b = est.get_module("b", lambda: torch.nn.Linear(2, 1))
    loss = torch.nn.functional.mse_loss(b(a(features["x"])), labels)
    first = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.1), var_list=a,
                              name=params.get("rename", "first"))
    late = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.1), var_list=b, name="late") \
        if est.get_global_step() >= 2 else None

    def train_op():
        loss.backward()
        for opt in (first, late):
            if opt is not None:
                opt.step()
    return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_an_optimizer_made_after_the_checkpoint_starts_fresh_and_a_renamed_one_is_refused(
        tmp_path, caplog):
    """TF makes every optimizer before the first step, so its checkpoints
    hold them all; one a later step makes here was a ValueError on resuming
    from a checkpoint written before it ('has no optimizer')."""
    def train(steps, **params):
        e = est.Estimator(_late_model_fn, model_dir=str(tmp_path), params=params)
        e.train(lambda: itertools.cycle(BATCHES), steps=steps)
        return e
    train(1)
    with caplog.at_level(logging.WARNING):
        e = train(3)
    assert "has no optimizer 'late' (one made after it was written?): it starts fresh" \
        in caplog.text
    assert e.get_variable_value("late/b/weight/step") == 2
    with pytest.raises(ValueError, match=r"has no optimizer 'renamed' \(its optimizer 'first' "
                                         r"is over these variables: renamed\?\)"):
        train(1, rename="renamed")
