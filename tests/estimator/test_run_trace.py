"""What a plain run leaves behind and calls, against TF 2.15's recording
(tests/support/fixtures/record_tf_run_trace.py): the checkpoints each `train`
keeps, the CheckpointSaverListener calls, a CheckpointSaverHook of the user's,
`evaluate`'s directory and the steps a local `train_and_evaluate` evaluates.

One difference is documented (docs/migration.md, "Checkpoints"): TF saves when
a training session starts (model.ckpt-0 on a fresh run, the restored step
again on a resumed one, with its listener calls); here the model is built by
the first step's model_fn call, so the first save is the first periodic one.
"""
import json
import os

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import distribute
import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_run_trace.json"), encoding="utf-8") as _f:
    TF = json.load(_f)

X = np.arange(16, dtype=np.float32).reshape(8, 2) / 16.0
Y = (X @ np.array([[1.0], [-2.0]], dtype=np.float32) + 0.5).astype(np.float32)


def input_fn(repeat=True):
    def batches():
        while True:
            for i in range(0, 8, 4):
                yield {"x": torch.from_numpy(X[i:i + 4])}, torch.from_numpy(Y[i:i + 4])
            if not repeat:
                return
    return batches


def model_fn(features, labels, mode):
    pred = est.get_module("dense", lambda: torch.nn.Linear(2, 1))(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": pred})
    loss = torch.nn.functional.mse_loss(pred, labels)
    return est.EstimatorSpec(
        mode, loss=loss, train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)),
        eval_metric_ops={"mae": est.metrics.mean_absolute_error(labels, pred)})


class Listener(est.CheckpointSaverListener):
    def __init__(self):
        self.calls = []

    def begin(self):
        self.calls.append(["begin", None])

    def before_save(self, session, global_step_value):
        self.calls.append(["before_save", global_step_value])

    def after_save(self, session, global_step_value):
        self.calls.append(["after_save", global_step_value])

    def end(self, session, global_step_value):
        self.calls.append(["end", global_step_value])


def without_session_start_save(calls):
    """TF's listener calls less the save TF makes when the session starts
    (the pair right after `begin`)."""
    assert calls[:3] == [["begin", None], ["before_save", calls[1][1]],
                         ["after_save", calls[1][1]]]
    return calls[:1] + calls[3:]


def checkpoints(model_dir):
    kept = [est.checkpoint.step_of(p) for p in est.checkpoint.all_checkpoints(model_dir)]
    return {"latest": est.checkpoint.step_of(est.checkpoint.latest_checkpoint(model_dir)),
            "listed": kept, "on_disk": kept}


def tfs_checkpoints(recorded, started_fresh):
    """TF's kept checkpoints less model.ckpt-0 of a fresh session's start."""
    return {k: [s for s in v if s or not started_fresh] if isinstance(v, list) else v
            for k, v in recorded.items()}


def config(model_dir, **kw):
    return est.RunConfig(model_dir=str(model_dir), tf_random_seed=1, save_summary_steps=100,
                         log_step_count_steps=100, **kw)


def test_train_twice_keeps_and_tells_listeners_as_tf(tmp_path):
    e = est.Estimator(model_fn, config=config(tmp_path, save_checkpoints_steps=3,
                                              keep_checkpoint_max=3))
    for call, train in (("first_train", dict(max_steps=7)), ("second_train", dict(steps=4))):
        listener = Listener()
        e.train(input_fn(), saving_listeners=[listener], **train)
        recorded = TF["train_twice"][call]
        assert checkpoints(tmp_path) == tfs_checkpoints(recorded["checkpoints"], False)
        assert listener.calls == without_session_start_save(recorded["listener"])


def test_evaluate_with_a_name_writes_where_tf_writes(tmp_path):
    e = est.Estimator(model_fn, config=config(tmp_path, save_checkpoints_steps=3))
    e.train(input_fn(), max_steps=11)
    result = e.evaluate(input_fn(repeat=False), name="val")
    recorded = TF["train_twice"]["evaluate"]
    assert sorted(result) == recorded["keys"]
    assert result["global_step"] == recorded["global_step"]
    assert sorted(d for d in os.listdir(tmp_path) if d.startswith("eval")) == recorded["dirs"]
    events = EventAccumulator(str(tmp_path / "eval_val"))
    events.Reload()
    assert [s.step for s in events.Scalars("loss")] == recorded["steps"]


def test_saving_listeners_without_checkpoints_are_tfs_error(tmp_path):
    """They were never called: RunConfig saves no checkpoint to call them on."""
    e = est.Estimator(model_fn, config=config(tmp_path, save_checkpoints_steps=None,
                                              save_checkpoints_secs=None))
    recorded = TF["no_periodic_saves"]
    listener = Listener()
    with pytest.raises(ValueError) as raised:
        e.train(input_fn(), max_steps=5, saving_listeners=[listener])
    assert str(raised.value) == recorded["listeners_error"]
    assert listener.calls == [] and e.latest_checkpoint() is None
    e.train(input_fn(), max_steps=5)     # and without listeners: TF saves nothing at all
    assert est.checkpoint.all_checkpoints(str(tmp_path)) == recorded["on_disk"] == []


@pytest.mark.parametrize("where", ["hooks", "spec"])
def test_a_users_checkpoint_saver_hook_saves_instead_of_run_configs(tmp_path, where):
    """A CheckpointSaverHook in `hooks` or in the EstimatorSpec's
    training_chief_hooks replaces RunConfig's saver (every 3 steps here) and
    takes saving_listeners, as in TF; here both saved, the listeners went to
    RunConfig's."""
    own = Listener()
    hook = est.CheckpointSaverHook(str(tmp_path), save_steps=2, listeners=[own])

    def with_chief_hook(features, labels, mode):
        spec = model_fn(features, labels, mode)
        return spec._replace(training_chief_hooks=[hook]) if mode == est.ModeKeys.TRAIN \
            else spec

    e = est.Estimator(with_chief_hook if where == "spec" else model_fn,
                      config=config(tmp_path, save_checkpoints_steps=3))
    given = Listener()
    e.train(input_fn(), max_steps=5, hooks=[hook] if where == "hooks" else None,
            saving_listeners=[given])
    recorded = TF["own_saver_hook_in_" + where]
    assert checkpoints(tmp_path) == tfs_checkpoints(recorded["checkpoints"], True)
    assert own.calls == without_session_start_save(recorded["own_listener"])
    assert given.calls == without_session_start_save(recorded["listener"])


def test_a_users_checkpoint_saver_hook_keeps_run_configs_number_as_tf(tmp_path):
    """A CheckpointSaverHook made without a saver saves through the
    Estimator's (TF: the graph's Saver, made with keep_checkpoint_max): 2
    kept here, where it kept its own Saver's default 5."""
    hook = est.CheckpointSaverHook(str(tmp_path), save_steps=2)
    e = est.Estimator(model_fn, config=config(tmp_path, keep_checkpoint_max=2))
    e.train(input_fn(), max_steps=11, hooks=[hook])
    assert checkpoints(tmp_path) == TF["own_saver_hook_keeps"]["checkpoints"]


def test_local_train_and_evaluate_evaluates_after_the_saves_tf_evaluates_after(tmp_path):
    e = est.Estimator(model_fn, config=config(tmp_path, save_checkpoints_steps=3))
    est.train_and_evaluate(e, est.TrainSpec(input_fn(), max_steps=7),
                           est.EvalSpec(input_fn(repeat=False), steps=None, throttle_secs=0,
                                        start_delay_secs=0))
    recorded = TF["local_train_and_evaluate"]
    assert checkpoints(tmp_path) == tfs_checkpoints(recorded["checkpoints"], True)
    events = EventAccumulator(str(tmp_path / "eval"))
    events.Reload()
    assert sorted(s.step for s in events.Scalars("loss")) == recorded["eval_steps"]


def test_local_train_and_evaluate_without_checkpoints_is_tfs_error(tmp_path):
    """It trained to the end and evaluated nothing, saying nothing."""
    e = est.Estimator(model_fn, config=config(tmp_path, save_checkpoints_steps=None,
                                              save_checkpoints_secs=None))
    with pytest.raises(ValueError) as raised:
        est.train_and_evaluate(e, est.TrainSpec(input_fn(), max_steps=4),
                               est.EvalSpec(input_fn(repeat=False), throttle_secs=0))
    assert str(raised.value) == TF["local_train_and_evaluate_without_saves"]["error"]


class FetchesGlobalStep(est.SessionRunHook):
    def __init__(self, model_dir):
        self.seen = []
        self.checkpoints = []
        self._model_dir = str(model_dir)

    def _latest(self):
        path = est.checkpoint.latest_checkpoint(self._model_dir)
        return est.checkpoint.step_of(path) if path else None

    def before_run(self, run_context):
        return est.SessionRunArgs("global_step")

    def after_run(self, run_context, run_values):
        self.seen.append([run_values.results, run_context.session.global_step])
        self.checkpoints.append(["after_run", self._latest()])

    def end(self, session):
        self.checkpoints.append(["end", self._latest()])


def test_a_hooks_fetched_global_step_and_the_logged_steps_are_tfs(tmp_path, caplog):
    """TF's fetch of the global step reads it beside the train_op, before the
    update (0 on the first step; a ported hook adds 1, as TF's own do), and
    the Estimator logs `loss = ..., step = 0, 2, 4`; here both were a step
    later. TF's saver runs before the user's hooks: a step's checkpoint, and
    the final one at the end, are there when they look (here they were not:
    a hook's `end` saw the checkpoint before the final one). Saves on the
    step, as TF's: an asynchronous one (the default) is there once written."""
    hook = FetchesGlobalStep(tmp_path)
    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=str(tmp_path), tf_random_seed=1, log_step_count_steps=2,
        save_checkpoints_steps=2, experimental_async_checkpoint=False))
    with caplog.at_level("INFO"):
        e.train(input_fn(), max_steps=5, hooks=[hook])
    recorded = TF["hook_fetches"]
    assert hook.seen == recorded["fetched_and_after"]
    # (less TF's model.ckpt-0 of the session's start: none here yet)
    assert hook.checkpoints == [[when, step or None]
                                for when, step in recorded["checkpoints_seen"]]
    logged = [int(r.getMessage().split("step = ")[1].split()[0]) for r in caplog.records
              if r.getMessage().startswith("loss = ")]
    assert logged == recorded["logged_steps"]


class FetchesLoss(est.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return est.SessionRunArgs("loss")

    def after_run(self, run_context, run_values):
        self.losses.append(run_values.results)


def test_evaluate_before_training_evaluates_the_model_training_starts_from(tmp_path, caplog):
    """TF evaluates the initialization when model_dir has no checkpoint (a
    baseline before training); here it was an error."""
    first_batch = [next(input_fn()())]
    e = est.Estimator(model_fn, config=config(tmp_path))
    rng = torch.get_rng_state()
    with caplog.at_level("WARNING"):
        result = e.evaluate(lambda: first_batch)
    assert "running initialization to evaluate" in caplog.text
    assert torch.equal(torch.get_rng_state(), rng)      # the caller's stream untouched
    recorded = TF["evaluate_without_checkpoint"]
    assert sorted(result) == recorded["keys"] and result["global_step"] == 0
    events = EventAccumulator(str(tmp_path / "eval"))
    events.Reload()
    assert [s.step for s in events.Scalars("loss")] == recorded["steps"] == [0]
    losses = FetchesLoss()
    e.train(input_fn(), max_steps=1, hooks=[losses])     # seeded alike: the same model
    assert losses.losses == [pytest.approx(result["loss"], rel=1e-6)]


def initial_model_fn(features, labels, mode):
    """A model whose initial values are drawn at random (batch norm, dropout,
    a lazy layer)."""
    body = est.get_module("body", lambda: torch.nn.Sequential(
        torch.nn.Linear(2, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5)))
    pred = est.get_module("head", lambda: torch.nn.LazyLinear(1))(body(features["x"]))
    loss = torch.nn.functional.mse_loss(pred, labels)
    return est.EstimatorSpec(
        mode, loss=loss, train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)),
        eval_metric_ops={"mae": est.metrics.mean_absolute_error(labels, pred),
                         "mean": est.metrics.mean(pred)})


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True])
def test_evaluate_before_training_on_replicas_evaluates_one_initial_model(tmp_path, warm):
    """TF initializes a mirrored variable once; here each replica drew an
    initial model of its own (replicas past rank 0 draw from streams of
    their own), so evaluating it on several replicas was refused. Now every
    replica takes rank 0's initial values (a lazy layer's once its first
    batch makes them): the evaluation is one process's, warm-started or not."""
    x = torch.randn(37, 2, generator=torch.Generator().manual_seed(3))
    y = torch.randn(37, 1, generator=torch.Generator().manual_seed(4))
    batches = [({"x": a}, b) for a, b in zip(x.split(8), y.split(8))]   # the last one short
    warm_start = None
    if warm:   # the body from a trained model, the lazy head at its initial values
        trained = est.Estimator(initial_model_fn, str(tmp_path / "trained"))
        trained.train(lambda: batches, max_steps=3)
        warm_start = est.WarmStartSettings(trained.model_dir, vars_to_warm_start="body.*")
    results = []
    for devices in (["cpu:0"], ["cpu:0", "cpu:1"]):
        e = est.Estimator(initial_model_fn, warm_start_from=warm_start, config=est.RunConfig(
            model_dir=str(tmp_path / str(len(devices))), tf_random_seed=1,
            eval_distribute=distribute.MirroredStrategy(devices)))
        results.append(e.evaluate(lambda: batches))
    one, two = results
    assert two == {k: pytest.approx(v, rel=1e-5) for k, v in one.items()}
    assert one["global_step"] == 0
