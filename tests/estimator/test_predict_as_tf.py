"""Estimator.predict against TF 2.15's recording
(tests/support/fixtures/record_tf_predict_api.py): `predict_keys` keeps the
model_fn's order, ignores keys that name nothing unless none names one, and
an empty list means all; string predictions come out as bytes; the model_fn
gets no labels in PREDICT, although the input_fn gives them."""
import json
import logging
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES
from run_outline import predictions_outline

with open(os.path.join(FIXTURES, "tf_predict_api.json"), encoding="utf-8") as _f:
    TF = json.load(_f)["cases"]

X = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)   # as the recorder's
IDS = ["u1", "u2", "u3"]


def model_fn(features, labels, mode):
    x = torch.as_tensor(features["x"])
    scale = est.get_module("scale", lambda: torch.nn.Linear(1, 1))
    return est.EstimatorSpec(mode, predictions={
        "y": 2.0 * x + 0 * scale(x), "n": 3.0 * x, "id": features["id"],
        "labelled": torch.full(x.shape, labels is not None)})


def input_fn():
    return [({"x": X[i:i + 2], "id": np.array(IDS[i:i + 2])}, X[i:i + 2]) for i in (0, 2)]


@pytest.fixture(scope="module")
def estimator(tmp_path_factory):
    return est.Estimator(model_fn, model_dir=str(tmp_path_factory.mktemp("m")))


@pytest.mark.parametrize("case", sorted(TF))
def test_predict_yields_what_tf_yields(estimator, case):
    recorded = dict(TF[case])
    kwargs = recorded.pop("kwargs")   # the recorder's predict arguments
    if "error" in recorded:
        with pytest.raises(ValueError) as raised:
            list(estimator.predict(input_fn, **kwargs))
        assert str(raised.value).startswith("Expected to run at least one output from ")
        assert str(raised.value).endswith("provided ['typo']")
        return
    assert predictions_outline(list(estimator.predict(input_fn, **kwargs))) == recorded


def test_an_ignored_key_is_said_once(estimator, caplog):
    with caplog.at_level(logging.WARNING, logger="estimator"):
        list(estimator.predict(input_fn, predict_keys=["y", "typo"]))
    assert [r.getMessage() for r in caplog.records if "typo" in r.getMessage()] == [
        "predict_keys ['typo'] are not in the predictions (y, n, id, labelled): ignored, as "
        "TF ignores them"]


def test_string_predictions_are_utf8_bytes(estimator):
    def words(features, labels, mode):
        x = torch.as_tensor(features["x"])
        est.get_module("scale", lambda: torch.nn.Linear(1, 1))
        return est.EstimatorSpec(mode, predictions={
            "x": x, "word": ["héllo", "wörld"][:len(x)], "kept": np.array([b"a", b"b"][:len(x)],
                                                                          dtype=object),
            "fixed": np.array([b"cd", b"e"][:len(x)])})   # numpy's dtype S2
    e = est.Estimator(words, model_dir=estimator.model_dir)
    got = list(e.predict(lambda: [{"x": X[:2]}]))
    assert [(p["word"], p["kept"], p["fixed"]) for p in got] == [
        ("héllo".encode(), b"a", b"cd"), ("wörld".encode(), b"b", b"e")]
    # TF's: Python bytes in an object array (numpy's bytes_ printed as np.bytes_(b'cd'))
    assert {type(p[k]) for p in got for k in ("word", "kept", "fixed")} == {bytes}
    batch, = e.predict(lambda: [{"x": X[:2]}], yield_single_examples=False)
    assert batch["fixed"].dtype == object and type(batch["fixed"][0]) is bytes


def test_a_single_tensor_prediction_takes_no_keys(estimator):
    def tensor(features, labels, mode):
        est.get_module("scale", lambda: torch.nn.Linear(1, 1))
        return est.EstimatorSpec(mode, predictions=torch.as_tensor(features["x"]))
    e = est.Estimator(tensor, model_dir=estimator.model_dir)
    assert [float(p[0]) for p in e.predict(lambda: [{"x": X}])] == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="predict_keys argument is not valid in case of "
                                         "non-dict predictions"):
        list(e.predict(lambda: [{"x": X}], predict_keys=["predictions"]))
