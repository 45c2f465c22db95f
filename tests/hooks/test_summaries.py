"""TensorBoard summaries: est.summary.*, SummarySaverHook, StepCounterHook,
evaluation summaries and chief-only writing, read back with TensorBoard's own
EventAccumulator."""
import json
import logging
import os
import signal
import subprocess
import sys
import types
import zlib

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

import distribute
import estimator as est
import hooks
from hooks import checkpoint, model_scope
from models import regression_input_fn, regression_model_fn
from paths import FIXTURES, ROOT, SUPPORT
from tf_cluster import tf_config

CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
IMAGES = torch.arange(2 * 3 * 4 * 3, dtype=torch.uint8).reshape(2, 3, 4, 3)


def events(logdir):
    return EventAccumulator(str(logdir), size_guidance={
        "scalars": 0, "images": 0, "histograms": 0, "tensors": 0}).Reload()


def steps(acc, tag):
    """The steps of `tag`, sorted: several runs (evaluations) write several
    event files, whose names order them only to the second."""
    return sorted(e.step for e in acc.Scalars(tag))


def summary_model_fn(recorded):
    """A model_fn recording every kind of summary; `recorded[step]` says which
    calls recorded on the step that model_fn saw."""
    def model_fn(features, labels, mode):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        pred = net(torch.as_tensor(features["x"]))
        loss = torch.nn.functional.mse_loss(pred, labels)
        recorded[est.get_global_step()] = [
            est.summary.scalar("pred_mean", pred.mean()),
            est.summary.histogram("pred", pred),
            est.summary.image("img", IMAGES, max_outputs=2),
            est.summary.image("float_img", torch.full((3, 2, 2, 1), 0.5)),
            est.summary.text("note", "step **%d**" % est.get_global_step())]
        if mode == est.ModeKeys.EVAL:
            return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
                "mae": est.metrics.mean_absolute_error(labels, pred)})
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)
    return model_fn


def make(model_dir, model_fn=None, **config):
    config.setdefault("save_checkpoints_steps", 10)
    return est.Estimator(model_fn or summary_model_fn({}),
                         config=est.RunConfig(model_dir=str(model_dir), **config))


def _png_pixels(png: bytes, height, width, channels):
    """Decode our filter-0 PNG (checked against Pillow too when it is installed)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(png):
        n = int.from_bytes(png[pos:pos + 4], "big")
        kind, data = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        assert int.from_bytes(png[pos + 8 + n:pos + 12 + n], "big") == zlib.crc32(kind + data)
        idat += data if kind == b"IDAT" else b""
        pos += 12 + n
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, -1)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(height, width, channels)


# -- training summaries ----------------------------------------------------------
def test_train_writes_loss_speed_and_model_fn_summaries(tmp_path):
    e = make(tmp_path, save_summary_steps=10, log_step_count_steps=10)
    e.train(regression_input_fn(), steps=25)
    assert str(tmp_path) in hooks.SummaryWriterCache._idle    # flushed, no run holds it
    acc = events(tmp_path)
    assert steps(acc, "loss") == [1, 11, 21]
    assert steps(acc, "pred_mean") == [1, 11, 21]
    assert steps(acc, "global_step/sec") == [11, 21]
    assert all(ev.value > 0 for ev in acc.Scalars("global_step/sec"))
    assert [ev.step for ev in acc.Histograms("pred")] == [1, 11, 21]
    assert acc.Histograms("pred")[0].histogram_value.num == 32
    # the logged loss is the step's loss (step 1 ran on the untrained model)
    assert acc.Scalars("loss")[0].value > acc.Scalars("loss")[-1].value

    tags = acc.Tags()["images"]
    assert sorted(tags) == ["float_img/image/0", "float_img/image/1", "float_img/image/2",
                            "img/image/0", "img/image/1"]
    first = acc.Images("img/image/1")[0]
    assert (first.step, first.height, first.width) == (1, 3, 4)
    pixels = _png_pixels(first.encoded_image_string, 3, 4, 3)
    np.testing.assert_array_equal(pixels, IMAGES[1].numpy())
    gray = acc.Images("float_img/image/0")[0]   # all 0.5: TF1 scales the largest to 255
    assert (_png_pixels(gray.encoded_image_string, 2, 2, 1) == 255).all()
    try:
        import io

        from PIL import Image
    except ImportError:
        pass
    else:
        np.testing.assert_array_equal(
            np.asarray(Image.open(io.BytesIO(first.encoded_image_string))), IMAGES[1].numpy())

    notes = acc.Tensors("note")
    assert [t.step for t in notes] == [1, 11, 21]
    assert tensor_util.make_ndarray(notes[1].tensor_proto).item() == b"step **10**"


class _CrashAt(hooks.SessionRunHook):
    def __init__(self, step):
        self.step = step

    def after_run(self, run_context, run_values):
        if run_context.session.global_step == self.step:
            raise RuntimeError("the machine went away")


def test_a_resumed_run_replaces_what_the_interrupted_one_wrote_past_its_checkpoint(tmp_path):
    """TF's SessionLog START at a session's first step: TensorBoard drops the
    points at and after it that the interrupted run wrote (16 and 21 past the
    checkpoint of step 10 here), instead of drawing both runs' points
    there (found against TF 2.15: [.., 11, 16, 11, 16, 21, ..] here)."""
    kwargs = dict(model_fn=regression_model_fn, save_summary_steps=5, log_step_count_steps=5)
    with pytest.raises(RuntimeError, match="went away"):
        make(tmp_path, **kwargs).train(regression_input_fn(), max_steps=30,
                                       hooks=[_CrashAt(18)])
    hooks.SummaryWriterCache.clear()   # (the process ended: a new writer, a new file)
    make(tmp_path, **kwargs).train(regression_input_fn(), max_steps=30)
    hooks.SummaryWriterCache.clear()
    acc = events(tmp_path)
    assert [e.step for e in acc.Scalars("loss")] == [1, 6, 11, 16, 21, 26]
    # (the resumed run's speed starts 5 steps in, at 16, as TF's: its 11 is gone)
    assert [e.step for e in acc.Scalars("global_step/sec")] == [6, 16, 21, 26]


_KILLED_AFTER_SAVE = """
import os, signal, sys, time
sys.path[:0] = [{root!r}, {support!r}]
import torch
import estimator as est
from hooks import checkpoint
from models import regression_input_fn


class KillAfterSave(est.CheckpointSaverListener):
    def after_save(self, session, step):
        if step == 20:
            os.kill(os.getpid(), signal.SIGKILL)


class KillOnceListed(est.SessionRunHook):
    # No listener: the save of step 20 is written in the background and
    # listed steps later; killed at the first step that sees it listed,
    # with the event files' writer thread slow (a slow disk): the index
    # must wait for it.
    def begin(self):
        from tensorboard.summary.writer import record_writer
        write = record_writer.RecordWriter.write

        def slow(writer, data):
            time.sleep(0.1)
            write(writer, data)
        record_writer.RecordWriter.write = slow

    def after_run(self, run_context, run_values):
        step = run_context.session.global_step
        if step > 20:
            latest = checkpoint.latest_checkpoint(sys.argv[1])
            if step == 29 or latest and latest.endswith("-20"):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.05)


def model_fn(features, labels, mode):
    pred = est.get_module("linear", lambda: torch.nn.Linear(3, 1))(torch.as_tensor(features["x"]))
    est.summary.scalar("pred_mean", pred.mean())
    return est.EstimatorSpec(mode, loss=torch.nn.functional.mse_loss(pred, labels),
                             train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)))


killer = {{"listener": dict(saving_listeners=[KillAfterSave()]),
          "hook": dict(hooks=[KillOnceListed()])}}[sys.argv[2]]
est.Estimator(model_fn, config=est.RunConfig(
    model_dir=sys.argv[1], save_checkpoints_steps=10, save_summary_steps=5,
    log_step_count_steps=5)).train(regression_input_fn(), max_steps=30, **killer)
"""


@pytest.mark.slow
@pytest.mark.parametrize("killer", ["listener", "hook"])
def test_a_crash_after_a_save_loses_no_summary_up_to_the_checkpoint(tmp_path, killer):
    """kill -9 after the checkpoint of step 20: the loss and global_step/sec
    points before it were still held in memory (the hooks' scalars go to the
    event file a few seconds late, model_fn's stay in the writer's buffer up
    to 120 s) and died with the process; the restart resumed at 20, so those
    points were gone for good while the steps after it were written again.
    Killed by a listener (its save waited for) and by a hook once the index
    lists the save (written in the background), with the event files'
    writer thread slow: the save waits for it before it is handed over."""
    script = tmp_path / "killed.py"
    script.write_text(_KILLED_AFTER_SAVE.format(root=ROOT, support=SUPPORT))
    model_dir = tmp_path / "m"
    out = subprocess.run([sys.executable, str(script), str(model_dir), killer],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    assert checkpoint.step_of(checkpoint.latest_checkpoint(str(model_dir))) == 20
    acc = events(model_dir)
    assert [s for s in steps(acc, "loss") if s <= 20] == [1, 6, 11, 16]
    assert [s for s in steps(acc, "pred_mean") if s <= 20] == [1, 6, 11, 16]
    assert [s for s in steps(acc, "global_step/sec") if s <= 20] == [6, 11, 16]
    make(model_dir, model_fn=regression_model_fn, save_summary_steps=5,
         log_step_count_steps=5).train(regression_input_fn(), max_steps=30)
    hooks.SummaryWriterCache.clear()
    assert [e.step for e in events(model_dir).Scalars("loss")] == [1, 6, 11, 16, 21, 26]

with open(os.path.join(FIXTURES, "tf_image_summary.json"), encoding="utf-8") as _f:
    TF_IMAGES = json.load(_f)["cases"]


def test_float_images_are_scaled_as_tf1_scales_them(tmp_path):
    """Each float image on its own, as TF1's image summary kernel does
    (record_tf_image_summary.py, TF 2.15): the largest value at 255, or with
    negatives 0 at 128; float32 and float64 alike. They were clipped to
    [0, 1] (TF2's rule): 0-200 pixel values came out white, 0-0.5 dark."""
    def model_fn(features, labels, mode):
        for name, case in TF_IMAGES.items():
            for dtype in ("float32", "float64"):
                images = np.asarray(case["images"], dtype).reshape(-1, 2, 3, 1)
                est.summary.image(f"{name}_{dtype}", images, max_outputs=2)
        return regression_model_fn(features, labels, mode, {})
    make(tmp_path, model_fn=model_fn).train(regression_input_fn(), max_steps=1)
    hooks.SummaryWriterCache.clear()
    acc = events(tmp_path)
    for name, case in TF_IMAGES.items():
        for dtype in ("float32", "float64"):
            got = [_png_pixels(acc.Images(f"{name}_{dtype}/image/{i}")[0].encoded_image_string,
                               2, 3, 1).reshape(-1).tolist() for i in range(len(case[dtype]))]
            assert got == case[dtype], (name, dtype)


def test_summaries_are_recorded_only_on_due_steps(tmp_path):
    recorded, seen_pending = {}, []

    class Watch(hooks.SessionRunHook):
        def before_run(self, run_context):
            seen_pending.append(len(run_context.session.scope.summaries))

    e = make(tmp_path, summary_model_fn(recorded), save_summary_steps=5, log_step_count_steps=100)
    e.train(regression_input_fn(), steps=12, hooks=[Watch()])
    # model_fn sees the step before it runs: due steps 1, 6, 11 -> model_fn at 0, 5, 10
    assert sorted(recorded) == list(range(12))
    assert sorted(s for s, rec in recorded.items() if any(rec)) == [0, 5, 10]
    assert all(all(rec) or not any(rec) for rec in recorded.values())
    assert seen_pending == [5] + [0] * 11      # the first spec's 5 records, then none left
    assert steps(events(tmp_path), "loss") == [1, 6, 11]
    assert est.summary.scalar("outside", 1.0) is False   # no model scope active


def test_summary_step_argument_and_secs_schedule(tmp_path):
    def model_fn(features, labels, mode, params):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        est.summary.scalar("fixed", 3, step=1000)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)

    e = make(tmp_path, model_fn, save_summary_steps=None, log_step_count_steps=100)
    e.train(regression_input_fn(), steps=3)        # no summary hook: nothing but speed
    assert not os.path.exists(tmp_path / "eval")
    assert "loss" not in events(tmp_path).Tags()["scalars"]

    sub = tmp_path / "secs"
    e = make(sub, model_fn, save_summary_steps=None, log_step_count_steps=100)
    hook = hooks.SummarySaverHook(save_secs=3600, output_dir=str(sub / "s"))
    e.train(regression_input_fn(), steps=4, hooks=[hook])
    acc = events(sub / "s")
    assert steps(acc, "loss") == [1]                # first step only within the hour
    assert [(ev.step, ev.value) for ev in acc.Scalars("fixed")] == [(1000, 3.0)]


def test_summary_op_selects_tags_and_skips_the_loss_fetch(tmp_path):
    def step_fn():
        est.summary.scalar("a", 1.0)
        est.summary.scalar("b", 2.0)
        return {"no_loss_here": torch.tensor(0.0)}

    hook = hooks.SummarySaverHook(save_steps=2, output_dir=str(tmp_path), summary_op=["a"])
    scope = model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy())
    with hooks.MonitoredSession(scope, [hook, hooks.StopAtStepHook(last_step=4)]) as sess:
        while not sess.should_stop():
            sess.run(step_fn)
    acc = events(tmp_path)
    assert acc.Tags()["scalars"] == ["a"]
    assert steps(acc, "a") == [1, 3]


def test_monitored_training_session_writes_summaries(tmp_path):
    with hooks.MonitoredTrainingSession(checkpoint_dir=str(tmp_path), save_summaries_steps=5,
                                        log_step_count_steps=5,
                                        hooks=[hooks.StopAtStepHook(last_step=12)]) as sess:
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))

        def train_step():
            loss = net(torch.ones(4, 2)).pow(2).mean()
            est.summary.scalar("bias", net.bias[0])
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        while not sess.should_stop():
            sess.run(train_step)
    acc = events(tmp_path)
    assert steps(acc, "bias") == [1, 6, 11]
    assert "loss" not in acc.Tags()["scalars"]   # TF's Estimator writes one, not a custom loop
    assert steps(acc, "global_step/sec") == [6, 11]
    # a due record is a copy: the later optimizer step did not change it
    assert acc.Scalars("bias")[0].value != pytest.approx(net.bias.item())


def test_nan_histogram_is_a_clear_error(tmp_path):
    def model_fn(features, labels, mode, params):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        est.summary.histogram("bad", torch.tensor([1.0, float("nan")]))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)

    with pytest.raises(ValueError, match=r"histogram\('bad'\) at step 1: .*NaN or Inf"):
        make(tmp_path, model_fn).train(regression_input_fn(), steps=2)


@pytest.mark.parametrize("call, error, message", [
    (lambda: est.summary.scalar("s", torch.ones(3)), ValueError, r"scalar\('s'\).*shape \(3,\)"),
    (lambda: est.summary.scalar("s", "x"), TypeError, r"scalar\('s'\): data must be a number"),
    (lambda: est.summary.scalar("", 1.0), ValueError, "name must be a non-empty string"),
    (lambda: est.summary.scalar("s", 1.0, step=1.5), TypeError, "step must be an int"),
    (lambda: est.summary.histogram("h", torch.ones(0)), ValueError, r"histogram\('h'\).*empty"),
    (lambda: est.summary.histogram("h", torch.ones(2, dtype=torch.bool)), TypeError,
     "real numbers"),
    (lambda: est.summary.histogram("h", ["a"]), TypeError, "array of numbers"),
    (lambda: est.summary.image("i", torch.ones(3, 4, 3)), ValueError,
     r"image\('i'\): data must be 4-D .* got shape \(3, 4, 3\)"),
    (lambda: est.summary.image("i", torch.ones(1, 3, 4, 2)), ValueError, "channels 1, 3 or 4"),
    (lambda: est.summary.image("i", torch.ones(1, 3, 4, 3, dtype=torch.int32)), TypeError,
     "uint8 or floating point"),
    (lambda: est.summary.image("i", torch.ones(1, 3, 4, 3), max_outputs=0), ValueError,
     "max_outputs must be an int >= 1"),
    (lambda: est.summary.text("t", 5), TypeError, r"text\('t'\): data must be a string"),
    (lambda: est.summary.text("t", []), TypeError, "non-empty list of strings"),
])
def test_bad_summary_calls_are_clear_errors(call, error, message):
    with model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy()) as scope:
        scope.summaries_due = True
        with pytest.raises(error, match=message):
            call()
        assert scope.summaries == []
        scope.summaries_due = False
        assert call() is False                     # not due: no check, no work


@pytest.mark.parametrize("make_hook, message", [
    (lambda d: hooks.SummarySaverHook(output_dir=d), "exactly one of save_steps and save_secs"),
    (lambda d: hooks.SummarySaverHook(save_steps=1, save_secs=1, output_dir=d), "exactly one"),
    (lambda d: hooks.SummarySaverHook(save_steps=1), "one of output_dir or summary_writer"),
    (lambda d: hooks.SummarySaverHook(save_steps=1, output_dir=d, scaffold=object(),
                                      summary_op="a"), "at most one of scaffold or summary_op"),
    (lambda d: hooks.SummarySaverHook(save_steps=1, output_dir=d, summary_op=[3]),
     "summary_op names the tags"),
    # a ported tf.train.Scaffold's parts, which would be ignored
    (lambda d: hooks.SummarySaverHook(save_steps=1, output_dir=d, scaffold=types.SimpleNamespace(
        summary_op="merged")), r"SummarySaverHook: scaffold's summary_op cannot run here "
                               r".*SummarySaverHook\(summary_op=\[tags\]\) picks some"),
    (lambda d: hooks.CheckpointSaverHook(d, save_steps=1, scaffold=types.SimpleNamespace(
        saver="a Saver(max_to_keep=None)")),
     r"CheckpointSaverHook: scaffold's saver cannot run here .*"
     r"CheckpointSaverHook\(saver=checkpoint.Saver\(dir, max_to_keep=...\)\)"),
    (lambda d: hooks.MonitoredTrainingSession(checkpoint_dir=d, scaffold=types.SimpleNamespace(
        init_fn=lambda scaffold, session: None, saver=None)),
     r"MonitoredTrainingSession: scaffold's init_fn cannot run here .*warm_start_from\. "
     r"Leave scaffold out"),
    (lambda d: hooks.SummarySaverHook(save_steps=1, summary_writer=d), "must be a torch"),
    (lambda d: hooks.SummarySaverHook(save_steps=0, output_dir=d), "every_steps must be > 0"),
    (lambda d: hooks.StepCounterHook(every_n_steps=None), "exactly one of every_n_steps"),
    (lambda d: hooks.StepCounterHook(every_n_steps=5, every_n_secs=1), "exactly one"),
])
def test_bad_hook_arguments(tmp_path, make_hook, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make_hook(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_step_counter_logs_without_writer_and_uses_given_writer(tmp_path, caplog):
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(tmp_path))
    counters = [hooks.StepCounterHook(every_n_steps=2),
                hooks.StepCounterHook(every_n_steps=2, summary_writer=writer)]
    scope = model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy())
    with caplog.at_level(logging.INFO, logger="hooks.summary_hooks"):
        with hooks.MonitoredSession(scope, counters + [hooks.StopAtStepHook(last_step=5)]) as s:
            while not s.should_stop():
                s.run(lambda: torch.tensor(0.0))
    assert caplog.text.count("global_step/sec:") == 4      # steps 3 and 5, two hooks
    writer.close()
    assert steps(events(tmp_path), "global_step/sec") == [3, 5]


# -- scalars held back and written together -----------------------------------------
def test_held_scalars_are_on_disk_when_train_returns(tmp_path):
    e = make(tmp_path, save_summary_steps=1, log_step_count_steps=1)
    e.train(regression_input_fn(), steps=30)        # 60 scalars: fewer than one batch
    acc = events(tmp_path)
    assert steps(acc, "loss") == list(range(1, 31))
    assert steps(acc, "global_step/sec") == list(range(2, 31))
    wall = [ev.wall_time for ev in acc.Scalars("loss")]
    assert wall == sorted(wall)                      # each event keeps its own time


def test_held_scalars_reach_disk_although_an_error_ends_the_session(tmp_path):
    saver = hooks.SummarySaverHook(save_steps=1, output_dir=str(tmp_path))
    scope = model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy())
    scope.loss_summary = True   # (the Estimator's: its loss is a summary)

    def failing_step():
        if scope.global_step == 5:
            raise RuntimeError("the data broke")
        return torch.tensor(float(scope.global_step))
    with pytest.raises(RuntimeError, match="the data broke"):
        with hooks.MonitoredSession(scope, [saver]) as s:
            while True:
                s.run(failing_step)
    # no hook's `end` ran (TF's rule on errors), yet the loss curve is readable
    assert steps(events(tmp_path), "loss") == [1, 2, 3, 4, 5]
    hooks.SummaryWriterCache.clear()


def test_held_scalars_are_written_after_hold_secs(tmp_path, monkeypatch):
    import time as time_module
    now = [100.0]
    monkeypatch.setattr(time_module, "time", lambda: now[0])
    cache = hooks.SummaryWriterCache
    counter = hooks.StepCounterHook(every_n_steps=1, output_dir=str(tmp_path))
    scope = model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy())
    with hooks.MonitoredSession(scope, [counter]) as s:
        for _ in range(3):
            now[0] += 1.0
            s.run(lambda: torch.tensor(0.0))
        key = os.path.abspath(str(tmp_path))
        assert len(cache._held[key]) == 2            # steps 2 and 3, held
        now[0] += cache._HOLD_SECS
        s.run(lambda: torch.tensor(0.0))
        assert key not in cache._held                # handed to the writer
        cache._writers[key].flush()
        assert steps(events(tmp_path), "global_step/sec") == [2, 3, 4]


# -- what the summaries cost ---------------------------------------------------------
def _count_to_host(monkeypatch):
    import hooks.monitored_session as ms
    calls = []
    real = ms._to_host

    def counting(values):
        calls.append(model_scope._current.global_step)
        return real(values)
    monkeypatch.setattr(ms, "_to_host", counting)
    return calls


def test_steps_nobody_fetches_never_copy_to_host(tmp_path, monkeypatch):
    calls = _count_to_host(monkeypatch)
    counter = hooks.StepCounterHook(every_n_steps=5, output_dir=str(tmp_path))
    saver = hooks.CheckpointSaverHook(str(tmp_path / "ckpt"), save_steps=5)
    scope = model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy())
    with hooks.MonitoredSession(scope, [counter, saver, hooks.StopAtStepHook(last_step=20)]) as s:
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        while not s.should_stop():
            s.run(lambda: net(torch.ones(1, 2)).sum())
    assert calls == []
    assert steps(events(tmp_path), "global_step/sec") == [6, 11, 16]


def test_summaries_copy_to_host_on_one_step_in_ten(tmp_path, monkeypatch):
    calls = _count_to_host(monkeypatch)
    e = make(tmp_path, save_summary_steps=10, log_step_count_steps=10)
    e.train(regression_input_fn(), steps=40)
    assert calls == [1, 11, 21, 31]
    assert steps(events(tmp_path), "loss") == [1, 11, 21, 31]


# -- evaluation summaries ------------------------------------------------------------
def test_evaluation_writes_result_scalars_at_the_checkpoint_step(tmp_path):
    e = make(tmp_path, save_summary_steps=100)
    e.train(regression_input_fn(), steps=10)
    first = e.evaluate(regression_input_fn(repeat=False))
    e.train(regression_input_fn(), steps=10)
    second = e.evaluate(regression_input_fn(repeat=False))
    named = e.evaluate(regression_input_fn(repeat=False), steps=2, name="holdout",
                       checkpoint_path=str(tmp_path / "model.ckpt-10"))
    acc = events(tmp_path / "eval")
    assert sorted(acc.Tags()["scalars"]) == ["loss", "mae"]
    assert sorted((ev.step, ev.value) for ev in acc.Scalars("mae")) == [
        (10, pytest.approx(first["mae"])), (20, pytest.approx(second["mae"]))]
    assert steps(acc, "loss") == [10, 20]
    acc = events(e.eval_dir("holdout"))
    assert e.eval_dir("holdout") == os.path.join(str(tmp_path), "eval_holdout")
    assert [(ev.step, ev.value) for ev in acc.Scalars("loss")] == [
        (10, pytest.approx(named["loss"]))]


def test_array_results_are_tensors_and_other_results_are_skipped(tmp_path, caplog):
    from hooks.summary_hooks import write_dict_to_summary
    with caplog.at_level(logging.WARNING):
        write_dict_to_summary(str(tmp_path), {"acc": np.float32(0.5), "n": 3, "global_step": 7,
                                               "per_class": np.ones(3), "name": "x"}, 7)
    assert "Skipping summary for name" in caplog.text and "per_class" not in caplog.text
    acc = events(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == ["acc", "n"]
    assert [(ev.step, ev.value) for ev in acc.Scalars("n")] == [(7, 3.0)]
    # an array result is a tensor summary, as TF's (precision_at_thresholds)
    (per_class,) = acc.Tensors("per_class")
    assert per_class.step == 7
    np.testing.assert_array_equal(tensor_util.make_ndarray(per_class.tensor_proto), np.ones(3))


def test_writer_cache_shares_one_writer_per_logdir(tmp_path):
    a = hooks.SummaryWriterCache.get(str(tmp_path / "x"))
    assert hooks.SummaryWriterCache.get(str(tmp_path / "x" / ".")) is a
    assert hooks.SummaryWriterCache.get(str(tmp_path / "y")) is not a
    a.add_scalar("v", 1.0, 3)
    hooks.SummaryWriterCache.clear()
    assert steps(events(tmp_path / "x"), "v") == [3]
    assert hooks.SummaryWriterCache.get(str(tmp_path / "x")) is not a
    hooks.SummaryWriterCache.clear()


# -- chief-only writing ---------------------------------------------------------------
def _as(monkeypatch, task_type):
    monkeypatch.setenv("TF_CONFIG", tf_config(CLUSTER, task_type, 0))


def test_only_the_chief_writes_to_model_dir(tmp_path, monkeypatch):
    _as(monkeypatch, "worker")
    worker_dir = tmp_path / "worker"
    worker = make(worker_dir, save_summary_steps=1, log_step_count_steps=1)
    assert not worker.config.is_chief
    worker.train(regression_input_fn(), steps=5)
    assert not worker_dir.exists() or os.listdir(worker_dir) == []

    _as(monkeypatch, "chief")
    chief = make(tmp_path / "chief", save_summary_steps=1, log_step_count_steps=1)
    assert chief.config.is_chief
    chief.train(regression_input_fn(), steps=5)
    files = os.listdir(tmp_path / "chief")
    assert "model.ckpt-5" in files and any(f.startswith("events.out.tfevents") for f in files)
    assert steps(events(tmp_path / "chief"), "loss") == [1, 2, 3, 4, 5]

    # a worker evaluating the chief's checkpoint writes no eval summaries; the evaluator does
    _as(monkeypatch, "worker")
    make(tmp_path / "chief").evaluate(regression_input_fn(repeat=False), steps=2)
    assert not (tmp_path / "chief" / "eval").exists()
    _as(monkeypatch, "evaluator")
    make(tmp_path / "chief").evaluate(regression_input_fn(repeat=False), steps=2)
    assert steps(events(tmp_path / "chief" / "eval"), "loss") == [5]


# (tensorboard's writer thread reports its error itself, then keeps it for the next call)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_full_disk_under_the_summaries_names_their_directory(tmp_path, monkeypatch, caplog):
    """The event file's writer thread meets ENOSPC (from step 13 on): training
    stops with an error naming the directory (before: the bare OSError of a
    file it did not name, and another at exit), at the latest when the held
    summaries are written (64 events or 5 s); the checkpoints stay whole."""
    import errno
    from tensorboard.compat.tensorflow_stub.io import gfile

    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        if est.get_global_step() == 12:
            monkeypatch.setattr(gfile.LocalFileSystem, "_write", full)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))

    def full(self, filename, content, mode):
        raise OSError(errno.ENOSPC, "No space left on device")

    model_dir = str(tmp_path / "m")
    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=model_dir, save_summary_steps=1, save_checkpoints_steps=5))
    with pytest.raises(OSError, match=rf"No space left on device writing the summaries in "
                                      rf"{model_dir}") as info:
        e.train(regression_input_fn(), steps=100)
    assert info.value.errno == errno.ENOSPC
    assert int(e.latest_checkpoint().rsplit("-", 1)[1]) >= 10
    assert np.isfinite(e.get_variable_value("net/weight")).all()
    with caplog.at_level(logging.ERROR):
        hooks.SummaryWriterCache.clear()   # what runs at exit: logged, not raised
    monkeypatch.undo()


@pytest.mark.parametrize("case", ["read-only", "a file above it", "a file as it"])
def test_a_summary_directory_that_cannot_be_written_is_said_in_one_line(
        tmp_path, monkeypatch, capfd, case):
    """A read-only model_dir printed tensorboard's writer-thread traceback
    (40 lines) before the error; a file where the eval directory or one
    above the model_dir should be was "File exists" / "Not a directory"
    without the file (names probe)."""
    logdir, blocking = tmp_path / "m", None
    if case == "read-only":
        real = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
            False if str(path) == str(logdir) else real(path, mode, **kw)))
    elif case == "a file above it":
        blocking = tmp_path / "afile"
        logdir = blocking / "m"
    else:
        blocking = logdir = tmp_path / "eval"
    if blocking is not None:
        blocking.write_text("")
    with pytest.raises(OSError) as info:
        hooks.SummaryWriterCache.get(str(logdir))
    assert f"writing the summaries in {logdir}" in str(info.value)
    assert ("Permission denied" in str(info.value) if blocking is None
            else f"({blocking} is a file, not a directory)" in str(info.value))
    assert "Exception in thread" not in capfd.readouterr().err


@pytest.mark.parametrize("given_writer", [False, True])
def test_events_are_written_in_step_order(tmp_path, given_writer):
    """The held loss and global_step/sec scalars are written before a later
    step's model_fn summaries (TF's event files are in step order; a reader
    going through one in order saw `pred_mean` of step 11 before `loss` of 6),
    also by a SummarySaverHook given the cached writer (FileWriterCache.get's)."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    e = make(tmp_path, save_summary_steps=5, log_step_count_steps=4)
    e.train(regression_input_fn(), steps=30, hooks=[hooks.SummarySaverHook(
        save_steps=3, summary_writer=hooks.SummaryWriterCache.get(str(tmp_path)))]
        if given_writer else None)
    hooks.SummaryWriterCache.clear()   # (the one `get` pinned: flushed and closed)
    files = [f for f in os.listdir(tmp_path) if f.startswith("events.out.tfevents")]
    assert len(files) == 1
    written = [(ev.step, v.tag) for ev in LegacyEventFileLoader(str(tmp_path / files[0])).Load()
               if ev.HasField("summary") for v in ev.summary.value]
    assert {tag for _, tag in written} >= {"loss", "global_step/sec", "pred_mean"}
    assert [s for s, _ in written] == sorted(s for s, _ in written)
