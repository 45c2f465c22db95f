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


def test_each_step_updates_with_its_steps_rate(tmp_path):
    """loss = w: each SGD step takes the rate off w, so after 25 steps
    w = 1 - the sum of TF's rates at global steps 0..24 (staircase: 0.1 for
    steps 0-9, 0.05 for 10-19, 0.025 for 20-24)."""
    def model_fn(features, labels, mode):
        w = est.get_module("w", lambda: torch.nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            if est.get_global_step() == 0:
                w.weight.fill_(1.0)
        loss = w.weight.sum() + 0.0 * features["x"].sum()
        optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=123.0))
        lr = decay.exponential_decay(0.1, est.get_global_step(), 10, 0.5, staircase=True)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path))
    batch = ({"x": torch.zeros(2, 1)}, torch.zeros(2))
    estimator.train(lambda: [batch] * 100, max_steps=25)
    rates = 10 * 0.1 + 10 * 0.05 + 5 * 0.025
    assert estimator.get_variable_value("w/weight")[0, 0] == pytest.approx(1.0 - rates,
                                                                          rel=1e-6)


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
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
