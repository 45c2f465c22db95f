"""est.layers.BatchNormalization: TF1's batch normalization on [batch, ...,
units] (its non-fused layer: the biased batch variance moves the moving
variance), and torch's BatchNorm2d as TF's fused layer on convolutions.
Recorded from TF 2.15 by tests/support/fixtures/record_tf_layers_batch_norm.py."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_layers_batch_norm.json"), encoding="utf-8") as _f:
    TF = json.load(_f)["cases"]


def _run(layer, case, to_torch=lambda t: t, from_torch=lambda t: t):
    layer.train()
    for batch in case["batches"]:
        trained = layer(to_torch(torch.tensor(batch)))
    layer.eval()
    inferred = layer(to_torch(torch.tensor(case["batches"][-1])))
    np.testing.assert_allclose(from_torch(trained).detach().numpy(), case["trained"],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(from_torch(inferred).detach().numpy(), case["inferred"],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["2d", "3d", "4d_fused", "5d_fused"])
def test_batch_normalization_is_tfs_layer(name):
    """TF's non-fused layer on 2 and 3 dimensions (the biased variance moves
    the moving one), its fused layer (the unbiased) on 4 and 5, as TF picks."""
    case = TF[name]
    layer = est.layers.BatchNormalization(len(case["gamma"]), momentum=0.9, epsilon=1e-3)
    with torch.no_grad():
        layer.gamma.copy_(torch.tensor(case["gamma"]))
        layer.beta.copy_(torch.tensor(case["beta"]))
    _run(layer, case)
    for key in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(getattr(layer, key).numpy(), case["moving"][key], rtol=1e-5)
    # torch's BatchNorm1d moves its variance towards the unbiased batch variance
    torch_bn = torch.nn.BatchNorm1d(len(case["gamma"]), momentum=0.1, eps=1e-3)
    for batch in case["batches"]:
        torch_bn(torch.tensor(batch).reshape(-1, len(case["gamma"])))
    assert np.allclose(torch_bn.running_var.numpy(), case["moving"]["moving_variance"],
                       rtol=1e-5) == name.endswith("fused")


def test_float64_inputs_train_float32_statistics():
    """TF's float32 layer on float64 input: it raised in lerp_ (float and double)."""
    layer = est.layers.BatchNormalization(3)
    out = layer(torch.randn(4, 3, dtype=torch.float64))
    assert out.dtype == torch.float64 and layer.moving_variance.dtype == torch.float32
    assert layer.moving_variance.ne(1).all()


def test_tfs_fused_layer_on_convolutions_is_torchs_batch_norm_2d():
    case = TF["4d_fused"]
    layer = torch.nn.BatchNorm2d(len(case["gamma"]), momentum=0.1, eps=1e-3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(case["gamma"]))
        layer.bias.copy_(torch.tensor(case["beta"]))
    _run(layer, case, lambda t: t.permute(0, 3, 1, 2), lambda t: t.permute(0, 2, 3, 1))
    np.testing.assert_allclose(layer.running_var.numpy(), case["moving"]["moving_variance"],
                               rtol=1e-5)


def test_a_wrong_size_is_said():
    with pytest.raises(ValueError, match=r"BatchNormalization\(3\): the input's last axis is 4"):
        est.layers.BatchNormalization(3)(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="units must be a positive int"):
        est.layers.BatchNormalization(0)
