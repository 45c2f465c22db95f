"""`estimator serve` against TF Serving's own rules (its server's source,
tensorflow_serving/util/json_tensor.cc and http_rest_api_handler.cc): how
JSON numbers become tensors, the row format's batch, `results`, and the HTTP
a client meets (keep-alive, chunked bodies, bad requests as JSON, a stop
that does not wait on idle connections, SIGTERM). The server runs in this
process on a free port, unless the test is about the process."""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import estimator as est
from estimator import host_transform, serving
from paths import ROOT


def _model_fn(features, labels, mode):
    lin = est.get_module("lin", lambda: torch.nn.Linear(3, 2))
    x = features["x"] + features["d"].float().unsqueeze(-1) + features["n"].float().unsqueeze(-1)
    logits = lin(x) + features["flag"].float().unsqueeze(-1)
    if mode == est.ModeKeys.PREDICT:
        scores = torch.softmax(logits, -1)
        return est.EstimatorSpec(mode, predictions={"scores": scores}, export_outputs={
            "serving_default": est.export.PredictOutput({"scores": scores}),
            "with_bias": est.export.PredictOutput({"scores": scores, "bias": lin.bias * 1}),
            "scores_only": est.export.ClassificationOutput(scores=scores),
            "regress": est.export.RegressionOutput(logits[:, :1])})
    return est.EstimatorSpec(mode, loss=logits.pow(2).mean(),
                             train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)))


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http")
    batch = {"x": torch.zeros(2, 3), "d": torch.zeros(2, dtype=torch.float64),
             "n": torch.zeros(2, dtype=torch.int64), "flag": torch.zeros(2, dtype=torch.bool)}
    e = est.Estimator(_model_fn, model_dir=str(tmp / "m"))
    e.train(lambda: [(batch, None)], max_steps=1)
    return e.export_saved_model(str(tmp / "export"),
                                est.export.build_raw_serving_input_receiver_fn(batch))


@pytest.fixture(scope="module")
def model(export_dir):
    return serving.Model(export_dir)


@pytest.fixture
def served(export_dir):
    """(server, port) serving in a thread of this process; stopped after."""
    server = serving.make_server(export_dir, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(10)


def _row(**given):
    return dict({"x": [1.0, 2.0, 3.0], "d": 0.5, "n": 2, "flag": True}, **given)


@pytest.mark.parametrize("given, error", [
    # a bool input takes true or false: 0.5 and -7 were taken as true
    ({"flag": 0.5}, "0.5 is not of expected type bool: give true or false"),
    ({"flag": 1}, "1 is not of expected type bool"),
    # float32 takes no number it would lose: 1e39 was inf (NaN scores, a 200)
    ({"x": [1e39, 0.0, 0.0]}, "Cannot convert JSON value: 1e+39 to float32 without loss"),
    ({"x": [16777217, 0.0, 0.0]}, "Cannot convert JSON value: 16777217 to float32"),
    ({"d": 2 ** 53}, "Cannot convert JSON value: 9007199254740992 to float64"),
    # 2.0**63 (9223372036854775807.0 in JSON) was past int64's top, not at it: it wrapped
    ({"n": 9223372036854775807.0}, "9.223372036854776e+18 is out of the range of int64"),
    ({"n": 10 ** 30}, "1000000000000000000000000000000 is out of the range of int64"),
])
def test_numbers_are_taken_by_tf_servings_rules(model, given, error):
    with pytest.raises(serving.RequestError, match=error.replace("+", r"\+")):
        model.predict({"instances": [_row(**given)]})


def test_numbers_tf_serving_takes_are_taken(model):
    base = model.predict({"instances": [_row()]})["predictions"]
    assert np.all(np.isfinite(base))
    for given in ({"x": [float("nan"), 0.0, 0.0]}, {"x": [16777215, 0.0, 0.0]},
                  {"x": [-3.4e38, 0.0, 0.0]}, {"d": 1e300}, {"n": -2 ** 63},
                  {"flag": False}):
        assert len(model.predict({"instances": [_row(**given)]})["predictions"]) == 1


def test_a_json_example_takes_no_float_it_would_lose():
    spec = {"a": est.io.FixedLenFeature([1], torch.float32),
            "k": est.io.FixedLenFeature([1], torch.int64)}
    for value, error in (({"a": 1e39}, "without loss of precision"),
                         ({"k": 2 ** 63}, "out of the range of int64")):
        with pytest.raises(ValueError, match=error):
            host_transform.example_of(value, spec)


def test_the_row_format_needs_a_row_per_example(model):
    """An output of one row (a bias) for 3 instances answered 1 prediction,
    misaligned with the instances (TF Serving: inconsistent batch size)."""
    rows = [_row(), _row(n=1), _row(d=0.0)]
    with pytest.raises(serving.RequestError, match="Tensor name: bias has inconsistent batch "
                                                   "size: 2 expecting: 3"):
        model.predict({"signature_name": "with_bias", "instances": rows})
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    answer = model.predict({"signature_name": "with_bias", "inputs": columns})["outputs"]
    assert len(answer["scores"]) == 3 and len(answer["bias"]) == 2


def test_classify_and_regress_answer_results_and_unnamed_classes_as_tf_serving(model):
    """TF Serving's server answers under "results" (we wrote "result", as one
    section of its docs says); a score without a class is labelled ""."""
    classified = model.classify({"signature_name": "scores_only",
                                 "examples": [_row(), _row(n=0)]})
    assert set(classified) == {"results"}
    assert [[label for label, _ in row] for row in classified["results"]] == [["", ""]] * 2
    regressed = model.regress({"signature_name": "regress", "examples": [_row()]})
    assert set(regressed) == {"results"} and len(regressed["results"]) == 1


def test_a_signature_name_must_be_a_string(model):
    """A list was a 500 (unhashable type: 'list')."""
    with pytest.raises(serving.RequestError, match="'signature_name' key must be a string"):
        model.predict({"signature_name": ["with_bias"], "instances": [_row()]})


def _request(port, method, path, body=None, headers=None, connection=None):
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    return response, json.loads(data) if data else None, conn


def test_a_connection_is_kept_alive_and_takes_chunked_bodies(served):
    _, port = served
    body = json.dumps({"instances": [_row()]}).encode()
    first, answer, conn = _request(port, "POST", "/v1/models/default:predict", body)
    assert first.status == 200 and first.version == 11, answer
    second, again, _ = _request(port, "POST", "/v1/models/default:predict",
                                iter([body[:10], body[10:]]), connection=conn)
    assert second.status == 200 and again == answer   # (the same connection, chunked)
    conn.close()


@pytest.mark.parametrize("method, path, raw, headers, status, error", [
    ("PUT", "/v1/models/default:predict", b"{}", {}, 400, "Malformed request: PUT"),
    ("POST", "/v1/models/default:PREDICT", None, {}, 200, None),
    ("GET", "/v1/models/default/versions/0VERSION", None, {}, 200, None),
    ("GET", "/v1/models/default/versions/2", None, {}, 404, "Specific(default, 2)"),
    ("GET", "/v1/models/default/labels/stable", None, {}, 400,
     "Unrecognized servable version label: stable"),
    ("POST", "/v1/models/default:predict", b"[" * 100000 + b"]" * 100000, {}, 400,
     "JSON Parse error"),
    ("POST", "/v1/models/default:predict", b"", {}, 400, "The document is empty"),
])
def test_http_requests_get_tf_servings_json_answers(served, method, path, raw, headers,
                                                    status, error):
    _, port = served
    if raw is None and method == "POST":
        raw = json.dumps({"instances": [_row()]}).encode()
    path = path.replace("VERSION", served[0].model.version)
    response, answer, conn = _request(port, method, path, raw, headers)
    conn.close()
    assert response.status == status, answer
    assert error is None or error in answer["error"], answer


def _raw_exchange(port, data: bytes, then_close=True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        if then_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


@pytest.mark.parametrize("data, status, error", [
    (b"GARBAGE\r\n\r\n", b"400", b"Bad request"),
    (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n\r\n", b"411",
     b"no Content-Length"),
    (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
     b"400", b"ended after 1 bytes of its Content-Length of 100 bytes"),
])
def test_malformed_http_is_answered_in_json(served, data, status, error):
    """A bad request line was the standard library's HTML page; a body sent
    without its length was read as none ("got NoneType"); one cut short
    waited 60 s for a 500."""
    _, port = served
    answer = _raw_exchange(port, data)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split()[1] == status and error in json.loads(body)["error"].encode(), answer


def test_clients_leaving_mid_request_leave_no_traceback(served, capfd):
    _, port = served
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /v1/models/default:predict HTTP/1.1\r\nContent-Length: 50\r\n"
                         b"\r\n{\"instances\"")
    _request(port, "GET", "/v1/models/default")[2].close()   # (the server carries on)
    time.sleep(0.5)
    assert "Traceback" not in capfd.readouterr().err


def test_a_stop_does_not_wait_on_idle_connections(export_dir):
    """Ctrl-C waited out the 60 s read timeout of any idle connection (a
    client's pool opened it, or kept it alive after a request)."""
    server = serving.make_server(export_dir, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    _, _, kept_alive = _request(port, "GET", "/v1/models/default")
    opened = socket.create_connection(("127.0.0.1", port), timeout=30)
    time.sleep(0.5)   # (accepted, its thread waiting for a request)
    started = time.monotonic()
    server.shutdown()
    server.server_close()
    assert time.monotonic() - started < 10
    kept_alive.close()
    opened.close()
    thread.join(10)


def test_sigterm_stops_it_as_ctrl_c(export_dir):
    """docker stop and Kubernetes send SIGTERM: it killed the process (-15),
    dropping the requests in flight; now it stops as Ctrl-C does, exit 0."""
    import tf_cluster
    port = tf_cluster.free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "estimator", "serve", export_dir,
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _request(port, "GET", "/v1/models/default")[2].close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "stopped" in out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_damaged_export_is_said_at_load(export_dir, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(export_dir, copy)
    with open(os.path.join(copy, "signature.json"), "w") as f:
        json.dump([], f)
    with pytest.raises(ValueError, match="signature.json cannot be read: .*not an export's "
                                         "signature"):
        est.export.load(copy)


def test_an_export_missing_its_transform_is_said_at_load(tmp_path):
    """The server started and answered every request 400, blaming the client."""
    columns = [est.feature_column.indicator_column(
        est.feature_column.categorical_column_with_vocabulary_list("c", ["a", "b"]))]
    e = est.LinearClassifier(columns, model_dir=str(tmp_path / "m"))
    e.train(lambda: [({"c": np.array(["a", "b"])}, np.array([0, 1]))], max_steps=1)
    path = e.export_saved_model(str(tmp_path / "e"), est.export.build_raw_serving_input_receiver_fn(
        {"c": np.array(["a", "b"])}))
    os.remove(os.path.join(path, "transform.json"))
    with pytest.raises(ValueError, match="transform.json is missing"):
        serving.Model(path)


def test_a_version_exported_later_is_served_once_it_loads(export_dir, tmp_path, caplog):
    """As TF Serving polls its base directory (a LatestExporter of a running
    train_and_evaluate): the newest version was served till a restart. A
    version that cannot be loaded is said, and the one served stays; one
    deleted gives way to the newest left."""
    base = tmp_path / "base"
    shutil.copytree(export_dir, base / "100")
    server = serving.make_server(str(base), port=0, file_system_poll_wait_seconds=0.1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]

    def served_version():
        return _request(port, "GET", "/v1/models/default")[1][
            "model_version_status"][0]["version"]
    try:
        assert served_version() == "100"
        shutil.copytree(export_dir, base / "200")
        deadline = time.monotonic() + 30
        while served_version() != "200":
            assert time.monotonic() < deadline, "version 200 was not served in 30 s"
            time.sleep(0.1)
        (base / "300").mkdir()   # (a copy begun: a signature whose outputs are not yet)
        (base / "300" / "signature.json").write_text('{"inputs": [], "signatures": {"x": {}}}')
        deadline = time.monotonic() + 30
        while "version 300 cannot be served, version 200 stays" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.1)
        assert served_version() == "200"
        shutil.rmtree(base / "300")   # (the copy done: tried again, served; it was never)
        shutil.copytree(export_dir, base / "300")
        deadline = time.monotonic() + 30
        while served_version() != "300":
            assert time.monotonic() < deadline, "version 300 was not served in 30 s"
            time.sleep(0.1)
        body = json.dumps({"instances": [_row()]}).encode()
        answer = _request(port, "POST", "/v1/models/default/versions/300:predict", body)
        assert answer[0].status == 200, answer[1]
        gone = _request(port, "POST", "/v1/models/default/versions/100:predict", body)
        assert gone[0].status == 404, gone[1]
        shutil.rmtree(base / "300")   # the served version deleted: the newest left (it stayed)
        deadline = time.monotonic() + 30
        while served_version() != "200":
            assert time.monotonic() < deadline, "version 200 was not served in 30 s"
            time.sleep(0.1)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_get_with_a_body_does_not_desync_the_connection(served):
    """A GET's body was left unread on a kept-alive connection: it was taken
    as the next request line, and the client's next request got its 400."""
    _, port = served
    _, _, conn = _request(port, "GET", "/v1/models/default/metadata", b'{"a": 1}')
    response, answer, _ = _request(port, "POST", "/v1/models/default:predict",
                                   json.dumps({"instances": [_row()]}).encode(),
                                   connection=conn)
    conn.close()
    assert response.status == 200, answer


def _chunked(*chunks: bytes) -> bytes:
    return (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(chunks))


@pytest.mark.parametrize("data, status, error", [
    # a negative chunk lowered the total the 64 MiB limit checks
    (_chunked(b"-10000\r\n\r\n2\r\n{}\r\n0\r\n\r\n"), b"400", b"is not hex digits"),
    # data past a chunk's size was dropped: the body read as "{}"
    (_chunked(b"2\r\n{}junk\r\n0\r\n\r\n"), b"400", b"longer than its size"),
    # "\u00b2" is a digit to str.isdigit: int() raised, a 500
    (b"POST /v1/models/default:predict HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n{}",
     b"400", b"is not a number of bytes"),
    # over the limit with Expect: 100-continue: refused before the body is sent
    (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
     b"Content-Length: 999999999\r\n\r\n", b"413", b"over the limit"),
])
def test_bodies_are_read_as_http_says(served, data, status, error):
    _, port = served
    head, _, body = _raw_exchange(port, data).partition(b"\r\n\r\n")
    assert head.split()[1] == status and error in json.loads(body)["error"].encode(), head


def test_a_stop_answers_a_request_still_being_sent(export_dir):
    """A connection counted as waiting until its whole body was read: a stop
    then shut it, dropping the request the docs say is answered."""
    server = serving.make_server(export_dir, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    body = json.dumps({"instances": [_row()]}).encode()
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=30) as sock:
        sock.sendall(b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        time.sleep(0.5)
        stop = threading.Thread(target=lambda: (server.shutdown(), server.server_close()))
        stop.start()
        time.sleep(0.5)
        sock.sendall(body[5:])
        answer = sock.recv(65536)
    stop.join(30)
    thread.join(10)
    assert answer.split()[1] == b"200", answer


def test_values_are_taken_exactly_and_in_process_numpy_numbers_too(model):
    """An int64 list mixing integral floats became float64 first: 2**63 - 1
    wrapped, 2**53 + 1 rounded; a null signature_name served the default."""
    assert model._tensor("n", [2 ** 63 - 1, 1.0]).tolist() == [2 ** 63 - 1, 1]
    assert model._tensor("n", [2 ** 53 + 1, 2.0]).tolist() == [2 ** 53 + 1, 2]
    row = _row(n=np.int64(2), flag=np.bool_(True), d=np.float64(0.5))
    assert len(model.predict({"instances": [row]})["predictions"]) == 1
    with pytest.raises(serving.RequestError, match="'signature_name' key must be a string"):
        model.predict({"signature_name": None, "instances": [_row()]})
    for big in (10 ** 30, -10 ** 30):   # (a double to TF's JSON parser: in float32's range)
        assert len(model.predict({"instances": [_row(x=[big, 0.0, 0.0])]})["predictions"]) == 1
