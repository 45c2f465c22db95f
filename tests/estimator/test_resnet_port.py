"""A port of a TF1 program shaped like tensorflow/models' official/r1/resnet
(cifar10_main.py through resnet_run_loop.resnet_model_fn), written as a user
would, against what TF itself did with the same weights and data
(tests/support/fixtures/record_tf_resnet_port.py made tf_resnet_port.json):
the logged learning rate, cross entropy and streaming train accuracies at each
step, every variable after training (batch norm's moving statistics and the
momentum slots included), the evaluation over uneven batches, predictions."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
import hooks

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "support", "fixtures",
                       "tf_resnet_port.json")


@pytest.fixture(scope="module")
def tf_run():
    with open(FIXTURE) as f:
        return json.load(f)


def _model_fn(tf_run, rate_in_factory=False):
    """`rate_in_factory`: the rate passed to the optimizer as TF's program does
    (`MomentumOptimizer(learning_rate)`), else set on its groups each step."""
    init = {k: torch.tensor(v) for k, v in tf_run["init"].items()}
    decay, boundaries, values = tf_run["weight_decay"], tf_run["boundaries"], tf_run["values"]

    def build():
        net = torch.nn.ModuleDict({
            "conv": torch.nn.Conv2d(3, 4, 3, padding=1, bias=False),
            # TF's momentum 0.997 is torch's 0.003.
            "batch_normalization": torch.nn.BatchNorm2d(4, momentum=0.003, eps=1e-5),
            "dense": torch.nn.Linear(4, 10)})
        with torch.no_grad():
            net["conv"].weight.copy_(init["conv"].permute(3, 2, 0, 1))   # HWIO -> OIHW
            net["dense"].weight.copy_(init["dense_kernel"].T)
            net["dense"].bias.copy_(init["dense_bias"])
        return net

    def model_fn(features, labels, mode, params):
        net = est.get_module("resnet", build)
        x = features["image"].permute(0, 3, 1, 2)   # channels_last as in TF's input
        x = torch.relu(net["batch_normalization"](net["conv"](x)))
        logits = net["dense"](x.mean((2, 3)))
        predictions = {"classes": logits.argmax(1), "probabilities": logits.softmax(1)}
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions=predictions)
        cross_entropy = est.losses.sparse_softmax_cross_entropy(labels, logits)
        est.named_tensor("cross_entropy", cross_entropy)
        l2_loss = decay * sum((p ** 2).sum() / 2 for name, p in net.named_parameters()
                              if "batch_normalization" not in name)
        loss = cross_entropy + l2_loss
        optimizer = None
        if mode == est.ModeKeys.TRAIN:
            learning_rate = est.learning_rate_decay.piecewise_constant(
                est.get_global_step(), boundaries, values)
            if rate_in_factory:
                optimizer = est.get_optimizer(lambda p: torch.optim.SGD(
                    p, lr=learning_rate, momentum=0.9))
            else:
                optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=values[0],
                                                                        momentum=0.9))
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate
            est.named_tensor("learning_rate",
                             torch.tensor(optimizer.param_groups[0]["lr"]))
        accuracy = est.metrics.accuracy(labels, predictions["classes"])
        top_5 = torch.topk(logits, 5).indices.eq(labels[:, None]).any(1)
        accuracy_top_5 = est.metrics.mean(top_5.float())
        est.named_tensor("train_accuracy", accuracy[1])
        est.named_tensor("train_accuracy_top_5", accuracy_top_5[1])
        return est.EstimatorSpec(mode, predictions=predictions, loss=loss, train_op=optimizer,
                                 eval_metric_ops={"accuracy": accuracy,
                                                  "accuracy_top_5": accuracy_top_5})
    return model_fn


class _Log(hooks.SessionRunHook):
    NAMES = ["learning_rate", "cross_entropy", "train_accuracy", "train_accuracy_top_5"]

    def __init__(self):
        self.logged = []

    def before_run(self, run_context):
        return hooks.SessionRunArgs({n: n for n in self.NAMES})

    def after_run(self, run_context, run_values):
        self.logged.append({k: float(v) for k, v in run_values.results.items()})


def _input(batches):
    def input_fn():
        return [({"image": np.array(b["image"], np.float32)}, np.array(b["label"], np.int32))
                for b in batches]
    return input_fn


def _tf_name(name):
    """Our state-dict names as TF1's variable names."""
    return {"resnet/conv/weight": "conv2d/kernel",
            "resnet/batch_normalization/weight": "batch_normalization/gamma",
            "resnet/batch_normalization/bias": "batch_normalization/beta",
            "resnet/batch_normalization/running_mean": "batch_normalization/moving_mean",
            "resnet/batch_normalization/running_var": "batch_normalization/moving_variance",
            "resnet/dense/weight": "dense/kernel", "resnet/dense/bias": "dense/bias"}[name]


def _as_tf(name, value):
    if name == "conv2d/kernel":
        return value.transpose(2, 3, 1, 0)
    if name == "dense/kernel":
        return value.T
    return value


@pytest.fixture(scope="module", params=["rate_on_groups", "rate_in_factory"])
def trained(request, tf_run, tmp_path_factory):
    """The rate set on the optimizer's groups each step, or given to its
    factory (which runs once: before, the rate stayed the first step's)."""
    model_dir = str(tmp_path_factory.mktemp("resnet"))
    e = est.Estimator(_model_fn(tf_run, request.param == "rate_in_factory"),
                      model_dir=model_dir)
    log = _Log()
    e.train(_input(tf_run["train"]), hooks=[log])
    return e, log.logged


def test_logged_each_step_as_tf(tf_run, trained):
    _, logged = trained
    assert len(logged) == len(tf_run["logged"])
    for ours, theirs in zip(logged, tf_run["logged"]):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6)


def test_variables_after_training_as_tf(tf_run, trained):
    e, _ = trained
    theirs = tf_run["variables"]
    for name in e.get_variable_names():
        if not name.startswith("resnet/") or name.endswith("num_batches_tracked"):
            continue
        tf_name = _tf_name(name)
        np.testing.assert_allclose(_as_tf(tf_name, e.get_variable_value(name)),
                                   np.array(theirs[tf_name]), rtol=1e-4, atol=1e-6,
                                   err_msg=name)
    assert e.get_variable_value("global_step") == theirs["global_step"]


def test_a_rate_in_the_factory_follows_the_schedule_after_a_restart(tf_run, tmp_path):
    """Three steps, then a new Estimator resumes from the checkpoint (which
    holds the last step's rate, 0.1 where this step's is 0.01) on the rest of
    the input: TF's rates and variables."""
    first = est.Estimator(_model_fn(tf_run, True), model_dir=str(tmp_path))
    first.train(_input(tf_run["train"]), steps=3)
    second = est.Estimator(_model_fn(tf_run, True), model_dir=str(tmp_path))
    log = _Log()
    second.train(_input(tf_run["train"][3:]), hooks=[log])
    assert [r["learning_rate"] for r in log.logged] == pytest.approx(
        [r["learning_rate"] for r in tf_run["logged"][3:]])
    test_variables_after_training_as_tf(tf_run, (second, None))


def test_evaluate_and_predict_as_tf(tf_run, trained):
    e, _ = trained
    result = e.evaluate(_input(tf_run["eval"]))
    assert {k: float(v) for k, v in result.items()} == pytest.approx(tf_run["evaluate"],
                                                                     rel=1e-5)
    predicted = next(e.predict(_input(tf_run["eval"][:1]), yield_single_examples=False))
    np.testing.assert_allclose(predicted["probabilities"], tf_run["predict"]["probabilities"],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(predicted["classes"], tf_run["predict"]["classes"])
