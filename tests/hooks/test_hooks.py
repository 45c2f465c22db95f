"""The built-in hooks: LoggingTensorHook, NanTensorHook, GlobalStepWaiterHook,
FinalOpsHook, FeedFnHook, ProfilerHook, early stopping, the progress display,
and the Estimator's default worker hooks."""
import io
import json
import logging
import math
import os
import sys
import threading
import time

import numpy as np
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

import distribute
import estimator as est
import hooks
from estimator import checkpoint
from hooks import model_scope
from hooks import monitored_session
from models import regression_input_fn, regression_model_fn

HOOKS_LOG = "hooks.basic_session_run_hooks"
EVERY_STEP = {"run_every_secs": None, "run_every_steps": 1}


def session(hook_list, mode=est.ModeKeys.TRAIN, model_dir=None, is_chief=None):
    return hooks.MonitoredSession(model_scope.ModelScope(mode, distribute.get_strategy()),
                                  hook_list, model_dir, is_chief)


def step(value=1.0):
    loss = torch.tensor(float(value))
    est.named_tensor("double", loss * 2)
    return {"loss": loss}


def run_steps(sess, n, fn=step, *args):
    for _ in range(n):
        if sess.should_stop():
            break
        sess.run(fn, *args)


def make(tmp_path, model_fn=regression_model_fn, name="m", **config):
    return est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path / name),
                                                        **config), params={"lr": 0.1})


@pytest.fixture
def count_to_host(monkeypatch):
    """Counts the session's copies to the host (one per step that fetches)."""
    calls = []
    real = monitored_session._to_host

    def counting(values):
        calls.append(sorted(values))
        return real(values)
    monkeypatch.setattr(monitored_session, "_to_host", counting)
    return calls


def checkpoint_steps(model_dir):
    return sorted(checkpoint.step_of(p) for p in checkpoint.all_checkpoints(model_dir))


# -- LoggingTensorHook --------------------------------------------------------------
def test_logging_hook_copies_to_host_on_one_step_in_ten(count_to_host, caplog):
    hook = hooks.LoggingTensorHook({"loss": "loss", "step": "global_step"}, every_n_iter=10)
    with caplog.at_level(logging.INFO, logger=HOOKS_LOG), session([hook]) as sess:
        run_steps(sess, 100)
    assert len(count_to_host) == 10
    lines = [r.getMessage() for r in caplog.records if r.name == HOOKS_LOG]
    # the fetched global step is the one the step read (TF logs step = 0 first)
    assert lines[0] == "loss = 1.0, step = 0"
    assert len(lines) == 10 and lines[1].startswith("loss = 1.0, step = 10 (")
    assert lines[1].endswith(" sec)")


def test_estimator_default_hooks_fetch_once_per_log_step_count_steps(tmp_path, count_to_host,
                                                                       caplog):
    e = make(tmp_path, log_step_count_steps=10, save_summary_steps=0)
    with caplog.at_level(logging.INFO, logger=HOOKS_LOG):
        e.train(regression_input_fn(), steps=100)
    assert len(count_to_host) == 10
    assert all(names == ["global_step", "loss"] for names in count_to_host)
    lines = [r.getMessage() for r in caplog.records if r.name == HOOKS_LOG
             and r.getMessage().startswith("loss = ")]
    # TF's lines: the step each logged step read, before its update
    assert [int(line.split("step = ")[1].split()[0]) for line in lines] == list(range(0, 100, 10))


def test_logging_hook_list_tags_formatter_and_at_end(caplog):
    seen = []
    hook_list = [
        hooks.LoggingTensorHook(["double", "loss"], every_n_iter=2),
        hooks.LoggingTensorHook("loss", at_end=True),
        hooks.LoggingTensorHook({"z": "loss", "a": "double"}, every_n_iter=100,
                                formatter=lambda values: seen.append(values) or "custom"),
    ]
    with caplog.at_level(logging.INFO, logger=HOOKS_LOG), session(hook_list) as sess:
        for v in (1.0, 2.0, 3.0):
            sess.run(step, v)
    lines = [r.getMessage() for r in caplog.records if r.name == HOOKS_LOG]
    assert lines[0] == "double = 2.0, loss = 1.0"
    assert lines[1] == "custom" and seen == [{"z": 1.0, "a": 2.0}]
    assert lines[2].startswith("double = 6.0, loss = 3.0 (")
    assert lines[3] == "loss = 3.0"      # at_end: the last step's value, no extra step


def test_logging_hook_every_n_secs(caplog):
    hook = hooks.LoggingTensorHook(["loss"], every_n_secs=0.05)
    with caplog.at_level(logging.INFO, logger=HOOKS_LOG), session([hook]) as sess:
        for _ in range(4):
            sess.run(step)
            sess.run(step)
            time.sleep(0.06)
    assert len([r for r in caplog.records if r.name == HOOKS_LOG]) == 4


@pytest.mark.parametrize("kwargs, error, message", [
    ({"every_n_iter": 10, "every_n_secs": 5}, ValueError,
     "either at_end and/or exactly one of every_n_iter and every_n_secs must be provided"),
    ({}, ValueError, "either at_end and/or exactly one of every_n_iter and every_n_secs"),
    ({"every_n_iter": 0}, ValueError, "invalid every_n_iter=0"),
    ({"every_n_iter": 2.5}, ValueError, "invalid every_n_iter=2.5"),
    ({"every_n_secs": -1}, ValueError, "invalid every_n_secs=-1"),
    ({"every_n_iter": 1, "formatter": "x"}, TypeError, "formatter must be callable"),
])
def test_logging_hook_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        hooks.LoggingTensorHook(["loss"], **kwargs)


def test_logging_hook_rejects_tensors_outside_a_model_fn():
    with pytest.raises(TypeError, match=r"named by strings.*est.named_tensor.*or given as "
                                        r"tensors inside a model_fn"):
        hooks.LoggingTensorHook([torch.tensor(1.0)], every_n_iter=1)


def test_hooks_given_tensors_in_a_model_fn_see_each_steps_values(tmp_path, caplog):
    """TF1's `LoggingTensorHook({"loss": loss, "accuracy": accuracy[1]})` and
    `NanTensorHook(loss)` in `training_hooks`: TF fetches the graph's tensors
    every step; here the model_fn runs every step, and the session's hooks
    (the first step's) log each step's values (before: refused)."""
    logged = []

    def model_fn(features, labels, mode, params):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        pred = net(torch.as_tensor(features["x"]))
        loss = torch.nn.functional.mse_loss(pred, labels)
        if est.get_global_step() + 1 >= NAN_AT:
            loss = loss * float("nan")
        error = est.metrics.mean_absolute_error(labels, pred)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.05)), training_hooks=[
            hooks.LoggingTensorHook({"loss": loss, "mae": error[1], "step": "global_step"},
                                    every_n_iter=1, formatter=lambda v: logged.append(v) or ""),
            hooks.LoggingTensorHook([loss], every_n_iter=3),
            hooks.NanTensorHook(loss)])

    e = make(tmp_path, model_fn)
    with caplog.at_level(logging.INFO):
        e.train(regression_input_fn(), steps=NAN_AT - 1)
    losses = [v["loss"] for v in logged]
    assert [v["step"] for v in logged] == list(range(NAN_AT - 1))   # as TF fetches it
    assert len(set(losses)) == len(losses)   # each step's own
    maes = [v["mae"] for v in logged]
    assert maes[0] != maes[-1]
    assert caplog.text.count("tensor_0 = ") == 2   # the list form, steps 1 and 4
    with pytest.raises(hooks.NanLossDuringTrainingError, match=rf"global step {NAN_AT}\)"):
        e.train(regression_input_fn(), steps=5)


# -- NanTensorHook ------------------------------------------------------------------
NAN_AT = 7


def nan_model_fn(features, labels, mode, params):
    """The regression model whose loss goes NaN at global step NAN_AT."""
    spec = regression_model_fn(features, labels, mode, params)
    if mode == est.ModeKeys.TRAIN and est.get_global_step() + 1 >= NAN_AT:
        spec = spec._replace(loss=spec.loss * float("nan"))
    return spec


def test_nan_hook_raises_before_a_nan_checkpoint(tmp_path):
    e = make(tmp_path, nan_model_fn, save_checkpoints_steps=1)
    with pytest.raises(hooks.NanLossDuringTrainingError, match=r"NaN loss during training "
                       rf"\(global step {NAN_AT}\)"):
        e.train(regression_input_fn(), steps=20, hooks=[hooks.NanTensorHook()])
    assert checkpoint_steps(e.model_dir)[-1] == NAN_AT - 1
    assert checkpoint.step_of(e.latest_checkpoint()) == NAN_AT - 1
    assert math.isfinite(float(e.get_variable_value("linear/weight").sum()))


def test_a_nan_hook_not_failing_under_the_estimator_raises_as_tf(tmp_path, caplog):
    """TF's Estimator has its own NanTensorHook, which fails: it sees the NaN
    at the step the user's (fail_on_nan_loss=False) does, and train raises.
    Ours checks every log_step_count_steps, so the user's stopped the session
    first and train returned normally, no checkpoint of the NaN saved but
    none said wrong (hooks probe)."""
    e = make(tmp_path, nan_model_fn, save_checkpoints_steps=1)
    ends = []

    class End(hooks.SessionRunHook):
        def end(self, session):
            ends.append(session.global_step)
    with caplog.at_level(logging.WARNING), pytest.raises(
            hooks.NanLossDuringTrainingError, match=rf"\(global step {NAN_AT}\)"):
        e.train(regression_input_fn(), steps=20,
                hooks=[hooks.NanTensorHook("loss", fail_on_nan_loss=False), End()])
    assert ends == []                             # no hook's end, as TF
    assert checkpoint_steps(e.model_dir)[-1] == NAN_AT - 1
    assert f"Model diverged with loss = NaN (global step {NAN_AT})" in caplog.text


def test_a_nan_hook_not_failing_warns_stops_and_saves_no_nan_checkpoint(tmp_path, caplog):
    """In a session of one's own with no failing NaN check: a warning, a stop,
    the hooks' end run, and no checkpoint of the diverged state."""
    ends = []

    class End(hooks.SessionRunHook):
        def end(self, session):
            ends.append(session.global_step)
    saver = hooks.CheckpointSaverHook(str(tmp_path), save_steps=1)
    with caplog.at_level(logging.WARNING):
        with session([hooks.NanTensorHook("loss", fail_on_nan_loss=False), saver, End()],
                     model_dir=str(tmp_path), is_chief=True) as sess:
            run_steps(sess, 2)
            run_steps(sess, 5, step, math.nan)
            assert sess.should_stop()
    assert ends == [3]                            # stopped at once; end hooks ran
    assert checkpoint_steps(str(tmp_path))[-1] == 2
    assert "Model diverged with loss = NaN (global step 3)" in caplog.text
    assert "Not saving a checkpoint at step 3" in caplog.text


def test_default_nan_check_rides_on_the_logging_steps(tmp_path):
    # log_step_count_steps=5: loss fetched at steps 1, 6, 11, ...; NaN from step 7
    e = make(tmp_path, nan_model_fn, log_step_count_steps=5, save_summary_steps=0)
    with pytest.raises(hooks.NanLossDuringTrainingError) as info:
        e.train(regression_input_fn(), steps=20)
    assert info.value.global_step == 11
    assert e.latest_checkpoint() is None          # the end-of-training save never ran


def test_nan_hook_on_arrays_and_bad_arguments():
    hook = hooks.NanTensorHook("vec")
    with session([hook]) as sess:
        sess.run(lambda: {"loss": torch.tensor(1.0), "vec": torch.tensor([1.0, 2.0])})
        with pytest.raises(hooks.NanLossDuringTrainingError):
            sess.run(lambda: {"loss": torch.tensor(1.0), "vec": torch.tensor([1.0, math.nan])})
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="invalid every_n_iter"):
            hooks.NanTensorHook(every_n_iter=bad)


# -- GlobalStepWaiterHook -----------------------------------------------------------
def test_global_step_waiter_times_out_with_a_clear_error(tmp_path):
    hook = hooks.GlobalStepWaiterHook(5, timeout_secs=0.3, poll_secs=0.05)
    with session([hook], model_dir=str(tmp_path), is_chief=False) as sess:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"for global step 5, but the latest checkpoint "
                           r"in .* is at step 0.*save_checkpoints_steps"):
            sess.run(step)
        assert 0.3 <= time.monotonic() - start < 5


def test_global_step_waiter_starts_once_the_chief_checkpoints(tmp_path):
    hook = hooks.GlobalStepWaiterHook(5, timeout_secs=30, poll_secs=0.05)
    state = model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy()).state()

    def chief():
        time.sleep(0.3)
        checkpoint.Saver(str(tmp_path)).save(state, 5)
    thread = threading.Thread(target=chief)
    with session([hook], model_dir=str(tmp_path), is_chief=False) as sess:
        start = time.monotonic()
        thread.start()
        sess.run(step)
        sess.run(step)
        waited = time.monotonic() - start
        thread.join()
    assert 0.3 <= waited < 10


def test_global_step_waiter_on_the_chief_and_argument_errors(tmp_path):
    with session([hooks.GlobalStepWaiterHook(3)], model_dir=str(tmp_path)) as sess:
        with pytest.raises(ValueError, match="this is the chief.*wait_until_step=0"):
            sess.run(step)
    with session([hooks.GlobalStepWaiterHook(0)], is_chief=True) as sess:
        sess.run(step)                            # step 0: never waits
    with pytest.raises(TypeError, match="wait_until_step must be an int"):
        hooks.GlobalStepWaiterHook(2.5)
    with pytest.raises(ValueError, match="timeout_secs must be >= 0"):
        hooks.GlobalStepWaiterHook(1, timeout_secs=-1)


# -- FinalOpsHook and FeedFnHook -------------------------------------------------------
def test_final_ops_hook_names_dicts_callables_and_feeds():
    by_name = hooks.FinalOpsHook(["loss", "global_step"])
    by_dict = hooks.FinalOpsHook({"d": "double"}, final_ops_feed_dict={"loss": 42.0})
    fed_loss = hooks.FinalOpsHook("loss", final_ops_feed_dict={"loss": 42.0})
    weight = hooks.FinalOpsHook(lambda: {
        "norm": est.get_module("net", lambda: torch.nn.Linear(2, 1)).weight.norm(),
        "scale": est.named_tensor("scale", torch.tensor(1.0))},
        final_ops_feed_dict={"scale": 3.0})
    all_hooks = [by_name, by_dict, fed_loss, weight]
    with session(all_hooks) as sess:
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        for v in (1.0, 5.0):
            sess.run(step, v)
        assert all(h.final_ops_values is None for h in all_hooks)
    assert by_name.final_ops_values == [5.0, 2]
    assert by_dict.final_ops_values == {"d": 10.0}
    assert fed_loss.final_ops_values == 42.0
    assert weight.final_ops_values["norm"] == pytest.approx(net.weight.norm().item())
    assert weight.final_ops_values["scale"] == 3.0
    # a name no step exposes (a typo): TF's session.run refuses it; it was lost
    typo = hooks.FinalOpsHook(["double"], final_ops_feed_dict={"dubble": 2.0})
    with pytest.raises(KeyError, match="session.run feeds 'dubble', which the last step does "
                       r"not expose; available: \['double'\]"):
        with session([typo]) as sess:
            sess.run(step)


def test_end_values_need_a_step(caplog):
    final = hooks.FinalOpsHook("loss")
    with caplog.at_level(logging.INFO, logger=HOOKS_LOG):
        with session([hooks.LoggingTensorHook("loss", at_end=True)]):
            pass                                  # no step: nothing to log, no error
        with pytest.raises(RuntimeError, match=r"session.run\('loss'\): no step has run"):
            with session([final]):
                pass
    assert not [r for r in caplog.records if r.name == HOOKS_LOG]
    step_only = hooks.FinalOpsHook({"gs": "global_step"})   # known without a step, as in TF
    with session([step_only]):
        pass
    assert step_only.final_ops_values == {"gs": 0}


def test_final_ops_hook_bad_arguments():
    with pytest.raises(TypeError, match="final_ops must be a name"):
        hooks.FinalOpsHook(3)
    with pytest.raises(TypeError, match="named by strings"):
        hooks.FinalOpsHook([torch.tensor(1.0)])
    with pytest.raises(TypeError, match="final_ops_feed_dict must be a dict"):
        hooks.FinalOpsHook("loss", final_ops_feed_dict=[1])


def test_feed_fn_hook_replaces_named_tensors_for_the_step():
    feeds = iter([{"lr": 0.5}, {}, {"lr": 0.25}])
    seen = []

    def train_step():
        lr = est.named_tensor("lr", torch.tensor(0.1, dtype=torch.float64))
        seen.append((lr.item(), lr.dtype))
        return {"loss": lr * 2}
    rec = hooks.FinalOpsHook("lr")
    with session([hooks.FeedFnHook(lambda: next(feeds)), rec]) as sess:
        run_steps(sess, 3, train_step)
    assert seen == [(0.5, torch.float64), (0.1, torch.float64), (0.25, torch.float64)]
    assert rec.final_ops_values == 0.25


def test_a_python_number_named_is_a_float32_tensor_to_hooks_and_can_be_fed():
    """`named_tensor("scale", 0.1 + 0.2)`: logged as 0.30000000000000004 (TF's
    constant is float32: 0.3), and a feed of it raised AttributeError."""
    feeds = iter([{}, {"scale": 2}])
    seen = []

    def train_step():
        scale = est.named_tensor("scale", 0.1 + 0.2)
        seen.append(scale)
        return {"loss": torch.tensor(1.0) * scale}
    rec = hooks.FinalOpsHook("scale")
    with session([rec]) as sess:
        run_steps(sess, 1, train_step)
    assert type(rec.final_ops_values) is np.float32 and str(rec.final_ops_values) == "0.3"
    with session([hooks.FeedFnHook(lambda: next(feeds)), rec]) as sess:
        run_steps(sess, 2, train_step)
    assert seen[1] == 0.1 + 0.2 and torch.equal(seen[2], torch.tensor(2.0))
    assert rec.final_ops_values == 2.0
    # anything else is kept as given (the attack: a string, None, tuples raised)
    kept = hooks.FinalOpsHook(["phase", "none", "pair"])
    pair = (torch.ones(2), torch.zeros(3))
    with session([kept]) as sess:
        run_steps(sess, 1, lambda: {"loss": torch.tensor(1.0) * est.named_tensor("pair", pair)[0]
                                    .sum() * bool(est.named_tensor("phase", "train"))
                                    * (est.named_tensor("none", None) is None)})
    phase, none, held = kept.final_ops_values
    assert phase == "train" and none is None and held[0] is pair[0]


def test_a_tensor_named_loss_leaves_the_logged_and_summarized_loss_the_steps(tmp_path, caplog):
    """`est.named_tensor("loss", other)` took over the Estimator's loss log
    and TensorBoard curve (123.0 where the losses were 1.14, 1.27; names
    probe): TF's hooks fetch the loss tensor, not a name."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    losses = []

    def model_fn(features, labels, mode, params):
        spec = regression_model_fn(features, labels, mode, params)
        est.named_tensor("loss", torch.tensor(123.0))
        losses.append(spec.loss.item())
        return spec
    e = est.Estimator(model_fn, str(tmp_path), config=est.RunConfig(
        log_step_count_steps=1, save_summary_steps=1))
    with caplog.at_level(logging.INFO):
        e.train(regression_input_fn(), steps=2)
    assert "loss = 123" not in caplog.text and "loss = " in caplog.text
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [round(ev.value, 5) for ev in events.Scalars("loss")] == [
        round(v, 5) for v in losses]


def test_a_custom_steps_named_loss_is_what_loss_fetches_beside_another_tensor():
    """A step naming its loss and returning another tensor (an accuracy):
    "loss" fetched the returned tensor (the attack on the fix above); a step
    returning its loss alone still has it fetched."""
    rec = hooks.FinalOpsHook("loss")
    with session([rec]) as sess:
        run_steps(sess, 1, lambda: (est.named_tensor("loss", torch.tensor(8.5)),
                                    torch.tensor(0.25))[1])
    assert rec.final_ops_values == 8.5
    with session([rec]) as sess:
        run_steps(sess, 1, lambda: torch.tensor(3.5))
    assert rec.final_ops_values == 3.5


def test_feed_fn_hook_reaches_the_estimators_model_fn(tmp_path):
    scales = []

    def model_fn(features, labels, mode, params):
        spec = regression_model_fn(features, labels, mode, params)
        scale = est.named_tensor("scale", torch.tensor(1.0))
        scales.append(scale.item())
        return spec._replace(loss=spec.loss * scale)
    e = make(tmp_path, model_fn)
    e.train(regression_input_fn(), steps=3, hooks=[hooks.FeedFnHook(lambda: {"scale": 0.0})])
    assert scales == [1.0, 0.0, 0.0]    # the first batch runs before the session starts


def test_feed_fn_hook_errors():
    with pytest.raises(TypeError, match="feed_fn must be callable"):
        hooks.FeedFnHook({"a": 1})
    with session([hooks.FeedFnHook(lambda: [1])]) as sess:
        with pytest.raises(TypeError, match="feed_fn must return a dict"):
            sess.run(step)
    twice = [hooks.FeedFnHook(lambda: {"a": 1, "b": 2}), hooks.FeedFnHook(lambda: {"b": 3})]
    with session(twice) as sess:
        with pytest.raises(RuntimeError, match=r"Same tensor is fed by two hooks: \['b'\]"):
            sess.run(step)
    # a name the step does not expose (a typo): TF's feed_dict refuses it; it was
    # dropped, the step run unfed (hooks probe)
    with session([hooks.FeedFnHook(lambda: {"doubel": 1.0})]) as sess:
        with pytest.raises(KeyError, match="A hook feeds 'doubel', which this step does not "
                           r"expose; available: \['double'\]"):
            sess.run(step)


def test_ported_fetches_of_tf_graph_names_say_what_to_fetch():
    """A ported hook's TF fetches (movielens probe): a canned estimator's
    graph tensor name, and `get_global_step()` taken in `begin()` (TF's
    tensor, here the step's number), are refused saying what to fetch."""
    class Fetch(hooks.SessionRunHook):
        def __init__(self, what):
            self.what = what

        def before_run(self, run_context):
            return hooks.SessionRunArgs(self.what)
    with session([Fetch("dnn/head/weighted_loss/value")]) as sess:
        with pytest.raises(KeyError, match="TF's graph tensor names .* a step's loss is 'loss'"):
            sess.run(step)
    with session([Fetch(0)]) as sess:
        with pytest.raises(TypeError, match="est.get_global_step.. is the step's number, not "
                                            "TF's tensor: fetch the name 'global_step'"):
            sess.run(step)


# -- ProfilerHook ---------------------------------------------------------------------
def test_profiler_hook_writes_chrome_traces_of_due_steps_only(tmp_path):
    out = tmp_path / "prof"
    hook = hooks.ProfilerHook(save_steps=2, output_dir=str(out), show_memory=True)
    profiled = []
    w = torch.randn(64, 64)

    def matmul_step():
        profiled.append(torch.autograd._profiler_enabled())
        return {"loss": (w @ w).sum()}
    with session([hook]) as sess:
        run_steps(sess, 6, matmul_step)
    # TF's: the first step never (warm-up), then every 2nd from the step before
    # it, named by the global step after it (it was 3 and 5: TF's 10 was 11)
    assert profiled == [False, True, False, True, False, True]
    assert sorted(os.listdir(out)) == ["timeline-2.json", "timeline-4.json", "timeline-6.json"]
    with open(out / "timeline-2.json") as f:
        trace = json.load(f)
    names = {event.get("name") for event in trace["traceEvents"]}
    assert "aten::matmul" in names or "aten::mm" in names


def test_profiler_hook_defaults_to_model_dir_on_the_chief_only(tmp_path):
    with session([hooks.ProfilerHook(save_steps=1)], model_dir=str(tmp_path)) as sess:
        run_steps(sess, 2)
    assert os.listdir(tmp_path) == ["timeline-2.json"]
    with pytest.raises(ValueError, match="non-chief worker needs an output_dir"):
        with session([hooks.ProfilerHook(save_steps=1)], model_dir=str(tmp_path),
                     is_chief=False):
            pass
    for kwargs in ({}, {"save_steps": 1, "save_secs": 1}):
        with pytest.raises(ValueError, match="exactly one of every_secs and every_steps"):
            hooks.ProfilerHook(**kwargs)


# -- early stopping ---------------------------------------------------------------------
class ScriptedEvaluator(hooks.SessionRunHook):
    """Writes the eval summaries an evaluator would, at scripted global steps."""

    def __init__(self, eval_dir, metric, script):
        self._writer = SummaryWriter(eval_dir)
        self._metric, self._script = metric, script

    def after_run(self, run_context, run_values):
        step = run_context.session.global_step
        if step in self._script:
            self._writer.add_scalar(self._metric, self._script[step], step)
            self._writer.add_scalar("other", 0.0, step)
            self._writer.flush()

    def end(self, session):
        self._writer.close()


@pytest.mark.parametrize("make_hook, metric, script, stop_step", [
    (lambda e: hooks.stop_if_higher_hook(e, "accuracy", 0.9, **EVERY_STEP),
     "accuracy", {10: 0.5, 20: 0.8, 30: 0.95, 40: 0.97}, 30),
    (lambda e: hooks.stop_if_higher_hook(e, "accuracy", 0.9, min_steps=35, **EVERY_STEP),
     "accuracy", {10: 0.5, 20: 0.8, 30: 0.95, 40: 0.97}, 40),
    (lambda e: hooks.stop_if_lower_hook(e, "loss", 0.5, **EVERY_STEP),
     "loss", {10: 3.0, 20: 1.5, 30: 0.4}, 30),
    (lambda e: hooks.stop_if_no_increase_hook(e, "accuracy", 30, **EVERY_STEP),
     "accuracy", {10: 0.5, 20: 0.7, 30: 0.65, 40: 0.69, 50: 0.68, 60: 0.9}, 50),
    (lambda e: hooks.stop_if_no_decrease_hook(e, "loss", 30, **EVERY_STEP),
     "loss", {10: 3.0, 20: 2.0, 30: 2.5, 40: 2.0, 50: 2.1, 60: 1.0}, 50),
])
def test_early_stopping_stops_at_the_right_step(tmp_path, make_hook, metric, script, stop_step):
    e = make(tmp_path)
    evaluator = ScriptedEvaluator(e.eval_dir(), metric, script)
    e.train(regression_input_fn(), steps=100, hooks=[evaluator, make_hook(e)])
    assert checkpoint.step_of(e.latest_checkpoint()) == stop_step


def test_early_stopping_by_seconds_and_only_the_chief_decides(tmp_path, set_tf_config):
    calls = []
    e = make(tmp_path)
    hook = hooks.make_early_stopping_hook(e, lambda: calls.append(1) or len(calls) >= 3,
                                          run_every_secs=0)
    with session([hook]) as sess:
        run_steps(sess, 10)
        assert sess.session.global_step == 3
    set_tf_config({"chief": ["h:1"], "worker": ["h:2"]}, "worker", 0)
    worker = make(tmp_path, name="w")
    assert not worker.config.is_chief
    calls.clear()
    hook = hooks.make_early_stopping_hook(worker, lambda: calls.append(1) or True, **EVERY_STEP)
    with session([hook], is_chief=False) as sess:
        run_steps(sess, 5)
        assert sess.session.global_step == 5 and calls == []


def test_early_stopping_after_real_evaluations(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=10)
    first = e.evaluate(regression_input_fn(repeat=False))
    if not hooks.read_eval_metrics(e.eval_dir()):
        pytest.skip("Estimator.evaluate does not write eval summaries to eval_dir yet")
    assert hooks.read_eval_metrics(e.eval_dir())[10]["loss"] == pytest.approx(first["loss"])
    hook = hooks.stop_if_lower_hook(e, "loss", first["loss"] * 2, **EVERY_STEP)
    e.train(regression_input_fn(), steps=50, hooks=[hook])
    assert checkpoint.step_of(e.latest_checkpoint()) == 11


def test_read_eval_metrics(tmp_path):
    assert hooks.read_eval_metrics(str(tmp_path / "missing")) == {}
    for values in ({10: 1.0, 30: 3.0}, {20: 2.0, 30: 4.0}):   # two files, as two evaluations
        with SummaryWriter(str(tmp_path)) as writer:
            for step_, value in values.items():
                writer.add_scalar("loss", value, step_)
                writer.add_scalar("acc", -value, step_, new_style=True)
        time.sleep(1.1)    # event file names carry the second they were opened
    metrics = hooks.read_eval_metrics(str(tmp_path))
    assert list(metrics) == [10, 20, 30]
    assert metrics[20] == {"loss": 2.0, "acc": -2.0}
    assert metrics[30] == {"loss": 4.0, "acc": -4.0}     # the later file wins


def test_early_stopping_errors(tmp_path):
    e = make(tmp_path)
    with pytest.raises(TypeError, match="`estimator` must have type"):
        hooks.stop_if_higher_hook(object(), "acc", 1.0)
    with pytest.raises(ValueError, match="Only one of `run_every_secs` and `run_every_steps` "
                       "must be set .*pass run_every_secs=None"):
        hooks.stop_if_lower_hook(e, "loss", 1.0, run_every_steps=10)
    with pytest.raises(ValueError, match="One of `run_every_secs` and `run_every_steps`"):
        hooks.make_early_stopping_hook(e, lambda: False, run_every_secs=None)
    with pytest.raises(TypeError, match="`should_stop_fn` must be callable"):
        hooks.make_early_stopping_hook(e, True)
    with pytest.raises(ValueError, match="max_steps_without_decrease must be an int > 0"):
        hooks.stop_if_no_decrease_hook(e, "loss", 0)
    with pytest.raises(ValueError, match="min_steps must be an int >= 0"):
        hooks.stop_if_no_increase_hook(e, "acc", 10, min_steps=-1)
    with pytest.raises(TypeError, match="threshold must be a number"):
        hooks.stop_if_higher_hook(e, "acc", "0.9")
    with SummaryWriter(e.eval_dir()) as writer:
        writer.add_scalar("loss", 1.0, 5)
        writer.add_scalar("accuracy", 0.5, 5)
    hook = hooks.stop_if_higher_hook(e, "acuracy", 0.5, **EVERY_STEP)
    with pytest.raises(KeyError, match=r"metric 'acuracy' is not in the evaluation at global "
                       r"step 5 .* it has \['accuracy', 'loss'\]: did you mean 'accuracy'\?"):
        e.train(regression_input_fn(), steps=3, hooks=[hook])
    hook = hooks.stop_if_higher_hook(e, "auc", 0.5, **EVERY_STEP)
    with pytest.raises(KeyError, match=r"it has \['accuracy', 'loss'\]\W*$"):
        e.train(regression_input_fn(), steps=3, hooks=[hook])


# -- progress ---------------------------------------------------------------------------
def test_progress_is_silent_when_not_a_terminal(tmp_path, monkeypatch):
    stream = io.StringIO()
    with session([hooks.ProgressHook(num_steps=5, stream=stream, every_secs=1e-6)]) as sess:
        run_steps(sess, 5)
    assert stream.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", stream)
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=5)
    e.evaluate(regression_input_fn(repeat=False))
    list(e.predict(regression_input_fn(repeat=False)))
    assert stream.getvalue() == ""


@pytest.fixture
def terminal():
    """A real pseudo-terminal: (file object writing to it, function reading what arrived)."""
    master, slave = os.openpty()
    os.set_blocking(master, False)
    tty = os.fdopen(slave, "w")

    def read():
        tty.flush()
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode()
    yield tty, read
    tty.close()
    os.close(master)


def test_progress_on_a_terminal_shows_count_rate_and_eta(terminal):
    tty, read = terminal
    hook = hooks.ProgressHook(num_steps=20, desc="train", stream=tty, every_secs=0.01)
    with session([hook]) as sess:
        for _ in range(20):
            sess.run(step)
            time.sleep(0.003)
    text = read()
    assert "\rtrain: " in text and "steps/s, ETA 0:00:0" in text
    final = text.rstrip().rsplit("\r", 1)[1]
    assert final.startswith("train: 20/20 (100%), ") and final.endswith(" steps/s\x1b[K")


def test_progress_is_called_only_to_redraw_yet_counts_every_step(terminal):
    tty, read = terminal
    calls = []

    class Counted(hooks.ProgressHook):
        def after_run(self, run_context, run_values):
            calls.append(run_context.session._runs)
            super().after_run(run_context, run_values)

        def _idle(self, session):   # (its own after_run, idle when ProgressHook is)
            return super()._idle(session)
    with session([Counted(num_steps=50, stream=tty, every_secs=3600)]) as sess:
        for _ in range(50):
            sess.run(step)
    assert calls == [0]                            # the first step starts the rate clock
    assert read().rstrip().rsplit("\r", 1)[1].startswith("50/50 (100%)")


def test_estimator_shows_progress_on_a_terminal(tmp_path, terminal, monkeypatch):
    tty, read = terminal
    monkeypatch.setattr(sys, "stderr", tty)
    e = make(tmp_path)
    e.train(regression_input_fn(), max_steps=30)
    assert "train: 30/30 (100%)" in read()
    e.evaluate(regression_input_fn(), steps=4)
    assert "evaluate: 4/4 (100%)" in read()
    list(e.predict(regression_input_fn(n=64, repeat=False)))
    assert "predict: 2 steps" in read()


def test_progress_bad_arguments():
    with pytest.raises(ValueError, match="only one of num_steps or last_step"):
        hooks.ProgressHook(num_steps=1, last_step=2)
    with pytest.raises(ValueError, match="num_steps must be an int >= 0"):
        hooks.ProgressHook(num_steps=-1)
    with pytest.raises(ValueError, match="every_secs must be > 0"):
        hooks.ProgressHook(every_secs=0)
