"""Canned estimators used as TF1 programs use them: exported and served,
extended with add_metrics / forward_features, trained with
train_and_evaluate and on two Mirrored replicas."""
import numpy as np
import pytest
import torch

import distribute
import estimator as est
from estimator import feature_column as fc

N = 96


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    features = {"a": x[:, 0], "b": x[:, 1], "id": np.arange(n, dtype=np.int64),
                "color": rng.choice(["red", "green", "blue"], n)}
    labels = (x[:, 0] + 0.5 * x[:, 1] + (features["color"] == "red") > 0.3).astype(np.int64)
    return features, labels


def _input(features, labels, batch=16, repeat=False):
    def input_fn():
        while True:
            for i in range(0, len(labels), batch):
                yield {k: v[i:i + batch] for k, v in features.items()}, labels[i:i + batch]
            if not repeat:
                return
    return input_fn


NUMERIC = [fc.numeric_column("a"), fc.numeric_column("b")]


def test_exported_classifier_serves_what_predict_gives(tmp_path):
    features, labels = _data()
    estimator = est.DNNClassifier([6], NUMERIC, model_dir=str(tmp_path / "m"), dropout=0.3,
                                  batch_norm=True)
    estimator.train(_input(features, labels, repeat=True), max_steps=20)
    receiver = est.export.build_raw_serving_input_receiver_fn(
        {"a": torch.zeros(2), "b": torch.zeros(2)})
    path = estimator.export_saved_model(str(tmp_path / "export"), receiver)
    served = est.export.load(path)
    assert set(served.signatures) == {"serving_default", "classification", "regression",
                                      "predict"}
    inputs = {"a": torch.from_numpy(features["a"]), "b": torch.from_numpy(features["b"])}
    scores = served.signatures["classification"](**inputs)["scores"].numpy()
    predicted = np.stack([p["probabilities"] for p in estimator.predict(
        _input({"a": features["a"], "b": features["b"]}, labels))])
    np.testing.assert_allclose(scores, predicted, rtol=1e-5, atol=1e-6)
    outputs = served.signatures["predict"](**inputs)
    assert set(outputs) == {"logits", "logistic", "probabilities", "class_ids",
                            "all_class_ids"}
    np.testing.assert_allclose(served.signatures["regression"](**inputs)["outputs"].numpy(),
                               outputs["logistic"].numpy())


def test_add_metrics_and_forward_features(tmp_path):
    features, labels = _data()
    base = est.LinearClassifier(NUMERIC + [fc.categorical_column_with_vocabulary_list(
        "color", ["red", "green", "blue"])], model_dir=str(tmp_path))
    base.train(_input(features, labels, repeat=True), max_steps=10)

    def metric_fn(labels, predictions, features):
        return {"mean_id": est.metrics.mean(features["id"].float()),
                "auc": est.metrics.auc(labels, predictions["logistic"], name="my_auc")}
    with_metrics = est.add_metrics(base, metric_fn)
    results = with_metrics.evaluate(_input(features, labels))
    plain = base.evaluate(_input(features, labels))
    assert results["mean_id"] == pytest.approx((N - 1) / 2)
    assert results["auc"] == pytest.approx(plain["auc"])
    assert set(results) == set(plain) | {"mean_id"}

    forwarding = est.forward_features(base, ["id", "color"])
    rows = list(forwarding.predict(_input(features, labels)))
    assert [int(r["id"]) for r in rows] == list(range(N))
    assert [r["color"] for r in rows] == [c.encode() for c in features["color"]]   # TF's bytes
    assert rows[5]["logistic"] == pytest.approx(list(base.predict(_input(features, labels)))[5]
                                                ["logistic"])
    with pytest.raises(ValueError, match=r"Feature \(nope\) is not in features dict"):
        next(iter(est.forward_features(base, "nope").predict(_input(features, labels))))
    with pytest.raises(ValueError, match="not expected args"):
        est.add_metrics(base, lambda labels, mode: {})


def test_train_and_evaluate_a_combined_model(tmp_path):
    features, labels = _data()
    color = fc.categorical_column_with_vocabulary_list("color", ["red", "green", "blue"])
    estimator = est.DNNLinearCombinedClassifier(
        model_dir=str(tmp_path), linear_feature_columns=[color] + NUMERIC,
        dnn_feature_columns=NUMERIC, dnn_hidden_units=[8],
        config=est.RunConfig(save_checkpoints_steps=50, tf_random_seed=1))
    results, _ = est.train_and_evaluate(
        estimator, est.TrainSpec(_input(features, labels, repeat=True), max_steps=100),
        est.EvalSpec(_input(features, labels), throttle_secs=0))
    assert results["global_step"] == 100
    assert results["auc"] > 0.85


@pytest.mark.slow
def test_mirrored_replicas_train_what_one_process_trains(tmp_path):
    """Two Mirrored CPU replicas, each taking its own batch of 16 (TF1's rule:
    a step of N replicas consumes N batches), end with the weights of one
    process on batches of 32 (the SUM loss's replica gradients add, as TF1's)."""
    features, labels = _data()
    columns = NUMERIC + [fc.embedding_column(
        fc.categorical_column_with_hash_bucket("color", 7), 2)]

    def trained(name, strategy, batch):
        estimator = est.DNNClassifier(
            [4], columns, model_dir=str(tmp_path / name), optimizer="SGD",
            config=est.RunConfig(train_distribute=strategy, tf_random_seed=3))
        estimator.train(_input(features, labels, batch=batch, repeat=True), max_steps=6)
        return {n: estimator.get_variable_value(n) for n in estimator.get_variable_names()
                if not n.startswith("optimizer")}
    one = trained("one", None, 32)
    two = trained("two", distribute.MirroredStrategy(["cpu:0", "cpu:1"]), 16)
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [
    lambda: distribute.MirroredStrategy(["cpu:0", "cpu:1"]),
    lambda: distribute.MirroredStrategy(["cpu:0", "cpu:1"],
                                        cross_device_ops=distribute.ReductionToOneDevice()),
    lambda: distribute.CentralStorageStrategy(["cpu:0", "cpu:1"]),
], ids=["mirrored", "reduction_to_one_device", "central_storage"])
def test_wide_and_deep_replicas_train_what_one_process_trains(tmp_path, strategy):
    """Wide & deep steps two optimizers in a callable train_op: on two
    replicas of every synchronous strategy it ends with one process's weights
    (before: under ReductionToOneDevice each replica stepped on its own
    gradients, under central storage nothing trained)."""
    features, labels = _data()
    deep = NUMERIC + [fc.embedding_column(fc.categorical_column_with_hash_bucket("color", 7), 2)]

    def trained(name, strategy, batch):
        estimator = est.DNNLinearCombinedClassifier(
            model_dir=str(tmp_path / name), linear_feature_columns=NUMERIC,
            linear_optimizer="SGD", dnn_feature_columns=deep, dnn_hidden_units=[4],
            dnn_optimizer="SGD",
            config=est.RunConfig(train_distribute=strategy, tf_random_seed=3))
        estimator.train(_input(features, labels, batch=batch, repeat=True), max_steps=6)
        return {n: estimator.get_variable_value(n) for n in estimator.get_variable_names()
                if not n.startswith("optimizer")}
    one = trained("one", None, 32)
    two = trained("two", strategy(), 16)
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_warm_start_from_another_canned_model(tmp_path):
    """warm_start_from a model_dir: the variables start as that model's (with
    a zero learning rate they stay so), the global step at 0 as in TF."""
    features, labels = _data()
    first = est.DNNClassifier([5], NUMERIC, model_dir=str(tmp_path / "a"))
    first.train(_input(features, labels, repeat=True), max_steps=10)
    second = est.DNNClassifier([5], NUMERIC, model_dir=str(tmp_path / "b"),
                               optimizer=lambda p: torch.optim.SGD(p, lr=0.0),
                               warm_start_from=first.model_dir)
    second.train(_input(features, labels, repeat=True), max_steps=1)
    for name in ("dnn/hiddenlayer_0/kernel", "dnn/logits/bias"):
        np.testing.assert_array_equal(second.get_variable_value(name),
                                      first.get_variable_value(name))
    assert second.get_variable_value("global_step") == 1
