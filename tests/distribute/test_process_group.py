"""How a replica's transport failure is explained (`ProcessGroup.explain`),
from what its peers wrote in a real rendezvous store: deterministic cases
of races the multi-process tests meet only sometimes."""
import pytest

import distribute
from distribute import _process_group


@pytest.fixture
def group_of_two():
    store = _process_group.host_store("127.0.0.1", 0, 10.0)
    group = _process_group.ProcessGroup(1, 2, "gloo", store, f"127.0.0.1:{store.port}",
                                        lambda r: f"replica {r} (cpu:{r})", 4.0)
    yield group
    del store


def test_a_peers_timeout_seen_as_a_closed_connection_still_names_the_likely_cause(group_of_two):
    """Replica 0 timed out waiting in a collective replica 1 never made, and
    its timeout closed the connection replica 1 waited on (CI saw this
    race): replica 1's error still says the steps did not make the same
    collectives."""
    group_of_two.store.set("failed/0", "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                           "waiting 4000ms for recv operation to complete")
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                          "[127.0.0.1]:12164")
    error = group_of_two.explain(closed, "DDP's forward")
    assert isinstance(error, distribute.ReplicaFailedError)
    assert "Connection closed by peer" in str(error)
    assert "each waited for the others: their steps did not make the same collectives" \
        in str(error)


def test_a_closed_connection_without_any_timeout_gives_no_such_cause(group_of_two):
    group_of_two.store.set("failed/0", "[gloo/transport/tcp/pair.cc:553] Connection reset "
                           "by peer")
    error = group_of_two.explain(RuntimeError("[gloo] Connection closed by peer"), "x")
    assert "every replica reported a failure" in str(error)
    assert "each waited" not in str(error)


def test_a_peers_own_error_is_named(group_of_two):
    group_of_two.store.set("error/0", "ValueError: bad feature 'age' at line 3")
    error = group_of_two.explain(RuntimeError("[gloo] Connection closed by peer"),
                                 "the gradient all-reduce")
    assert str(error) == ("the gradient all-reduce failed on replica 1 (cpu:1): replica 0 "
                          "(cpu:0) failed: ValueError: bad feature 'age' at line 3")


def test_a_rendezvous_port_in_use_names_the_address():
    """A chief's (or ps 0's) port held by another process: "[Errno 98]
    Address already in use" named neither the address nor what it was for
    (fault probe)."""
    import errno
    held = _process_group.listening_socket("127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        with pytest.raises(OSError, match=rf"cannot listen at 127.0.0.1:{port}, this task's "
                                          r"address in the cluster \(TF_CONFIG\), for the "
                                          "rendezvous: Address already in use") as raised:
            _process_group.listening_socket("127.0.0.1", port)
        assert raised.value.errno == errno.EADDRINUSE
    finally:
        held.close()


@pytest.mark.parametrize("answer", ["closes", "stays silent"])
def test_a_port_another_program_holds_is_said_not_waited_on(monkeypatch, answer):
    """The chief could not listen (another program held its TF_CONFIG port),
    and the worker, connected to that program, retried for the store's whole
    timeout (30 minutes) with C++ stack traces (YAML journey probe)."""
    import socket
    import threading
    import time
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            if answer == "closes":
                conn.close()
            else:
                held.append(conn)
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    monkeypatch.setattr(_process_group, "_ATTEMPT_SECS", 0.5)
    monkeypatch.setattr(_process_group, "_UNANSWERED_SECS", 1.0)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"accepts connections but has not answered as "
                                               r"the rendezvous store of the chief at .*another "
                                               r"program listens there"):
            _process_group._connect("127.0.0.1", server.getsockname()[1], False, 60.0,
                                    "the chief")
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()
    assert time.monotonic() - start < 20
