"""One trainer per model_dir: the chief holds a lock on its model_dir while it
trains (TF has none: two jobs launched on one model_dir, or a restarted chief
whose old process still runs, silently overwrite each other's checkpoints and
summaries, and a resume mixes their states).

The lock is a POSIX record lock on `model_dir/.training.lock`, a file that
names its holder and is removed when training ends: released by the system
when the holder dies, kill -9 included (the file then stays behind, unlocked),
not inherited by forked children (DataLoader workers), and honoured over NFS.
A second trainer waits up to `WAIT_SECS` (for a preempted chief finishing its
save, a terminating pod), then fails naming the holder.
Where locks are unsupported (a filesystem without them, no `fcntl`),
training goes on with a warning.

`EvaluationLock` is the same for the evaluator task and its eval dir: two
evaluators of one model_dir wrote each evaluation twice and removed the
checkpoints the other held for its exports.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import time
import weakref
from typing import NamedTuple, Optional

try:
    import fcntl
except ImportError:   # (no POSIX locks: train without one)
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_FILE = ".training.lock"
EVAL_LOCK_FILE = ".evaluation.lock"
WAIT_SECS = 60.0    # the longest a second trainer waits for the first to end
_POLL_SECS = 0.2
_held: set = set()   # the lock files this process holds (their real paths)


class _Kind(NamedTuple):
    """A lock's file and what its messages say ({dir}: the directory)."""
    lock_file: str
    busy: str        # "<dir> ... by another process (holder)"
    harm: str
    instead: str
    resumed: str
    unlocked: str


_TRAINING = _Kind(
    LOCK_FILE, "model_dir {dir} is being trained",
    "two trainers writing one model_dir overwrite each other's checkpoints",
    "train into another model_dir", "model_dir {dir}: the other process ended; training",
    "Training into {dir} without a lock ({error}): another process training into it at the "
    "same time would not be noticed")
_EVALUATION = _Kind(
    EVAL_LOCK_FILE, "eval dir {dir} is being written",
    "two evaluators of one model_dir write each evaluation twice and remove the checkpoints "
    "the other holds", "give this evaluator's EvalSpec another name",
    "eval dir {dir}: the other process ended; evaluating",
    "Evaluating into {dir} without a lock ({error}): another evaluator writing it at the "
    "same time would not be noticed")


class _DirectoryLock:
    """The lock on `directory`, held from construction (after waiting for
    another holder, up to `wait_secs`) until `release()` (or until this
    object is collected)."""

    def __init__(self, directory: str, kind: _Kind, wait_secs: Optional[float]):
        self.directory = directory
        path = os.path.join(directory, kind.lock_file)
        self._fd = _acquire(path, WAIT_SECS if wait_secs is None else wait_secs, kind)
        self._finalizer = weakref.finalize(self, _release, path, self._fd)

    @property
    def held(self) -> bool:
        return self._finalizer.alive and self._fd is not None

    def release(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class TrainingLock(_DirectoryLock):
    """The chief's lock on its model_dir (`model_dir/.training.lock`)."""

    def __init__(self, model_dir: str, wait_secs: Optional[float] = None):
        super().__init__(model_dir, _TRAINING, wait_secs)


class EvaluationLock(_DirectoryLock):
    """The evaluator task's lock on its eval dir (`eval_dir/.evaluation.lock`)."""

    def __init__(self, eval_dir: str, wait_secs: Optional[float] = None):
        super().__init__(eval_dir, _EVALUATION, wait_secs)


def _release(path: str, fd: Optional[int]) -> None:
    if fd is None:
        return
    _held.discard(os.path.realpath(path))
    try:   # removed while held, so a waiter that then locks it sees it gone (_acquire)
        os.unlink(path)
    except OSError:   # (model_dir removed)
        pass
    os.close(fd)   # (the lock goes with the descriptor)


def _acquire(path: str, wait_secs: float, kind: _Kind) -> Optional[int]:
    """The descriptor holding the lock file `path`; None where no lock can be
    taken or this process holds it already (a POSIX lock is the process's: a
    second descriptor's close would release it)."""
    if fcntl is None:
        return None
    directory = os.path.dirname(path)
    if os.path.realpath(path) in _held:
        return None
    deadline = time.monotonic() + wait_secs
    waiting = False
    while True:
        try:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            logger.warning(kind.unlocked.format(dir=directory, error=e))
            return None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                logger.warning(kind.unlocked.format(dir=directory, error=e))
                return None
        else:
            if _same_file(fd, path):
                break
            os.close(fd)   # locked as its holder removed it: take the new one
            continue
        holder = _holder(fd)
        os.close(fd)
        busy = f"{kind.busy.format(dir=directory)} by another process ({holder})"
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{busy}, still after {wait_secs:g} s: {kind.harm}. Stop that "
                               f"process, or {kind.instead} ({path} names the holder)")
        if not waiting:
            waiting = True
            logger.warning("%s: waiting up to %g s for it to end", busy, wait_secs)
        time.sleep(_POLL_SECS)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (f"pid {os.getpid()} on {socket.gethostname()} since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode(), 0)
    except OSError:   # (a full disk: the lock holds all the same)
        pass
    if waiting:
        logger.warning(kind.resumed.format(dir=directory))
    _held.add(os.path.realpath(path))
    return fd


def _same_file(fd: int, path: str) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_ino, on_disk.st_dev) == (held.st_ino, held.st_dev)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
