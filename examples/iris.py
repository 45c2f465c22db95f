"""Iris flower classification with a DNN, the TF1 `DNNClassifier` tutorial
ported: Estimator.train, evaluate and predict on the shipped Iris CSV.

    python examples/iris.py [--model_dir runs/iris] [--max_steps 1000]
"""
from __future__ import annotations

import argparse
import csv
import logging
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import estimator as est  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                    "iris.csv")
SPECIES = ["setosa", "versicolor", "virginica"]
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def load_iris(path: str = DATA, test_fraction: float = 0.2, seed: int = 0):
    """(train, test) splits as ({feature: float32 array}, int64 labels)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    x = np.array([[float(r[k]) for k in FEATURES] for r in rows], dtype=np.float32)
    y = np.array([SPECIES.index(r["species"]) for r in rows], dtype=np.int64)
    order = np.random.RandomState(seed).permutation(len(rows))
    n_test = int(len(rows) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def input_fn(params, mode=est.ModeKeys.TRAIN):
    """Batches of ({"x": features}, labels) as numpy arrays; shuffled and repeated
    for training, one pass otherwise (tf.data's shuffle().repeat().batch())."""
    (x_train, y_train), (x_test, y_test) = load_iris()
    batch = params.get("batch_size", 32)
    if mode == est.ModeKeys.TRAIN:
        rng = np.random.RandomState(params.get("seed", 0))

        def repeat():
            while True:
                idx = rng.permutation(len(x_train))
                for i in range(0, len(idx) - batch + 1, batch):
                    j = idx[i:i + batch]
                    yield {"x": x_train[j]}, y_train[j]
        return repeat()
    return [({"x": x_test[i:i + batch]}, y_test[i:i + batch])
            for i in range(0, len(x_test), batch)]


def model_fn(features, labels, mode, params):
    """A DNNClassifier: hidden layers, ReLU, softmax cross-entropy."""
    def build():
        layers, width = [], len(FEATURES)
        for units in params.get("hidden_units", [16, 16]):
            layers += [torch.nn.Linear(width, units), torch.nn.ReLU()]
            width = units
        layers.append(torch.nn.Linear(width, len(SPECIES)))
        return torch.nn.Sequential(*layers)

    net = est.get_module("dnn", build)
    logits = net(features["x"])
    classes = logits.argmax(-1)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={
            "class_ids": classes, "probabilities": logits.softmax(-1), "logits": logits})
    loss = torch.nn.functional.cross_entropy(logits, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": est.metrics.accuracy(labels, classes)})
    optimizer = est.get_optimizer(
        lambda p: torch.optim.Adagrad(p, lr=params.get("learning_rate", 0.1)))
    return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/iris")
    parser.add_argument("--max_steps", type=int, default=1000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    params = {"hidden_units": [16, 16], "learning_rate": 0.1, "batch_size": 32}
    config = est.RunConfig(model_dir=args.model_dir, tf_random_seed=42,
                           save_checkpoints_steps=200)
    classifier = est.Estimator(model_fn, config=config, params=params)
    classifier.train(input_fn, max_steps=args.max_steps)   # input_fn(params, mode)
    result = classifier.evaluate(input_fn)
    print(f"\nTest set accuracy: {result['accuracy']:.3f}  loss: {result['loss']:.4f}  "
          f"global_step: {result['global_step']}")

    samples = np.array([[5.1, 3.3, 1.7, 0.5], [5.9, 3.0, 4.2, 1.5], [6.9, 3.1, 5.4, 2.1]],
                       dtype=np.float32)
    expected = ["setosa", "versicolor", "virginica"]
    for pred, want in zip(classifier.predict(lambda: [{"x": samples}]), expected):
        p = pred["probabilities"][pred["class_ids"]]
        print(f'Prediction is "{SPECIES[pred["class_ids"]]}" ({100 * p:.1f}%), expected "{want}"')
    return result


if __name__ == "__main__":
    main()
