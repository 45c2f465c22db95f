"""est.optimizers against TF1's optimizers: the same five gradients applied to
the same float32 [3, 2] variable give TF's values after every step, and TF's
slots after the last (recorded from TensorFlow 2.15 by
``tests/support/fixtures/record_tf_optimizers.py`` into ``tf_optimizers.json``)."""
import io
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from estimator.optimizers import (OPTIMIZER_NAMES, Adam, Ftrl, ProximalAdagrad,
                                  ProximalGradientDescent, RMSProp, optimizer_factory)
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_optimizers.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
CASES = {c["name"]: c for c in TF["cases"]}
BY_NAME = {c["name"]: c for c in TF["by_name"]}

# Relative tolerance per TF1 name. Rounding errors scale with the operands of
# w_new = w_old - update and carry over to later steps, so each value is held
# relative to the largest |value| its element has had so far (TF's, from the
# initial one): a value that cancels to ~0 (0.05 - 0.0499999) is not held to
# 1e-6 of itself. Slots are held relative to themselves; Adam's `v` to 2e-5,
# since TF1 computes 1 - beta2 from float32(0.999) (0.00099998713, not 0.001).
RTOL = {"Adagrad": 1e-6, "Adam": 1e-6, "Ftrl": 1e-6, "RMSProp": 1e-6, "SGD": 1e-6,
        "ProximalAdagrad": 1e-6, "ProximalGradientDescent": 1e-6, "TF1 Adam": 1e-6}
SLOT_RTOL = {"Adam": 2e-5}
# TF slot -> torch state key, for torch's own optimizers
TORCH_SLOTS = {"Adagrad": {"accumulator": "sum"}}


def _steps(make, gradients=TF["gradients"], w=None):
    """Applies `gradients` to a parameter (TF's initial value unless `w`) with
    optimizer `make([w])`; returns the values after each step, w, optimizer."""
    w = torch.nn.Parameter(torch.tensor(TF["initial"])) if w is None else w
    opt = make([w])
    values = []
    for g in gradients:
        w.grad = torch.tensor(g)
        opt.step()
        values.append(w.detach().clone().numpy())
    return values, w, opt


def _check(values, opt, w, recorded, name, slot_keys=None):
    rtol = RTOL[name]
    expected = np.array(recorded["values"], np.float32)
    trajectory = np.abs(np.concatenate([np.array([TF["initial"]], np.float32), expected]))
    assert len(values) == len(expected) == 5
    for step, ours in enumerate(values):
        scale = trajectory[:step + 2].max(axis=0)
        error = np.abs(ours - expected[step])
        assert (error <= rtol * scale).all(), (
            f"step {step + 1}: ours {ours.tolist()} TF {expected[step].tolist()}, "
            f"max relative error {(error / scale).max():.3g} > {rtol}")
    slot_keys = slot_keys or {slot: slot for slot in recorded["slots"]}
    assert set(opt.state[w]) >= set(slot_keys.values())
    for slot, key in slot_keys.items():
        np.testing.assert_allclose(opt.state[w][key].numpy(),
                                   np.array(recorded["slots"][slot]["value"], np.float32),
                                   rtol=SLOT_RTOL.get(name, rtol), atol=0,
                                   err_msg=f"slot {slot}")


def test_fixture_covers_the_settings():
    assert TF["tensorflow_version"].startswith("2.15")
    assert np.array(TF["initial"]).shape == (3, 2)
    assert np.array(TF["gradients"]).shape == (5, 3, 2)
    kwargs = [c["kwargs"] for c in TF["cases"]]
    for key in ("l1_regularization_strength", "l2_regularization_strength",
                "l2_shrinkage_regularization_strength", "learning_rate_power",
                "initial_accumulator_value", "beta", "momentum", "centered", "decay"):
        assert any(key in k for k in kwargs), key
    assert sorted(BY_NAME) == sorted(OPTIMIZER_NAMES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_ftrl_rmsprop_and_proximal_equal_tf1(case):
    recorded = CASES[case]
    cls = {"tf.compat.v1.train.FtrlOptimizer": Ftrl,
           "tf.compat.v1.train.RMSPropOptimizer": RMSProp,
           "tf.compat.v1.train.AdamOptimizer": Adam,
           "tf.compat.v1.train.ProximalAdagradOptimizer": ProximalAdagrad,
           "tf.compat.v1.train.ProximalGradientDescentOptimizer": ProximalGradientDescent,
           }[recorded["tf"]]
    values, w, opt = _steps(lambda p: cls(p, **recorded["kwargs"]))
    _check(values, opt, w, recorded, "TF1 Adam" if cls is Adam else cls.__name__)


@pytest.mark.parametrize("case", ["adam_epsilon_1", "adam_betas_epsilon"])
def test_torchs_adam_is_not_tf1s_with_a_large_epsilon(case):
    """Why est.optimizers.Adam: torch.optim.Adam with TF1's arguments misses
    TF1's steps by far more than rounding once epsilon is large (TF1 adds it
    before the bias correction)."""
    recorded = CASES[case]
    kwargs = recorded["kwargs"]
    betas = (kwargs.get("beta1", 0.9), kwargs.get("beta2", 0.999))
    values, _, _ = _steps(lambda p: torch.optim.Adam(p, lr=kwargs["learning_rate"], betas=betas,
                                                     eps=kwargs["epsilon"]))
    error = np.abs(np.array(values) - np.array(recorded["values"], np.float32)).max()
    assert error > 1e-3


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_named_optimizers_equal_tf1(name):
    """By name at learning rate 0.05, as a canned estimator builds them (TF:
    get_optimizer_instance). Adam is TF1's rule (it was torch's Adam, within
    1e-5 here but 6% of an embedding's weights a step in the NCF port)."""
    recorded = BY_NAME[name]
    values, w, opt = _steps(optimizer_factory(name, TF["learning_rate_by_name"]))
    _check(values, opt, w, recorded, name, TORCH_SLOTS.get(name))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", ["ftrl_shrinkage_l1_l2", "ftrl_accum_0", "ftrl_beta",
                                  "ftrl_power_0.7", "rmsprop_centered_momentum"])
def test_on_cuda_without_host_sync(case):
    """On a GPU the steps never wait on the device (sync debug mode 'error') and
    still give TF's values (1e-5: CUDA divides by a scalar as a reciprocal
    multiply, and its sqrt/pow round differently from the CPU)."""
    recorded = CASES[case]
    cls = Ftrl if case.startswith("ftrl") else RMSProp
    w = torch.nn.Parameter(torch.tensor(TF["initial"], device="cuda"))
    opt = cls([w], **recorded["kwargs"])
    gradients = torch.tensor(TF["gradients"], device="cuda")
    values = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for g in gradients:
            w.grad = g.clone()
            opt.step()
            values.append(w.detach().clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = np.array(recorded["values"], np.float32)
    scale = np.abs(np.concatenate([np.array([TF["initial"]], np.float32), expected])).max(0)
    for step, ours in enumerate(values):
        error = np.abs(ours.cpu().numpy() - expected[step])
        assert (error <= 1e-5 * scale).all(), (step + 1, error.max())


def test_slots_are_named_as_tf_says():
    assert {k: v["variable"] for k, v in CASES["ftrl_defaults"]["slots"].items()} == {
        "accum": "w/Ftrl", "linear": "w/Ftrl_1"}
    assert {k: v["variable"] for k, v in CASES["rmsprop_centered"]["slots"].items()} == {
        "rms": "w/RMSProp", "mg": "w/RMSProp_1", "momentum": "w/RMSProp_2"}
    assert {k: v["variable"] for k, v in CASES["adam"]["slots"].items()} == {
        "m": "w/Adam", "v": "w/Adam_1"}
    assert "Ftrl" in Ftrl.__doc__ and "Ftrl_1" in Ftrl.__doc__


@pytest.mark.parametrize("make", [
    lambda p: Ftrl(p, learning_rate=0.1, l1_regularization_strength=0.01,
                   l2_shrinkage_regularization_strength=0.1),
    lambda p: RMSProp(p, learning_rate=0.01, momentum=0.9, centered=True),
    optimizer_factory("Adagrad", 0.05),
    lambda p: ProximalAdagrad(p, learning_rate=0.1, l1_regularization_strength=0.05),
    lambda p: Adam(p, learning_rate=0.1, epsilon=1.0),
], ids=["ftrl", "rmsprop", "adagrad", "proximal_adagrad", "adam"])
def test_state_dict_round_trip_continues_identically(make):
    """Two steps; the state saved (torch.save), loaded into a fresh optimizer on
    a fresh parameter; three more steps: bit-identical to five in one go."""
    gradients = TF["gradients"]
    full, _, _ = _steps(make)
    _, w, opt = _steps(make, gradients[:2])
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = make([w2])
    opt2.load_state_dict(state)
    rest, _, _ = _steps(lambda p: opt2, gradients[2:], w=w2)
    for ours, expected in zip(rest, full[2:]):
        np.testing.assert_array_equal(ours, expected)
    assert set(opt2.state[w2]) == set(opt.state[w])


@pytest.mark.parametrize("make", [lambda p: Ftrl(p, learning_rate=0.1),
                                  lambda p: RMSProp(p, learning_rate=0.1),
                                  lambda p: ProximalAdagrad(p, learning_rate=0.1,
                                                            l1_regularization_strength=0.1),
                                  lambda p: ProximalGradientDescent(
                                      p, learning_rate=0.1, l2_regularization_strength=0.1),
                                  lambda p: Adam(p, learning_rate=0.1)],
                         ids=["ftrl", "rmsprop", "proximal_adagrad", "proximal_sgd", "adam"])
def test_parameter_without_gradient_is_untouched(make):
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2))
    opt = make([a, b])
    a.grad = torch.ones(2)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(2)) and not torch.equal(a.detach(), torch.ones(2))
    assert b not in opt.state and b.grad is None


@pytest.mark.parametrize("case", [c["name"] for c in TF["sparse"]])
def test_ftrl_with_sparse_gradients_equals_tfs_sparse_apply(case):
    """An `nn.Embedding(sparse=True)` table: the rows of each batch alone
    updated, a repeated id's gradients summed first, as TF's SparseApplyFtrl
    of an `embedding_lookup`'s gradient. (Ftrl refused sparse gradients, and
    a dense table's gradient recomputes every row, as TF's dense ApplyFtrl: a
    row no batch had lost its initial value at the first step, and with
    l2_shrinkage every absent row shrank at every step.)"""
    recorded = next(c for c in TF["sparse"] if c["name"] == case)
    table = torch.nn.Embedding(5, 2, sparse=True)
    with torch.no_grad():
        table.weight.copy_(torch.tensor(TF["sparse_initial"]))
    opt = Ftrl(table.parameters(), **recorded["kwargs"])
    for step, ((ids, rows), expected) in enumerate(zip(TF["sparse_steps"], recorded["values"])):
        opt.zero_grad()
        (table(torch.tensor(ids)) * torch.tensor(rows)).sum().backward()
        opt.step()
        np.testing.assert_allclose(table.weight.detach().numpy(),
                                   np.array(expected, np.float32), rtol=1e-6, atol=1e-7,
                                   err_msg=f"step {step + 1}")
    assert torch.equal(table.weight[4], torch.tensor(TF["sparse_initial"][4]))   # in no batch


@pytest.mark.parametrize("cls", [Ftrl, RMSProp, est.optimizers.ProximalAdagrad,
                                 est.optimizers.ProximalGradientDescent])
def test_a_sparse_gradient_updates_its_entries_alone(cls):
    """(each took dense gradients only; TF's sparse applies update the rows given)"""
    kwargs = {"l2_regularization_strength": 0.5} if "Proximal" in cls.__name__ else {}
    w, v = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    sparse, dense = cls([w], learning_rate=0.1, **kwargs), cls([v], learning_rate=0.1, **kwargs)
    w.grad = torch.sparse_coo_tensor([[0, 2, 0]], [1.0, 2.0, 0.5], (3,), check_invariants=True)
    v.grad = torch.tensor([1.5, 0.0, 2.0])
    sparse.step()
    dense.step()
    assert w[1].item() == 1.0 and (w[0].item(), w[2].item()) == (v[0].item(), v[2].item())


def test_step_returns_the_closures_loss():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = Ftrl([w], learning_rate=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss
    assert opt.step(closure).item() == 5.0 and w.grad is not None


@pytest.mark.parametrize("cls", [Ftrl, RMSProp, ProximalAdagrad, ProximalGradientDescent, Adam])
def test_the_param_groups_lr_is_used(cls):
    """A scheduler changes group["lr"]: the next step uses it (RMSProp without
    momentum and the proximal ones without L1 or L2: a step three times as long)."""
    _, a, opt_a = _steps(lambda p: cls(p, learning_rate=0.1), TF["gradients"][:1])
    _, b, opt_b = _steps(lambda p: cls(p, learning_rate=0.1), TF["gradients"][:1])
    before = a.detach().clone()
    opt_b.param_groups[0]["lr"] = 0.3
    for w, opt in ((a, opt_a), (b, opt_b)):
        w.grad = torch.tensor(TF["gradients"][1])
        opt.step()
    assert not torch.equal(a, b)
    if cls is not Ftrl:   # (Adam: alpha is lr times the bias corrections)
        torch.testing.assert_close(before - b.detach(), 3 * (before - a.detach()))


def test_factories_by_name():
    p = [torch.nn.Parameter(torch.zeros(1))]
    for name, cls in [("Adagrad", torch.optim.Adagrad), ("Adam", est.optimizers.Adam),
                      ("Ftrl", Ftrl), ("RMSProp", RMSProp), ("SGD", torch.optim.SGD)]:
        opt = optimizer_factory(name, 0.3)(p)
        assert type(opt) is cls and opt.param_groups[0]["lr"] == 0.3, name
    adagrad = optimizer_factory("Adagrad", 0.3)(p).defaults
    assert adagrad["initial_accumulator_value"] == 0.1 and adagrad["eps"] == 0.0
    adam = optimizer_factory("Adam", 0.3)(p).defaults
    assert adam == dict(lr=0.3, beta1=0.9, beta2=0.999, epsilon=1e-8)
    ftrl = optimizer_factory("Ftrl", 0.3)(p).defaults
    assert ftrl == dict(lr=0.3, learning_rate_power=-0.5, initial_accumulator_value=0.1,
                        l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                        l2_shrinkage_regularization_strength=0.0, beta=0.0)
    rms = optimizer_factory("RMSProp", 0.3)(p).defaults
    assert rms == dict(lr=0.3, decay=0.9, momentum=0.0, epsilon=1e-10, centered=False)
    factory = lambda params: torch.optim.SGD(params, lr=1.0)  # noqa: E731
    assert optimizer_factory(factory, 0.3) is factory
    assert est.optimizers.optimizer_factory is optimizer_factory and "optimizers" in est.__all__


@pytest.mark.parametrize("value, error, match", [
    ("Adagard", ValueError, r"Unsupported optimizer name: 'Adagard'.*; did you mean 'Adagrad'\?$"),
    ("rmsprop", ValueError, r"did you mean 'RMSProp'\?"),
    ("sgd", ValueError, r"did you mean 'SGD'\?"),
    ("lbfgs", ValueError,
     r"'lbfgs'. Supported names are: \('Adagrad', 'Adam', 'Ftrl', 'RMSProp', 'SGD'\)$"),
    (3, TypeError, r"must be one of \('Adagrad', .*got 3"),
    (None, TypeError, r"must be one of .*got None"),
])
def test_bad_optimizer_names(value, error, match):
    with pytest.raises(error, match=match):
        optimizer_factory(value, 0.1)


def test_a_name_needs_a_learning_rate():
    with pytest.raises(ValueError, match="learning_rate must be specified"):
        optimizer_factory("Adam", None)


def test_an_optimizer_instance_is_refused_with_the_reason():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(TypeError, match=r"\('Adagrad'.*not an optimizer instance"):
        optimizer_factory(opt, 0.1)


@pytest.mark.parametrize("kwargs, message", [
    ({"learning_rate_power": 0.5}, "learning_rate_power 0.500000 needs to be negative or zero"),
    ({"initial_accumulator_value": -1.0},
     "initial_accumulator_value -1.000000 needs to be positive or zero"),
    ({"l1_regularization_strength": -0.1},
     "l1_regularization_strength -0.100000 needs to be positive or zero"),
    ({"l2_regularization_strength": -0.1},
     "l2_regularization_strength -0.100000 needs to be positive or zero"),
    ({"l2_shrinkage_regularization_strength": -0.1},
     "l2_shrinkage_regularization_strength -0.100000 needs to be positive or zero"),
    ({"learning_rate": 0.0}, "learning_rate must be positive, got 0.0"),
])
def test_ftrl_arguments_checked_with_tf_messages(kwargs, message):
    kwargs = {"learning_rate": 0.1, **kwargs}
    with pytest.raises(ValueError) as info:
        Ftrl([torch.nn.Parameter(torch.zeros(1))], **kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("make", [
    lambda p: est.optimizers.Adam(p, 0.0), lambda p: est.optimizers.RMSProp(p, 0.0),
    lambda p: est.optimizers.ProximalGradientDescent(p, 0.0)])
def test_a_zero_learning_rate_trains_as_tf1s(make):
    """A warmup's first rate is 0.0 (official/r1 transformer's), which TF1's
    Adam, RMSProp and ProximalGradientDescent take (these refused it:
    "learning_rate must be positive"); the step moves nothing, as TF's
    (TF's Ftrl makes NaNs of it, its ProximalAdagrad fails: refused here)."""
    param = torch.nn.Parameter(torch.ones(2))
    opt = make([param])
    (param * torch.tensor([1.0, -2.0])).sum().backward()
    opt.step()
    assert param.tolist() == [1.0, 1.0]


def test_ftrl_allows_what_tf1_allows():
    """Zero initial accumulator and zero learning_rate_power are legal in TF1;
    beta=None is TF1's default."""
    opt = Ftrl([torch.nn.Parameter(torch.zeros(1))], 0.1, 0.0, 0.0, beta=None)
    assert opt.defaults["beta"] == 0.0


@pytest.mark.parametrize("kwargs, match", [
    ({"decay": 1.5}, "decay must be in"), ({"momentum": -0.1}, "momentum must be"),
    ({"epsilon": -1.0}, "epsilon must be"), ({"learning_rate": -0.1}, "must be positive"),
])
def test_rmsprop_arguments_checked(kwargs, match):
    kwargs = {"learning_rate": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        RMSProp([torch.nn.Parameter(torch.zeros(1))], **kwargs)


@pytest.mark.parametrize("cls", [Ftrl, RMSProp, ProximalAdagrad, ProximalGradientDescent, Adam])
def test_rebuilt_from_defaults_as_a_parameter_server_does(cls):
    """A ps builds the trainers' optimizer as cls(param_groups, **defaults)."""
    opt = cls([torch.nn.Parameter(torch.zeros(2))], learning_rate=0.3)
    again = cls([torch.nn.Parameter(torch.zeros(2))], **opt.defaults)
    assert again.defaults == opt.defaults
    if cls is Adam:   # TF1's default learning rate
        assert cls([torch.nn.Parameter(torch.zeros(2))]).defaults["lr"] == 0.001
        return
    with pytest.raises(TypeError, match="needs learning_rate"):
        cls([torch.nn.Parameter(torch.zeros(2))])


@pytest.mark.parametrize("kwargs, match", [
    ({"beta1": 1.0}, r"beta1 must be in \[0, 1\), got 1.0"),
    ({"beta2": -0.1}, r"beta2 must be in \[0, 1\), got -0.1"),
    ({"epsilon": -1.0}, "epsilon must be >= 0, got -1.0"),
    ({"learning_rate": -1.0}, "learning_rate must be positive or zero"),
])
def test_adam_arguments_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Adam([torch.nn.Parameter(torch.zeros(1))], **kwargs)


@pytest.mark.parametrize("cls, kwargs, match", [
    (ProximalAdagrad, {"initial_accumulator_value": 0.0}, "initial_accumulator_value must be "
                                                          "positive: 0.0"),
    (ProximalAdagrad, {"l1_regularization_strength": -0.1}, "l1_regularization_strength must "
                                                            "be >= 0, got -0.1"),
    (ProximalGradientDescent, {"l2_regularization_strength": -1.0},
     "l2_regularization_strength must be >= 0"),
    (ProximalGradientDescent, {"learning_rate": -1.0}, "learning_rate must be positive or zero"),
])
def test_proximal_arguments_checked(cls, kwargs, match):
    kwargs = {"learning_rate": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        cls([torch.nn.Parameter(torch.zeros(1))], **kwargs)


def test_a_canned_estimator_takes_proximal_adagrad_as_tfs_docs_show(tmp_path):
    """TF's DNNClassifier docstring: ``optimizer=ProximalAdagradOptimizer(
    learning_rate=0.1, l1_regularization_strength=0.001)``; here the factory of it."""
    from estimator.feature_column import numeric_column
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 2)).astype(np.float32)
    y = (x.sum(1) > 0).astype(np.int64)
    classifier = est.DNNClassifier([4], [numeric_column("x", shape=2)], model_dir=str(tmp_path),
                                   optimizer=lambda p: est.optimizers.ProximalAdagrad(
                                       p, learning_rate=0.1, l1_regularization_strength=0.001))
    classifier.train(est.inputs.numpy_input_fn({"x": x}, y, 16, None, True), max_steps=60)
    results = classifier.evaluate(est.inputs.numpy_input_fn({"x": x}, y, 16, 1, False))
    assert results["accuracy"] > 0.9
    assert "accumulator" in {key.rsplit("/", 1)[-1] for key in classifier.get_variable_names()}
