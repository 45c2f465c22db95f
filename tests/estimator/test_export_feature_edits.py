"""A model_fn that changes its features before the feature columns read them
(TF1 programs do: `features["x"] = features["x"] * 10`, an engineered
`features["dist"]`) is exported as predict runs it. With strings or crossed
columns an export redoes the columns' host-side work per request from the
receiver's inputs; the columns read the receiver's values there, so the
change was lost: the export served another model than predict, without a
word. Now what torch computes (a numeric column's input) follows model_fn,
and a change the host-side work would need is an error naming the feature."""
import base64
import json
import os

import numpy as np
import pytest
import torch

import estimator as est

fc = est.feature_column
ROWS = {"x": torch.tensor([0.5, 1.5, -2.0, 3.0]), "lat": torch.tensor([40.1, 40.7, 41.3, 40.2]),
        "c": np.array(["a", "b", "zz", "a"])}


def _trained(tmp_path, net_input, rows=ROWS):
    """An Estimator of a linear layer over `net_input(features)`, trained 3 steps."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.LazyLinear(1))
        out = net(net_input(features))
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"y": out})
        return est.EstimatorSpec(mode, loss=(out - labels).pow(2).mean(), train_op=(
            est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.001))))
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    e.train(lambda: [(rows, torch.ones(4, 1))] * 3, max_steps=3)
    return e


def _estimator(tmp_path, edit, columns, rows=ROWS):
    """`_trained` over the columns of the features after `edit(features)`."""
    def net_input(features):
        edit(features)
        return fc.input_layer(features, columns)
    return _trained(tmp_path, net_input, rows)


def _served_and_predicted(e, tmp_path):
    path = e.export_saved_model(str(tmp_path / "e"),
                                est.export.build_raw_serving_input_receiver_fn(ROWS))
    served = est.export.load(path).signatures["serving_default"](**ROWS)["y"].numpy()
    predicted = np.stack([p["y"] for p in e.predict(lambda: [ROWS])])
    return served, predicted


def _vocabulary():
    return fc.indicator_column(fc.categorical_column_with_vocabulary_list("c", ["a", "b"]))


def _scaled(features):
    features["x"] = features["x"] * 10.0 + 0.5


def _added(features):
    features["dist"] = torch.sqrt(features["x"] ** 2 + features["lat"] ** 2)


@pytest.mark.parametrize("edit, columns", [
    (_scaled, lambda: [fc.numeric_column("x"), _vocabulary()]),
    (_added, lambda: [fc.numeric_column("dist"), _vocabulary()]),
    (_scaled, lambda: [fc.bucketized_column(fc.numeric_column("x"), [0.0, 10.0]),
                       _vocabulary()]),
])
def test_a_change_torch_computes_is_exported_as_predict_runs_it(tmp_path, edit, columns):
    served, predicted = _served_and_predicted(_estimator(tmp_path, edit, columns()), tmp_path)
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)


def _shifted(features):
    features["lat"] = features["lat"] + 0.5


def test_a_change_the_host_side_work_would_need_is_an_error_naming_it(tmp_path):
    lat = fc.bucketized_column(fc.numeric_column("lat"), [40.5, 41.0])
    crossed = fc.indicator_column(fc.crossed_column([lat, "c"], 20))
    e = _estimator(tmp_path, _shifted, [fc.numeric_column("x"), crossed])
    with pytest.raises(ValueError, match="model_fn changed the feature 'lat' before a feature "
                                         "column read it on the host"):
        e.export_saved_model(str(tmp_path / "e"),
                             est.export.build_raw_serving_input_receiver_fn(ROWS))


def add_engineered(receiver_tensors):
    """TF1 taxifare's serving_input_fn computes features from its placeholders."""
    features = dict(receiver_tensors)
    features["dist"] = torch.sqrt(features["x"] ** 2 + (features["lat"] - 40.0) ** 2)
    return features


def _engineered_columns(with_strings):
    lat = fc.bucketized_column(fc.numeric_column("lat"), [40.5, 41.0])
    dist = fc.bucketized_column(fc.numeric_column("dist"), [1.0, 2.0])
    crossed = fc.indicator_column(fc.crossed_column([lat, dist], 20))
    return [fc.numeric_column("dist"), crossed] + ([_vocabulary()] if with_strings else [])


@pytest.mark.parametrize("with_strings", [True, False])
def test_a_receivers_features_function_runs_per_request_as_tfs_serving_input_fn(
        tmp_path, with_strings):
    """A receiver computing features with a callable was refused with strings
    ("preprocessing in a callable cannot be recorded"), and with numbers only
    where a column crosses (torch.export "could not trace": .numpy() in our
    own crossing). The server now calls the (module-level) function on each
    request's receiver tensors, before the feature columns."""
    rows = ROWS if with_strings else {k: v for k, v in ROWS.items() if k != "c"}
    e = _estimator(tmp_path, lambda features: None, _engineered_columns(with_strings),
                   add_engineered(rows))
    path = e.export_saved_model(str(tmp_path / "e"), lambda: est.export.ServingInputReceiver(
        add_engineered, dict(rows)))
    predicted = np.stack([p["y"] for p in e.predict(lambda: [add_engineered(rows)])])
    served = est.export.load(path).signatures["serving_default"](**rows)["y"].numpy()
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)
    instances = [{k: (v[i].item() if isinstance(v, torch.Tensor) else str(v[i]))
                  for k, v in rows.items()} for i in range(4)]
    answer = est.serving.Model(path).predict({"instances": instances})["predictions"]
    np.testing.assert_allclose(answer, predicted, rtol=1e-5, atol=1e-6)


def test_a_features_function_the_server_cannot_import_is_said(tmp_path):
    e = _estimator(tmp_path, lambda features: None, _engineered_columns(True),
                   add_engineered(ROWS))
    with pytest.raises(ValueError, match="must be a module-level function .* not a lambda"):
        e.export_saved_model(str(tmp_path / "e"), lambda: est.export.ServingInputReceiver(
            lambda tensors: add_engineered(tensors), dict(ROWS)))


def test_string_placeholders_export_as_tfs_tf_string():
    """`placeholder(tf.string, [None])` ported: it was "dtype must be a torch.dtype"."""
    assert est.export.placeholder(str, [None]).tolist() == ["", ""]
    assert est.export.placeholder("string", [None, 2], fill_value="a").tolist() == [["a"] * 2] * 2
    assert est.export.placeholder(bytes, [None]).tolist() == [b"", b""]
    with pytest.raises(ValueError, match="a string input's fill_value is a string"):
        est.export.placeholder(str, [None], fill_value=1)


def test_a_string_placeholder_exports_a_string_input(tmp_path):
    e = _estimator(tmp_path, lambda features: None, [fc.numeric_column("x"), _vocabulary()])
    path = e.export_saved_model(str(tmp_path / "e"), est.export.build_raw_serving_input_receiver_fn(
        {"x": est.export.placeholder(torch.float32, [None]),
         "c": est.export.placeholder(str, [None], fill_value="a")}))
    rows = {"x": ROWS["x"], "c": ROWS["c"]}
    served = est.export.load(path).signatures["serving_default"](**rows)["y"].numpy()
    np.testing.assert_allclose(served, np.stack([p["y"] for p in e.predict(lambda: [ROWS])]),
                               rtol=1e-5, atol=1e-6)


def decode_images(receiver_tensors):
    """An image-bytes receiver's decoder (flowersmodel's serving_input_fn)."""
    for image in receiver_tensors["c"]:
        if not str(image).startswith("\x89PNG"):
            raise ValueError("cannot identify image file")
    return add_engineered(receiver_tensors)


def test_a_features_function_failing_on_the_example_inputs_is_said_to_run_on_them(tmp_path):
    e = _estimator(tmp_path, lambda features: None, _engineered_columns(True),
                   add_engineered(ROWS))
    with pytest.raises(ValueError, match="cannot identify image file") as raised:
        e.export_saved_model(str(tmp_path / "e"), lambda: est.export.ServingInputReceiver(
            decode_images, dict(ROWS)))
    assert ("raised by the receiver's features function test_export_feature_edits:"
            "decode_images, which the export runs on the receiver's example inputs (c, lat, x): "
            "give examples it can take, an encoded image where it decodes one"
            ) in "".join(raised.value.__notes__)


def decode_bytes(receiver_tensors):
    """A receiver's function written for tf.string's bytes (a decoder's
    `.decode`, `io.BytesIO`): it takes only bytes."""
    features = dict(receiver_tensors)
    features["c"] = np.array([value.decode("utf-8") for value in features["c"]])
    return add_engineered(features)


def test_a_bytes_placeholder_is_served_bytes_as_tf_string(tmp_path):
    """TF Serving gives a JSON string to a tf.string placeholder as bytes; the
    server handed `placeholder(bytes)`'s function a str, and a decoder taking
    bytes answered 400 ('str' object has no attribute 'decode')."""
    e = _estimator(tmp_path, lambda features: None, _engineered_columns(True),
                   add_engineered(ROWS))
    receiver = {**ROWS, "c": np.array([c.encode() for c in ROWS["c"]], dtype=object)}
    path = e.export_saved_model(str(tmp_path / "e"), lambda: est.export.ServingInputReceiver(
        decode_bytes, receiver))
    predicted = np.stack([p["y"] for p in e.predict(lambda: [add_engineered(ROWS)])])
    instances = [{k: (v[i].item() if isinstance(v, torch.Tensor) else str(v[i]))
                  for k, v in ROWS.items()} for i in range(4)]
    served = est.export.load(path).signatures["serving_default"](**ROWS)["y"].numpy()
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)
    model = est.serving.Model(path)
    for request in ({"instances": instances},
                    {"inputs": {k: [row[k] for row in instances] for k in ROWS}}):
        answer = model.predict(request)
        np.testing.assert_allclose(answer["predictions" if "instances" in request
                                          else "outputs"], predicted, rtol=1e-5, atol=1e-6)
    with_b64 = [{**row, "c": {"b64": base64.b64encode(row["c"].encode()).decode()}}
                for row in instances]
    np.testing.assert_allclose(model.predict({"instances": with_b64})["predictions"],
                               predicted, rtol=1e-5, atol=1e-6)


def decode_text(receiver_tensors):
    """A receiver's function written for str (`.lower()` of text)."""
    features = dict(receiver_tensors)
    features["c"] = np.array([value.lower() for value in features["c"]])
    return add_engineered(features)


def test_a_str_placeholder_is_served_str_whatever_the_json(tmp_path):
    """`{"b64": ...}` sent to a `placeholder(str)` input reached its function
    as bytes beside the JSON strings' str (attack probe: a str-only
    function mixed them up); now as text, or a 400 where it is not utf-8."""
    e = _estimator(tmp_path, lambda features: None, _engineered_columns(True),
                   add_engineered(ROWS))
    path = e.export_saved_model(str(tmp_path / "e"), lambda: est.export.ServingInputReceiver(
        decode_text, dict(ROWS)))
    predicted = np.stack([p["y"] for p in e.predict(lambda: [add_engineered(ROWS)])])
    instances = [{k: (v[i].item() if isinstance(v, torch.Tensor) else str(v[i]))
                  for k, v in ROWS.items()} for i in range(4)]
    mixed = [{**row, "c": {"b64": base64.b64encode(row["c"].encode()).decode()}}
             if i % 2 else row for i, row in enumerate(instances)]
    model = est.serving.Model(path)
    np.testing.assert_allclose(model.predict({"instances": mixed})["predictions"],
                               predicted, rtol=1e-5, atol=1e-6)
    binary = [{**instances[0], "c": {"b64": base64.b64encode(b"\xff\xfe").decode()}}]
    with pytest.raises(est.serving.RequestError, match="input 'c' is text .* not utf-8"):
        model.predict({"instances": binary})


def _shifted_in_place(features):
    features["lat"] += 0.5   # (the same tensor object, changed)


def test_a_change_in_place_the_host_side_work_would_need_is_an_error_too(tmp_path):
    """`features["lat"] += 0.5` keeps the object: it was not seen as a change,
    and the export served the cross of the unshifted lat."""
    lat = fc.bucketized_column(fc.numeric_column("lat"), [40.5, 41.0])
    crossed = fc.indicator_column(fc.crossed_column([lat, "c"], 20))
    e = _estimator(tmp_path, _shifted_in_place, [fc.numeric_column("x"), crossed])
    with pytest.raises(ValueError, match="model_fn changed the feature 'lat'"):
        e.export_saved_model(str(tmp_path / "e"),
                             est.export.build_raw_serving_input_receiver_fn(ROWS))


def test_a_column_read_again_after_a_change_reads_the_change(tmp_path):
    """One column read before and after model_fn changed its feature: the
    export's one transformation cache gave the value from before."""
    x = fc.numeric_column("x")

    def net_input(features):
        before = fc.input_layer(features, [x])
        features["x"] = features["x"] * 10.0
        return torch.cat([before, fc.input_layer(features, [x, _vocabulary()])], 1)
    served, predicted = _served_and_predicted(_trained(tmp_path, net_input), tmp_path)
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)


def add_engineered_in_place(receiver_tensors):
    """taxifare's add_engineered adds to the dict it is given."""
    receiver_tensors["dist"] = torch.sqrt(receiver_tensors["x"] ** 2
                                          + (receiver_tensors["lat"] - 40.0) ** 2)
    return receiver_tensors


def test_a_features_function_adding_to_its_dict_keeps_the_receivers_inputs(tmp_path):
    """The function's own key became an input a client had to send (REST:
    "missing input(s) ['dist']")."""
    e = _estimator(tmp_path, lambda features: None, _engineered_columns(True),
                   add_engineered(ROWS))
    path = e.export_saved_model(str(tmp_path / "e"), lambda: est.export.ServingInputReceiver(
        add_engineered_in_place, dict(ROWS)))
    assert [i["name"] for i in est.export.load(path).signature["inputs"]] == ["x", "lat", "c"]
    instances = [{k: (v[i].item() if isinstance(v, torch.Tensor) else str(v[i]))
                  for k, v in ROWS.items()} for i in range(4)]
    predicted = np.stack([p["y"] for p in e.predict(lambda: [add_engineered(ROWS)])])
    answer = est.serving.Model(path).predict({"instances": instances})["predictions"]
    np.testing.assert_allclose(answer, predicted, rtol=1e-5, atol=1e-6)
    numpy_rows = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in ROWS.items()}
    served = est.export.load(path)(**numpy_rows)["y"].numpy()   # (numpy: as without one)
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)


def test_a_features_function_the_server_cannot_import_is_said_at_load(tmp_path):
    e = _estimator(tmp_path, lambda features: None, _engineered_columns(True),
                   add_engineered(ROWS))
    path = e.export_saved_model(str(tmp_path / "e"), lambda: est.export.ServingInputReceiver(
        add_engineered, dict(ROWS)))
    transform = os.path.join(path, "transform.json")
    with open(transform) as f:
        data = json.load(f)
    data["features_fn"] = "no_such_trainer.model:add_engineered"
    with open(transform, "w") as f:
        json.dump(data, f)
    with pytest.raises(ValueError, match="cannot be imported .*No module named "
                                         "'no_such_trainer'.*sys.path"):
        est.serving.Model(path)
