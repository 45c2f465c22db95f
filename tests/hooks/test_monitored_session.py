"""The session loop: hook call order, fetches by name, stopping, errors."""
import threading
import time

import numpy as np
import pytest
import torch

import distribute
import estimator as est
import hooks
from hooks import model_scope


class Recorder(hooks.SessionRunHook):
    def __init__(self, fetches=None):
        self.fetches, self.calls, self.results = fetches, [], []

    def begin(self):
        self.calls.append("begin")

    def after_create_session(self, session, coord):
        self.calls.append(("after_create_session", session.global_step))

    def before_run(self, run_context):
        self.calls.append("before_run")
        return hooks.SessionRunArgs(self.fetches) if self.fetches else None

    def after_run(self, run_context, run_values):
        self.calls.append("after_run")
        self.results.append(run_values.results)

    def end(self, session):
        self.calls.append(("end", session.global_step))


def session(hook_list, mode=est.ModeKeys.TRAIN):
    return hooks.MonitoredSession(model_scope.ModelScope(mode, distribute.get_strategy()), hook_list)


def step(value=1.0):
    loss = torch.tensor(value)
    est.named_tensor("double", loss * 2)
    return {"loss": loss, "other": torch.arange(3)}


def test_call_order_and_global_step():
    rec = Recorder()
    with session([rec, hooks.StopAtStepHook(num_steps=2)]) as sess:
        while not sess.should_stop():
            sess.run(step)
    assert rec.calls == ["begin", ("after_create_session", 0), "before_run", "after_run",
                         "before_run", "after_run", ("end", 2)]


def test_fetches_by_name_structure_and_host_values():
    rec = Recorder({"l": "loss", "both": ["global_step", "double"], "o": "other"})
    with session([rec]) as sess:
        sess.run(step, 3.0)
    r = rec.results[0]
    # global_step as TF's fetch reads it: the step's, before its update
    assert r["l"] == 3.0 and r["both"] == [0, 6.0] and list(r["o"]) == [0, 1, 2]
    assert isinstance(r["l"], np.float32) and isinstance(r["both"][0], np.int64)   # as TF


def test_unknown_fetch_names_the_hook_and_what_is_available():
    """Which hook asked: a YAML experiment's hooks are configured far from the
    model_fn, and "A hook fetches" left the user to guess."""
    with session([Recorder("loss"), Recorder("nope")]) as sess:
        with pytest.raises(KeyError, match=r"^\"Recorder fetches 'nope'.*available.*double"):
            sess.run(step)


def test_input_exhausted_ends_cleanly_and_calls_end():
    rec = Recorder()
    data = iter([1.0, 2.0])
    with session([rec]) as sess:
        while not sess.should_stop():
            sess.run(lambda: step(next(data)))
    assert rec.calls[-1] == ("end", 2)


def test_exception_skips_end_and_propagates():
    rec = Recorder()

    def boom():
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        with session([rec]) as sess:
            sess.run(boom)
    assert not any(isinstance(c, tuple) and c[0] == "end" for c in rec.calls)
    assert model_scope._current is None


class _FailsToSetUp(Recorder):
    def after_create_session(self, session, coord):
        super().after_create_session(session, coord)
        try:
            raise ValueError("setup failed")
        except ValueError as e:
            coord.request_stop(e)


def test_a_hooks_request_stop_with_an_error_raises_it_after_the_ends_as_tf(tmp_path):
    """`coord.request_stop(e)` in after_create_session: no step, the hooks'
    `end`, then `train` raises `e` (TF 2.15: the Coordinator's join). It
    stopped training as if done."""
    hook = _FailsToSetUp()
    e = est.Estimator(_linear_model_fn, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="^setup failed$"):
        e.train(lambda: [({"x": torch.ones(2, 1)}, torch.ones(2, 1))] * 5, hooks=[hook])
    assert hook.calls == ["begin", ("after_create_session", 0), ("end", 0)]


class _EndFails(Recorder):
    def end(self, session):
        super().end(session)
        raise RuntimeError("end failed")


def test_a_hooks_request_stop_with_an_error_is_raised_over_an_end_s_error_as_tf(tmp_path):
    """A hook's `end` raising after a `coord.request_stop(e)`: `train` raises
    `e`, the end's error its context (TF 2.15: the Coordinator's join in the
    session's close, after the ends)."""
    e = est.Estimator(_linear_model_fn, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="^setup failed$") as raised:
        e.train(lambda: [({"x": torch.ones(2, 1)}, torch.ones(2, 1))] * 5,
                hooks=[_FailsToSetUp(), _EndFails()])
    assert str(raised.value.__context__) == "end failed"


@pytest.mark.parametrize("step_error", [RuntimeError, KeyboardInterrupt])
def test_a_hooks_request_stop_with_an_error_is_raised_over_a_step_s_error_as_tf(
        tmp_path, step_error):
    """A hook's thread fails (`coord.request_stop(e)`) and so does the step
    that needed it: `train` raises `e`, the step's error its context (TF
    2.15: the coordinator's join in the session's close); it raised the
    step's error, the root cause nowhere."""
    stepping, stopped = threading.Event(), threading.Event()

    class Feeder(hooks.SessionRunHook):
        def after_create_session(self, session, coord):
            def work():
                stepping.wait(10)
                coord.request_stop(OSError("the feeder failed"))
                stopped.set()
            threading.Thread(target=work, daemon=True).start()

    def model_fn(features, labels, mode):
        spec = _linear_model_fn(features, labels, mode)

        def train_op():
            stepping.set()
            stopped.wait(10)
            raise step_error("no input: the feeder is gone")
        return spec._replace(train_op=train_op)
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    with pytest.raises(OSError, match="^the feeder failed$") as raised:
        e.train(lambda: [({"x": torch.ones(2, 1)}, torch.ones(2, 1))] * 5, hooks=[Feeder()])
    assert type(raised.value.__context__) is step_error


class _Feeder(Recorder):
    """TF's Coordinator pattern: a thread started in after_create_session
    works until `coord.should_stop()`, and reports its error with
    `coord.request_stop(e)` (`fail_at`: at that iteration)."""

    def __init__(self, fail_at=None):
        super().__init__()
        self.fail_at, self.thread = fail_at, None

    def after_create_session(self, session, coord):
        super().after_create_session(session, coord)

        def work():
            try:
                n = 0
                while not coord.should_stop():
                    n += 1
                    if n == self.fail_at:
                        raise OSError("the feeder failed")
                    time.sleep(0.005)
            except OSError as e:
                coord.request_stop(e)
        self.thread = threading.Thread(target=work, daemon=True)
        self.thread.start()

    def after_run(self, run_context, run_values):
        super().after_run(run_context, run_values)
        time.sleep(0.01)


@pytest.mark.parametrize("fail_at", [None, 3])
def test_a_hooks_thread_on_the_coordinator_ends_with_the_session_or_stops_it_as_tf(
        tmp_path, fail_at):
    """A thread waiting on `coord.should_stop()` ends when training does (it
    spun on: the process never exited); its `coord.request_stop(e)` stops
    training after the step in flight and `train` raises `e` after the
    hooks' end, as TF 2.15 (training went on to max_steps)."""
    hook = _Feeder(fail_at)
    e = est.Estimator(_linear_model_fn, model_dir=str(tmp_path))
    data = [({"x": torch.ones(2, 1)}, torch.ones(2, 1))] * 200
    if fail_at is None:
        e.train(lambda: data, hooks=[hook], max_steps=5)
        assert e.get_variable_value("global_step") == 5
    else:
        with pytest.raises(OSError, match="the feeder failed"):
            e.train(lambda: data, hooks=[hook])
        assert e.get_variable_value("global_step") < 100 and hook.calls[-1][0] == "end"
    hook.thread.join(5)
    assert not hook.thread.is_alive()


def _linear_model_fn(features, labels, mode):
    net = est.get_module("net", lambda: torch.nn.Linear(1, 1))
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    return est.EstimatorSpec(mode, loss=loss,
                             train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))


def test_eval_mode_does_not_increment_the_step():
    with session([], est.ModeKeys.EVAL) as sess:
        sess.run(step)
        assert sess.session.global_step == 0


def test_non_hooks_are_rejected():
    with pytest.raises(TypeError, match="SessionRunHook"):
        session([object()])
    with pytest.raises(TypeError, match="fetches must be names"):
        with session([Recorder(fetches=[3])]) as sess:
            sess.run(step)
    # TF1's hook given the loss tensor in a model_fn: say how it ports
    with pytest.raises(TypeError, match=r"fetches must be names .*a model_fn's tensor is a new "
                                        r"object every step .*est.named_tensor\(name, tensor\)"):
        with session([Recorder(fetches={"loss": torch.tensor(1.0)})]) as sess:
            sess.run(step)


def test_stop_at_step_arguments():
    with pytest.raises(ValueError, match="one of num_steps or last_step"):
        hooks.StopAtStepHook()
    with pytest.raises(ValueError, match="only one of"):
        hooks.StopAtStepHook(num_steps=1, last_step=2)


# -- the schedule: hooks with `_idle` are skipped until they may act ------------------
class Counting(hooks.SessionRunHook):
    """Wraps a built-in hook, counting the calls the session makes of it."""

    def __init__(self, inner, log):
        self.inner, self.log, self.before = inner, log, 0

    def begin(self):
        self.inner.begin()

    def after_create_session(self, session, coord):
        self.inner.after_create_session(session, coord)

    def before_run(self, run_context):
        self.before += 1
        self.log.append(("before", type(self.inner).__name__, run_context.session.global_step))
        return self.inner.before_run(run_context)

    def after_run(self, run_context, run_values):
        self.log.append(("after", type(self.inner).__name__, run_context.session.global_step))
        self.inner.after_run(run_context, run_values)

    def end(self, session):
        self.inner.end(session)

    def _idle(self, session):
        return self.inner._idle(session)


def test_scheduled_hooks_are_called_only_when_due(tmp_path, caplog):
    log = []
    stop = Counting(hooks.StopAtStepHook(last_step=25), log)
    logging_hook = Counting(hooks.LoggingTensorHook(["loss"], every_n_iter=10), log)
    saver = Counting(hooks.CheckpointSaverHook(str(tmp_path), save_steps=7), log)
    every_step = Recorder()
    with caplog.at_level("INFO", logger="hooks"):
        with session([stop, logging_hook, saver, every_step], ) as sess:
            while not sess.should_stop():
                sess.run(step)
    assert sess._scope.global_step == 25
    assert every_step.calls.count("before_run") == 25      # no _idle: every step
    assert logging_hook.before == 3                         # iterations 0, 10, 20
    assert [r.getMessage().split(" (")[0] for r in caplog.records
            if r.getMessage().startswith("loss")] == ["loss = 1.0"] * 3
    saved = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("model.ckpt-*")
                   if p.suffix != ".crc32c")
    assert saved == [7, 14, 21, 25]
    assert stop.before == 1 and ("after", "StopAtStepHook", 25) in log   # woken at step 25 only


def test_scheduled_hooks_keep_their_order_on_a_due_step():
    log = []
    b = Counting(hooks.LoggingTensorHook(["loss"], every_n_iter=3), log)   # runs 0 and 3
    a = Counting(hooks.StopAtStepHook(last_step=4), log)                   # after step 4
    with session([b, a]) as sess:
        while not sess.should_stop():
            sess.run(step)
    assert sess._scope.global_step == 4
    assert [(when, name) for when, name, step_ in log if step_ == 4] == [
        ("after", "LoggingTensorHook"), ("after", "StopAtStepHook")]   # the list's order
    assert [(name, step_) for when, name, step_ in log if when == "before"] == [
        ("LoggingTensorHook", 0), ("LoggingTensorHook", 3), ("StopAtStepHook", 3)]


def test_a_jumping_global_step_wakes_hooks_after_the_step():
    """Under parameter servers the global step jumps inside a step (other
    workers' steps): a hook due by the step's result is still called."""
    log = []
    stop = Counting(hooks.StopAtStepHook(last_step=12), log)

    def jumping_step():
        model_scope.current().global_step += 4     # 5 per step with the session's own
        return step()

    with session([stop]) as sess:
        while not sess.should_stop():
            sess.run(jumping_step)
    assert sess._scope.global_step == 15      # 5, 10, 15: stopped at the first step >= 12
    assert stop.before == 0 and log == [("after", "StopAtStepHook", 15)]


def test_time_scheduled_hook_wakes_when_its_time_comes(tmp_path, monkeypatch):
    import time as time_module
    now = [1000.0]
    monkeypatch.setattr(time_module, "time", lambda: now[0])
    log = []
    saver = Counting(hooks.CheckpointSaverHook(str(tmp_path), save_secs=60), log)
    with session([saver]) as sess:
        for _ in range(5):
            sess.run(step)
        assert log == []                 # 60 s have not passed: never called
        now[0] += 61
        sess.run(step)
        sess.run(step)
    assert [e for e in log if e[0] == "after"] == [("after", "CheckpointSaverHook", 6)]
    saved = [est.checkpoint.step_of(p) for p in est.checkpoint.all_checkpoints(str(tmp_path))]
    assert saved == [6, 7]               # at 61 s, and at the end


def test_time_passing_during_a_step_wakes_an_after_run_hook_that_step(tmp_path, monkeypatch):
    import time as time_module
    now = [1000.0]
    monkeypatch.setattr(time_module, "time", lambda: now[0])
    log = []
    saver = Counting(hooks.CheckpointSaverHook(str(tmp_path), save_secs=60), log)

    def slow_step():
        if model_scope.current().global_step == 3:
            now[0] += 61                  # the fourth step takes a minute
        return step()
    with session([saver]) as sess:
        for _ in range(6):
            sess.run(slow_step)
    assert [e for e in log if e[0] == "after"] == [("after", "CheckpointSaverHook", 4)]
    saved = [est.checkpoint.step_of(p) for p in est.checkpoint.all_checkpoints(str(tmp_path))]
    assert saved == [4, 6]               # as TF's after_run check saves: at the step itself


class SeesCheckpoints(hooks.SessionRunHook):
    """The newest checkpoint's step after each step and at the end."""

    def __init__(self, model_dir):
        self.model_dir, self.seen = model_dir, []

    def _latest(self):
        path = est.checkpoint.latest_checkpoint(self.model_dir)
        return est.checkpoint.step_of(path) if path else None

    def after_run(self, run_context, run_values):
        self.seen.append(self._latest())

    def end(self, session):
        self.seen.append(("end", self._latest()))


def test_monitored_training_session_runs_its_saver_before_the_users_hooks(tmp_path):
    """TF's MonitoredTrainingSession on the chief: chief-only hooks and its
    own (the saver) before `hooks`, so a hook's end sees the final checkpoint
    (before: step 4's)."""
    seen = SeesCheckpoints(str(tmp_path))
    custom_loop(str(tmp_path), last_step=5, save_checkpoint_steps=2, extra_hooks=[seen])
    assert seen.seen[-1] == ("end", 5)


TF_MTS = None


def tf_mts(case):
    """TF 2.15's MonitoredTrainingSession in a custom loop
    (record_tf_monitored_training_session.py)."""
    global TF_MTS
    if TF_MTS is None:
        import json
        import os
        from paths import FIXTURES
        with open(os.path.join(FIXTURES, "tf_monitored_training_session.json")) as f:
            TF_MTS = json.load(f)
    return TF_MTS[case]


class _V(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.v = torch.nn.Parameter(torch.zeros(()))


def custom_loop(directory, last_step=12, clock=None, extra_hooks=(), **kwargs):
    """The recorder's loop, ported: v = 0, loss (v - 1)^2 with a `my_loss`
    summary, gradient descent 0.1; `clock` advanced 0.3 s a step. Returns
    what the recording holds (TF's session-start save at step 0 left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    with hooks.MonitoredTrainingSession(
            checkpoint_dir=directory,
            hooks=[hooks.StopAtStepHook(last_step=last_step), *extra_hooks], **kwargs) as sess:
        v = est.get_module("v", _V)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))

        def train_step():
            loss = (v.v - 1.0) ** 2
            est.summary.scalar("my_loss", loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        while not sess.should_stop():
            sess.run(train_step)
            if clock is not None:
                clock[0] += 0.3
    on_disk = [est.checkpoint.step_of(p) for p in est.checkpoint.checkpoints_on_disk(directory)]
    listed = [est.checkpoint.step_of(p) for p in est.checkpoint.all_checkpoints(directory)]
    events = EventAccumulator(directory)
    events.Reload()
    return {"checkpoints": sorted(on_disk), "listed": listed or None,
            "scalars": {tag: [e.step for e in events.Scalars(tag)]
                        for tag in events.Tags()["scalars"]}}


def test_a_users_checkpoint_saver_hook_keeps_keep_checkpoint_max(tmp_path):
    """One made without a saver saves through a Saver of the session's
    settings (TF: the Scaffold's Saver): it kept its own default 5."""
    saver = hooks.CheckpointSaverHook(str(tmp_path), save_steps=1)
    assert custom_loop(str(tmp_path), last_step=6, extra_hooks=[saver], keep_checkpoint_max=2,
                       save_checkpoint_secs=None)["checkpoints"] == [5, 6]


def without_step_0(recorded):
    """TF's record without its session-start save (a documented difference)."""
    out = dict(recorded)
    for key in ("checkpoints", "listed"):
        if out[key] is not None:
            out[key] = [s for s in out[key] if s != 0] or (None if key == "listed" else [])
    return out


@pytest.mark.parametrize("case", ["defaults", "summaries_secs", "summaries_steps_none",
                                  "checkpoint_steps_none", "checkpoint_steps_3"])
def test_monitored_training_session_saves_and_summarizes_as_tf(tmp_path, monkeypatch, case):
    """TF's rule for its (steps, secs) pairs: neither given, the defaults;
    one given, the other off; None, off. Here `save_summaries_secs` was
    ignored (the summaries' steps defaulted to 100 beside it) and an
    explicit `save_checkpoint_steps=None` still saved every 600 s and at the
    end; and a custom loop's summaries had a `loss` that TF's Estimator
    writes but its MonitoredTrainingSession does not."""
    kwargs = {"defaults": {}, "summaries_secs": {"save_summaries_secs": 1},
              "summaries_steps_none": {"save_summaries_steps": None},
              "checkpoint_steps_none": {"save_checkpoint_steps": None},
              "checkpoint_steps_3": {"save_checkpoint_steps": 3}}[case]
    import time as time_module
    clock = [1000.0]
    monkeypatch.setattr(time_module, "time", lambda: clock[0])
    got = custom_loop(str(tmp_path), clock=clock, **kwargs)
    assert got == without_step_0(tf_mts(case))


def test_checkpoint_saver_hooks_of_one_directory_share_one_saver_as_tf(tmp_path):
    """TF's CheckpointSaverHooks save through the graph's one Saver: the
    session's (every 2 steps) and the user's (every 3) keep one list, the
    newest five, and the index lists them. With a Saver each, 7 files stayed
    and the index listed 5 others."""
    saved = []

    class Listener(hooks.CheckpointSaverListener):
        def after_save(self, session, global_step_value):
            saved.append(global_step_value)
    directory = str(tmp_path)
    users = hooks.CheckpointSaverHook(directory, save_steps=3, listeners=[Listener()])
    got = custom_loop(directory, last_step=20, save_checkpoint_steps=2, save_summaries_steps=None,
                      log_step_count_steps=None, extra_hooks=[users])
    recorded = dict(tf_mts("two_savers"))
    users_saves = recorded.pop("saved_by_the_users_hook")
    assert got == without_step_0(recorded)
    assert saved == [s for s in users_saves if s != 0]


def test_a_logging_hooks_formatter_is_called_whatever_the_log_level(tmp_path, caplog):
    """TF calls the formatter on every due iteration (it is the argument of
    logging.info); here it was skipped below INFO."""
    calls = []

    def formatter(values):
        calls.append(int(values["step"]))
        return f"step {values['step']}"
    with caplog.at_level("WARNING"):
        custom_loop(str(tmp_path), extra_hooks=[hooks.LoggingTensorHook(
            {"step": "global_step"}, every_n_iter=3, formatter=formatter)])
    assert calls == tf_mts("formatter")["formatter_calls"]


def test_a_custom_loops_step_may_expose_no_loss(tmp_path):
    """The default SummarySaverHook of a MonitoredTrainingSession fetched
    `loss` (TF's Estimator's summary), so a step returning nothing failed
    at the first step; TF's loop runs."""
    with hooks.MonitoredTrainingSession(checkpoint_dir=str(tmp_path), save_summaries_steps=1,
                                        hooks=[hooks.StopAtStepHook(last_step=3)]) as sess:
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        while not sess.should_stop():
            sess.run(lambda: est.summary.scalar("w", net.weight.sum()) and None)
    assert sess._scope.global_step == 3


def test_running_what_is_not_a_step_function_says_what_run_takes():
    """TF1's `sess.run(train_op)`, ported as is: a bare "'SGD' object is not
    callable" from deep in the session before."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with session([]) as sess:
        with pytest.raises(TypeError, match=r"MonitoredSession.run takes a step function.* "
                                            r"sess.run\(step_fn, batch\)\), got a "
                                            r"torch.optim.sgd.SGD"):
            sess.run(opt)


def test_a_subclass_of_a_built_in_hook_with_its_own_run_methods_is_called_every_step(
        tmp_path, caplog):
    """TF calls every hook's before_run/after_run on every step: a user's
    StopAtStepHook that also stops on the loss, or a LoggingTensorHook that
    records each step, must not be skipped with the steps the built-in would
    skip (before: called at the built-in's due steps only, so the loss check
    never ran and training went on to num_steps)."""
    losses = [1.0 / (i + 1) for i in range(40)]

    class StopAtStepOrLoss(hooks.StopAtStepHook):
        seen = []

        def before_run(self, run_context):
            return hooks.SessionRunArgs({"loss": "loss"})

        def after_run(self, run_context, run_values):
            self.seen.append(run_context.session.global_step)
            super().after_run(run_context, run_values)
            if run_values.results["loss"] < 0.1:
                run_context.request_stop()

    class CountingLogger(hooks.LoggingTensorHook):
        seen = []

        def after_run(self, run_context, run_values):
            self.seen.append(run_context.session.global_step)
            super().after_run(run_context, run_values)

    class QuietSaver(hooks.CheckpointSaverHook):   # (overrides neither: still scheduled)
        def end(self, session):
            super().end(session)

    with caplog.at_level("INFO", logger="hooks"):
        with session([StopAtStepOrLoss(num_steps=30), CountingLogger(["loss"], every_n_iter=4),
                      QuietSaver(str(tmp_path), save_steps=5)]) as sess:
            while not sess.should_stop():
                sess.run(lambda: {"loss": torch.tensor(losses[sess._scope.global_step])})
    stop_at = next(i for i, loss in enumerate(losses) if loss < 0.1) + 1   # 10 steps
    assert sess._scope.global_step == stop_at
    assert StopAtStepOrLoss.seen == CountingLogger.seen == list(range(1, stop_at + 1))
    assert [r.getMessage().split(" (")[0] for r in caplog.records
            if r.getMessage().startswith("loss")] == [
        "loss = 1.0", "loss = 0.2", "loss = 0.11111111"]
    assert [s for s in sess._scheduled if isinstance(s, QuietSaver)]


def test_fetches_in_a_namedtuple_come_back_in_one():
    import collections
    Pair = collections.namedtuple("Pair", ["loss", "step"])
    rec = Recorder(Pair("loss", "global_step"))
    with session([rec]) as sess:
        sess.run(step, 3.0)
    assert rec.results == [Pair(3.0, 0)]


def test_a_mixins_or_an_instances_own_after_run_is_called_every_step_too():
    class StopAtFive:   # a user's mixin, listed before the built-in
        def after_run(self, run_context, run_values):
            self.seen.append(run_context.session.global_step)
            if run_context.session.global_step >= 5:
                run_context.request_stop()
            super().after_run(run_context, run_values)

    class MyStop(StopAtFive, hooks.StopAtStepHook):
        pass
    mixed = MyStop(last_step=20)
    mixed.seen = []
    patched, seen = hooks.LoggingTensorHook(["loss"], every_n_iter=100), []
    inner = patched.after_run
    patched.after_run = lambda context, values: (seen.append(1), inner(context, values))
    with session([mixed, patched]) as sess:
        while not sess.should_stop():
            sess.run(step)
    assert sess._scope.global_step == 5 and mixed.seen == [1, 2, 3, 4, 5] and len(seen) == 5
    assert not sess._scheduled
