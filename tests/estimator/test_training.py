"""train_and_evaluate: specs, local mode, role dispatch, the evaluator (ledger,
checkpoint policy, completion and stop markers) and real multi-process runs."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import estimator as est
import hooks
from estimator import checkpoint, training
from hooks.summary_hooks import write_dict_to_summary
from models import regression_data, regression_input_fn, regression_model_fn
from paths import ROOT
from tf_cluster import tf_config

EXAMPLE = os.path.join(ROOT, "examples", "train_and_evaluate.py")
SERVING = est.export.build_raw_serving_input_receiver_fn({"x": torch.zeros(1, 3)})


def input_fn():
    return regression_input_fn()()


def eval_input_fn():
    x, y = regression_data(64, seed=5)
    return [({"x": x[i:i + 32]}, y[i:i + 32]) for i in range(0, 64, 32)]


class _RecordSteps(hooks.SessionRunHook):
    """An evaluation hook noting the global step of each evaluated checkpoint."""

    def __init__(self):
        self.steps = []

    def after_create_session(self, session, coord):
        self.steps.append(session.global_step)


def make(tmp_path, name="m", **config):
    config.setdefault("save_checkpoints_steps", 10)
    return est.Estimator(regression_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / name), **config), params={"lr": 0.1})


def set_cluster(monkeypatch, task_type, index=0, cluster=None):
    cluster = cluster or {"chief": ["127.0.0.1:1111"]}
    monkeypatch.setenv("TF_CONFIG", tf_config(cluster, task_type, index))


def ledger_steps(model_dir, name="eval"):
    return [e["global_step"] for e in training._Ledger(os.path.join(model_dir, name)).entries()]


# -- specs ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, message", [
    ({"input_fn": None}, TypeError, "`input_fn` must be callable"),
    ({"max_steps": 0}, ValueError, r"Must specify max_steps > 0, given: 0"),
    ({"max_steps": 1.5}, TypeError, "`max_steps` must be an int"),
    ({"hooks": [object()]}, TypeError, "All hooks must be `SessionRunHook` instances"),
    ({"saving_listeners": [hooks.StopAtStepHook(1)]}, TypeError,
     "All saving_listeners must be `CheckpointSaverListener`"),
])
def test_train_spec_validation(kwargs, error, message):
    kwargs = dict({"input_fn": input_fn}, **kwargs)
    with pytest.raises(error, match=message):
        est.TrainSpec(**kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"input_fn": 3}, TypeError, "`input_fn` must be callable"),
    ({"steps": 0}, ValueError, "Must specify steps > 0, given: 0"),
    ({"name": 1}, TypeError, "`name` must be string"),
    ({"hooks": ["x"]}, TypeError, "All hooks must be `SessionRunHook` instances"),
    ({"start_delay_secs": -1}, ValueError, "Must specify start_delay_secs >= 0, given: -1"),
    ({"throttle_secs": -1}, ValueError, "Must specify throttle_secs >= 0, given: -1"),
    ({"throttle_secs": "10"}, TypeError, "`throttle_secs` must be a number"),
    ({"exporters": [SERVING]}, TypeError, "`exporters` must be an Exporter, an iterable"),
    ({"exporters": 5}, TypeError, "`exporters` must be an Exporter, an iterable"),
    ({"exporters": [est.LatestExporter("a", SERVING), est.FinalExporter("a", SERVING)]},
     ValueError, "`exporters` must have unique names"),
    ({"exporters": [est.LatestExporter("", SERVING)]}, ValueError, "cannot have a name"),
    ({"checkpoint_policy": "all"}, ValueError, "`checkpoint_policy` must be one of"),
])
def test_eval_spec_validation(kwargs, error, message):
    kwargs = dict({"input_fn": input_fn}, **kwargs)
    with pytest.raises(error, match=message):
        est.EvalSpec(**kwargs)


def test_spec_defaults_are_tf_s():
    spec = est.EvalSpec(input_fn, exporters=est.LatestExporter("latest", SERVING))
    assert (spec.steps, spec.start_delay_secs, spec.throttle_secs) == (100, 120, 600)
    assert len(spec.exporters) == 1 and spec.checkpoint_policy == "latest"
    assert est.TrainSpec(input_fn).max_steps is None


def test_train_and_evaluate_argument_types(tmp_path):
    e = make(tmp_path)
    with pytest.raises(TypeError, match="`estimator` must have type"):
        est.train_and_evaluate(object(), est.TrainSpec(input_fn), est.EvalSpec(input_fn))
    with pytest.raises(TypeError, match="`train_spec` must have type"):
        est.train_and_evaluate(e, est.EvalSpec(input_fn), est.EvalSpec(input_fn))
    with pytest.raises(TypeError, match="`eval_spec` must have type"):
        est.train_and_evaluate(e, est.TrainSpec(input_fn), None)


# -- local mode ---------------------------------------------------------------------------
def run_local(tmp_path, max_steps=35, throttle_secs=0, train_input=input_fn, **config):
    e = make(tmp_path, **config)
    recorder = _RecordSteps()
    final = est.FinalExporter("final", SERVING)
    result = est.train_and_evaluate(
        e, est.TrainSpec(train_input, max_steps=max_steps),
        est.EvalSpec(eval_input_fn, steps=None, throttle_secs=throttle_secs, hooks=[recorder],
                     exporters=[final, est.LatestExporter("latest", SERVING)]))
    return e, recorder.steps, result


def test_local_evaluates_after_every_checkpoint_and_at_the_end(tmp_path):
    e, steps, (metrics, exports) = run_local(tmp_path, max_steps=35, throttle_secs=0)
    assert steps == [10, 20, 30, 35]
    assert ledger_steps(e.model_dir) == steps
    assert metrics["global_step"] == 35 and set(metrics) == {"loss", "mae", "global_step"}
    final, latest = exports
    assert json.load(open(os.path.join(final, "signature.json")))["global_step"] == 35
    assert os.listdir(os.path.dirname(final)) == [os.path.basename(final)]   # final: once
    assert len(os.listdir(os.path.dirname(latest))) == 4
    assert sorted(hooks.read_eval_metrics(e.eval_dir())) == [10, 20, 30, 35]


def test_evaluating_during_training_leaves_the_training_as_it_would_be(tmp_path):
    """TF evaluates in a graph of its own: a dropout model trains to the same
    weights with an evaluation after every checkpoint as without any, even
    where the evaluation builds the model again and its input_fn shuffles with
    the global generator (each moved training's dropout masks: weights 0.08
    apart from the rebuild, 1.3e-3 from the shuffle)."""
    import numpy as np
    from models import bn_dropout_model_fn, iris_like_input_fn
    batches = iris_like_input_fn(epochs=3)()

    def shuffled_eval_input():
        return [batches[int(i)] for i in torch.randperm(4)]

    def estimator(name):
        return est.Estimator(bn_dropout_model_fn, params={"width": 16}, config=est.RunConfig(
            model_dir=str(tmp_path / name), save_checkpoints_steps=4, tf_random_seed=5))
    evaluated = estimator("evaluated")
    metrics, _ = est.train_and_evaluate(
        evaluated, est.TrainSpec(lambda: batches, max_steps=12),
        est.EvalSpec(shuffled_eval_input, steps=None, throttle_secs=0))
    assert sorted(hooks.read_eval_metrics(evaluated.eval_dir())) == [4, 8, 12]
    alone = estimator("alone")
    alone.train(lambda: batches, max_steps=12)
    for name in alone.get_variable_names():
        np.testing.assert_array_equal(evaluated.get_variable_value(name),
                                      alone.get_variable_value(name), err_msg=name)


def test_local_does_not_evaluate_the_last_checkpoint_twice(tmp_path):
    e, steps, (metrics, exports) = run_local(tmp_path, max_steps=30)
    assert steps == [10, 20, 30] and metrics["global_step"] == 30
    assert exports[0] is not None   # the final export happened, at step 30


def test_local_throttle_skips_checkpoints_but_not_the_end(tmp_path):
    _, steps, (metrics, _) = run_local(tmp_path, max_steps=35, throttle_secs=3600)
    assert steps == [10, 35] and metrics["global_step"] == 35


def test_local_no_final_export_when_the_input_runs_out_before_max_steps(tmp_path):
    short = regression_input_fn(batch_size=32, n=32 * 25, repeat=False)
    e, steps, (metrics, exports) = run_local(tmp_path, max_steps=100, train_input=short)
    assert steps == [10, 20, 25] and metrics["global_step"] == 25
    assert exports[0] is None   # FinalExporter: final only at max_steps, as TF's
    assert len(os.listdir(os.path.join(e.model_dir, "export", "latest"))) == 3   # none twice
    assert not os.path.exists(os.path.join(e.model_dir, "export", "final"))


def test_local_returns_none_when_already_trained(tmp_path):
    run_local(tmp_path, max_steps=20)
    _, steps, result = run_local(tmp_path, max_steps=20)
    assert steps == [] and result == (None, None)


def test_local_early_stopping_from_eval_results(tmp_path):
    e = make(tmp_path)
    stop = hooks.stop_if_lower_hook(e, "loss", 1e9, run_every_secs=None, run_every_steps=1)
    est.train_and_evaluate(e, est.TrainSpec(input_fn, max_steps=1000, hooks=[stop]),
                           est.EvalSpec(eval_input_fn, steps=None, throttle_secs=0))
    # the hook sees step 10's evaluation in step 10 (TF's saver runs first)
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 10


# -- roles ------------------------------------------------------------------------------
def test_unknown_task_type_is_a_clear_error(tmp_path, monkeypatch):
    set_cluster(monkeypatch, "trainer", 0, {"chief": ["a:1"], "trainer": ["a:2"]})
    with pytest.raises(ValueError, match=r"Task type 'trainer' .* is not supported. Supported "
                                         r"task types are \['chief', 'evaluator', 'master', "
                                         r"'ps', 'worker'\]"):
        est.train_and_evaluate(make(tmp_path), est.TrainSpec(input_fn, 10),
                               est.EvalSpec(input_fn))


def test_only_one_evaluator(tmp_path, monkeypatch):
    set_cluster(monkeypatch, "evaluator", 1, {"chief": ["a:1"], "evaluator": ["a:2", "a:3"]})
    with pytest.raises(ValueError, match="there can only be one `evaluator` task"):
        est.train_and_evaluate(make(tmp_path), est.TrainSpec(input_fn, 10),
                               est.EvalSpec(input_fn))


@pytest.mark.parametrize("task_type", ["ps", "chief", "worker"])
@pytest.mark.parametrize("sync", [False, True])
def test_ps_tasks_need_a_parameter_server_strategy(tmp_path, monkeypatch, task_type, sync):
    import distribute
    set_cluster(monkeypatch, task_type, 0,
                {"chief": ["a:1"], "worker": ["a:2"], "ps": ["a:3"]})
    if sync and task_type == "ps":   # the strategy itself refuses to run on a ps task
        with pytest.raises(ValueError, match="MultiWorkerMirroredStrategy has no parameter "
                                             "servers: this task is ps:0"):
            distribute.MultiWorkerMirroredStrategy()
        return
    if not sync:   # no strategy: TF1's between-graph way, parameter servers (issue 6)
        e = make(tmp_path)
        assert isinstance(e.config.train_distribute, distribute.ParameterServerStrategy)
        return
    strategy = distribute.MultiWorkerMirroredStrategy()
    with pytest.raises(ValueError, match="does not use parameter servers. Use "
                                         "ParameterServerStrategy"):
        est.train_and_evaluate(make(tmp_path, train_distribute=strategy),
                               est.TrainSpec(input_fn, 10), est.EvalSpec(input_fn))


def test_chief_writes_the_completion_marker(tmp_path, monkeypatch):
    set_cluster(monkeypatch, "chief", 0, {"chief": ["a:1"], "worker": ["a:2"]})
    e = make(tmp_path)
    assert est.train_and_evaluate(e, est.TrainSpec(input_fn, 25), est.EvalSpec(input_fn)) is None
    steps = [est.checkpoint.step_of(p) for p in est.checkpoint.all_checkpoints(e.model_dir)]
    assert steps == [10, 20, 25]
    marker = json.load(open(os.path.join(e.model_dir, training.COMPLETION_MARKER)))
    assert marker["global_step"] == 25 and marker["max_steps"] == 25


def test_a_chief_whose_failure_marker_cannot_be_written_leaves_its_heartbeat(
        tmp_path, monkeypatch, caplog):
    """Training failed (a full disk) and so did writing the failure marker:
    the heartbeat was removed all the same, so the ps tasks, the workers and
    the evaluator, finding neither, took the chief for one not started yet
    and waited for ever. The heartbeat now stays, to go stale (they stop
    after ESTIMATOR_CHIEF_TIMEOUT_SECS), and training's own error is raised."""
    set_cluster(monkeypatch, "chief", 0, {"chief": ["a:1"], "worker": ["a:2"]})
    e = make(tmp_path)
    marker = os.path.join(e.model_dir, training.FAILURE_MARKER)

    class Fail(hooks.SessionRunHook):
        def after_run(self, run_context, run_values):
            os.makedirs(marker)   # (no marker can be written there)
            raise RuntimeError("disk full")
    caplog.set_level("ERROR", logger="estimator.training")
    with pytest.raises(RuntimeError, match="disk full"):
        est.train_and_evaluate(e, est.TrainSpec(input_fn, 25, hooks=[Fail()]),
                               est.EvalSpec(input_fn))
    assert f"Training failed, and {marker} could not be written" in caplog.text
    monkeypatch.setenv("ESTIMATOR_CHIEF_TIMEOUT_SECS", "0")
    assert "no heartbeat" in training._failure(e.model_dir, 25, 0.0)["error"]

def test_a_worker_with_no_model_to_train_is_an_error(tmp_path, monkeypatch):
    """No ps tasks and a strategy that does not span workers: a worker's
    updates would reach neither the chief's model nor a checkpoint (it trained
    its own copy and exited 0; TF's worker waits for ever for the chief's
    variables)."""
    set_cluster(monkeypatch, "worker", 1, {"chief": ["a:1"], "worker": ["a:2", "a:3"]})
    e = make(tmp_path, experimental_max_worker_delay_secs=60)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"worker 1 has no model to train with: the cluster in "
                                         r"TF_CONFIG has no 'ps' tasks .* Give train_distribute="
                                         r"MultiWorkerMirroredStrategy\(\)"):
        est.train_and_evaluate(e, est.TrainSpec(input_fn, 10), est.EvalSpec(input_fn))
    assert time.monotonic() - start < 5   # before the worker delay
    assert not os.path.exists(e.model_dir) or not os.listdir(e.model_dir)


def test_worker_start_delay_is_tf_s_when_asked(monkeypatch, tmp_path):
    set_cluster(monkeypatch, "worker", 3, {"chief": ["a:1"], "worker": ["a:2"] * 4})
    assert training._worker_start_delay(make(tmp_path).config) == 0   # off by default
    assert training._worker_start_delay(make(tmp_path, experimental_max_worker_delay_secs=60)
                                        .config) == 20   # (3 + 1) * 5 s
    assert training._worker_start_delay(make(tmp_path, experimental_max_worker_delay_secs=7)
                                        .config) == 7


def test_trainer_stops_on_the_evaluator_s_stop_marker(tmp_path, monkeypatch):
    e = make(tmp_path)
    e.train(input_fn, max_steps=20)
    os.makedirs(e.model_dir, exist_ok=True)
    training._write_json(os.path.join(e.model_dir, training.STOP_MARKER),
                         {"global_step": 20, "max_steps": 99})   # another run's: stale
    set_cluster(monkeypatch, "chief")
    chief = make(tmp_path)
    est.train_and_evaluate(chief, est.TrainSpec(input_fn, 30), est.EvalSpec(input_fn))
    assert est.checkpoint.step_of(chief.latest_checkpoint()) == 30
    training._write_json(os.path.join(e.model_dir, training.STOP_MARKER),
                         {"global_step": 30, "max_steps": 1000})
    est.train_and_evaluate(chief, est.TrainSpec(input_fn, 1000), est.EvalSpec(input_fn))
    marker = json.load(open(os.path.join(e.model_dir, training.COMPLETION_MARKER)))
    assert marker == dict(marker, global_step=30, max_steps=1000)   # stopped at once


# -- the evaluator, in-process on a finished model_dir --------------------------------------
def evaluator(tmp_path, monkeypatch, max_steps=40, policy="every", train_hooks=(),
              eval_fn=eval_input_fn, recorder=None, **eval_kw):
    """The evaluator task over model_dir `m`; `recorder`: a list the steps of
    the evaluated checkpoints are appended to as they come."""
    set_cluster(monkeypatch, "evaluator")
    e = make(tmp_path)
    assert e.config.task_type == "evaluator"
    hook = _RecordSteps()
    if recorder is not None:
        hook.steps = recorder
    metrics, exports = est.train_and_evaluate(
        e, est.TrainSpec(input_fn, max_steps, hooks=list(train_hooks)),
        est.EvalSpec(eval_fn, steps=None, throttle_secs=0, start_delay_secs=0,
                     checkpoint_policy=policy, hooks=[hook],
                     exporters=[est.FinalExporter("final", SERVING)], **eval_kw))
    return hook.steps, metrics, exports


def test_evaluator_says_it_waits_on_a_machine_booted_minutes_ago(tmp_path, monkeypatch, caplog):
    """The "not trained yet" line comes on the first empty poll, whatever the
    monotonic clock reads (it starts at boot: a fresh CI machine is < 600 s)."""
    set_cluster(monkeypatch, "evaluator")
    e = make(tmp_path)
    marker = os.path.join(e.model_dir, training.FAILURE_MARKER)

    def chief_fails(secs):   # the evaluator's poll wait: the chief then fails
        training._write_json(marker, {"error": "boom", "max_steps": 40, "time": time.time()})
    monkeypatch.setattr(training.time, "monotonic", lambda: 120.0)
    monkeypatch.setattr(training.time, "sleep", chief_fails)
    caplog.set_level("INFO", logger="estimator.training")
    with pytest.raises(training.TrainingFailedError, match="boom"):
        est.train_and_evaluate(e, est.TrainSpec(input_fn, 40), est.EvalSpec(eval_input_fn))
    assert "(the estimator is not trained yet)" in caplog.text


def test_evaluator_ledger_neither_repeats_nor_skips(tmp_path, monkeypatch):
    make(tmp_path, keep_checkpoint_max=None).train(input_fn, max_steps=40)
    steps, metrics, exports = evaluator(tmp_path, monkeypatch)
    assert steps == [10, 20, 30, 40] and metrics["global_step"] == 40 and exports[0]
    model_dir = str(tmp_path / "m")
    assert ledger_steps(model_dir) == [10, 20, 30, 40]
    steps, *_ = evaluator(tmp_path, monkeypatch)   # restarted when done: nothing to do
    assert steps == []
    # Restarted after a crash that lost the last two records (killed between an
    # evaluation's summaries and its ledger line), and a torn line: recorded
    # from the event files, not evaluated again (no duplicate TensorBoard points).
    path = os.path.join(model_dir, "eval", training.LEDGER)
    lines = open(path).read().splitlines(True)
    open(path, "w").write("".join(lines[:2]) + lines[2][:17])
    steps, metrics, exports = evaluator(tmp_path, monkeypatch)
    assert steps == [] and metrics["global_step"] == 40 and exports[0]
    assert ledger_steps(model_dir) == [10, 20, 30, 40]
    assert _loss_points(os.path.join(model_dir, "eval")) == {10: 1, 20: 1, 30: 1, 40: 1}
    # A checkpoint whose evaluation never reached the event files is evaluated.
    open(path, "w").write("".join(lines[:3]))
    for event_file in glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
        os.remove(event_file)
    steps, *_ = evaluator(tmp_path, monkeypatch)
    assert steps == [40]
    # Nor one whose summaries a crash cut short: `loss` flushed, `mae` not (it
    # was recorded with its metrics missing: evaluator probe)
    open(path, "w").write("".join(lines[:3]))
    for event_file in glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
        os.remove(event_file)
    write_dict_to_summary(os.path.join(model_dir, "eval"), {"loss": 0.123}, 40)
    steps, metrics, _ = evaluator(tmp_path, monkeypatch)
    assert steps == [40] and "mae" in metrics and metrics["loss"] != pytest.approx(0.123)


def test_evaluator_passes_over_a_damaged_checkpoint_and_stops_on_a_damaged_final_one(
        tmp_path, monkeypatch, caplog):
    """It stopped on any damaged checkpoint (again on each restart); now a
    warning naming it. The final one damaged, nothing would be exported as
    final: an error saying what to do (TF's evaluator stops on it too)."""
    make(tmp_path, keep_checkpoint_max=None).train(input_fn, max_steps=40)
    for step in (20, 40):
        path = tmp_path / "m" / f"model.ckpt-{step}"
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 10)
    recorder = []
    with caplog.at_level("WARNING"):
        with pytest.raises(checkpoint.DataLossError, match=(
                f"^The final checkpoint {tmp_path}/m/model.ckpt-40 is damaged, so it is not "
                "evaluated or exported: .* Train again")):
            evaluator(tmp_path, monkeypatch, recorder=recorder)
    assert recorder == [10, 30]
    assert (f"Checkpoint {tmp_path}/m/model.ckpt-20 is not evaluated: Checkpoint "
            f"'{tmp_path}/m/model.ckpt-20' is damaged: its content does not match the "
            "digest") in caplog.text
    assert ledger_steps(str(tmp_path / "m")) == [10, 30]
    assert os.listdir(tmp_path / "m" / "eval" / training._PIN_DIR) == []   # links removed


@pytest.mark.parametrize("error", [FileNotFoundError("eval.csv"),
                                   checkpoint.DataLossError("eval.tfrecord: corrupted record")])
def test_an_evaluator_whose_input_fails_stops_on_it(tmp_path, monkeypatch, error):
    """A missing eval file or a damaged TFRecord read by input_fn was taken
    for a checkpoint deleted or damaged: every checkpoint skipped with a
    warning about the checkpoint, the evaluator ending with nothing."""
    make(tmp_path).train(input_fn, max_steps=20)

    def failing_input_fn():
        raise error
    with pytest.raises(type(error), match=str(error)):
        evaluator(tmp_path, monkeypatch, max_steps=20, eval_fn=failing_input_fn)
    assert ledger_steps(str(tmp_path / "m")) == []


def _loss_points(eval_dir):
    """{step: how many `loss` points the event files hold}."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    counts = {}
    for path in glob.glob(os.path.join(eval_dir, "events.out.tfevents.*")):
        for event in LegacyEventFileLoader(path).Load():
            if any(v.tag == "loss" for v in event.summary.value):
                counts[event.step] = counts.get(event.step, 0) + 1
    return counts


def _start_over(model_dir):
    """Delete model_dir's checkpoints and index, keeping eval/ (a user
    training again from scratch in the same model_dir)."""
    for name in os.listdir(model_dir):
        if name.startswith("model.ckpt-") or name == checkpoint.INDEX:
            os.remove(os.path.join(model_dir, name))


def test_training_started_over_is_evaluated_again_locally(tmp_path):
    """Checkpoints deleted, eval/ kept, trained again at another rate: no
    evaluation ran and the first run's metrics came back (read from the old
    event files at the same steps). TF evaluates each new checkpoint."""
    def run(lr):
        hook = _RecordSteps()
        e = est.Estimator(regression_model_fn, config=est.RunConfig(
            model_dir=str(tmp_path / "m"), save_checkpoints_steps=10), params={"lr": lr})
        metrics, _ = est.train_and_evaluate(e, est.TrainSpec(input_fn, 20), est.EvalSpec(
            eval_input_fn, steps=None, throttle_secs=0, hooks=[hook]))
        return hook.steps, metrics
    steps, first = run(0.1)
    assert steps == [10, 20]
    _start_over(str(tmp_path / "m"))
    steps, second = run(0.01)
    assert steps == [10, 20] and second["loss"] != first["loss"]
    assert isinstance(second["loss"], np.float32)
    assert _loss_points(str(tmp_path / "m" / "eval")) == {10: 2, 20: 2}


@pytest.mark.parametrize("policy, every, lr, evaluated", [
    ("every", 10, 0.01, [10, 20, 30, 40]), ("latest", 10, 0.01, [40]),
    ("every", 7, 0.01, [7, 14, 21, 28, 35, 40]),   # other steps: 10, 20, 30 no longer there
    ("every", 10, 0.1, [10, 20, 30, 40]),          # the same digests: saved again, evaluated
    ("every", 10, "old ledger", [10, 20, 30, 40])])   # lines of earlier versions: no digest
def test_an_evaluator_evaluates_training_started_over(tmp_path, monkeypatch, policy, every, lr,
                                                      evaluated):
    """The ledger of an earlier training (its checkpoints since deleted) made
    the evaluator skip the new checkpoints at its steps, and, with no
    checkpoint yet, stop at once (its last step at max_steps); with other
    checkpoint steps, those before the earlier training's last (an attack
    probe). An evaluation counts only for the checkpoint it saw (digest and
    file mtime), and while no checkpoint at or before its step was written
    after it."""
    make(tmp_path, keep_checkpoint_max=None, tf_random_seed=3).train(input_fn, max_steps=40)
    assert evaluator(tmp_path, monkeypatch, policy=policy)[0] == ([40] if policy == "latest"
                                                                  else [10, 20, 30, 40])
    model_dir = str(tmp_path / "m")
    if lr == "old ledger":
        path = os.path.join(model_dir, "eval", training.LEDGER)
        lines = [json.loads(line) for line in open(path)]
        with open(path, "w") as f:
            f.writelines(json.dumps({k: v for k, v in e.items() if k not in (
                "digest", "mtime_ns")}) + "\n" for e in lines)
        lr = 0.01
    _start_over(model_dir)

    def chief_trains(secs):   # the evaluator's first poll finds no checkpoint
        monkeypatch.setattr(training.time, "sleep", lambda secs: None)
        monkeypatch.delenv("TF_CONFIG")
        est.Estimator(regression_model_fn, config=est.RunConfig(
            model_dir=model_dir, save_checkpoints_steps=every, keep_checkpoint_max=None,
            tf_random_seed=3), params={"lr": lr}).train(input_fn, max_steps=40)
        set_cluster(monkeypatch, "evaluator")
    monkeypatch.setattr(training.time, "sleep", chief_trains)
    steps, metrics, _ = evaluator(tmp_path, monkeypatch, policy=policy)
    assert steps == evaluated and metrics["global_step"] == 40


def test_the_chief_keeps_the_checkpoints_of_training_started_over_unevaluated(
        tmp_path, monkeypatch):
    """An earlier training's ledger (steps 10..40) let the chief of one
    started over with checkpoints every 7 steps delete 7 and 14 unseen."""
    make(tmp_path, keep_checkpoint_max=None).train(input_fn, max_steps=40)
    evaluator(tmp_path, monkeypatch)
    _start_over(str(tmp_path / "m"))
    set_cluster(monkeypatch, "chief")
    est.train_and_evaluate(make(tmp_path, save_checkpoints_steps=7, keep_checkpoint_max=2),
                           est.TrainSpec(input_fn, 35),
                           est.EvalSpec(input_fn, checkpoint_policy="every"))
    kept = [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path / "m"))]
    assert kept == [7, 14, 21, 28, 35]


def test_evaluator_latest_policy_evaluates_the_newest_only(tmp_path, monkeypatch):
    make(tmp_path, keep_checkpoint_max=None).train(input_fn, max_steps=40)
    steps, metrics, _ = evaluator(tmp_path, monkeypatch, policy="latest")
    assert steps == [40] and metrics["global_step"] == 40


class _PreemptAt(hooks.SessionRunHook):
    def __init__(self, step):
        self._step = step

    def after_run(self, run_context, run_values):
        if run_context.session.global_step >= self._step:
            raise hooks.TrainingPreempted(self._step, "SIGTERM")


def test_an_evaluator_stops_when_a_preempted_chief_never_comes_back(tmp_path, monkeypatch):
    """A preempted chief removed its heartbeat as one that ended does: with
    no heartbeat the evaluator took the chief for one not started yet and
    waited for ever when the job was not restarted (chaos probe). The chief
    leaves it to go stale; the evaluator, its last checkpoint evaluated,
    stops after ESTIMATOR_CHIEF_TIMEOUT_SECS, saying why."""
    set_cluster(monkeypatch, "chief")
    with pytest.raises(hooks.TrainingPreempted):
        est.train_and_evaluate(make(tmp_path), est.TrainSpec(input_fn, 40, hooks=[_PreemptAt(15)]),
                               est.EvalSpec(eval_input_fn))
    assert os.path.exists(tmp_path / "m" / training.HEARTBEAT)
    monkeypatch.setenv("ESTIMATOR_CHIEF_TIMEOUT_SECS", "1")
    recorder = []
    with pytest.raises(training.TrainingFailedError, match="killed, or preempted and not "
                                                           "restarted"):
        evaluator(tmp_path, monkeypatch, recorder=recorder)
    assert recorder == [10]


def test_evaluator_stops_at_the_chief_s_final_step(tmp_path, monkeypatch):
    """Training ended before max_steps (input ran out, early stop): the
    completion marker names the final step; it is evaluated, then the
    evaluator stops (TF's would wait for max_steps for ever). Not exported as
    final: as TF's, FinalExporter exports only at max_steps."""
    make(tmp_path).train(input_fn, max_steps=25)
    training._write_json(str(tmp_path / "m" / training.COMPLETION_MARKER),
                         {"global_step": 25, "max_steps": 1000})
    steps, metrics, exports = evaluator(tmp_path, monkeypatch, max_steps=1000, policy="latest")
    assert steps == [25] and metrics["global_step"] == 25 and exports == [None]


def test_evaluator_early_stopping_writes_the_stop_marker(tmp_path, monkeypatch):
    make(tmp_path).train(input_fn, max_steps=20)
    model_dir = str(tmp_path / "m")
    training._write_json(os.path.join(model_dir, training.COMPLETION_MARKER),
                         {"global_step": 20, "max_steps": 1000})
    estimator_for_hook = make(tmp_path)
    hook = hooks.stop_if_lower_hook(estimator_for_hook, "loss", 1e9)
    evaluator(tmp_path, monkeypatch, max_steps=1000, policy="latest", train_hooks=[hook])
    marker = json.load(open(os.path.join(model_dir, training.STOP_MARKER)))
    assert marker["global_step"] == 20 and marker["max_steps"] == 1000


def test_the_ledger_writes_float32_metrics_in_their_shortest_digits(tmp_path):
    """As `estimator evaluate` prints them (0.85, not 0.8500000238418579)."""
    ledger = training._Ledger(str(tmp_path / "eval"))
    ledger.record(str(tmp_path / "model.ckpt-10"), {
        "loss": np.float32(0.85), "global_step": np.int64(10),
        "precision": np.array([0.25, 0.5], np.float32)}, {})
    assert ledger.entries()[0]["metrics"] == {"loss": 0.85, "global_step": 10,
                                              "precision": [0.25, 0.5]}
    with open(ledger.path) as f:
        assert '"loss": 0.85,' in f.read()


def test_a_full_disk_under_the_ledger_names_it(tmp_path, monkeypatch):
    """A ledger line that cannot be written for want of space names the
    ledger (before: the bare ENOSPC of a write naming no file)."""
    import errno
    ledger = training._Ledger(str(tmp_path / "eval"))
    ledger.record(str(tmp_path / "model.ckpt-10"), {"loss": 1.0}, {})

    class Full:   # the ledger file, on a full disk
        def __init__(self, *args):
            self._f = open(*args)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self._f, name)
    monkeypatch.setattr(training, "open", Full, raising=False)
    with pytest.raises(OSError, match=r"No space left on device: '\S*evaluated_checkpoints"
                                      r".jsonl'") as info:
        ledger.record(str(tmp_path / "model.ckpt-20"), {"loss": 0.5}, {})
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert set(ledger.evaluated()) == {10}


def test_chief_keeps_checkpoints_the_evaluator_has_not_seen(tmp_path, monkeypatch):
    set_cluster(monkeypatch, "chief")
    model_dir = str(tmp_path / "m")
    e = make(tmp_path, keep_checkpoint_max=2)
    e.train(input_fn, max_steps=10)
    ten = os.path.join(model_dir, "model.ckpt-10")
    training._Ledger(os.path.join(model_dir, "eval")).record(
        ten, {"loss": 1.0, "global_step": 10}, training._seen(ten))
    est.train_and_evaluate(e, est.TrainSpec(input_fn, 50),
                           est.EvalSpec(input_fn, checkpoint_policy="every"))
    kept = sorted(est.checkpoint.step_of(p) for p in est.checkpoint.all_checkpoints(model_dir))
    assert kept == [20, 30, 40, 50]   # 10 was evaluated; the rest are protected
    files = sorted(n for n in os.listdir(model_dir) if n.startswith("model.ckpt-")
                   and not n.endswith(est.checkpoint.DIGEST_SUFFIX))
    assert files == ["model.ckpt-20", "model.ckpt-30", "model.ckpt-40", "model.ckpt-50"]
    latest = make(tmp_path, "latest_policy", keep_checkpoint_max=2)
    est.train_and_evaluate(latest, est.TrainSpec(input_fn, 50), est.EvalSpec(input_fn))
    assert sorted(n for n in os.listdir(latest.model_dir) if n.startswith("model.ckpt-")
                  and not n.endswith(est.checkpoint.DIGEST_SUFFIX)) == [
        "model.ckpt-40", "model.ckpt-50"]


# -- real processes ----------------------------------------------------------------------
def start_task(tmp_path, task_type, args, cluster, name=None):
    env = dict(os.environ, TF_CONFIG=tf_config(cluster, task_type, 0), PYTHONUNBUFFERED="1",
               PYTHONFAULTHANDLER="1")   # a hung task killed by `finish` shows where it was
    log = open(tmp_path / f"{name or task_type}.log", "w")
    proc = subprocess.Popen([sys.executable, EXAMPLE, *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = str(tmp_path / f"{name or task_type}.log")
    return proc


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def finish(procs, timeout=120):
    """Wait for `procs` to exit 0 (each within `timeout`); one still running
    then gets SIGABRT (faulthandler prints its threads' stacks into its log,
    which the failure shows), then SIGKILL; none is left behind."""
    hung = []
    try:
        for proc in procs:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                hung.append(proc)
                os.killpg(proc.pid, signal.SIGABRT)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for proc in procs:
        assert proc.returncode == 0, ("still running after %d s, stopped: " % timeout
                                      if proc in hung else "") + open(proc.log_path).read()[-3000:]


def final_eval(proc) -> dict:
    lines = [line for line in open(proc.log_path) if line.startswith("FINAL_EVAL ")]
    assert lines, open(proc.log_path).read()[-3000:]
    return json.loads(lines[-1][len("FINAL_EVAL "):])


@pytest.mark.slow
def test_evaluator_started_first_and_faster_than_the_chief(tmp_path):
    model_dir = str(tmp_path / "job")
    cluster = {"chief": ["127.0.0.1:1"]}
    args = ["--model_dir", model_dir, "--max_steps", "80", "--save_checkpoints_steps", "20"]
    evaluator_proc = start_task(tmp_path, "evaluator", args, cluster)
    procs = [evaluator_proc]
    try:
        wait_for(lambda: "not trained yet" in open(evaluator_proc.log_path).read(), 60,
                 "the evaluator to poll an empty model_dir")
        written = [os.path.relpath(os.path.join(d, f), model_dir)
                   for d, _, files in os.walk(model_dir) for f in files]
        assert written == [os.path.join("eval", ".evaluation.lock")]   # only its lock
        procs.append(start_task(tmp_path, "chief", args + ["--step_sleep", "0.05"], cluster))
    finally:
        finish(procs)
    steps = ledger_steps(model_dir)
    assert steps[-1] == 80 and steps == sorted(set(steps)) and set(steps) <= {20, 40, 60, 80}
    assert len(steps) >= 2, steps   # it evaluated while the (slower) chief trained
    assert final_eval(evaluator_proc)["global_step"] == 80
    assert sorted(hooks.read_eval_metrics(os.path.join(model_dir, "eval"))) == steps


@pytest.mark.slow
def test_evaluator_restarted_mid_job_resumes_from_its_ledger(tmp_path):
    model_dir = str(tmp_path / "job")
    cluster = {"chief": ["127.0.0.1:1"]}
    args = ["--model_dir", model_dir, "--max_steps", "100", "--save_checkpoints_steps", "10",
            "--keep_checkpoint_max", "1", "--checkpoint_policy", "every"]
    chief = start_task(tmp_path, "chief", args + ["--step_sleep", "0.08"], cluster)
    first = start_task(tmp_path, "evaluator", args, cluster, name="evaluator1")
    procs = [chief, first]
    try:
        wait_for(lambda: len(ledger_steps(model_dir)) >= 1, 90, "a first evaluation")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        time.sleep(0.5)    # the chief saves more checkpoints meanwhile; none is lost
        second = start_task(tmp_path, "evaluator", args, cluster, name="evaluator2")
        procs = [chief, second]
    finally:
        finish(procs)
    assert ledger_steps(model_dir) == list(range(10, 101, 10))
    assert "Evaluator resuming" in open(second.log_path).read()
    assert final_eval(second)["global_step"] == 100


def test_the_example_program_in_local_mode(tmp_path, capsys):
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import train_and_evaluate as example
    finally:
        sys.path.remove(os.path.dirname(EXAMPLE))
    metrics, exports = example.main(["--model_dir", str(tmp_path / "ex"), "--max_steps", "40"])
    assert metrics["global_step"] == 40 and metrics["loss"] < 1e-3
    assert [os.path.basename(os.path.dirname(p)) for p in exports] == ["best", "latest", "final"]
    printed = json.loads(capsys.readouterr().out.split("FINAL_EVAL ", 1)[1])
    assert printed["global_step"] == 40


@pytest.mark.slow
def test_local_mode_under_mirrored_strategy_evaluates_on_the_chief_replica(tmp_path):
    """MirroredStrategy forks a process per device; the evaluation after each
    checkpoint runs on the chief's while the other replica waits."""
    import distribute
    e = est.Estimator(regression_model_fn, params={"lr": 0.1}, config=est.RunConfig(
        model_dir=str(tmp_path / "m"), save_checkpoints_steps=10,
        train_distribute=distribute.MirroredStrategy(["cpu:0", "cpu:1"])))
    metrics, exports = est.train_and_evaluate(
        e, est.TrainSpec(input_fn, max_steps=25),
        est.EvalSpec(eval_input_fn, steps=None, throttle_secs=0,
                     exporters=[est.FinalExporter("final", SERVING)]))
    assert metrics["global_step"] == 25 and exports[0] is not None
    assert ledger_steps(e.model_dir) == [10, 20, 25]


def test_worker_0_of_a_chief_less_cluster_is_the_chief(tmp_path, monkeypatch):
    set_cluster(monkeypatch, "worker", 0, {"worker": ["127.0.0.1:1"]})
    import distribute
    e = make(tmp_path, train_distribute=distribute.MultiWorkerMirroredStrategy())
    assert e.config.is_chief and e.config.task_type == "worker"
    est.train_and_evaluate(e, est.TrainSpec(input_fn, 10), est.EvalSpec(input_fn))
    marker = json.load(open(os.path.join(e.model_dir, training.COMPLETION_MARKER)))
    assert marker["global_step"] == 10   # it trained as the chief and said it finished


def test_an_evaluator_that_sees_no_chief_in_its_model_dir_says_so(tmp_path, monkeypatch, caplog):
    """A relative model_dir run from another working directory: the
    evaluator waited in silence for a chief that wrote elsewhere (YAML
    journey probe)."""
    set_cluster(monkeypatch, "evaluator")
    e = make(tmp_path)
    marker = os.path.join(e.model_dir, training.FAILURE_MARKER)
    began = time.time()
    clock = [began]

    def a_minute_passes(secs):   # (start_delay_secs too) then the chief fails
        clock[0] += 61
        if clock[0] > began + 150:
            training._write_json(marker, {"error": "boom", "max_steps": 40, "time": clock[0]})
    monkeypatch.setattr(training.time, "time", lambda: clock[0])
    monkeypatch.setattr(training.time, "sleep", a_minute_passes)
    caplog.set_level("WARNING", logger="estimator.training")
    with pytest.raises(training.TrainingFailedError, match="boom"):
        est.train_and_evaluate(e, est.TrainSpec(input_fn, 40), est.EvalSpec(eval_input_fn))
    assert caplog.text.count("No chief has trained in") == 1
    assert f"{os.path.abspath(e.model_dir)} after" in caplog.text
