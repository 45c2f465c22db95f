"""Checkpoint files: atomic writes, retention, safe loading, kill -9 and resume."""
import errno
import json
import os
import pickle
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import estimator as est
import hooks
from estimator import checkpoint
from estimator.experiment import cli
from hooks import files as checkpoint_files
from models import regression_input_fn, regression_model_fn
from paths import FIXTURES, ROOT, SUPPORT


def train(model_dir, steps, **config):
    e = est.Estimator(regression_model_fn, config=est.RunConfig(model_dir=str(model_dir),
                                                                **config), params={"lr": 0.1})
    e.train(regression_input_fn(), steps=steps)
    return e


def test_files_and_index(tmp_path):
    train(tmp_path, 12, save_checkpoints_steps=5)
    files = sorted(f for f in os.listdir(tmp_path) if not f.startswith("events."))
    assert files == ["checkpoint", "model.ckpt-10", "model.ckpt-10.crc32c", "model.ckpt-12",
                     "model.ckpt-12.crc32c", "model.ckpt-5", "model.ckpt-5.crc32c"]
    index = (tmp_path / "checkpoint").read_text()
    assert index.startswith('model_checkpoint_path: "model.ckpt-12"')
    assert checkpoint.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-12")
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path))] == \
        [5, 10, 12]


def test_keep_checkpoint_max(tmp_path):
    train(tmp_path, 30, save_checkpoints_steps=5, keep_checkpoint_max=2)
    files = sorted(f for f in os.listdir(tmp_path) if f.startswith("model.ckpt-"))
    assert files == ["model.ckpt-25", "model.ckpt-25.crc32c", "model.ckpt-30",
                     "model.ckpt-30.crc32c"]   # the evicted ones' digests go with them
    ckpts = files[::2]
    assert [os.path.basename(p) for p in checkpoint.all_checkpoints(str(tmp_path))] == ckpts


def test_keep_checkpoint_every_n_hours_preserves_old_ones(tmp_path, monkeypatch):
    """As TF's Saver (its _MaybeDeleteOldCheckpoints): one kept by the hours
    leaves the index's list and stays on disk for good (before, it stayed
    listed, was judged again at the next save against the moved mark, and
    deleted)."""
    now = [0.0]
    monkeypatch.setattr(time, "time", lambda: now[0])   # (the Saver's clock)
    saver = checkpoint.Saver(str(tmp_path), max_to_keep=1, keep_checkpoint_every_n_hours=1)
    for step, at in enumerate([0, 4000, 4001, 4002, 8000, 8001, 8002], 1):
        now[0] = at
        saver.save({"modules": {}, "optimizers": {}, "global_step": step}, step)
    on_disk = sorted(checkpoint.step_of(p) for p in checkpoint.checkpoints_on_disk(str(tmp_path)))
    # 1 within the Saver's first hour; 2 past it (the mark moves to 7200), 5
    # past that (to 10800); the others were not past the mark when evicted
    assert on_disk == [2, 5, 7]
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path))] == [7]
    plain = checkpoint.Saver(str(tmp_path / "p"), max_to_keep=1)
    for step in range(1, 5):
        plain.save({"modules": {}, "optimizers": {}, "global_step": step}, step)
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path / "p"))] == [4]


def test_half_written_temp_files_are_ignored_then_removed(tmp_path):
    e = train(tmp_path, 5, save_checkpoints_steps=100)
    stale = ["model.ckpt-9.tmp-abc123", "model.ckpt-9.crc32c.tmp-x1", "checkpoint.tmp-zz",
             "model.ckpt-8.sha256.tmp-x2"]   # (an earlier version's digest file)
    (tmp_path / stale[0]).write_bytes(b"\x80\x02garbage")
    (tmp_path / stale[1]).write_text("0" * 8)
    (tmp_path / stale[2]).write_text('model_checkpoint_path: "model.ckpt-9"\n')
    (tmp_path / stale[3]).write_text("0" * 64)
    (tmp_path / "notes.tmp-keep").write_text("not ours")
    assert e.latest_checkpoint().endswith("model.ckpt-5")
    e.train(regression_input_fn(), steps=2)
    assert e.latest_checkpoint().endswith("model.ckpt-7")
    assert not any((tmp_path / n).exists() for n in stale)   # the chief's Saver removed them
    assert (tmp_path / "notes.tmp-keep").exists()


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    e = train(tmp_path, 3, save_checkpoints_steps=100)
    path = e.latest_checkpoint()
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(checkpoint.DataLossError, match="is damaged: its content does not match"):
        e.evaluate(regression_input_fn(repeat=False), checkpoint_path=path)
    os.remove(path + checkpoint.DIGEST_SUFFIX)   # a file without a digest (older saves)
    with pytest.raises(checkpoint.DataLossError,
                       match="cannot be read: it is truncated, damaged") as info:
        e.evaluate(regression_input_fn(repeat=False), checkpoint_path=path)
    assert "weights_only" not in str(info.value)   # never advise loading unsafely


def test_a_checkpoint_without_its_digest_loads_and_says_it_is_unchecked(tmp_path, caplog):
    """Copied without it, or the digest deleted: it loaded without a word."""
    e = train(tmp_path, 3, save_checkpoints_steps=100)
    path = e.latest_checkpoint()
    os.remove(path + checkpoint.DIGEST_SUFFIX)
    caplog.clear()
    with caplog.at_level("WARNING"):
        for _ in range(2):
            assert checkpoint.load(path)["global_step"] == 3
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"Checkpoint {path} has no digest beside it (model.ckpt-3.crc32c): its content is "
        "loaded unchecked"]   # once a file


def test_checkpoint_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))
    path = tmp_path / "model.ckpt-1"
    path.write_bytes(pickle.dumps({"global_step": 1, "x": Evil()}, protocol=2))
    with pytest.raises(ValueError, match="cannot be read") as info:
        checkpoint.load(str(path))
    assert not (tmp_path / "pwned").exists()
    assert "weights_only" not in str(info.value)


class Vocab:
    """A user's object kept in a module's extra state (not a tensor)."""

    def __init__(self, words):
        self.words = words


class _WithVocab(torch.nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)
        self.extra = extra

    def forward(self, x):
        return self.linear(x)

    def get_extra_state(self):
        return self.extra

    def set_extra_state(self, extra):   # (a plain one read back as the user's object)
        self.extra = (Vocab(extra["words"]) if isinstance(self.extra, Vocab)
                      and isinstance(extra, dict) else extra)


def _vocab_estimator(model_dir, extra, **config):
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: _WithVocab(extra))
        loss = torch.nn.functional.mse_loss(net(torch.as_tensor(features["x"])), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)), eval_metric_ops={})
    return est.Estimator(model_fn, config=est.RunConfig(model_dir=str(model_dir), **config))


@pytest.mark.parametrize("background", [False, True])
def test_a_state_holding_objects_a_checkpoint_cannot_load_is_refused_at_the_first_save(
        tmp_path, background):
    """A module's get_extra_state returning a user's object: every save was
    written and every restore failed, passed over as damaged, so each run
    started again from step 0 with only a warning."""
    model_dir = tmp_path / "m"
    config = {"experimental_async_checkpoint": background}
    e = _vocab_estimator(model_dir, {"words": ["a", "b"]}, **config)   # plain values: saved
    e.train(regression_input_fn(), steps=3)
    kept = open(e.latest_checkpoint(), "rb").read()
    e = _vocab_estimator(model_dir, Vocab(["a", "b"]), **config)
    with pytest.raises(checkpoint.UnsafeCheckpointError) as info:
        e.train(regression_input_fn(), steps=3)
    name = f"{Vocab.__module__}.Vocab"
    assert str(info.value).startswith(
        f"The checkpoint of step 6 is not saved: it would hold Python objects of {name} (at "
        "['modules']['net']['_extra_state'], a module's get_extra_state()), which a checkpoint "
        "loads only when allowed")
    assert f"torch.serialization.add_safe_globals([{name}])" in str(info.value)
    assert e.latest_checkpoint().endswith("model.ckpt-3")
    assert open(e.latest_checkpoint(), "rb").read() == kept
    assert sorted(n for n in os.listdir(model_dir) if "ckpt" in n) == [
        "model.ckpt-3", "model.ckpt-3.crc32c"]   # no temp file left


def test_a_checkpoint_holding_objects_not_allowed_is_an_error_not_a_restart(tmp_path, capsys):
    """Written where the class was allowed, read where it is not: training
    restarted from step 0 and its next save replaced the checkpoint."""
    e = _vocab_estimator(tmp_path, Vocab(["a", "b"]))
    with torch.serialization.safe_globals([Vocab]):
        e.train(regression_input_fn(), steps=3)
    path = e.latest_checkpoint()
    written = open(path, "rb").read()
    name = f"{Vocab.__module__}.Vocab"
    for call in (lambda: e.train(regression_input_fn(), steps=3),
                 lambda: e.evaluate(regression_input_fn(repeat=False), steps=1),
                 lambda: checkpoint.load(path)):
        with pytest.raises(checkpoint.UnsafeCheckpointError) as info:
            call()
        assert str(info.value).startswith(
            f"Checkpoint {path!r} holds Python objects of {name}, which a checkpoint loads "
            "only when allowed")
        assert "not damaged and is left as it is" in str(info.value)
        assert "weights_only=False" not in str(info.value)
    assert e.latest_checkpoint() == path and open(path, "rb").read() == written
    assert cli.main(["inspect", str(tmp_path)]) == 0   # (it stopped with a traceback)
    assert (f"  NOT READ: Checkpoint {path!r} holds Python objects of {name}, which"
            in capsys.readouterr().out)
    with torch.serialization.safe_globals([Vocab]):   # allowed again: it resumes
        e.train(regression_input_fn(), steps=3)
        assert checkpoint.load(e.latest_checkpoint())["global_step"] == 6


def test_a_class_torchs_scanner_misses_is_refused_at_save_and_not_read_as_damage(tmp_path):
    """A numpy array in the state with the classes the error named allowed
    (ndarray, dtype, _reconstruct): torch's scanner then found nothing, the
    save passed, and the load, refused on numpy's Float32DType, was taken
    for damage: training restarted from step 0."""
    core = np._core if hasattr(np, "_core") else np.core   # (numpy 2 renamed it)
    array_classes = [np.ndarray, np.dtype, core.multiarray._reconstruct]
    e = _vocab_estimator(tmp_path, np.zeros(2, np.float32))
    with torch.serialization.safe_globals(array_classes):
        with pytest.raises(checkpoint.UnsafeCheckpointError,
                           match=r"The checkpoint of step 3 is not saved: it would hold Python "
                                 r"objects of numpy.dtypes.Float32DType, which"):
            e.train(regression_input_fn(), steps=3)
    assert e.latest_checkpoint() is None
    with torch.serialization.safe_globals(array_classes + [type(np.dtype(np.float32))]):
        e.train(regression_input_fn(), steps=3)
    path = e.latest_checkpoint()
    with torch.serialization.safe_globals(array_classes):
        with pytest.raises(checkpoint.UnsafeCheckpointError,
                           match=rf"Checkpoint {re.escape(repr(path))} holds Python objects of "
                                 r"numpy.dtypes.Float32DType, which"):
            e.train(regression_input_fn(), steps=3)
    assert e.latest_checkpoint() == path


def _resumed_step(model_dir):
    """The global step a new training in `model_dir` starts from."""
    seen = []

    def model_fn(features, labels, mode, params):
        seen.append(est.get_global_step())
        return regression_model_fn(features, labels, mode, params)
    est.Estimator(model_fn, config=est.RunConfig(model_dir=str(model_dir),
                                                 save_checkpoints_steps=100),
                  params={"lr": 0.1}).train(regression_input_fn(), steps=1)
    return seen[0]


def _flip_a_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage, warning", [
    ("index deleted", "index .* is missing; using the checkpoint files"),
    ("index empty", "index .* names no checkpoint; using the checkpoint files"),
    ("index garbage", "index .* cannot be read"),
    ("index lies", "names 'model.ckpt-99', which does not exist"),
    ("latest deleted", "names 'model.ckpt-12', which does not exist; using .*model.ckpt-10"),
    ("latest byte flipped", "model.ckpt-12' is damaged: its content does not match the digest"
                            ".*; falling back to model.ckpt-10"),
    ("latest truncated", "model.ckpt-12' is damaged.*falling back to model.ckpt-10"),
    ("latest digest changed", "model.ckpt-12' is damaged.*falling back to model.ckpt-10"),
])
def test_a_damaged_index_or_checkpoint_falls_back_to_the_newest_good_one(tmp_path, caplog,
                                                                          damage, warning):
    train(tmp_path, 12, save_checkpoints_steps=5)        # 5, 10, 12
    latest = tmp_path / "model.ckpt-12"
    index = tmp_path / "checkpoint"
    if damage == "index deleted":
        index.unlink()
    elif damage == "index empty":
        index.write_text("")
    elif damage == "index garbage":
        index.write_bytes(b"\xff\xfe garbage: here\n")
    elif damage == "index lies":
        index.write_text('model_checkpoint_path: "model.ckpt-99"\n'
                         'all_model_checkpoint_paths: "model.ckpt-99"\n')
    elif damage == "latest deleted":
        latest.unlink()
    elif damage == "latest byte flipped":
        _flip_a_byte(latest)
    elif damage == "latest truncated":
        with open(latest, "r+b") as f:
            f.truncate(os.path.getsize(latest) - 10)
    elif damage == "latest digest changed":
        digest = tmp_path / "model.ckpt-12.crc32c"
        digest.write_text("%08x" % (int(digest.read_text(), 16) ^ 1))
    caplog.clear()
    with caplog.at_level("WARNING"):
        step = _resumed_step(tmp_path)
    index_only = damage.startswith("index")
    assert step == (12 if index_only else 10)
    assert any(__import__("re").search(warning, r.getMessage()) for r in caplog.records), \
        caplog.text


def test_an_index_naming_only_deleted_checkpoints_says_training_starts_over(tmp_path, caplog):
    """Every checkpoint file deleted, the index left: training started from
    step 0 without a word (fault probe; TF: "Couldn't match files for
    checkpoint"); with the latest alone deleted it was said."""
    train(tmp_path, 12, save_checkpoints_steps=5)
    for path in tmp_path.glob("model.ckpt-*"):
        path.unlink()
    with caplog.at_level("WARNING"):
        assert _resumed_step(tmp_path) == 0
    assert ("names 'model.ckpt-12', which does not exist, and " + str(tmp_path) +
            " holds no checkpoint file: training starts from step 0") in caplog.text
    caplog.clear()
    fresh = tmp_path / "fresh"
    with caplog.at_level("WARNING"):   # (a model_dir without an index: nothing to say)
        assert _resumed_step(fresh) == 0
    assert "holds no checkpoint file" not in caplog.text
    tf_dir = tmp_path / "tf"   # (TF's own checkpoint: another error says so, not this)
    shutil.copytree(os.path.join(FIXTURES, "tf_ckpt", "dnn"), tf_dir)
    with caplog.at_level("WARNING"), pytest.raises(ValueError, match="TensorFlow"):
        _resumed_step(tf_dir)
    assert "holds no checkpoint file" not in caplog.text


def test_a_damaged_checkpoint_at_max_steps_is_trained_again(tmp_path, caplog):
    """train(max_steps=30) over a damaged model.ckpt-30 said "Skipping training
    since max_steps has already saved" and returned: the model stayed at step
    20 (chaos probe). It trains from 20 again, with the warning, and saves 30
    at its end (the saver took the damaged 30 for saved)."""
    def train_to(max_steps, every):
        est.Estimator(regression_model_fn, config=est.RunConfig(
            model_dir=str(tmp_path), save_checkpoints_steps=every), params={"lr": 0.1}
        ).train(regression_input_fn(), max_steps=max_steps)
    train_to(30, 10)
    _flip_a_byte(tmp_path / "model.ckpt-30")
    with caplog.at_level("WARNING"):
        train_to(30, 100)
    assert "model.ckpt-30' is damaged" in caplog.text and "falling back to model.ckpt-20" \
        in caplog.text
    assert checkpoint.load(str(tmp_path / "model.ckpt-30"))["global_step"] == 30   # (good)
    caplog.clear()
    with caplog.at_level("INFO"):
        train_to(30, 100)
    assert "Skipping training since max_steps has already saved" in caplog.text


def test_an_index_rolled_back_by_hand_is_followed_and_said(tmp_path, caplog):
    """An index whose latest is older than checkpoints it lists (TF's way to
    roll a run back, by editing it): restored from, as TF, with a warning
    that the newer ones will be replaced (it was silent; chaos probe)."""
    train(tmp_path, 30, save_checkpoints_steps=10)
    index = tmp_path / "checkpoint"
    index.write_text(index.read_text().replace('model_checkpoint_path: "model.ckpt-30"',
                                               'model_checkpoint_path: "model.ckpt-10"'))
    with caplog.at_level("WARNING"):
        assert _resumed_step(tmp_path) == 10
    assert "names model.ckpt-10 as the latest, while it lists the newer model.ckpt-20, " \
        "model.ckpt-30: restoring from model.ckpt-10, as TF does" in caplog.text, caplog.text


@pytest.mark.parametrize("copied, relative", [(True, False), (False, False), (False, True)])
def test_an_index_naming_another_model_dir_never_deletes_its_checkpoints(
        tmp_path, caplog, copied, relative):
    """TF writes absolute paths in the index, and a model_dir copied (or one
    given another's index) keeps them: training there evicted (deleted) the
    other model_dir's listed checkpoints (chaos probe). A copy resumes from
    its own files; without them it restores the other's, saying so, and
    lists and evicts only its own."""
    a, b = tmp_path / "a", tmp_path / "b"
    train(a, 30, save_checkpoints_steps=10, keep_checkpoint_max=3)   # 10, 20, 30
    before = sorted(os.listdir(a))
    b.mkdir()
    if copied:
        for name in before:
            if name.startswith("model.ckpt-"):
                (b / name).write_bytes((a / name).read_bytes())
    (b / "checkpoint").write_text((a / "checkpoint").read_text().replace(   # (relative:
        '"model.ckpt', f'"{"../a" if relative else a}/model.ckpt'))   # TF's relpath, too)
    with caplog.at_level("WARNING"):
        train(b, 20, save_checkpoints_steps=10, keep_checkpoint_max=3)   # from 30: 40, 50
    assert ("outside" in caplog.text) != copied, caplog.text
    assert sorted(os.listdir(a)) == before   # (and a's index still lists them all)
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(a))] == [10, 20, 30]
    assert checkpoint.all_checkpoints(str(b)) == [
        str(b / f"model.ckpt-{step}") for step in ((30, 40, 50) if copied else (40, 50))]


def test_a_damaged_checkpoint_passed_over_does_not_evict_a_good_one(tmp_path):
    """keep_checkpoint_max=2 over [4, 6] with 6 damaged: the restart restores
    4 and saves 5, unlisting and deleting 6; the damaged 6 used to stay listed
    and the good 4 was deleted, leaving one good checkpoint."""
    train(tmp_path, 6, save_checkpoints_steps=2, keep_checkpoint_max=2)
    assert checkpoint.all_checkpoints(str(tmp_path)) == [
        str(tmp_path / "model.ckpt-4"), str(tmp_path / "model.ckpt-6")]
    with open(tmp_path / "model.ckpt-6", "r+b") as f:
        f.truncate(100)
    train(tmp_path, 1, save_checkpoints_steps=2, keep_checkpoint_max=2)   # from 4 to 5
    assert checkpoint.all_checkpoints(str(tmp_path)) == [
        str(tmp_path / "model.ckpt-4"), str(tmp_path / "model.ckpt-5")]
    for path in checkpoint.all_checkpoints(str(tmp_path)):
        checkpoint.load(path)   # both good
    assert not (tmp_path / "model.ckpt-6").exists()
    assert not (tmp_path / "model.ckpt-6.crc32c").exists()
    assert _resumed_step(tmp_path) == 5


@pytest.mark.parametrize("right", [True, False])
def test_an_earlier_version_s_sha256_digest_is_still_checked(tmp_path, caplog, right):
    """Checkpoints written before the digest became CRC-32C carry
    `model.ckpt-N.sha256`: a matching one restores, a mismatch falls back;
    their retention removes those files too."""
    import hashlib
    train(tmp_path, 12, save_checkpoints_steps=5)        # 5, 10, 12
    for step in (5, 10, 12):
        path = tmp_path / f"model.ckpt-{step}"
        (tmp_path / f"model.ckpt-{step}.crc32c").unlink()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        (tmp_path / f"model.ckpt-{step}.sha256").write_text(
            digest if right or step != 12 else "0" * 64)
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert _resumed_step(tmp_path) == (12 if right else 10)
    assert right == ("is damaged" not in caplog.text), caplog.text
    train(tmp_path, 25, save_checkpoints_steps=5, keep_checkpoint_max=2)
    assert not list(tmp_path.glob("*.sha256"))


def test_no_good_checkpoint_starts_from_step_0_and_says_so(tmp_path, caplog):
    train(tmp_path, 5, save_checkpoints_steps=5, keep_checkpoint_max=1)
    _flip_a_byte(tmp_path / "model.ckpt-5")
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert _resumed_step(tmp_path) == 0
    assert "no older checkpoint is left" in caplog.text
    assert "No good checkpoint in" in caplog.text and "starts from step 0" in caplog.text


def test_the_index_is_durable_before_an_evicted_checkpoint_is_deleted(tmp_path, monkeypatch):
    """A crash between the index and the deletion leaves an extra file, never
    an index naming a deleted one (keep_checkpoint_max=1 used to lose both)."""
    saver = checkpoint.Saver(str(tmp_path), max_to_keep=1)
    saver.save({"modules": {}, "optimizers": {}, "global_step": 1}, 1)
    order = []
    real_remove, real_replace, real_fsync = os.remove, os.replace, os.fsync
    monkeypatch.setattr(os, "remove", lambda p: (order.append(("remove", os.path.basename(p))),
                                                 real_remove(p)))
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append(("rename", os.path.basename(b))),
                                                     real_replace(a, b)))
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append(("fsync",)), real_fsync(fd)))
    saver.save({"modules": {}, "optimizers": {}, "global_step": 2}, 2)
    assert order == [("fsync",), ("rename", "model.ckpt-2.crc32c"),
                     ("fsync",), ("rename", "model.ckpt-2"),
                     ("fsync",), ("rename", "checkpoint"), ("fsync",),   # the directory's
                     ("remove", "model.ckpt-1"), ("remove", "model.ckpt-1.crc32c"),
                     ("remove", "model.ckpt-1.sha256")]   # (an earlier version's digest: none)


def _writes_failing_at(monkeypatch, nth: int, error: OSError) -> list:
    """os.write (how checkpoint files are written) raises `error` at its `nth`
    call (from 1); returns the sizes of the writes tried."""
    real_write, sizes = os.write, []

    def write(fd, data):
        sizes.append(len(data))
        if len(sizes) == nth:
            raise error
        return real_write(fd, data)
    monkeypatch.setattr(os, "write", write)
    return sizes


def _writes_failing_to(monkeypatch, marker: str, error: OSError, when=lambda: True) -> None:
    """os.write raises `error` writing to a file whose name holds `marker`
    while `when()`; patched before a background Saver's first save, in its
    writer process too (a fork)."""
    real_write = os.write

    def write(fd, data):
        try:
            target = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            target = ""
        if marker in target and when():
            raise error
        return real_write(fd, data)
    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("background", [False, True])
def test_disk_full_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch,
                                                                    background):
    # (in the background, save 2's tensors are staged and written by the
    # writer process: the fault is set before it is forked, at save 1)
    _writes_failing_to(monkeypatch, "model.ckpt-2.tmp-",
                       OSError(errno.ENOSPC, "No space left on device"))
    saver = checkpoint.Saver(str(tmp_path), max_to_keep=5, background=background)
    saver.save({"modules": {}, "optimizers": {}, "global_step": 1}, 1)
    saver.wait()
    # (before: "...; the previous checkpoint is unchanged: '.../model.ckpt-2'",
    # the failed save named as the one kept)
    with pytest.raises(OSError, match=r"No space left on device writing the checkpoint "
                                      r"\S*model.ckpt-2\S*; the latest checkpoint, "
                                      r"\S*model.ckpt-1, is unchanged$") as info:
        saver.save({"modules": {}, "optimizers": {}, "global_step": 2}, 2)
        saver.wait()
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    saver.close()
    assert checkpoint.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-1")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "model.ckpt-1", "model.ckpt-1.crc32c"]


@pytest.mark.parametrize("code", [errno.EFBIG, errno.EPERM])
def test_another_write_error_says_what_is_kept_too(tmp_path, monkeypatch, code):
    """A file size limit, a file system refusing (fault probe): the error
    named the file but not that the latest checkpoint is unchanged."""
    saver = checkpoint.Saver(str(tmp_path), max_to_keep=5)
    saver.save({"modules": {}, "optimizers": {}, "global_step": 1}, 1)
    _writes_failing_at(monkeypatch, 1, OSError(code, os.strerror(code)))
    with pytest.raises(OSError, match=rf"{os.strerror(code)} writing the checkpoint "
                                      r"\S*model.ckpt-2\S*; the latest checkpoint, "
                                      r"\S*model.ckpt-1, is unchanged$") as info:
        saver.save({"modules": {}, "optimizers": {}, "global_step": 2}, 2)
    assert info.value.errno == code
    monkeypatch.undo()
    saver.close()
    assert checkpoint.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-1")


@pytest.mark.parametrize("background", [False, True])
def test_a_save_whose_index_write_fails_leaves_no_unlisted_checkpoint(tmp_path, monkeypatch,
                                                                      background):
    """The disk filled at the index, after the checkpoint was renamed into
    place: model.ckpt-2 stayed on disk unlisted, never read nor deleted,
    holding its size on the full disk. (The writer process, a fork, has the
    fault from before save 1, set off after it.)"""
    full = tmp_path / "full"
    if background:
        _writes_failing_to(monkeypatch, "checkpoint.tmp-",
                           OSError(errno.ENOSPC, "No space left on device"), when=full.exists)
    saver = checkpoint.Saver(str(tmp_path / "m"), max_to_keep=5, background=background)
    saver.save(_state(1.0, 1), 1)
    saver.wait()
    full.touch()
    if not background:
        real = checkpoint_files.atomic_write_bytes

        def write(path, data, sync_dir=True):
            if os.path.basename(path) == "checkpoint":
                raise OSError(errno.ENOSPC, "No space left on device", path)
            return real(path, data, sync_dir)
        monkeypatch.setattr(checkpoint_files, "atomic_write_bytes", write)
    with pytest.raises(OSError, match=r"No space left on device writing the checkpoint "
                                      r"\S*/checkpoint \(\d+ bytes\); "):
        saver.save(_state(2.0, 2), 2)
        saver.wait()
    monkeypatch.undo()
    saver.close()
    model_dir = str(tmp_path / "m")
    assert sorted(os.listdir(model_dir)) == ["checkpoint", "model.ckpt-1", "model.ckpt-1.crc32c"]
    saver = checkpoint.Saver(model_dir, max_to_keep=5, background=background)
    saver.save(_state(3.0, 3), 3)
    saver.close()
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(model_dir)] == [1, 3]


@pytest.mark.parametrize("background", [False, True])
def test_a_model_dir_removed_while_training_fails_the_next_save(tmp_path, background):
    """As TF's Saver: the next save fails naming model_dir (before: it made the
    directory again, holding only the newer checkpoints under an index naming
    gone ones, or failed naming the temp file of the save in flight)."""
    import shutil
    model_dir = str(tmp_path / "m")
    saver = checkpoint.Saver(model_dir, background=background)
    saver.save({"modules": {}, "optimizers": {}, "global_step": 1}, 1)
    shutil.rmtree(model_dir)
    with pytest.raises(FileNotFoundError, match=rf"model_dir {model_dir} no longer exists "
                                                r"\(removed while training\?\): the "
                                                r"checkpoint of step 2 was not saved"):
        saver.save({"modules": {}, "optimizers": {}, "global_step": 2}, 2)
    saver.close()
    assert not os.path.exists(model_dir)


def test_large_files_are_written_whole_in_pieces_or_not_at_all(tmp_path, monkeypatch):
    """atomic_write_bytes cuts its writes to 1 MiB: the bytes arrive whole and in
    order; a failure at the second piece leaves the old file and no temp file."""
    from hooks import files
    path = str(tmp_path / "blob")
    data = os.urandom(2 * files._CHUNK + 12345)
    files.atomic_write_bytes(path, data)
    assert open(path, "rb").read() == data
    pieces = _writes_failing_at(monkeypatch, 2, OSError(errno.EIO, "Input/output error"))
    with pytest.raises(OSError, match="Input/output error"):
        files.atomic_write_bytes(path, os.urandom(3 * files._CHUNK))
    monkeypatch.undo()
    assert pieces == [files._CHUNK] * 2
    assert os.listdir(tmp_path) == ["blob"] and open(path, "rb").read() == data


def test_a_checkpoint_of_several_mebibytes_restores_exactly(tmp_path):
    saver = checkpoint.Saver(str(tmp_path))
    weight = torch.randn(1024, 700)   # 2.8 MB: three pieces
    saver.save({"modules": {"net": {"w": weight}}, "optimizers": {}, "global_step": 3}, 3)
    path, state = checkpoint.restore_latest(str(tmp_path))
    assert path.endswith("model.ckpt-3") and torch.equal(state["modules"]["net"]["w"], weight)


@pytest.mark.parametrize("background", [False, True])
def test_a_save_streams_the_checkpoint_to_its_file_without_a_copy_in_memory(
        tmp_path, monkeypatch, background):
    """torch.save writes straight into the temp file: a 16 MB model's save
    allocates no 16 MB buffer (it held one, the size of the checkpoint);
    small records are gathered, big ones cut to 1 MiB pieces; the digest,
    computed on the way, matches the file."""
    import tracemalloc
    from hooks import files
    big = torch.randn(4 * 1024 * 1024)   # 16 MiB
    small = {f"layer{i}.bias": torch.full((3,), float(i)) for i in range(40)}
    state = {"modules": {"net": dict(small, weight=big)}, "optimizers": {}, "global_step": 7}
    model_dir, log = str(tmp_path / "m"), str(tmp_path / "writes")
    real_write = os.write

    def write(fd, data):   # (patched before the writer process, a fork, starts: there too)
        try:
            target = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            target = ""
        if target.startswith("model.ckpt-7.tmp-"):
            with open(log, "a") as f:
                f.write(f"{len(data)}\n")
        return real_write(fd, data)
    monkeypatch.setattr(os, "write", write)
    saver = checkpoint.Saver(model_dir, background=background)
    saver.save(state, 6)   # (the writer process, if any, is started before measuring)
    saver.wait()
    tracemalloc.start()
    try:
        saver.save(state, 7)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    saver.close()
    monkeypatch.undo()
    assert peak < 4 * 1024 * 1024, peak
    with open(log) as f:
        sizes = [int(line) for line in f]
    assert max(sizes) == files._CHUNK and len(sizes) < 25, sizes   # 16 pieces, not ~600 writes
    path, restored = checkpoint.restore_latest(model_dir)   # the digest is checked
    assert path.endswith("model.ckpt-7")
    assert torch.equal(restored["modules"]["net"]["weight"], big)
    assert torch.equal(restored["modules"]["net"]["layer39.bias"], small["layer39.bias"])


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_checkpoint_files_follow_the_umask(tmp_path, umask, mode):
    from hooks import files
    old = os.umask(umask)
    try:
        files.atomic_write(str(tmp_path / "f"), lambda f: f.write(b"x"))
        files.atomic_write_bytes(str(tmp_path / "g"), b"y")
    finally:
        os.umask(old)
    assert [os.stat(tmp_path / n).st_mode & 0o777 for n in "fg"] == [mode, mode]
    assert sorted(os.listdir(tmp_path)) == ["f", "g"]


def test_a_temp_file_left_by_an_earlier_process_with_this_pid_is_passed_over(tmp_path):
    from hooks import files
    path = tmp_path / "blob"
    n = next(files._serial) + 1
    left = tmp_path / f"blob.tmp-{os.getpid()}-{n}"
    left.write_bytes(b"an earlier process's half-written file")
    files.atomic_write_bytes(str(path), b"new")
    assert path.read_bytes() == b"new" and left.exists()


_PREDICT_ELSEWHERE = """
import json, sys
sys.path[:0] = [{root!r}, {support!r}]
import numpy as np
import estimator as est
from models import bn_dropout_model_fn
e = est.Estimator(bn_dropout_model_fn, model_dir=sys.argv[1])
x = np.random.RandomState(7).randn(10, 4)
print(json.dumps([p["logits"].tolist() for p in e.predict(lambda: [{{"x": x}}])]))
"""


@pytest.mark.slow
def test_a_multi_mebibyte_background_checkpoint_predicts_the_same_in_another_process(tmp_path):
    """Batch-norm + dropout + Adam (a 3 MB checkpoint: several 1 MiB pieces),
    float64 input with a short last batch, saved in the background; a second
    process restores it and predicts what this one does (dropout off,
    batch-norm on its moving averages)."""
    from models import bn_dropout_model_fn, iris_like_input_fn
    e = est.Estimator(bn_dropout_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "m"), save_checkpoints_steps=3,
        experimental_async_checkpoint=True))
    e.train(iris_like_input_fn(epochs=3), steps=8)   # epochs of 4 batches, the last of 4 rows
    latest = e.latest_checkpoint()
    assert latest.endswith("model.ckpt-8") and os.path.getsize(latest) > 3 * 2**20
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(e.model_dir)] == [3, 6, 8]
    x = np.random.RandomState(7).randn(10, 4)
    here = [p["logits"].tolist() for p in e.predict(lambda: [{"x": x}])]
    script = tmp_path / "predict.py"
    script.write_text(_PREDICT_ELSEWHERE.format(root=ROOT, support=SUPPORT))
    out = subprocess.run([sys.executable, str(script), e.model_dir], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    np.testing.assert_allclose(json.loads(out.stdout.splitlines()[-1]), here, rtol=1e-6)
    np.testing.assert_allclose(here, [p["logits"].tolist() for p in e.predict(
        lambda: [{"x": x}])], rtol=0)   # deterministic: dropout is off in predict


def test_list_and_load_variables(tmp_path):
    e = train(tmp_path, 4, save_checkpoints_steps=100)
    names = dict(checkpoint.list_variables(str(tmp_path)))
    assert names["linear/weight"] == [1, 3] and names["linear/bias"] == [1]
    assert names["global_step"] == []
    step = checkpoint.load_variable(str(tmp_path), "global_step")
    assert step == 4 and type(step) is np.int64   # TF's scalar, not a 0-d array
    assert type(e.get_variable_value("global_step")) is np.int64
    np.testing.assert_array_equal(checkpoint.load_variable(e.latest_checkpoint(), "linear/bias"),
                                  e.get_variable_value("linear/bias"))
    with pytest.raises(ValueError, match="not found in checkpoint"):
        checkpoint.load_variable(str(tmp_path), "nope")
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="No checkpoint found"):
        checkpoint.list_variables(str(tmp_path / "empty"))


def test_rng_state_is_saved_and_restored(tmp_path):
    train(tmp_path, 2, save_checkpoints_steps=100)
    state = checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))
    torch.manual_seed(123)
    checkpoint.restore_rng(state["rng"])
    a = torch.rand(3), np.random.rand(), __import__("random").random()
    checkpoint.restore_rng(state["rng"])
    b = torch.rand(3), np.random.rand(), __import__("random").random()
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


_TRAINER = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{root!r}, {tests!r}]
    import torch
    import estimator as est
    from models import regression_model_fn, regression_input_fn

    def slow_input():
        for batch in regression_input_fn()():
            time.sleep(0.002)
            yield batch

    e = est.Estimator(regression_model_fn, params={{"lr": 0.05, "momentum": 0.9}},
                      config=est.RunConfig(model_dir={model_dir!r}, save_checkpoints_steps=3))
    e.train(slow_input, steps=100000)
""")


@pytest.mark.slow
def test_kill_9_then_restart_resumes_from_last_checkpoint(tmp_path):
    model_dir = tmp_path / "m"
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER.format(root=ROOT, tests=SUPPORT,
                                      model_dir=str(model_dir)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            latest = checkpoint.latest_checkpoint(str(model_dir))
            if latest and checkpoint.step_of(latest) >= 30:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        else:
            pytest.fail("the trainer saved no checkpoint in 60 s")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stderr.close()
    # Every checkpoint named by the index loads; stray temp files may exist.
    for path in checkpoint.all_checkpoints(str(model_dir)):
        checkpoint.load(path)
    latest = checkpoint.latest_checkpoint(str(model_dir))
    saved = checkpoint.load(latest)
    step = saved["global_step"]
    assert step == checkpoint.step_of(latest) and step >= 30

    resumed = {}

    def model_fn(features, labels, mode, params):
        if not resumed:
            net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
            resumed["weight"] = net.weight.detach().clone()
            resumed["step"] = est.get_global_step()
        return regression_model_fn(features, labels, mode, params)
    e = est.Estimator(model_fn, params={"lr": 0.05, "momentum": 0.9},
                      config=est.RunConfig(model_dir=str(model_dir), save_checkpoints_steps=3))
    e.train(regression_input_fn(), steps=2)
    assert resumed["step"] == step
    torch.testing.assert_close(resumed["weight"], saved["modules"]["linear"]["weight"],
                               rtol=0, atol=0)
    assert checkpoint.step_of(e.latest_checkpoint()) == step + 2


_KILLED_TRAINER = textwrap.dedent("""
    import os, sys, time
    sys.path[:0] = [{root!r}, {support!r}]
    import torch
    import estimator as est
    from models import regression_input_fn

    out, model_dir, keep, background = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    first = []

    def model_fn(features, labels, mode, params):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.01))
        if not first:   # what this run resumed from, before its first step
            first.append(1)
            torch.save({{"step": est.get_global_step(), "weights": net.state_dict(),
                         "optimizer": opt.state_dict()["state"]}},
                       os.path.join(out, "resumed-%d.pt" % os.getpid()))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)

    def slow_input():
        for batch in regression_input_fn()():
            time.sleep(0.001)
            yield batch

    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=1, keep_checkpoint_max=keep,
        log_step_count_steps=1000, save_summary_steps=0,
        experimental_async_checkpoint=background == "async"))
    e.train(slow_input, steps=10 ** 9)
""")


@pytest.mark.slow
@pytest.mark.parametrize("keep, background", [(1, "sync"), (5, "sync"), (1, "async"),
                                              (5, "async")])
def test_kill_9_at_random_points_of_saves_never_loses_the_newest_listed_checkpoint(
        tmp_path, keep, background):
    """20 kill -9s at random points of a loop that saves every step (written
    on the step, or by the background writer): each restart resumes from the
    checkpoint the index named when the process died, with bit-equal weights
    and optimizer state."""
    import random
    rng = random.Random(keep)
    model_dir, out = tmp_path / "m", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "trainer.py"
    script.write_text(_KILLED_TRAINER.format(root=ROOT, support=SUPPORT))
    expected = None   # (step, weights, optimizer state) of the newest listed checkpoint
    for cycle in range(20):
        before = set(os.listdir(out))
        proc = subprocess.Popen([sys.executable, str(script), str(out), str(model_dir),
                                 str(keep), background], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            deadline = time.time() + 60
            start = expected[0] if expected else 0
            while time.time() < deadline:   # until this run has saved a few times
                latest = checkpoint.latest_checkpoint(str(model_dir))
                if latest and checkpoint.step_of(latest) >= start + 3:
                    break
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
                time.sleep(0.01)
            else:
                pytest.fail(f"cycle {cycle}: no checkpoint within 60 s")
            time.sleep(rng.uniform(0, 0.05))   # a random point, often mid-save
            writers = _writer_processes(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            # A plan step the writer began before its parent died ends (the
            # next it does not begin): what the index names once it is gone
            # (at once: woken by its parent's exit) is what the next run
            # resumes from.
            deadline = time.time() + 10
            while any(_running(pid) for pid in writers):
                assert time.time() < deadline, f"writer {writers} outlived its parent by 10 s"
                time.sleep(0.01)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            proc.stderr.close()
        resumed = [n for n in os.listdir(out) if n not in before]
        assert len(resumed) == 1, resumed
        got = torch.load(out / resumed[0], weights_only=True)
        if expected is None:
            assert got["step"] == 0
        else:
            assert got["step"] == expected[0], (cycle, got["step"], expected[0])
            for name, value in expected[1].items():
                assert torch.equal(got["weights"][name], value), (cycle, name)
            assert got["optimizer"].keys() == expected[2].keys()
            for index, slots in expected[2].items():
                for slot, value in slots.items():
                    assert torch.equal(got["optimizer"][index][slot], value), (cycle, slot)
        # What the index names now is what the next run must resume from.
        latest = checkpoint.latest_checkpoint(str(model_dir))
        listed = checkpoint.all_checkpoints(str(model_dir))
        assert latest == listed[-1] and len(listed) <= keep
        state = checkpoint.load(latest)    # digest checked: complete and unaltered
        expected = (state["global_step"], state["modules"]["linear"],
                    state["optimizers"]["optimizer"]["state"])


@pytest.mark.parametrize("steps", [60, 8])
def test_nan_from_a_scripted_step_leaves_the_last_healthy_checkpoint_latest(tmp_path, steps):
    """NaN loss from step 45 with saves every 10 (keep 5): the run stops with
    NanLossDuringTrainingError before any save of the diverged weights, and a
    run shorter than the NaN check interval no longer exits with a NaN model."""
    poison_at = 45 if steps == 60 else 5

    def model_fn(features, labels, mode, params):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        pred = net(features["x"])
        if est.get_global_step() + 1 >= poison_at:
            pred = pred * float("nan")
        loss = torch.nn.functional.mse_loss(pred, labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.05)))
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path),
                                                     save_checkpoints_steps=10))
    with pytest.raises(hooks.NanLossDuringTrainingError, match="^The model diverged: at the "
                       "save of global step .*, linear/.* is not finite; no checkpoint of it "
                       "was saved"):   # (it said "NaN loss during training": the weights)
        e.train(regression_input_fn(), steps=steps)
    kept = [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path))]
    assert kept == ([10, 20, 30, 40] if steps == 60 else [])
    for path in checkpoint.all_checkpoints(str(tmp_path)):
        state = checkpoint.load(path)["modules"]["linear"]
        assert all(torch.isfinite(v).all() for v in state.values())


def test_the_save_time_check_names_the_first_tensor_not_finite_and_only_such_one():
    """Finite values whose sum overflows (float32, float16) are finite; NaN or
    inf anywhere in a parameter or an optimizer slot is named, the first in
    order; in a buffer only NaN (inf is a mask's or a sentinel's)."""
    from hooks.checkpoint import _first_nonfinite

    def state(weight, slot, half, mask=torch.zeros(2, 2)):
        return {"modules": {"net": {"0.weight": weight, "0.bias": torch.zeros(2),
                                    "bn.num_batches_tracked": torch.tensor(7),
                                    "half": half, "mask": mask}},
                "optimizers": {"opt": {"state": {0: {"step": torch.tensor(3.0),
                                                     "exp_avg": slot}},
                                       "param_groups": [{"lr": 0.1, "params": [0]}]}},
                "global_step": 3}
    buffers = {"net": {"bn.num_batches_tracked", "mask"}}
    big = torch.full((4, 3), 3e38)                       # sum: inf in float32
    half = torch.full((4,), 60000.0, dtype=torch.float16)   # sum: inf in float16
    assert _first_nonfinite(state(big, torch.ones(3), half), buffers) is None
    assert _first_nonfinite({"global_step": 0}, {}) is None
    nan, inf = big.clone(), torch.ones(3)
    nan[2, 1] = float("nan")
    inf[0] = -float("inf")
    assert _first_nonfinite(state(nan, inf, half), buffers) == "net/0/weight"
    assert _first_nonfinite(state(big, inf, half), buffers) == "opt/state/0/exp_avg"
    causal = torch.full((2, 2), -float("inf")).triu(1)
    both = torch.tensor([[float("inf"), -float("inf")]])   # (their sum: NaN)
    for mask in (causal, both):
        assert _first_nonfinite(state(big, torch.ones(3), half, mask), buffers) is None
    assert _first_nonfinite(state(big, torch.ones(3), half, causal), {}) == "net/mask"
    assert _first_nonfinite(state(big, torch.ones(3), half, causal * 0), buffers) == "net/mask"
    half[1] = float("inf")
    assert _first_nonfinite(state(big, inf, half), buffers) == "net/half"


def test_a_model_with_a_causal_mask_of_minus_inf_saves_its_checkpoints(tmp_path):
    """A causal attention mask registered as a buffer (-inf above the
    diagonal, as in most transformer code) stopped the run at its first
    save with NanLossDuringTrainingError, its loss finite: TF checks the
    loss only. Its buffers are checked for NaN, its weights for NaN and inf."""
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(3, 3)
            self.register_buffer("mask", torch.full((4, 4), -float("inf")).triu(1))

        def forward(self, x):                                 # x: [batch, 4, 3]
            scores = x @ x.transpose(1, 2) + self.mask
            return (scores.softmax(-1) @ self.proj(x)).mean((1, 2))

    def model_fn(features, labels, mode):
        net = est.get_module("net", Attention)
        pred = net(torch.as_tensor(features["x"]).reshape(-1, 4, 3))
        loss = torch.nn.functional.mse_loss(pred, torch.as_tensor(labels))
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.Adam(p, lr=0.01)))
    rows = np.random.RandomState(0)
    data = [({"x": rows.randn(8, 12)}, rows.randn(8)) for _ in range(20)]
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path),
                                                     save_checkpoints_steps=5))
    e.train(lambda: data)
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path))] == [
        5, 10, 15, 20]
    assert torch.equal(checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))[
        "modules"]["net"]["mask"], torch.full((4, 4), -float("inf")).triu(1))


# -- background saves (RunConfig(experimental_async_checkpoint=True)) ------------------------
def _state(value: float, step: int) -> dict:
    return {"modules": {"net": {"w": torch.full((3,), value)}}, "optimizers": {},
            "optimizer_var_names": {}, "metrics": {}, "global_step": step}


def test_a_background_save_writes_the_state_of_its_step(tmp_path):
    """The state is copied on the step: changing the live tensors right after
    `save` does not reach the file; the file equals a synchronous save's."""
    saver = checkpoint.Saver(str(tmp_path), background=True)
    state = _state(1.0, 7)
    path = saver.save(state, 7)
    state["modules"]["net"]["w"].fill_(99.0)          # the next step's update
    saver.wait()
    assert checkpoint.latest_checkpoint(str(tmp_path)) == path
    assert checkpoint.load(path)["modules"]["net"]["w"].tolist() == [1.0] * 3
    sync_path = checkpoint.Saver(str(tmp_path / "sync")).save(_state(1.0, 7), 7)
    assert torch.equal(checkpoint.load(sync_path)["modules"]["net"]["w"],
                       checkpoint.load(path)["modules"]["net"]["w"])


def test_background_saves_are_never_dropped_and_keep_max_holds(tmp_path):
    saver = checkpoint.Saver(str(tmp_path), max_to_keep=2, background=True)
    for step in range(1, 6):
        saver.save(_state(float(step), step), step)
    saver.wait()
    listed = checkpoint.all_checkpoints(str(tmp_path))
    assert [checkpoint.step_of(p) for p in listed] == [4, 5]


def _writer_processes(parent=None) -> set:
    """Pids of the checkpoint writer processes of `parent` (this process by
    default; those of Savers still to be collected too)."""
    parent = os.getpid() if parent is None else parent
    pids = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{entry}/comm", "rb") as f:
                name = f.read().strip()
        except (OSError, ValueError):
            continue
        if ppid == parent and name == checkpoint_files.FORKED_WRITER_NAME:
            pids.add(int(entry))
    return pids


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


class _AtStep(hooks.SessionRunHook):
    """Calls `act()` once, after step `step`."""

    def __init__(self, step, act):
        self.step, self.act = step, act

    def after_run(self, run_context, run_values):
        if run_context.session.global_step == self.step:
            self.act()


def test_a_failed_background_save_fails_the_next_step(tmp_path):
    """A write error in the writer process (here the file size limit: EFBIG as
    the kernel gives it, on the index) stops training soon after it (at the
    latest, the next save waits for it) with the error naming the file; the
    previous checkpoint stays the latest."""
    import resource
    others = _writer_processes()

    def limit_file_size():
        [pid] = _writer_processes() - others
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (64, 64))   # the digest fits, the index not
    e = est.Estimator(regression_model_fn, params={"lr": 0.1}, config=est.RunConfig(
        model_dir=str(tmp_path), save_checkpoints_steps=2, experimental_async_checkpoint=True))
    with pytest.raises(OSError, match="File too large.*checkpoint") as info:
        e.train(regression_input_fn(), max_steps=20, hooks=[_AtStep(3, limit_file_size)])
    assert info.value.errno == errno.EFBIG
    assert checkpoint.step_of(checkpoint.latest_checkpoint(str(tmp_path))) == 2
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    assert _writer_processes() <= others


def test_a_failed_background_save_fails_training_soon_not_at_the_next_save(tmp_path):
    """The saver looks at a save in flight after 1 ms, then after twice the
    time each time it is still writing (not on every step): a failed write
    still stops training within milliseconds of failing, long before the
    next save (here 400 steps later) would wait for it."""
    others, seen = _writer_processes(), []

    def limit_file_size():
        [pid] = _writer_processes() - others
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (64, 64))

    class LastStep(hooks.SessionRunHook):
        def after_run(self, run_context, run_values):
            seen.append(run_context.session.global_step)
    e = est.Estimator(regression_model_fn, params={"lr": 0.1}, config=est.RunConfig(
        model_dir=str(tmp_path), save_checkpoints_steps=400, experimental_async_checkpoint=True))
    with pytest.raises(OSError, match="File too large.*checkpoint"):
        e.train(regression_input_fn(), max_steps=1200,
                hooks=[_AtStep(500, limit_file_size), LastStep()])
    # The save of step 800 failed, and stopped training within 200 steps (seen
    # here: 4 steps, 3.7 ms; looking only at the next save: step 1199).
    assert 800 < seen[-1] < 1000
    assert checkpoint.step_of(checkpoint.latest_checkpoint(str(tmp_path))) == 400
    assert _writer_processes() <= others


def test_by_default_a_writer_process_saves_and_ends_with_train(tmp_path, monkeypatch):
    monkeypatch.delenv("ESTIMATOR_ASYNC_CHECKPOINT", raising=False)
    others, seen = _writer_processes(), []
    e = est.Estimator(regression_model_fn, params={"lr": 0.1}, config=est.RunConfig(
        model_dir=str(tmp_path), save_checkpoints_steps=2))
    e.train(regression_input_fn(), max_steps=7,
            hooks=[_AtStep(3, lambda: seen.extend(_writer_processes() - others))])
    assert len(seen) == 1
    assert _writer_processes() <= others
    assert checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))["global_step"] == 7


def test_the_last_save_of_train_is_made_on_the_step(tmp_path, monkeypatch):
    """train waits for its last save: it starts no writer process for it
    (starting one costs more than the save); saves during training use one."""
    started = []

    class Recorded(checkpoint_files.WriterProcess):
        def __init__(self, prepare=None, **kwargs):
            super().__init__(prepare, **kwargs)
            started.append(self.pid)
    monkeypatch.setattr(checkpoint_files, "WriterProcess", Recorded)
    config = est.RunConfig(model_dir=str(tmp_path), save_checkpoints_steps=100,
                           experimental_async_checkpoint=True)
    e = est.Estimator(regression_model_fn, params={"lr": 0.1}, config=config)
    e.train(regression_input_fn(), max_steps=7)
    assert started == []
    assert checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))["global_step"] == 7
    e.train(regression_input_fn(), max_steps=210)   # saves at 107, 207 in the background
    assert len(started) == 1
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path))] == [
        7, 107, 207, 210]


def test_a_killed_writer_process_is_an_error_and_the_next_save_starts_another(tmp_path):
    others = _writer_processes()
    saver = checkpoint.Saver(str(tmp_path), background=True)
    saver.save(_state(1.0, 1), 1)
    saver.wait()
    [pid] = _writer_processes() - others
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ChildProcessError, match=rf"writer process \(pid {pid}\) ended: "
                                                r"killed by signal 9"):
        saver.save(_state(2.0, 2), 2)
        saver.wait()
    assert checkpoint.step_of(checkpoint.latest_checkpoint(str(tmp_path))) == 1
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    saver.save(_state(3.0, 3), 3)
    saver.close()
    assert checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))["global_step"] == 3
    assert _writer_processes() <= others


def test_a_plan_larger_than_the_pipe_reaches_the_writer_process_whole(tmp_path):
    """A plan is read while it is written when it does not fit in the pipe
    (an index listing thousands of kept checkpoints)."""
    from hooks import files
    writer = files.WriterProcess()
    try:
        data = os.urandom(3 * (1 << 20) + 17)
        writer.submit([("write", str(tmp_path / "big"), data, True),
                       ("remove", str(tmp_path / "not-there"))])
        writer.result()
        assert (tmp_path / "big").read_bytes() == data
    finally:
        writer.close()
    assert writer._proc.returncode == 0


def test_without_eventfd_the_writer_process_waits_on_its_pipe(tmp_path, monkeypatch):
    """Outside Linux (no os.eventfd) the plan in the pipe wakes the writer."""
    monkeypatch.delattr(os, "eventfd")
    saver = checkpoint.Saver(str(tmp_path), max_to_keep=1, background=True)
    for step in (1, 2):
        saver.save(_state(float(step), step), step)
    saver.close()
    assert checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))["global_step"] == 2
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "model.ckpt-2", "model.ckpt-2.crc32c"]


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no pidfd"])
def test_closing_a_writer_process_that_does_not_end_kills_it(monkeypatch, pidfd):
    """close() waits for the writer's exit (woken by it through a pidfd where
    there is one), and kills a writer that has not ended within its timeout."""
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    writer = checkpoint_files.WriterProcess()
    writer.submit([])
    writer.result()
    os.kill(writer.pid, signal.SIGSTOP)   # it cannot read the end of its pipe
    start = time.monotonic()
    writer.close(timeout=0.5)
    assert 0.5 <= time.monotonic() - start < 5
    assert writer._proc.returncode == -signal.SIGKILL
    ended = checkpoint_files.WriterProcess()
    ended.close()
    assert ended._proc.returncode == 0


def test_saves_are_made_on_the_step_where_no_writer_process_can_start(tmp_path, monkeypatch,
                                                                      caplog):
    def fork():   # (as at a process limit)
        raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
    monkeypatch.setattr(os, "fork", fork)
    saver = checkpoint.Saver(str(tmp_path), background=True)
    saver.save(_state(1.0, 1), 1)
    assert "the background writer process cannot start" in caplog.text
    assert os.strerror(errno.EAGAIN) in caplog.text
    assert not saver.in_flight
    assert checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))["global_step"] == 1
    saver.save(_state(2.0, 2), 2)   # (on the step too)
    assert not saver.in_flight
    assert checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))["global_step"] == 2


_WRITER_OF_A_KILLED_PROCESS = """
import sys, time, torch
sys.path[:0] = [{root!r}]
from hooks import checkpoint
saver = checkpoint.Saver(sys.argv[1], background=True)
saver.save({{"modules": {{"w": {{"w": torch.ones(3)}}}}, "global_step": 1}}, 1)
saver.wait()
print(saver._process.pid, flush=True)
time.sleep(60)
"""


def test_the_writer_process_ends_with_a_process_killed_with_9(tmp_path):
    """Woken by its parent's exit (a pidfd): gone within half a second (it
    looks every second where there are no pidfds)."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER_OF_A_KILLED_PROCESS.format(root=ROOT),
                             str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        writer = int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(30)
    killed = time.monotonic()
    limit = 0.5 if hasattr(os, "pidfd_open") else 10
    while _running(writer):
        if time.monotonic() - killed > limit:
            os.kill(writer, signal.SIGKILL)
            pytest.fail(f"the writer process {writer} outlived the process killed with -9 "
                        f"by {limit} s")
        time.sleep(0.005)
    assert checkpoint.step_of(checkpoint.latest_checkpoint(str(tmp_path))) == 1


def test_train_returns_with_the_final_background_save_complete(tmp_path):
    e = est.Estimator(regression_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path), save_checkpoints_steps=3, experimental_async_checkpoint=True))
    e.train(regression_input_fn(), max_steps=10)
    latest = checkpoint.latest_checkpoint(str(tmp_path))
    assert checkpoint.step_of(latest) == 10
    assert checkpoint.load(latest)["global_step"] == 10      # complete, digest checked
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp") or ".tmp" in n]


def test_a_background_save_in_flight_is_on_disk_when_training_fails(tmp_path):
    """An error after a save was handed to the writer: train raises the error,
    and the checkpoint of that save is complete and listed by then (the writer
    process is stopped, as a slow disk would hold it, from after the save of
    step 5 until a second later)."""
    import threading
    resumed, others = [], _writer_processes()

    def stop_the_writer_for_a_second():
        deadline = time.monotonic() + 30
        while not (checkpoint.latest_checkpoint(str(tmp_path)) or "").endswith("-5"):
            assert time.monotonic() < deadline, "the save of step 5 did not complete"
            time.sleep(0.01)
        [pid] = _writer_processes() - others
        os.kill(pid, signal.SIGSTOP)
        timer = threading.Timer(1.0, lambda: (resumed.append(time.monotonic()),
                                              os.kill(pid, signal.SIGCONT)))
        timer.daemon = True
        timer.start()

    def model_fn(features, labels, mode, params):
        if est.get_global_step() >= 12:
            raise RuntimeError("the input broke at step 13")
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.05)))
    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=str(tmp_path), save_checkpoints_steps=5, experimental_async_checkpoint=True))
    with pytest.raises(RuntimeError, match="the input broke at step 13"):
        e.train(regression_input_fn(), steps=30, hooks=[_AtStep(7, stop_the_writer_for_a_second)])
    assert resumed, "train raised before the writer process was resumed"
    assert checkpoint.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-10")


def _two_layer_model_fn(features, labels, mode):
    net = est.get_module("net", lambda: torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)))
    loss = torch.nn.functional.mse_loss(net(torch.as_tensor(features["x"])), labels)
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)))


def test_a_module_is_restored_by_variable_names_from_another_layout(tmp_path):
    """TF restores by variable name: a checkpoint whose modules split what is
    one module now (an earlier version's canned linear model saved a module
    per column, `linear/linear_model/b` holding `weights`, one module now
    holding `b/weights`) restores the same variables. Before: 'Missing
    key(s)', though `estimator inspect` listed exactly those names."""
    def run(model_dir, steps):
        torch.manual_seed(0)
        e = est.Estimator(_two_layer_model_fn, model_dir=str(model_dir))
        e.train(regression_input_fn(), steps=steps)
        return e
    run(tmp_path / "one", 3)
    state = checkpoint.load(str(tmp_path / "one" / "model.ckpt-3"))
    net = state["modules"].pop("net")
    for layer in ("0", "2"):
        state["modules"][f"net/{layer}"] = {k.split(".", 1)[1]: v for k, v in net.items()
                                            if k.startswith(layer + ".")}
    state.pop("rng")
    hooks.checkpoint.Saver(str(tmp_path / "split")).save(state, 3)
    resumed, split = run(tmp_path / "one", 3), run(tmp_path / "split", 3)
    assert split.get_variable_value("global_step") == 6
    for name in resumed.get_variable_names():
        np.testing.assert_array_equal(split.get_variable_value(name),
                                      resumed.get_variable_value(name), err_msg=name)

    state["modules"]["net"] = state["modules"].pop("net/0")   # (0.* in its own state)
    state["modules"]["net"] = {f"0.{k}": v for k, v in state["modules"]["net"].items()}
    hooks.checkpoint.Saver(str(tmp_path / "part_split")).save(state, 3)
    part_split = run(tmp_path / "part_split", 3)
    for name in resumed.get_variable_names():
        np.testing.assert_array_equal(part_split.get_variable_value(name),
                                      resumed.get_variable_value(name), err_msg=name)
    state["modules"]["net/0"] = {k[2:]: v for k, v in state["modules"].pop("net").items()}
    del state["modules"]["net/2"]   # a variable not there under any name: the error stands
    hooks.checkpoint.Saver(str(tmp_path / "part")).save(state, 3)
    with pytest.raises(ValueError, match=r"get_module\('net'\): the checkpoint .* has no module "
                                         r"'net' \(it has \['net/0'\]\)"):
        run(tmp_path / "part", 1)


def test_a_module_named_within_anothers_is_not_restored_from_its_variables(tmp_path):
    """Module `a/b`, new, is not in the checkpoint; module `a`'s `b.weight`
    has its variable's name, but is `a`'s: the clear error, not `a`'s weights
    in a new module (TF would have named the new one `a/b_1`)."""
    def model_fn(with_new):
        def fn(features, labels, mode):
            a = est.get_module("a", lambda: torch.nn.ModuleDict({"b": torch.nn.Linear(3, 1)}))
            pred = a["b"](torch.as_tensor(features["x"]))
            if with_new:
                pred = pred + est.get_module("a/b", lambda: torch.nn.Linear(3, 1))(
                    torch.as_tensor(features["x"]))
            loss = torch.nn.functional.mse_loss(pred, labels)
            return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
                lambda p: torch.optim.SGD(p, lr=0.1)))
        return fn
    est.Estimator(model_fn(False), model_dir=str(tmp_path)).train(regression_input_fn(), steps=2)
    with pytest.raises(ValueError, match=r"get_module\('a/b'\): the checkpoint .* has no module "
                                         r"'a/b' \(it has \['a'\]\)"):
        est.Estimator(model_fn(True), model_dir=str(tmp_path)).evaluate(regression_input_fn(),
                                                                        steps=1)


@pytest.mark.parametrize("name", ["a/b", "", "a/", "/a", "a//b", 3])
def test_modules_whose_variables_would_share_names_are_refused(tmp_path, name):
    """`a` holding `b` and a module `a/b` were both made, one variable name
    for two (a warm start from them took the second's weights for the
    first's; TF: "Variable a/b/weight already exists"); names TF's scopes
    cannot be ('', 'a/', 'a//b') made variables `/weight`, `a//weight` (names
    probe)."""
    def model_fn(features, labels, mode):
        a = est.get_module("a", lambda: torch.nn.ModuleDict({"b": torch.nn.Linear(3, 1)}))
        other = est.get_module(name, lambda: torch.nn.Linear(3, 1))
        x = torch.as_tensor(features["x"])
        loss = torch.nn.functional.mse_loss(a["b"](x) + other(x), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    match = (r"get_module\('a/b'\): its variable a/b/bias is also module 'a''s" if name == "a/b"
             else "get_module: the name must be a variable scope")
    with pytest.raises(ValueError, match=match):
        est.Estimator(model_fn, model_dir=str(tmp_path)).train(regression_input_fn(), steps=1)
    assert not os.path.exists(os.path.join(tmp_path, "checkpoint"))


def test_a_module_made_of_another_modules_tensors_is_not_a_clash(tmp_path):
    """`a` holding the module `a/b` itself is one variable per name, not two
    (the attack: refused by the check above)."""
    def model_fn(features, labels, mode):
        b = est.get_module("a/b", lambda: torch.nn.Linear(3, 1))
        a = est.get_module("a", lambda: torch.nn.ModuleDict({"b": b}))
        loss = torch.nn.functional.mse_loss(a["b"](torch.as_tensor(features["x"])), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(regression_input_fn(), steps=2)
    assert sorted(e.get_variable_names()) == ["a/b/bias", "a/b/weight", "global_step"]


def test_hourly_and_unevaluated_checkpoints_stay_and_a_damaged_index_deletes_none(
        tmp_path, monkeypatch):
    """One not yet evaluated stays listed (an evaluator evaluating every
    checkpoint reads the list), even when past the hourly mark; an index that
    cannot be read lists nothing, as TF's get_checkpoint_state is None: the
    next save deletes none of the files on disk (before: all taken as listed,
    the oldest, hourly ones among them, deleted)."""
    now = [0.0]
    monkeypatch.setattr(time, "time", lambda: now[0])   # (the Saver's clock)
    saver = checkpoint.Saver(str(tmp_path), max_to_keep=1, keep_checkpoint_every_n_hours=1)
    saver.protect(lambda path: True)
    for step, at in enumerate([0, 4000, 4001], 1):
        now[0] = at
        saver.save({"modules": {}, "optimizers": {}, "global_step": step}, step)
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path))] == [1, 2, 3]
    saver.protect(lambda path: False)
    now[0] = 4002
    saver.save({"modules": {}, "optimizers": {}, "global_step": 4}, 4)
    on_disk = sorted(checkpoint.step_of(p) for p in checkpoint.checkpoints_on_disk(str(tmp_path)))
    assert on_disk == [2, 4]   # 2, past the mark when judged unprotected, kept for good
    (tmp_path / "checkpoint").write_text("garbage{{{\n")
    fresh = checkpoint.Saver(str(tmp_path), max_to_keep=1)
    fresh.save({"modules": {}, "optimizers": {}, "global_step": 5}, 5)
    fresh.save({"modules": {}, "optimizers": {}, "global_step": 6}, 6)
    on_disk = sorted(checkpoint.step_of(p) for p in checkpoint.checkpoints_on_disk(str(tmp_path)))
    assert on_disk == [2, 4, 6]
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(str(tmp_path))] == [6]


def _one_checkpoint(tmp_path):
    e = train(tmp_path / "model", 1)
    return e.latest_checkpoint()


def test_a_checkpoint_that_cannot_be_linked_is_pinned_by_a_copy(tmp_path, monkeypatch):
    """An evaluator whose pin dir is on another file system, or reading the
    chief's files as another user (protected_hardlinks), got the checkpoint
    itself: the chief deleted it before the exporters read it, and the
    evaluator died (evaluator probe)."""
    path = _one_checkpoint(tmp_path)
    mtime, weight = os.stat(path).st_mtime_ns, checkpoint.load(path)["modules"]["linear"]["weight"]

    def no_link(source, target):
        if not os.path.exists(source):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", source)
        raise OSError(errno.EXDEV, "Invalid cross-device link", source)
    monkeypatch.setattr(os, "link", no_link)
    held = hooks.checkpoint.pin(path, str(tmp_path / "pins"))
    assert held != path and os.path.dirname(held) == str(tmp_path / "pins")
    assert os.stat(held).st_mtime_ns == mtime   # (compared with the summaries' times)
    for name in os.listdir(tmp_path / "model"):
        if name.startswith(os.path.basename(path)):
            os.remove(tmp_path / "model" / name)   # the chief's retention
    assert torch.equal(checkpoint.load(held)["modules"]["linear"]["weight"], weight)
    hooks.checkpoint.unpin(held, path)
    assert os.listdir(tmp_path / "pins") == []


def test_a_checkpoint_that_can_be_neither_linked_nor_copied_is_read_in_place(
        tmp_path, monkeypatch, caplog):
    path = _one_checkpoint(tmp_path)

    def refused(source, target):
        if not os.path.exists(source):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", source)
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", refused)
    monkeypatch.setattr(hooks.checkpoint, "_copy", refused)
    assert hooks.checkpoint.pin(path, str(tmp_path / "pins")) == path
    assert "is read in place: it can neither be linked nor copied" in caplog.text
    os.remove(path)
    with pytest.raises(FileNotFoundError):   # gone: the evaluator passes over it
        checkpoint.load(hooks.checkpoint.pin(path, str(tmp_path / "pins")))


def test_a_pin_dir_on_another_file_system_holds_a_copy(tmp_path):
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system here")
    path = _one_checkpoint(tmp_path)
    pins = os.path.join("/dev/shm", f"pins-{os.getpid()}-{time.monotonic_ns()}")
    try:
        held = hooks.checkpoint.pin(path, pins)
        assert held.startswith(pins)
        os.remove(path)
        checkpoint.load(held)
        hooks.checkpoint.unpin(held, path)
    finally:
        shutil.rmtree(pins, ignore_errors=True)


def test_a_pin_dir_that_cannot_be_made_says_where_to_write(tmp_path):
    path = _one_checkpoint(tmp_path)
    (tmp_path / "eval").write_text("")   # (as a read-only eval dir: root writes anywhere)
    with pytest.raises(OSError, match=r"Cannot make .*eval/pins, where the checkpoints being "
                                      r"read are held .*eval must be writable"):
        hooks.checkpoint.pin(path, str(tmp_path / "eval" / "pins"))
