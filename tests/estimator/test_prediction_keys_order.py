"""A prediction's keys come in TF's order (recorded by
tests/support/fixtures/record_tf_prediction_keys.py): a port that prints a
prediction or writes its keys as columns sees TF's. A classifier's class
names followed all the ids (`class_ids, all_class_ids, classes, ...`); TF
puts each after its ids (`class_ids, classes, all_class_ids, all_classes`)."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_prediction_keys.json"), encoding="utf-8") as _f:
    TF = json.load(_f)["models"]
X = [est.feature_column.numeric_column("x", shape=3)]
MODELS = {   # as the recorder builds them
    "dnn_classifier_2": lambda d: est.DNNClassifier([4], X, d),
    "dnn_classifier_3": lambda d: est.DNNClassifier([4], X, d, n_classes=3,
                                                    label_vocabulary=["a", "b", "c"]),
    "linear_classifier_2": lambda d: est.LinearClassifier(X, d),
    "baseline_classifier_3": lambda d: est.BaselineClassifier(d, n_classes=3),
    "dnn_linear_combined_classifier_2": lambda d: est.DNNLinearCombinedClassifier(
        d, linear_feature_columns=X, dnn_feature_columns=X, dnn_hidden_units=[4]),
    "dnn_regressor": lambda d: est.DNNRegressor([4], X, d),
    "linear_regressor": lambda d: est.LinearRegressor(X, d),
    "binary_head": lambda d: est.DNNEstimator(est.BinaryClassHead(), [4], X, d),
    "multi_class_head": lambda d: est.DNNEstimator(est.MultiClassHead(3), [4], X, d),
    "multi_label_head": lambda d: est.DNNEstimator(est.MultiLabelHead(3), [4], X, d),
    "regression_head_exp": lambda d: est.DNNEstimator(
        est.RegressionHead(inverse_link_fn=torch.exp), [4], X, d),
    "poisson_head": lambda d: est.DNNEstimator(est.PoissonRegressionHead(), [4], X, d),
    "logistic_regression_head": lambda d: est.DNNEstimator(est.LogisticRegressionHead(),
                                                           [4], X, d),
    "multi_head": lambda d: est.DNNEstimator(est.MultiHead(
        [est.MultiClassHead(3, name="kind"), est.RegressionHead(name="score")]), [4], X, d),
}


def test_every_recorded_model_is_built():
    assert sorted(MODELS) == sorted(TF)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_predictions_keys_come_in_tfs_order(name, tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = next(MODELS[name](str(tmp_path)).predict(lambda: iter([{"x": x}])))
    assert ["/".join(k) if isinstance(k, tuple) else k for k in first] == TF[name]
