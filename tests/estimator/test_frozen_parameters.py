"""Frozen parameters (`requires_grad` False) and `get_optimizer`, as torch's
optimizers take them: `torch.optim.Adam(net.parameters())` holds a frozen
parameter and steps it once it has a gradient again (gradual unfreezing).
An optimizer here was built over the parameters trainable at its first step
only: a layer unfrozen later never trained, without a word."""
import numpy as np
import pytest
import torch

import estimator as est

STEPS = 20


def _data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g))
            for _ in range(STEPS)]


DATA = _data()
FROZEN = {"unfreeze_later": lambda step: step < 5,          # a backbone unfrozen at step 5
          "freeze_window": lambda step: 5 <= step < 15,
          "always": lambda step: True}


def _net():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _frozen_net():
    net = _net()
    net[0].requires_grad_(False)
    return net


def model_fn(features, labels, mode, params):
    net = est.get_module("net", _frozen_net if params.get("in_factory") else _net)
    for p in net[0].parameters():
        p.requires_grad_(not FROZEN[params["frozen"]](est.get_global_step()))
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.05),
                            var_list=net[2] if params.get("head_only") else None)
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def _plain(frozen):
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for step, (x, y) in enumerate(DATA):
        for p in net[0].parameters():
            p.requires_grad_(not FROZEN[frozen](step))
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return {f"net/{k.replace('.', '/')}": v.numpy() for k, v in net.state_dict().items()}


def _train(model_dir, frozen, batches, **params):
    e = est.Estimator(model_fn, model_dir=str(model_dir), params=dict(params, frozen=frozen))
    e.train(lambda: [({"x": x}, y) for x, y in batches])
    return e


def _assert_equal(e, expected):
    for name, value in expected.items():
        np.testing.assert_allclose(e.get_variable_value(name), value, rtol=0, atol=1e-7,
                                   err_msg=name)


@pytest.mark.parametrize("frozen", ["unfreeze_later", "freeze_window"])
def test_a_layer_unfrozen_later_trains_as_in_torch(tmp_path, frozen):
    expected = _plain(frozen)
    _assert_equal(_train(tmp_path / "one", frozen, DATA), expected)
    _train(tmp_path / "resumed", frozen, DATA[:10])     # resumed at step 10: in the
    _assert_equal(_train(tmp_path / "resumed", frozen, DATA[10:]), expected)   # window too


def test_an_earlier_versions_optimizer_without_its_frozen_parameters_resumes(tmp_path):
    """Such a checkpoint's optimizer is over the trainable parameters only
    (here made so by var_list): it resumes, the frozen ones without state."""
    _train(tmp_path, "always", DATA[:10], head_only=True)
    _assert_equal(_train(tmp_path, "always", DATA[10:]), _plain("always"))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_layer_unfrozen_later_under_mirrored_strategy_is_refused(tmp_path):
    """DDP averages the gradients of the parameters trainable when it wraps
    the module: one unfrozen later would step on each replica's own gradient
    and the replicas drift apart. A layer frozen throughout trains."""
    import distribute

    def run(model_dir, frozen, in_factory=True):
        strategy = distribute.MirroredStrategy(
            ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
                timeout_seconds=30))
        e = est.Estimator(model_fn, params={"frozen": frozen, "in_factory": in_factory},
                          config=est.RunConfig(model_dir=str(model_dir),
                                               train_distribute=strategy))
        e.train(lambda: [({"x": x}, y) for x, y in DATA])   # 10 steps of 2 batches
        return e
    assert run(tmp_path / "always", "always").get_variable_value("global_step") == 10
    with pytest.raises(Exception, match=r"net/0/weight, net/0/bias has a gradient, but was "
                                        r"frozen \(requires_grad False\) when its module"):
        run(tmp_path / "unfrozen", "unfreeze_later")
    # frozen after the module was made: DDP's "Expected to have finished reduction"
    # at the next step, said at the first
    with pytest.raises(Exception, match=r"module 'net': its parameters 0.weight, 0.bias were "
                                        r"frozen \(requires_grad False\) after the module"):
        run(tmp_path / "frozen_since", "always", in_factory=False)
