"""What evaluate writes into its eval directories, against TF 2.15's recording
(tests/support/fixtures/record_tf_eval_dir.py): the metrics as scalars and the
evaluated checkpoint's path as a string tensor tagged `checkpoint_path`, at the
checkpoint's step (none for the initial model); and the log lines saying so."""
import glob
import itertools
import json
import logging
import os

import pytest
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.util import tensor_util

import estimator as est
from linear_port import BATCHES, model_fn
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_eval_dir.json"), encoding="utf-8") as _f:
    TF = json.load(_f)


def events(eval_dir, model_dir):
    """[step, tag, kind, value] of every summary value, as the recorder lists them."""
    out = []
    for path in sorted(glob.glob(os.path.join(eval_dir, "events.out.tfevents*"))):
        for event in LegacyEventFileLoader(path).Load():
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.append([int(event.step), value.tag, "simple", value.simple_value])
                else:
                    text = tensor_util.make_ndarray(value.tensor).item().decode()
                    out.append([int(event.step), value.tag, "string",
                                text.replace(model_dir, "MODEL_DIR")])
    return sorted(out)


def assert_events_are_tfs(ours, recorded):
    assert [e[:3] for e in ours] == [e[:3] for e in recorded]
    for mine, theirs in zip(ours, recorded):
        if mine[2] == "string":
            assert mine[3] == theirs[3]
        else:
            assert mine[3] == pytest.approx(theirs[3], rel=1e-5)


def test_eval_dirs_hold_the_metrics_and_the_checkpoint_path_as_tf(tmp_path, caplog):
    model_dir = str(tmp_path / "m")
    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=2, tf_random_seed=1))
    e.train(lambda: itertools.cycle(BATCHES), steps=4)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        e.evaluate(lambda: BATCHES)
    lines = [r.getMessage().replace(model_dir, "MODEL_DIR") for r in caplog.records
             if r.getMessage().startswith("Saving")]
    assert lines[1] == TF["latest_lines"][1]
    assert lines[0].split(":")[0] == TF["latest_lines"][0].split(":")[0]
    e.evaluate(lambda: BATCHES, checkpoint_path=os.path.join(model_dir, "model.ckpt-2"),
               name="old")
    assert_events_are_tfs(events(os.path.join(model_dir, "eval"), model_dir), TF["eval"])
    assert len(glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents*"))) == 1   # as TF
    assert_events_are_tfs(events(os.path.join(model_dir, "eval_old"), model_dir),
                          TF["eval_old"])
    fresh = str(tmp_path / "fresh")
    est.Estimator(model_fn, config=est.RunConfig(model_dir=fresh, tf_random_seed=1)).evaluate(
        lambda: BATCHES)
    assert_events_are_tfs(events(os.path.join(fresh, "eval"), fresh), TF["initial"])
    # what reads the eval dir (exporters, early stopping, the evaluator) sees the scalars only
    from hooks.event_files import read_scalars
    assert read_scalars(os.path.join(model_dir, "eval", "events.out.tfevents*")) == {
        4: {"loss": pytest.approx(TF["eval"][1][3]), "mae": pytest.approx(TF["eval"][2][3])}}


def test_the_evaluator_task_names_the_checkpoint_it_evaluated_not_its_link(tmp_path,
                                                                           monkeypatch):
    """The evaluator reads each checkpoint through a hard link that keeps it
    while the chief deletes it; its eval dir named that link."""
    from tf_cluster import tf_config
    model_dir = str(tmp_path / "m")
    config = dict(model_dir=model_dir, save_checkpoints_steps=2, tf_random_seed=1)
    est.Estimator(model_fn, config=est.RunConfig(**config)).train(
        lambda: itertools.cycle(BATCHES), steps=4)
    monkeypatch.setenv("TF_CONFIG", tf_config({"chief": ["127.0.0.1:1111"]}, "evaluator", 0))
    e = est.Estimator(model_fn, config=est.RunConfig(**config))
    est.train_and_evaluate(e, est.TrainSpec(lambda: BATCHES, max_steps=4), est.EvalSpec(
        lambda: BATCHES, steps=None, start_delay_secs=0, throttle_secs=0))
    assert_events_are_tfs(events(os.path.join(model_dir, "eval"), model_dir), TF["eval"])


def test_an_evaluation_of_no_batch_is_refused_where_tf_reports_zeros(tmp_path):
    """TF reports every metric at 0 over no batch (recorded): a loss of 0 a
    BestExporter exports as the best model, early stopping reads, and the
    eval dir keeps. A reused generator gives no batch from its second
    evaluation on: refused, saying why, the eval dir left as it was."""
    assert TF["empty_result"] == {"loss": 0.0, "mae": 0.0, "global_step": 4}
    model_dir = str(tmp_path / "m")
    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=2, tf_random_seed=1))
    e.train(lambda: itertools.cycle(BATCHES), steps=4)
    batches = iter(BATCHES)
    e.evaluate(lambda: batches)
    with pytest.raises(ValueError, match=r"gave no batch \(an iterator or generator an earlier "
                                         r"evaluation consumed\?.*TF reports every metric at 0"):
        e.evaluate(lambda: batches)
    assert_events_are_tfs(events(os.path.join(model_dir, "eval"), model_dir), TF["eval"])
