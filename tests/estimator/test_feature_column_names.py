"""Feature columns whose names hold '/' or '.' (R's `sepal.length`, a
DataFrame's `a/b`): their variables named as TF's (a '/' made '_', a '.'
kept), so TF's checkpoints warm-start them. TF's values recorded by
tests/support/fixtures/record_tf_column_names.py."""
import json
import os

import numpy as np
import pandas as pd
import pytest

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_column_names.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
fc = est.feature_column


def _frame():
    return pd.DataFrame({"a/b": np.array(TF["a/b"], dtype=object),
                         "a.b": np.array(TF["a.b"], dtype=object),
                         "c>d": np.array(TF["c>d"], dtype=object), "n/1": TF["n/1"]})


def _estimator(kind, model_dir, warm_start_from=None):
    ab = fc.categorical_column_with_vocabulary_list("a/b", ["x", "y"])
    dot = fc.categorical_column_with_vocabulary_list("a.b", ["x", "y"])
    gt = fc.categorical_column_with_hash_bucket("c>d", 5)
    num = fc.numeric_column("n/1")
    if kind == "linear":
        return est.LinearClassifier([ab, dot, gt, num], model_dir=model_dir,
                                    warm_start_from=warm_start_from)
    columns = (fc.shared_embedding_columns([ab, dot], 2) if kind == "shared" else [
        fc.embedding_column(ab, 2), fc.embedding_column(dot, 2), fc.embedding_column(gt, 2)])
    return est.DNNClassifier([4], columns + [num], model_dir=model_dir,
                             warm_start_from=warm_start_from)


@pytest.mark.parametrize("kind", ["linear", "dnn", "shared"])
def test_columns_named_with_slashes_and_dots_are_tfs_variables(kind, tmp_path):
    """A linear model over a column named "a.b" failed ('parameter name can't
    contain "."'); a column "a/b" made variables `a/b/weights` where TF's
    are `a_b/weights`, so a warm start from TF failed (names probe); "c>d"
    is TF's `c_d`, a shared embedding's collection name kept (the attack)."""
    estimator = _estimator(kind, str(tmp_path / "warm"),
                           os.path.join(FIXTURES, TF[kind]["prefix"]))
    logits = [p["logits"] for p in estimator.predict(
        est.inputs.pandas_input_fn(_frame(), batch_size=20, shuffle=False))]
    np.testing.assert_allclose(np.array(logits), np.array(TF[kind]["logits"]),
                               rtol=1e-5, atol=1e-6)
    trained = _estimator(kind, str(tmp_path / "trained"))
    trained.train(est.inputs.pandas_input_fn(_frame(), pd.Series(TF["labels"]), batch_size=10,
                                             shuffle=False, num_epochs=1), steps=2)
    names = [n for n in trained.get_variable_names() if not n.startswith("optimizer/")]
    assert sorted(names) == sorted(TF[kind]["variables"])
    again = _estimator(kind, str(tmp_path / "trained"))   # (restored by those names)
    assert len(list(again.predict(est.inputs.pandas_input_fn(
        _frame(), batch_size=20, shuffle=False)))) == 20


@pytest.mark.parametrize("features, key, hint", [
    ({0: np.ones(2), 1: np.ones(2)}, "0", "0 is a int, the column's key str"),
    ({"a\u0301ge": np.ones(2)}, "\u00e1ge", "is the same text in another Unicode normalization"),
    ({"age": np.ones(2)}, "agee", None)])
def test_a_missing_feature_says_what_tells_it_from_one_that_looks_like_it(features, key, hint):
    """`numeric_column("0")` over a DataFrame's columns 0, 1 said "the
    features are ['0', '1']" (the keys shown as strings); an NFD name beside
    the column's NFC one looked the same (names probe)."""
    with pytest.raises(ValueError, match=f"Feature {key!r} is not in features dictionary") as e:
        fc.input_layer(features, [fc.numeric_column(key)])
    assert (hint in str(e.value)) if hint else "(" not in str(e.value)


@pytest.mark.parametrize("layer", ["linear", "dnn"])
def test_columns_tf_would_name_alike_are_refused(layer, tmp_path):
    """"a/b" and "a_b" shared one variable without a word (the attack); TF:
    "Variable .../a_b/weights already exists"."""
    columns = [fc.categorical_column_with_vocabulary_list(n, ["x", "y"]) for n in ("a/b", "a_b")]
    estimator = (est.LinearClassifier(columns, model_dir=str(tmp_path)) if layer == "linear"
                 else est.DNNClassifier([2], [fc.embedding_column(c, 2) for c in columns],
                                        model_dir=str(tmp_path)))
    rows = {"a/b": np.array(["x", "y"]), "a_b": np.array(["y", "x"])}
    with pytest.raises(ValueError, match="the columns 'a/b(_embedding)?' and "
                                         "'a_b(_embedding)?' would both be variable scope 'a_b"):
        estimator.train(lambda: [(rows, np.array([0, 1]))], max_steps=1)
