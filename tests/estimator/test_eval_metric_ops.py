"""Metrics as TF1 programs use them (issue 12): train-time metrics in
summaries, custom `est.metrics.Metric`s and scalar tensors in
`eval_metric_ops`, exact over uneven batches and over two Mirrored replicas."""
import os

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import distribute
import estimator as est
import hooks

rng = np.random.RandomState(3)
N = 101                                   # uneven batches: 13 x 7 + 10
X = rng.randn(N, 2).astype(np.float32)
Y = rng.rand(N).astype(np.float32) + 0.5  # regression labels, > 0
GUESS = rng.randint(0, 2, N)              # a fixed "prediction" for a train-time accuracy
CLASS = rng.randint(0, 2, N)
SIZES = [7] * 13 + [10]


def _batches():
    out, i = [], 0
    for n in SIZES:
        sl = slice(i, i + n)
        out.append(({"x": X[sl], "guess": GUESS[sl]}, Y[sl]))
        i += n
    return out


class MeanRelativeError(est.metrics.Metric):
    """A user's streaming metric: sum/count state."""

    def __init__(self):
        super().__init__()
        self._add_state("total")
        self._add_state("count")

    def update_state(self, labels, predictions):
        err = ((predictions - labels).abs() / labels.abs()).double()
        self.total += err.sum()
        self.count += err.numel()

    def result(self):
        return self.total / self.count


def model_fn(features, labels, mode):
    net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
    pred = net(features["x"]).squeeze(-1)
    loss = torch.nn.functional.mse_loss(pred, labels)
    if mode == est.ModeKeys.TRAIN:
        acc = est.metrics.accuracy(torch.as_tensor(features["guess"]) > 0, labels > 1.0)
        est.summary.scalar("train_accuracy", acc[1])
        est.named_tensor("train_accuracy", acc[1])
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.01))
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)
    mre = MeanRelativeError()       # new each call: the framework adds the batches up
    mre.update_state(labels, pred)
    return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        "mre": mre,
        "abs_error": (pred - labels).abs().mean(),      # a scalar tensor, per batch
        "mae": est.metrics.mean_absolute_error(labels, pred),
        "auc": est.metrics.auc(labels > 1.0, torch.sigmoid(pred)),
        "auc_pr": est.metrics.auc(labels > 1.0, torch.sigmoid(pred), curve="PR"),
    })


def _expected(e, rows=slice(None)):
    w = e.get_variable_value("net/weight").astype(np.float64)
    b = e.get_variable_value("net/bias").astype(np.float64)
    pred = (X[rows].astype(np.float64) @ w.T + b).ravel()
    err = np.abs(pred - Y[rows])
    return {"mre": (err / np.abs(Y[rows])).mean(), "abs_error": err.mean(), "mae": err.mean()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("metrics") / "m")
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=model_dir, save_summary_steps=3,
                                                     tf_random_seed=0))
    e.train(_batches)
    return e


def test_train_time_metric_summary_is_the_running_accuracy(trained):
    acc = EventAccumulator(trained.model_dir, size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("train_accuracy")
    assert [ev.step for ev in events] == [1, 4, 7, 10, 13]
    hits = np.concatenate([(g > 0) == (y > 1.0) for (f, y) in _batches()
                           for g in [f["guess"]]])
    ends = np.cumsum(SIZES)
    for ev in events:   # summaries are recorded on the step they are due, after its batch
        want = hits[:ends[ev.step - 1]].mean()
        assert ev.value == pytest.approx(want, abs=1e-6), ev.step
    assert 0 < events[-1].value < 1


def test_a_hook_fetches_a_train_time_metric_as_tfs_float32(tmp_path):
    """TF's `accuracy[1]` is a float32 tensor, so a hook's fetched value is
    np.float32; ours was np.float64 (the metric's state), which the docs'
    "as TF's session.run gives them" does not say (docs probe)."""
    fetched = []

    class Fetch(hooks.SessionRunHook):
        def before_run(self, run_context):
            return hooks.SessionRunArgs(["train_accuracy", "loss"])

        def after_run(self, run_context, run_values):
            fetched.append(run_values.results)
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path)))
    e.train(_batches, steps=2, hooks=[Fetch()])
    assert [(type(a), type(loss)) for a, loss in fetched] == [(np.float32, np.float32)] * 2


def test_a_train_time_metric_is_not_checkpointed_as_tf(trained):
    """TF's metric variables are local: not in checkpoints. Its running
    state was saved (on replicas, replica 0's counts) and listed as
    variables `accuracy/count` and `accuracy/total`."""
    assert trained.get_variable_names() == ["global_step", "net/bias", "net/weight"]


def test_custom_metric_and_scalar_tensor_are_exact_over_uneven_batches(trained):
    results = trained.evaluate(_batches)
    want = _expected(trained)
    for key in ("mre", "abs_error", "mae"):
        assert results[key] == pytest.approx(want[key], rel=1e-5), key
    batch_means = _expected(trained, slice(N - 10, N))   # the last batch alone differs
    assert abs(batch_means["mre"] - want["mre"]) > 1e-3
    assert results["auc"] != results["auc_pr"]   # two auc calls: auc and auc_1


@pytest.mark.slow
def test_custom_metric_and_scalar_tensor_are_exact_on_two_mirrored_replicas(trained, tmp_path):
    strategy = distribute.MirroredStrategy(["cpu:0", "cpu:1"])
    two = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=trained.model_dir, eval_distribute=strategy))
    results = two.evaluate(_batches, name="two")
    want = _expected(trained)
    for key in ("mre", "abs_error", "mae"):
        assert results[key] == pytest.approx(want[key], rel=1e-5), key
    alone = trained.evaluate(_batches, name="one")
    assert results["auc"] == pytest.approx(alone["auc"], abs=1e-9)
    assert os.path.isdir(os.path.join(trained.model_dir, "eval_two"))


def _eval_with(value_fn, tmp_path, key="bad"):
    def fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        pred = net(features["x"]).squeeze(-1)
        loss = torch.nn.functional.mse_loss(pred, labels)
        if mode == est.ModeKeys.TRAIN:
            return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
                lambda p: torch.optim.SGD(p, lr=0.01)))
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={key: value_fn(pred)})
    e = est.Estimator(fn, model_dir=str(tmp_path / "bad"))
    e.train(_batches, steps=1)
    return e.evaluate(_batches)


def test_unsupported_metric_values_are_errors_naming_the_key(tmp_path):
    with pytest.raises(TypeError, match=r"eval_metric_ops\['bad'\].*tensor of shape \(7,\)"):
        _eval_with(lambda pred: pred, tmp_path)
    with pytest.raises(TypeError, match=r"eval_metric_ops\['bad'\].*float"):
        _eval_with(lambda pred: 0.5, tmp_path)
    with pytest.raises(TypeError, match=r"eval_metric_ops\['bad'\].*update_op"):
        _eval_with(lambda pred: (pred.mean(), pred.mean()), tmp_path)
    shared = MeanRelativeError()
    with pytest.raises(ValueError, match=r"eval_metric_ops\['bad'\]: the same "
                                         r"MeanRelativeError object"):
        _eval_with(lambda pred: shared, tmp_path)


def test_a_metric_named_loss_or_global_step_is_an_error_as_in_tf(tmp_path):
    """TF1 refuses them; they were dropped, evaluate reporting its own loss."""
    for key in ("loss", "global_step"):
        with pytest.raises(ValueError, match=f'Metric with name "{key}" is not allowed.*'
                                             f"eval_metric_ops\\['{key}'\\]"):
            _eval_with(lambda pred: est.metrics.mean(pred), tmp_path / key, key=key)


def test_tf_pair_from_a_metric_in_eval_metric_ops_is_the_metric(tmp_path):
    results = _eval_with(lambda pred: est.metrics.mean(pred), tmp_path)
    assert isinstance(results["bad"], np.float32)   # as TF
