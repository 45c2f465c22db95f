"""The canned regression and multi-class heads against TF's: models TF 2.15
trained (a DNNRegressor with label_dimension=2 and a weight column, a
LinearRegressor, a 3-class DNNClassifier over a label vocabulary with a weight
column, binary DNNClassifiers with elu and dropout, and with batch norm)
warm-start here and take one step at learning rate 0, then evaluate (uneven
batches 16 x 3 + 5, float64 weights) and predict what TF did (recorded by
tests/support/fixtures/record_tf_heads.py): dropout off, batch norm's
statistics moved by the step's batch and used in evaluation, as TF's."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from head_data import LABELS, rows
from paths import FIXTURES
from tf_recorded import assert_evaluation_is_tfs, assert_predictions_are_tfs

with open(os.path.join(FIXTURES, "tf_heads.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
FROZEN = lambda params: torch.optim.SGD(params, lr=0.0)   # noqa: E731


def make(name, model_dir):
    x = [est.feature_column.numeric_column("x", shape=3)]
    warm = os.path.join(FIXTURES, "tf_ckpt", "heads", name)
    return {
        "dnn_regressor_2d": (lambda: est.DNNRegressor(
            [6], x, model_dir=model_dir, label_dimension=2, weight_column="w",
            optimizer=FROZEN, warm_start_from=warm), 1),
        "linear_regressor": (lambda: est.LinearRegressor(
            x, model_dir=model_dir, optimizer=FROZEN, warm_start_from=warm), 2),
        "dnn_classifier_3": (lambda: est.DNNClassifier(
            [6], x, model_dir=model_dir, n_classes=3, label_vocabulary=LABELS,
            weight_column="w", optimizer=FROZEN, warm_start_from=warm), 3),
        "dnn_dropout": (lambda: est.DNNClassifier(
            [8, 4], x, model_dir=model_dir, activation_fn=torch.nn.functional.elu,
            dropout=0.3, optimizer=FROZEN, warm_start_from=warm), 4),
        "dnn_batch_norm": (lambda: est.DNNClassifier(   # the statistics too, as recorded
            [8, 4], x, model_dir=model_dir, batch_norm=True, optimizer=FROZEN,
            warm_start_from=est.WarmStartSettings(warm, [".*"])), 4),
    }[name]


@pytest.mark.parametrize("name", sorted(TF["models"]))
def test_evaluation_and_predictions_are_tfs(name, tmp_path):
    recorded = TF["models"][name]
    build, target = make(name, str(tmp_path))
    estimator = build()
    train, eval_ = rows(64, 0), rows(53, 1)
    estimator.train(est.inputs.numpy_input_fn(train[0], train[target], 16, None, False),
                    steps=1)
    got = estimator.evaluate(est.inputs.numpy_input_fn(eval_[0], eval_[target], 16, 1, False))
    if name == "dnn_batch_norm":   # TF's list form warm-starts the step too: 5, then 6
        assert got["global_step"] == recorded["evaluation"]["global_step"] == 6
    assert_evaluation_is_tfs(got, recorded["evaluation"])
    few = {k: v[:5] for k, v in eval_[0].items()}
    assert_predictions_are_tfs(
        list(estimator.predict(est.inputs.numpy_input_fn(few, None, 5, 1, False))),
        recorded["predictions"])


with open(os.path.join(FIXTURES, "tf_sparse_combiner.json"), encoding="utf-8") as _f:
    TF_COMBINER = json.load(_f)


@pytest.mark.parametrize("combiner", sorted(TF_COMBINER["models"]))
def test_linear_sparse_combiners_over_multi_valued_columns_are_tfs(combiner, tmp_path):
    """LinearClassifier(sparse_combiner=...) over a padded multi-valued string
    column (repeats, empty rows), a weighted identity column and a cross,
    from TF's checkpoint (tests/support/fixtures/record_tf_sparse_combiner.py)."""
    from head_data import TAGS, tag_rows
    fc = est.feature_column
    columns = [fc.categorical_column_with_vocabulary_list("tags", TAGS, num_oov_buckets=1),
               fc.weighted_categorical_column(fc.categorical_column_with_identity("ids", 5),
                                              "scores"),
               fc.crossed_column(["tags", "flag"], 11)]
    estimator = est.LinearClassifier(
        columns, model_dir=str(tmp_path), sparse_combiner=combiner, optimizer=FROZEN,
        warm_start_from=os.path.join(FIXTURES, "tf_ckpt", "combiner", combiner))
    train, eval_ = tag_rows(64, 0), tag_rows(53, 1)
    estimator.train(est.inputs.numpy_input_fn(train[0], train[1], 16, None, False), steps=1)
    got = estimator.evaluate(est.inputs.numpy_input_fn(eval_[0], eval_[1], 16, 1, False))
    recorded = TF_COMBINER["models"][combiner]
    for key, value in recorded["evaluation"].items():
        if key != "global_step":
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    few = {k: v[:5] for k, v in eval_[0].items()}
    probabilities = [p["probabilities"] for p in estimator.predict(
        est.inputs.numpy_input_fn(few, None, 5, 1, False))]
    np.testing.assert_allclose(probabilities, recorded["probabilities"], rtol=1e-5, atol=1e-6)
