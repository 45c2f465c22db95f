"""Input read-ahead (RunConfig(experimental_prefetch_batches=N)): a thread
reads the input ahead of the step; training sees the same batches, in order,
and the same end of input and errors."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import estimator as est
from estimator import _inputs
from models import regression_input_fn, regression_model_fn
from paths import SUPPORT


def test_order_end_and_errors_are_kept():
    assert list(_inputs.read_ahead(iter(range(50)), 3)) == list(range(50))

    def failing():
        yield 1
        yield 2
        raise RuntimeError("input broke at 3")
    got = []
    with pytest.raises(RuntimeError, match="input broke at 3"):
        for x in _inputs.read_ahead(failing(), 2):
            got.append(x)
    assert got == [1, 2]


def test_closing_stops_the_thread():
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1
    before = threading.active_count()
    it = _inputs.read_ahead(endless(), 2)
    assert [next(it) for _ in range(5)] == list(range(5))
    it.close()   # returns once the thread has stopped
    assert threading.active_count() == before
    assert len(produced) <= 5 + 2 + 2   # at most `depth` (and one in hand) ahead


def test_closing_waits_for_the_batch_the_thread_is_reading():
    """No input code runs on after the reading ends (TF's prefetch iterator
    is cancelled and joined when destroyed)."""
    inside = threading.Event()

    def slow():
        for i in range(100):
            if i >= 1:
                inside.set()
                time.sleep(0.3)
                inside.clear()
            yield i
    it = _inputs.read_ahead(slow(), 1)
    assert next(it) == 0
    assert inside.wait(5)   # the thread is in the input
    it.close()
    assert not inside.is_set()
    assert not any(t.name == "input-read-ahead" for t in threading.enumerate())


def test_an_input_stuck_past_the_bound_is_left_with_a_warning(monkeypatch, caplog):
    release = threading.Event()

    def stuck():
        yield 0
        release.wait(30)
        yield 1
    monkeypatch.setattr(_inputs, "_STOP_SECS", 0.2)
    it = _inputs.read_ahead(stuck(), 1)
    assert next(it) == 0
    start = time.monotonic()
    with caplog.at_level("WARNING"):
        it.close()
    assert time.monotonic() - start < 5
    assert "still in the input" in caplog.text
    release.set()


# A program that trains reading ahead, then ends at once. Its input thread is
# in the input (freeing tensors that came through pickle, as a DataLoader's
# or torch.load's do) when train returns: a thread freeing such a tensor while
# the interpreter exits aborts the process.
_ENDS_AFTER_TRAINING = """
import pickle, sys, time, torch
import estimator as est
from models import regression_model_fn
blob = pickle.dumps(torch.ones(3))
def input_fn():
    for i in range(1000):
        if i >= 4:   # the batches read ahead past the last step
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                pickle.loads(blob)
        yield {"x": torch.ones(4, 3)}, torch.ones(4, 1)
est.Estimator(regression_model_fn, config=est.RunConfig(
    model_dir=sys.argv[1], experimental_prefetch_batches=2)).train(input_fn, max_steps=3)
print("trained", flush=True)
"""


def test_a_program_ending_right_after_training_exits_cleanly(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_ENDS_AFTER_TRAINING)
    path = [SUPPORT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    for i in range(2):   # (a model_dir each: a second run there would not train)
        done = subprocess.run([sys.executable, str(script), str(tmp_path / f"model{i}")],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert "trained" in done.stdout


def test_training_with_read_ahead_equals_training_without(tmp_path):
    def trained(name, prefetch):
        e = est.Estimator(regression_model_fn, config=est.RunConfig(
            model_dir=str(tmp_path / name), tf_random_seed=1,
            experimental_prefetch_batches=prefetch))
        e.train(regression_input_fn(), max_steps=25)
        return {n: e.get_variable_value(n) for n in e.get_variable_names()}
    a, b = trained("plain", 0), trained("ahead", 3)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_an_input_error_fails_training_with_it(tmp_path):
    def input_fn():
        for i in range(3):
            yield {"x": torch.ones(4, 3)}, torch.ones(4, 1)
        raise ValueError("bad record 3")
    e = est.Estimator(regression_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path), experimental_prefetch_batches=2))
    with pytest.raises(ValueError, match="bad record 3"):
        e.train(input_fn, max_steps=10)


def test_prefetch_batches_checked():
    with pytest.raises(ValueError, match="experimental_prefetch_batches should be >= 0"):
        est.RunConfig(experimental_prefetch_batches=-1)


@pytest.mark.parametrize("how", ["end", "error", "close"])
def test_a_core_is_left_to_the_input_thread_while_reading_ahead(how):
    """torch's intra-op threads are one fewer while the input thread runs, and
    back to what they were however reading ends."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def batches():
            yield 1
            if how == "error":
                raise RuntimeError("input broke")
            yield 0
        it = _inputs.read_ahead(batches(), 1)
        assert next(it) == 1
        assert torch.get_num_threads() == 1
        if how == "close":
            it.close()
        elif how == "error":
            with pytest.raises(RuntimeError, match="input broke"):
                list(it)
        else:
            assert list(it) == [0]
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)   # one thread: nothing to leave
        assert list(_inputs.read_ahead(iter([1]), 1)) == [1]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_failed_train_leaves_no_thread_and_the_thread_count_as_it_was(tmp_path, monkeypatch):
    """A hook raising mid-training (the error kept, as a notebook keeps
    sys.last_value): the read-ahead thread ran on and torch's threads stayed
    one fewer until the traceback was freed, and the model_dir's summary
    writer thread stayed for the process (one more per failed train). (No
    released writer waits for a next run here: they would count.)"""
    import hooks
    monkeypatch.setattr(hooks.SummaryWriterCache, "_KEEP_IDLE", 0)

    class Fail(hooks.SessionRunHook):
        def after_run(self, run_context, run_values):
            if run_context.session.global_step == 3:
                raise ValueError("hook broke")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    threads = threading.active_count()
    kept = []
    for i in range(3):
        e = est.Estimator(regression_model_fn, config=est.RunConfig(
            model_dir=str(tmp_path / str(i)), experimental_prefetch_batches=2,
            save_summary_steps=1), params={})
        try:
            e.train(regression_input_fn(repeat=True), max_steps=10, hooks=[Fail()])
        except ValueError as error:
            kept.append(error)
        assert torch.get_num_threads() == 2
        assert threading.active_count() <= threads, threading.enumerate()
    assert len(kept) == 3
    torch.set_num_threads(before)
