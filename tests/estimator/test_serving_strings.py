"""Exports that take strings or serialized tf.Examples (TF's parsing and raw
string receivers): the torch program plus the recorded host-side feature
transform, loaded in Python and served over TF Serving's REST API, against
`Estimator.predict` on the same rows, with the cases real data brings
(out-of-vocabulary and missing values, several values in a row, a vocabulary
file, batches of 1 and 7)."""
import base64
import json
import os

import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

import estimator as est
from estimator import serving
from estimator.host_transform import example_of

fc = est.feature_column
EDUCATION = ["Bachelors", "HS-grad", "Masters", "Doctorate"]


def scaled(t):
    """A normalizer_fn: module-level, so an export records it by name."""
    return t / 10.0


def _columns(vocab_file):
    age = fc.numeric_column("age", normalizer_fn=scaled)
    education = fc.categorical_column_with_vocabulary_list("education", EDUCATION,
                                                           num_oov_buckets=1)
    occupation = fc.categorical_column_with_hash_bucket("occupation", 20)
    tags = fc.categorical_column_with_vocabulary_file("tags", vocab_file, num_oov_buckets=0)
    deep = [age, fc.embedding_column(occupation, 3), fc.indicator_column(education),
            fc.embedding_column(tags, 2, combiner="sqrtn")]
    wide = [age, education, occupation, tags,
            fc.crossed_column(["education", "occupation"], 30),
            fc.crossed_column([fc.bucketized_column(age, [2.0, 4.0]), "occupation"], 25),
            fc.bucketized_column(fc.numeric_column("hours"), [20.0, 40.0])]
    return deep, wide


def _rows(rng, n):
    """Census-like rows: strings from numpy, a variable number of tags (some
    rows none, some unknown), unknown educations and occupations."""
    return {"age": rng.uniform(18, 70, n).astype(np.float32),
            "hours": rng.uniform(5, 60, n).astype(np.float32),
            "education": rng.choice(EDUCATION + ["9th"], n),
            "occupation": rng.choice(["Sales", "Tech", "Farming", "Other"], n),
            "tags": [list(rng.choice(["x", "y", "z", "new"], rng.randint(0, 4)))
                     for _ in range(n)]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strings")
    vocab = tmp / "tags.txt"
    vocab.write_text("x\ny\nz\n")
    deep, wide = _columns(str(vocab))
    rng = np.random.RandomState(0)
    batches = []
    for _ in range(20):
        rows = _rows(rng, 32)
        batches.append((rows, (rows["age"] > 40).astype(np.int64)))
    estimator = est.DNNLinearCombinedClassifier(
        model_dir=str(tmp / "model"), linear_feature_columns=wide, dnn_feature_columns=deep,
        dnn_hidden_units=[8])
    estimator.train(lambda: batches, max_steps=20)
    spec = fc.make_parse_example_spec(deep + wide)
    parsing = estimator.export_saved_model(
        str(tmp / "parsing"), est.export.build_parsing_serving_input_receiver_fn(spec))
    raw = estimator.export_saved_model(
        str(tmp / "raw"), est.export.build_raw_serving_input_receiver_fn(
            {"age": torch.zeros(2), "hours": torch.zeros(2),
             "education": np.array(["a", "b"]), "occupation": np.array(["a", "b"]),
             "tags": [["x"], []]}))
    # The export carries its own copy of the vocabulary file.
    os.remove(vocab)
    return estimator, spec, parsing, raw, tmp


def _predicted(estimator, rows):
    vocab = str(os.path.join(os.path.dirname(estimator.model_dir), "tags.txt"))
    with open(vocab, "w") as f:   # (predict reads the file the columns name)
        f.write("x\ny\nz\n")
    try:
        return np.stack([p["logistic"] for p in estimator.predict(lambda: [rows])])
    finally:
        os.remove(vocab)


def _examples(rows, spec):
    n = len(rows["age"])
    return [example_of({k: (v[i].tolist() if hasattr(v[i], "tolist") else v[i])
                        for k, v in rows.items()}, spec) for i in range(n)]


@pytest.mark.parametrize("n", [1, 7])
def test_loaded_exports_equal_estimator_predict(trained, n):
    estimator, spec, parsing, raw, _ = trained
    rows = _rows(np.random.RandomState(n), n)
    expected = _predicted(estimator, rows)
    loaded = est.export.load(parsing)
    by_examples = loaded.signatures["predict"](examples=_examples(rows, spec))
    np.testing.assert_allclose(by_examples["logistic"].numpy(), expected, rtol=1e-5,
                               atol=1e-6)
    # TF's classify / regress signatures name the serialized Examples `inputs`
    scores = loaded.signatures["classification"](inputs=_examples(rows, spec))["scores"]
    np.testing.assert_allclose(scores.numpy()[:, 1], expected[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loaded.signatures["regression"](
        inputs=_examples(rows, spec))["outputs"].numpy().reshape(-1), expected[:, 0],
        rtol=1e-5, atol=1e-6)
    inputs = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
                  else v) for k, v in rows.items()}
    by_strings = est.export.load(raw).signatures["predict"](**inputs)
    np.testing.assert_allclose(by_strings["logistic"].numpy(), expected, rtol=1e-5,
                               atol=1e-6)


def test_a_loaded_export_checks_string_inputs_nesting_as_tfs_signature(trained):
    """TF's signature refuses an input not of its TensorSpec's shape. A
    string per example where a list of strings ([batch, any]) was declared
    was taken as one unknown word: a client sending a sentence where the
    receiver took its words got an answer, not an error."""
    raw = est.export.load(trained[3]).signatures["predict"]
    rows = {"age": torch.tensor([44.0]), "hours": torch.tensor([40.0]),
            "education": np.array(["Masters"]), "occupation": np.array(["Tech"])}
    raw(**rows, tags=[["x", "y"]])
    for tags, error in [
            (["x y"], r"input 'tags'\[0\]: expected a list of values, got str 'x y'; "
                      r"the input's shape is \[batch, any\]"),
            (np.array(["x y"]), r"input 'tags': expected shape \[batch, any\], got \[1\]"),
            ([[["x"]]], r"input 'tags'\[0\]\[0\]: expected a string, got a list"),
            ("x y", r"input 'tags': expected a list of values, one per example")]:
        with pytest.raises(ValueError, match=error):
            raw(**rows, tags=tags)
    with pytest.raises(ValueError, match=r"input 'education'\[0\]: expected one string per "
                                         r"example, got a list; the input's shape is \[batch\]"):
        raw(**dict(rows, education=[["Masters"]]), tags=[["x"]])


def test_export_records_the_transform_and_copies_the_vocabulary(trained):
    _, _, parsing, _, _ = trained
    with open(os.path.join(parsing, "transform.json")) as f:
        transform = json.load(f)
    assert set(transform["parse_spec"]) == {"age", "hours", "education", "occupation", "tags"}
    assert transform["numeric"] == {"age": "float32", "hours": "float32"}
    assert sorted(r["kind"] for r in transform["records"]) == [
        "embedding", "embedding", "indicator", "linear"]
    assert os.listdir(os.path.join(parsing, "assets")) == ["0_tags.txt"]
    with open(os.path.join(parsing, "signature.json")) as f:
        signature = json.load(f)
    assert signature["inputs"] == [{"name": "examples", "dtype": "string", "shape": [None]}]


def _served(export_dir, name):
    """The URL of `export_dir` served in a thread, until the generator ends."""
    server = serving.make_server(export_dir, port=0, model_name=name)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/models/{name}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def url(trained):
    yield from _served(trained[2], "census")


def _post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_served_examples_equal_estimator_predict(trained, url):
    estimator, spec, _, _, _ = trained
    rows = _rows(np.random.RandomState(5), 4)
    expected = _predicted(estimator, rows)[:, 0]
    instances = [{"b64": base64.b64encode(e).decode()} for e in _examples(rows, spec)]
    status, body = _post(url + ":predict", {"signature_name": "predict",
                                            "instances": instances})
    assert status == 200, body
    np.testing.assert_allclose([p["logistic"][0] for p in body["predictions"]], expected,
                               rtol=1e-5)
    examples = [{k: (v[i].tolist() if hasattr(v[i], "tolist") else v[i])
                 for k, v in rows.items()} for i in range(4)]
    status, body = _post(url + ":classify", {"examples": examples})
    assert status == 200, body
    np.testing.assert_allclose([r[1][1] for r in body["results"]], expected, rtol=1e-5)
    status, body = _post(url + ":regress", {"signature_name": "regression",
                                            "examples": examples})
    assert status == 200, body
    np.testing.assert_allclose(body["results"], expected, rtol=1e-5)


@pytest.mark.parametrize("body, field", [
    ({"instances": [{"b64": "%%%"}]}, "bad base64"),
    ({"instances": [{"b64": base64.b64encode(b"\xff\x01junk").decode()}]},
     "not a serialized tf.Example"),
    ({"instances": [{"b64": base64.b64encode(b"").decode()}]}, "age"),   # required feature
    ({"examples": [{"age": "old", "hours": 1.0}]}, "feature 'age'"),
])
def test_bad_examples_get_400_naming_the_problem(url, body, field):
    verb = ":classify" if "examples" in body else ":predict"
    status, answer = _post(url + verb, body)
    assert status == 400 and field in answer["error"], answer


def test_a_transform_that_cannot_be_recorded_fails_the_export(tmp_path):
    """A cross over a bucketized column whose normalizer_fn is a lambda: the
    server could not redo the buckets, so the export refuses, naming it."""
    hours = fc.numeric_column("hours", normalizer_fn=lambda t: t * 2)
    cross = fc.crossed_column([fc.bucketized_column(hours, [20.0]), "job"], 10)
    estimator = est.LinearClassifier([cross], model_dir=str(tmp_path / "m"))
    rows = {"hours": np.array([5.0, 50.0], np.float32), "job": np.array(["a", "b"])}
    estimator.train(lambda: [(rows, np.array([0, 1]))], max_steps=1)
    with pytest.raises(ValueError, match="column 'hours': its normalizer_fn .*lambda.* cannot "
                                         "be recorded.*module-level function"):
        estimator.export_saved_model(str(tmp_path / "e"),
                                     est.export.build_parsing_serving_input_receiver_fn(
                                         fc.make_parse_example_spec([cross])))
    assert not os.path.exists(tmp_path / "e") or not os.listdir(tmp_path / "e")


def test_columns_round_trip_through_json(tmp_path):
    vocab = tmp_path / "v.txt"
    vocab.write_text("a\nb\n")
    columns = [
        fc.numeric_column("n", shape=(2,), default_value=(1.0, 2.0), dtype=torch.float64),
        fc.bucketized_column(fc.numeric_column("b"), [1.0, 2.0]),
        fc.indicator_column(fc.categorical_column_with_vocabulary_list(
            "v", ["x", "y"], num_oov_buckets=2)),
        fc.categorical_column_with_vocabulary_list("iv", [3, 5], default_value=0),
        fc.categorical_column_with_vocabulary_file("f", str(vocab), num_oov_buckets=1),
        fc.crossed_column(["v", fc.bucketized_column(fc.numeric_column("b"), [1.0])], 7,
                          hash_key=5),
        fc.weighted_categorical_column(fc.categorical_column_with_identity("i", 4, 0), "w"),
        fc.categorical_column_with_hash_bucket("h", 9, dtype=torch.int64),
    ]
    for column in columns:
        config = json.loads(json.dumps(fc.serialize_feature_column(column)))
        assert fc.deserialize_feature_column(config) == column
    emb = fc.embedding_column(fc.categorical_column_with_hash_bucket("h", 9), 3,
                              initializer=lambda shape: np.zeros(shape))
    back = fc.deserialize_feature_column(json.loads(json.dumps(
        fc.serialize_feature_column(emb))))
    assert back.initializer is None and back._replace(initializer=emb.initializer) == emb
    with pytest.raises(ValueError, match="unknown feature column class 'Nope'"):
        fc.deserialize_feature_column({"class_name": "Nope", "config": {}})



def test_string_receivers_must_be_recordable(trained, tmp_path):
    estimator = trained[0]
    names = np.array(["Sales", "Tech"])

    def preprocessing():
        return est.export.ServingInputReceiver(lambda inputs: {"occupation": inputs["o"]},
                                               {"o": names})
    with pytest.raises(ValueError, match="must be a module-level function .*not a lambda"):
        estimator.export_saved_model(str(tmp_path / "e"), preprocessing)
    one_row = est.export.build_raw_serving_input_receiver_fn(
        {"age": torch.zeros(1), "hours": torch.zeros(1), "education": np.array(["a"]),
         "occupation": np.array(["a"]), "tags": [["x"]]}, default_batch_size=None)
    vocab = trained[4] / "tags.txt"
    vocab.write_text("x\ny\nz\n")
    try:
        assert estimator.export_saved_model(str(tmp_path / "ok"), one_row)   # rows made 2
    finally:
        os.remove(vocab)
    with pytest.raises(ValueError, match="must be a tensor, or strings as a numpy array"):
        est.export.ServingInputReceiver({"x": {"a": 1}}, {"x": {"a": 1}})


def test_a_non_integral_number_for_an_integer_input_is_refused_not_truncated(tmp_path):
    """2.7 for an int64 input or tf.Example feature gave 2's answer, and true
    1's; TF Serving answers 400. 2.0 is still 2."""
    def model_fn(features, labels, mode):
        x = torch.cat([features["ids"].float(), features["flag"].float()], 1)
        y = est.get_module("w", lambda: torch.nn.Linear(2, 1))(x)
        return est.EstimatorSpec(mode, predictions={"y": y},
                                 loss=None if labels is None else ((y - labels) ** 2).mean(),
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    e.train(lambda: [({"ids": torch.tensor([[1], [3]]), "flag": torch.tensor([[True], [False]])},
                      torch.ones(2, 1))], steps=1)
    export_dir = e.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(
            {"ids": torch.zeros(2, 1, dtype=torch.int64),
             "flag": torch.zeros(2, 1, dtype=torch.bool)}))
    model = serving.Model(export_dir)
    two = model.predict({"instances": [{"ids": [2], "flag": [True]}]})
    assert model.predict({"instances": [{"ids": [2.0], "flag": [True]}]}) == two
    for bad in (2.7, True):
        with pytest.raises(serving.RequestError, match="input 'ids': cannot make a int64 "
                           "tensor of the values given \\(expected integers"):
            model.predict({"instances": [{"ids": [bad], "flag": [True]}]})
    spec = {"kids": est.io.FixedLenFeature([1], torch.int64)}
    assert example_of({"kids": 2.0}, spec) == example_of({"kids": 2}, spec)
    for bad in (2.7, True):
        with pytest.raises(ValueError, match=f"feature 'kids': {bad!r} is not a int64 value"):
            example_of({"kids": bad}, spec)


@pytest.mark.parametrize("value", [12, 12.0, 2134])
def test_a_number_for_a_string_feature_is_refused_not_made_text(url, value):
    """TF Serving answers 400: as text, 12.0 was "12.0" (another hash bucket
    than "12") and 2134 not "02134", with no word."""
    status, answer = _post(url + ":classify", {"examples": [
        {"age": 30.0, "hours": 40.0, "occupation": value}]})
    assert status == 400 and "feature 'occupation'" in answer["error"] \
        and "expected a string, got" in answer["error"], answer
    status, answer = _post(url + ":classify", {"examples": [
        {"age": 30.0, "hours": 40.0, "occupation": str(value)}]})
    assert status == 200, answer


def _trained_on(tmp_path, to_input, width, features):
    """An Estimator of one Linear(width, 1) over `to_input(features)`,
    trained one step on `features` (2 examples)."""
    def model_fn(features, labels, mode):
        y = est.get_module("w", lambda: torch.nn.Linear(width, 1))(to_input(features))
        return est.EstimatorSpec(mode, predictions={"y": y},
                                 loss=None if labels is None else ((y - labels) ** 2).mean(),
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    e.train(lambda: [(features, torch.ones(2, 1))], steps=1)
    return e


def test_a_number_for_a_raw_string_input_is_refused_not_made_text(tmp_path):
    fc = est.feature_column
    e = _trained_on(tmp_path, lambda features: fc.input_layer(features, [fc.indicator_column(
        fc.categorical_column_with_hash_bucket("code", 4))]), 4, {"code": ["02134", "7"]})
    export_dir = e.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(
            {"code": np.array(["02134", "7"], dtype=object)}))
    model = serving.Model(export_dir)
    model.predict({"instances": [{"code": "02134"}]})
    for bad in (2134, 12.0):
        with pytest.raises(serving.RequestError, match=rf"input 'code'\[0\]: expected a string, "
                           rf"got the number {bad!r}: send it as a JSON string"):
            model.predict({"instances": [{"code": bad}]})


@pytest.fixture(scope="module")
def raw_url(trained):
    yield from _served(trained[3], "raw")


def test_classify_and_regress_signatures_take_inputs_as_tf_serving(trained, url):
    """TF's classification/regression signatures (serving_default among them)
    name their serialized Examples `inputs`; only `predict` has the
    receiver's `examples`. A client building requests from the metadata's
    names got a 400 ("missing input(s) ['examples']")."""
    estimator, spec, _, _, _ = trained
    with urllib.request.urlopen(url + "/metadata", timeout=30) as response:
        signatures = json.loads(response.read())["metadata"]["signature_def"]["signature_def"]
    assert {name: sorted(s["inputs"]) for name, s in signatures.items()} == {
        "classification": ["inputs"], "predict": ["examples"], "regression": ["inputs"],
        "serving_default": ["inputs"]}
    assert signatures["serving_default"]["inputs"]["inputs"]["dtype"] == "DT_STRING"
    rows = _rows(np.random.RandomState(6), 3)
    expected = _predicted(estimator, rows)[:, 0]
    encoded = [{"b64": base64.b64encode(e).decode()} for e in _examples(rows, spec)]
    for body in ({"instances": [{"inputs": e} for e in encoded]},
                 {"inputs": {"inputs": encoded}}, {"inputs": encoded}):
        status, answer = _post(url + ":predict", body)
        assert status == 200, answer
        scores = answer.get("predictions") or answer["outputs"]
        scores = [p["scores"] for p in scores] if isinstance(scores, list) else scores["scores"]
        np.testing.assert_allclose(np.array(scores)[:, 1], expected, rtol=1e-5)


def test_classify_examples_take_b64_strings_as_tf_serving(url):
    """TF Serving's classify example itself sends `"image": {"b64": ...}`: a
    bytes_list value. It was refused ("is not a string value")."""
    example = {"age": 44.0, "hours": 40.0, "education": "Masters", "occupation": "Tech",
               "tags": ["x"]}
    as_b64 = dict(example, education={"b64": base64.b64encode(b"Masters").decode()})
    answers = [_post(url + ":classify", {"examples": [e]}) for e in (example, as_b64)]
    assert answers[0][0] == answers[1][0] == 200, answers
    assert answers[0][1] == answers[1][1]


@pytest.mark.parametrize("body, status, error", [
    # a list where one string per example is declared: TF Serving's 400, not numbers
    ({"instances": [{"age": 44.0, "hours": 40.0, "education": ["Masters", "HS-grad"],
                     "occupation": "Tech", "tags": ["x"]}]}, 400,
     "input 'education'[0]: expected one string per example"),
    # a bare string where a list of strings is declared ([batch, any]): TF's 400;
    # it was taken as one word (a sentence where its words were declared)
    ({"instances": [{"age": 44.0, "hours": 40.0, "education": "Masters",
                     "occupation": "Tech", "tags": "x y"}]}, 400,
     "input 'tags'[0]: expected a list of values, got str 'x y'"),
    ({"inputs": {"age": [44.0, 30.0], "hours": [40.0, 20.0], "education": ["a", "b"],
                 "occupation": ["c", "d"], "tags": [["x"], "y"]}}, 400,
     "input 'tags'[1]: expected a list of values, got str 'y'"),
    # a bool for a float input: TF's 400 (it was taken as 1.0)
    ({"inputs": {"age": [True], "hours": [40.0], "education": ["Masters"],
                 "occupation": ["Tech"], "tags": [["x"]]}}, 400, "expected numbers"),
    # columnar keys the model does not take are ignored, as TF Serving's
    ({"inputs": {"age": [44.0], "hours": [40.0], "education": ["Masters"],
                 "occupation": ["Tech"], "tags": [["x"]], "extra": [1]}}, 200, None),
])
def test_raw_string_inputs_are_checked_as_tf_serving(raw_url, body, status, error):
    code, answer = _post(raw_url + ":predict", dict(body, signature_name="predict"))
    assert code == status, answer
    assert error is None or error in answer["error"], answer


def test_malformed_requests_are_400_as_tf_serving(url):
    """TF answers InvalidArgument ("Malformed request"): 400, not 404 or 405."""
    status, answer = _post(url + ":explain", {"instances": []})
    assert status == 400 and answer["error"].startswith("Malformed request"), answer
    try:
        urllib.request.urlopen(url + ":predict", timeout=30)
        raise AssertionError("a GET of :predict was answered")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and json.loads(e.read())["error"].startswith("Malformed request")


@pytest.mark.parametrize("batch", [None, 2])
def test_strings_mapped_by_model_fn_itself_fail_the_export(tmp_path, batch):
    """A port mapping a string feature to ids in Python (`vocab.index(c) for c
    in features["city"]`): the export runs model_fn once, so the example's
    ids were fixed into the program. The error told to fix the batch size;
    with it, every request was answered as for the example strings (the
    served probabilities for ["oslo", "lima"] were those of ["paris",
    "paris"]). The strings are now refused for any use but forwarding."""
    vocab = ["lima", "oslo", "paris", "rome"]

    def model_fn(features, labels, mode):
        ids = torch.tensor([vocab.index(c) for c in features["city"]])
        emb = est.get_module("city", lambda: torch.nn.Embedding(4, 2))(ids)
        x = torch.cat([torch.as_tensor(features["x"], dtype=torch.float32), emb], 1)
        y = est.get_module("w", lambda: torch.nn.Linear(3, 1))(x)
        return est.EstimatorSpec(mode, predictions={"y": y, "city": features["city"]},
                                 loss=None if labels is None else ((y - labels) ** 2).mean(),
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    e.train(lambda: [({"x": np.ones((2, 1)), "city": ["oslo", "lima"]}, torch.ones(2, 1))],
            steps=1)
    rows = e.predict(lambda: [{"x": np.ones((2, 1)), "city": ["rome", "lima"]}])
    assert [p["city"] for p in rows] == [b"rome", b"lima"]   # (predict reads them)
    receiver = est.export.build_raw_serving_input_receiver_fn(
        {"x": torch.zeros(2, 1), "city": np.array(["paris", "paris"])}, default_batch_size=batch)
    with pytest.raises(TypeError, match=r"model_fn uses the string feature 'city' itself while "
                       r"it is exported: an export runs model_fn once.* Map strings to ids with "
                       r"est.feature_column"):
        e.export_saved_model(str(tmp_path / "export"), receiver)
    assert not os.path.exists(tmp_path / "export") or os.listdir(tmp_path / "export") == []


def test_feature_columns_given_a_copy_of_the_features_fail_the_export(tmp_path):
    """input_layer({k: features[k] ...}, columns): the copy has no
    transformation cache, so the columns mapped the example strings once,
    in Python, and the export served ["b", "a"] as ["a", "b"]."""
    fc = est.feature_column
    columns = [fc.indicator_column(fc.categorical_column_with_vocabulary_list("city", ["a", "b"]))]
    e = _trained_on(tmp_path, lambda features: fc.input_layer(
        {k: features[k] for k in ["city"]}, columns), 2, {"city": ["a", "b"]})
    with pytest.raises(TypeError, match=r"model_fn uses the string feature 'city' itself.*"
                       r"Feature columns given a new dict made from `features` read the strings "
                       r"here too: give them `features` itself"):
        e.export_saved_model(str(tmp_path / "export"),
                             est.export.build_raw_serving_input_receiver_fn(
                                 {"city": np.array(["a", "b"])}))


@pytest.mark.parametrize("outputs", ["classes", "predict_output", "checked_predictions"])
def test_string_features_still_reach_the_exports_outputs(tmp_path, outputs):
    """While an export records, a string feature is a stand-in: it goes into
    ClassificationOutput's classes, a PredictOutput, and predictions guarded
    by `isinstance(features[k], np.ndarray)` as the strings did (it failed
    as "not a tensor", or the guarded output was left out)."""
    fc = est.feature_column

    def model_fn(features, labels, mode):
        x = fc.input_layer(features, [fc.indicator_column(
            fc.categorical_column_with_vocabulary_list("color", ["red", "blue"]))])
        logits = est.get_module("w", lambda: torch.nn.Linear(2, 1))(x)[:, 0]
        if mode != est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, loss=((logits - labels) ** 2).mean(),
                                     train_op=est.get_optimizer(
                                         lambda p: torch.optim.SGD(p, 0.1)))
        scores = torch.stack([1 - logits.sigmoid(), logits.sigmoid()], -1)
        if outputs == "checked_predictions":
            predictions = {"logits": logits}
            if isinstance(features["key"], np.ndarray):
                predictions["key"] = features["key"]
            return est.EstimatorSpec(mode, predictions=predictions)
        output = (est.export.ClassificationOutput(scores=scores, classes=features["key"])
                  if outputs == "classes" else
                  est.export.PredictOutput({"logits": logits, "key": features["key"]}))
        return est.EstimatorSpec(mode, predictions={"logits": logits},
                                 export_outputs={"serving_default": output})
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    e.train(lambda: [({"color": ["red", "blue"], "key": np.array(["a", "b"])},
                      torch.ones(2))], steps=1)
    export_dir = e.export_saved_model(str(tmp_path / "export"), (
        est.export.build_raw_serving_input_receiver_fn(
            {"color": np.array(["red", "blue"]), "key": np.array(["x", "y"])})))
    served = est.export.load(export_dir).signatures["serving_default"](
        color=np.array(["blue", "red", "red"]), key=np.array(["A", "B", "C"]))
    key = "classes" if outputs == "classes" else "key"
    assert served[key].tolist() == [b"A", b"B", b"C"]


def test_a_sparse_feature_forwarded_fails_the_export_as_it_fails_predict(tmp_path):
    """est.forward_features of a feature of rows (a VarLenFeature's): predict
    refuses it; the export, given a stand-in, took it and served the rows."""
    fc = est.feature_column
    tags = fc.indicator_column(fc.categorical_column_with_vocabulary_list("tags", ["a", "b"]))
    e = est.forward_features(_trained_on(
        tmp_path, lambda features: fc.input_layer(features, [tags]), 2,
        {"tags": [["a"], ["a", "b"]]}), ["tags"])
    with pytest.raises(ValueError, match=r"Feature \(tags\) is sparse \(a list of lists\); only "
                       r"dense features can be forwarded"):
        list(e.predict(lambda: [{"tags": [["a"], ["b", "a"]]}]))
    with pytest.raises(ValueError, match=r"Feature \(tags\) is sparse"):
        e.export_saved_model(str(tmp_path / "export"),
                             est.export.build_raw_serving_input_receiver_fn(
                                 {"tags": [["a"], ["a", "b"]]}))


def test_features_named_otherwise_than_python_export_and_serve_as_predict(tmp_path):
    """Numeric features named as TF's feature keys may be (`marital-status`,
    `1st.val/x`, `class`): the export with a parsing receiver refused them
    ("must be a Python identifier"; names probe); they are program inputs
    under other names, as the export's transform says."""
    columns = [fc.numeric_column(n) for n in (   # (the attack: feature_0 after a renamed
        "hours-per-week", "1st.val/x", "class", "age", "feature_0", "self", "\u00b5g")]  # one,
    # self, a name Python rewrites, µg to μg, failed)
    rng = np.random.RandomState(0)
    rows = {c.name: rng.uniform(0, 5, 6).astype(np.float32) for c in columns}
    estimator = est.DNNRegressor([3], columns, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: [(rows, rows["age"][:, None])], max_steps=2)
    spec = fc.make_parse_example_spec(columns)
    path = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_parsing_serving_input_receiver_fn(spec))
    expected = np.stack([p["predictions"] for p in estimator.predict(lambda: [rows])])
    served = est.export.load(path).signatures["predict"](examples=_examples(rows, spec))
    np.testing.assert_allclose(served["predictions"], expected, rtol=1e-6)
    url = _served(path, "names")
    status, answer = _post(next(url) + ":predict", {"instances": [
        {"b64": base64.b64encode(e).decode()} for e in _examples(rows, spec)]})
    next(url, None)
    assert status == 200, answer
    np.testing.assert_allclose(np.array(answer["predictions"]), expected, rtol=1e-5)


def test_a_raw_receivers_rows_of_ids_are_served_as_numbers(tmp_path):
    """Rows of ints (a VarLenFeature's ids) in a raw receiver: the server
    described them as strings and asked for "1" where the column takes 1,
    so no request could be served."""
    col = est.feature_column.embedding_column(
        est.feature_column.categorical_column_with_identity("ids", 10), 3)

    def model_fn(features, labels, mode):
        logits = est.get_module("h", lambda: torch.nn.Linear(3, 2))(
            est.feature_column.input_layer(features, [col]))
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"logits": logits})
        return est.EstimatorSpec(mode, loss=logits.sum(), train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))

    features = {"ids": [[1, 2], [3]]}
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: [(features, torch.zeros(2))], steps=1)
    path = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(features))
    model = serving.Model(path)
    assert model.inputs["ids"]["dtype"] == "int64" and model.inputs["ids"]["rows"]
    served = model.predict({"instances": [{"ids": [1, 2]}, {"ids": [3]}]})["predictions"]
    expected = [p["logits"] for p in estimator.predict(lambda: [(features, None)])]
    np.testing.assert_allclose(served, expected, atol=1e-6)
    with pytest.raises(serving.RequestError, match="'ids'.*expected integers"):
        model.predict({"instances": [{"ids": [1.5]}]})
