"""est.moving_averages.ExponentialMovingAverage: TF1's moving averages of the
model's variables, updated after each step's update, checkpointed under TF's
names, copied into the variables to evaluate, predict and export on them.
TF's values recorded by tests/support/fixtures/record_tf_moving_averages.py."""
import copy
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_moving_averages.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
X, Y = np.array(TF["x"], np.float32), np.array(TF["y"], np.float32)
ema_lib = est.moving_averages


class Dense(torch.nn.Module):
    """TF's dense layer, its variables named as TF names them (kernel, bias)."""

    def __init__(self, name):
        super().__init__()
        self.kernel = torch.nn.Parameter(torch.tensor(TF["init"][name + "/kernel"]))
        self.bias = torch.nn.Parameter(torch.tensor(TF["init"][name + "/bias"]))

    def forward(self, x):
        return x @ self.kernel + self.bias


def model_fn(features, labels, mode, params):
    hidden = est.get_module("hidden", lambda: Dense("hidden"))
    out_layer = est.get_module("out", lambda: Dense("out"))
    warm = ema_lib.ExponentialMovingAverage(0.9, num_updates=est.get_global_step(), name="warm")
    plain = ema_lib.ExponentialMovingAverage(0.5)
    if mode != est.ModeKeys.TRAIN:
        warm.copy_to()
        plain.apply()   # (TF: an op no train_op runs outside TRAIN; an export's trace too)
    out = out_layer(torch.relu(hidden(features["x"])))
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": out})
    loss = torch.nn.functional.mse_loss(out, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss)
    optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
    if params.get("apply_in_train_op"):   # a custom step: the updates still after its step
        def train_op():
            warm.apply()
            loss.backward()
            plain.apply([hidden, out_layer])
            optimizer.step()
            optimizer.zero_grad()
            if params["apply_in_train_op"] == "after the first step":
                ema_lib.ExponentialMovingAverage(0.5, name="late").apply()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    warm.apply()
    plain.apply([hidden, out_layer])
    return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)


def batches():
    while True:
        for i in (0, 4):
            yield {"x": X[i:i + 4]}, Y[i:i + 4]


def _train(model_dir, steps, **params):
    estimator = est.Estimator(model_fn, model_dir, params=params)
    estimator.train(batches, max_steps=steps)
    return estimator


def _assert_variables_are_tfs(estimator):
    names = set(estimator.get_variable_names()) - {"global_step"}
    assert names == set(TF["variables"])
    for name in sorted(names):
        np.testing.assert_allclose(estimator.get_variable_value(name), TF["variables"][name],
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("where", ["model_fn", "train_op"])
def test_averages_are_tfs_and_checkpointed_under_tfs_names(tmp_path, where):
    estimator = _train(str(tmp_path), TF["steps"], apply_in_train_op=where == "train_op")
    _assert_variables_are_tfs(estimator)
    # resumed half-way: the averages restored with the model, the same at the end
    _train(str(tmp_path / "resumed"), 2)
    estimator = _train(str(tmp_path / "resumed"), TF["steps"])
    _assert_variables_are_tfs(estimator)


@pytest.mark.parametrize("source", ["ours", "tf"])
def test_a_list_warm_start_takes_the_averages_as_tfs(tmp_path, caplog, source):
    """TF's list form warm-starts every variable, the averages (and the global
    step) included; they restarted from the warm-started variables (and from
    TF's checkpoint were said to be optimizer slots left out)."""
    if source == "ours":
        _train(str(tmp_path / "a"), TF["steps"])
        start = str(tmp_path / "a")
    else:
        start = os.path.join(FIXTURES, "tf_ckpt", "moving_averages", "model.ckpt")
    warm = est.Estimator(model_fn, str(tmp_path / "b"), params={},
                         warm_start_from=est.WarmStartSettings(start, [".*"]))
    warm.train(batches, steps=1)
    recorded = TF["list_warm_started_then_one_step"]
    assert sorted(warm.get_variable_names()) == sorted(recorded)
    for name in recorded:
        np.testing.assert_allclose(warm.get_variable_value(name), recorded[name], rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    assert "optimizer slots" not in caplog.text   # (the averages are not an optimizer's)


def test_evaluate_predict_and_export_run_on_the_averages(tmp_path):
    estimator = _train(str(tmp_path / "m"), TF["steps"])
    got = [p["y"] for p in estimator.predict(lambda: [{"x": X}])]
    np.testing.assert_allclose(np.concatenate(got).ravel(),
                               np.ravel(TF["predictions_on_warm_averages"]), rtol=1e-5)
    loss = estimator.evaluate(lambda: [({"x": X}, Y)])["loss"]
    assert loss == pytest.approx(TF["eval_loss_on_warm_averages"], rel=1e-5)
    export = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(
            {"x": torch.zeros(2, 4)}))
    served = est.export.load(export)(x=torch.tensor(X))
    np.testing.assert_allclose(served["y"].numpy().ravel(),
                               np.ravel(TF["predictions_on_warm_averages"]), rtol=1e-5)
    # training goes on from the trained variables, not the averages
    estimator.train(batches, max_steps=TF["steps"] + 1)
    assert not np.allclose(estimator.get_variable_value("hidden/kernel"),
                           TF["variables"]["hidden/kernel/warm"], atol=1e-3)


with open(os.path.join(FIXTURES, "tf_moving_averages_batch_norm.json"), encoding="utf-8") as _f:
    TF_BN = json.load(_f)
_TORCH_NAMES = {"bn/gamma": "bn/weight", "bn/beta": "bn/bias", "bn/moving_mean":
                "bn/running_mean", "bn/moving_variance": "bn/running_var"}


@pytest.mark.parametrize("apply_at", ["the end", "the start"])
def test_batch_norm_statistics_average_from_their_initial_values_as_tfs(tmp_path, apply_at):
    """EfficientNet's averages (its get_ema_vars: the trainable variables and
    batch norm's moving statistics) applied after the forward pass, where the
    docs place `apply`: the statistics' averages started from the values the
    first forward pass wrote (1.22x TF's after a step; EfficientNet port
    probe), TF's from the initial ones."""
    def model_fn(features, labels, mode):
        bn = est.get_module("bn", lambda: torch.nn.BatchNorm2d(2, momentum=0.1, eps=1e-3))
        kernel = est.get_module("dense", lambda: torch.nn.ParameterDict({
            "kernel": torch.nn.Parameter(torch.tensor(TF_BN["init"]["dense/kernel"]))}))["kernel"]
        ema = ema_lib.ExponentialMovingAverage(0.8, num_updates=est.get_global_step())
        ema_vars = [*bn.parameters(), kernel, bn.running_mean, bn.running_var]
        if apply_at == "the start":
            ema.apply(ema_vars)
        x = bn(features["x"].permute(0, 3, 1, 2)).mean((2, 3))
        loss = torch.nn.functional.mse_loss(x @ kernel, labels)
        if apply_at == "the end":
            ema.apply(ema_vars)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))

    x, y = np.array(TF_BN["x"], np.float32), np.array(TF_BN["y"], np.float32)

    def input_fn():
        while True:
            for i in (0, 4):
                yield {"x": x[i:i + 4]}, y[i:i + 4]
    estimator = est.Estimator(model_fn, str(tmp_path))
    estimator.train(input_fn, max_steps=TF_BN["steps"])
    for name, value in sorted(TF_BN["variables"].items()):
        variable, _, average = name.partition("/Exp")
        ours = _TORCH_NAMES.get(variable, variable) + ("/Exp" + average if average else "")
        np.testing.assert_allclose(estimator.get_variable_value(ours), value,
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case", ["converted", "tf1 layer", "warm-started step", "lazy"])
def test_statistics_averages_start_from_their_initial_values_whatever_the_module(tmp_path,
                                                                                 case):
    """The attack on the above: a module converted in the model_fn
    (`.double()`: new buffers, an average from another buffer's initial
    value), est.layers.BatchNormalization, a first step past step 0 (a list
    warm start carrying global_step: no initial values kept), and a lazy
    module (every fresh run with one failed in its first step)."""
    x = torch.tensor(np.random.RandomState(0).randn(8, 2) + 3.0, dtype=torch.float32)
    make = {"tf1 layer": lambda: est.layers.BatchNormalization(2, momentum=0.9),
            "lazy": lambda: torch.nn.Sequential(torch.nn.LazyLinear(2),
                                                torch.nn.LazyBatchNorm1d(momentum=0.1))
            }.get(case, lambda: torch.nn.BatchNorm1d(2, momentum=0.1))

    def model_fn(features, labels, mode):
        bn = est.get_module("bn", make)
        if case == "converted":
            bn = bn.double()
        y = bn(features["x"].to(torch.float64 if case == "converted" else torch.float32))
        if case != "lazy":
            stats = [b for _, b in sorted(bn.named_buffers()) if b.is_floating_point()]
            ema_lib.ExponentialMovingAverage(0.5).apply(stats)
        return est.EstimatorSpec(mode, loss=y.pow(2).mean(), train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.0)))
    warm = None
    if case == "warm-started step":
        est.Estimator(model_fn, str(tmp_path / "first")).train(
            lambda: [({"x": x}, torch.zeros(8))], max_steps=1)
        warm = est.WarmStartSettings(str(tmp_path / "first"), vars_to_warm_start=[
            "bn/weight", "bn/bias", "bn/running_mean$", "bn/running_var$", "global_step"])
    estimator = est.Estimator(model_fn, str(tmp_path / "run"), warm_start_from=warm)
    estimator.train(lambda: [({"x": x}, torch.zeros(8))], steps=1)
    if case == "lazy":
        return   # (it trains)
    names = ["bn/moving_mean", "bn/moving_variance"] if case == "tf1 layer" else [
        "bn/running_mean", "bn/running_var"]
    initial = [np.zeros(2), np.ones(2)]
    if warm is not None:
        reader = est.Estimator(model_fn, str(tmp_path / "first"))
        initial = [reader.get_variable_value(n) for n in names]
    for name, start in zip(names, initial):
        now = estimator.get_variable_value(name)
        np.testing.assert_allclose(
            estimator.get_variable_value(name + "/ExponentialMovingAverage"),
            start - 0.5 * (start - now), rtol=1e-6, err_msg=name)


def test_an_average_begun_after_the_first_update_is_refused(tmp_path):
    with pytest.raises(ValueError, match="first called after hidden/kernel was updated"):
        _train(str(tmp_path), 2, apply_in_train_op="after the first step")


def test_a_custom_loops_average_built_once_follows_the_step_as_tfs(tmp_path):
    """cifar10_train's shape: the average built once before the loop with
    num_updates=global_step, applied in each step (here before the optimizer
    steps; updated after it)."""
    import hooks
    with hooks.MonitoredTrainingSession(checkpoint_dir=str(tmp_path),
                                        hooks=[hooks.StopAtStepHook(TF["steps"])]) as sess:
        hidden = est.get_module("hidden", lambda: Dense("hidden"))
        out_layer = est.get_module("out", lambda: Dense("out"))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        warm = ema_lib.ExponentialMovingAverage(0.9, est.get_global_step(), name="warm")
        plain = ema_lib.ExponentialMovingAverage(0.5)

        def step(features, labels):
            loss = torch.nn.functional.mse_loss(
                out_layer(torch.relu(hidden(torch.as_tensor(features["x"])))),
                torch.as_tensor(labels))
            warm.apply()
            plain.apply()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        data = batches()
        while not sess.should_stop():
            sess.run(step, *next(data))
        averages = {f"{n}/{e.name}": e.average(v).clone() for e in (warm, plain)
                    for n, v in (("hidden/kernel", hidden.kernel), ("hidden/bias", hidden.bias),
                                 ("out/kernel", out_layer.kernel), ("out/bias", out_layer.bias))}
        assert warm.average_name(hidden.kernel) == "hidden/kernel/warm"
    for name, value in averages.items():
        np.testing.assert_allclose(value.numpy(), TF["variables"][name], rtol=1e-5, atol=1e-6)
    assert set(averages) <= {name for name, _ in est.checkpoint.list_variables(str(tmp_path))}
    # resumed, before any step: the checkpoint's averages (they were None)
    with hooks.MonitoredTrainingSession(checkpoint_dir=str(tmp_path)):
        hidden = est.get_module("hidden", lambda: Dense("hidden"))
        restored = ema_lib.ExponentialMovingAverage(0.9, name="warm").average(hidden.kernel)
    np.testing.assert_array_equal(restored.numpy(), averages["hidden/kernel/warm"].numpy())


def _erring_model_fn(features, labels, mode, params):
    net = est.get_module("net", lambda: torch.nn.Linear(4, 1))
    counts = est.get_module("counts", lambda: CountBuffer())
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    ema = ema_lib.ExponentialMovingAverage(0.9)
    case = params["case"]
    if case == "a tensor":
        ema.apply([loss])
    elif case == "an integer buffer":
        ema.apply([counts.seen])
    elif case == "twice":
        ema.apply(net)
        ema.apply([net.weight])
    elif case == "copy_to in TRAIN":
        ema.copy_to()
    elif case == "not a list":
        ema.apply(3)
    elif case == "begun later":
        if est.get_global_step() >= 2:
            ema.apply()
    elif case == "nothing":   # (TF: a no-op)
        ema.apply([])
        ema.apply([p for p in net.parameters() if not p.requires_grad])
    elif case == "before a lazy module's first call":
        lazy = est.get_module("lazy", lambda: torch.nn.LazyLinear(1))
        ema.apply(lazy)
    else:
        ema.apply(net)
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)))


class CountBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))


@pytest.mark.parametrize("case, error, match", [
    ("a tensor", TypeError, r"a tensor of shape \[\] is not a variable of the model"),
    ("an integer buffer", TypeError, "counts/seen is torch.int64; the variables must be half"),
    ("twice", ValueError, "net/weight is averaged twice in one step"),
    ("copy_to in TRAIN", ValueError, "call it in EVAL and PREDICT only"),
    ("not a list", TypeError, "var_list must be the model's parameters, buffers or modules"),
    ("before a lazy module's first call", ValueError, "lazy/weight is not made yet .* call "
                                                      "apply after the forward pass"),
])
def test_wrong_uses_are_said(tmp_path, case, error, match):
    estimator = est.Estimator(_erring_model_fn, str(tmp_path), params={"case": case})
    with pytest.raises(error, match=match):
        estimator.train(lambda: [({"x": X[:4]}, Y[:4])] * 2)


def test_averaging_nothing_does_nothing(tmp_path):
    estimator = est.Estimator(_erring_model_fn, str(tmp_path), params={"case": "nothing"})
    estimator.train(lambda: [({"x": X[:4]}, Y[:4])] * 2)
    assert not any("Average" in name for name in estimator.get_variable_names())


def test_averages_a_checkpoint_lacks_start_from_the_variables_said(tmp_path, caplog):
    """A model_dir written before averaging began, resumed: its averages start
    from the variables' values then, said (TF's restore would fail)."""
    def make(model_dir):
        return est.Estimator(_erring_model_fn, params={"case": "begun later"},
                             config=est.RunConfig(model_dir=str(model_dir), tf_random_seed=1))
    make(tmp_path).train(lambda: [({"x": X[:4]}, Y[:4])] * 2)
    estimator = make(tmp_path)
    estimator.train(lambda: [({"x": X[:4]}, Y[:4])])
    assert ("the checkpoint " + os.path.join(str(tmp_path), "model.ckpt-2") +
            " holds no averages of net/weight, net/bias") in caplog.text
    at_2 = make(tmp_path / "at_2")
    at_2.train(lambda: [({"x": X[:4]}, Y[:4])] * 3)   # (the same, without the restart)
    for name in ("net/weight", "net/bias"):
        np.testing.assert_allclose(estimator.get_variable_value(name + "/ExponentialMovingAverage"),
                                   at_2.get_variable_value(name + "/ExponentialMovingAverage"),
                                   rtol=1e-6)


@pytest.mark.parametrize("arguments, error, match", [
    ({"decay": "0.9"}, TypeError, "decay must be a number"),
    ({"decay": 0.9, "num_updates": 1.5}, TypeError, "num_updates must be an integer"),
    ({"decay": 0.9, "name": "a/b"}, ValueError, "name must be a non-empty string"),
])
def test_wrong_arguments_are_said(arguments, error, match):
    with pytest.raises(error, match=match):
        ema_lib.ExponentialMovingAverage(**arguments)


def _averaged_spec(net, ema, features, labels, mode, lr):
    """Evaluated on the averages; trained by SGD, averaged after each step."""
    if mode != est.ModeKeys.TRAIN:
        ema.copy_to()
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss)
    ema.apply()
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=lr)))


def _replicated_model_fn(features, labels, mode):
    net = est.get_module("net", lambda: torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.0), torch.nn.Linear(8, 1)))
    return _averaged_spec(net, ema_lib.ExponentialMovingAverage(
        0.8, num_updates=est.get_global_step()), features, labels, mode, lr=0.05)


def _replica_input_fn(input_context=None):
    rng = np.random.RandomState(0)
    data = [(rng.randn(3, 4), rng.randn(3, 1)) for _ in range(8)]   # float64, as pandas gives
    if input_context is None:   # one process: a replica's batch and the next, together
        return [({"x": np.concatenate([data[i][0], data[i + 1][0]])},
                 np.concatenate([data[i][1], data[i + 1][1]])) for i in range(0, 8, 2)]
    return [({"x": x}, y) for x, y in data[input_context.input_pipeline_id::2]]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["mirrored", "central_storage"])
def test_replicas_average_as_one_process(tmp_path, kind):
    import distribute
    options = distribute.CommunicationOptions(timeout_seconds=30)
    strategy = (distribute.MirroredStrategy(["cpu:0", "cpu:1"], communication_options=options)
                if kind == "mirrored" else
                distribute.CentralStorageStrategy(["cpu:0", "cpu:1"],
                                                  communication_options=options))
    two = est.Estimator(_replicated_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "two"), train_distribute=strategy))
    two.train(_replica_input_fn)
    one = est.Estimator(_replicated_model_fn, str(tmp_path / "one"))
    one.train(lambda: _replica_input_fn())
    names = one.get_variable_names()
    assert "net/0/weight/ExponentialMovingAverage" in names and names == two.get_variable_names()
    for name in names:
        np.testing.assert_allclose(two.get_variable_value(name), one.get_variable_value(name),
                                   atol=1e-6, err_msg=name)

    def data():
        return _replica_input_fn()[:1]
    assert two.evaluate(data)["loss"] == pytest.approx(one.evaluate(data)["loss"], rel=1e-6)


def test_parameter_server_strategy_without_a_cluster_averages_as_no_strategy(tmp_path):
    """Its local case keeps the variables here (CentralStorage's way)."""
    import distribute
    local = est.Estimator(_replicated_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "local"), train_distribute=distribute.ParameterServerStrategy(),
        tf_random_seed=3))
    local.train(lambda: _replica_input_fn())
    plain = est.Estimator(_replicated_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "plain"), tf_random_seed=3))
    plain.train(lambda: _replica_input_fn())
    name = "net/3/weight/ExponentialMovingAverage"
    np.testing.assert_allclose(local.get_variable_value(name), plain.get_variable_value(name),
                               atol=1e-7)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_parameter_server_training_is_refused(tmp_path):
    """TF keeps the averages on the ps tasks, updated by every worker: not built here."""
    import io
    from estimator.experiment.launch import launch
    from paths import SUPPORT
    output = io.StringIO()
    status = launch([os.path.join(SUPPORT, "ps_task.py"), str(tmp_path), "--steps", "5",
                     "--moving-average"], output=output, workers=0, ps=1, timeout=150,
                    stop_grace_secs=5)
    assert status != 0
    assert "not built for ParameterServerStrategy's training" in output.getvalue()


def test_an_in_memory_evaluator_evaluates_on_the_averages(tmp_path):
    """Its first evaluation, before any update, is of the variables (their
    averages then); its last is TF's evaluation on the averages."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    estimator = est.Estimator(model_fn, str(tmp_path), params={})
    estimator.train(batches, max_steps=TF["steps"], hooks=[est.experimental.InMemoryEvaluatorHook(
        estimator, lambda: [({"x": X}, Y)], every_n_iter=3)])
    events = EventAccumulator(estimator.eval_dir()).Reload()
    losses = {e.step: e.value for e in events.Scalars("loss")}
    hidden, out = Dense("hidden"), Dense("out")
    initial = torch.nn.functional.mse_loss(out(torch.relu(hidden(torch.tensor(X)))),
                                           torch.tensor(Y)).item()
    assert sorted(losses) == [0, 3, 6]
    assert losses[0] == pytest.approx(initial, rel=1e-6)
    assert losses[6] == pytest.approx(TF["eval_loss_on_warm_averages"], rel=1e-5)


def _lazy_model_fn(features, labels, mode, params):
    """A LazyLinear made at its first call, a weight set by hand in the first
    step, and an average begun at step 2 (updates before apply there)."""
    net = est.get_module("net", lambda: torch.nn.Sequential(
        torch.nn.LazyLinear(3), torch.nn.ReLU(), torch.nn.Linear(3, 1)))
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    if est.get_global_step() == 0:
        with torch.no_grad():
            net[2].bias.fill_(0.5)
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))

    def train_op():
        ema_lib.ExponentialMovingAverage(0.9).apply()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if est.get_global_step() >= 2:
            ema_lib.ExponentialMovingAverage(0.5, name="later").apply()
    return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_changes_before_the_first_update_and_averages_begun_later_are_not_refused(tmp_path):
    estimator = est.Estimator(_lazy_model_fn, str(tmp_path))
    estimator.train(lambda: [({"x": X[:4]}, Y[:4])], max_steps=1)
    # the average starts at the value set by hand, then one update (decay 0.9)
    trained = estimator.get_variable_value("net/2/bias")
    np.testing.assert_allclose(
        estimator.get_variable_value("net/2/bias/ExponentialMovingAverage"),
        0.5 + 0.1 * (trained - 0.5), rtol=1e-6)
    estimator.train(lambda: [({"x": X[:4]}, Y[:4])] * 3)
    assert "net/0/weight/later" in estimator.get_variable_names()   # (begun at step 2)


_NET = torch.nn.Linear(4, 1)   # built once, at import, as a ported script may


def _global_model_fn(features, labels, mode, params):
    shared = {"top": lambda: _NET, "inside": lambda: torch.nn.Sequential(_NET),
              "copied": lambda: torch.nn.Sequential(copy.deepcopy(_NET))}[params["shared"]]
    net = est.get_module("net", shared)
    return _averaged_spec(net, ema_lib.ExponentialMovingAverage(0.9), features, labels, mode,
                          lr=0.1)


def test_an_evaluation_inside_training_leaves_a_module_made_once_alone(tmp_path):
    """`get_module("net", lambda: NET)` (or a new module holding NET): the
    in-memory evaluation's scope got the training's own module, and its
    copy_to trained on from the averages (a batch norm's forward there broke
    the training's backward)."""
    with torch.no_grad():
        _NET.weight.copy_(torch.tensor([[0.1, -0.2, 0.3, 0.0]]))
        _NET.bias.zero_()
    initial = copy.deepcopy(_NET.state_dict())
    weights = {}
    for shared in ("copied", "top", "inside"):
        _NET.load_state_dict(initial)
        estimator = est.Estimator(_global_model_fn, str(tmp_path / str(shared)),
                                  params={"shared": shared})
        estimator.train(batches, max_steps=6, hooks=[est.experimental.InMemoryEvaluatorHook(
            estimator, lambda: [({"x": X}, Y)], every_n_iter=2)])
        weights[shared] = estimator.get_variable_value(
            "net/weight" if shared == "top" else "net/0/weight")
    np.testing.assert_array_equal(weights["top"], weights["copied"])
    np.testing.assert_array_equal(weights["inside"], weights["copied"])


def test_a_list_warm_start_of_an_average_alone_takes_it(tmp_path):
    """`vars_to_warm_start=["net/weight/ExponentialMovingAverage"]`: the
    average without its variable (the diff's reread: the layout's new
    lookup failed there, 'set' object has no attribute 'get')."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        loss = (net(features) - labels).pow(2).mean()
        ema_lib.ExponentialMovingAverage(0.5).apply()
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, 0.1)))

    def input_fn():
        return [(torch.ones(4, 2), torch.zeros(4, 1))] * 3
    first = est.Estimator(model_fn, str(tmp_path / "first"))
    first.train(input_fn, steps=2)
    average = first.get_variable_value("net/weight/ExponentialMovingAverage")
    warm = est.Estimator(model_fn, str(tmp_path / "warm"), warm_start_from=est.WarmStartSettings(
        str(tmp_path / "first"), vars_to_warm_start=["net/weight/ExponentialMovingAverage"]))
    warm.train(input_fn, steps=1)
    weight = warm.get_variable_value("net/weight")
    np.testing.assert_allclose(warm.get_variable_value("net/weight/ExponentialMovingAverage"),
                               average - 0.5 * (average - weight), rtol=1e-6)


# -- averages of tensors (cifar10_train's loss averages) -------------------------------
with open(os.path.join(FIXTURES, "tf_moving_averages_tensors.json"), encoding="utf-8") as _f:
    TF_TENSORS = json.load(_f)


def _loss_averages_model_fn(features, labels, mode, params):
    """cifar10's _add_loss_summaries, as a port writes it: the losses named
    as TF named their ops, averaged before the gradients."""
    dense = est.get_module("dense", lambda: torch.nn.ParameterDict(
        {"kernel": torch.nn.Parameter(torch.tensor(TF_TENSORS["kernel"]))}))
    kernel = dense["kernel"]
    cross_entropy = torch.nn.functional.cross_entropy(features["x"] @ kernel, labels.long())
    weight_loss = (kernel ** 2).sum() / 2 * 0.01
    total = cross_entropy + weight_loss
    losses = {"cross_entropy": cross_entropy, "weight_loss": weight_loss, "total_loss": total}
    averages = ema_lib.ExponentialMovingAverage(
        0.9, name="avg", zero_debias=params["zero_debias"],
        num_updates=est.get_global_step() if params["zero_debias"] else None)
    averages.apply(losses)
    for name, loss in losses.items():
        est.summary.scalar(name + " (raw)", loss)
        est.summary.scalar(name + "_1", averages.average(loss))   # (TF's tag: "_1")
    return est.EstimatorSpec(mode, loss=total, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.5)))


def _loss_batches():
    x, y = np.array(TF_TENSORS["x"], np.float32), np.array(TF_TENSORS["y"], np.int64)
    while True:
        for i in (0, 4):
            yield {"x": x[i:i + 4]}, y[i:i + 4]


def _scalars(model_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(model_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("case", ["plain", "zero_debias"])
def test_loss_averages_are_tfs(tmp_path, case):
    """cifar10_train's loss summaries were refused (TypeError, "averages of
    other tensors are not built here"). Each average starts at zero (TF's
    zeros slot), its summary reads it before the step's update (0 at step
    1), and zero_debias keeps TF's `biased` and `local_step`; the second
    half of the run is resumed from the checkpoint, the averages with it."""
    tf = TF_TENSORS[case]
    config = est.RunConfig(model_dir=str(tmp_path), save_summary_steps=1)
    for steps in (2, TF_TENSORS["steps"]):
        estimator = est.Estimator(_loss_averages_model_fn, config=config,
                                  params={"zero_debias": case == "zero_debias"})
        estimator.train(_loss_batches, max_steps=steps)
    names = set(estimator.get_variable_names()) - {"global_step", "dense/kernel"}
    assert names == set(tf["variables"]) - {"global_step", "dense/kernel"}
    for name in sorted(names | {"dense/kernel"}):
        np.testing.assert_allclose(estimator.get_variable_value(name), tf["variables"][name],
                                   rtol=2e-6, atol=1e-7, err_msg=name)
    ours = _scalars(str(tmp_path))
    for tag in ("cross_entropy__raw_", "cross_entropy_1", "weight_loss_1", "total_loss_1"):
        np.testing.assert_allclose(np.array(ours[tag]), np.array(tf["summaries"][tag]),
                                   rtol=2e-6, atol=1e-7, err_msg=tag)


def test_a_tensors_average_is_read_and_named_by_its_tensor_or_name(tmp_path):
    seen = {}

    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(4, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        ema = ema_lib.ExponentialMovingAverage(0.5, name="avg")
        ema.apply({"losses/mse": loss})
        seen[mode] = (ema.average(loss), ema.average("losses/mse"), ema.average_name(loss))
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    estimator = est.Estimator(model_fn, str(tmp_path))
    estimator.train(batches, max_steps=3)
    by_tensor, by_name, name = seen[est.ModeKeys.TRAIN]
    assert torch.equal(by_tensor, by_name) and name == "losses/mse/avg"
    saved = estimator.get_variable_value("losses/mse/avg")
    assert saved != 0 and by_tensor.item() != saved   # (read before step 3's update)
    estimator.evaluate(lambda: iter([({"x": X}, Y)]))   # restored, not updated
    assert seen[est.ModeKeys.EVAL][0].item() == pytest.approx(float(saved))


def _replica_tensor_model_fn(features, labels, mode):
    import distribute
    net = est.get_module("net", lambda: torch.nn.Linear(4, 1))
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    replica = distribute.get_replica_context().replica_id_in_sync_group
    ema_lib.ExponentialMovingAverage(0.9, name="avg").apply(
        {"replica": torch.tensor(1.0 + replica)})
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_tensors_average_moves_towards_the_replicas_mean(tmp_path):
    """TF's assign_moving_average in a replica context averages the mean of
    the replicas' values (its merge_call); TF 2.15's Estimator refuses such
    averages under a MirroredStrategy, so no value recorded from it."""
    import distribute
    options = distribute.CommunicationOptions(timeout_seconds=30)
    two = est.Estimator(_replica_tensor_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path), train_distribute=distribute.MirroredStrategy(
            ["cpu:0", "cpu:1"], communication_options=options)))
    two.train(lambda: [({"x": X}, Y)] * 6)
    steps = two.get_variable_value("global_step")
    assert steps >= 2   # (replica 0 alone would give 1 - 0.9 ** steps)
    assert two.get_variable_value("replica/avg") == pytest.approx(1.5 * (1 - 0.9 ** steps),
                                                                  rel=1e-6)


def _tensor_erring_model_fn(features, labels, mode, params):
    net = est.get_module("net", lambda: torch.nn.Linear(4, 1))
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    ema = ema_lib.ExponentialMovingAverage(0.9)
    case = params["case"]
    if case == "an integer tensor":
        ema.apply({"count": torch.tensor(3)})
    elif case == "a number":
        ema.apply({"lr": 0.1})
    elif case == "a variable":
        ema.apply({"w": net.weight})
    elif case == "a variable's name":
        ema.apply({"net/weight": loss})
    elif case == "a bad name":
        ema.apply({"losses/": loss})
    elif case == "twice":
        ema.apply({"loss": loss})
        ema.apply({"loss": loss * 2})
    elif case == "one tensor, two names":
        ema.apply({"a": loss, "b": loss})
    elif case == "a module named after it":
        ema.apply({"head": loss})
        est.get_module("head", lambda: torch.nn.Linear(1, 1))
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)))


@pytest.mark.parametrize("case, error, match", [
    ("an integer tensor", TypeError, r"'count' is torch.int64; an average's tensor must be"),
    ("a number", TypeError, r"'lr' is float; an average's tensor must be half"),
    ("a variable", TypeError, r"'w' is the model's variable net/weight: give variables in a"),
    ("a variable's name", ValueError, r"'net/weight' names a variable of the model"),
    ("a bad name", ValueError, r"'losses/' cannot name an average"),
    ("twice", ValueError, r"loss is averaged twice in one step"),
    ("one tensor, two names", ValueError, r"'b' is the tensor 'a' names already"),
    ("a module named after it", ValueError, r"get_module\('head'\): the name is taken by the "
                                            r"slots"),
])
def test_a_tensor_average_that_cannot_be_is_refused(tmp_path, case, error, match):
    estimator = est.Estimator(_tensor_erring_model_fn, str(tmp_path), params={"case": case})
    with pytest.raises(error, match=match):
        estimator.train(batches, max_steps=1)


def test_copy_to_a_dict_of_tensors_is_refused(tmp_path):
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(4, 1))
        ema_lib.ExponentialMovingAverage(0.9).copy_to({"loss": net.weight})
        return est.EstimatorSpec(mode, predictions={"y": net(features["x"])})
    with pytest.raises(TypeError, match="averages of tensors .* have no variables to copy to"):
        list(est.Estimator(model_fn, str(tmp_path)).predict(lambda: iter([{"x": X}])))


def _evaluated_average_model_fn(features, labels, mode, params):
    net = est.get_module("net", lambda: torch.nn.Linear(4, 1))
    loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
    ema = ema_lib.ExponentialMovingAverage(0.9, name="avg")
    if params["averaged"]:
        ema.apply({"mse": loss})
    return est.EstimatorSpec(
        mode, loss=loss, eval_metric_ops={"avg": est.metrics.mean(
            ema.average(loss) if params["averaged"] else loss)},
        train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)))


def test_a_tensors_average_no_checkpoint_holds_is_zero(tmp_path, caplog):
    """The initial model's evaluation read None (summaries and metrics of it
    crashed); TF makes its zeros slot there too (0.0). A checkpoint written
    before the average began: from zero, said."""
    fresh = est.Estimator(_evaluated_average_model_fn, str(tmp_path / "fresh"),
                          params={"averaged": True})
    assert fresh.evaluate(lambda: iter([({"x": X}, Y)]))["avg"] == 0.0
    model_dir = str(tmp_path / "later")
    est.Estimator(_evaluated_average_model_fn, model_dir, params={"averaged": False}).train(
        batches, max_steps=1)
    later = est.Estimator(_evaluated_average_model_fn, model_dir, params={"averaged": True})
    with caplog.at_level("WARNING"):
        later.train(batches, max_steps=2)
    assert "holds no average of mse (it was written before it began)" in caplog.text
    assert later.get_variable_value("mse/avg") == pytest.approx(
        0.1 * later.evaluate(lambda: iter([({"x": X[:4]}, Y[:4])]), steps=1,
                             checkpoint_path=os.path.join(model_dir, "model.ckpt-1"))["loss"],
        rel=1e-5)
