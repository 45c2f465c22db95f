"""TF1's standalone client mode: `train_and_evaluate` run on a machine outside
the cluster, against servers already running on the cluster's machines.

    # on each machine of the cluster, one server per task, at its address:
    ESTIMATOR_SERVER_TOKEN=secret estimator server --address 10.0.0.2:2222

    # on the client:
    config = est.RunConfig(model_dir="/shared/run", experimental_distribute=
        est.DistributeConfig(remote_cluster={"chief": ["10.0.0.2:2222"], ...}))
    est.train_and_evaluate(estimator, train_spec, eval_spec)   # ESTIMATOR_SERVER_TOKEN set

TF's client built graphs and sent them to the servers. Here code travels by
name, so the client sends its own program: `train_and_evaluate` connects to
the server of each task and asks it to run the client's command line
(``sys.argv``, from the client's working directory, which the cluster's
machines must have too: a shared file system or the same image) with
TF_CONFIG naming that task; there the program's `train_and_evaluate` runs
the role. Each task's output comes back prefixed with ``[chief:0]``...;
Ctrl-C on the client (or the client dying) closes the connections, and each
server stops its task. A server runs one task at a time: it gives the task
its address (the task's TF_CONFIG port) while the task runs, and listens
again when it ends.

The server runs what a client sends, as the user it runs as: it needs the
shared secret ``ESTIMATOR_SERVER_TOKEN`` (or ``--token``) on both sides, and
binds the address it is given only.
"""
from __future__ import annotations

import ctypes
import hmac
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading

from typing import Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)

TOKEN_ENV = "ESTIMATOR_SERVER_TOKEN"
ROLE_ENV = "ESTIMATOR_REMOTE_ROLE"   # set in a task a server started: run the role
_MAX_REQUEST = 1 << 20
_KILL_GRACE_SECS = 5.0
_GREETING = {"server": "estimator"}   # what a server says first
_GREETING_SECS = 10.0


def _split(address: str):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r} must be host:port")
    return host, int(port)


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def _read_line(conn: socket.socket, limit: int = _MAX_REQUEST) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError(f"request over {limit} bytes")
    return data


# -- the server -------------------------------------------------------------------------------
def serve(address: str, token: str, once: bool = False,
          stop: Optional[threading.Event] = None) -> None:
    """Run the tasks clients send to `address`, one at a time (`once`: one
    task, then return)."""
    if not token:
        raise ValueError(f"estimator server needs a shared secret: set {TOKEN_ENV} (or "
                         "--token) here and on the client")
    host, port = _split(address)
    while stop is None or not stop.is_set():
        with socket.create_server((host, port)) as listener:
            logger.info("estimator server: waiting for a client on %s", address)
            listener.settimeout(0.5)
            conn = None
            while conn is None and (stop is None or not stop.is_set()):
                try:
                    conn, peer = listener.accept()
                except socket.timeout:
                    continue
        if conn is None:
            return
        with conn:   # the listener is closed: the task may take the address
            try:
                _run_task(conn, token, address)
            finally:
                try:   # (wakes the thread watching the client, and tells the client)
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if once:
            return


def _run_task(conn: socket.socket, token: str, address: str) -> None:
    conn.settimeout(30)
    try:
        _send(conn, _GREETING)   # (the client sends nothing, its token least, before it)
    except OSError:
        return
    try:
        request = json.loads(_read_line(conn) or b"null")
        if not isinstance(request, dict):
            raise ValueError("the request must be a JSON object")
        if not hmac.compare_digest(str(request.get("token", "")).encode(), token.encode()):
            raise PermissionError("wrong token")
        argv, env, cwd = request["argv"], request.get("env", {}), request.get("cwd")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
    except (ValueError, KeyError, PermissionError, OSError) as e:
        logger.warning("estimator server %s: refused a request: %s", address, e)
        try:
            _send(conn, {"error": f"{type(e).__name__}: {e}"})
        except OSError:
            pass
        return
    logger.info("estimator server %s: running %s (%s)", address, " ".join(argv),
                env.get("TF_CONFIG", ""))
    try:
        proc = subprocess.Popen([sys.executable, *argv], cwd=cwd or None,
                                env={**os.environ, **env, ROLE_ENV: "1"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_signalled_when_server_dies())
    except OSError as e:
        _send(conn, {"error": f"could not start {argv[0]}: {e}"})
        return
    conn.settimeout(None)
    gone = threading.Event()

    def watch_client():   # the client closed (Ctrl-C, died): stop the task
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        gone.set()
        _stop_group(proc)
    threading.Thread(target=watch_client, daemon=True).start()
    try:
        for line in proc.stdout:
            if not gone.is_set():
                try:
                    _send(conn, {"line": line.decode("utf-8", "replace").rstrip("\n")})
                except OSError:
                    gone.set()
                    _stop_group(proc)
        rc = proc.wait()
        if not gone.is_set():
            _send(conn, {"exit": rc})
    except OSError:
        _stop_group(proc)
    except BaseException:   # the server stopped (Ctrl-C, SIGTERM): its task with it
        _stop_group(proc)
        raise
    logger.info("estimator server %s: the task ended (exit code %s)", address, proc.poll())


def _signalled_when_server_dies():
    """A preexec_fn asking Linux to SIGTERM the task when its server dies
    (kill -9): the task then stops as preempted (it saves) instead of running
    on unattended. None where prctl is not there."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl   # (looked up here, not in the child)
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def _stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=_KILL_GRACE_SECS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- the client -------------------------------------------------------------------------------
def run_remote(cluster: Dict[str, List[str]], token: Optional[str] = None,
               argv: Optional[Sequence[str]] = None, cwd: Optional[str] = None,
               connect_timeout: float = 30.0, out=None) -> Dict[str, int]:
    """Run `argv` (default: this program's command line) as every task of
    `cluster` through their servers; print their output prefixed by task;
    return {task: exit code}, raising if a training or evaluation task failed."""
    token = token if token is not None else os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ValueError(f"the standalone client needs the servers' shared secret in {TOKEN_ENV}")
    argv = list(sys.argv if argv is None else argv)
    out = out or sys.stdout
    conns, addresses = {}, {}
    try:
        for job in sorted(cluster, key=lambda j: j != "ps"):   # ps tasks first
            for i, address in enumerate(cluster[job]):
                task = f"{job}:{i}"
                try:
                    conn = socket.create_connection(_split(address), timeout=connect_timeout)
                except OSError as e:
                    raise ConnectionError(f"standalone client: no estimator server at {address} "
                                          f"for {task} ({e}); start one there with `estimator "
                                          f"server --address {address}`") from None
                _expect_greeting(conn, address, task, min(connect_timeout, _GREETING_SECS))
                conn.settimeout(None)
                tf_config = {"cluster": cluster, "task": {"type": job, "index": i}}
                _send(conn, {"token": token, "argv": argv, "cwd": cwd or os.getcwd(),
                             "env": {"TF_CONFIG": json.dumps(tf_config)}})
                conns[task], addresses[task] = conn, address
        codes: Dict[str, Optional[int]] = {task: None for task in conns}
        lock = threading.Lock()

        def relay(task, conn):
            with conn.makefile("rb") as stream:
                for raw in stream:
                    try:
                        message = json.loads(raw)
                    except ValueError:   # (a line cut short: the server was killed)
                        break
                    if "line" in message:
                        with lock:
                            print(f"[{task}] {message['line']}", file=out, flush=True)
                    elif "exit" in message:
                        codes[task] = message["exit"]
                        break
                    elif "error" in message:
                        with lock:
                            print(f"[{task}] server refused: {message['error']}", file=out,
                                  flush=True)
                        codes[task] = _REFUSED
                        break
            if codes[task] is None:
                codes[task] = _SERVER_GONE
                with lock:
                    print(f"[{task}] its estimator server at {addresses[task]} went away (stopped "
                          "or killed) before the task ended; the server stops its task with it",
                          file=out, flush=True)
        threads = [threading.Thread(target=relay, args=item, daemon=True)
                   for item in conns.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    finally:
        for conn in conns.values():   # (Ctrl-C: the servers stop their tasks)
            try:
                conn.close()
            except OSError:
                pass
    failed = {t: c for t, c in codes.items() if c != 0 and not t.startswith("ps:")}
    if failed:
        raise RuntimeError("standalone client: task(s) failed: " + "; ".join(
            f"{t} {_outcome(c)}" for t, c in failed.items()) + " (their output is above, "
            "prefixed by task)")
    return dict(codes)


def _expect_greeting(conn: socket.socket, address: str, task: str, timeout: float) -> None:
    """The server's greeting; else a clear error (a busy server has given its
    address to the task it runs: something else answers there)."""
    conn.settimeout(timeout)
    try:
        hello = json.loads(_read_line(conn, 4096) or b"null")
    except (OSError, ValueError):
        hello = None
    if hello != _GREETING:
        conn.close()
        raise ConnectionError(f"standalone client: {address} (for {task}) answers, but not as an "
                              "estimator server waiting for a client: is its server busy "
                              "running another job's task (which has the address while it "
                              "runs)?")


_REFUSED, _SERVER_GONE = -1001, -1002   # (codes of a task that never ran, or was cut off)


def _outcome(code: int) -> str:
    if code == _REFUSED:
        return "was refused by its server"
    if code == _SERVER_GONE:
        return "lost its server"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def is_remote_role() -> bool:
    """Whether this process is a task a server started for a standalone client."""
    return os.environ.get(ROLE_ENV) == "1"


__all__ = ["serve", "run_remote", "is_remote_role", "TOKEN_ENV"]

