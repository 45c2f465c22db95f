"""Files written atomically, the one way this library writes what a crash
must not leave half-written (checkpoints, the checkpoint index, markers in
model_dir, the resolved experiment, profiler traces), `WriterProcess`,
which carries such writes out in a child process while training goes on, and
`DataLossError`, what reading a damaged file raises. Standard library only."""
from __future__ import annotations

import fcntl
import gc
import io
import itertools
import marshal
import os
import select
import signal
import struct
import subprocess
import time
from typing import Callable, IO, Optional, Tuple

_CHUNK = 1 << 20
_serial = itertools.count()


class DataLossError(ValueError):
    """A file whose content is damaged: a checkpoint whose digest does not
    match or that torch cannot read, a TFRecord with a bad CRC (TF:
    ``tf.errors.DataLossError``); the message names the file."""


def atomic_write(path: str, write: Callable[[IO[bytes]], None], sync_dir: bool = True) -> None:
    """Write `path` through `write(fileobj)` (binary) to a temp file in the
    same directory, fsync, rename over `path`, fsync the directory. A crash
    leaves the old file or the new one, never a mix; the temp file is removed
    on an error. The file's mode follows the umask, as open()'s does (a task
    running as another user of the group can read checkpoints).
    `sync_dir=False`: the rename is made durable by a later atomic_write in
    the same directory (one directory fsync covers both renames)."""
    settle(stream_temp(path, write)[0], path, sync_dir)


def atomic_write_bytes(path: str, data: bytes, sync_dir: bool = True) -> None:
    """`atomic_write` of `data`."""
    settle(_write_temp(path, lambda fd: _write_all(fd, data)), path, sync_dir)


def stream_temp(path: str, produce: Callable[[IO[bytes]], None],
                observe: Optional[Callable[[bytes], None]] = None,
                tmp: Optional[str] = None) -> Tuple[str, int]:
    """(name, size) of a new temp file beside `path` (named `tmp` where given:
    `temp_name(path)`), not yet durable (`settle` it), that `produce(fileobj)`
    fills, as torch.save writes into a file object: the bytes go to the file
    as they come, never all held in memory (a 100 MB checkpoint held 100 MB
    more while it was saved). Small writes are gathered into pieces of up to
    1 MiB; `observe(piece)` sees each piece before it is written (a digest)."""
    pieces = None

    def fill(fd: int) -> None:
        nonlocal pieces
        pieces = _Pieces(fd, observe)
        with io.BufferedWriter(pieces, buffer_size=_CHUNK) as f:   # (closing leaves fd open)
            produce(f)
    return _write_temp(path, fill, tmp), pieces.size


class _Pieces(io.RawIOBase):
    """The file under `stream_temp`'s buffer: what it is given, observed, then
    written in 1 MiB pieces."""

    def __init__(self, fd: int, observe: Optional[Callable[[bytes], None]]):
        self._fd, self._observe = fd, observe
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self._observe is not None:
            self._observe(data)
        _write_all(self._fd, data)
        n = memoryview(data).nbytes
        self.size += n
        return n


def _write_all(fd: int, data) -> None:
    """Write `data` in 1 MiB pieces: on the VMs we measure on one multi-megabyte
    write() costs 2-7x the CPU of the same bytes in 1 MiB pieces (2.7 MB:
    1.4 ms while old checkpoints are deleted, 5.2 ms while the page cache
    grows, against 0.7 ms)."""
    view = memoryview(data).cast("B")   # (bytes, whatever items the buffer holds)
    while view:
        view = view[os.write(fd, view[:_CHUNK]):]


def settle(tmp: str, path: str, sync_dir: bool = True) -> None:
    """Make temp file `tmp` durable (fsync) and rename it over `path`, then
    fsync the directory (unless `sync_dir=False`). `tmp` is removed on an
    error."""
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise
    if not sync_dir:
        return
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class naming:
    """`with naming(path):` an OSError that names no file (a write on a full
    disk: "[Errno 28] No space left on device") is raised naming `path`."""

    def __init__(self, path: str):
        self._path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, OSError) and error.filename is None:
            error.filename = self._path
        return False


def _write_temp(path: str, fill: Callable[[int], None], tmp: Optional[str] = None) -> str:
    """Temp file `tmp` (default: a new `temp_name(path)`), created exclusively,
    mode 0o666 less the umask (as open() gives), filled by `fill(fd)`; its
    name. An error names `path` and leaves no temp file."""
    fd, tmp = _create_temp(path) if tmp is None else (_create(tmp), tmp)
    try:
        with naming(path):
            try:
                fill(fd)
            finally:
                os.close(fd)
    except BaseException:
        _discard(tmp)
        raise
    return tmp


def _discard(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def temp_name(path: str) -> str:
    """A name for a temp file beside `path`: `<path>.tmp-<pid>-<n>`."""
    return f"{path}.tmp-{os.getpid()}-{next(_serial)}"


_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _create_temp(path: str):
    while True:   # a temp file of an earlier process with this pid: the next name
        tmp = temp_name(path)
        try:
            return os.open(tmp, _EXCLUSIVE, 0o666), tmp
        except FileExistsError:
            continue


def _create(tmp: str) -> int:
    """Temp file `tmp`, named by another process (whose pid it holds): one of
    that name already there is an earlier process's, left by a crash."""
    try:
        return os.open(tmp, _EXCLUSIVE, 0o666)
    except FileExistsError:
        _discard(tmp)
        return os.open(tmp, _EXCLUSIVE, 0o666)


# -- plans, carried out here or by a writer process ------------------------------
# A plan is a list of steps, done in order, stopping at the first error:
#   ("write", path, data, sync_dir)   atomic_write_bytes(path, data, sync_dir)
#   ("settle", tmp, path, sync_dir)   settle(tmp, path, sync_dir): a stream_temp made durable
#   ("remove", path)                  remove the file if it is there
# Plain values only: marshal carries a plan to the writer process.


def apply(plan: list, before_step: Optional[Callable[[], None]] = None) -> None:
    """Carry out `plan`. An error names the path of the step that failed, and
    the temp files of the steps not done are removed."""
    for i, step in enumerate(plan):
        try:
            if before_step is not None:
                before_step()
            if step[0] == "write":
                atomic_write_bytes(*step[1:])
            elif step[0] == "settle":
                settle(*step[1:])
            else:
                _discard_if_there(step[1])
        except BaseException as e:
            abandon(plan[i + 1:])
            if isinstance(e, OSError) and e.filename is None:   # (fsync names no file)
                e.filename = step[1] if step[0] != "settle" else step[2]
            raise


def abandon(plan: list) -> None:
    """Remove the temp files of `plan`'s settle steps (a plan not carried out)."""
    for step in plan:
        if step[0] == "settle":
            _discard(step[1])


def _discard_if_there(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class WriterProcess:
    """A child process, a fork of this one, that carries out plans:
    `submit(plan)` hands one over, `result()` waits for it and raises its
    error; a plan submitted with a `job` starts with the steps
    `prepare(job)` returns, run in the child (a checkpoint serialized there
    from tensors staged in memory shared before the fork). A process rather than a
    thread because a thread doing this work takes the interpreter lock back
    after each of its system calls, and the training step waits for it each
    time (torch.distributed.checkpoint's async save offers a process for the
    same reason). The child exits when this process closes it or dies (woken
    by its exit through a pidfd; it also looks every second, and before each
    step of a plan): a process killed with -9 leaves no writer behind
    changing its model_dir.

    A plan goes into the pipe while the child sleeps on an eventfd, which
    then wakes it: a pipe wakes its reader as a "sync" wake-up, which Linux
    serves on the writer's CPU, where the child then takes its turn from
    the training step instead of running on an idle core (bench/overhead.py's
    tiny model saving every 100 steps on 2 cores: 0.81 of the plain loop
    woken by the pipe, 0.86 by the eventfd, 0.89 with the child pinned to the
    other core).

    Forked rather than started afresh: the child has torch and the staging
    memory at once (a new interpreter importing torch takes 2 s of a core).
    It holds the pages this process changes while it lives (copy on write):
    at most this process's memory at the fork, in practice the model and
    optimizer state, which the staging memory doubles anyway; an input
    held in numpy arrays, which training only reads, is not copied."""

    def __init__(self, prepare: Optional[Callable[[object], list]] = None,
                 errors: Tuple[type, ...] = ()):
        """`errors`: exception classes that come back from the child as
        themselves (rebuilt from their `args`, plain values); any other
        error but OSError comes back as a RuntimeError naming it."""
        child_in, self._send = _pipe()
        self._errors = errors
        self._receive, child_out = os.pipe()
        # (no eventfd outside Linux: there the child waits on the pipe itself)
        self._wake = os.eventfd(0) if hasattr(os, "eventfd") else -1
        kept = (child_in, child_out) + ((self._wake,) if self._wake >= 0 else ())
        parent = os.getpid()
        try:
            self._proc = _Fork(lambda: _serve(child_in, child_out, self._wake, parent, prepare,
                                              errors),
                               kept)
        except BaseException:
            for fd in (self._send, self._receive, self._wake):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            os.close(child_in)
            os.close(child_out)
        self._capacity = _capacity(self._send)
        self._poll = select.poll()
        self._poll.register(self._receive, select.POLLIN)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def submit(self, plan: list, job=None) -> None:
        """Hand `plan` to the child (one at a time: `result()` before the next),
        with `job` for the child's `prepare` (plain values, as the plan's)."""
        message = marshal.dumps(list(plan) if job is None else (job, list(plan)))
        fits = len(message) + 8 <= self._capacity   # else it is read while written
        try:
            if not fits:
                self._notify()
            _send(self._send, message)
            if fits:
                self._notify()
        except BrokenPipeError:
            raise self._ended() from None

    def answered(self) -> bool:
        """Whether the child has answered the plan in hand (one poll, no wait)."""
        return bool(self._poll.poll(0))

    def result(self) -> None:
        """Wait for the child to finish the plan in hand; raise its error."""
        reply = _receive(self._receive)
        if reply is None:
            raise self._ended()
        error = marshal.loads(reply)
        if error is not None:
            raise _error(*error, errors=self._errors)

    def _notify(self) -> None:
        if self._wake >= 0:
            os.eventfd_write(self._wake, 1)

    def _ended(self) -> ChildProcessError:
        return ChildProcessError(f"The checkpoint writer process (pid {self._proc.pid}) "
                                 f"ended: {_how_it_ended(self._proc)}; the save it was "
                                 "writing is not complete")

    def close(self, timeout: float = 60.0) -> None:
        """End the child (once its plan in hand, if any, is done)."""
        if self._send < 0:
            return
        try:   # (said, not only the pipe's end: a process forked meanwhile, a
            _send(self._send, _END)   # DataLoader worker, holds it open)
        except OSError:
            pass   # (it has ended)
        os.close(self._send)   # then woken, it reads the end of the pipe
        self._notify()
        for fd in (self._receive, self._wake):
            if fd >= 0:
                os.close(fd)
        self._send = self._receive = self._wake = -1
        try:
            self._proc.wait(_await_exit(self._proc.pid, timeout))
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _pipe() -> Tuple[int, int]:
    """(read end, write end) of a pipe holding 1 MiB where the system allows:
    a plan fits whole (its largest part is the index, ~100 bytes a checkpoint)."""
    read, write = os.pipe()
    try:
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, _CHUNK)
    except (AttributeError, OSError):
        pass
    return read, write


def _capacity(fd: int) -> int:
    """Bytes the pipe holds (Linux says; elsewhere PIPE_BUF, which POSIX promises)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (AttributeError, OSError):
        return 512


def _send(fd: int, message: bytes) -> None:
    os.write(fd, struct.pack("<Q", len(message)))   # (8 bytes: whole, as pipes write)
    view = memoryview(message)
    while view:
        view = view[os.write(fd, view):]


def _receive(fd: int) -> Optional[bytes]:
    """One message from `fd`; None at the end of the pipe."""
    header = _read_exactly(fd, 8)
    if header is None:
        return None
    return _read_exactly(fd, struct.unpack("<Q", header)[0])


def _read_exactly(fd: int, n: int) -> Optional[bytes]:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        count = os.readv(fd, [view[got:]])
        if count == 0:
            return None
        got += count
    return bytes(buffer)


def _error(errno, strerror, filename, text, kind=None, args=(), errors=()) -> Exception:
    """The writer process's error, rebuilt here: OSError(errno, ...) is the
    subclass it was (FileNotFoundError, ...); one of `errors` (`kind`: its
    place there) is itself."""
    if kind is not None:
        return errors[kind](*args)
    if errno is None:
        return RuntimeError(f"The checkpoint writer process failed: {text}")
    return OSError(errno, strerror, filename)


def _pidfd(pid: int) -> int:
    """A descriptor of process `pid`, readable once it exits (Linux 5.3+); -1
    where there are none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def _await_exit(pid: int, timeout: float) -> float:
    """Wait up to `timeout` seconds for child `pid` to exit, woken by its exit
    (a pidfd: closing takes 0.4 ms here, against 1.2 ms with Popen.wait's
    timeout, which polls with sleeps); returns the time left (all of it
    where there are no pidfds)."""
    start = time.monotonic()
    fd = _pidfd(pid)
    if fd < 0:
        return timeout
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return max(0.0, timeout - (time.monotonic() - start))


def _how_it_ended(proc: "_Fork") -> str:
    try:
        code = proc.wait(5)
    except subprocess.TimeoutExpired:
        return "it stopped answering"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _serve(receive: int, send: int, wake: int, parent: int,
           prepare: Optional[Callable[[object], list]] = None, errors: tuple = ()) -> None:
    """The child's loop: woken, a plan in (with a job: `prepare`'s steps
    first), None or its error out, until the parent closes the pipe or dies
    (then it exits at once: nothing to tidy)."""
    def parent_alive() -> None:
        if os.getppid() != parent:
            os._exit(1)
    woken = select.poll()
    woken.register(wake if wake >= 0 else receive, select.POLLIN)
    exited = _pidfd(parent)
    if exited >= 0:
        woken.register(exited, select.POLLIN)
    parent_alive()
    while True:
        events = woken.poll(1000)
        parent_alive()
        if not events:
            continue
        if any(fd == exited for fd, _ in events):   # yet parent_alive() returned: only
            woken.unregister(exited)   # its first thread ended; look every second from now
            if len(events) == 1:
                continue
        if wake >= 0:
            os.eventfd_read(wake)
        message = _receive(receive)
        if message is None or message == _END:
            os._exit(0)
        try:
            plan = marshal.loads(message)
            if isinstance(plan, tuple):   # (job, plan)
                plan = prepare(plan[0]) + plan[1]
            apply(plan, before_step=parent_alive)
            error = None
        except OSError as e:   # handed to the parent, which raises it
            error = (e.errno, e.strerror, e.filename, str(e))
        except errors as e:   # (itself, in the parent)
            error = (None, None, None, str(e), errors.index(type(e)), e.args)
        except Exception as e:   # noqa: BLE001
            error = (None, None, None, f"{type(e).__name__}: {e}")
        try:
            _send(send, marshal.dumps(error))
        except BrokenPipeError:   # the parent stopped listening
            os._exit(0)


_END = marshal.dumps(None)   # the message that ends the writer
FORKED_WRITER_NAME = b"ckpt_writer"
_GROUP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class _Fork:
    """A forked child running `body()`, then exiting; what the writer uses of
    Popen (pid, wait, kill, returncode). In the child, the descriptors but
    `kept` (and 0-2) are closed, the signals sent to a process group (Ctrl-C,
    a scheduler's SIGTERM) are ignored, as the parent ends the child once its
    save in hand is done, and the parent's Python signal handlers never run."""

    def __init__(self, body: Callable[[], None], kept: tuple):
        self.returncode: Optional[int] = None
        import ctypes   # (imported before the fork: the child only calls it)
        self._libc = ctypes.CDLL(None)
        # (blocked across the fork: one arriving before the child ignores it
        # would end it; the parent's are delivered once unblocked)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
        self.pid = -1
        try:
            self.pid = os.fork()
        finally:
            if self.pid != 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if self.pid == 0:   # (the child: never returns)
            code = 1
            try:
                _fork_child(kept, self._libc)
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                body()
                code = 0
            finally:
                os._exit(code)

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"checkpoint writer {self.pid}", timeout)
            time.sleep(0.001)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, 9)


def _fork_child(kept: tuple, libc) -> None:
    gc.freeze()   # the parent's objects are never collected here (nor their pages copied)
    try:   # the name ps, top and /proc/<pid>/comm show
        libc.prctl(15, FORKED_WRITER_NAME, 0, 0, 0)   # PR_SET_NAME
    except (AttributeError, OSError):
        pass
    for number in signal.valid_signals():
        try:
            if number in _GROUP_SIGNALS:
                signal.signal(number, signal.SIG_IGN)
            elif callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass
    low = 3
    for fd in sorted(kept):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1 << 16)
