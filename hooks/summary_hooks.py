"""TensorBoard summary hooks (tf.estimator's SummarySaverHook, StepCounterHook)
and the writer cache they share with evaluation (tf.compat.v1.summary.FileWriterCache).

Event files are written with `torch.utils.tensorboard.SummaryWriter`. A hook
opens its writer at its first write (so a run that writes nothing leaves no
event file) and flushes it at `end`. As TF's, a process writes one event file
per directory: the writer a run lets go stays open for the next run there
(the 16 directories used last keep theirs; TF keeps every one).
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import glob
import logging
import numbers
import os
import re
import threading
import time
from typing import Dict, Optional, Set

import numpy as np

from . import summary as _summary

from .basic_session_run_hooks import BEFORE_SAVE, SecondOrStepTimer
from .event_files import EVENT_FILE_PATTERN
from .scaffold import check_scaffold
from .session_run_hook import SessionRunArgs, SessionRunHook

logger = logging.getLogger(__name__)


class SummaryWriterCache:
    """One `SummaryWriter` per log directory (tf.compat.v1.summary.FileWriterCache).

    `get(logdir)` returns the shared writer, kept open until `clear()` (or
    exit). Hooks and evaluation take a writer for the length of a run and
    flush it at the run's end, so event files are complete on disk when
    `train`/`evaluate` returns; the writer then waits, open, for the next
    run in its directory (one event file per directory and process, as TF's
    FileWriterCache), closed when `_KEEP_IDLE` directories used since are
    waiting too. A forked child starts with none: the parent's writer
    threads do not exist there.
    """

    _lock = threading.Lock()
    _writers: Dict[str, object] = {}
    _users: Dict[str, int] = {}       # runs holding each writer
    _pinned: Set[str] = set()         # opened by get(): kept until clear()
    _KEEP_IDLE = 16
    _idle: "collections.OrderedDict[str, None]" = collections.OrderedDict()   # oldest first
    _inherited: list = []             # a forked child's copies of the parent's writers
    # Scalars the hooks write, held back and handed to the writer together:
    # each hand-over wakes the event file's writer thread, which then competes
    # with the training thread for the GIL (measured: ~4 us per training step
    # of a tiny model when handed over every 100 steps).
    _HOLD_EVENTS, _HOLD_SECS = 64, 5.0
    _held: Dict[str, list] = {}       # logdir -> [(tag, value, step, walltime)]

    @classmethod
    def get(cls, logdir: str):
        """The SummaryWriter for `logdir`, created (with the directory) on first use."""
        with cls._lock:
            key = os.path.abspath(logdir)
            cls._pinned.add(key)
            return cls._open(key)

    @classmethod
    def clear(cls) -> None:
        """Flush and close every cached writer (at exit too: a writer that
        cannot write, the disk full, is logged and the others closed)."""
        try:
            cls._write_held()
        except OSError as e:
            logger.error("%s", e)
        with cls._lock:
            writers = list(cls._writers.values())
            cls._writers.clear()
            cls._users.clear()
            cls._pinned.clear()
            cls._idle.clear()
        for writer in writers:
            _close_logging_errors(writer)

    # -- for hooks and evaluation -------------------------------------------------
    @classmethod
    def _acquire(cls, logdir: str):
        with cls._lock:
            key = os.path.abspath(logdir)
            writer = cls._open(key)
            cls._users[key] += 1
            return writer

    @classmethod
    def _hold_scalar(cls, key: str, tag: str, value: float, step: int) -> None:
        """Write scalar `tag` into the writer of `key` (an absolute logdir) soon:
        with the scalars of the next few steps, within `_HOLD_SECS`, and in any
        case when the writer is released or the session ends."""
        now = time.time()
        held = cls._held.setdefault(key, [])
        held.append((tag, value, step, now))
        if len(held) >= cls._HOLD_EVENTS or now - held[0][3] >= cls._HOLD_SECS:
            cls._write_held(key)

    @classmethod
    def _write_held(cls, key: Optional[str] = None, flush: bool = False) -> None:
        """Hand the held scalars (of `key`, default all) to their writers, and
        with `flush` make those writers write them to disk (with no `key`:
        every writer a run holds, what model_fn's summaries wrote included)."""
        with cls._lock:
            keys = list(cls._held) if key is None else [key]
            batches = [(cls._writers.get(k), cls._held.pop(k, ())) for k in keys]
            in_use = [w for k, w in cls._writers.items() if cls._users.get(k) or k in cls._pinned] \
                if flush and key is None else []
        for writer, held in batches:
            if writer is not None and held:
                for tag, value, step, walltime in held:
                    _summary._write_scalar(writer, tag, value, step, walltime)
                if flush and writer not in in_use:
                    writer.flush()
        for writer in in_use:
            writer.flush()

    @classmethod
    def _write_held_of(cls, writer) -> None:
        """Hand its held scalars to `writer`, if it is a cached writer (one a
        hook acquired, or the user's from `get`)."""
        with cls._lock:
            keys = [k for k, w in cls._writers.items() if w is writer and k in cls._held]
        for key in keys:
            cls._write_held(key)

    @classmethod
    def _release(cls, logdir: str) -> None:
        """Flush; when this was the last run holding it and `get` did not pin
        it, keep it open for the next run in `logdir`, and close the writer
        that has waited longest if more than `_KEEP_IDLE` are waiting."""
        cls._write_held(os.path.abspath(logdir))
        evicted = None
        with cls._lock:
            key = os.path.abspath(logdir)
            writer = cls._writers.get(key)
            if writer is None:
                return
            cls._users[key] -= 1
            if cls._users[key] <= 0 and key not in cls._pinned:
                cls._idle[key] = None
                if len(cls._idle) > cls._KEEP_IDLE:
                    oldest = cls._idle.popitem(last=False)[0]
                    evicted = cls._writers.pop(oldest)
                    del cls._users[oldest]
        try:
            writer.flush()
        except BaseException:
            cls._drop(key, writer)   # broken (a full disk): the next run opens another
            raise
        finally:
            if evicted is not None:
                _close_logging_errors(evicted)

    @classmethod
    def _drop(cls, key: str, writer) -> None:
        """Close `writer` quietly (its error is being raised), uncached if no run holds it."""
        with cls._lock:
            if cls._writers.get(key) is writer and key in cls._idle:
                del cls._writers[key], cls._users[key], cls._idle[key]
            else:
                return
        try:
            writer.close()
        except OSError:
            pass

    @classmethod
    def _forget_inherited(cls) -> None:
        """In a forked child: the parent's writers are kept (never used,
        flushed or closed: their threads are not here), the cache starts empty."""
        cls._lock = threading.Lock()
        cls._inherited.extend(cls._writers.values())
        cls._writers, cls._users, cls._pinned = {}, {}, set()
        cls._idle, cls._held = collections.OrderedDict(), {}

    @classmethod
    def _open(cls, key: str):
        writer = cls._writers.get(key)
        if writer is not None and key in cls._idle:
            del cls._idle[key]
            if not _file_is_newest(writer):
                # removed while it waited, or another process (replicas of a
                # MirroredStrategy) began a file after it there: a new file, as
                # if the process had started again, which TensorBoard reads
                # after theirs (a SessionLog START in theirs would drop what
                # this one wrote past its step). TF's writes on, into the file.
                del cls._writers[key], cls._users[key]
                _close_logging_errors(writer)
                writer = None
        if writer is None:
            _after_newest_second(key)
            from torch.utils.tensorboard import SummaryWriter
            # A deep queue: the writer thread drains it when the training thread
            # lets go of the GIL, instead of a step blocking on a full queue.
            with _naming_errors(key):
                # (where the directory cannot be written, said here: tensorboard's
                # writer thread would first print its own traceback of it)
                os.makedirs(key, exist_ok=True)
                if not os.access(key, os.W_OK | os.X_OK):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), key)
                writer = SummaryWriter(log_dir=key, max_queue=1000)
            file_writer = writer._get_file_writer()
            file_writer.event_writer = _NamingErrors(file_writer.event_writer, key)
            cls._writers[key] = writer
            cls._users[key] = 0
        return writer


def _close_logging_errors(writer) -> None:
    """Close a cached writer no run holds (its run has returned): an error
    (a full disk) is logged, not raised into a run in another directory."""
    try:
        writer.close()
    except OSError as e:
        logger.error("%s", e)


def _after_newest_second(directory: str) -> None:
    """Wait, if need be (at most a second), for the clock's next second: an
    event file's name begins with the second it was made in, and TensorBoard
    reads a directory's files in name order, so a file begun in the second of
    the newest one there (replicas that just trained) would sort by host and
    pid (as text) and could be read before it."""
    seconds = [int(m.group(1)) for m in (
        re.match(r"events\.out\.tfevents\.(\d+)\.", os.path.basename(name))
        for name in _event_files(directory)) if m]
    wait = max(seconds, default=0) + 1 - time.time()
    if 0 < wait <= 1:
        time.sleep(wait)


def _file_is_newest(writer) -> bool:
    """Whether `writer`'s event file is still there and the last of its
    directory's in TensorBoard's reading order (by name)."""
    name = getattr(writer._get_file_writer().event_writer, "_file_name", None)
    if name is None:   # (a tensorboard that names it otherwise: the directory, at least)
        return os.path.isdir(writer.log_dir)
    if not os.path.exists(name):
        return False
    return max(_event_files(os.path.dirname(name))) == name


def _event_files(directory: str) -> list:
    return glob.glob(os.path.join(glob.escape(directory), EVENT_FILE_PATTERN))


@contextlib.contextmanager
def _naming_errors(logdir: str):
    """An OSError (ENOSPC: a full disk) as one naming the summaries' directory."""
    try:
        yield
    except OSError as e:
        blocking = _file_in_the_way(logdir) if e.errno in (errno.EEXIST, errno.ENOTDIR) else None
        raise OSError(e.errno, f"{e.strerror or e} writing the summaries in {logdir}" + (
            f" ({blocking} is a file, not a directory)" if blocking else "")) from e


def _file_in_the_way(path: str) -> Optional[str]:
    """The file where `path` or one of the directories above it should be."""
    while path and path != os.path.dirname(path):
        if os.path.isfile(path):
            return path
        path = os.path.dirname(path)
    return None


class _NamingErrors:
    """A SummaryWriter's event file writer whose errors name the directory:
    its thread's error (a full disk) surfaces at the next write, flush or
    close, as the bare OSError of a file it does not name."""

    def __init__(self, event_writer, logdir: str):
        self._writer, self._logdir = event_writer, logdir

    def add_event(self, event) -> None:
        with _naming_errors(self._logdir):
            self._writer.add_event(event)

    def flush(self) -> None:
        with _naming_errors(self._logdir):
            self._writer.flush()

    def close(self) -> None:
        with _naming_errors(self._logdir):
            self._writer.close()

    def __getattr__(self, name):
        return getattr(self._writer, name)


atexit.register(SummaryWriterCache.clear)
BEFORE_SAVE.append(lambda: SummaryWriterCache._write_held(flush=True))   # (every summary so far)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SummaryWriterCache._forget_inherited)


class _WritesSummaries(SessionRunHook):
    """A hook that writes to `summary_writer`, or to the cached writer of
    `output_dir` opened at its first write and released at `end`."""

    def __init__(self, what: str, output_dir: Optional[str], summary_writer):
        if summary_writer is not None and not hasattr(summary_writer, "_get_file_writer"):
            raise TypeError(f"{what}: summary_writer must be a "
                            "torch.utils.tensorboard.SummaryWriter, got "
                            f"{type(summary_writer).__name__}")
        if output_dir is not None and not isinstance(output_dir, (str, os.PathLike)):
            raise TypeError(f"{what}: output_dir must be a path, got {output_dir!r}")
        self._output_dir = None if output_dir is None else os.fspath(output_dir)
        self._given_writer = summary_writer
        self._acquired = None

    def _writer(self):
        if self._given_writer is not None:
            return self._given_writer
        if self._acquired is None and self._output_dir:
            self._acquired = SummaryWriterCache._acquire(self._output_dir)
            self._key = os.path.abspath(self._output_dir)
        return self._acquired

    def _write_scalar(self, tag: str, value: float, step: int) -> None:
        """A scalar event: held back briefly with others when the writer is
        the cached one of `output_dir`, at once to a writer the user gave."""
        writer = self._writer()
        if writer is self._given_writer:
            _summary._write_scalar(writer, tag, value, step)
        else:
            SummaryWriterCache._hold_scalar(self._key, tag, value, step)

    def _has_writer(self) -> bool:
        return self._given_writer is not None or bool(self._output_dir)

    def end(self, session):
        self.settle()
        if self._given_writer is not None:
            self._given_writer.flush()

    def settle(self) -> None:
        """Also after an error (which skips `end`, as TF's): the cached writer
        is let go (its held scalars written; closed with its last user), so a
        failed run leaves no writer thread behind."""
        if self._acquired is not None:
            self._acquired = None
            SummaryWriterCache._release(self._output_dir)


class SummarySaverHook(_WritesSummaries):
    """Writes the summaries every N steps or seconds (tf.estimator.SummarySaverHook).

    On a due step it fetches "summaries" (what `est.summary.*` recorded in
    the model_fn on that step) and writes every record, and under the
    Estimator the scalar `loss` (unless the model_fn recorded a `loss`
    itself: TF's Estimator adds its own only then; a custom loop's
    MonitoredTrainingSession adds none, as TF's) at the global step after the step
    (1, 1 + N, 1 + 2N, ... from a fresh start), after TF's SessionLog START
    at the first (TensorBoard then drops what an interrupted run wrote past
    it). `summary_op` (TF: the summary tensor
    to run) here names the tags to write, a string or a list; default all;
    `est.summary.merge_all()` (TF's, made in the model_fn) every summary the
    model_fn records, without the Estimator's `loss`.
    `scaffold` is accepted empty (one with a part set, its `summary_op`,
    is refused: `hooks.scaffold`). The Estimator adds this hook on the
    chief only.
    """

    def __init__(self, save_steps: Optional[int] = None, save_secs: Optional[float] = None,
                 output_dir: Optional[str] = None, summary_writer=None, scaffold=None,
                 summary_op=None):
        if (save_steps is None) == (save_secs is None):
            raise ValueError("SummarySaverHook: exactly one of save_steps and save_secs must "
                             f"be given, got save_steps={save_steps}, save_secs={save_secs}")
        if scaffold is not None and summary_op is not None:
            raise ValueError("SummarySaverHook: give at most one of scaffold or summary_op")
        check_scaffold(scaffold, "SummarySaverHook")
        super().__init__("SummarySaverHook", output_dir, summary_writer)
        if not self._has_writer():
            raise ValueError("SummarySaverHook: one of output_dir or summary_writer "
                             "must be given")
        self._tags = _tag_set(summary_op)
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._fetches = {"summaries": "summaries"}
        wants_loss = summary_op is None or "loss" in (self._tags or ())
        self._fetches_loss = dict(self._fetches, loss="loss") if wants_loss else self._fetches
        self._due = False
        self._started = False

    def begin(self):
        self._timer.reset()
        self._started = False

    def before_run(self, run_context):
        session = run_context.session
        self._due = self._timer.should_trigger_for_step(session.global_step + 1)
        if not self._due:
            return None
        return SessionRunArgs(self._fetches_loss if session.scope.loss_summary else self._fetches)

    def after_run(self, run_context, run_values):
        if not self._due:
            return
        self._due = False
        results = run_values.results
        step = run_context.session.global_step
        self._timer.update_last_triggered_step(step)
        writer = self._writer()
        if not self._started:   # TF's SessionLog START, at the session's first step
            self._started = True
            _summary._write_session_start(writer, step)
        records = results["summaries"]
        if records or writer is self._given_writer:   # the held ones first: step order
            SummaryWriterCache._write_held_of(writer)
        # TF's Estimator adds its `loss` summary only where the model_fn wrote none
        if "loss" in results and not any(record.tag == "loss" for record in records):
            self._write_scalar("loss", results["loss"], step)
        tags = self._tags
        for record in records:
            if tags is None or record.tag in tags:
                _summary._write(writer, record, step)

    def _idle(self, session):
        return self._timer._idle()


class StepCounterHook(_WritesSummaries):
    """Logs and writes training speed, `global_step/sec`, every N steps or
    seconds (tf.estimator.StepCounterHook). It fetches nothing: the global
    step is known on the host, so it never waits on the device (the rate
    counts steps issued, which the device queue keeps in step with the
    device). Written only when `output_dir` or `summary_writer` is given."""

    def __init__(self, every_n_steps: Optional[int] = 100, every_n_secs: Optional[float] = None,
                 output_dir: Optional[str] = None, summary_writer=None):
        if (every_n_steps is None) == (every_n_secs is None):
            raise ValueError("StepCounterHook: exactly one of every_n_steps and every_n_secs "
                             f"should be provided, got every_n_steps={every_n_steps}, "
                             f"every_n_secs={every_n_secs}")
        super().__init__("StepCounterHook", output_dir, summary_writer)
        self._timer = SecondOrStepTimer(every_steps=every_n_steps, every_secs=every_n_secs)
        self._summary_tag = "global_step/sec"

    def begin(self):
        self._timer.reset()

    def after_run(self, run_context, run_values):
        step = run_context.session.global_step
        if self._timer.should_trigger_for_step(step):
            elapsed_secs, elapsed_steps = self._timer.update_last_triggered_step(step)
            if elapsed_secs is not None and elapsed_secs > 0 and elapsed_steps > 0:
                self._log_and_record(elapsed_steps, elapsed_secs, step)

    def _idle(self, session):
        return self._timer._idle()

    def _log_and_record(self, elapsed_steps: int, elapsed_time: float, global_step: int):
        steps_per_sec = elapsed_steps / elapsed_time
        if self._has_writer():
            self._write_scalar(self._summary_tag, steps_per_sec, global_step)
        logger.info("%s: %g", self._summary_tag, steps_per_sec)


def _tag_set(summary_op):
    if summary_op is None or summary_op is _summary.MERGED:
        return None
    tags = [summary_op] if isinstance(summary_op, str) else summary_op
    if not isinstance(tags, (list, tuple, set)) or not tags \
            or not all(isinstance(t, str) and t for t in tags):
        raise TypeError("SummarySaverHook: summary_op names the tags to write, a string or a "
                        f"non-empty list of strings; got {summary_op!r}")
    return frozenset(tags)


def write_dict_to_summary(output_dir: str, dictionary: dict, current_global_step: int,
                          checkpoint_path: Optional[str] = None) -> None:
    """Write the numeric entries of `dictionary` (evaluation results) as
    scalars at `current_global_step` into `output_dir`, tags = keys, skipping
    `global_step`, numeric arrays as tensor summaries (tf.estimator's
    _write_dict_to_summary); and the evaluated
    `checkpoint_path` as a string tensor tagged `checkpoint_path`
    (_write_checkpoint_path_to_summary; without a plugin, as TF's: for
    programs reading the eval events, not a TensorBoard dashboard)."""
    writer = SummaryWriterCache._acquire(output_dir)
    try:
        for key, value in sorted(dictionary.items()):
            if key == "global_step":
                continue
            if isinstance(value, (numbers.Real, np.number)) and not isinstance(value, np.ndarray):
                _summary._write_scalar(writer, key, value, current_global_step)
            elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                # TF's: a tensor summary (no plugin: TensorBoard does not draw it)
                _summary._add_summary(writer, _tensor_summary(key, value), current_global_step)
            else:
                logger.warning("Skipping summary for %s, must be a number (int or float, "
                               "numpy included), got %s.", key, type(value).__name__)
        if checkpoint_path is not None:
            _summary._add_summary(writer, _string_summary("checkpoint_path", checkpoint_path),
                                  current_global_step)
    finally:
        SummaryWriterCache._release(output_dir)


def _tensor_summary(tag: str, array: np.ndarray):
    """A Summary of one numeric tensor (TF's make_tensor_proto of an ndarray result)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.util.tensor_util import make_tensor_proto
    return Summary(value=[Summary.Value(tag=tag, node_name=tag,
                                        tensor=make_tensor_proto(array))])


def _string_summary(tag: str, text: str):
    """A Summary of one string scalar tensor (TF's make_tensor_proto(text, tf.string))."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.compat.proto.types_pb2 import DT_STRING
    tensor = TensorProto(dtype=DT_STRING, tensor_shape=TensorShapeProto(),
                         string_val=[text.encode()])
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor)])

