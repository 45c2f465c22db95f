"""Checkpoint files: `model_dir/model.ckpt-<step>` plus a `checkpoint` index.

The only module that touches checkpoint files. TF analogues:
`tf.train.Saver` (save, keep_checkpoint_max, keep_checkpoint_every_n_hours),
`tf.train.latest_checkpoint`, `tf.train.list_variables`,
`tf.train.load_variable`.

A checkpoint that was listed is never lost:
- every file is written atomically (`hooks.files.apply`, in a writer
  process for background saves): the checkpoint's content digest
  (`model.ckpt-<step>.crc32c`, CRC-32C as TF's checkpoints and TFRecords
  carry; `.sha256` files of earlier versions are still checked), then the
  checkpoint, then the index; only once the index is on disk are the files it
  no longer names deleted. Temp files an interrupted save left behind are
  removed when the next Saver starts.
- `load` checks the digest, so changed bytes are an error naming the file,
  never a model with altered weights; files load with
  `torch.load(weights_only=True)`: a checkpoint cannot run code. A state
  holding other Python objects (a module's `get_extra_state` returning a
  class of the user's) is refused at a Saver's first save (read back as
  `load` reads it; later saves are not checked), and a checkpoint holding
  them is an `UnsafeCheckpointError` naming the classes, never passed over
  as damaged.
- `restore_latest` falls back to the newest good checkpoint when the index is
  missing, empty, unreadable or names a missing file, or the latest
  checkpoint is damaged, with a warning naming the bad file; a fresh start
  (step 0) is said in the log too.
- a full disk is an error naming the path (ENOSPC), raised before the index
  changes, so the previous checkpoint stays the latest.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import inspect
import io
import logging
import os
import pickle
import random
import re
import shutil
import time
import weakref
from typing import Dict, List, Optional, Tuple

import google_crc32c
import numpy as np
import torch

from distribute.host_arrays import to_numpy
from distribute.variable_names import var_name

from . import tf_checkpoint
from . import files
from ._staging import Staging
from .files import DataLossError

logger = logging.getLogger(__name__)

INDEX = "checkpoint"
PREFIX = "model.ckpt"
DIGEST_SUFFIX = ".crc32c"
# Digest files by suffix -> the hex digest of a checkpoint's bytes. CRC-32C
# (hardware, ~8x SHA-256's speed: 0.3 ms against 1.5 ms for 2.7 MB, on the
# step, as the bytes are written) finds the torn and flipped bytes a digest is
# here for; SHA-256 is what checkpoints of earlier versions carry.
_DIGESTS = {DIGEST_SUFFIX: lambda data: _Crc32c(data).hexdigest(),
            ".sha256": lambda data: hashlib.sha256(data).hexdigest()}
_CKPT_RE = re.compile(r"^model\.ckpt-(\d+)$")
_TEMP_RE = re.compile(r"^(model\.ckpt-\d+(\.crc32c|\.sha256)?|checkpoint)\.tmp-")


# -- the index ----------------------------------------------------------------
def _read_index(model_dir: str) -> Tuple[Optional[str], List[Tuple[str, float]]]:
    """(latest name, [(name, timestamp), ...] oldest first) from the index,
    each a name in `model_dir` where it is one (`_here`)."""
    path = os.path.join(model_dir, INDEX)
    if not os.path.exists(path):
        return None, []
    latest, names, stamps = None, [], []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            key, _, value = line.partition(":")
            value = value.strip()
            if key == "model_checkpoint_path":
                latest = value.strip('"')
            elif key == "all_model_checkpoint_paths":
                names.append(value.strip('"'))
            elif key == "all_model_checkpoint_timestamps":
                stamps.append(float(value))
            elif key == "last_preserved_timestamp":   # TF2's CheckpointManager writes it
                continue
            else:
                raise ValueError(f"{path}:{lineno}: unknown entry {key!r} in the checkpoint index")
    stamps += [0.0] * (len(names) - len(stamps))
    return _here(model_dir, latest), [(_here(model_dir, n), t) for n, t in zip(names, stamps)]


def _here(model_dir: str, name: Optional[str]) -> Optional[str]:
    """An index entry as the name of a file of `model_dir` where it is one
    (TF writes absolute paths, and a model_dir copied or moved keeps them: a
    file of the same name here is this model_dir's own); else as an absolute
    path (a checkpoint elsewhere, `../other/model.ckpt-4` too: read, never
    deleted, not listed again)."""
    if name is None or os.path.basename(name) == name:
        return name
    path = os.path.join(model_dir, name)   # (an absolute name stays itself)
    base = os.path.basename(name)
    if os.path.dirname(os.path.realpath(path)) == os.path.realpath(model_dir) or \
            os.path.isfile(os.path.join(model_dir, base)):
        return base
    return os.path.abspath(path)


def _index(latest: str, kept: List[Tuple[str, float]]) -> bytes:
    """The index's bytes (TF's CheckpointState as text)."""
    lines = [f'model_checkpoint_path: "{latest}"']
    lines += [f'all_model_checkpoint_paths: "{n}"' for n, _ in kept]
    lines += [f"all_model_checkpoint_timestamps: {t:.6f}" for _, t in kept]
    return ("\n".join(lines) + "\n").encode()


def _on_disk(model_dir: str) -> List[str]:
    """Names of the checkpoint files in `model_dir`, newest step first."""
    names = [n for n in os.listdir(model_dir) if _CKPT_RE.match(n)]
    return sorted(names, key=lambda n: -int(_CKPT_RE.match(n).group(1)))


def _candidates(model_dir: str, warn: bool, none_left: str = "") -> List[str]:
    """Checkpoint paths to restore from, best first: the index's latest, then
    the others it lists, newest first; when the index is missing, empty,
    unreadable or names no existing file, the files on disk, newest step
    first (with a warning naming the problem, when `warn`, and `none_left`
    where there are none)."""
    index = os.path.join(model_dir, INDEX)
    try:
        latest, kept = _read_index(model_dir)
        problem = None if latest else ("is missing" if not os.path.exists(index)
                                       else "names no checkpoint")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        latest, kept, problem = None, [], f"cannot be read ({e})"
    listed = [latest] + [n for n, _ in reversed(kept)] if latest else []
    listed = [n for i, n in enumerate(listed) if n not in listed[:i]
              and os.path.isfile(os.path.join(model_dir, n))]
    if latest and not listed:
        problem = f"names {latest!r}, which does not exist"
    if listed:
        if latest not in listed and warn:
            logger.warning("The checkpoint index %s names %r, which does not exist; using %s",
                           index, latest, listed[0])
        elif warn and os.path.isabs(latest):
            logger.warning("The checkpoint index %s names %s, outside %s (an index copied from "
                           "another model_dir?): restoring from it, which stays as it is; the "
                           "checkpoints written from here on are this model_dir's", index,
                           latest, model_dir)
        newer = sorted((n for n in listed[1:] if _step_in(n) > _step_in(listed[0])),
                       key=_step_in)
        if warn and newer:   # (TF's way to roll a run back, by hand: done, but said)
            logger.warning("The checkpoint index %s names %s as the latest, while it lists the "
                           "newer %s: restoring from %s, as TF does; the checkpoints training "
                           "writes from there replace the newer ones", index, listed[0],
                           ", ".join(os.path.basename(n) for n in newer), listed[0])
        return [os.path.join(model_dir, n) for n in listed]
    files = _on_disk(model_dir)
    if files and warn:
        logger.warning("The checkpoint index %s %s; using the checkpoint files in %s "
                       "(newest: %s)", index, problem, model_dir, files[0])
    elif warn and os.path.exists(index) and tf_checkpoint.find_prefix(model_dir) is None:
        # (TF: "Couldn't match files for checkpoint"; a TF model_dir's is said where it is read)
        logger.warning("The checkpoint index %s %s, and %s holds no checkpoint file: %s",
                       index, problem, model_dir, none_left)
    return [os.path.join(model_dir, n) for n in files]


def _step_in(name: str) -> int:
    """The step of a checkpoint's name, -1 for a name of another form."""
    m = _CKPT_RE.match(os.path.basename(name))
    return int(m.group(1)) if m else -1


def latest_checkpoint(model_dir: str) -> Optional[str]:
    """Path of the newest checkpoint in `model_dir`, or None
    (tf.train.latest_checkpoint). When the index is missing, unreadable or
    names a file that is gone, the newest listed (or else on disk) checkpoint."""
    if not model_dir or not os.path.isdir(model_dir):
        return None
    found = _candidates(model_dir, warn=False)
    if not found:   # a TF model_dir: its latest checkpoint prefix
        return tf_checkpoint.find_prefix(model_dir)
    return found[0]


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint (or a state to save) holding Python objects that
    `torch.load(weights_only=True)` loads only when allowed
    (`torch.serialization.add_safe_globals`). Not damage: training does not
    fall back past such a checkpoint (and restart from an older one, or from
    step 0); the message names the classes and the fix."""


# Checkpoints this process found damaged (restore_latest passed over them for
# their content, a DataLossError): a
# Saver's next save unlists and deletes them, so that they do not count towards
# max_to_keep, evicting good ones.
_damaged: set = set()


def _is_damaged(model_dir: str, name: str) -> bool:
    return os.path.realpath(os.path.join(model_dir, name)) in _damaged


def restore_latest(model_dir: Optional[str], none_left: str = "training starts from step 0"
                   ) -> Tuple[Optional[str], Optional[dict]]:
    """(path, contents) of the newest good checkpoint of `model_dir`, falling
    back past a damaged one (or a broken index) with a warning naming it;
    (None, None) when there is none, said in the log (with `none_left`, what
    follows) when files were there."""
    if not model_dir or not os.path.isdir(model_dir):
        return None, None
    candidates = _candidates(model_dir, warn=True, none_left=none_left)
    for i, path in enumerate(candidates):
        try:
            return path, load(path)
        except (OSError, ValueError) as e:
            if isinstance(e, DataLossError):   # (not a read that may succeed later)
                _damaged.add(os.path.realpath(path))
            fallback = (f"falling back to {os.path.basename(candidates[i + 1])}"
                        if i + 1 < len(candidates) else "no older checkpoint is left")
            logger.warning("%s; %s", e, fallback)   # (the error names the file)
    if candidates:
        logger.warning("No good checkpoint in %s: %s", model_dir, none_left)
    return None, None


def all_checkpoints(model_dir: str) -> List[str]:
    """Paths of the kept checkpoints (those the index lists), oldest first;
    none when the index cannot be read."""
    try:
        _, kept = _read_index(model_dir)
    except (OSError, ValueError):
        return []
    return [os.path.join(model_dir, n) for n, _ in kept
            if os.path.exists(os.path.join(model_dir, n))]


def checkpoints_on_disk(model_dir: str) -> List[str]:
    """Paths of the checkpoint files in `model_dir`, listed or not, oldest
    first (what restore falls back to when the index is missing or broken)."""
    return [os.path.join(model_dir, n) for n in reversed(_on_disk(model_dir))]


def digest(path: str) -> Optional[str]:
    """The content digest saved beside checkpoint `path` (`"crc32c:<hex>"`),
    which names its content: a checkpoint saved again at a step (training
    started over) has another. None where it has none (copied without it,
    written by TF)."""
    for suffix in _DIGESTS:
        try:
            with open(path + suffix, "rb") as f:
                return suffix[1:] + ":" + f.read().strip().decode("ascii", "replace")
        except FileNotFoundError:
            continue
    return None


def step_of(path: str) -> int:
    """The global step in a checkpoint's file name."""
    m = _CKPT_RE.match(os.path.basename(path))
    if not m:
        raise ValueError(f"{path!r} is not a checkpoint path (expected .../{PREFIX}-<step>)")
    return int(m.group(1))


# -- RNG ------------------------------------------------------------------------
def rng_state() -> dict:
    """The RNG states a checkpoint saves (torch, CUDA, numpy, Python's), for
    `restore_rng`."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": _python_rng(random.getstate()),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "cached_gaussian": float(np_state[4])},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Put back the RNG states saved with a checkpoint."""
    torch.set_rng_state(state["torch"])
    python = state["python"]
    if isinstance(python, dict):
        python = (python["version"], tuple(python["state"].tolist()), python["gauss_next"])
    random.setstate(_tuples(python))   # (checkpoints before: the tuple itself)
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def rng_preserved():
    """The RNG states after the block as they were before it: work that draws
    (building a model whose checkpoint replaces its initial values, an
    evaluation during training) leaves the training's stream as it found it."""
    state = rng_state()
    try:
        yield
    finally:
        restore_rng(state)


def _python_rng(state: tuple) -> dict:
    """`random.getstate()` with its 625 words as one tensor: pickling them one by
    one cost a background save more of the step's interpreter time than the
    model (a tiny one)."""
    version, words, gauss_next = state   # (through numpy: 3x faster than torch.tensor)
    return {"version": version, "state": torch.from_numpy(np.array(words, dtype=np.int64)),
            "gauss_next": gauss_next}


def _tuples(obj):
    return tuple(_tuples(x) for x in obj) if isinstance(obj, (list, tuple)) else obj


# -- save and load ----------------------------------------------------------------
class Saver:
    """Writes checkpoints and keeps the newest `max_to_keep`, plus one every
    `keep_checkpoint_every_n_hours` (tf.compat.v1.train.Saver)."""

    def __init__(self, model_dir: str, max_to_keep: Optional[int] = 5,
                 keep_checkpoint_every_n_hours: float = 10000.0, background: bool = False):
        self.model_dir = model_dir
        self.max_to_keep = max_to_keep
        self._keep_every_secs = keep_checkpoint_every_n_hours * 3600.0
        self._next_keep_time = time.time() + self._keep_every_secs  # as TF's Saver
        self._protected = lambda path: False
        self.background = background
        self._process: Optional[files.WriterProcess] = None
        self._staging: Optional[Staging] = None   # shared with self._process, a fork
        # (plan, sizes, kept) of the background save in flight
        self._pending: Optional[tuple] = None
        # [(name, time)] the index lists, read from disk once, then kept here as
        # TF's Saver keeps its _last_checkpoints (this Saver is the one writer).
        self._kept: Optional[List[Tuple[str, float]]] = None
        self._saved_here = False   # model_dir made or found by a save of this Saver
        self._loadable = False   # a save's content was found loadable with weights_only
        _remove_temp_files(model_dir)

    def protect(self, predicate) -> None:
        """Never delete a checkpoint for which `predicate(path)` is true (e.g. one
        an evaluator has not yet seen)."""
        self._protected = predicate

    def save(self, state: dict, global_step: int, background: Optional[bool] = None,
             finite: Optional[Dict[str, set]] = None) -> str:
        """Write `state` as the checkpoint of `global_step`; returns its path.
        With `finite` ({module name: its buffers' keys}), a state whose
        module or optimizer tensors hold NaN or inf (buffers: NaN) is not
        saved: NotFiniteError, raised here, or for a save staged for the
        writer process (which checks the staged copy) where its errors are.

        With `background` (default: the Saver's), the state's tensors are
        copied here into memory shared with a writer process (a fork of
        this one), which serializes them and writes the checkpoint with the
        same atomicity (temp file, fsync, rename, index last) while training
        goes on; the first save of a Saver (whose content is checked
        loadable) and a state holding tensors that are not plain dense CPU
        ones are serialized here and only written there. A save waits for
        the one before it (at most one in flight, none dropped) and raises
        its error if it failed; `wait()` completes the last one, `close()`
        also ends the writer process. A save the caller waits for anyway
        (the last of a `train` call) is best made with `background=False`:
        starting a writer process only to wait for it costs more than the
        save."""
        if not self._saved_here:
            os.makedirs(self.model_dir, exist_ok=True)
            self._saved_here = True
        elif not os.path.isdir(self.model_dir):
            self._removed(global_step)
        payload = dict(state, rng=rng_state())
        self.wait()
        name = f"{PREFIX}-{global_step}"
        path = os.path.join(self.model_dir, name)
        if _damaged:   # (realpath costs the step 10-20 us a call: only when there are any)
            _damaged.discard(os.path.realpath(path))   # (replaced by this save)
        logger.info("Saving checkpoints for %d into %s.", global_step,   # (TF's words)
                    os.path.join(self.model_dir, PREFIX))
        kept = self._kept if self._kept is not None else self._listed()
        damaged = [n for n, _ in kept if n != name and _is_damaged(self.model_dir, n)
                   ] if _damaged else []
        kept, dropped = self._retain([(n, t) for n, t in kept if n != name and n not in damaged]
                                     + [(name, time.time())])
        dropped += damaged   # (deleted once the index no longer lists them)
        if background is None:
            background = self.background
        index = [("write", os.path.join(self.model_dir, INDEX), _index(name, kept), True)]
        index += [("remove", os.path.join(self.model_dir, old + suffix))
                  for old in dropped for suffix in ("", *_DIGESTS)]
        if background and self._loadable:
            staged = self._staged(payload, path)
            if staged is not None:
                job, tmp = staged
                job += (finite, global_step)
                plan = [("settle", tmp, path, False)] + index
                return self._submit(plan, _sizes(plan), kept, path, job)
        _check_finite(state, finite, global_step)
        # On the step, as a plain loop's torch.save: the bytes into a temp file
        # (the copy training cannot change), their digest computed on the way.
        # Then, here or by the writer process, the digest, the checkpoint made
        # durable and renamed, then the index, whose directory fsync makes the
        # three renames durable (a crash before it leaves the old index, or one
        # naming a file whose rename was lost, which restore_latest passes over
        # to the newest on disk); only then are the files the index no longer
        # names deleted.
        crc = _Crc32c()
        tmp, size = _carry_out(lambda: files.stream_temp(
            path, lambda f: torch.save(payload, f), observe=crc.update), {})
        if not self._loadable:   # (once a Saver: the state's kinds of objects stay)
            self._check_loadable(tmp, payload, global_step)
        plan = [("write", path + DIGEST_SUFFIX, crc.hexdigest().encode(), False),
                ("settle", tmp, path, False)] + index
        sizes = _sizes(plan, {path: size})
        if background and self._writer_process(payload) is not None:
            return self._submit(plan, sizes, kept, path)
        try:
            _carry_out(lambda: files.apply(plan), sizes)
        except BaseException as e:
            self._remove_unlisted(plan, e)
            raise
        self._kept = kept
        return path

    def _submit(self, plan: list, sizes: Dict[str, int], kept, path: str, job=None) -> str:
        """Hand `plan` (with `job`: the staged checkpoint to serialize first)
        to the writer process; the save is then in flight."""
        try:
            _carry_out(lambda: self._process.submit(plan, job), sizes)
        except BaseException as e:
            self._failed(plan, e)
            raise
        self._pending = (plan, sizes, kept)
        return path

    def _staged(self, payload: dict, path: str) -> Optional[Tuple[tuple, str]]:
        """(job, temp file name) of `payload` staged for the writer process
        to serialize into the temp file; None where it holds tensors that are
        not staged (then saved as the first save is) or no writer starts. A
        payload larger than the staging memory has the writer forked again."""
        if self._writer_process(payload) is None:
            return None
        skeleton = self._staging.stage(payload)
        if skeleton is None:
            if Staging.size_of(payload) is None:
                return None
            self._process.close()
            self._process = None
            if self._writer_process(payload) is None:
                return None
            skeleton = self._staging.stage(payload)
            if skeleton is None:   # (tensors pickle reaches that size_of does not)
                return None
        tmp = files.temp_name(path)
        return (skeleton, tmp, path), tmp

    def _check_loadable(self, tmp: str, payload: dict, global_step: int) -> None:
        """Raise UnsafeCheckpointError (removing `tmp`, the save's temp file)
        if the checkpoint would hold objects that `load` refuses: its every
        restore would fail, far from the model_fn that put them there. Read
        back as `load` reads it (its tensors mapped, not read): torch's
        scanner alone misses some (numpy's dtype classes)."""
        try:
            torch.load(tmp, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:   # noqa: BLE001 - any: what load would meet
            unsafe = _refused_globals(e, tmp) or [type(e).__name__]
            files.abandon([("settle", tmp)])
            where = _where(payload, unsafe)
            raise UnsafeCheckpointError(
                f"The checkpoint of step {global_step} is not saved: it would hold Python "
                f"objects of {', '.join(unsafe)}{f' (at {where})' if where else ''}, which a "
                f"checkpoint loads only when allowed{_ALLOW.format(', '.join(unsafe))}. Keep "
                "tensors and plain Python values (numbers, strings, lists, dicts) in the state, "
                "or allow the classes in every process that saves or reads the checkpoints; "
                "the checkpoints already in model_dir are unchanged") from None
        self._loadable = True

    def wait(self) -> None:
        """Complete the save in flight, if any; raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            plan, sizes, kept = pending
            try:
                _carry_out(self._process.result, sizes)
            except BaseException as e:
                self._failed(plan, e)
                raise
            self._kept = kept

    def close(self) -> None:
        """`wait()`, then end the writer process, if any (a later save starts
        another)."""
        try:
            self.wait()
        finally:
            process, self._process, self._staging = self._process, None, None
            if process is not None:
                process.close()

    @property
    def in_flight(self) -> bool:
        """Whether a background save has not been waited for yet."""
        return self._pending is not None

    def check(self) -> None:
        """Raise the error of a finished background save (called every step:
        one attribute test when nothing is in flight, one poll of the writer
        process's answer while a save is)."""
        if self._pending is not None and self._process.answered():
            self.wait()

    def _writer_process(self, payload: dict) -> Optional[files.WriterProcess]:
        """The writer process, forked if need be with staging memory shared
        with it that `payload` fits in (a quarter more: a state may grow a
        little); None, with saves made synchronous and a warning, where no
        process can be forked."""
        if self._process is None:
            size = Staging.size_of(payload) or 0
            try:
                self._staging = staging = Staging(size + size // 4)
                self._process = files.WriterProcess(
                    prepare=lambda job: _serialize(staging, *job), errors=(NotFiniteError,))
            except Exception as e:   # noqa: BLE001 - any: saving on the step still works
                logger.warning("Checkpoints are written on the step: the background writer "
                               "process cannot start (%s: %s)", type(e).__name__, e)
                self._staging, self.background = None, False
                return None
            weakref.finalize(self, self._process.close)
        return self._process

    def _removed(self, global_step: int) -> None:
        """model_dir is gone since the last save (removed while training): fail
        as TF's Saver does, rather than make it again holding only the newest."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._failed(pending[0], FileNotFoundError())
        raise FileNotFoundError(errno.ENOENT, f"model_dir {self.model_dir} no longer exists "
                                f"(removed while training?): the checkpoint of step "
                                f"{global_step} was not saved")

    def _failed(self, plan, error: BaseException) -> None:
        files.abandon(plan)   # its temp file, if the writer process died holding it
        self._remove_unlisted(plan, error)
        if isinstance(error, ChildProcessError):   # the next save starts another
            self._process.close()
            self._process = None

    def _remove_unlisted(self, plan, error: BaseException) -> None:
        """The checkpoint of a save that failed writing the index (a full
        disk), renamed into place but not listed, is removed where the index
        names a checkpoint on disk: restore_latest would never read it, nor a
        Saver delete it, and it would hold its size. (With no such index,
        the files on disk are read: it stays.)"""
        index = os.path.join(self.model_dir, INDEX)
        cause = error.__cause__ if error.__cause__ is not None else error   # (_carry_out's)
        if not any(getattr(e, "filename", None) == index for e in (error, cause)):
            return   # (failed before the rename, or after the index: nothing unlisted)
        path = next(step[2] for step in plan if step[0] == "settle")
        try:
            latest, kept = _read_index(self.model_dir)
        except (OSError, ValueError, UnicodeDecodeError):
            return
        listed = {latest, *(n for n, _ in kept)} - {None}
        if os.path.basename(path) in listed or not any(
                os.path.isfile(os.path.join(self.model_dir, n)) for n in listed):
            return
        for name in (path, *(path + suffix for suffix in _DIGESTS)):
            try:
                os.remove(name)
            except FileNotFoundError:
                pass
            except OSError as e:
                logger.warning("Could not remove %s, a checkpoint no index lists: %s", name, e)

    def _listed(self) -> List[Tuple[str, float]]:
        """What the index on disk lists of `model_dir`'s own checkpoints (one
        elsewhere, `_here`, is another model_dir's: never deleted here);
        nothing if it cannot be read (as TF's Saver, whose get_checkpoint_state
        is then None: the files on disk stay, unlisted, rather than be deleted
        as the oldest, hourly ones with them)."""
        try:
            return [(n, t) for n, t in _read_index(self.model_dir)[1] if not os.path.isabs(n)]
        except (OSError, ValueError, UnicodeDecodeError):
            return []

    def _retain(self, kept):
        """(the entries to keep listed, the names to delete once they are not).
        As TF's Saver, one kept by `keep_checkpoint_every_n_hours` leaves the
        list and stays on disk for good (listed, the next save would judge it
        again and delete it); one protected (not yet evaluated) stays listed."""
        if not self.max_to_keep or len(kept) <= self.max_to_keep:
            return kept, []
        excess, keep = kept[:-self.max_to_keep], kept[-self.max_to_keep:]
        protected, dropped = [], []
        for name, stamp in excess:
            if self._protected(os.path.join(self.model_dir, name)):
                protected.append((name, stamp))   # (judged again once evaluated)
            elif stamp > self._next_keep_time:
                self._next_keep_time += self._keep_every_secs
            else:
                dropped.append(name)
        return protected + keep, dropped


class _Crc32c:
    """The CRC-32C of the pieces `update` is given (DIGEST_SUFFIX's digest)."""

    def __init__(self, data=b""):
        self._value = 0
        self.update(data)

    def update(self, piece) -> None:
        # (numpy's view: google_crc32c takes no memoryview or bytearray, and a
        # copy of each piece would cost what streaming saves)
        self._value = google_crc32c.extend(self._value, np.frombuffer(piece, dtype=np.uint8))

    def hexdigest(self) -> str:
        return "%08x" % self._value


def _sizes(plan: list, sizes: Optional[Dict[str, int]] = None) -> Dict[str, int]:
    """{path: size} of the files `plan` writes (and `sizes`), for its errors."""
    return dict(sizes or {}, **{step[1]: len(step[2]) for step in plan if step[0] == "write"})


def _serialize(staging: Staging, skeleton: bytes, tmp: str, path: str,
               finite: Optional[Dict[str, set]], global_step: int) -> list:
    """In the writer process: the staged checkpoint checked finite (with
    `finite`, see `Saver.save`) and serialized into temp file `tmp` (as
    `Saver.save` does on the step: torch.save streamed, its digest computed
    on the way); the plan's steps writing the digest."""
    torch.set_num_threads(1)   # (a fork's OpenMP pool is not usable; none needed)
    payload = staging.unstage(skeleton)
    _check_finite(payload, finite, global_step)
    crc = _Crc32c()
    files.stream_temp(path, lambda f: torch.save(payload, f), observe=crc.update, tmp=tmp)
    return [("write", path + DIGEST_SUFFIX, crc.hexdigest().encode(), False)]


class NotFiniteError(ValueError):
    """A checkpoint was not saved: tensor `name` of its state (`owner/key`)
    holds NaN or inf (a buffer: NaN) at `global_step`."""

    def __init__(self, name: str, global_step: int):
        super().__init__(name, global_step)
        self.name, self.global_step = name, global_step

    def __str__(self):
        return (f"{self.name} is not finite at global step {self.global_step}: no checkpoint "
                "of it was saved")


def _check_finite(state: dict, finite: Optional[Dict[str, set]], global_step: int) -> None:
    if finite is not None:
        bad = _first_nonfinite(state, finite)
        if bad is not None:
            raise NotFiniteError(bad, global_step)


def _first_nonfinite(state: dict, buffers: Dict[str, set]) -> Optional[str]:
    """The name of the first module or optimizer tensor of a checkpoint's
    contents that shows divergence, or None (checked at save time only):
    NaN or inf in a parameter or an optimizer slot, NaN in a buffer
    (`buffers`: each module's buffer names), where inf may be meant (a causal
    attention mask of -inf, a running maximum's start).

    One sum a tensor and one read back a device: a sum is finite only where
    every value is (NaN or inf in, NaN or inf out), and not NaN where no value
    is; only a sum that fails (or finite values that overflowed it, or a
    buffer's +inf and -inf) has its tensors checked one by one: a 456-tensor
    model with Adam's slots (5 M values) is checked in 2.2 ms instead of
    8.8-9.6 on a CPU, and with one device sync instead of one a tensor."""
    named = list(_floating_tensors(state, buffers))
    sums: Dict[torch.device, Tuple[list, list]] = {}
    for _, value, buffer in named:
        sums.setdefault(value.device, ([], []))[buffer].append(value.sum().double())
    if all(bool(sum(strict, torch.zeros((), dtype=torch.float64)).isfinite()
                & ~sum(lenient, torch.zeros((), dtype=torch.float64)).isnan())
           for strict, lenient in sums.values()):
        return None
    for name, value, buffer in named:
        if bool(value.isnan().any() if buffer else ~torch.isfinite(value).all()):
            return name
    return None


def _floating_tensors(state: dict, buffers: Dict[str, set]):
    """(name, tensor, whether a buffer) of a checkpoint's floating-point
    module and optimizer tensors, in order: `owner/key` with dots as slashes."""
    for kind in ("modules", "optimizers"):
        for owner, sd in state.get(kind, {}).items():
            tensors = sd.items() if kind == "modules" else (
                (f"state/{i}/{slot}", v) for i, slots in sd.get("state", {}).items()
                for slot, v in slots.items())
            owned = buffers.get(owner, ()) if kind == "modules" else ()
            for key, value in tensors:
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    yield f"{owner}/{key.replace('.', '/')}", value, key in owned


def _carry_out(do, sizes: Dict[str, int]):
    """`do()`; a full disk (a file size limit, a file system refusing) is
    said with the checkpoint file (and its size, where known: the
    checkpoint's own is not until it is written) and what is kept."""
    try:
        return do()
    except OSError as e:
        if e.errno == errno.ENOSPC or e.filename is not None:
            size = f" ({sizes[e.filename]} bytes)" if e.filename in sizes else ""
            try:
                latest = e.filename and latest_checkpoint(os.path.dirname(e.filename))
            except OSError:
                latest = None
            kept = (f"the latest checkpoint, {latest}, is unchanged" if latest else
                    "no earlier checkpoint is listed")
            what = os.strerror(e.errno) if e.errno else str(e)
            # (no filename argument: OSError would append it after `kept`)
            raise OSError(e.errno, f"{what} writing the checkpoint {e.filename}{size}; "
                                   f"{kept}") from e
        raise


def _remove_temp_files(model_dir: str) -> None:
    """Temp files of saves interrupted by a crash (kill -9, power loss)."""
    if not os.path.isdir(model_dir):
        return
    stale = [n for n in os.listdir(model_dir) if _TEMP_RE.match(n)]
    for name in stale:
        try:
            os.remove(os.path.join(model_dir, name))
        except OSError:
            pass
    if stale:
        logger.info("Removed %d temp file(s) of interrupted checkpoint saves in %s",
                    len(stale), model_dir)


def pin(path: str, directory: str) -> str:
    """A hard link to checkpoint `path` in `directory` (same name), its digest
    linked beside it, so that a reader in another process keeps the file while
    the chief's Saver deletes the original; a copy where no hard link can be
    made (`directory` on another file system; the file another user's, which
    Linux's protected_hardlinks refuses to link); `path` itself, with a
    warning, where neither can. FileNotFoundError if `path` is already gone.
    `unpin` the link when done."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:   # (a read-only eval dir: said as such, not by this inner name)
        raise OSError(e.errno, f"Cannot make {directory}, where the checkpoints being read "
                               f"are held ({e.strerror}): {os.path.dirname(directory)} must "
                               f"be writable") from e
    link = os.path.join(directory, os.path.basename(path))
    unpin(link, path)   # (left by a killed reader)
    pairs = [(path + s, link + s) for s in _DIGESTS if os.path.isfile(path + s)]
    try:   # the digest first: the file is never there without it
        for source, target in pairs + [(path, link)]:
            os.link(source, target)
        return link
    except FileNotFoundError:
        unpin(link, path)
        if not os.path.exists(path):
            raise
    except OSError as e:
        unpin(link, path)
        if not _copying.get(directory):
            _copying[directory] = True
            logger.info("Checkpoints are copied into %s while they are read (no hard link to "
                        "%s: %s)", directory, path, e.strerror or e)
    try:   # (a file the chief deletes while it is copied stays readable to the end)
        for source, target in pairs + [(path, link)]:
            _copy(source, target)
        return link
    except FileNotFoundError:
        unpin(link, path)
        raise
    except OSError as e:
        unpin(link, path)
        logger.warning("Checkpoint %s is read in place: it can neither be linked nor copied "
                       "into %s (%s), so the chief may delete it before it is read (keep more "
                       "checkpoints: RunConfig(keep_checkpoint_max=...))", path, directory,
                       e.strerror or e)
        return path


_copying: Dict[str, bool] = {}   # pin directories told that checkpoints are copied there


def _copy(source: str, target: str) -> None:
    """Copy `source` to `target` with its modification time (which the
    evaluator compares with its summaries')."""
    with open(source, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
        stat = os.fstat(src.fileno())
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def unpin(link: str, path: str) -> None:
    """Remove what `pin(path, ...)` returned (nothing when it was `path`)."""
    if link != path:
        for name in (link, *(link + suffix for suffix in _DIGESTS)):
            if os.path.lexists(name):
                os.remove(name)


def load(path: str) -> dict:
    """Load a checkpoint file safely (weights_only=True), its content digest
    checked when it has one; a damaged file is a DataLossError naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Checkpoint {path!r} " + (
            "is a directory, not a checkpoint file" if os.path.isdir(path) else "does not exist"))
    with open(path, "rb") as f:
        data = f.read()
    for suffix, digest in _DIGESTS.items():
        if not os.path.isfile(path + suffix):
            continue
        with open(path + suffix, "rb") as f:
            want = f.read().strip().decode("ascii", "replace")
        if digest(data) != want:
            raise DataLossError(f"Checkpoint {path!r} is damaged: its content does not match "
                                f"the digest saved with it ({os.path.basename(path)}{suffix})")
        break
    else:   # (copied without it, or deleted): said once a file
        if os.path.realpath(path) not in _unchecked:
            _unchecked.add(os.path.realpath(path))
            logger.warning("Checkpoint %s has no digest beside it (%s%s): its content is "
                           "loaded unchecked", path, os.path.basename(path), DIGEST_SUFFIX)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, foreign or unsafe content
        unsafe = _refused_globals(e, io.BytesIO(data))
        if unsafe:
            raise UnsafeCheckpointError(
                f"Checkpoint {path!r} holds Python objects of {', '.join(unsafe)}, which a "
                f"checkpoint loads only when allowed{_ALLOW.format(', '.join(unsafe))} before "
                "it is read (training, evaluating, predicting or exporting). The checkpoint is "
                "not damaged and is left as it is") from None
        reason = " ".join(line for line in str(e).splitlines()[:1]
                          if "weights_only" not in line) or type(e).__name__
        raise DataLossError(f"Checkpoint {path!r} cannot be read: it is truncated, damaged or "
                            f"not a checkpoint of this library ({reason})") from None


_unchecked: set = set()   # checkpoints loaded without a digest, said once

_ALLOW = (" (checkpoints are read with torch.load(weights_only=True), so that a checkpoint "
          "cannot run code); to allow classes of your own, where you trust the checkpoint's "
          "source, call torch.serialization.add_safe_globals([{}])")


def _refused_globals(error: Exception, file) -> List[str]:
    """The classes and functions (`module.name`) a checkpoint file (a path or
    a file object) names that `torch.load(weights_only=True)` refused with
    `error`: those torch's scanner finds, and the one the error names (the
    scanner misses numpy's dtype classes); none for a file that cannot be
    read as torch.save's format (damage, for `load`)."""
    try:
        found = set(torch.serialization.get_unsafe_globals_in_checkpoint(file))
    except Exception:   # noqa: BLE001 - any: not a readable checkpoint
        return []
    named = re.findall(r"Unsupported global: GLOBAL ([\w.]+)|allowlisted via `add_safe_globals`"
                       r", but got <class '([\w.]+)'>", str(error))
    return sorted(found | {a or b for a, b in named})


def _where(state, names: List[str], at: str = "") -> str:
    """Where in `state` (as `modules['net']['_extra_state']`) the first object
    of a class (or a class or function itself) named in `names` lies ("" if
    none is found: one inside another object, a numpy array's dtype)."""
    kind = state if isinstance(state, type) or callable(state) else type(state)
    if f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', '')}" in names:
        return at or "the top"
    if isinstance(state, dict):
        items = ((f"[{k!r}]", v) for k, v in state.items())
    elif isinstance(state, (list, tuple, set, frozenset)):
        items = ((f"[{i}]", v) for i, v in enumerate(state))
    else:
        return ""
    for key, value in items:
        found = _where(value, names, at + key)
        if found:
            return found + (", a module's get_extra_state()"
                            if not at and "['_extra_state']" in found else "")
    return ""


def resolve(path_or_dir: str) -> str:
    """A checkpoint file from a file path or a model_dir (its latest); an error if none."""
    if os.path.isdir(path_or_dir):
        latest = latest_checkpoint(path_or_dir)
        if latest is None:
            raise ValueError(f"No checkpoint found in directory {path_or_dir!r}")
        return latest
    if not os.path.isfile(path_or_dir):
        raise ValueError(f"Checkpoint {path_or_dir!r} does not exist")
    return path_or_dir


def optimizer_kind(optimizer) -> str:
    """The optimizer's class as checkpoints record it (`torch.optim.adam.Adam`)."""
    return f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"


def missing_slots(optimizer, state: dict, kind: Optional[str]) -> List[str]:
    """The state `optimizer` keeps for a variable that `state` (a checkpoint's
    optimizer state_dict, of an optimizer of class `kind`) lacks: NAdam's
    `mu_product` from an Adam's, an Adam's `max_exp_avg_sq` with amsgrad
    turned on, each a bare KeyError at the first step. Found by one step of
    copies over a one-number variable: of this optimizer's class and settings
    against the checkpoint's state, or, where the class is the same, against
    the checkpoint's settings (an AdamW takes an Adam's state; [] where no
    copy can be made). `kind` None: an earlier version's checkpoint, which did
    not record it, taken as another class's. The copies are of the variable
    of the checkpoint's first state entry: its group's settings, its shape
    (Adafactor keeps row and column variances of a matrix)."""
    entries = state.get("state", {})
    if not entries:
        return []
    index, saved = next(iter(entries.items()))
    params = [(g, p) for g in optimizer.param_groups for p in g["params"]]
    group, param = params[index] if isinstance(index, int) and index < len(params) \
        else (optimizer.param_groups[0], None)
    shape = tuple(param.shape) if param is not None else (1,)
    if kind is None or kind != optimizer_kind(optimizer):
        return sorted((_slots_of(optimizer, group, shape) or set()) - set(saved))
    missing = set()   # what the new settings keep, the old did not, and the state lacks
    for group, before in zip(optimizer.param_groups, state.get("param_groups", [])):
        if _differ(before, group, optimizer.defaults):
            missing |= (_slots_of(optimizer, group) or set()) - (
                _slots_of(optimizer, before) or set(saved)) - set(saved)
    return sorted(missing)


def setting_changes(optimizer, state: dict) -> Dict[str, tuple]:
    """{setting: (the checkpoint's, this optimizer's)} of the first param group
    where `optimizer` (of the checkpoint's class) is set otherwise."""
    for group, before in zip(optimizer.param_groups, state.get("param_groups", [])):
        changed = _differ(before, group, optimizer.defaults)
        if changed:
            return changed
    return {}


def _differ(before: dict, group: dict, defaults: dict) -> Dict[str, tuple]:
    return {k: (before.get(k, v), group.get(k, v)) for k, v in defaults.items()
            if not _equal(before.get(k, v), group.get(k, v))}


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:   # noqa: BLE001 - (tensors of several numbers): compared whole
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)


def _slots_of(optimizer, settings: dict, shape: tuple = (1,)) -> Optional[set]:
    """The state keys `optimizer`'s class keeps for a variable of `shape`
    under `settings` (None where a copy cannot be made or stepped). Only the
    settings its constructor takes are given (AdamW's defaults hold a
    `decoupled_weight_decay` it sets itself)."""
    try:
        taken = inspect.signature(type(optimizer).__init__).parameters
        probe = torch.nn.Parameter(torch.zeros(shape))
        copy = type(optimizer)([probe], **{k: settings.get(k, v)
                                           for k, v in optimizer.defaults.items()
                                           if k in taken or "kwargs" in taken})
        probe.grad = torch.zeros(shape)
        copy.step()
    except Exception:   # noqa: BLE001 - (a closure needed, another constructor): not told
        return None
    return set(copy.state[probe])


def rounded_by_cast(value: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether `value` cast to `dtype` loses anything (a float32 weight put
    into a bfloat16 module). TF refuses to restore a variable into another
    dtype ("expected dtype bfloat16 does not equal original dtype float");
    here a cast that keeps every value (bfloat16 into float32) is let through."""
    if value.dtype == dtype:
        return False
    if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool) \
            and value.numel() and not value.is_complex():   # (int8 -3 as uint8 is 253)
        info = torch.iinfo(dtype)
        if value.min().item() < info.min or value.max().item() > info.max:
            return True
    back = value.to(dtype).to(value.dtype)
    if value.is_floating_point() or value.is_complex():
        return not torch.isclose(back, value, rtol=0, atol=0, equal_nan=True).all()
    return not torch.equal(back, value)


def flat_variables(state: dict) -> Dict[str, torch.Tensor]:
    """Flatten a checkpoint into TF-style variable names -> tensors."""
    out: Dict[str, torch.Tensor] = {}
    for owner, sd in state.get("modules", {}).items():   # (metrics: earlier versions saved
        for key, value in sd.items():                       # their running state; TF's never)
            out[var_name(owner, key)] = value
    for owner, sd in state.get("optimizers", {}).items():
        var_names = state.get("optimizer_var_names", {}).get(owner, [])
        for index, slots in sd.get("state", {}).items():
            var = var_names[index] if index < len(var_names) else f"param_{index}"
            for slot, value in slots.items():
                if isinstance(value, torch.Tensor):
                    out[f"{owner}/{var}/{slot}"] = value
    for owner, sd in state.get("grad_scalers", {}).items():   # (TF: current_loss_scale, good_steps)
        if sd:
            out[f"{owner}/scale"] = torch.tensor(sd["scale"], dtype=torch.float32)
            out[f"{owner}/growth_tracker"] = torch.tensor(sd["_growth_tracker"], dtype=torch.int64)
    out["global_step"] = torch.tensor(state["global_step"], dtype=torch.int64)
    return out


def list_variables(ckpt_dir_or_file: str) -> List[Tuple[str, List[int]]]:
    """[(name, shape)] of every variable in a checkpoint (tf.train.list_variables);
    a TF checkpoint (a prefix, or a TF model_dir) too."""
    prefix = tf_checkpoint.find_prefix(ckpt_dir_or_file)
    if prefix is not None:
        return [(n, list(shape)) for n, (_, shape)
                in tf_checkpoint.TFCheckpointReader(prefix).variables().items()]
    variables = flat_variables(load(resolve(ckpt_dir_or_file)))
    return sorted((n, list(v.shape)) for n, v in variables.items())


def load_variable(ckpt_dir_or_file: str, name: str):
    """One variable's value as numpy (tf.train.load_variable), a scalar as a
    numpy scalar (`global_step`: np.int64), as TF's; from a TF checkpoint too."""
    prefix = tf_checkpoint.find_prefix(ckpt_dir_or_file)
    if prefix is not None:
        try:
            value = np.asarray(tf_checkpoint.TFCheckpointReader(prefix).tensor(name))
        except KeyError as e:
            raise ValueError(e.args[0]) from None
    else:
        variables = flat_variables(load(resolve(ckpt_dir_or_file)))
        if name not in variables:
            raise ValueError(f"Variable {name!r} not found in checkpoint {ckpt_dir_or_file!r}; "
                             f"it has {sorted(variables)}")
        value = to_numpy(variables[name])
    return value[()] if value.ndim == 0 else value
