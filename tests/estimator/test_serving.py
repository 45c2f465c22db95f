"""`estimator serve`: TF Serving's REST API over an export, started as a
process on a free port and queried over HTTP as a TF Serving client would."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

import estimator as est
from paths import ROOT

fc = est.feature_column


def _trained_export(tmp, hidden_units=(6,), steps=30):
    """A binary DNNClassifier over two numeric columns, trained and exported
    with a raw receiver; (estimator, export base, features)."""
    rng = np.random.RandomState(0)
    x = rng.randn(64, 2).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    features = {"a": x[:, 0], "b": x[:, 1]}
    estimator = est.DNNClassifier(list(hidden_units), [fc.numeric_column("a"),
                                                       fc.numeric_column("b")],
                                  model_dir=str(tmp / "model"))
    estimator.train(lambda: [(features, y)] * steps, max_steps=steps)
    return estimator, _raw_export(estimator, str(tmp / "export")), features


def _raw_export(estimator, base: str) -> str:
    """`estimator` exported under `base` with a raw receiver of the float inputs a and b."""
    estimator.export_saved_model(base, est.export.build_raw_serving_input_receiver_fn(
        {"a": torch.zeros(2), "b": torch.zeros(2)}))
    return base


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return _trained_export(tmp_path_factory.mktemp("serving"))


def _start_server(base, model_name="census"):
    """`estimator serve base` as a process on a free port, once it answers:
    (process, the model's URL)."""
    import tf_cluster
    port = tf_cluster.free_ports(1)[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "estimator", "serve", base, "--port", str(port),
         "--model_name", model_name], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    url = f"http://127.0.0.1:{port}/v1/models/{model_name}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return proc, url
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the server did not start in 60 s"
            time.sleep(0.1)


def _end(proc):
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(exported):
    proc, url = _start_server(exported[1])
    yield url, proc
    _end(proc)


def _post(url, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _predicted(estimator, features, key):
    return np.stack([p[key] for p in estimator.predict(lambda: [(features, None)])])


def test_status_and_metadata(server):
    url, _ = server
    status = json.loads(urllib.request.urlopen(url).read())
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    metadata = json.loads(urllib.request.urlopen(url + "/metadata").read())
    signatures = metadata["metadata"]["signature_def"]["signature_def"]
    assert set(signatures) == {"serving_default", "classification", "regression", "predict"}
    # TF Serving's TensorInfo JSON: TF's dtype names, -1 for the batch, int64s as strings
    classification = signatures["classification"]
    assert classification["method_name"] == "tensorflow/serving/classify"
    assert classification["inputs"]["a"] == {
        "dtype": "DT_FLOAT", "tensor_shape": {"dim": [{"size": "-1", "name": ""}],
                                              "unknown_rank": False}, "name": "a:0"}
    scores, classes = classification["outputs"]["scores"], classification["outputs"]["classes"]
    assert scores["dtype"] == "DT_FLOAT" and classes["dtype"] == "DT_STRING"
    assert [d["size"] for d in scores["tensor_shape"]["dim"]] == ["-1", "2"]
    assert [d["size"] for d in classes["tensor_shape"]["dim"]] == ["-1", "2"]
    assert signatures["predict"]["outputs"]["class_ids"]["dtype"] == "DT_INT64"


def test_predict_rows_and_columns_equal_estimator_predict(server, exported):
    url, _ = server
    estimator, _, features = exported
    rows = [{"a": float(a), "b": float(b)} for a, b in zip(features["a"][:5], features["b"][:5])]
    status, body = _post(url + ":predict", {"signature_name": "predict", "instances": rows})
    assert status == 200, body
    probabilities = _predicted(estimator, {k: v[:5] for k, v in features.items()},
                               "probabilities")
    np.testing.assert_allclose([p["probabilities"] for p in body["predictions"]],
                               probabilities, rtol=1e-5)
    status, body = _post(url + ":predict", {"signature_name": "predict", "inputs": {
        "a": features["a"][:5].tolist(), "b": features["b"][:5].tolist()}})
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"]["probabilities"], probabilities, rtol=1e-5)


def test_classify_and_regress_equal_estimator_predict(server, exported):
    url, _ = server
    estimator, _, features = exported
    examples = [{"a": float(a), "b": float(b), "unused": "x"}
                for a, b in zip(features["a"][:4], features["b"][:4])]
    first = {k: v[:4] for k, v in features.items()}
    status, body = _post(url + ":classify", {"examples": examples})
    assert status == 200, body
    probabilities = _predicted(estimator, first, "probabilities")
    assert [[c for c, _ in r] for r in body["results"]] == [["0", "1"]] * 4
    np.testing.assert_allclose([[s for _, s in r] for r in body["results"]], probabilities,
                               rtol=1e-5)
    status, body = _post(url + ":regress", {"signature_name": "regression",
                                            "examples": examples})
    assert status == 200, body
    np.testing.assert_allclose(body["results"], _predicted(estimator, first, "logistic")[:, 0],
                               rtol=1e-5)


@pytest.mark.parametrize("body, raw, status, field", [
    ({"instances": [{"a": 1.0}]}, None, 400, "instances[0]: missing input(s) ['b']"),
    ({"instances": [{"a": 1.0, "b": 2.0, "c": 3}]}, None, 400, "unknown input(s) ['c']"),
    ({"signature_name": "nope", "instances": [1]}, None, 400, "signature_name: 'nope'"),
    ({"inputs": {"a": [1.0], "b": [1.0]}, "instances": []}, None, 400, "exactly one of"),
    ({"inputs": {"a": ["x"], "b": [1.0]}}, None, 400, "input 'a'"),
    ({"inputs": {"a": [1.0, "2"], "b": [1.0, 2.0]}}, None, 400,
     "input 'a': cannot make a float32 tensor of the values given (\"2\" is not of expected "
     "type float32)"),
    ({"inputs": {"a": [1.0, None], "b": [1.0, 2.0]}}, None, 400,
     "(null is not of expected type float32)"),
    ({"signature_name": "predict", "examples": [{"a": 1.0, "b": 2.0}]}, None, 400,
     "needs one of ['serving_default', 'classification']"),
    ({"instances": []}, None, 400, "instances must be a non-empty list, got an empty list"),
    (None, b"{not json", 400, "JSON Parse error"),
    (None, b"[1, 2]", 400, "must be a JSON object"),
])
def test_bad_requests_get_400_naming_the_field(server, body, raw, status, field):
    url, proc = server
    verb = ":classify" if body and "examples" in body else ":predict"
    code, answer = _post(url + verb, body, raw)
    assert code == status and field in answer["error"], answer
    assert proc.poll() is None   # still serving
    assert _post(url + ":predict", {"instances": [{"a": 0.5, "b": 0.5}]})[0] == 200


def test_unknown_model_or_version_is_404(server):
    url, _ = server
    assert _post(url.replace("census", "other") + ":predict", {"instances": []})[0] == 404
    assert _post(url + "/versions/1:predict", {"instances": []})[0] == 404


def test_concurrent_requests(server):
    """24 clients at once (the standard library's listen backlog of 5 reset
    connections at 20), each answered with its own rows."""
    from concurrent.futures import ThreadPoolExecutor
    url, _ = server
    bodies = [{"instances": [{"a": 0.1 * i, "b": -0.2 * j} for i in range(1 + j % 5)]}
              for j in range(48)]
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda body: _post(url + ":predict", body), bodies))
    assert all(code == 200 for code, _ in answers)
    assert [len(a["predictions"]) for _, a in answers] == [1 + j % 5 for j in range(48)]
    same = [j for j in range(48) if bodies[j] == bodies[0]]
    assert all(answers[j][1] == answers[0][1] for j in same)


def test_a_content_length_that_is_not_a_number_is_a_400(server):
    import http.client
    url, proc = server
    host, port = url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", url.split(port, 1)[1] + ":predict")
    connection.putheader("Content-Length", "abc")
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 400
    assert "Content-Length: 'abc' is not a number of bytes" in json.loads(response.read())["error"]
    connection.close()
    assert proc.poll() is None


def test_integers_out_of_an_inputs_range_are_refused_not_wrapped(tmp_path):
    """int32 2**40 reached the model as 0, uint8 300 as 44, -1 as 255: a 200
    with a wrong answer (TF Serving: a 400 naming the type)."""
    def model_fn(features, labels, mode):
        lin = est.get_module("lin", lambda: torch.nn.Linear(1, 1))
        out = lin(features["n"].float().unsqueeze(-1))
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"n": features["n"] * 1,
                                                        "u": features["u"] * 1, "out": out})
        return est.EstimatorSpec(mode, loss=out.pow(2).mean(), train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    batch = {"n": torch.tensor([1, 2], dtype=torch.int32),
             "u": torch.tensor([3, 4], dtype=torch.uint8)}
    e.train(lambda: [(batch, None)], max_steps=1)
    path = e.export_saved_model(str(tmp_path / "export"),
                                est.export.build_raw_serving_input_receiver_fn(batch))
    model = est.serving.Model(path)
    answer = model.predict({"instances": [{"n": 2 ** 31 - 1, "u": 255}, {"n": -2 ** 31, "u": 0}]})
    assert [(p["n"], p["u"]) for p in answer["predictions"]] == [(2 ** 31 - 1, 255),
                                                                 (-2 ** 31, 0)]
    for n, u, said in ((2 ** 40, 1, "1099511627776 is out of the range of int32"),
                       (-2 ** 31 - 1, 1, "-2147483649 is out of the range of int32"),
                       (1, 300, "300 is out of the range of uint8 [0, 255]"),
                       (1, -1, "-1 is out of the range of uint8")):
        with pytest.raises(est.serving.RequestError, match=re.escape(said)):
            model.predict({"instances": [{"n": n, "u": u}]})


def test_ctrl_c_stops_it_cleanly(server):
    url, proc = server
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped" in out


@pytest.mark.slow
def test_ctrl_c_under_load_answers_the_requests_in_flight_and_exits_cleanly(tmp_path):
    """Ctrl-C while clients keep the server busy: the requests in flight are
    answered and the process exits 0. It aborted (-6, a request thread still
    in the model while the interpreter exited) in 8 of 8 tries before."""
    _, base, _ = _trained_export(tmp_path, hidden_units=(256, 256), steps=5)
    proc, url = _start_server(base)
    try:
        deadline = time.monotonic() + 60
        body = {"instances": [{"a": float(i % 7), "b": 0.5} for i in range(3000)]}
        stop, answered = threading.Event(), []

        def client():
            while not stop.is_set():
                try:
                    answered.append(_post(url + ":predict", body)[0])
                except (urllib.error.URLError, ConnectionError):
                    pass   # after the server closed
        clients = [threading.Thread(target=client) for _ in range(6)]
        for c in clients:
            c.start()
        while len(answered) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        stop.set()
        for c in clients:
            c.join(60)
        assert proc.returncode == 0, err[-3000:]
        assert "stopped" in out
        assert answered and set(answered) == {200}, answered
    finally:
        _end(proc)


def test_census_tfrecord_pipeline_example(tmp_path):
    """examples/census_tfrecord_serving.py: TFRecord -> canned estimator ->
    export -> estimator serve -> HTTP, end to end."""
    import importlib
    example = importlib.import_module("examples.census_tfrecord_serving")
    out = example.main(["--workdir", str(tmp_path), "--train_steps", "60"])
    assert out["eval"]["global_step"] == 60 and out["eval"]["auc"] > 0.6
    probability = out["classify"]["results"][0][1][1]
    assert probability == pytest.approx(out["predict"]["predictions"][0]["logistic"][0],
                                        rel=1e-5)


@pytest.mark.parametrize("kind", ["three_classes", "multi_label"])
def test_classify_answers_with_the_class_names_as_tf_serving(tmp_path, kind):
    """TF Serving answers `:classify` with TF's string classes (the label
    vocabulary), under the key "results"; `:predict` on the classification
    signature gives them as `classes` too. A 3-class DNNClassifier and a
    multi-label DNNEstimator, each over a label vocabulary."""
    rng = np.random.RandomState(1)
    x = rng.randn(64, 2).astype(np.float32)
    features = {"a": x[:, 0], "b": x[:, 1]}
    columns = [fc.numeric_column("a"), fc.numeric_column("b")]
    words = ["cat", "dog", "eel"]
    if kind == "three_classes":
        labels = np.array(words)[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0)]
        estimator = est.DNNClassifier([4], columns, model_dir=str(tmp_path / "m"), n_classes=3,
                                      label_vocabulary=words)
    else:
        labels = np.where(np.stack([x[:, 0] > 0, x[:, 1] > 0, x.sum(1) > 1], 1),
                          np.array(words), "")
        estimator = est.DNNEstimator(est.MultiLabelHead(3, label_vocabulary=words), [4],
                                     columns, model_dir=str(tmp_path / "m"))
    estimator.train(lambda: [(features, labels)] * 10, max_steps=10)
    proc, url = _start_server(_raw_export(estimator, str(tmp_path / "export")))
    try:
        examples = [{"a": float(a), "b": float(b)} for a, b in zip(x[:3, 0], x[:3, 1])]
        status, body = _post(url + ":classify", {"examples": examples})
        assert status == 200, body
        assert set(body) == {"results"}
        assert [[c for c, _ in r] for r in body["results"]] == [words] * 3
        probabilities = _predicted(estimator, {k: v[:3] for k, v in features.items()},
                                   "probabilities")
        np.testing.assert_allclose([[s for _, s in r] for r in body["results"]], probabilities,
                                   rtol=1e-5)
        status, body = _post(url + ":predict", {"signature_name": "classification",
                                                "instances": examples})
        assert status == 200, body
        assert [p["classes"] for p in body["predictions"]] == [words] * 3
        status, body = _post(url + ":predict", {"signature_name": "predict",
                                                "instances": examples})
        assert status == 200, body
        if kind == "multi_label":   # TF's predict signature: every class name
            assert [p["classes"] for p in body["predictions"]] == [words] * 3
        else:   # TF's predict signature: classes and all_classes
            predicted = list(estimator.predict(lambda: [({k: v[:3] for k, v in
                                                          features.items()}, None)]))
            assert [p["classes"] for p in body["predictions"]] == [
                [p["classes"][0].decode()] for p in predicted]
            assert [p["all_classes"] for p in body["predictions"]] == [words] * 3
            metadata = json.loads(urllib.request.urlopen(url + "/metadata").read())
            outputs = metadata["metadata"]["signature_def"]["signature_def"]["predict"]
            assert {"classes", "all_classes", "class_ids"} <= set(outputs["outputs"])
    finally:
        _end(proc)


def test_class_names_must_be_strings():
    with pytest.raises(ValueError, match="ClassificationOutput: class_names must be a list "
                                         "of str, got 'ab'"):
        est.export.ClassificationOutput(scores=torch.zeros(1, 2), class_names="ab")
    with pytest.raises(ValueError, match="named output 'classes' names the ids of output "
                                         "'ids', which it does not have"):
        est.export.PredictOutput({"scores": torch.zeros(1, 2)}, ["a", "b"], {"classes": "ids"})
    with pytest.raises(ValueError, match="named output 'classes' has no class names"):
        est.export.PredictOutput({"ids": torch.zeros(1, 2)}, named_outputs={"classes": "ids"})


def test_a_multi_head_predict_signature_names_each_heads_classes(tmp_path):
    """MultiHead's merged `predict` signature: each head's string classes with
    its own vocabulary (TF's `<head>/classes`)."""
    rng = np.random.RandomState(2)
    x = rng.randn(32, 2).astype(np.float32)
    features = {"a": x[:, 0], "b": x[:, 1]}
    head = est.MultiHead([est.BinaryClassHead(label_vocabulary=["no", "yes"], name="flag"),
                          est.MultiClassHead(3, label_vocabulary=["s", "m", "l"], name="size")])
    labels = {"flag": np.where(x[:, 0] > 0, "yes", "no"),
              "size": np.array(["s", "m", "l"])[(x[:, 1] > -0.5).astype(int) + (x[:, 1] > 0.5)]}
    estimator = est.DNNEstimator(head, [4], [fc.numeric_column("a"), fc.numeric_column("b")],
                                 model_dir=str(tmp_path / "m"))
    estimator.train(lambda: [(features, labels)] * 5, max_steps=5)
    proc, url = _start_server(_raw_export(estimator, str(tmp_path / "export")))
    try:
        rows = [{"a": float(a), "b": float(b)} for a, b in x[:3]]
        status, body = _post(url + ":predict", {"signature_name": "predict", "instances": rows})
        assert status == 200, body
        predicted = list(estimator.predict(lambda: [({k: v[:3] for k, v in features.items()},
                                                     None)]))
        for served, ours in zip(body["predictions"], predicted):
            assert served["flag/classes"] == [ours[("flag", "classes")][0].decode()]
            assert served["size/classes"] == [ours[("size", "classes")][0].decode()]
            assert served["size/all_classes"] == ["s", "m", "l"]
            assert served["flag/all_classes"] == ["no", "yes"]
    finally:
        _end(proc)


def _serve_error(args, capsys) -> str:
    """`estimator serve ARGS`'s exit code and its error line (it must not start)."""
    from estimator.experiment import cli
    try:
        code = cli.main(["serve", *args])
    except SystemExit as e:   # (argparse's errors)
        code = e.code
    assert code == 2
    return capsys.readouterr().err


def test_serve_errors_name_the_file_the_port_or_the_path(exported, tmp_path, capsys):
    """Each was a traceback (OverflowError, zipfile.BadZipFile), a JSON error
    naming no file, or "Address already in use" naming no address."""
    import shutil
    import socket
    base = exported[1]
    [version] = os.listdir(base)
    assert "'99999': a port is a number 0-65535" in _serve_error([base, "--port", "99999"],
                                                                 capsys)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in \
            _serve_error([base, "--port", str(port)], capsys)
    for name, damage in (("model.pt2", lambda b: b[:len(b) // 2]),
                         ("signature.json", lambda b: b"{" + b)):
        bad = tmp_path / name / version
        shutil.copytree(os.path.join(base, version), bad)
        (bad / name).write_bytes(damage((bad / name).read_bytes()))
        assert f"error: {bad / name} cannot be read: it is damaged or not written by " \
               "export_saved_model" in _serve_error([str(bad), "--port", "0"], capsys)
    assert "no such directory" in _serve_error([str(tmp_path / "nope"), "--port", "0"], capsys)
    model_dir = tmp_path / "run"
    shutil.copytree(base, model_dir / "export" / "final")
    assert "exports under it: export/final" in _serve_error([str(model_dir), "--port", "0"],
                                                            capsys)


def test_export_into_a_file_says_so(exported, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("kept")
    with pytest.raises(ValueError, match=r"export_dir_base '.*afile' is a file, not a "
                                         r"directory"):
        _raw_export(exported[0], str(afile))
    assert afile.read_text() == "kept"


def test_regress_refuses_several_values_an_example_as_tf_serving(tmp_path):
    """A regressor of label_dimension 2: TF Serving's :regress answers 400 (a
    value per example); it gave a flat list of twice the examples (interop probe)."""
    estimator = est.LinearRegressor([fc.numeric_column("a"), fc.numeric_column("b")],
                                    label_dimension=2, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: [({"a": np.ones(4, np.float32), "b": np.zeros(4, np.float32)},
                              np.ones((4, 2), np.float32))], steps=1)
    model = est.serving.Model(_raw_export(estimator, str(tmp_path / "export")))
    examples = [{"a": 1.0, "b": 2.0}] * 3
    with pytest.raises(est.serving.RequestError, match=re.escape(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
            "[3, 2]")):
        model.regress({"signature_name": "regression", "examples": examples})
    predictions = model.predict({"signature_name": "predict", "instances": examples})
    assert np.shape(predictions["predictions"]) == (3, 2)


def test_example_values_of_another_kind_are_refused_as_tf_serving():
    """A bool or a string for a float feature, a string for an int64 one:
    TF Serving's JSON makes them features of another kind, which the spec
    refuses (400); they were taken as 1.0 and 2.0 (interop probe)."""
    spec = {"x": est.io.FixedLenFeature([1], torch.float32),
            "n": est.io.FixedLenFeature([1], torch.int64)}
    est.host_transform.example_of({"x": 2, "n": 2.0}, spec)
    for values, said in (({"x": True}, "feature 'x': True is not a float32 value"),
                         ({"x": "2.0"}, "feature 'x': '2.0' is not a float32 value"),
                         ({"n": "10090"}, "feature 'n': '10090' is not a int64 value")):
        with pytest.raises(ValueError, match=re.escape(said)):
            est.host_transform.example_of(values, spec)


def test_an_export_needing_a_function_of_the_exporting_main_says_so(tmp_path):
    """A receiver whose features function lives in the exporting script's
    __main__ (as TF1 trainers define theirs): the export warns, and loading
    it elsewhere says what to do, not that the file is damaged."""
    script = tmp_path / "trainer.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {ROOT!r})
import torch
import estimator as est


def to_features(receiver):   # (a CSV line a request: work on the host)
    x, = est.io.decode_csv(receiver["csv"], [[0.0]])
    return {{"x": torch.as_tensor(x).reshape(-1, 1)}}


def model_fn(features, labels, mode):
    net = est.get_module("net", lambda: torch.nn.Linear(1, 1))
    out = net(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={{"y": out}})
    loss = ((out - labels) ** 2).mean()
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)))


e = est.Estimator(model_fn, model_dir={str(tmp_path / "model")!r})
e.train(lambda: [({{"x": torch.ones(4, 1)}}, torch.ones(4, 1))], steps=1)
print(e.export_saved_model({str(tmp_path / "export")!r}, lambda: est.export.ServingInputReceiver(
    to_features, {{"csv": est.export.placeholder(str, [None], fill_value="1")}})))
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "recorded from __main__" in done.stderr
    path = done.stdout.strip().splitlines()[-1]
    with pytest.raises(ValueError, match="names a function the exporting program defined in "
                                         "its __main__ .* define it in a module on the "
                                         "server's sys.path"):
        est.export.load(path)
