"""est.experimental.InMemoryEvaluatorHook (TF's InMemoryEvaluatorHook):
evaluations of the training's current weights during `train`, on a model
with dropout and batch norm, uneven evaluation batches and float64 input."""
import json
import os
import signal

import numpy as np
import pytest
import torch

import distribute
import estimator as est
import hooks as hooks_lib
from hooks.event_files import read_scalars

RNG = np.random.RandomState(0)
X = RNG.randn(100, 3)                                   # float64, as pandas gives
Y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * RNG.randn(100)
TRAIN = est.inputs.numpy_input_fn({"x": X}, Y, 16, None, True)
EVAL = est.inputs.numpy_input_fn({"x": X[:70]}, Y[:70], 32, 1, False)    # 32, 32, 6


def model_fn(features, labels, mode):
    net = est.get_module("net", lambda: torch.nn.Sequential(
        torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
        torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1)))
    pred = net(features["x"]).squeeze(-1)
    loss = ((pred - labels) ** 2).mean()
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.05)), eval_metric_ops={
        "mae": est.metrics.mean_absolute_error(labels, pred)})


def make(model_dir, **config):
    return est.Estimator(model_fn, config=est.RunConfig(
        model_dir=str(model_dir), tf_random_seed=7, **config))


def variables(estimator):
    return {n: estimator.get_variable_value(n) for n in estimator.get_variable_names()}


def test_evaluates_at_start_every_n_and_at_end_the_weights_of_that_moment(tmp_path):
    estimator = make(tmp_path / "m")
    hook = est.experimental.InMemoryEvaluatorHook(estimator, EVAL, every_n_iter=10,
                                                  name="mem")
    estimator.train(TRAIN, steps=25, hooks=[hook])
    scalars = read_scalars(os.path.join(estimator.eval_dir("mem"), "*tfevents*"))
    assert sorted(scalars) == [0, 10, 20, 25]
    assert scalars[0]["loss"] > 2 * scalars[25]["loss"]            # it learnt
    final = estimator.evaluate(EVAL)                                # the checkpoint at 25
    assert scalars[25]["loss"] == pytest.approx(final["loss"], rel=1e-5)
    assert scalars[25]["mae"] == pytest.approx(final["mae"], rel=1e-5)
    assert estimator.latest_checkpoint().endswith("model.ckpt-25")   # no checkpoint of its own


def test_training_goes_on_as_without_it(tmp_path):
    """Dropout stays on and the random state is the training's (an
    evaluation input that shuffles draws from it): the same weights as a
    training without the hook."""
    with_hook, without = make(tmp_path / "a"), make(tmp_path / "b")
    shuffled = est.inputs.numpy_input_fn({"x": X[:70]}, Y[:70], 32, 1, True)
    with_hook.train(TRAIN, steps=30, hooks=[
        est.experimental.InMemoryEvaluatorHook(with_hook, shuffled, every_n_iter=7)])
    without.train(TRAIN, steps=30)
    a, b = variables(with_hook), variables(without)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_steps_hooks_and_a_second_train_call(tmp_path):
    class Counter(hooks_lib.SessionRunHook):
        def __init__(self):
            self.runs = 0

        def after_run(self, run_context, run_values):
            self.runs += 1
    counter = Counter()
    estimator = make(tmp_path)
    hook = est.experimental.InMemoryEvaluatorHook(estimator, EVAL, steps=2, hooks=[counter],
                                                  every_n_iter=5)
    estimator.train(TRAIN, steps=5, hooks=[hook])
    estimator.train(TRAIN, steps=5, hooks=[hook])     # counts this call's iterations anew
    assert counter.runs == 2 * 6                      # 2 batches x (0, 5, end) x 2 calls
    assert sorted(read_scalars(os.path.join(estimator.eval_dir(), "*tfevents*"))) == [
        0, 5, 10]


def test_bad_arguments(tmp_path, monkeypatch):
    estimator = make(tmp_path)
    for bad in (0, -1, None, 2.5):
        with pytest.raises(ValueError, match="invalid every_n_iter"):
            est.experimental.InMemoryEvaluatorHook(estimator, EVAL, every_n_iter=bad)
    with pytest.raises(TypeError, match="All hooks must be `SessionRunHook` instances"):
        est.experimental.InMemoryEvaluatorHook(estimator, EVAL, hooks=[object()])
    with pytest.raises(TypeError, match="input_fn must be callable"):
        est.experimental.InMemoryEvaluatorHook(estimator, [1, 2])
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                    "ps": ["127.0.0.1:3"]}, "task": {"type": "chief", "index": 0}}))
    clustered = make(tmp_path / "c")
    with pytest.raises(ValueError, match="supports only single machine .* 1 ps and 2 workers"):
        est.experimental.InMemoryEvaluatorHook(clustered, EVAL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_on_two_local_replicas_the_metrics_cover_the_whole_input(tmp_path):
    strategy = distribute.MirroredStrategy(["cpu:0", "cpu:1"])
    estimator = make(tmp_path, train_distribute=strategy)
    hook = est.experimental.InMemoryEvaluatorHook(estimator, EVAL, every_n_iter=4)
    estimator.train(TRAIN, steps=8, hooks=[hook])
    scalars = read_scalars(os.path.join(estimator.eval_dir(), "*tfevents*"))
    assert sorted(scalars) == [0, 4, 8]
    one = make(tmp_path).evaluate(EVAL, name="one")               # one process, checkpoint 8
    assert scalars[8]["mae"] == pytest.approx(one["mae"], rel=1e-5)
    assert scalars[8]["loss"] == pytest.approx(one["loss"], rel=1e-5)


def test_early_stopping_reads_its_evaluations(tmp_path):
    """TF's pattern: an early-stopping hook reading the in-memory evaluations
    from the eval dir. Learning rate 0: the loss never decreases, so training
    stops once 20 steps passed without a decrease, far before max_steps."""
    def frozen(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        loss = ((net(features["x"]).squeeze(-1) - labels) ** 2).mean()
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.0)))
    estimator = est.Estimator(frozen, model_dir=str(tmp_path))
    evaluator = est.experimental.InMemoryEvaluatorHook(estimator, EVAL, every_n_iter=10)
    stop = est.experimental.stop_if_no_decrease_hook(
        estimator, "loss", max_steps_without_decrease=20, run_every_secs=None,
        run_every_steps=5)
    estimator.train(TRAIN, max_steps=500, hooks=[evaluator, stop])
    assert 20 <= estimator.get_variable_value("global_step") <= 30


class _SigtermAt(hooks_lib.SessionRunHook):
    """Sends this process SIGTERM after the step reaching `step` (a preemption)."""

    def __init__(self, step):
        self._step = step

    def after_run(self, run_context, run_values):
        if run_context.session.global_step == self._step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_preemption_skips_the_final_evaluation_and_saves_at_once(tmp_path):
    """The hooks' `end` runs before the preemption checkpoint is saved: a final
    evaluation there would spend the grace period before the kill."""
    estimator = make(tmp_path)
    hook = est.experimental.InMemoryEvaluatorHook(estimator, EVAL, every_n_iter=100)
    with pytest.raises(SystemExit) as info:
        estimator.train(TRAIN, max_steps=50, hooks=[hook, _SigtermAt(7)])
    assert info.value.code == hooks_lib.PREEMPTION_EXIT_CODE
    assert estimator.latest_checkpoint().endswith("model.ckpt-7")
    assert sorted(read_scalars(os.path.join(estimator.eval_dir(), "*tfevents*"))) == [0]
