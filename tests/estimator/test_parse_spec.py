"""est.classifier_parse_example_spec and regressor_parse_example_spec: TF1's
specs and errors (recorded from TF 2.15 by
tests/support/fixtures/record_tf_parse_spec.py), and a canned estimator
trained on tf.Examples parsed with them."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from estimator.host_transform import example_of
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_parse_spec.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
fc = est.feature_column


def columns():
    return [fc.numeric_column("age"), fc.numeric_column("pos", shape=2, default_value=0.0),
            fc.embedding_column(fc.categorical_column_with_hash_bucket("occupation", 50), 4),
            fc.indicator_column(fc.categorical_column_with_vocabulary_list(
                "education", ["a", "b"]))]


CASES = {
    "classifier": lambda: est.classifier_parse_example_spec(columns(), "label"),
    "classifier_weighted_string_label": lambda: est.classifier_parse_example_spec(
        columns(), "label", label_dtype=str, label_default="a", weight_column="w"),
    "regressor": lambda: est.regressor_parse_example_spec(columns(), "price"),
    "regressor_two_dims_weight_column": lambda: est.regressor_parse_example_spec(
        columns(), "price", label_dimension=2, label_default=(0.0, 1.0),
        weight_column=fc.numeric_column("w", dtype=torch.float32, default_value=1.0)),
    "label_is_a_feature": lambda: est.classifier_parse_example_spec(columns(), "age"),
    "weight_is_a_feature": lambda: est.regressor_parse_example_spec(columns(), "price",
                                                                    weight_column="age"),
    "weight_not_numeric": lambda: est.classifier_parse_example_spec(
        columns(), "label", weight_column=fc.categorical_column_with_identity("w", 3)),
}
_DTYPES = {torch.float32: "float32", torch.int64: "int64", str: "string"}


def describe(spec):
    out = {}
    for key, value in sorted(spec.items()):
        entry = {"kind": type(value).__name__, "dtype": _DTYPES[value.dtype]}
        if hasattr(value, "shape"):
            entry["shape"] = list(value.shape)
            default = value.default_value
            entry["default"] = list(default) if isinstance(default, tuple) else default
        out[key] = entry
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_specs_and_errors_are_tfs(case):
    recorded = TF["cases"][case]
    if "spec" in recorded:
        assert describe(CASES[case]()) == recorded["spec"]
        return
    first_words = " ".join(recorded["error"].split()[:6])    # TF's wording; names are ours
    with pytest.raises(ValueError, match=first_words):
        CASES[case]()


def _example(age, education, label, weight):
    example = est.io.Example()
    feature = example.features.feature
    feature["age"].float_list.value.append(age)
    feature["education"].bytes_list.value.append(education.encode())
    feature["label"].int64_list.value.append(label)
    feature["w"].float_list.value.append(weight)
    return example.SerializeToString()


def test_a_canned_classifier_trains_on_examples_parsed_with_its_spec(tmp_path):
    columns = [fc.numeric_column("age"), fc.indicator_column(
        fc.categorical_column_with_vocabulary_list("education", ["a", "b"]))]
    spec = est.classifier_parse_example_spec(columns, "label", weight_column="w")
    rng = np.random.default_rng(0)
    records = [_example(float(age), edu, int(age > 40), 1.0 + (edu == "b"))
               for age, edu in zip(rng.uniform(20, 60, 96), rng.choice(["a", "b"], 96))]

    def input_fn():
        for i in range(0, len(records), 32):
            features = est.io.parse_example(records[i:i + 32], spec)
            yield features, features.pop("label")
    estimator = est.LinearClassifier(columns, model_dir=str(tmp_path), weight_column="w")
    estimator.train(input_fn, max_steps=3)
    results = estimator.evaluate(input_fn)
    ages = np.array([est.io.parse_example([r], spec)["age"][0, 0] for r in records])
    weights = np.array([est.io.parse_example([r], spec)["w"][0, 0] for r in records])
    labels = (ages > 40).astype(float)
    assert results["label/mean"] == pytest.approx(float((labels * weights).sum()
                                                        / weights.sum()), rel=1e-6)


with open(os.path.join(FIXTURES, "tf_parse_defaults.json"), encoding="utf-8") as _f:
    TF_DEFAULTS = json.load(_f)["cases"]


@pytest.mark.parametrize("name", list(TF_DEFAULTS))
def test_fixed_len_defaults_are_taken_as_tf_takes_them(name):
    """record_tf_parse_defaults.py (TF 2.15): a string default is bytes (it was
    str, in an array mixing str and bytes); the default is reshaped to the
    shape, so it needs as many values (a scalar was broadcast); an int64
    default of 1.7 and a feature present with no values are errors (the
    default was truncated to 1 / used)."""
    case = TF_DEFAULTS[name]
    dtype = {"string": str, "int64": torch.int64}[case["dtype"]]
    values = case["present"]
    if values is None:   # a Feature holding no list: missing, as TF takes it (it was an error)
        example = est.io.Example()
        example.features.feature["f"].SetInParent()
        examples = [b"", example.SerializeToString()]
    else:
        examples = [b"", example_of({"f": values}, {"f": est.io.VarLenFeature(dtype)})]
    spec = {"f": est.io.FixedLenFeature(case["shape"], dtype, default_value=case["default"])}
    try:
        parsed = est.io.parse_example(examples, spec)["f"]
    except ValueError as e:
        assert "error" in case, e
        return
    assert "values" in case, f"parsed {parsed!r}; TF: {case['error']}"
    assert list(parsed.shape) == case["parsed_shape"] and [
        v.decode() if isinstance(v, bytes) else int(v) for v in parsed.reshape(-1)
    ] == case["values"]
    if case["dtype"] == "string":
        assert all(type(v) is bytes for v in parsed.reshape(-1))
