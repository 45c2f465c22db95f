"""`est.forward_features` in an export, as Cloud ML's trainers use it: an
example key forwarded into the predictions comes back from the exported
signatures and the server with each request's own values (TF adds the
feature to its `predict` and predict `serving_default` outputs), strings
included, the canned head's string classes kept."""
import base64
import json
import threading
import urllib.request

import numpy as np
import pytest
import torch

import estimator as est
from estimator import serving

fc = est.feature_column
COLORS = ["red", "green", "blue"]


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    return {"a": rng.normal(size=n).astype(np.float32), "color": rng.choice(COLORS, n),
            "id": np.arange(n, dtype=np.int64) + 100,
            "key": np.array([f"row-{seed}-{i}" for i in range(n)])}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forward")
    color = fc.categorical_column_with_vocabulary_list("color", COLORS)
    base = est.LinearClassifier([fc.numeric_column("a"), color], label_vocabulary=["no", "yes"],
                                model_dir=str(tmp / "model"))
    rows = _rows(64)
    labels = np.where(rows["a"] > 0, "yes", "no")
    base.train(lambda: [(rows, labels)] * 10, max_steps=10)
    forwarding = est.forward_features(base, ["key", "id"])
    raw = forwarding.export_saved_model(
        str(tmp / "raw"), est.export.build_raw_serving_input_receiver_fn({
            "a": torch.zeros(2), "color": np.array(["red", "blue"]),
            "id": torch.zeros(2, dtype=torch.int64), "key": np.array(["k1", "k2"])}))
    spec = {**fc.make_parse_example_spec([fc.numeric_column("a"), color]),
            "id": est.io.FixedLenFeature([], torch.int64),
            "key": est.io.FixedLenFeature([], str)}
    parsing = forwarding.export_saved_model(
        str(tmp / "parsing"), est.export.build_parsing_serving_input_receiver_fn(spec))
    return base, forwarding, raw, parsing, spec


def _inputs(rows):
    return {"a": torch.from_numpy(rows["a"]), "color": rows["color"],
            "id": torch.from_numpy(rows["id"]), "key": rows["key"]}


@pytest.mark.parametrize("n", [1, 7])
def test_loaded_signatures_give_the_forwarded_key(model, n):
    base, forwarding, raw, parsing, spec = model
    rows = _rows(n, seed=n)
    expected = list(forwarding.predict(lambda: [rows]))
    outputs = est.export.load(raw).signatures["predict"](**_inputs(rows))
    assert list(outputs["key"]) == [p["key"] for p in expected] == [
        k.encode() for k in rows["key"]]   # TF's string tensor: bytes
    assert outputs["id"].tolist() == rows["id"].tolist()
    np.testing.assert_allclose(outputs["logistic"].numpy()[:, 0],
                               [p["logistic"][0] for p in expected], rtol=1e-5)
    examples = [est.host_transform.example_of(
        {k: v[i].item() for k, v in rows.items()}, spec) for i in range(n)]
    by_examples = est.export.load(parsing).signatures["predict"](examples=examples)
    assert list(by_examples["key"]) == [k.encode() for k in rows["key"]]
    assert by_examples["id"].tolist() == rows["id"].tolist()


def test_signature_json_names_the_forwarded_feature(model):
    _, _, raw, _, _ = model
    with open(f"{raw}/signature.json") as f:
        predict = json.load(f)["signatures"]["predict"]
    assert predict["forwarded"] == {"key": "key"}
    assert {"name": "key", "dtype": "string", "shape": [None]} in predict["outputs"]
    assert "id" in [o["name"] for o in predict["outputs"]]


def _post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_server_answers_with_the_key_and_the_class_names(model):
    _, forwarding, raw, _, _ = model
    server = serving.make_server(raw, port=0, model_name="m")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/models/m"
        rows = _rows(3, seed=5)
        instances = [{"a": float(rows["a"][i]), "color": str(rows["color"][i]),
                      "id": int(rows["id"][i]), "key": str(rows["key"][i])} for i in range(3)]
        answer = _post(url + ":predict", {"signature_name": "predict", "instances": instances})
        expected = list(forwarding.predict(lambda: [rows]))
        assert [p["key"] for p in answer["predictions"]] == list(rows["key"])
        assert [p["id"] for p in answer["predictions"]] == rows["id"].tolist()
        assert [p["classes"] for p in answer["predictions"]] == [
            [c.decode() for c in p["classes"]] for p in expected]
        metadata = json.loads(urllib.request.urlopen(url + "/metadata", timeout=30).read())
        outputs = metadata["metadata"]["signature_def"]["signature_def"]["predict"]["outputs"]
        assert outputs["key"]["dtype"] == "DT_STRING"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_binary_outputs_are_base64_as_tf_serving_gives_them():
    values = np.array([b"\xff\x00", b"text"], dtype=object)
    assert serving._json_strings("key", values).tolist() == [
        {"b64": base64.b64encode(b"\xff\x00").decode()}, "text"]
    assert serving._json_strings("key_bytes", values)[1] == {"b64": "dGV4dA=="}


def test_a_string_output_not_a_feature_is_refused(tmp_path):
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(1, 1))
        y = net(features["a"][:, None])
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={
                "y": y, "key": features["key"], "made": np.array(["x"] * len(y))})
        return est.EstimatorSpec(mode, loss=y.pow(2).mean(),
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    rows = {"a": np.ones(4, np.float32), "key": np.array(list("abcd"))}
    estimator.train(lambda: [(rows, np.ones(4, np.float32))], max_steps=1)
    receiver = est.export.build_raw_serving_input_receiver_fn(
        {"a": torch.zeros(2), "key": np.array(["k1", "k2"])})
    with pytest.raises(ValueError, match=r"predictions\['made'\] is ndarray, not a tensor: an "
                                         "export serves tensors, and string features"):
        estimator.export_saved_model(str(tmp_path / "e"), receiver)
