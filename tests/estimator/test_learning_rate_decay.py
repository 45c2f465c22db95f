"""est.learning_rate_decay: TF1's schedules (values recorded from TF 2.15 by
tests/support/fixtures/record_tf_learning_rate_decay.py), and a model_fn
whose SGD steps use them, step by step as TF's graph does."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_learning_rate_decay.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
decay = est.learning_rate_decay


@pytest.mark.parametrize("case", sorted(TF["cases"]))
def test_schedules_are_tfs(case):
    recorded = TF["cases"][case]
    fn = getattr(decay, recorded["function"])
    arg = "x" if recorded["function"] == "piecewise_constant" else "global_step"
    got = [fn(**recorded["kwargs"], **{arg: step}) for step in TF["steps"]]
    np.testing.assert_allclose(got, recorded["values"], rtol=2e-6, atol=1e-8)   # float32 ulp
    tensor_step = fn(**recorded["kwargs"], **{arg: torch.tensor(TF["steps"][4])})
    assert tensor_step == pytest.approx(recorded["values"][4], rel=2e-6)


def _w_model_fn(placement):
    """loss = w: each SGD step takes the rate off w. The rate, TF's staircase
    exponential_decay (0.1 for global steps 0-9, 0.05 for 10-19, 0.025 for
    20-24), reaches the optimizer as `placement` says."""
    def model_fn(features, labels, mode):
        w = est.get_module("w", lambda: torch.nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            if est.get_global_step() == 0:
                w.weight.fill_(1.0)
        loss = w.weight.sum() + 0.0 * features["x"].sum()
        if placement == "set on the groups each step":
            optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=123.0))
            lr = decay.exponential_decay(0.1, est.get_global_step(), 10, 0.5, staircase=True)
            for group in optimizer.param_groups:
                group["lr"] = lr
        elif placement == "given to the factory":   # TF: GradientDescentOptimizer(lr)
            lr = decay.exponential_decay(0.1, est.get_global_step(), 10, 0.5, staircase=True)
            optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
        elif placement == "given to the factory, by epoch":   # 5 steps an epoch
            lr = decay.piecewise_constant(est.get_global_step() // 5, [1, 3],
                                          [0.1, 0.05, 0.025])
            optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
        else:   # computed in the factory, as TF's canned `optimizer=lambda: ...`
            optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=decay.exponential_decay(
                0.1, est.get_global_step(), 10, 0.5, staircase=True)))
        return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)
    return model_fn


@pytest.mark.parametrize("placement", ["set on the groups each step", "given to the factory",
                                       "given to the factory, by epoch",
                                       "computed in the factory"])
def test_each_step_updates_with_its_steps_rate(tmp_path, placement):
    """After 25 steps w = 1 - the sum of TF's rates at global steps 0..24,
    also where the rate was given to get_optimizer's factory, which runs once
    (before: those stayed at 0.1), and after a restart at step 12."""
    batch = ({"x": torch.zeros(2, 1)}, torch.zeros(2))
    est.Estimator(_w_model_fn(placement), model_dir=str(tmp_path)).train(
        lambda: [batch] * 100, max_steps=12)
    estimator = est.Estimator(_w_model_fn(placement), model_dir=str(tmp_path))
    estimator.train(lambda: [batch] * 100, max_steps=25)
    rates = 10 * 0.1 + 10 * 0.05 + 5 * 0.025
    assert estimator.get_variable_value("w/weight")[0, 0] == pytest.approx(1.0 - rates,
                                                                          rel=1e-6)


def test_a_canned_estimators_optimizer_with_a_decaying_rate_follows_it(tmp_path):
    """TF's DNNClassifier docstring: `optimizer=lambda: tf.keras.optimizers.Adam(
    learning_rate=tf.compat.v1.train.exponential_decay(..., global_step=
    tf.compat.v1.train.get_global_step(), ...))`; here the same lambda taking
    the parameters. The checkpoint holds the last step's rate."""
    columns = [est.feature_column.numeric_column("x")]
    e = est.LinearRegressor(columns, model_dir=str(tmp_path), optimizer=lambda p: torch.optim.SGD(
        p, lr=decay.exponential_decay(0.1, est.get_global_step(), 1, 0.5)))
    e.train(lambda: [({"x": np.ones((4, 1), np.float32)}, np.ones((4, 1), np.float32))] * 3)
    state = est.checkpoint.load(e.latest_checkpoint())
    rates = [g["lr"] for o in state["optimizers"].values() for g in o["param_groups"]]
    assert rates == [pytest.approx(0.1 * 0.5 ** 2)]


def test_a_rate_computed_in_the_factory_from_another_step_is_refused(tmp_path):
    """In the factory (which runs once) a schedule of a step other than the
    global step cannot be followed: a clear error, not a fixed rate."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(1, 1))
        loss = net(features["x"]).sum()
        epoch = est.get_global_step() // 100 + 1
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=decay.piecewise_constant(epoch, [2], [0.1, 0.01]))))
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"get_optimizer\(name='optimizer'\): its factory's "
                                         r"learning rate comes from a schedule given a step "
                                         r"other than est.get_global_step\(\) .*test_learning_"
                                         r"rate_decay.py, in <lambda>.*Compute the rate in "
                                         r"model_fn"):
        e.train(lambda: [({"x": torch.ones(2, 1)}, torch.ones(2))], steps=1)
    assert e.latest_checkpoint() is None


@pytest.mark.parametrize("call, error, match", [
    (lambda: decay.exponential_decay(0.1, None, 10, 0.9), ValueError,
     "global_step is required for exponential_decay"),
    (lambda: decay.exponential_decay(0.1, "7", 10, 0.9), TypeError,
     "global_step must be a number"),
    (lambda: decay.polynomial_decay(0.1, 3, 0), ValueError,
     "polynomial_decay: decay_steps must be a positive number, got 0"),
    (lambda: decay.piecewise_constant(3, [10, 20], [1.0, 0.5]), ValueError,
     "The length of boundaries should be 1 less than the length of values"),
    (lambda: decay.piecewise_constant(3, [20, 10], [1.0, 0.5, 0.1]), ValueError,
     "boundaries must be increasing"),
    # (TF's rate is NaN past the periods' end; it was Python's "math domain error")
    (lambda: decay.cosine_decay_restarts(0.1, 80, 40, t_mul=0.5), ValueError,
     "with t_mul=0.5 < 1 the periods add up to 80 steps, and step 80 is past their end"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def _warmup_model_fn(rate_given):
    """BERT's optimization.create_optimizer: polynomial decay with a linear
    warmup blended in by arithmetic; the rate given to the factory
    ("given"), set by hand in a callable train_op ("by_hand"), or not given
    (the factory's rate is model_fn's first warmup rate, 0.0, by its own
    arithmetic: "not_given")."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1, bias=False))
        loss = net(features["x"]).sum()
        step = est.get_global_step()
        lr = decay.polynomial_decay(0.1, step, 100, end_learning_rate=0.0)
        is_warmup = float(step < 5)
        lr = (1.0 - is_warmup) * lr + is_warmup * 0.1 * step / 5
        if rate_given == "not_given":
            optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.0))
        else:
            optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
        if rate_given != "by_hand":
            return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)

        def train_op():
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


@pytest.mark.parametrize("rate_given", ["given", "by_hand", "not_given"])
def test_a_rate_made_by_arithmetic_is_followed_and_one_no_optimizer_takes_is_warned(
        tmp_path, caplog, rate_given):
    """A schedule blended with a warmup (BERT) is another number each step;
    given to the factory, the optimizer takes each step's (it trained at
    step 0's rate, 0.0, without a word), as when set by hand in a callable
    train_op. Where the optimizer is given another number, a warning says
    so, a step after the schedule moved."""
    e = est.Estimator(_warmup_model_fn(rate_given),
                      config=est.RunConfig(model_dir=str(tmp_path), tf_random_seed=1))
    x = torch.ones(1, 3)
    e.train(lambda: [({"x": x}, None)] * 10)
    warned = [r for r in caplog.records if "computes a learning-rate schedule that moves" in
              r.getMessage()]
    weight = e.get_variable_value("net/weight")
    initial = est.Estimator(_warmup_model_fn(rate_given), config=est.RunConfig(
        model_dir=str(tmp_path / "x"), tf_random_seed=1))
    initial.train(lambda: [({"x": x}, None)], max_steps=1)   # step 0's rate is 0
    if rate_given != "not_given":   # each step's rate: warmup 0, .02, .04, .06, .08, then decay
        rates = [0.1 * s / 5 for s in range(5)] + [0.1 * (1 - s / 100) for s in range(5, 10)]
        np.testing.assert_allclose(weight, initial.get_variable_value("net/weight")
                                   - sum(rates[1:]), rtol=1e-5)
        assert not warned
    else:
        np.testing.assert_array_equal(weight, initial.get_variable_value("net/weight"))
        assert len(warned) == 1 and "stays at 0.0" in warned[0].getMessage()


def test_noisy_linear_cosine_decay_is_linear_cosine_decay_with_tfs_noise():
    """It was not here (an AttributeError for a TF program using it): the
    noise's variance decays as TF's, each step draws anew, the same step the
    same (however often computed), repeatable with torch's seed."""
    torch.manual_seed(3)
    args = dict(decay_steps=1000, initial_variance=0.5, variance_decay=0.55)
    noisy = np.array([decay.noisy_linear_cosine_decay(1.0, s, **args) for s in range(1000)])
    plain = np.array([decay.linear_cosine_decay(1.0, s, 1000) for s in range(1000)])
    cosine = 0.5 * (1.0 + np.cos(np.pi * np.arange(1000) / 1000))
    noise = (noisy - plain) / np.where(cosine > 1e-3, cosine, np.nan)
    scaled = noise / np.sqrt(0.5 / (1.0 + np.arange(1000)) ** 0.55)
    scaled = scaled[np.isfinite(scaled)]
    assert abs(scaled.mean()) < 0.1 and abs(scaled.std() - 1.0) < 0.1   # (N(0, 1))
    assert decay.noisy_linear_cosine_decay(1.0, 7, **args) == noisy[7]
    torch.manual_seed(3)
    assert decay.noisy_linear_cosine_decay(1.0, 7, **args) == noisy[7]
    torch.manual_seed(4)
    assert decay.noisy_linear_cosine_decay(1.0, 7, **args) != noisy[7]


@pytest.mark.parametrize("in_factory", [False, True])
def test_a_custom_loops_schedule_computed_once_follows_the_step(tmp_path, in_factory):
    """TF1's cifar10_train computes `lr = exponential_decay(..., global_step,
    ...)` once and a MonitoredTrainingSession loop runs; TF reads the rate
    at every step. The optimizer built before the loop kept the first step's
    rate for the whole run (and a resumed run the restored step's)."""
    import hooks

    def expected(step):
        return est.learning_rate_decay.exponential_decay(0.1, step, 4, 0.1, staircase=True)

    for last_step, start in ((6, 0), (11, 6)):   # (the second resumes at step 6)
        used = []
        with hooks.MonitoredTrainingSession(
                checkpoint_dir=str(tmp_path), save_checkpoint_steps=3,
                hooks=[hooks.StopAtStepHook(last_step=last_step)]) as sess:
            net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
            if in_factory:
                opt = est.get_optimizer(lambda p: torch.optim.SGD(
                    p, lr=est.learning_rate_decay.exponential_decay(
                        0.1, est.get_global_step(), 4, 0.1, staircase=True)))
            else:
                lr = est.learning_rate_decay.exponential_decay(0.1, est.get_global_step(), 4,
                                                               0.1, staircase=True)
                opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
            assert est.get_global_step() == start

            def step(x):
                opt.zero_grad()
                loss = net(x).pow(2).mean()
                loss.backward()
                opt.step()
                used.append((est.get_global_step(), opt.param_groups[0]["lr"]))
                return loss
            while not sess.should_stop():
                sess.run(step, torch.ones(4, 2))
        assert used == [(s, pytest.approx(expected(s))) for s in range(start, last_step)]


def _custom_loop(last_step, build, set_by_hand=None):
    """The (step, rate) of each step of a MonitoredTrainingSession loop whose
    optimizer `build()` makes before the loop (`set_by_hand(step, group)`:
    the loop's own rate, set before each step)."""
    import hooks
    used = []
    with hooks.MonitoredTrainingSession(
            checkpoint_dir=None, hooks=[hooks.StopAtStepHook(last_step=last_step)]) as sess:
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        opt = build()

        def step(x):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            if set_by_hand:
                set_by_hand(est.get_global_step(), opt.param_groups[0])
            opt.step()
            used.append((est.get_global_step(), opt.param_groups[0]["lr"]))
        while not sess.should_stop():
            sess.run(step, torch.ones(4, 2))
    return used


def test_a_custom_loops_rate_set_by_hand_is_left_as_given():
    """A rate the loop sets by hand at each step is the loop's (it was
    overwritten by the schedule's once custom loops followed it)."""
    def scheduled():
        lr = est.learning_rate_decay.exponential_decay(0.1, est.get_global_step(), 1, 0.5)
        return est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))

    def warmup(step, group):
        group["lr"] = 0.01 * (step + 1)
    assert [r for _, r in _custom_loop(4, scheduled, warmup)] == [
        pytest.approx(0.01 * (s + 1)) for s in range(4)]
