"""est.inputs.numpy_input_fn and pandas_input_fn: TF1's batches (recorded
from TF 2.15 by tests/support/fixtures/record_tf_inputs.py), their errors, and
the Estimator trained and evaluated on them."""
import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

import distribute
import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_inputs.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
N, BATCH = TF["rows"], TF["batch_size"]
X = {"id": np.arange(N, dtype=np.float64), "b": np.arange(N) * 10}
Y = np.arange(N) % 3


def frame():
    return pd.DataFrame({"id": np.arange(N, dtype=np.float64), "b": np.arange(N) * 10},
                        index=np.arange(100, 100 + N))


CASES = {
    "numpy_one_epoch": lambda: est.inputs.numpy_input_fn(X, Y, BATCH, 1, False),
    "numpy_two_epochs": lambda: est.inputs.numpy_input_fn(X, Y, BATCH, 2, False),
    "numpy_forever": lambda: est.inputs.numpy_input_fn(X, Y, BATCH, None, False),
    "numpy_array_no_labels": lambda: est.inputs.numpy_input_fn(
        np.arange(N * 2, dtype=np.float32).reshape(N, 2), None, BATCH, 1, False),
    "numpy_dict_labels": lambda: est.inputs.numpy_input_fn(
        X, {"y": Y, "z": Y * 2.0}, BATCH, 1, False),
    "pandas_one_epoch": lambda: est.inputs.pandas_input_fn(
        frame(), pd.Series(Y, index=frame().index), BATCH, 1, False),
    "pandas_two_epochs": lambda: est.inputs.pandas_input_fn(
        frame(), pd.Series(Y, index=frame().index), BATCH, 2, False),
    "pandas_frame_labels": lambda: est.inputs.pandas_input_fn(
        frame(), pd.DataFrame({"y": Y, "z": Y * 2.0}, index=frame().index), BATCH, 1, False),
    "pandas_no_labels": lambda: est.inputs.pandas_input_fn(frame(), None, BATCH, 1, False),
}


def describe(value):
    if isinstance(value, dict):
        return {k: describe(v) for k, v in sorted(value.items())}
    return {"dtype": value.dtype.name, "shape": list(value.shape), "value": value.tolist()}


def take(input_fn, limit=8, **kwargs):
    out = []
    for batch in input_fn(**kwargs):
        out.append({"features": describe(batch[0]), "labels": describe(batch[1])}
                   if isinstance(batch, tuple) else {"features": describe(batch)})
        if len(out) == limit:
            break
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_batches_are_tfs(case):
    """In order, the epochs one stream (a batch spans two epochs), the last
    batch short unless the stream is endless; dtypes as given (float64 stays
    float64 here; the Estimator makes it float32)."""
    assert take(CASES[case]()) == TF["cases"][case]


@pytest.mark.parametrize("case", ["numpy_shuffled_one_epoch", "pandas_shuffled_one_epoch"])
def test_shuffled_each_row_once_an_epoch_in_a_new_order_per_call(case):
    make = (lambda: est.inputs.numpy_input_fn(X, Y, BATCH, 1, True)) if case.startswith(
        "numpy") else (lambda: est.inputs.pandas_input_fn(
            frame(), pd.Series(Y, index=frame().index), BATCH, 1, True))
    input_fn = make()
    torch.manual_seed(0)
    first, second = take(input_fn), take(input_fn)
    torch.manual_seed(0)
    again = take(input_fn)
    sizes = [len(b["labels"]["value"]) for b in TF["cases"][case]]
    for batches in (first, second):
        assert [len(b["labels"]["value"]) for b in batches] == sizes
        ids = [i for b in batches for i in b["features"]["id"]["value"]]
        assert sorted(ids) == list(range(N)) and ids != list(range(N))
        for b in batches:                                   # rows stay whole
            assert [int(i) % 3 for i in b["features"]["id"]["value"]] == b["labels"]["value"]
    assert first != second and again == first


def test_pipelines_take_every_nth_batch_of_one_stream():
    input_fn = est.inputs.numpy_input_fn(X, Y, 3, 1, True)
    parts = []
    for pipeline in range(3):
        torch.manual_seed(5)
        context = distribute.InputContext(num_input_pipelines=3, input_pipeline_id=pipeline,
                                          num_replicas_in_sync=3)
        parts.append([f["id"].tolist() for f, _ in input_fn(context)])
    torch.manual_seed(5)
    whole = [f["id"].tolist() for f, _ in input_fn()]
    assert [parts[i % 3][i // 3] for i in range(len(whole))] == whole


def test_strings_and_a_categorical_column_from_pandas():
    df = pd.DataFrame({"name": [f"row{i}" for i in range(5)],
                       "kind": pd.Categorical(["a", "b", "a", "c", "b"])})
    (features, labels), = est.inputs.pandas_input_fn(
        df, pd.Series(np.arange(5.0)), batch_size=8, shuffle=False)()
    assert features["name"].tolist() == [f"row{i}" for i in range(5)]
    assert features["kind"].tolist() == ["a", "b", "a", "c", "b"]
    assert labels.dtype == np.float64


@pytest.mark.parametrize("call, error, match", [
    (lambda: est.inputs.numpy_input_fn(X, Y), ValueError,
     "shuffle must be provided and explicitly set as boolean"),
    (lambda: est.inputs.numpy_input_fn(X, Y, shuffle=1), ValueError, "got 1"),
    (lambda: est.inputs.numpy_input_fn({}, Y, shuffle=False), ValueError,
     "x cannot be an empty dict"),
    (lambda: est.inputs.numpy_input_fn(np.zeros((0, 2)), shuffle=False), ValueError,
     "x cannot be an empty array"),
    (lambda: est.inputs.numpy_input_fn([1, 2], shuffle=False), TypeError,
     "x must be a dict or array; got list"),
    (lambda: est.inputs.numpy_input_fn(X, Y[:7], shuffle=False), ValueError,
     r"mismatched.*x\['b'\] has 10, x\['id'\] has 10, y has 7"),
    (lambda: est.inputs.numpy_input_fn(X, {"b": Y}, shuffle=False), ValueError,
     r"1 duplicate keys are found in both x and y: \['b'\]"),
    (lambda: est.inputs.numpy_input_fn(X, {}, shuffle=False), ValueError,
     "y cannot be empty dict"),
    (lambda: est.inputs.numpy_input_fn(X, Y, batch_size=0, shuffle=False), ValueError,
     "batch_size must be a positive integer, got 0"),
    (lambda: est.inputs.numpy_input_fn(X, Y, num_epochs=0.5, shuffle=False), ValueError,
     "num_epochs must be a positive integer or None, got 0.5"),
    (lambda: est.inputs.pandas_input_fn(X, shuffle=False), TypeError,
     "x must be a pandas DataFrame; got dict"),
    (lambda: est.inputs.pandas_input_fn(frame(), Y, shuffle=False), TypeError,
     "y must be a pandas Series or DataFrame; got ndarray"),
    (lambda: est.inputs.pandas_input_fn(frame(), pd.Series(Y), shuffle=False), ValueError,
     r"Index for x and y are mismatched: x's index \[100, 101, 102, 103, 104\] \.\.\. "
     r"\(10 rows\), y's index \[0, 1, 2, 3, 4\] \.\.\. \(10 rows\)"),
    (lambda: est.inputs.pandas_input_fn(frame(), pd.Series(Y, index=frame().index),
                                        shuffle=False, target_column="b"), ValueError,
     "Cannot use name b for target column"),
    (lambda: est.inputs.pandas_input_fn(frame(), shuffle=False, target_column=3), TypeError,
     "target_column must be a string type"),
])
def test_bad_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def census_frame(n, seed):
    """A census-like DataFrame as pandas reads a CSV: float64 and int64
    numbers, str columns (pandas' own string dtype)."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"age": rng.uniform(17, 90, n).round(),
                       "hours": rng.integers(1, 99, n),
                       "education": rng.choice(["Bachelors", "HS-grad", "Masters"], n)})
    label = ((df["age"] > 40) & (df["education"] != "HS-grad")).astype(np.int64)
    return df, label


def test_a_canned_estimator_on_pandas_as_a_tf1_program(tmp_path):
    """TF1's census pattern: train on pandas_input_fn(shuffle=True,
    num_epochs=None), evaluate with num_epochs=1 on 203 rows in batches of
    32 (the last holds 11): every row counted once."""
    fc = est.feature_column
    columns = [fc.numeric_column("age"), fc.numeric_column("hours"),
               fc.indicator_column(fc.categorical_column_with_vocabulary_list(
                   "education", ["Bachelors", "HS-grad", "Masters"]))]
    train_x, train_y = census_frame(500, 0)
    test_x, test_y = census_frame(203, 1)
    estimator = est.DNNClassifier([8], columns, model_dir=str(tmp_path),
                                  config=est.RunConfig(tf_random_seed=1))
    estimator.train(est.inputs.pandas_input_fn(train_x, train_y, batch_size=32,
                                               num_epochs=None, shuffle=True), steps=50)
    results = estimator.evaluate(est.inputs.pandas_input_fn(test_x, test_y, batch_size=32,
                                                            shuffle=False))
    assert results["global_step"] == 50
    assert results["label/mean"] == pytest.approx(float(test_y.mean()), rel=1e-6)
    predictions = list(estimator.predict(est.inputs.pandas_input_fn(
        test_x, batch_size=32, shuffle=False)))
    assert len(predictions) == 203
    got = np.array([p["class_ids"][0] for p in predictions])
    assert results["accuracy"] == pytest.approx(float((got == test_y.to_numpy()).mean()),
                                                rel=1e-6)


def _ids_model_fn(features, labels, mode):
    net = est.get_module("net", lambda: torch.nn.Linear(1, 1))
    ids = features["id"]
    loss = ((net(ids[:, None]).squeeze(-1) - labels) ** 2).mean()
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.0)), eval_metric_ops={
        "id": est.metrics.mean(ids), "id_squared": est.metrics.mean(ids ** 2)})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_replicas_read_disjoint_parts_of_one_shuffled_stream(tmp_path):
    """Each replica shuffles with the same draw and takes every other batch:
    together every row once (TF's sharding of one input)."""
    ids = np.arange(203, dtype=np.float64)
    one = est.Estimator(_ids_model_fn, model_dir=str(tmp_path))
    one.train(est.inputs.numpy_input_fn({"id": ids}, ids, 10, 1, False), steps=1)
    strategy = distribute.MirroredStrategy(["cpu:0", "cpu:1"])
    two = est.Estimator(_ids_model_fn, config=est.RunConfig(model_dir=str(tmp_path),
                                                            eval_distribute=strategy))
    results = two.evaluate(est.inputs.numpy_input_fn({"id": ids}, ids, 10, 1, True))
    assert results["id"] == pytest.approx(ids.mean(), rel=1e-6)
    assert results["id_squared"] == pytest.approx((ids ** 2).mean(), rel=1e-6)
