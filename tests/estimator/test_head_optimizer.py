"""A head in a custom model_fn given `optimizer=`, `trainable_variables=` and
`regularization_losses=` (the form of TF's own head docstrings) against TF
2.15's (tests/support/fixtures/record_tf_head_optimizer.py): the summaries of
each step, the weights after 4 steps and the evaluation, for three heads and
a MultiHead; and the arguments' errors."""
import json
import os

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import estimator as est
from head_data import LABELS, fixed_layer, rows, v2_labels
from paths import FIXTURES
from tf_recorded import assert_evaluation_is_tfs

with open(os.path.join(FIXTURES, "tf_head_optimizer.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
HEADS = {   # name: (head, logits dimension, labels), as the recorder's
    "binary": (lambda: est.BinaryClassHead(weight_column="w"), 1, 4),
    "multi_class": (lambda: est.MultiClassHead(3, label_vocabulary=LABELS), 3, 3),
    "regression_sum": (lambda: est.RegressionHead(label_dimension=2, loss_reduction="sum"),
                       2, 1),
    "multi_label": (lambda: est.MultiLabelHead(3, name="tags"), 3, "multi_hot"),
    "multi_head": (lambda: est.MultiHead(
        [est.MultiClassHead(3, label_vocabulary=LABELS, name="kind"),
         est.RegressionHead(name="score")]), 4, "multi"),
}


def layer(dim):
    kernel, bias = fixed_layer(dim)
    net = torch.nn.Linear(3, dim)
    with torch.no_grad():
        net.weight.copy_(torch.from_numpy(kernel.T))
        net.bias.copy_(torch.from_numpy(bias))
    return net


def model_fn_of(make_head, dim, **spec_args):
    """The recorder's model_fn: its L2 term is Keras's, l2 * sum(kernel^2)."""
    def model_fn(features, labels, mode):
        net = est.get_module("logits", lambda: layer(dim))
        optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=TF["lr"]))
        args = dict(optimizer=optimizer, trainable_variables=list(net.parameters()),
                    regularization_losses=[TF["l2"] * net.weight.square().sum()])
        args.update(spec_args)
        return make_head().create_estimator_spec(features, mode, net(features["x"]), labels,
                                                 **args)
    return model_fn


def input_fn(data, target):
    return est.inputs.numpy_input_fn(data[0], v2_labels(data, target), 16, 1, False)


def summaries(model_dir):
    acc = EventAccumulator(model_dir, size_guidance={"scalars": 0}).Reload()
    return {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
            if tag.split("/")[0] in ("loss", "regularization_loss")}


def test_every_head_is_recorded():
    assert sorted(HEADS) == sorted(TF["models"])


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_heads_optimizer_and_regularization_train_and_evaluate_as_tfs(name, tmp_path):
    make_head, dim, target = HEADS[name]
    recorded = TF["models"][name]
    estimator = est.Estimator(model_fn_of(make_head, dim), config=est.RunConfig(
        model_dir=str(tmp_path), save_summary_steps=1))
    estimator.train(input_fn(rows(64, 0), target))
    ours = summaries(str(tmp_path))
    assert sorted(ours) == sorted(recorded["summaries"])
    for tag, values in ours.items():
        np.testing.assert_allclose(values, recorded["summaries"][tag], rtol=1e-5, err_msg=tag)
    np.testing.assert_allclose(estimator.get_variable_value("logits/weight").T,
                               recorded["kernel"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(estimator.get_variable_value("logits/bias"), recorded["bias"],
                               rtol=1e-5, atol=1e-6)
    assert_evaluation_is_tfs(estimator.evaluate(input_fn(rows(53, 1), target)),
                             recorded["evaluation"])


def test_train_op_fn_trains_as_the_optimizer_and_predict_needs_neither(tmp_path):
    optimizer = []

    def model_fn(features, labels, mode):
        net = est.get_module("logits", lambda: layer(1))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=TF["lr"]))
        optimizer.append(opt)
        return est.BinaryClassHead(weight_column="w").create_estimator_spec(
            features, mode, net(features["x"]), labels, train_op_fn=lambda loss: opt,
            regularization_losses=[TF["l2"] * net.weight.square().sum()])
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path))
    estimator.train(input_fn(rows(64, 0), 4))
    np.testing.assert_allclose(estimator.get_variable_value("logits/weight").T,
                               TF["models"]["binary"]["kernel"], rtol=1e-5, atol=1e-6)
    predictions = list(estimator.predict(est.inputs.numpy_input_fn(
        {"x": rows(3, 2)[0]["x"]}, None, 3, 1, False)))
    assert len(predictions) == 3 and "logistic" in predictions[0]


@pytest.mark.parametrize("spec_args, error", [
    ({"train_op_fn": lambda loss: None}, "train_op_fn and optimizer cannot both be set."),
    ({"optimizer": None}, "train_op_fn and optimizer cannot both be None."),
    ({"optimizer": "Adagrad"}, r"optimizer must be a torch.optim.Optimizer of the model's "
                               r"scope \(est.get_optimizer\(.*got str"),
    ({"trainable_variables": []}, r"trainable_variables \(0 trainable tensors\) are not the "
                                  r"parameters the optimizer steps \(2\): build it over them"),
    ({"trainable_variables": "logits"}, "trainable_variables must be a list or tuple, given: "
                                        "str"),
    ({"update_ops": [lambda: None]}, "update_ops are not run here: PyTorch layers"),
    ({"update_ops": "ops"}, "update_ops must be a list or tuple, given: str"),
    ({"regularization_losses": [torch.ones(3)]},
     r"regularization_losses\[0\] must be a scalar, got a tensor of shape \[3\]"),
    ({"regularization_losses": ["l2"]},
     r"regularization_losses\[0\] must be a scalar tensor, got str"),
    ({"regularization_losses": torch.tensor(1.0)},
     "regularization_losses must be a list or tuple of scalars, got Tensor"),
])
@pytest.mark.parametrize("name", ["binary", "multi_head"])
def test_bad_arguments_are_tfs_errors_or_named(name, spec_args, error, tmp_path):
    make_head, dim, target = HEADS[name]
    estimator = est.Estimator(model_fn_of(make_head, dim, **spec_args),
                              model_dir=str(tmp_path))
    with pytest.raises(ValueError, match=error):
        estimator.train(input_fn(rows(16, 0), target), steps=1)


def test_empty_arguments_train_as_none_and_a_module_names_its_parameters(tmp_path):
    def model_fn_with(**spec_args):
        def model_fn(features, labels, mode):
            net = est.get_module("logits", lambda: layer(1))
            opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=TF["lr"]))
            args = spec_args or dict(optimizer=opt, trainable_variables=[net], update_ops=[],
                                     regularization_losses=[])
            if spec_args:
                args["train_op_fn"] = lambda loss: opt
            return est.BinaryClassHead(weight_column="w").create_estimator_spec(
                features, mode, net(features["x"]), labels, **args)
        return model_fn
    results = []
    for i, args in enumerate([{}, {"update_ops": None}]):
        estimator = est.Estimator(model_fn_with(**args), model_dir=str(tmp_path / str(i)))
        estimator.train(input_fn(rows(64, 0), 4))
        results.append(estimator.evaluate(input_fn(rows(53, 1), 4)))
    assert "regularization_loss" not in results[0]
    assert results[0] == results[1]
