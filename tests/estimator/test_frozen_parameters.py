"""Frozen parameters (`requires_grad` False) and `get_optimizer`, as TF's
`minimize` takes the variables trainable when it is built: an optimizer is
over the parameters trainable at its first step (no state for a frozen
table), a layer unfrozen later trains with an optimizer of its own, and one
no optimizer steps is said. A resumed optimizer is over what the
checkpoint's was over, so a layer frozen in a window of steps resumes as in
a run never stopped (it was dropped for good, without a word)."""
import logging

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
FROZEN = {"unfreeze_at_5": lambda step: step < 5,
          "window": lambda step: 5 <= step < 15,
          "always": lambda step: True}


def _net(frozen_in_factory=False):
    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return net[0].requires_grad_(not frozen_in_factory) and net


def model_fn(features, labels, mode, params):
    net = est.get_module("net", lambda: _net(params.get("in_factory", False)))
    step = est.get_global_step()
    for p in net[0].parameters():
        p.requires_grad_(not FROZEN[params["frozen"]](step))
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    opt = est.get_optimizer(lambda p: params.get("kind", torch.optim.Adam)(p, lr=0.05))
    if not params.get("own") or step < 5:
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)
    backbone = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.01), name="backbone",
                                 var_list=net[0])

    def train_op():
        loss.backward()
        opt.step()
        backbone.step()
    return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _plain(frozen, own=False):
    """A plain loop: one Adam over the parameters trainable at the start
    (`own`: and one of the first layer's own from step 5)."""
    net = _net()
    for p in net[0].parameters():
        p.requires_grad_(not FROZEN[frozen](0))
    optimizers = [torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=0.05)]
    for step, (x, y) in enumerate(DATA):
        for p in net[0].parameters():
            p.requires_grad_(not FROZEN[frozen](step))
        if own and step == 5:
            optimizers.append(torch.optim.Adam(net[0].parameters(), lr=0.01))
        for opt in optimizers:
            opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        for opt in optimizers:
            opt.step()
    return {f"net/{k.replace('.', '/')}": v.numpy() for k, v in net.state_dict().items()}


def _train(model_dir, batches, **params):
    e = est.Estimator(model_fn, model_dir=str(model_dir), params=params)
    e.train(lambda: [({"x": x}, y) for x, y in batches])
    return e


def _assert_equal(e, expected):
    for name, value in expected.items():
        np.testing.assert_allclose(e.get_variable_value(name), value, rtol=0, atol=1e-7,
                                   err_msg=name)


def test_a_layer_frozen_in_a_window_resumes_as_a_run_never_stopped(tmp_path):
    expected = _plain("window")
    _assert_equal(_train(tmp_path / "one", DATA, frozen="window"), expected)
    _train(tmp_path / "resumed", DATA[:10], frozen="window")   # resumed in the window
    _assert_equal(_train(tmp_path / "resumed", DATA[10:], frozen="window"), expected)


@pytest.mark.parametrize("split", [None, 3, 10])
def test_a_layer_unfrozen_later_trains_with_an_optimizer_of_its_own(tmp_path, split):
    """Its optimizer made at step 5; resumed before that (split 3) it starts fresh."""
    expected = _plain("unfreeze_at_5", own=True)
    if split:
        _train(tmp_path, DATA[:split], frozen="unfreeze_at_5", own=True)
    e = _train(tmp_path, DATA[split or 0:], frozen="unfreeze_at_5", own=True)
    _assert_equal(e, expected)


def test_a_layer_unfrozen_later_that_no_optimizer_steps_is_said(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hooks.model_scope"):
        e = _train(tmp_path, DATA, frozen="unfreeze_at_5")
    _assert_equal(e, _plain("unfreeze_at_5"))   # (as TF: the first layer never moves)
    said = [r.getMessage() for r in caplog.records if "no optimizer steps it" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("net/0/weight, net/0/bias trainable now")


def test_each_layer_unfrozen_later_that_no_optimizer_steps_is_said(tmp_path, caplog):
    """Two layers unfrozen at steps 3 and 6: two warnings (the second was lost).
    Resumed after, the error says what the model needs."""
    def two_layers(features, labels, mode):
        net = est.get_module("net", _net)
        step = est.get_global_step()
        net[0].requires_grad_(step >= 3)
        net[2].weight.requires_grad_(step >= 6)
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    e = est.Estimator(two_layers, model_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="hooks.model_scope"):
        e.train(lambda: [({"x": x}, y) for x, y in DATA[:8]])
    said = [r.getMessage().split(" trainable now")[0] for r in caplog.records
            if "no optimizer steps it" in r.getMessage()]
    assert said == ["net/0/weight, net/0/bias", "net/2/weight"]
    with pytest.raises(ValueError, match=r"needs an optimizer of its own"):
        e.train(lambda: [({"x": x}, y) for x, y in DATA[:2]])


def test_a_window_resumes_beside_a_parameter_not_a_modules(tmp_path):
    """A custom loop's var_list holding a bare nn.Parameter beside a module:
    the module's variables go by name, the bare one by requires_grad (all
    went by requires_grad, and the resume in the window failed with torch's
    "parameter group that doesn't match the size")."""
    import hooks
    scale = torch.nn.Parameter(torch.ones(1))

    def run(last_step):
        with hooks.MonitoredTrainingSession(
                checkpoint_dir=str(tmp_path), save_checkpoint_steps=1000,
                hooks=[hooks.StopAtStepHook(last_step=last_step)]) as sess:
            net = est.get_module("net", lambda: torch.nn.Linear(4, 2))
            net.requires_grad_(not 5 <= est.get_global_step() < 15)
            opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.05),
                                    var_list=[net, scale])

            def step(x, y):
                net.requires_grad_(not 5 <= est.get_global_step() < 15)
                opt.zero_grad()
                torch.nn.functional.mse_loss(scale * net(x), y).backward()
                opt.step()
            while not sess.should_stop():
                sess.run(step, *DATA[int(est.get_global_step())])
    run(10)
    run(20)
    state = est.checkpoint.load(str(tmp_path / "model.ckpt-20"))["optimizers"]["optimizer"]
    assert [float(state["state"][i]["step"]) for i in range(3)] == [10.0, 10.0, 20.0]


def test_a_frozen_table_gets_no_optimizer_state(tmp_path):
    """TF makes no slot for a variable not trainable; torch's Adagrad makes its
    state when built, for every parameter it is given."""
    e = _train(tmp_path, DATA[:2], frozen="always", in_factory=True, kind=torch.optim.Adagrad)
    assert [n for n in e.get_variable_names() if n.startswith("optimizer/")] == [
        "optimizer/net/2/bias/step", "optimizer/net/2/bias/sum",
        "optimizer/net/2/weight/step", "optimizer/net/2/weight/sum"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_frozen_layers_under_mirrored_strategy(tmp_path):
    """DDP averages the gradients of the parameters trainable when it wraps
    the module: one frozen there and trained later (an optimizer of its own)
    would step on each replica's own gradient, the replicas drifting apart;
    one frozen after the module was made failed at the next step with DDP's
    'Expected to have finished reduction'. A layer frozen throughout trains."""
    import distribute

    def run(model_dir, **params):
        strategy = distribute.MirroredStrategy(
            ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
                timeout_seconds=30))
        e = est.Estimator(model_fn, params=params, config=est.RunConfig(
            model_dir=str(model_dir), train_distribute=strategy))
        e.train(lambda: [({"x": x}, y) for x, y in DATA])   # 10 steps of 2 batches
        return e
    e = run(tmp_path / "always", frozen="always", in_factory=True)
    assert e.get_variable_value("global_step") == 10
    with pytest.raises(Exception, match=r"get_optimizer\(name='backbone'\): net/0/weight, "
                                        r"net/0/bias has a gradient, but was frozen"):
        run(tmp_path / "own", frozen="unfreeze_at_5", in_factory=True, own=True)
    with pytest.raises(Exception, match=r"module 'net': its parameters 0.weight, 0.bias were "
                                        r"frozen \(requires_grad False\) after the module"):
        run(tmp_path / "frozen_since", frozen="always")
    # Frozen from step 5 (DDP's "Expected to have finished reduction" at step 6)
    with pytest.raises(ValueError, match=r"module 'net': its parameters 0.weight, 0.bias were "
                                         r"frozen .* set their .grad to None"):
        run(tmp_path / "window", frozen="window")


def window_by_grad(features, labels, mode):
    """The window of `FROZEN["window"]` as said for MirroredStrategy: the layer
    stays trainable, its gradient dropped before the optimizer's step."""
    net = est.get_module("net", _net)
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.05))
    frozen = FROZEN["window"](est.get_global_step())

    def train_op():
        opt.zero_grad()
        loss.backward()
        if frozen:
            for p in net[0].parameters():
                p.grad = None
        opt.step()
    return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_window_frozen_as_the_error_says_trains_on_replicas_as_in_one_process(tmp_path):
    import distribute
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=30))
    e = est.Estimator(window_by_grad, config=est.RunConfig(
        model_dir=str(tmp_path / "replicas"), train_distribute=strategy))
    e.train(lambda: [({"x": x}, y) for x, y in DATA])   # 10 steps of 2 batches
    pairs = [(torch.cat([DATA[i][0], DATA[i + 1][0]]), torch.cat([DATA[i][1], DATA[i + 1][1]]))
             for i in range(0, STEPS, 2)]
    one = _train(tmp_path / "one", pairs, frozen="window")
    assert e.get_variable_value("global_step") == 10
    for name in one.get_variable_names():
        if name.startswith("net/"):
            np.testing.assert_allclose(e.get_variable_value(name), one.get_variable_value(name),
                                       rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("where", ["later_step", "train_op", "own_optimizer", "frozen"])
def test_a_module_first_made_after_the_optimizer_is_said_unless_one_steps_it(
        tmp_path, caplog, where):
    """A head first made at step 3 (or in a callable train_op) was in the
    loss and the checkpoint, but no optimizer stepped it, without a word
    (patterns probe). Given an optimizer of its own, it trains, unsaid."""
    made = {}

    def make_head():
        made["head"] = torch.nn.Linear(4, 2)
        made["initial"] = made["head"].weight.detach().clone().numpy()
        return made["head"]

    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(4, 2))
        out = net(features["x"])
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        late = where != "train_op" and est.get_global_step() >= 3
        if late:
            head = est.get_module("head", make_head)
            if where == "frozen":   # (a teacher: said of nothing, attack probe)
                head.requires_grad_(False)
            out = out + head(features["x"])
        loss = torch.nn.functional.mse_loss(out, labels)
        if where == "own_optimizer" and late:
            own = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1), name="head",
                                    var_list=[head])

            def train_op():
                loss.backward()
                opt.step()
                own.step()
            return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
        if where != "train_op":
            return est.EstimatorSpec(mode, loss=loss, train_op=opt)

        def made_in_train_op():
            head = est.get_module("head", make_head)
            (loss + head(features["x"]).square().mean()).backward()
            opt.step()
        return est.EstimatorSpec(mode, loss=loss, train_op=made_in_train_op)
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="hooks.model_scope"):
        e.train(lambda: [({"x": x}, y) for x, y in DATA[:8]])
    said = [r.getMessage() for r in caplog.records if "first made" in r.getMessage()]
    moved = not np.array_equal(e.get_variable_value("head/weight"), made["initial"])
    if where == "own_optimizer":
        assert said == [] and moved
    elif where == "frozen":
        assert said == [] and not moved
    else:
        assert len(said) == 1 and said[0].startswith(
            "module 'head' was first made (get_module) after get_optimizer built 'optimizer'")
        assert not moved
