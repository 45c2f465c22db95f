"""Linear regression as in TF's distribution guide ("Using tf.distribute.Strategy
with Estimator"): one `feats` feature, a LinearRegressor-style model_fn, and
the same code on one device or under MirroredStrategy; only RunConfig changes.

    python examples/linear_regression.py [--model_dir runs/lr] [--max_steps 300]
    python examples/linear_regression.py --devices cpu:0,cpu:1     # 2 CPU replicas
    estimator run configs/linear_regression.yaml                   # the same, from YAML
    estimator run configs/mirrored_cpu.yaml

The data: y = 2 * feats - 1 plus a little noise; the model learns w ~ 2, b ~ -1.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import distribute  # noqa: E402
import estimator as est  # noqa: E402

TRUE_W, TRUE_B = 2.0, -1.0


def _examples(n: int, seed: int):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, size=(n, 1)).astype(np.float32)
    y = (TRUE_W * x + TRUE_B + 0.01 * rng.randn(n, 1)).astype(np.float32)
    return x, y


def input_fn(params, mode, input_context=None):
    """({"feats": [batch, 1]}, [batch, 1]) batches: an endless stream for
    training (each input pipeline draws its own examples), 10 fixed batches
    otherwise (the guide's `evaluate(steps=10)`)."""
    batch = params.get("batch_size", 10)
    if mode == est.ModeKeys.TRAIN:
        pipeline = input_context.input_pipeline_id if input_context else 0
        rng = np.random.RandomState(100 + pipeline)

        def stream():
            while True:
                x, y = _examples(batch, rng.randint(1 << 30))
                yield {"feats": x}, y
        return stream()
    x, y = _examples(10 * batch, seed=0)
    return [({"feats": x[i:i + batch]}, y[i:i + batch]) for i in range(0, len(x), batch)]


def model_fn(features, labels, mode, params):
    """LinearRegressor's head: predictions, mean squared error, SGD."""
    linear = est.get_module("linear", lambda: torch.nn.Linear(1, 1))
    predictions = linear(features["feats"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"predictions": predictions})
    loss = torch.nn.functional.mse_loss(predictions, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "average_loss": est.metrics.mean_squared_error(labels, predictions),
            "label/mean": est.metrics.mean(labels),
            "prediction/mean": est.metrics.mean(predictions)})
    optimizer = est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=params.get("learning_rate", 0.1)))
    return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)


def serving_input_receiver_fn():
    """Serving takes raw `feats` of any batch size."""
    return est.export.build_raw_serving_input_receiver_fn({"feats": torch.zeros(1, 1)})()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/linear_regression")
    parser.add_argument("--max_steps", type=int, default=300)
    parser.add_argument("--devices", default=None,
                        help="comma-separated devices for MirroredStrategy, e.g. cpu:0,cpu:1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    strategy = distribute.MirroredStrategy(args.devices.split(",")) if args.devices else None
    config = est.RunConfig(model_dir=args.model_dir, tf_random_seed=1,
                           save_checkpoints_steps=100, train_distribute=strategy,
                           eval_distribute=strategy)
    regressor = est.Estimator(model_fn, config=config,
                              params={"learning_rate": 0.1, "batch_size": 10})
    regressor.train(input_fn, max_steps=args.max_steps)
    result = regressor.evaluate(input_fn)
    w = float(regressor.get_variable_value("linear/weight").ravel()[0])
    b = float(regressor.get_variable_value("linear/bias").ravel()[0])
    print(f"average_loss: {result['average_loss']:.5f}  global_step: {result['global_step']}  "
          f"learned y = {w:.3f} * feats + {b:.3f}")
    return result, w, b


if __name__ == "__main__":
    main()
