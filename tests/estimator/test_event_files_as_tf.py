"""How many event files a process leaves, against TF 2.15's recording
(tests/support/fixtures/record_tf_event_files.py): one per directory and
process, however many times it trains and evaluates there (TF1's
FileWriterCache). Before, every `train` call and every evaluation began a
file of its own: a local train_and_evaluate evaluating every 10 minutes
added ~144 files a day to eval/."""
import errno
import glob
import itertools
import json
import os
import shutil

import pytest
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

import distribute
import estimator as est
import hooks
from linear_port import BATCHES, model_fn
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_event_files.json"), encoding="utf-8") as _f:
    TF = json.load(_f)


def train_input_fn():
    return itertools.cycle(BATCHES)


def eval_input_fn():
    return BATCHES


def loss_steps(directory):
    steps = []
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents*"))):
        for event in LegacyEventFileLoader(path).Load():
            steps += [int(event.step) for v in event.summary.value if v.tag == "loss"]
    return sorted(steps)


def stage(model_dir):
    """The recorder's view of model_dir and its eval directory."""
    eval_dir = os.path.join(model_dir, "eval")
    return {"model_dir_files": len(glob.glob(os.path.join(model_dir, "events.out.tfevents*"))),
            "eval_files": len(glob.glob(os.path.join(eval_dir, "events.out.tfevents*"))),
            "train_loss_steps": loss_steps(model_dir), "eval_loss_steps": loss_steps(eval_dir)}


def config(model_dir, **kwargs):
    return est.RunConfig(model_dir=str(model_dir), save_checkpoints_steps=2,
                         save_summary_steps=1, tf_random_seed=1, **kwargs)


@pytest.fixture(autouse=True)
def _as_a_new_process():
    hooks.SummaryWriterCache.clear()   # (writers earlier tests left waiting)
    yield
    hooks.SummaryWriterCache.clear()


def test_one_process_writes_one_event_file_per_directory_as_tf(tmp_path):
    model_dir = tmp_path / "m"
    e = est.Estimator(model_fn, config=config(model_dir))
    for i in range(3):
        e.train(train_input_fn, steps=4)
        e.evaluate(eval_input_fn)
        assert stage(model_dir) == TF[f"cycle_{i + 1}"]   # complete once they return
    again = est.Estimator(model_fn, config=config(model_dir))
    again.train(train_input_fn, steps=4)
    again.evaluate(eval_input_fn)
    assert stage(model_dir) == TF["second_estimator"]

    tae_dir = tmp_path / "tae"
    est.train_and_evaluate(
        est.Estimator(model_fn, config=config(tae_dir)),
        est.TrainSpec(train_input_fn, max_steps=6),
        est.EvalSpec(eval_input_fn, steps=None, throttle_secs=0, start_delay_secs=0))
    assert stage(tae_dir) == TF["train_and_evaluate"]


def test_a_directory_removed_between_runs_gets_a_new_event_file(tmp_path):
    """TF's cached writer writes on into the removed file (nothing on disk,
    recorded as `after_rmtree`); here the next run starts a new file, as the
    next process would."""
    model_dir = tmp_path / "m"
    e = est.Estimator(model_fn, config=config(model_dir))
    e.train(train_input_fn, steps=4)
    e.evaluate(eval_input_fn)
    shutil.rmtree(model_dir)
    e.train(train_input_fn, steps=4)
    e.evaluate(eval_input_fn)
    assert TF["after_rmtree"]["model_dir_files"] == 0   # (TF's, for the record)
    assert stage(model_dir) == {"model_dir_files": 1, "eval_files": 1,
                                "train_loss_steps": [1, 2, 3, 4], "eval_loss_steps": [4]}


def test_writers_no_run_holds_are_kept_for_the_newest_directories_only(tmp_path, monkeypatch):
    monkeypatch.setattr(hooks.SummaryWriterCache, "_KEEP_IDLE", 2)
    for i in range(4):
        est.Estimator(model_fn, config=config(tmp_path / str(i))).train(train_input_fn, steps=2)
    kept = [os.path.basename(k) for k in hooks.SummaryWriterCache._writers]
    assert kept == ["2", "3"]
    for i in range(4):   # the closed ones complete, the kept ones flushed
        assert loss_steps(tmp_path / str(i)) == [1, 2]
    est.Estimator(model_fn, config=config(tmp_path / "0")).train(train_input_fn, steps=2)
    assert len(glob.glob(str(tmp_path / "0" / "events.out.tfevents*"))) == 2   # closed: a new one
    assert loss_steps(tmp_path / "0") == [1, 2, 3, 4]


# (tensorboard's writer thread reports its error itself, then keeps it for the next call)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_writer_broken_by_a_full_disk_is_not_kept_for_the_next_run(tmp_path, monkeypatch):
    from tensorboard.compat.tensorflow_stub.io import gfile
    real = gfile.LocalFileSystem._write

    def full(self, filename, content, mode):
        raise OSError(errno.ENOSPC, "No space left on device")
    model_dir = tmp_path / "m"
    e = est.Estimator(model_fn, config=config(model_dir))
    e.train(train_input_fn, steps=2)
    monkeypatch.setattr(gfile.LocalFileSystem, "_write", full)
    with pytest.raises(OSError, match="No space left on device writing the summaries"):
        e.train(train_input_fn, steps=70)   # (held scalars are handed over every 64)
    monkeypatch.setattr(gfile.LocalFileSystem, "_write", real)
    e.train(train_input_fn, steps=2)   # space again: a new file, written
    steps = loss_steps(model_dir)
    assert steps[:2] == [1, 2] and steps[-2:] == [e.get_variable_value("global_step") - 1,
                                                  e.get_variable_value("global_step")]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_replicas_forked_after_local_runs_write_their_own_event_files(tmp_path):
    """The parent's writer waits for its next run with a thread the forked
    replicas do not have: they must not write through it (their events would
    be lost, a flush would wait forever). And the parent's next run begins a
    file after theirs: TensorBoard reads files by name, and the replicas'
    SessionLog START (at step 3) dropped what the parent's reused file held
    past it (steps 5 and 6). Each file begins in a second after the newest
    there: names begin with it, and within one second a replica's pid (12552)
    sorted before its parent's (8572)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    model_dir = tmp_path / "m"
    est.Estimator(model_fn, config=config(model_dir)).train(train_input_fn, steps=2)
    mirrored = est.Estimator(model_fn, config=config(
        model_dir, train_distribute=distribute.MirroredStrategy(["cpu:0", "cpu:1"])))
    mirrored.train(train_input_fn, steps=2)
    est.Estimator(model_fn, config=config(model_dir)).train(train_input_fn, steps=2)
    assert loss_steps(model_dir) == [1, 2, 3, 4, 5, 6]
    assert len(glob.glob(str(model_dir / "events.out.tfevents*"))) == 3
    events = EventAccumulator(str(model_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5, 6]
