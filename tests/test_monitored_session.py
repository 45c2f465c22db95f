"""The session loop: hook call order, fetches by name, stopping, errors."""
import pytest
import torch

import distribute
import estimator as est
import hooks
from estimator import _scope


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
    return hooks.MonitoredSession(_scope.ModelScope(mode, distribute.get_strategy()), hook_list)


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
    assert r["l"] == 3.0 and r["both"] == [1, 6.0] and list(r["o"]) == [0, 1, 2]
    assert isinstance(r["l"], float)


def test_unknown_fetch_names_what_is_available():
    with session([Recorder("nope")]) as sess:
        with pytest.raises(KeyError, match=r"fetches 'nope'.*available.*double"):
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
    assert _scope._current is None


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


def test_stop_at_step_arguments():
    with pytest.raises(ValueError, match="one of num_steps or last_step"):
        hooks.StopAtStepHook()
    with pytest.raises(ValueError, match="only one of"):
        hooks.StopAtStepHook(num_steps=1, last_step=2)
