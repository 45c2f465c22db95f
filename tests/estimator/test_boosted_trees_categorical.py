"""Boosted trees over bare categorical columns (TF's equality splits: the
column is one feature, its id, and a split sends the examples whose id
equals its value left) against TF 2.8's, recorded by
tests/support/fixtures/record_tf_boosted_trees_categorical.py on the rows of
`bt_data.categorical_rows`: vocabulary (an out-of-vocabulary value: TF's
missing bucket; an OOV bucket), identity (ignored -1 ids), hashed and
crossed columns, absent values (TF reads them as id 0), with bucketized,
numeric and indicator columns, in groups of mixed split types; classifier,
regressor, multi-class, pre-pruning, two batches a layer, bias centering.
Where TF 2.8 fails (feature importances: "Unexpected split type
categorical_split"; post-pruning: a segmentation fault) or is wrong
(explanations: a categorical split's change credited to feature 0), this
library gives the answer the rest of TF's definition implies, checked here
against the parts TF gets right."""
import itertools
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from bt_data import COLORS, SHADES, X1_BOUNDARIES, X2_BOUNDARIES, batches, categorical_rows
from bt_trees import assert_trees_are, tf_trees, trees_of
from paths import FIXTURES
from tf_recorded import assert_evaluation_is_tfs, assert_predictions_are_tfs

fc = est.feature_column
with open(os.path.join(FIXTURES, "tf_boosted_trees_categorical.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
CASES = sorted(TF["cases"])


def _column(name):
    color = fc.categorical_column_with_vocabulary_list("color", COLORS)
    return {
        "x1": lambda: fc.bucketized_column(fc.numeric_column("x1"), X1_BOUNDARIES),
        "x2": lambda: fc.bucketized_column(fc.numeric_column("x2"), X2_BOUNDARIES),
        "x1_numeric": lambda: fc.numeric_column("x1"),
        "color": lambda: color,
        "color_indicator": lambda: fc.indicator_column(color),
        "color_hash": lambda: fc.categorical_column_with_hash_bucket("color", 7),
        "code": lambda: fc.categorical_column_with_identity("code", 5),
        "flag": lambda: fc.categorical_column_with_identity("flag", 2),
        "shade": lambda: fc.categorical_column_with_vocabulary_list("shade", SHADES),
        "shade_oov": lambda: fc.categorical_column_with_vocabulary_list(
            "shade", SHADES, num_oov_buckets=1),
        "cross": lambda: fc.crossed_column([color, "shade"], 6),
    }[name]()


def _data(record, n, seed):
    features, binary, target, kind = categorical_rows(n, seed)
    return features, {"binary": binary, "target": target, "kind": kind}[record["labels"]]


def _build(name, model_dir, **more):
    record = TF["cases"][name]
    return getattr(est, record["estimator"])(
        [_column(c) for c in record["columns"]], model_dir=model_dir,
        **{**record["arguments"], **more})


def _train(name, model_dir, **more):
    record = TF["cases"][name]
    estimator = _build(name, model_dir, **more)
    train = batches(_data(record, 60, 0), record["batch_size"])
    estimator.train(lambda: itertools.cycle(train), max_steps=record["max_steps"])
    return estimator


def _names(record):
    """TF's names of the feature ids (one feature a column here), from its
    explanations' keys."""
    return sorted(name for name, _ in record["explanations"][0]["dfc"])


def _few(name):
    return [(f, None) for f, _ in batches(_data(TF["cases"][name], 30, 1), 12)[:1]]


@pytest.mark.parametrize("name", CASES)
def test_the_trees_evaluation_and_predictions_are_tfs(name, tmp_path):
    recorded = TF["cases"][name]
    estimator = _train(name, str(tmp_path / "model"))
    assert estimator.get_variable_value("global_step") == recorded["final_global_step"]
    assert_trees_are(trees_of(estimator), tf_trees(recorded["ensemble"]),
                     ties=name == "multiclass", negligible=1e-6)
    assert_evaluation_is_tfs(
        estimator.evaluate(lambda: batches(_data(recorded, 30, 1), 8)), recorded["evaluation"])
    assert_predictions_are_tfs(list(estimator.predict(lambda: _few(name))),
                               recorded["predictions"])


def test_the_recorded_trees_split_on_categorical_columns_where_tf_reads_them():
    """The cases exercise what they are for: equality splits in every case,
    on an id an absent value takes (0) and beside inequality splits of the
    same group."""
    for name, record in TF["cases"].items():
        kinds = {next(iter(k for k in n if k.endswith("_split")), "leaf")
                 for t in record["ensemble"]["trees"] for n in t.get("nodes", [])}
        assert "categorical_split" in kinds, name
    flag = [n for t in TF["cases"]["indicator_and_flag"]["ensemble"]["trees"]
            for n in t.get("nodes", [])]
    assert {"bucketized_split", "categorical_split"} <= {k for n in flag for k in n}


@pytest.mark.parametrize("name", ["regressor_center_bias", "classifier_center_bias"])
def test_feature_importances_sum_each_columns_gains(name, tmp_path):
    """TF 2.8 raises "Unexpected split type categorical_split"; here each
    column's gains summed over its splits, the categorical column's equality
    splits under its name, largest first."""
    recorded = TF["cases"][name]
    assert recorded["feature_importances"]["error"]["message"] == \
        "Unexpected split type categorical_split"
    estimator = _train(name, str(tmp_path / "model"))
    importances = estimator.experimental_feature_importances()
    names = _names(recorded)
    expected = {}
    for tree in tf_trees(recorded["ensemble"]):
        for node in tree:
            if node[0] == "split":
                expected[names[node[1]]] = expected.get(names[node[1]], 0.0) + node[-1]
    assert set(importances) == set(names)
    for column, gain in importances.items():
        assert gain == pytest.approx(expected.get(column, 0.0), rel=1e-5, abs=1e-6), column
    assert [abs(v) for v in importances.values()] == \
        sorted((abs(v) for v in importances.values()), reverse=True)


@pytest.mark.parametrize("name", ["regressor_center_bias", "classifier_center_bias"])
def test_explanations_credit_each_split_to_its_own_column(name, tmp_path):
    """TF 2.8 credits a categorical split's change to feature 0 (its kernel
    reads the split as a bucketized one, whose feature_id is 0 when unset).
    Here it goes to the split's column: the bias, the other columns'
    contributions and the sum (the prediction) are TF's; the categorical
    columns' between them hold what TF gave feature 0's column."""
    recorded = TF["cases"][name]
    estimator = _train(name, str(tmp_path / "model"))
    explained = list(estimator.experimental_predict_with_explanations(lambda: _few(name)))
    names = _names(recorded)
    categorical = {n for n in names if not n.endswith("_bucketized")}
    predictions = recorded["predictions"]
    assert len(explained) == len(recorded["explanations"]) == len(predictions)
    credited_elsewhere = 0
    for ours, theirs, prediction in zip(explained, recorded["explanations"], predictions):
        theirs_dfc = dict(theirs["dfc"])
        assert ours["bias"] == pytest.approx(theirs["bias"], abs=1e-6)
        assert set(ours["dfc"]) == set(theirs_dfc) == set(names)
        for column in set(names) - categorical:
            assert ours["dfc"][column] == pytest.approx(theirs_dfc[column], abs=2e-6), column
        assert sum(ours["dfc"][c] for c in categorical) == pytest.approx(
            sum(theirs_dfc[c] for c in categorical), abs=2e-6)
        value = prediction["probabilities"][1] if "probabilities" in prediction \
            else prediction["predictions"][0]
        assert ours["bias"] + sum(ours["dfc"].values()) == pytest.approx(value, abs=2e-6)
        credited_elsewhere += any(abs(ours["dfc"][c] - theirs_dfc[c]) > 1e-4
                                  for c in categorical)
    assert credited_elsewhere, "no row where TF credits feature 0 wrongly: the test tests nothing"


def test_post_pruning_prunes_equality_splits(tmp_path):
    """TF 2.8 crashes (a segmentation fault) as it post-prunes a tree with a
    categorical split. Here post-pruning is as for the other splits: the
    trees are those grown without pruning, less the splits of negative gain
    whose children are leaves, bottom up, and predict as the trees say."""
    name = "pre_pruning_numeric"
    pruned = _train(name, str(tmp_path / "post"), pruning_mode="post")
    trees = trees_of(pruned)
    assert any(n[0] == "split" and n[1] in (0, 1) for t in trees for n in t)   # (categorical)
    for tree in trees:
        for node in tree:
            if node[0] == "split" and node[-1] < 0:
                assert tree[node[3]][0] == "split" or tree[node[4]][0] == "split"
    features = _few(name)
    logits = np.array([p["logits"][0] for p in pruned.predict(lambda: features)])
    ids = {"code": np.where(features[0][0]["code"][:, 0] < 0, 0, features[0][0]["code"][:, 0]),
           "shade": np.array([SHADES.index(s) if s in SHADES else (0 if s == "" else -1)
                              for s in features[0][0]["shade"][:, 0]])}
    boundaries = pruned.get_variable_value("boosted_trees/boundaries")[0]
    count = int(pruned.get_variable_value("boosted_trees/boundary_count")[0])
    x1 = np.minimum(np.searchsorted(boundaries[:count], features[0][0]["x1"][:, 0]
                                    .astype(np.float32)), count - 1)
    buckets = np.stack([ids["code"], ids["shade"], x1], 1)
    expected = np.zeros(len(buckets), np.float32)
    for tree in trees:
        for row, example in enumerate(buckets):
            node = 0
            while tree[node][0] == "split":
                _, feature, threshold, left, right, _ = tree[node]
                goes_left = example[feature] == threshold if feature < 2 else \
                    example[feature] <= threshold
                node = left if goes_left else right
            expected[row] += tree[node][1][0]
    np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=1e-6)


def test_a_categorical_column_of_several_values_an_example_is_refused(tmp_path):
    estimator = est.BoostedTreesClassifier(
        [fc.categorical_column_with_vocabulary_list("tags", ["a", "b", "c"])],
        n_batches_per_layer=1, n_trees=1, max_depth=1, model_dir=str(tmp_path / "model"))
    features = {"tags": [["a"], ["b", "c"], []]}
    with pytest.raises(ValueError, match=r"Column 'tags' has 2 values in row 1: one value an "
                                         r"example"):
        estimator.train(lambda: [(features, np.array([0, 1, 0]))], steps=1)
    with pytest.raises(ValueError, match="WeightedCategoricalColumn 'color_weighted_by_w': its "
                                         "weights cannot be split on"):
        est.BoostedTreesClassifier(
            [fc.weighted_categorical_column(_column("color"), "w")], n_batches_per_layer=1)


def test_an_id_outside_the_columns_buckets_is_an_error_naming_it(tmp_path):
    estimator = est.BoostedTreesRegressor(
        [_column("code")], n_batches_per_layer=1, n_trees=1, max_depth=1,
        model_dir=str(tmp_path / "model"))
    features = {"code": np.array([[0], [7], [2]])}
    with pytest.raises(ValueError, match=r"'code': value 7 is out of range \[0, 5\)"):
        estimator.train(lambda: [(features, np.array([0.0, 1.0, 0.5]))], steps=1)


def test_categorical_ids_are_tfs_dense_ids():
    """`feature_column.categorical_ids`: TF's ``tf.sparse.to_dense`` of the
    ids (absent: 0; out of vocabulary: the default value, -1)."""
    features = {"shade": np.array([["pale"], [""], ["grey"], ["dark"]]),
                "code": np.array([[4], [-1], [0], [2]])}
    assert fc.categorical_ids(features, _column("shade")).tolist() == [[2], [0], [-1], [0]]
    assert fc.categorical_ids(features, _column("shade_oov")).tolist() == [[2], [0], [3], [0]]
    assert fc.categorical_ids(features, _column("code")).tolist() == [[4], [0], [0], [2]]
    assert fc.categorical_ids(features, _column("shade")).dtype == torch.int64
    with pytest.raises(ValueError, match="takes a categorical column"):
        fc.categorical_ids(features, fc.numeric_column("code"))


def test_exported_trees_serve_categorical_ids_as_predict(tmp_path):
    """The ids are host work an export records and a server redoes per
    request (an absent shade, an out-of-vocabulary color, an ignored code
    among them): the served scores are predict's and TF's."""
    from estimator import serving
    name = "classifier"
    estimator = _train(name, str(tmp_path / "model"))
    few = {k: v for k, v in _few(name)[0][0].items() if k in ("x1", "x2", "color", "code")}
    raw = {"x1": torch.tensor(few["x1"][:2], dtype=torch.float32),
           "x2": torch.tensor(few["x2"][:2], dtype=torch.float32),
           "color": few["color"][:2], "code": torch.tensor(few["code"][:2])}
    path = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(raw))
    instances = [{"x1": [float(few["x1"][i, 0])], "x2": [float(few["x2"][i, 0])],
                  "color": [str(few["color"][i, 0])], "code": [int(few["code"][i, 0])]}
                 for i in range(len(few["x1"]))]
    served = serving.Model(path).predict({"instances": instances})["predictions"]
    predicted = list(estimator.predict(lambda: [(few, None)]))
    np.testing.assert_allclose([s["scores"] for s in served],
                               [p["probabilities"] for p in predicted], atol=1e-6)
    np.testing.assert_allclose([s["scores"] for s in served],
                               [p["probabilities"] for p in TF["cases"][name]["predictions"]],
                               atol=1e-6)


@pytest.mark.slow
def test_two_replicas_grow_tfs_trees_and_predict_as_tf(tmp_path):
    """Trained on two replicas (each a half of each batch: their statistics'
    mean is the batch's), the trees over categorical columns are TF's; the
    predictions under two replicas (an odd last batch split unevenly) are
    TF's."""
    import distribute

    def strategy():
        return distribute.MirroredStrategy(
            ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
                timeout_seconds=60))
    name = "classifier_center_bias"
    record = TF["cases"][name]
    halves = [part for f, y in batches(_data(record, 60, 0), 60) for part in batches((f, y), 30)]
    model = _build(name, None, config=est.RunConfig(
        model_dir=str(tmp_path / "model"), train_distribute=strategy(),
        eval_distribute=strategy()))
    model.train(lambda: itertools.cycle(halves), max_steps=record["max_steps"])
    assert model.get_variable_value("global_step") == record["final_global_step"]
    assert_trees_are(trees_of(model), tf_trees(record["ensemble"]), negligible=1e-6)
    few = _few(name)[0][0]
    uneven = [({k: v[i:i + 5] for k, v in few.items()}, None) for i in range(0, 12, 5)]
    assert_predictions_are_tfs(list(model.predict(lambda: uneven)), record["predictions"])
