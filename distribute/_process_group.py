"""Joining a torch.distributed process group, bounded and with names.

TF analogue: the collective ops' group setup in a MultiWorkerMirroredStrategy
cluster. Here the engine is torch.distributed: a `TCPStore` at the
rendezvous address (the chief's, or one the launching process holds), then
`init_process_group` over it. What this module adds is names: every replica
registers itself in the store, so a rendezvous that times out says which
task did not arrive and at which address, and a collective that fails
(a peer died, or hung past the timeout) is explained by which replicas did not
report the failure themselves.
"""
from __future__ import annotations

import atexit
import errno
import datetime
import logging
import os
import socket
import stat
import threading
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_GRACE_SECS = 5.0   # how long a failing replica waits for the others to report
_ATTEMPT_SECS = 10.0      # a rendezvous client's attempt at a port that accepts connections
_UNANSWERED_SECS = 120.0  # that long accepting but not answering as a store: not the host's
_WAIT_LOG_SECS = 60.0   # a rendezvous still waiting says so this often (or 4 times)
_SUM = dist.AllreduceOptions()
_MAX = dist.AllreduceOptions()
_MAX.reduceOp = dist.ReduceOp.MAX


_FORMED = "formed"   # a store key: its group is formed, no rank joins it any more


class ReplicaFailedError(RuntimeError):
    """A collective failed because another replica died or hung (no TF
    analogue: TF raises UnavailableError/DeadlineExceededError)."""


def _is_communication_error(exc: BaseException) -> bool:
    """Whether `exc` comes from the transport (a peer gone or a timeout), not
    from the user's code. gloo raises plain RuntimeErrors naming itself."""
    if isinstance(exc, dist.DistError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(s in text for s in ("gloo", "nccl", "connection reset", "connection closed",
                                   "timed out", "timeout", "pair closure", "broken pipe"))


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


BIND_ALL_ENV = "ESTIMATOR_BIND_ALL_INTERFACES"


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening at `host:port` (the task's own address, so a
    loopback address stays loopback; `port` 0: a free one), for a TCPStore to
    serve on (`host_store`). Every interface when
    ESTIMATOR_BIND_ALL_INTERFACES=1, or when `host` is not an address of this
    machine (a NAT or service address), then with a warning."""
    bind_host = "" if os.environ.get(BIND_ALL_ENV) == "1" else host
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            bind_host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise RuntimeError(f"cannot listen at {host}:{port}: {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise OSError(e.errno, f"cannot listen at {host}:{port}, this task's address in "
                                       f"the cluster (TF_CONFIG), for the rendezvous: "
                                       f"{e.strerror} (by another process: an earlier run's "
                                       "task still alive, or another job's)") from None
            if e.errno != errno.EADDRNOTAVAIL or not bind_host:
                raise
            logger.warning("%s is not an address of this machine: the rendezvous listens on "
                           "every interface at port %d", host, port)
            sock.close()
            return listening_socket("", port)
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


def host_store(host: str, port: int, timeout: float,
               sock: Optional[socket.socket] = None) -> dist.TCPStore:
    """A store server at `host:port` on this machine (`port` 0: a free one,
    read `.port`), listening there only (see `listening_socket`); or serving
    on `sock`, a listening socket opened before (the store owns it then)."""
    sock = sock or listening_socket(host, port)
    port = sock.getsockname()[1]
    return dist.TCPStore(host, port, None, True, _timeout(timeout), wait_for_workers=False,
                         master_listen_fd=sock.detach())


class ProcessGroup:
    """This replica's membership: rank, world size, backend, the store, and
    `describe(rank)` naming any replica for error messages."""

    def __init__(self, rank: int, world_size: int, backend: str, store, address: str,
                 describe: Callable[[int], str], timeout: float, store_host: str = ""):
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.store = store
        self.address = address
        self.describe = describe
        self.timeout = timeout
        self.store_host = store_host or describe(0)
        self.main = None     # the default group (gradients, loss, metrics)
        self.control = None  # a gloo group for host-side flags (the default one under gloo)
        self._failed_alone = False   # this rank failed on its own error (`report_failure`)
        self._links: Dict[int, int] = {}   # gloo's connections to the peers: fd -> inode

    # -- joining ----------------------------------------------------------------
    @classmethod
    def join(cls, rank: int, world_size: int, backend: str, host: Optional[str], port: int,
             describe: Callable[[int], str], timeout: float, store=None,
             is_host: bool = False, store_host: str = "") -> "ProcessGroup":
        """Rendezvous at `host:port` (hosting the store there if `is_host`,
        or in `store`, already connected), wait for every rank within
        `timeout` seconds, and initialize torch.distributed."""
        address = f"{host}:{port}"
        if store is None:
            store = _connect(host, port, is_host, timeout, store_host or describe(0),
                             describe(rank))
        incarnation = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if incarnation:   # torchrun keeps its store across restarts: no stale keys
            store = dist.PrefixStore(f"restart{incarnation}", store)
        if store.check([_FORMED]):
            # (its arrivals all there, this rank would join a group whose others are
            # gone or never come back: torch's rendezvous then waits out the timeout)
            raise RuntimeError(
                f"Rendezvous at {address}: the group there was formed before {describe(rank)} "
                f"arrived, by an earlier run of the job whose {store_host or describe(0)} has "
                "not exited yet (failing after a task died?), or by another strategy of this "
                "job at that address. Start this task again once it has exited, or restart the "
                "whole job")
        store.set(f"arrived/{rank}", describe(rank))
        _wait_for_all(store, world_size, timeout, describe, address)
        sockets_before = _sockets()
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=world_size, timeout=_timeout(timeout))
        if rank == 0:
            store.set(_FORMED, "1")
        group = cls(rank, world_size, backend, store, address, describe, timeout, store_host)
        group.main = dist.group.WORLD
        group.control = group.main if backend == "gloo" else dist.new_group(backend="gloo")
        group._links = _links(_sockets(), sockets_before, port)
        atexit.register(group._shutdown)
        return group

    def _shutdown(self) -> None:
        """At interpreter exit (forked replicas `os._exit` before): wait for every
        rank, so the store's host outlives the others' use of it, then destroy
        the process group while Python is whole; a group left to C++ static
        destruction can abort the process ("terminate called without an
        active exception")."""
        if self._failed_alone:   # its peers' collectives fail now, the store still up
            self._destroy()
            self._cut_links()
        try:
            # The count our own add returns: the last to arrive asks the store
            # nothing more (its host may leave as soon as it sees everyone).
            arrived = self.store.add("exited", 1)
            deadline = time.monotonic() + min(self.timeout, _EXIT_WAIT_SECS)
            while arrived < self.world_size and time.monotonic() < deadline:
                time.sleep(0.02)
                arrived = self.store.add("exited", 0)
        except Exception:  # a peer or the store's host is already gone: nothing to wait for
            pass
        self._destroy()   # (in any case: left to C++ static destruction, it can abort)

    def _cut_links(self) -> None:
        """Shut gloo's connections to the peers, so that a peer waiting in a
        collective for this rank fails now and reads its error in the store
        (then exits, and the exit wait ends). Destroying the group does not
        close them while anything (a DDP module, a pending Work) holds it:
        they closed only with the process, after the whole exit wait, and a
        store hosted here could then be gone before the peer read it."""
        for fd, inode in self._links.items():
            try:
                if os.fstat(fd).st_ino != inode:   # (closed, its number reused)
                    continue
                sock = socket.socket(fileno=fd)
            except OSError:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.detach()   # (the descriptor stays gloo's to close)

    @staticmethod
    def _destroy() -> None:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass

    def report_failure(self, error: BaseException) -> None:
        """This rank fails on its own `error` (not a peer's): say so in the
        store, where a peer's failing collective reads it (`explain`), and
        leave the group first at exit, so that the peers waiting in a
        collective for this rank fail then, not after the exit wait."""
        if isinstance(error, ReplicaFailedError) or _is_communication_error(error):
            return
        try:
            self.store.set(f"error/{self.rank}",
                           f"{type(error).__name__}: {_first_line(error, '')}"[:500])
        except Exception:   # (the store's host is gone: the peers see that)
            return
        self._failed_alone = True

    # -- the per-step collectives ---------------------------------------------------------
    def start_sum(self, tensor: torch.Tensor):
        """Start summing `tensor` over the replicas (on the main group); returns the
        Work to `wait()` on. Calls the backend directly: this runs every step."""
        return self.main.allreduce([tensor], _SUM)

    def start_max(self, tensor: torch.Tensor):
        """Start a max of a host `tensor` over the replicas (on the gloo control group)."""
        return self.control.allreduce([tensor], _MAX)

    # -- failures ------------------------------------------------------------------
    def explain(self, exc: BaseException, what: str) -> BaseException:
        """The error to raise for `exc`, raised by the collective `what`: the
        same `exc` for a user error; for a transport failure, a
        ReplicaFailedError naming the replicas that did not report failing
        themselves (those that died or hung)."""
        if not _is_communication_error(exc):
            return exc
        me = self.describe(self.rank)
        first_line = _first_line(exc, type(exc).__name__)
        try:
            self.store.set(f"failed/{self.rank}", first_line)
            missing = self._silent_ranks()
            errors = self._said("error")
            failures = [first_line, *self._said("failed").values()]
        except Exception:  # the store is gone with its host
            return ReplicaFailedError(
                f"{what} failed on {me} ({first_line}), and the rendezvous store at "
                f"{self.address} is unreachable: its host, {self.store_host}, died or hung")
        if errors:
            said = "; ".join(f"{self.describe(r)} failed: {text}" for r, text in errors.items())
            return ReplicaFailedError(f"{what} failed on {me}: {said}")
        if not missing:
            why = ""   # (a peer's timeout closes its connections: this rank may see that)
            if any(t in line.lower() for line in failures for t in ("timed out", "timeout")):
                why = ("; each waited for the others: their steps did not make the same "
                       "collectives. Under DDP a common cause is a parameter the loss reaches "
                       "on some replicas only (a branch their data decides): every replica's "
                       "loss must reach the same parameters each step (weight the branch by a "
                       "mask rather than skip it)")
            return ReplicaFailedError(f"{what} failed on {me}: {first_line} (every replica "
                                      f"reported a failure: see their logs){why}")
        names = ", ".join(self.describe(r) for r in missing)
        return ReplicaFailedError(
            f"{what} failed on {me}: {names} did not respond (died, or hung for more than "
            f"{self.timeout:g} s). Underlying error: {first_line}")

    def _said(self, kind: str) -> Dict[int, str]:
        """The other ranks' `kind` ("error" or "failed") lines in the store."""
        return {r: self.store.get(f"{kind}/{r}").decode(errors="replace")
                for r in range(self.world_size)
                if r != self.rank and self.store.check([f"{kind}/{r}"])}

    def _silent_ranks(self) -> List[int]:
        deadline = time.monotonic() + min(_GRACE_SECS, self.timeout)
        while True:
            missing = [r for r in range(self.world_size) if r != self.rank
                       and not self.store.check([f"failed/{r}"])
                       and not self.store.check([f"error/{r}"])]
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.1)


_EXIT_WAIT_SECS = 10.0


def _sockets() -> Dict[int, int]:
    """This process's open socket descriptors, fd -> inode ({} where the
    system lists no descriptors)."""
    listing = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    found = {}
    try:
        names = os.listdir(listing)
    except OSError:
        return found
    for name in names:
        try:
            info = os.fstat(int(name))
        except (OSError, ValueError):
            continue
        if stat.S_ISSOCK(info.st_mode):
            found[int(name)] = info.st_ino
    return found


def _links(after: Dict[int, int], before: Dict[int, int], store_port: int) -> Dict[int, int]:
    """The TCP connections made while the process group formed (`before`,
    `after`: `_sockets()`): gloo's to the peers, not the store's."""
    links = {}
    for fd, inode in after.items():
        if before.get(fd) == inode:
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                ports = (sock.getsockname()[1], sock.getpeername()[1])   # (connected only)
                if store_port not in ports:
                    links[fd] = inode
        except OSError:
            pass
        finally:
            sock.detach()
    return links


def _first_line(error: BaseException, default: str) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else default


def _connect(host: str, port: int, is_host: bool, timeout: float, host_name: str,
             me: str = "this replica"):
    """The rendezvous's store: hosted here, or reached at `host:port` within
    `timeout` s (saying every minute that it still waits: a chief that is
    not there, or that failed and ended its job, is otherwise silence)."""
    if is_host:
        try:
            return host_store(host, port, timeout)
        except (RuntimeError, dist.DistError) as e:
            raise RuntimeError(f"{host_name} cannot listen at {host}:{port} for the "
                               f"rendezvous: {e}") from None
    if f"{host}:{port}" not in host_name:
        host_name = f"{host_name} at {host}:{port}"
    # Until the host listens, a plain socket asks (torch's client would print
    # a C++ stack trace for each refused attempt); then the store is reached.
    start, every = time.monotonic(), min(_WAIT_LOG_SECS, timeout / 4)
    said, error, unanswered = start, None, None
    while True:
        left = timeout - (time.monotonic() - start)
        if left <= 0.05:
            reason = str(error).splitlines()[0] if error else "no answer"
            raise TimeoutError(f"Rendezvous failed: {host_name} could not be reached within "
                               f"{timeout:g} s ({reason})") from None
        try:
            socket.create_connection((host, port), timeout=min(left, 5.0)).close()
        except OSError as e:   # (nothing listening there yet)
            error, unanswered = e, None
        else:   # something listens: a store answers at once, in attempts of a few seconds
            try:
                store = _client_store(host, port, min(left, _ATTEMPT_SECS))
                store.set_timeout(_timeout(timeout))   # (its waits after: the whole timeout)
                return store
            except (OSError, RuntimeError, dist.DistError) as e:
                error = e
                unanswered = unanswered or time.monotonic()
                if time.monotonic() - unanswered > _UNANSWERED_SECS:
                    raise RuntimeError(
                        f"Rendezvous failed: {host}:{port} accepts connections but has not "
                        f"answered as the rendezvous store of {host_name} for "
                        f"{time.monotonic() - unanswered:.0f} s: another program listens "
                        f"there (the chief could then not listen: see its error), or the "
                        f"address in TF_CONFIG is not the chief's "
                        f"({_first_line(e, type(e).__name__)})") from None
        now = time.monotonic()
        if now - said >= every and now - start < timeout:
            said = now
            logger.warning("%s: waiting for %s for the rendezvous (%.0f s of %g s); if it "
                           "failed and its job ended, restart the whole job", me, host_name,
                           now - start, timeout)
        time.sleep(min(0.2, max(0.0, timeout - (now - start))))


def _client_store(host: str, port: int, timeout: float):
    """A TCPStore client of `host:port`, made within `timeout` s: torch's
    blocks for good on a port that accepts and never answers (another
    service there), so it is made on a thread, waited for that long."""
    made = {}

    def make():
        try:
            made["store"] = dist.TCPStore(host, port, None, False, _timeout(timeout),
                                          wait_for_workers=False)
        except BaseException as e:   # noqa: BLE001 - any: raised by the caller
            made["error"] = e
    thread = threading.Thread(target=make, name="rendezvous-client", daemon=True)
    thread.start()
    thread.join(timeout + 2.0)
    if "error" in made:
        raise made["error"]
    if "store" not in made:
        raise TimeoutError(f"{host}:{port} accepts connections but does not answer as a "
                           f"rendezvous store within {timeout:g} s (another service there?)")
    return made["store"]


def _wait_for_all(store, world_size: int, timeout: float, describe, address: str) -> None:
    keys = [f"arrived/{r}" for r in range(world_size)]
    start = time.monotonic()
    said, every = start, min(_WAIT_LOG_SECS, timeout / 4)
    while True:
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        if not missing:
            return
        now = time.monotonic()
        if now - start > timeout:
            names = ", ".join(describe(r) for r in missing)
            raise TimeoutError(f"Rendezvous at {address} timed out after {timeout:g} s: "
                               f"{names} did not arrive")
        if now - said >= every:
            said = now
            logger.warning("Rendezvous at %s: waiting for %s (%.0f s of %g s)", address,
                           ", ".join(describe(r) for r in missing), now - start, timeout)
        time.sleep(0.05)
