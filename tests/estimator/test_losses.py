"""TF1's losses (`est.losses`, tf.compat.v1.losses) against TF's own results
(recorded by tests/support/fixtures/record_tf_losses.py): every function,
every reduction, weights of each shape TF broadcasts (zeros among them),
values and gradients; the loss collections a model_fn's calls fill, as TF's
graph collections; and the errors where torch would silently broadcast."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_losses.json"), encoding="utf-8") as _f:
    TF = json.load(_f)


def _arg(value):
    if isinstance(value, str) and value.startswith("@"):
        array = TF["arrays"][value[1:]]
        return torch.tensor(array["values"], dtype=getattr(torch, array["dtype"]))
    return value


def _case_id(case):
    args = case["args"]
    weights = args["weights"]
    shape = "scalar" if not isinstance(weights, (str, list)) else "list" if isinstance(
        weights, list) else "x".join(map(str, np.shape(TF["arrays"][weights[1:]]["values"])))
    extra = [f"{k}={v}" for k, v in args.items()
             if k in ("delta", "epsilon", "label_smoothing") or k == "labels" and
             isinstance(v, str) and TF["arrays"][v[1:]]["dtype"] == "int64"
             and np.ndim(TF["arrays"][v[1:]]["values"]) == 2]
    return "-".join([case["fn"], args.get("reduction", "-"), f"w{shape}"] + extra)


@pytest.mark.parametrize("case", TF["cases"], ids=[_case_id(c) for c in TF["cases"]])
def test_value_and_gradient_are_tfs(case):
    args = {k: _arg(v) for k, v in case["args"].items()}
    wrt = args[case["grad_of"]].requires_grad_(True)
    value = getattr(est.losses, case["fn"])(**args)
    assert value.dtype == torch.float32
    np.testing.assert_allclose(value.detach().numpy(), case["value"], rtol=2e-6, atol=1e-6)
    value.sum().backward()
    np.testing.assert_allclose(wrt.grad.numpy(), case["grad"], rtol=2e-5, atol=1e-6)


def _inputs():
    """The recorded labels and predictions (the first arrays recorded)."""
    return _arg("@0"), _arg("@1")


def test_the_first_arrays_are_the_labels_and_predictions():
    case = next(c for c in TF["cases"] if c["fn"] == "mean_squared_error")
    assert case["args"]["labels"] == "@0" and case["args"]["predictions"] == "@1"


def _recorded_losses():
    """record_collections()'s calls: what a TF1 model_fn adds to its graph."""
    l, p = _inputs()
    mse = est.losses.mean_squared_error(l, p)
    est.losses.absolute_difference(l, p, scope="tower/abs")
    est.losses.absolute_difference(l, p)
    est.losses.absolute_difference(l, p)
    sparse = next(c for c in TF["cases"] if c["fn"] == "sparse_softmax_cross_entropy")
    est.losses.sparse_softmax_cross_entropy(_arg(sparse["args"]["labels"]),
                                            _arg(sparse["args"]["logits"]),
                                            loss_collection=None)
    est.losses.compute_weighted_loss(l.abs())
    return mse


def test_a_model_fns_losses_are_collected_as_tfs_graph_collects_them(tmp_path):
    """tf.losses.* calls, then get_total_loss(), in every step: each model_fn
    call starts with empty collections (a step's losses are not summed with
    the last step's); the totals are TF's."""
    seen = []

    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        mse = _recorded_losses()
        got = {"count": len(est.losses.get_losses()),
               "tower": len(est.losses.get_losses(scope="tower")),
               "regularization_none": float(est.losses.get_regularization_loss())}
        est.losses.add_loss(torch.tensor(0.25), est.losses.GraphKeys.REGULARIZATION_LOSSES)
        got.update(total=float(est.losses.get_total_loss()),
                   without_regularization=float(est.losses.get_total_loss(False)),
                   tower_total=float(est.losses.get_total_loss(False, scope="tower")),
                   regularization=float(est.losses.get_regularization_loss()), mse=float(mse))
        seen.append(got)
        est.losses.mean_squared_error(labels, net(features["x"]))
        return est.EstimatorSpec(mode, loss=est.losses.get_total_loss(), train_op=(
            est.get_optimizer(lambda q: torch.optim.SGD(q, lr=0.01))))

    data = [({"x": np.ones((4, 3), np.float32)}, np.zeros((4, 1), np.float32))] * 3
    est.Estimator(model_fn, model_dir=str(tmp_path)).train(lambda: data, steps=3)
    want = TF["collections"]
    assert len(want["names"]) == 5 and want["tower"] == ["tower/abs/value:0"]
    assert len(seen) == 3
    for got in seen:
        assert got["count"] == len(want["names"]) and got["tower"] == 1
        for key in ("total", "without_regularization", "tower_total", "regularization_none",
                    "regularization", "mse"):
            assert got[key] == pytest.approx(want[key], rel=1e-6), key


def test_names_are_tfs_default_scopes_made_unique():
    """The names get_losses filters by: a loss's `scope`, else TF's default
    name, made unique in the call as TF's name scopes are."""
    want = [n.split("/value")[0] for n in TF["collections"]["names"]]
    assert want == ["mean_squared_error", "tower/abs", "absolute_difference",
                    "absolute_difference_1", "weighted_loss"]
    got = []

    def model_fn(features, labels, mode):
        _recorded_losses()
        for prefix in want:
            got.append(len(est.losses.get_losses(scope=prefix + "$")))
        raise _Done()

    with pytest.raises(_Done):
        est.Estimator(model_fn).train(lambda: [({"x": np.ones((1, 1))}, np.ones(1))], steps=1)
    assert got == [1] * 5


class _Done(Exception):
    pass


def test_outside_a_model_fn_the_losses_compute_and_collect_nothing():
    l, p = _inputs()
    assert float(est.losses.mean_squared_error(l, p)) == pytest.approx(
        TF["collections"]["mse"], rel=1e-6)
    assert est.losses.get_losses() == []
    with pytest.raises(ValueError, match="no losses were added in this model_fn call"):
        est.losses.get_total_loss()
    assert float(est.losses.get_regularization_loss()) == 0.0


def test_dtypes_torch_tensors_keep_theirs_numpy_float64_becomes_float32():
    l, p = _inputs()
    assert est.losses.mean_squared_error(l.double(), p.double()).dtype == torch.float64
    assert est.losses.mean_squared_error(l.numpy().astype(np.float64),
                                         p.numpy().astype(np.float64)).dtype == torch.float32
    assert est.losses.absolute_difference(np.array([1, 0]), torch.tensor([0.5, 0.5])).dtype \
        == torch.float32


@pytest.mark.parametrize("call, error", [
    (lambda: est.losses.mean_squared_error(torch.ones(4, 1), torch.ones(4)),
     r"predictions of shape \(4,\) and labels of shape \(4, 1\) are incompatible"),
    (lambda: est.losses.sigmoid_cross_entropy(torch.ones(4), torch.ones(4, 1)),
     r"logits of shape \(4, 1\) and multi_class_labels of shape \(4,\) are incompatible"),
    (lambda: est.losses.mean_squared_error(torch.ones(4, 1), torch.ones(4, 1),
                                           weights=torch.ones(4)),
     r"weights of shape \(4,\), values of shape \(4, 1\)"),
    (lambda: est.losses.mean_squared_error(torch.ones(4, 2), torch.ones(4, 2),
                                           weights=torch.ones(2)),
     r"weights of shape \(2,\), values of shape \(4, 2\)"),
    (lambda: est.losses.softmax_cross_entropy(torch.eye(3)[:2], torch.zeros(2, 3),
                                              weights=torch.ones(2, 1)),
     r"weights of shape \(2, 1\), values of shape \(2,\)"),
    (lambda: est.losses.mean_pairwise_squared_error(torch.ones(4, 2), torch.ones(4, 2),
                                                    weights=torch.ones(4)),
     r"weights of shape \(4,\), values of shape \(4, 2\)"),
    (lambda: est.losses.sparse_softmax_cross_entropy(torch.tensor([0, 3]), torch.zeros(2, 3)),
     r"out of bounds"),
    (lambda: est.losses.sparse_softmax_cross_entropy(torch.tensor([0, -100]),
                                                     torch.zeros(2, 3)),
     r"out of bounds"),
    (lambda: est.losses.sparse_softmax_cross_entropy(torch.tensor([0.0, 1.0]),
                                                     torch.zeros(2, 3)),
     r"labels must be integer class ids, got torch.float32"),
    (lambda: est.losses.sparse_softmax_cross_entropy(torch.tensor([0, 1, 2]),
                                                     torch.zeros(2, 3)),
     r"labels of shape \(3,\) do not match logits of shape \(2, 3\)"),
    (lambda: est.losses.cosine_distance(torch.ones(2, 3), torch.ones(2, 3)),
     r"You must specify argument `axis`"),
    (lambda: est.losses.mean_squared_error(None, torch.ones(3)),
     r"Argument `labels` must not be None"),
    (lambda: est.losses.compute_weighted_loss(torch.ones(3), reduction="bad"),
     r"Invalid Reduction Key 'bad'"),
])
def test_what_tf_refuses_is_an_error_naming_it(call, error):
    """TF's errors (torch would broadcast (4, 1) against (4,) into (4, 4), and
    pass over a label of -100 silently)."""
    with pytest.raises((ValueError, IndexError, RuntimeError), match=error):
        call()
