"""Starting and supervising one process per local replica.

TF's MirroredStrategy runs its replicas as threads of one process; PyTorch's
data parallelism wants one process per device (as torchrun or
`torch.multiprocessing.spawn` start them). `run_replicas` does that from
inside a running program, so a plain `python train.py` works:

- the replicas are **forked**, so `model_fn`/`input_fn` defined in the main
  script, closures and lambdas included, need no pickling. CUDA cannot be
  used across a fork: the parent must not have initialized CUDA (a strategy
  never does it there); if it has, this raises and says what to do instead;
- each child joins the process group (`setup`), runs `fn`, and sends its
  result (or its exception and traceback) back through a pipe: the result is
  all that comes back;
- the parent waits; the first failure (an exception, or a child that dies
  with no word) terminates the others and is raised here, naming the
  replica; once one replica has finished, the others get `timeout` seconds
  to finish too; Ctrl-C is forwarded; no child outlives the call, and a
  child whose parent dies is killed by the kernel (PR_SET_PDEATHSIG);
- the replicas share the console: the first logs as the program does, the
  others only their warnings and errors, so each INFO line (loss and step,
  evaluation results) shows once, as from TF's one-process MirroredStrategy.
"""
from __future__ import annotations

import ctypes
import faulthandler
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import signal
import sys
import threading
import time
import traceback
from typing import Callable, List, Optional, Sequence

import torch

logger = logging.getLogger(__name__)


class _RemoteTraceback(Exception):
    """Carries a replica's traceback as the `__cause__` of the re-raised error;
    `filenames`: the files of its frames, outermost first (whose code raised
    it: the CLI prints one line for the library's own checks)."""

    def __init__(self, text: str, filenames=()):
        super().__init__(text)
        self.filenames = list(filenames)

    def __str__(self):
        return self.args[0]


def _filenames(error: BaseException) -> list:
    """The files of `error`'s traceback frames, and of the errors it was
    raised from or during."""
    files, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        files += [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return files


_in_replica = False


def in_replica_process() -> bool:
    """Whether this process is a replica started by `run_replicas`."""
    return _in_replica


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError with its text."""
    try:
        clone = pickle.loads(pickle.dumps(exc))
        if type(clone) is type(exc):
            return exc
    except Exception:
        pass
    return RuntimeError(f"{type(exc).__name__}: {exc}")


class _WarningsAndAbove(logging.Filter):
    def filter(self, record):
        return record.levelno >= logging.WARNING


def _log_warnings_only() -> None:
    """Every logging handler this process has (forked copies: the parent's
    keep logging everything) passes on warnings and errors only."""
    only = _WarningsAndAbove()
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    for handler in {h for lg in loggers for h in lg.handlers}:
        handler.addFilter(only)


def _child(conn, index: int, setup: Callable, fn: Callable, args, kwargs, python_rng):
    global _in_replica
    _in_replica = True
    ok = False
    # Python reseeds `random` in a forked child (torch's and numpy's
    # generators are copied): put the parent's state back, so that replicas
    # shuffling with `random` shuffle alike (disjoint shards), as with numpy.
    random.setstate(python_rng)
    try:
        _die_with_parent()
        if index > 0:
            _log_warnings_only()
        try:
            faulthandler.enable(file=sys.__stderr__)   # a crash prints where it happened
        except (AttributeError, OSError, ValueError):
            pass
        setup(index)
        payload = ("ok", fn(*args, **kwargs))
        ok = True
    except BaseException as e:  # noqa: B902 - everything goes back to the parent
        payload = ("error", _portable(e), traceback.format_exc(), _filenames(e))
    try:
        conn.send(payload)
    except Exception as e:  # an unpicklable result
        ok = False
        try:
            conn.send(("error", RuntimeError(f"the result of replica {index} cannot be sent "
                                             f"back: {e}"), traceback.format_exc(),
                       _filenames(e)))
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    if ok:   # stay until every replica is done: no peer sees this one's sockets close early
        try:
            conn.recv()
        except (EOFError, OSError):
            pass
    # No teardown: destroying a process group from Python can deadlock in
    # torch (its worker thread waits for the GIL), and the OS frees it all.
    os._exit(0 if ok else 1)


def run_replicas(fn: Callable, args: tuple, kwargs: dict, names: Sequence[str],
                 setup: Callable[[int], None], timeout: float,
                 forked: Optional[Callable[[], object]] = None) -> List:
    """Run `fn(*args, **kwargs)` in one forked process per name in `names`
    (after `setup(i)` there); return the results in replica order.
    `forked()` runs here once all are forked; what it returns is held until
    they are done."""
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA is already initialized in this process, so the strategy cannot fork its "
            "replica processes (CUDA does not survive a fork). Train and evaluate before "
            "anything in this process uses the GPU (predict does), or start one process per "
            "GPU with torchrun and use MultiWorkerMirroredStrategy")
    if "fork" not in multiprocessing.get_all_start_methods():
        raise RuntimeError("Several local replicas need the 'fork' start method, which this "
                           "platform lacks; start one process per device with torchrun and "
                           "use MultiWorkerMirroredStrategy")
    ctx = multiprocessing.get_context("fork")
    procs, conns, held = [], [], None
    sys.stdout.flush()
    sys.stderr.flush()
    # The children must never collect the parent's garbage: finalizers of
    # torch.distributed objects (a store, a process group) hang or crash in a
    # fork, where their threads do not exist. Frozen objects are left alone.
    gc.freeze()
    try:
        for i in range(len(names)):
            mine, theirs = ctx.Pipe()
            # Not daemonic: a replica's DataLoader starts worker processes
            # (no replica outlives this call: stopped below, PR_SET_PDEATHSIG).
            p = ctx.Process(target=_child, name=f"replica-{i}",
                            args=(theirs, i, setup, fn, args, kwargs, random.getstate()),
                            daemon=False)
            p.start()
            theirs.close()
            procs.append(p)
            conns.append(mine)
        gc.unfreeze()
        held = forked() if forked is not None else None
        with _PassSignalsOn(procs):
            return _supervise(procs, conns, names, timeout)
    except KeyboardInterrupt:
        _stop(procs, signal.SIGINT)
        raise
    finally:
        gc.unfreeze()
        _stop(procs, signal.SIGKILL)
        for c in conns:
            c.close()
        for p in procs:   # its pipes now, not when a kept traceback is freed
            if p.exitcode is not None:
                p.close()
        del held   # after the replicas: the store they met at outlives them


class _PassSignalsOn:
    """While the replicas run (main thread only): the first SIGTERM or SIGINT
    here is passed on to them as SIGTERM, so they stop at an agreed step and
    save (hooks.preemption) while this process waits for their results; a
    second one a second later or more interrupts (KeyboardInterrupt: the
    replicas are stopped)."""

    def __init__(self, procs):
        self._procs, self._first, self._previous = procs, None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum, frame):
        if self._first is None:
            self._first = time.monotonic()
            logger.warning("%s received: passing it on to the replicas, which stop at an "
                           "agreed step and save", signal.Signals(signum).name)
            for p in self._procs:
                if p.is_alive():
                    try:
                        os.kill(p.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
        elif time.monotonic() - self._first >= 1.0:
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _supervise(procs, conns, names, timeout: float) -> List:
    results, done = [None] * len(procs), set()
    first_done_at = None
    pending = {c: i for i, c in enumerate(conns)}
    while len(done) < len(procs):
        waitables = list(pending) + [p.sentinel for i, p in enumerate(procs) if i not in done]
        ready = multiprocessing.connection.wait(waitables, timeout=1.0)
        for conn in [c for c in pending if c in ready or not procs[pending[c]].is_alive()]:
            if conn not in ready and not conn.poll():
                continue
            i = pending.pop(conn)
            try:
                status, *rest = conn.recv()
            except (EOFError, OSError):
                continue  # closed without a word: dead, seen below
            if status == "ok":
                results[i] = rest[0]
                done.add(i)
                first_done_at = first_done_at or time.monotonic()
                continue
            _kill_others(procs, i)
            exc, text, filenames = rest
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised in {names[i]}, pid {procs[i].pid})")
            raise exc from _RemoteTraceback(f"\n\nTraceback in {names[i]}:\n"
                                            f"{text}", filenames)
        dead = [i for i, p in enumerate(procs) if i not in done and not p.is_alive()
                and conns[i] not in pending]
        if dead:
            _kill_others(procs, dead[0])
            # An exit code (the replica's own doing) before a signal (often a consequence).
            dead.sort(key=lambda i: procs[i].exitcode < 0)
            what = [f"{names[i]} (pid {procs[i].pid}) {_how(procs[i].exitcode)}" for i in dead]
            raise RuntimeError(f"{what[0][0].upper()}{what[0][1:]} without reporting a result"
                               + "".join(f"; then {w}" for w in what[1:])
                               + "; the other replicas were stopped")
        if first_done_at and time.monotonic() - first_done_at > timeout:
            late = [f"{names[i]} (pid {procs[i].pid})"
                    for i in range(len(procs)) if i not in done]
            raise TimeoutError(f"{', '.join(late)} did not finish within {timeout:g} s of "
                               "the first replica; stopped")
    for conn in conns:   # all done: they may exit
        try:
            conn.send("exit")
        except OSError:
            pass
    for p in procs:
        p.join(min(timeout, 30.0))
    return results


def _how(code: int) -> str:
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _kill_others(procs, failed: int) -> None:
    for i, p in enumerate(procs):
        if i != failed and p.is_alive():
            p.kill()


def _stop(procs, sig) -> None:
    """Signal the live children, give them a moment (SIGINT only), then kill."""
    alive = [p for p in procs if p.is_alive()]
    if not alive:
        return
    if sig != signal.SIGKILL:
        for p in alive:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5.0
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
        p.join(5.0)
