"""TF1's standalone client mode: `estimator server` processes stand for the
cluster's machines (one per task, at the task's address); a client process
runs train_and_evaluate with `remote_cluster`, which sends its program to
each server, streams their output back prefixed by task, and finds the
chief's checkpoints and the evaluator's results in model_dir."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import estimator as est
from estimator import checkpoint, remote
from paths import ROOT, SUPPORT
from tf_cluster import free_ports

PROGRAM = os.path.join(SUPPORT, "remote_program.py")
TOKEN = "test-secret"


def _server(address, token=TOKEN):
    env = dict(os.environ, ESTIMATOR_SERVER_TOKEN=token, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "estimator", "server", "--address", address],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


_server_procs = []   # the servers the fixture started, the newest last


@pytest.fixture
def servers():
    procs = _server_procs
    procs.clear()

    def start(*addresses, token=TOKEN):
        for address in addresses:
            proc = _server(address, token)
            procs.append(proc)
            deadline = time.monotonic() + 60
            while "waiting for a client" not in proc.stdout.readline():   # listening
                assert proc.poll() is None and time.monotonic() < deadline
    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _client(model_dir, cluster, token=TOKEN, **kw):
    env = dict(os.environ, ESTIMATOR_SERVER_TOKEN=token, PYTHONPATH=ROOT)
    env.pop("TF_CONFIG", None)
    return subprocess.Popen([sys.executable, PROGRAM, model_dir, json.dumps(cluster)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.slow
def test_train_and_evaluate_from_a_client_outside_the_cluster(servers, tmp_path):
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "evaluator": [f"127.0.0.1:{ports[1]}"]}
    servers(*cluster["chief"], *cluster["evaluator"])
    model_dir = str(tmp_path / "model")
    client = _client(model_dir, cluster)
    out, _ = client.communicate(timeout=240)
    assert client.returncode == 0, out[-4000:]
    assert "[chief:0] program started as" in out and "[evaluator:0] program started as" in out
    assert "Loss for final step" in out   # the chief's log, streamed back
    assert checkpoint.latest_checkpoint(model_dir).endswith("model.ckpt-60")
    assert os.listdir(os.path.join(model_dir, "eval"))   # the evaluator's summaries
    assert "[evaluator:0]" in out and "global_step = 60" in out, out[-3000:]


@pytest.mark.slow
def test_ctrl_c_on_the_client_stops_the_tasks_and_servers_serve_again(servers, tmp_path):
    ports = free_ports(1)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"]}
    servers(*cluster["chief"])
    long_run = str(tmp_path / "model")
    client = _client(long_run, cluster)
    deadline = time.monotonic() + 120
    seen = ""
    while "program started as {" not in seen:   # the chief task runs
        seen += client.stdout.readline()
        assert time.monotonic() < deadline and client.poll() is None, seen
    client.send_signal(signal.SIGINT)
    client.wait(timeout=60)
    # The server stopped that task and listens again: a second client trains.
    second = _client(str(tmp_path / "again"), cluster)
    out, _ = second.communicate(timeout=240)
    assert second.returncode == 0, out[-3000:]
    assert checkpoint.latest_checkpoint(str(tmp_path / "again")).endswith("model.ckpt-60")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_server_stopped_or_killed_stops_its_task_and_the_client_says_so(servers, tmp_path,
                                                                          sig):
    """SIGTERM (Ctrl-C alike) or kill -9 to a task's server while the task
    runs: the task stops too (the server stops its process group; killed,
    Linux signals the task), and the client names the task that lost its
    server. Before, the task ran on unattended, and the client said
    `{'chief:0': -2}`."""
    port = free_ports(1)[0]
    cluster = {"chief": [f"127.0.0.1:{port}"]}
    servers(*cluster["chief"])
    server = _server_procs[-1]
    client = _client(str(tmp_path / "model"), cluster)
    deadline = time.monotonic() + 120
    seen = ""
    while "program started as {" not in seen:   # the chief task runs
        seen += client.stdout.readline()
        assert time.monotonic() < deadline and client.poll() is None, seen
    task = int(seen.rsplit("(pid ", 1)[1].split(")")[0])
    os.kill(server.pid, sig)
    out, _ = client.communicate(timeout=60)
    assert client.returncode != 0
    assert "task(s) failed: chief:0 lost its server" in out, out[-3000:]
    assert f"its estimator server at 127.0.0.1:{port} went away" in out, out[-3000:]
    deadline = time.monotonic() + 30
    while _alive(task) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(task)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_wrong_token_or_no_server_is_a_clear_error(servers, tmp_path):
    with pytest.raises(ValueError, match="standalone client needs the servers' shared secret"):
        remote.run_remote({"chief": ["127.0.0.1:1"]}, token="")
    port = free_ports(1)[0]
    with pytest.raises(ConnectionError, match=r"no estimator server at 127.0.0.1:\d+ for "
                                              r"chief:0.*estimator server --address"):
        remote.run_remote({"chief": [f"127.0.0.1:{port}"]}, token="x", connect_timeout=2)
    servers(f"127.0.0.1:{port}")
    lines = []

    class Out:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass
    with pytest.raises(RuntimeError, match=r"task\(s\) failed: chief:0 was refused by its "
                                           r"server"):
        remote.run_remote({"chief": [f"127.0.0.1:{port}"]}, token="wrong", argv=["x.py"],
                          out=Out())
    assert any("server refused: PermissionError: wrong token" in line for line in lines)
    with pytest.raises(ValueError, match="remote_cluster must be"):
        est.DistributeConfig(remote_cluster={"chief": "127.0.0.1:1"})
    with pytest.raises(ValueError, match="needs a shared secret"):
        remote.serve("127.0.0.1:1", "")


@pytest.mark.parametrize("cluster, match", [
    ({"cheif": ["127.0.0.1:1"]}, r"unknown job\(s\) \['cheif'\]"),
    ({"chief": ["127.0.0.1"]}, r"'127.0.0.1' of remote_cluster chief:0 must be host:port"),
    ({"chief": ["127.0.0.1:99999"]}, r"port 99999, outside 1..65535"),
    ({"chief": ["h:1"], "worker": ["h:1"]}, r"worker:0 and chief:0 have one address"),
    ({"chief": ["h:1", "h:2"]}, r"one chief and one evaluator at most"),
    ({"evaluator": ["h:1"]}, r"no chief or worker to train"),
])
def test_a_bad_remote_cluster_is_refused_before_any_task_starts(cluster, match):
    """Before, a bad address was found after the tasks before it had started,
    and a typo in a job name only inside the remote task."""
    with pytest.raises(ValueError, match=match):
        est.DistributeConfig(remote_cluster=cluster)


def test_an_address_where_no_server_waits_is_a_clear_error():
    """A busy server has given its address to its task (a rendezvous store
    listens there): the client waits for a server's greeting, sends nothing
    (its token least), and says the server may be busy. Before, it sent its
    request into whatever listened and reported "no estimator server"."""
    import socket
    import threading
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received = []

    def accept():
        conn, _ = listener.accept()
        conn.settimeout(5)
        try:
            received.append(conn.recv(4096))
        except OSError:
            received.append(b"")
        conn.close()
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        with pytest.raises(ConnectionError, match=r"127.0.0.1:\d+ \(for chief:0\) answers, but "
                                                  r"not as an estimator server.*busy"):
            remote.run_remote({"chief": [f"127.0.0.1:{port}"]}, token="x", argv=["x.py"],
                              connect_timeout=1)
        thread.join(10)
        assert received == [b""]   # nothing sent
    finally:
        listener.close()
