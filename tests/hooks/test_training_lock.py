"""One trainer per model_dir (hooks.training_lock): a second process training
into a model_dir that another is training waits for it, then resumes from its
last checkpoint; it fails naming the holder once the wait is over. Before the
lock both trained at once, overwriting each other's checkpoints (the same step
numbers, different weights) with no word."""
import os
import signal
import subprocess
import sys
import time

import pytest

import estimator as est
import hooks
from estimator import checkpoint
from hooks import training_lock
from models import regression_input_fn, regression_model_fn
from paths import ROOT, SUPPORT

# A trainer of the regression model into argv[1] up to step argv[2], one
# batch every 20 ms; it writes argv[3] once it has saved a checkpoint.
_TRAINER = """
import os, sys, time
sys.path[:0] = [{root!r}, {support!r}]
import estimator as est
from models import regression_input_fn, regression_model_fn
model_dir, last, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class Ready(est.CheckpointSaverListener):
    def after_save(self, session, global_step_value):
        open(ready, "w").close()

def slow():
    for batch in regression_input_fn()():
        time.sleep(0.02)
        yield batch

e = est.Estimator(regression_model_fn, params={{"lr": 0.1}}, config=est.RunConfig(
    model_dir=model_dir, save_checkpoints_steps=5, experimental_async_checkpoint=False))
e.train(slow, max_steps=last, saving_listeners=[Ready()])
"""

# A process holding the lock of argv[1] until killed; writes argv[2] once held.
_HOLDER = """
import sys, time
sys.path[:0] = [{root!r}]
from hooks.training_lock import {lock}
lock = {lock}(sys.argv[1])
open(sys.argv[2], "w").close()
time.sleep(120)
"""
_EVALUATOR_HOLDER = _HOLDER.replace("{lock}", "EvaluationLock")
_HOLDER = _HOLDER.replace("{lock}", "TrainingLock")


def _start(tmp_path, template, *args):
    script = tmp_path / "script.py"
    script.write_text(template.format(root=ROOT, support=SUPPORT))
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, str(script), *map(str, args), str(ready)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail("the other process did not start: "
                        + proc.communicate(timeout=10)[1].decode()[-2000:])
        time.sleep(0.02)
    return proc


def _stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    proc.stderr.close()


def _estimator(model_dir):
    return est.Estimator(regression_model_fn, params={"lr": 0.1}, config=est.RunConfig(
        model_dir=str(model_dir), save_checkpoints_steps=5))


@pytest.mark.slow
def test_a_second_trainer_waits_for_the_first_then_resumes_from_its_last_checkpoint(
        tmp_path, caplog):
    model_dir = tmp_path / "m"
    first = _start(tmp_path, _TRAINER, model_dir, 60)   # has saved step 5 or so
    try:
        with caplog.at_level("INFO"):
            e = _estimator(model_dir)
            e.train(regression_input_fn(), max_steps=80)
        assert first.wait(timeout=60) == 0, first.stderr.read().decode()[-2000:]
    finally:
        _stop(first)
    assert "is being trained by another process (pid %d" % first.pid in caplog.text
    # it restored what the first left at its end, and trained the rest
    assert f"Resuming from {model_dir / 'model.ckpt-60'}" in caplog.text
    assert e.get_variable_value("global_step") == 80
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(model_dir))] == \
        [60, 65, 70, 75, 80]
    assert not (model_dir / training_lock.LOCK_FILE).exists()   # gone with its holder


@pytest.mark.slow
def test_a_second_train_and_evaluate_that_waited_for_max_steps_skips_as_a_rerun(
        tmp_path, caplog):
    """The second of two runs of one experiment (launched together) found
    max_steps saved once it held the lock: it ran a session of no step,
    evaluated and exported the last checkpoint again (a second point at its
    step in eval/) and said "Loss for final step"; a rerun started after
    says "Skipping training" and evaluates nothing, as TF's."""
    model_dir = tmp_path / "m"
    first = _start(tmp_path, _TRAINER, model_dir, 60)
    try:
        with caplog.at_level("INFO"):
            result = est.train_and_evaluate(
                _estimator(model_dir), est.TrainSpec(regression_input_fn(), max_steps=60),
                est.EvalSpec(regression_input_fn(repeat=False), steps=2, throttle_secs=0))
        assert first.wait(timeout=60) == 0, first.stderr.read().decode()[-2000:]
    finally:
        _stop(first)
    assert "is being trained by another process (pid %d" % first.pid in caplog.text
    assert "Skipping training since max_steps has already saved." in caplog.text
    assert "Loss for final step" not in caplog.text
    assert result == (None, None) and not (model_dir / "eval").exists()


@pytest.mark.slow
def test_a_holder_that_stays_is_an_error_naming_it_and_nothing_is_written(
        tmp_path, monkeypatch):
    model_dir = tmp_path / "m"
    _estimator(model_dir).train(regression_input_fn(), max_steps=5)
    holder = _start(tmp_path, _HOLDER, model_dir)
    before = sorted(os.listdir(model_dir))
    monkeypatch.setattr(training_lock, "WAIT_SECS", 0.5)
    try:
        with pytest.raises(RuntimeError, match=f"{model_dir} is being trained by another "
                           f"process \\(pid {holder.pid} on .*still after 0.5 s"):
            _estimator(model_dir).train(regression_input_fn(), max_steps=10)
        assert sorted(os.listdir(model_dir)) == before
        # a custom loop's MonitoredTrainingSession takes the same lock
        with pytest.raises(RuntimeError, match=f"pid {holder.pid}"):
            hooks.MonitoredTrainingSession(checkpoint_dir=str(model_dir), is_chief=True)
        # evaluation and prediction only read: not held up
        assert _estimator(model_dir).evaluate(regression_input_fn(repeat=False))[
            "global_step"] == 5
    finally:
        _stop(holder)


@pytest.mark.slow
def test_a_holder_killed_with_9_leaves_its_file_and_no_lock(tmp_path, caplog):
    model_dir = tmp_path / "m"
    holder = _start(tmp_path, _HOLDER, model_dir)
    holder.send_signal(signal.SIGKILL)
    _stop(holder)
    assert (model_dir / training_lock.LOCK_FILE).exists()
    with caplog.at_level("WARNING"):
        _estimator(model_dir).train(regression_input_fn(), max_steps=3)
    assert "another process" not in caplog.text
    assert not (model_dir / training_lock.LOCK_FILE).exists()


def test_the_lock_is_the_process_s_once(tmp_path):
    """A second lock in the holding process takes nothing and releases nothing
    (closing a second descriptor would drop the process's POSIX lock)."""
    model_dir = str(tmp_path)
    with training_lock.TrainingLock(model_dir) as outer:
        with training_lock.TrainingLock(model_dir, wait_secs=0) as inner:
            assert not inner.held
        assert outer.held and os.path.exists(os.path.join(model_dir, training_lock.LOCK_FILE))
        probe = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n"
             f"from hooks.training_lock import TrainingLock\n"
             f"TrainingLock({model_dir!r}, wait_secs=0)"],
            capture_output=True, text=True, timeout=60)
        assert probe.returncode == 1 and "is being trained by another process" in probe.stderr
    assert not outer.held
    assert not os.path.exists(os.path.join(model_dir, training_lock.LOCK_FILE))


@pytest.mark.slow
def test_a_second_evaluator_of_one_eval_dir_is_an_error_naming_the_first(tmp_path, monkeypatch):
    """Both evaluated every checkpoint into one eval dir (each point twice in
    TensorBoard, each export twice), and the second's start removed the links
    through which the first held checkpoints for its exports."""
    from tf_cluster import tf_config
    model_dir = tmp_path / "m"
    _estimator(model_dir).train(regression_input_fn(), max_steps=5)
    holder = _start(tmp_path, _EVALUATOR_HOLDER, model_dir / "eval")
    monkeypatch.setattr(training_lock, "WAIT_SECS", 0.5)
    monkeypatch.setenv("TF_CONFIG", tf_config({"chief": ["127.0.0.1:1111"]}, "evaluator", 0))
    specs = (est.TrainSpec(regression_input_fn(), max_steps=5), est.EvalSpec(
        regression_input_fn(repeat=False), steps=None, start_delay_secs=0, throttle_secs=0))
    try:
        with pytest.raises(RuntimeError, match=(
                f"^eval dir {model_dir / 'eval'} is being written by another process \\(pid "
                f"{holder.pid} on .*\\), still after 0.5 s: two evaluators of one model_dir "
                "write each evaluation twice .* give this evaluator's EvalSpec another name")):
            est.train_and_evaluate(_estimator(model_dir), *specs)
        assert os.listdir(model_dir / "eval") == [training_lock.EVAL_LOCK_FILE]
    finally:
        _stop(holder)
    metrics, _ = est.train_and_evaluate(_estimator(model_dir), *specs)   # the holder gone
    assert metrics["global_step"] == 5
    assert training_lock.EVAL_LOCK_FILE not in os.listdir(model_dir / "eval")
