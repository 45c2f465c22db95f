"""The Strategy API on one device: default and OneDeviceStrategy."""
import numpy as np
import pytest
import torch

import distribute
import estimator as est
from models import regression_input_fn, regression_model_fn


def test_default_strategy_and_scope():
    default = distribute.get_strategy()
    assert not distribute.has_strategy() and default.num_replicas_in_sync == 1
    one = distribute.OneDeviceStrategy("cpu")
    with one.scope():
        assert distribute.get_strategy() is one and distribute.has_strategy()
        assert distribute.in_cross_replica_context()
        assert one.run(lambda: distribute.get_replica_context().replica_id_in_sync_group) == 0
    assert distribute.get_strategy() is default
    assert distribute.get_replica_context() is not None


def test_run_reduce_and_local_results():
    s = distribute.OneDeviceStrategy("cpu")
    v = s.run(lambda x: x * 2, args=(torch.arange(4.0),))
    assert torch.equal(s.reduce(distribute.ReduceOp.SUM, v, axis=None), v)
    assert s.reduce("SUM", v, axis=0).item() == 12.0
    assert s.reduce(distribute.ReduceOp.MEAN, v, axis=0).item() == 3.0
    assert s.experimental_local_results(v) == (v,)
    ctx = s.run(lambda: distribute.get_replica_context())
    assert torch.equal(ctx.all_reduce("SUM", v), v)


def test_distribute_datasets_convert_numpy_and_move():
    s = distribute.OneDeviceStrategy("cpu")
    out = list(s.experimental_distribute_dataset([(np.ones((2, 3), np.float32), np.zeros(2))]))
    assert isinstance(out[0][0], torch.Tensor) and out[0][0].shape == (2, 3)
    got = list(s.distribute_datasets_from_function(
        lambda ctx: [{"p": np.array([ctx.input_pipeline_id])}]))
    assert got[0]["p"].tolist() == [0]


def test_batches_already_on_the_device_pass_untouched_others_are_converted():
    move = distribute.OneDeviceStrategy("cpu").extended.to_device
    x, y = torch.ones(2, 3), torch.zeros(2)
    ready = ({"x": x}, y)
    assert move(ready) is ready                      # nothing allocated per step
    mixed = move(({"x": x, "n": np.ones(2)}, np.arange(2)))
    assert mixed[0]["x"] is x and isinstance(mixed[0]["n"], torch.Tensor)
    assert isinstance(mixed[1], torch.Tensor) and mixed[1].tolist() == [0, 1]
    nested = move(([x, {"deep": np.zeros(1)}], 3))
    assert isinstance(nested[0][1]["deep"], torch.Tensor) and nested[1] == 3
    meta = torch.ones(2, device="meta")              # a tensor elsewhere is moved
    with pytest.raises(NotImplementedError):
        move((meta, y))


def test_input_context_batch_size():
    ctx = distribute.InputContext(2, 1, 4)
    assert ctx.get_per_replica_batch_size(64) == 16
    with pytest.raises(ValueError, match="not divisible"):
        ctx.get_per_replica_batch_size(30)


def test_estimator_under_one_device_strategy(tmp_path):
    config = est.RunConfig(model_dir=str(tmp_path), train_distribute=distribute.OneDeviceStrategy(
        "cpu"), eval_distribute=distribute.OneDeviceStrategy("cpu"))
    e = est.Estimator(regression_model_fn, config=config, params={"lr": 0.1})
    e.train(regression_input_fn(), steps=50)
    assert e.evaluate(regression_input_fn(repeat=False))["global_step"] == 50


def test_set_strategy():
    s = distribute.OneDeviceStrategy("cpu")
    distribute.experimental_set_strategy(s)
    try:
        assert distribute.get_strategy() is s
    finally:
        distribute.experimental_set_strategy(None)
    assert not distribute.has_strategy()


def test_steps_hold_no_gradients_and_a_stale_one_does_not_leak(tmp_path):
    """Gradients are freed after each step (the next forward reuses their
    memory); one left on a parameter before training is not applied."""
    stale = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.ones_(stale.weight)
    stale.weight.grad = torch.full_like(stale.weight, 100.0)

    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: stale)
        loss = ((net(features) - labels) ** 2).mean()
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)

    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(lambda: [(torch.ones(1, 1), torch.zeros(1, 1))], steps=1)
    # d/dw (w - 0)^2 = 2w = 2 at w = 1: w = 1 - 0.1 * 2
    assert e.get_variable_value("net/weight").item() == pytest.approx(0.8)
    assert stale.weight.grad is None


class _CountingSGD(torch.optim.SGD):
    """An optimizer with a zero_grad of its own (one keeping count, as one
    keeping accumulators of its own would do its work there)."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.zeroed = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zeroed.append(set_to_none)
        super().zero_grad(set_to_none)


@pytest.mark.parametrize("kind", ["torch's", "its own", "patched on the instance"])
def test_each_step_frees_the_gradients_through_an_optimizers_own_zero_grad(tmp_path, kind):
    """torch's zero_grad(set_to_none=True) is done without calling it (its
    profiler record costs more than the rest of a small model's step), with
    the same result: every gradient None after each step, the weights a plain
    loop's; an optimizer whose class or instance has a zero_grad of its own
    has it called when built and after each step."""
    import copy
    torch.manual_seed(0)
    initial = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(),
                                  torch.nn.Linear(4, 1))
    made, patched = [], []

    def optimizer(params):
        opt = (_CountingSGD if kind == "its own" else torch.optim.SGD)(
            params, lr=0.1, momentum=0.9)
        if kind == "patched on the instance":
            opt.zero_grad = lambda set_to_none=True: (
                patched.append(set_to_none), torch.optim.SGD.zero_grad(opt, set_to_none))
        made.append(opt)
        return opt

    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: copy.deepcopy(initial))
        loss = torch.nn.functional.mse_loss(net(features), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(optimizer))

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g))
               for n in (8, 8, 5)]
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(lambda: batches, steps=3)
    [opt] = made
    assert all(p.grad is None for group in opt.param_groups for p in group["params"])
    own = {"torch's": [], "its own": getattr(opt, "zeroed", None),
           "patched on the instance": patched}
    assert own[kind] == ([] if kind == "torch's" else [True] * 4)   # built, then each step
    plain = copy.deepcopy(initial)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        plain_opt.zero_grad()
        torch.nn.functional.mse_loss(plain(x), y).backward()
        plain_opt.step()
    for name, value in plain.state_dict().items():
        assert torch.equal(torch.as_tensor(e.get_variable_value("net/" + name.replace(".", "/"))),
                           value), name
