"""The port of tests/support/fixtures/tf_linear.py, the linear regression
that several TF recordings train: its data, in batches of 3, and its dense
layer from zeros."""
import numpy as np
import torch

import estimator as est

X = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
Y = (X @ np.array([[1.0], [-2.0]], np.float32) + 0.5).astype(np.float32)
BATCHES = [({"x": X[i:i + 3]}, Y[i:i + 3]) for i in (0, 3)]


def dense(features):
    """tf.compat.v1.layers.dense(x, 1, name="dense") from zeros."""
    def zeros():
        layer = torch.nn.Linear(2, 1)
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
        return layer
    return est.get_module("dense", zeros)(features["x"])


def model_fn(features, labels, mode):
    """The recorders' plain one: gradient descent at 0.1, with the `mae` metric."""
    pred = dense(features)
    return est.EstimatorSpec(
        mode, loss=est.losses.mean_squared_error(labels, pred),
        train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)),
        eval_metric_ops={"mae": est.metrics.mean_absolute_error(labels, pred)})


def assert_weights(estimator, recorded, rtol=1e-6, atol=1e-7):
    """`dense`'s kernel and bias as TF's `recorded` ones (tf_linear.weights)."""
    np.testing.assert_allclose(estimator.get_variable_value("dense/weight").ravel(),
                               recorded["kernel"], rtol=rtol, atol=atol)
    np.testing.assert_allclose(estimator.get_variable_value("dense/bias"), recorded["bias"],
                               rtol=rtol, atol=atol)
