"""Small model_fns and input_fns shared by the tests."""
import numpy as np
import torch

import estimator as est

TRUE_W = np.array([[2.0], [-3.0], [0.5]], dtype=np.float32)


def regression_data(n=256, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 3).astype(np.float32)
    y = x @ TRUE_W + 1.0
    return x, y


def regression_input_fn(batch_size=32, n=256, repeat=True, seed=0):
    x, y = regression_data(n, seed)

    def input_fn():
        def gen():
            while True:
                for i in range(0, n, batch_size):
                    yield {"x": x[i:i + batch_size]}, y[i:i + batch_size]
                if not repeat:
                    return
        return gen()
    return input_fn


def regression_model_fn(features, labels, mode, params):
    net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
    pred = net(torch.as_tensor(features["x"]))
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": pred})
    loss = torch.nn.functional.mse_loss(pred, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "mae": est.metrics.mean_absolute_error(labels, pred)})
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=params.get("lr", 0.1),
                                                      momentum=params.get("momentum", 0.0)))
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def bn_dropout_model_fn(features, labels, mode, params):
    """A user-shaped classifier: 512-unit hidden layers with batch-norm and
    dropout, Adam (two slots a variable): a checkpoint of several MiB."""
    width = params.get("width", 512)
    net = est.get_module("dnn", lambda: torch.nn.Sequential(
        torch.nn.Linear(4, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU(),
        torch.nn.Dropout(0.3), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Dropout(0.3), torch.nn.Linear(width, 3)))
    logits = net(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"logits": logits})
    loss = torch.nn.functional.cross_entropy(logits, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss)
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.Adam(p, lr=1e-3)))


def iris_like_input_fn(n=100, batch_size=32, seed=0, epochs=1):
    """float64 features (as pandas gives them) and int64 labels, the last
    batch of each epoch short (100 = 3 x 32 + 4)."""
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 4)   # float64
    y = rng.randint(0, 3, n)

    def input_fn():
        return [({"x": x[i:i + batch_size]}, y[i:i + batch_size])
                for _ in range(epochs) for i in range(0, n, batch_size)]
    return input_fn
