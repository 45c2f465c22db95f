"""Estimator train/evaluate/predict semantics, specs, resume and warm start."""
import json
import os
import sys
import types

import numpy as np
import pytest
import torch

import estimator as est
import hooks
from models import regression_input_fn, regression_model_fn, regression_data


def make(tmp_path, name="m", **config):
    config.setdefault("save_checkpoints_steps", 10)
    return est.Estimator(regression_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / name), **config), params={"lr": 0.1})


# -- train --------------------------------------------------------------------
def test_train_steps_relative_max_steps_absolute(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=5)
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 5
    e.train(regression_input_fn(), steps=5)
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 10
    e.train(regression_input_fn(), max_steps=12)
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 12


def test_max_steps_already_reached_is_a_noop(tmp_path, caplog):
    e = make(tmp_path)
    e.train(regression_input_fn(), max_steps=5)
    before = os.path.getmtime(e.latest_checkpoint())
    with caplog.at_level("INFO"):
        e.train(regression_input_fn(), max_steps=5)
    assert "max_steps has already saved" in caplog.text
    assert os.path.getmtime(e.latest_checkpoint()) == before


def test_training_stops_when_input_runs_out(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(batch_size=32, n=96, repeat=False), steps=100)
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 1, "max_steps": 2}, "Can not provide both steps and max_steps"),
    ({"steps": 0}, "Must specify steps > 0"),
    ({"max_steps": -1}, "Must specify max_steps > 0"),
])
def test_bad_train_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path).train(regression_input_fn(), **kwargs)


def test_training_learns_and_evaluate_is_exact(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=300)
    assert e.evaluate(regression_input_fn(repeat=False))["mae"] < 0.05
    e = make(tmp_path, "short")
    e.train(regression_input_fn(), steps=10)
    x, y = regression_data(100, seed=1)
    batches = [({"x": x[i:i + 30]}, y[i:i + 30]) for i in range(0, 100, 30)]  # uneven
    result = e.evaluate(lambda: batches)
    assert result["global_step"] == 10
    assert list(result) == ["loss", "mae", "global_step"]   # TF's: sorted, global_step last
    with torch.no_grad():
        w = torch.tensor(e.get_variable_value("linear/weight"))
        b = torch.tensor(e.get_variable_value("linear/bias"))
        pred = torch.tensor(x) @ w.T + b
    assert result["mae"] == pytest.approx(float((pred - torch.tensor(y)).abs().mean()), rel=1e-5)
    batch_losses = [float(((pred[i:i + 30] - torch.tensor(y[i:i + 30])) ** 2).mean())
                    for i in range(0, 100, 30)]
    assert result["loss"] == pytest.approx(np.mean(batch_losses), rel=1e-5)  # TF: mean of batches


def test_evaluate_steps_limits_batches(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=2)
    seen = []

    def input_fn():
        for b in regression_input_fn(n=320, repeat=False)():
            seen.append(1)
            yield b
    e.evaluate(input_fn, steps=3)
    assert len(seen) <= 4


def test_named_checkpoint_that_does_not_exist_is_an_error(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=2)
    with pytest.raises(ValueError, match="does not exist"):
        e.evaluate(regression_input_fn(repeat=False), checkpoint_path=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="does not exist"):
        list(e.predict(lambda: [{"x": np.zeros((2, 3), np.float32)}],
                       checkpoint_path=str(tmp_path / "nope")))


# -- predict ------------------------------------------------------------------
def test_predict_single_examples_keys_and_batches(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=200)
    x = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float32)
    preds = list(e.predict(lambda: [{"x": x[:2]}, {"x": x[2:]}]))
    assert len(preds) == 3 and set(preds[0]) == {"y"}
    np.testing.assert_allclose([p["y"][0] for p in preds], [3.0, -2.0, 1.5], atol=0.1)
    batches = list(e.predict(lambda: [{"x": x}], yield_single_examples=False))
    assert batches[0]["y"].shape == (3, 1)
    with pytest.raises(ValueError, match=r"Expected to run at least one output from \['y'\], "
                                         r"provided \['nope'\]"):
        list(e.predict(lambda: [{"x": x}], predict_keys=["nope"]))


def test_predict_accepts_feature_label_pairs_and_tensors(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=2)
    x = torch.zeros(4, 3)
    assert len(list(e.predict(lambda: [({"x": x}, torch.zeros(4, 1))]))) == 4


# -- specs ----------------------------------------------------------------------
def bad_model_fn(kind):
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        out = net(features["x"])
        loss = torch.nn.functional.mse_loss(out, labels)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        if kind == "no_loss":
            return est.EstimatorSpec(mode, train_op=opt)
        if kind == "no_train_op":
            return est.EstimatorSpec(mode, loss=loss)
        if kind == "vector_loss":
            return est.EstimatorSpec(mode, loss=(out - labels) ** 2, train_op=opt)
        if kind == "not_a_spec":
            return loss
        if kind == "wrong_mode":
            return est.EstimatorSpec(est.ModeKeys.EVAL, loss=loss)
        if kind == "scaffold_init_fn":   # (a port's tf.train.Scaffold(init_fn=...))
            scaffold = types.SimpleNamespace(init_fn=lambda scaffold, session: None,
                                             saver=None, init_op=None)
            return est.EstimatorSpec(mode, loss=loss, train_op=opt, scaffold=scaffold)
    return model_fn


@pytest.mark.parametrize("kind, message", [
    ("no_loss", r"mode='train'.*missing field `loss`"),
    ("no_train_op", r"mode='train'.*missing field `train_op`"),
    ("vector_loss", r"mode='train'.*`loss` must be a scalar tensor \(or one of one element\), "
                    r"got a tensor of shape"),
    ("not_a_spec", r"must return an EstimatorSpec, got Tensor"),
    ("wrong_mode", r"called in mode 'train' but returned an EstimatorSpec for mode 'eval'"),
    ("scaffold_init_fn", r"scaffold's init_fn cannot run here \(there is no graph or "
                         r"tf.Session\); instead: init_fn: load pretrained values in "
                         r"get_module's factory, or warm_start_from\. Leave scaffold out"),
])
def test_bad_spec_is_an_error_before_anything_is_written(tmp_path, kind, message):
    model_dir = tmp_path / "bad"
    e = est.Estimator(bad_model_fn(kind), model_dir=str(model_dir))
    with pytest.raises((ValueError, TypeError), match=message):
        e.train(regression_input_fn(), steps=3)
    assert not model_dir.exists() or not os.listdir(model_dir)


def test_an_empty_scaffold_is_accepted():
    spec = est.EstimatorSpec("infer", predictions={"y": torch.ones(2)},
                             scaffold=types.SimpleNamespace(init_fn=None, saver=None))
    assert spec.scaffold is not None


def test_a_loss_of_one_element_is_a_scalar_as_in_tf(tmp_path):
    """`tf.reduce_mean(tf.square(pred - y), 0)` over [N, 1] predictions is a
    loss of shape [1]: TF's EstimatorSpec reshapes it to a scalar (it was an
    error here)."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        loss = ((net(features["x"]) - labels) ** 2).mean(0)   # shape [1]
        return est.EstimatorSpec(mode, loss=loss[None] if mode == "eval" else loss,
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    spec = est.EstimatorSpec("eval", loss=torch.ones(1, 1))
    assert spec.loss.shape == ()
    with pytest.raises(ValueError, match="mode of EstimatorSpec cannot be changed"):   # TF's
        spec._replace(mode="train")
    e.train(regression_input_fn(), steps=3)
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 3
    result = e.evaluate(regression_input_fn(), steps=2)   # a [1, 1] loss
    assert isinstance(result["loss"], np.float32)   # as TF


def test_model_dir_may_be_a_path(tmp_path):
    """As TF's (path_to_str): train failed on a pathlib.Path model_dir."""
    e = est.Estimator(regression_model_fn, model_dir=tmp_path / "m", params={"lr": 0.01})
    assert e.model_dir == str(tmp_path / "m")
    e.train(regression_input_fn(), steps=2)
    assert e.evaluate(regression_input_fn(), steps=1)["global_step"] == 2


def test_log_lines_read_as_tf_s(tmp_path, caplog):
    """TF prints the loss and metrics as float32 (`loss = 5.0902576`, not
    `5.090257644653320`) and saves "into <model_dir>/model.ckpt"."""
    import logging
    import re
    e = est.Estimator(regression_model_fn, model_dir=str(tmp_path), params={})
    with caplog.at_level(logging.INFO):
        e.train(regression_input_fn(), steps=3)
        e.evaluate(regression_input_fn(), steps=2)
    text = caplog.text
    assert f"Saving checkpoints for 3 into {os.path.join(str(tmp_path), 'model.ckpt')}." in text
    loss = re.search(r"Loss for final step: (\S+)\.$", text, re.M).group(1)
    assert loss == str(np.float32(loss))   # float32's shortest digits
    saved = re.search(r"Saving dict for global step 3: global_step = 3, loss = (\S+), "
                      r"mae = (\S+)$", text, re.M)
    assert all(v == str(np.float32(v)) for v in saved.groups())


def test_a_model_dir_that_is_a_file_is_named_at_once(tmp_path):
    """It failed at the first summary, with 'File exists writing the summaries'."""
    path = tmp_path / "data.csv"
    path.write_text("x\n1\n")
    for kwargs in ({"model_dir": str(path)}, {"config": est.RunConfig(model_dir=str(path))}):
        with pytest.raises(ValueError, match=f"model_dir '{path}' is a file, not a directory"):
            est.Estimator(regression_model_fn, **kwargs)
    assert path.read_text() == "x\n1\n"


def test_predict_spec_needs_predictions():
    with pytest.raises(ValueError, match=r"mode='infer'.*missing field `predictions`"):
        est.EstimatorSpec(est.ModeKeys.PREDICT)
    with pytest.raises(TypeError, match=r"predictions\['a'\] must be a tensor"):
        est.EstimatorSpec(est.ModeKeys.PREDICT, predictions={"a": [1]})
    y = torch.ones(2, 1)   # it said predictions['predictions'] of a list
    with pytest.raises(TypeError, match=r"^EstimatorSpec\(mode='infer'\): predictions must be "
                       r"a tensor or a dict of tensors \(or strings\), got list; name them: "
                       r"\{'name': tensor, ...\}$"):
        est.EstimatorSpec(est.ModeKeys.PREDICT, predictions=[y, y * 2])
    est.EstimatorSpec(est.ModeKeys.PREDICT, predictions=["a", "b"])   # strings: as before


def test_model_fn_arguments_follow_its_signature(tmp_path):
    seen = {}

    def model_fn(features, labels, mode, config, params):
        seen.update(config=config, params=params)
        return regression_model_fn(features, labels, mode, params)
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "sig"), params={"lr": 0.01})
    e.train(regression_input_fn(), steps=1)
    assert seen["params"] == {"lr": 0.01} and seen["config"].model_dir == str(tmp_path / "sig")

    def minimal(features):
        return est.EstimatorSpec(est.ModeKeys.PREDICT, predictions=features["x"])
    out = list(est.Estimator(minimal, model_dir=str(tmp_path / "min")).predict(
        lambda: [{"x": torch.ones(2, 3)}]))
    assert len(out) == 2 and out[0].shape == (3,)
    with pytest.raises(ValueError, match="unexpected arguments"):
        est.Estimator(lambda features, foo: None)


def _model_fn_with(features, labels, mode, params=None, hidden=None, seen=None):
    seen.append((mode, hidden, params, sorted(features)))
    return regression_model_fn(features, labels, mode, {"lr": 0.01})


@pytest.mark.parametrize("signature", ["mode_features_labels", "labels_features_mode",
                                       "kwargs", "args", "partial"])
def test_model_fn_arguments_are_passed_by_name_as_tf_does(tmp_path, signature):
    """TF calls model_fn(features=..., labels=..., mode=...) by name: any order,
    with *args / **kwargs, or a functools.partial binding more (all refused
    here before, as unexpected arguments)."""
    import functools
    seen = []
    model_fns = {
        "mode_features_labels": lambda mode, features, labels: _model_fn_with(
            features, labels, mode, seen=seen),
        "labels_features_mode": lambda labels, features, mode: _model_fn_with(
            features, labels, mode, seen=seen),
        "kwargs": lambda features, labels, mode, **kwargs: _model_fn_with(
            features, labels, mode, params=kwargs, seen=seen),   # (TF passes none there)
        "args": lambda features, labels, mode, *args: _model_fn_with(
            features, labels, mode, params=args, seen=seen),
        "partial": functools.partial(_model_fn_with, hidden=5, seen=seen),
    }
    e = est.Estimator(model_fns[signature], model_dir=str(tmp_path), params={"lr": 0.01}
                      if signature == "partial" else None)
    e.train(regression_input_fn(), steps=1)
    mode, hidden, params, keys = seen[-1]
    assert mode == est.ModeKeys.TRAIN and keys == ["x"]
    assert hidden == (5 if signature == "partial" else None)
    assert params == ({"lr": 0.01} if signature == "partial" else
                      {} if signature == "kwargs" else () if signature == "args" else None)


def _tf_model_fn_args():
    from paths import FIXTURES
    with open(os.path.join(FIXTURES, "tf_model_fn_args.json"), encoding="utf-8") as f:
        return json.load(f)["cases"]


@pytest.mark.parametrize("case", sorted(_tf_model_fn_args()))
def test_model_fn_arguments_are_checked_against_what_it_is_given_as_tf(tmp_path, case):
    """TF's two checks (tf_model_fn_args.json): params given (even {}) to a
    model_fn without `params`, labels from the input_fn to a model_fn
    without `labels`. Both were accepted: the params unused, the labels
    dropped, without a word."""
    import re

    def no_params(features, labels, mode):
        return regression_model_fn(features, labels, mode, {"lr": 0.1})

    def no_labels(features, mode):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        return est.EstimatorSpec(mode, loss=net(features["x"]).mean(), train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    with_labels = regression_input_fn()
    build, input_fn = {
        "params_to_a_model_fn_without_params": (
            lambda: est.Estimator(no_params, str(tmp_path), params={"lr": 0.1}), with_labels),
        "empty_params_to_a_model_fn_without_params": (
            lambda: est.Estimator(no_params, str(tmp_path), params={}), with_labels),
        "labels_to_a_model_fn_without_labels": (
            lambda: est.Estimator(no_labels, str(tmp_path)), with_labels),
        "no_labels_to_a_model_fn_without_labels": (
            lambda: est.Estimator(no_labels, str(tmp_path)),
            lambda: [{"x": torch.ones(4, 3)}] * 2),
    }[case]
    tf_error = _tf_model_fn_args()[case]
    if tf_error is None:
        build().train(input_fn, steps=1)
        return
    # TF names the function by its repr; here by where it is defined
    expected = ".*no_params at .*:[0-9]+".join(
        map(re.escape, re.split(r"<function no_params at 0x[0-9a-f]+>", tf_error["message"])))
    with pytest.raises(ValueError, match="^" + expected + "$"):
        build().train(input_fn, steps=1)


def test_an_input_of_features_alone_trains_and_evaluates_with_labels_none(tmp_path):
    """An autoencoder's input_fn yields features alone, as TF allows in every
    mode (labels None); it was refused in TRAIN and EVAL. A tuple of another
    length than 2 stays an error."""
    def model_fn(features, labels, mode):
        assert labels is None
        net = est.get_module("auto", lambda: torch.nn.Sequential(
            torch.nn.Linear(3, 2), torch.nn.Linear(2, 3)))
        loss = torch.nn.functional.mse_loss(net(features["x"]), features["x"])
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    e = est.Estimator(model_fn, str(tmp_path))
    e.train(lambda: [{"x": x}] * 5, max_steps=5)
    assert e.evaluate(lambda: [{"x": x}])["global_step"] == 5
    with pytest.raises(ValueError, match=r"In mode 'train' each batch must be \(features, "
                                         r"labels\) or features alone, got a tuple of length 3"):
        e.train(lambda: [({"x": x}, x, x)], steps=1)
    with pytest.raises(ValueError, match=r"In mode 'train' each batch must be \(features, "
                                         r"labels\) or features alone, got None$"):
        e.train(lambda: [None], steps=1)   # (it was the model_fn's TypeError on None)


_STRINGS_NOTE = ("(features ['city'] are strings, given to model_fn as numpy arrays on the "
                 "host: map them to ids (a feature column, a vocabulary) before a torch layer)")


def _notes_of_a_linear_layer_fed(tmp_path, features, width):
    """The notes on the TypeError of a Linear layer given the first of
    `features` in a first training step."""
    def model_fn(features, labels, mode):
        net = est.get_module("linear", lambda: torch.nn.Linear(width, 1))
        return est.EstimatorSpec(mode, loss=net(next(iter(features.values()))).mean(),
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=1)))
    with pytest.raises(TypeError, match="must be Tensor") as info:
        est.Estimator(model_fn, str(tmp_path)).train(
            lambda: [(features, torch.ones(2, 1))], steps=1)
    return info.value.__notes__


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes: Python 3.11")
def test_strings_given_to_a_torch_layer_are_named_in_its_error(tmp_path):
    """torch said only "linear(): argument 'input' must be Tensor, not numpy.ndarray"."""
    assert _notes_of_a_linear_layer_fed(tmp_path, {"city": np.array([["a"], ["b"]])}, 1) == [
        _STRINGS_NOTE]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes: Python 3.11")
def test_python_lists_of_numbers_given_to_a_torch_layer_are_not_called_strings(tmp_path):
    """A list of floats was said to be strings, to map to ids."""
    features = {"x": [[1.0, 2.0], [3.0, 4.0]], "city": [["a"], ["b"]]}
    assert _notes_of_a_linear_layer_fed(tmp_path, features, 2) == [
        _STRINGS_NOTE,
        "(features ['x'] are Python lists, given to model_fn as they are: have the input_fn "
        "give arrays or tensors, e.g. np.asarray(values, np.float32))"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes: Python 3.11")
def test_a_checkpoint_that_does_not_fit_says_nothing_of_string_features(tmp_path):
    """A rerun whose model no longer fits the checkpoint was told to map its
    string features to ids, which it did."""
    def model_fn(features, labels, mode, params):
        ids = torch.tensor([["ab".index(c) for c in row] for row in features["city"]]).float()
        net = est.get_module("linear", lambda: torch.nn.Linear(1, params["units"]))
        return est.EstimatorSpec(mode, loss=net(ids).mean(),
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=1)))

    def input_fn():
        return [({"city": np.array([["a"], ["b"]])}, torch.ones(2, 1))]
    est.Estimator(model_fn, str(tmp_path), params={"units": 1}).train(input_fn, steps=1)
    with pytest.raises(Exception, match="linear") as info:
        est.Estimator(model_fn, str(tmp_path), params={"units": 2}).train(input_fn, steps=1)
    assert not any("strings" in note for note in getattr(info.value, "__notes__", []))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes: Python 3.11")
def test_a_gradient_penalty_in_evaluation_is_told_to_enable_gradients(tmp_path):
    """WGAN-GP's loss takes gradients; torch's error under evaluate's
    no_grad said only "element 0 of tensors does not require grad" (GAN
    port probe; TF's tf.gradients runs in EVAL: eval loss 2.963773)."""
    def model_fn(features, labels, mode):
        critic = est.get_module("critic", lambda: torch.nn.Linear(2, 1))
        x = features["x"].requires_grad_(True)
        grad, = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
        loss = ((grad.norm(dim=1) - 1) ** 2).mean() + critic(x).mean()
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    e = est.Estimator(model_fn, str(tmp_path))
    e.train(lambda: [({"x": torch.ones(4, 2)}, None)], steps=1)
    with pytest.raises(RuntimeError, match="does not require grad") as info:
        e.evaluate(lambda: [({"x": torch.ones(4, 2)}, None)])
    assert any("in eval the model_fn runs under torch.no_grad()" in note
               for note in info.value.__notes__)


def test_training_between_two_predictions_of_an_open_generator(tmp_path):
    """A predict generator waiting between two predictions held torch.no_grad
    over its caller: a `train` there failed ("the loss has no gradient"), and
    any torch work of the caller's ran without gradients."""
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=3)
    predictions = e.predict(lambda: [{"x": torch.ones(2, 3)}] * 2)
    next(predictions)
    assert torch.is_grad_enabled()
    e.train(regression_input_fn(), steps=2)
    assert len(list(predictions)) == 3
    assert e.get_variable_value("global_step") == 5
    with torch.no_grad():   # a caller's no_grad is its own, kept while predict waits
        inside = e.predict(lambda: [{"x": torch.ones(2, 3)}] * 2)
        next(inside)
        assert not torch.is_grad_enabled()
    inside.close()   # (closed later, it put back the no_grad it found at its first next())
    assert torch.is_grad_enabled()


def test_a_predict_generator_closed_during_training_leaves_the_training_s_scope(tmp_path):
    """Its scopes were popped off the top of the stacks, wherever they were: a
    waiting predict generator collected while another train ran took that
    training's model scope and strategy away."""
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=2)
    waiting = e.predict(lambda: [{"x": torch.ones(2, 3)}] * 2)
    next(waiting)
    other = make(tmp_path, name="other")

    class CloseIt(hooks.SessionRunHook):
        def after_run(self, run_context, run_values):
            waiting.close()
    other.train(regression_input_fn(), steps=4, hooks=[CloseIt()])
    assert other.get_variable_value("global_step") == 4


@pytest.mark.parametrize("seed", [None, 42])
def test_train_calls_in_one_process_do_not_rewind_the_callers_random_draws(tmp_path, seed):
    """Each train call put back the random state its checkpoint saved, so the
    caller's draws between train calls came out the same every time (a
    np.random.permutation of the next epoch's data, a random.shuffle): TF's
    training never touches them. Training in this process ending at that
    checkpoint goes on with the process's stream; a new Estimator on the
    model_dir too; a restart (another process) still restores it."""
    import random
    draws = []
    for _ in range(3):
        e = make(tmp_path, tf_random_seed=seed)   # (a new object each time, as a notebook)
        e.train(regression_input_fn(), steps=2)
        draws.append((np.random.rand(), random.random(), torch.rand(1).item()))
    assert len(set(draws)) == 3, draws


def test_a_seeded_train_leaves_the_caller_s_random_generators_as_they_were(tmp_path):
    """tf_random_seed seeded Python's, numpy's and torch's generators and left
    them so: a random search drawing between train calls drew the same values
    each time. TF's seed is its graph's; here it seeds the training's stream,
    which the checkpoint carries on."""
    import random
    from estimator import checkpoint
    before = (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state())
    for _ in range(2):
        make(tmp_path, tf_random_seed=3).train(regression_input_fn(), steps=2)
    after = (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state())
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])
    saved = checkpoint.load(make(tmp_path).latest_checkpoint())["rng"]
    assert not torch.equal(saved["torch"], after[2])   # (the training's own stream)


def test_a_waiting_predict_with_read_ahead_leaves_torch_s_threads(tmp_path):
    """Reading ahead set torch's threads one lower while a predict generator
    waited for its caller (the caller's work ran on half the cores here), and
    put back the count it found at its end, over one the caller set since."""
    e = make(tmp_path, experimental_prefetch_batches=2)
    e.train(regression_input_fn(), steps=2)
    threads = torch.get_num_threads()
    waiting = e.predict(lambda: [{"x": torch.ones(2, 3)}] * 3)
    next(waiting)
    assert torch.get_num_threads() == threads
    waiting.close()
    from estimator import _inputs
    reading = _inputs.read_ahead(iter([1, 2, 3]), 2)
    next(reading)
    torch.set_num_threads(threads + 1)   # the caller's own choice, made meanwhile
    try:
        reading.close()
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def _scalar_values(directory, tag) -> list:
    """Every value of `tag` in the event files of `directory`, in order."""
    import glob
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    return [v.simple_value for path in sorted(glob.glob(os.path.join(directory, "events.*")))
            for event in LegacyEventFileLoader(path).Load()
            for v in event.summary.value if v.tag == tag]


@pytest.mark.parametrize("mode", ["evaluate", "predict"])
def test_a_summary_saver_hook_in_evaluation_or_prediction_saves_the_first_batch_too(
        tmp_path, mode):
    """As TF 2.15 (a probe running both): the model_fn's summaries of every
    batch, the first included; the first was lost (the first batch's
    model_fn call came before any hook asked for summaries), so evaluate
    (steps=1) saved none."""
    def model_fn(features, labels, mode):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        predictions = net(features["x"])
        est.summary.scalar("pred_mean", predictions.mean())
        saver = hooks.SummarySaverHook(save_steps=1, output_dir=str(tmp_path / "summaries"),
                                       summary_op="pred_mean")
        loss = None if labels is None else ((predictions - labels) ** 2).mean()
        return est.EstimatorSpec(mode, loss=loss, predictions={"p": predictions},
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0)),
                                 evaluation_hooks=[saver], prediction_hooks=[saver])
    e = est.Estimator(model_fn, str(tmp_path / "m"))
    batches = [({"x": torch.full((2, 3), float(i))}, torch.ones(2, 1)) for i in range(3)]
    e.train(lambda: batches, steps=1)
    if mode == "evaluate":
        e.evaluate(lambda: batches)
    else:
        list(e.predict(lambda: [features for features, _ in batches]))
    values = _scalar_values(str(tmp_path / "summaries"), "pred_mean")
    weight, bias = e.get_variable_value("linear/weight"), e.get_variable_value("linear/bias")
    expected = [float((features["x"].numpy() @ weight.T + bias).mean())
                for features, _ in batches]
    assert values == pytest.approx(expected, rel=1e-6)
    if mode == "evaluate":
        e.evaluate(lambda: batches, steps=1)
        assert _scalar_values(str(tmp_path / "summaries"), "pred_mean") == pytest.approx(
            expected + expected[:1], rel=1e-6)


def test_a_model_fn_returning_no_spec_is_named(tmp_path):
    def model_fn(features):
        pass
    with pytest.raises(TypeError, match=r"model_fn in mode 'infer' must return an "
                                        r"EstimatorSpec, got NoneType \(model_fn: "
                                        r".*model_fn at .*test_estimator.py:[0-9]+\)"):
        list(est.Estimator(model_fn, str(tmp_path)).predict(lambda: [{"x": torch.ones(2, 3)}]))


def test_custom_train_op_callable(tmp_path):
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))

        def step():
            opt.zero_grad()
            loss.backward()
            opt.step()
        return est.EstimatorSpec(mode, loss=loss, train_op=step)
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "c"))
    e.train(regression_input_fn(), steps=50)
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 50
    assert abs(e.get_variable_value("net/weight")[0, 0] - 2.0) < 0.5


@pytest.mark.parametrize("zeroes", [True, False])
def test_a_train_op_stepping_every_k_calls_accumulates_as_a_plain_loop(tmp_path, zeroes):
    """PyTorch's gradient accumulation in a callable train_op (backward every
    call, step every k-th): the framework frees only the gradients of the
    optimizers that stepped, so the plain loop's weights come out (before, it
    freed them all after each call: each step saw the last batch's only)."""
    k, g = 3, torch.Generator().manual_seed(7)
    xs, ys = torch.randn(4 * k, 8, 4, generator=g), torch.randn(4 * k, 8, 1, generator=g)

    def make():
        return torch.nn.Linear(4, 1)
    torch.manual_seed(0)
    net = make()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for i in range(4 * k):
        (torch.nn.functional.mse_loss(net(xs[i]), ys[i]) / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
    calls = [0]

    def model_fn(features, labels, mode):
        module = est.get_module("net", make)
        loss = torch.nn.functional.mse_loss(module(features), labels)
        optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))

        def train_op():
            (loss / k).backward()
            calls[0] += 1
            if calls[0] % k == 0:
                optimizer.step()
                if zeroes:
                    optimizer.zero_grad()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path), tf_random_seed=0))
    e.train(lambda: list(zip(xs, ys)), steps=4 * k)
    assert e.get_variable_value("global_step") == 4 * k    # calls, as TF's (one per batch)
    torch.testing.assert_close(torch.as_tensor(e.get_variable_value("net/weight")),
                               net.weight.detach(), rtol=0, atol=1e-6)


def test_a_train_op_that_cannot_train_says_why(tmp_path):
    """An optimizer factory given as train_op, and a detached loss, failed
    with torch's words from deep inside (a missing argument 'p'; "element 0
    of tensors does not require grad")."""
    def model_fn(train_op, detach=False):
        def fn(features, labels, mode):
            net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
            loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
            return est.EstimatorSpec(mode, loss=loss.detach() if detach else loss,
                                     train_op=train_op())
        return fn
    factory = est.Estimator(model_fn(lambda: lambda p: torch.optim.SGD(p, lr=0.1)),
                            model_dir=str(tmp_path / "f"))
    with pytest.raises(TypeError, match=r"a callable `train_op` is called with no arguments.*"
                                        r"<lambda>\(p\) takes some.*est.get_optimizer"):
        factory.train(regression_input_fn(), steps=1)
    detached = est.Estimator(model_fn(lambda: est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)), detach=True), model_dir=str(tmp_path / "d"))
    with pytest.raises(ValueError, match="the loss has no gradient.*detached"):
        detached.train(regression_input_fn(), steps=1)


# -- resume and warm start ---------------------------------------------------------
def test_resume_restores_weights_optimizer_and_step(tmp_path):
    model_dir = tmp_path / "r"
    cfg = est.RunConfig(model_dir=str(model_dir), save_checkpoints_steps=100, tf_random_seed=3)
    a = est.Estimator(regression_model_fn, config=cfg, params={"lr": 0.05, "momentum": 0.9})
    a.train(regression_input_fn(), steps=7)
    a.train(regression_input_fn(), steps=7)   # resumes; its input starts again
    first7 = [b for _, b in zip(range(7), regression_input_fn()())]
    straight = est.Estimator(regression_model_fn, config=cfg.replace(
        model_dir=str(tmp_path / "s")), params={"lr": 0.05, "momentum": 0.9})
    straight.train(lambda: first7 + first7, steps=14)   # one run, same batches
    for name in ("linear/weight", "linear/bias", "optimizer/linear/weight/momentum_buffer"):
        np.testing.assert_array_equal(a.get_variable_value(name), straight.get_variable_value(name))
    assert "global_step" in a.get_variable_names()
    assert a.get_variable_value("global_step") == 14


@pytest.mark.parametrize("background", [True, False])
def test_a_dropout_batch_norm_model_resumed_trains_as_one_run(tmp_path, background):
    """A restart continues exactly from the checkpoint: the dropout masks
    (the RNG saved with it), batch-norm's moving statistics, Adam's slots and
    step. Float64 input with a short last batch per epoch; 6 + 6 steps in two
    train calls give every variable of one 12-step call."""
    from models import bn_dropout_model_fn, iris_like_input_fn
    batches = iris_like_input_fn(epochs=3)()   # 12 batches, every 4th of 4 rows

    def estimator(name):
        return est.Estimator(bn_dropout_model_fn, params={"width": 16}, config=est.RunConfig(
            model_dir=str(tmp_path / name), save_checkpoints_steps=4, tf_random_seed=5,
            experimental_async_checkpoint=background))
    split = estimator("split")
    split.train(lambda: batches[:6], steps=6)
    split.train(lambda: batches[6:], steps=6)
    one = estimator("one")
    one.train(lambda: batches, steps=12)
    names = one.get_variable_names()
    assert {"dnn/1/running_mean", "dnn/1/num_batches_tracked", "optimizer/dnn/0/weight/exp_avg",
            "global_step"} <= set(names)
    assert split.get_variable_names() == names
    for name in names:
        np.testing.assert_array_equal(split.get_variable_value(name),
                                      one.get_variable_value(name), err_msg=name)
    assert one.get_variable_value("dnn/1/num_batches_tracked") == 12


def test_resume_with_different_model_is_a_clear_error(tmp_path):
    e = make(tmp_path)
    e.train(regression_input_fn(), steps=2)

    def other(features, labels, mode):
        net = est.get_module("other", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    with pytest.raises(ValueError, match="has no module 'other'"):
        est.Estimator(other, model_dir=e.model_dir).train(regression_input_fn(), steps=1)


def test_warm_start_from_path_and_settings(tmp_path, caplog):
    src = make(tmp_path, "src")
    src.train(regression_input_fn(), steps=100)
    w = src.get_variable_value("linear/weight")
    with caplog.at_level("INFO"):
        dst = est.Estimator(regression_model_fn, model_dir=str(tmp_path / "dst"),
                            params={"lr": 0.0}, warm_start_from=src.model_dir)
        dst.train(regression_input_fn(), steps=1)
    assert "Warm-starting from" in caplog.text
    np.testing.assert_allclose(dst.get_variable_value("linear/weight"), w)
    assert dst.get_variable_value("global_step") == 1   # the step is not warm-started

    only_bias = est.WarmStartSettings(src.latest_checkpoint(), vars_to_warm_start=["linear/bias"])
    part = est.Estimator(regression_model_fn, model_dir=str(tmp_path / "part"),
                         params={"lr": 0.0}, warm_start_from=only_bias)
    part.train(regression_input_fn(), steps=1)
    np.testing.assert_allclose(part.get_variable_value("linear/bias"),
                               src.get_variable_value("linear/bias"))
    assert not np.allclose(part.get_variable_value("linear/weight"), w)


def test_warm_start_whose_pattern_matches_no_variable_says_so(tmp_path, caplog):
    """A scope named as TF named it ("dnn/.*" where the module is "linear")
    warm-started nothing without a word; now a warning listing the variables."""
    src = make(tmp_path, "src")
    src.train(regression_input_fn(), steps=5)
    for pattern, warned in (("dnn/.*", True), ("linear/.*", False)):
        caplog.clear()
        dst = est.Estimator(regression_model_fn, model_dir=str(tmp_path / pattern[:3]),
                            warm_start_from=est.WarmStartSettings(
                                src.model_dir, vars_to_warm_start=pattern))
        with caplog.at_level("INFO"):
            dst.train(regression_input_fn(), steps=1)
        said = (f"vars_to_warm_start '{pattern}' matched none of the model's variables, so "
                f"none was warm-started from {src.latest_checkpoint()}; the variables are "
                "['linear/weight', 'linear/bias']")
        assert (said in caplog.text) == warned, caplog.text


def test_warm_start_renamed_variables(tmp_path):
    src = make(tmp_path, "src")
    src.train(regression_input_fn(), steps=20)

    def renamed(features, labels, mode, params):
        net = est.get_module("new", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.0)))
    settings = est.WarmStartSettings(src.model_dir, vars_to_warm_start=["new/weight"],
                                     var_name_to_prev_var_name={"new/weight": "linear/weight"})
    dst = est.Estimator(renamed, model_dir=str(tmp_path / "dst"), warm_start_from=settings)
    dst.train(regression_input_fn(), steps=1)
    np.testing.assert_allclose(dst.get_variable_value("new/weight"),
                               src.get_variable_value("linear/weight"))


def test_warm_start_from_missing_checkpoint_is_an_error(tmp_path):
    e = est.Estimator(regression_model_fn, model_dir=str(tmp_path / "d"),
                      warm_start_from=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=f"^warm_start_from: Checkpoint '{tmp_path}/missing' "
                       "does not exist$"):
        e.train(regression_input_fn(), steps=1)
    assert not (tmp_path / "d").exists() or not os.listdir(tmp_path / "d")
    (tmp_path / "empty").mkdir()
    e = est.Estimator(regression_model_fn, model_dir=str(tmp_path / "d"),
                      warm_start_from=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="^warm_start_from: No checkpoint found in directory"):
        e.evaluate(regression_input_fn(repeat=False))


def test_resume_wins_over_warm_start(tmp_path, caplog):
    src = make(tmp_path, "src")
    src.train(regression_input_fn(), steps=3)
    e = est.Estimator(regression_model_fn, model_dir=str(tmp_path / "d"), params={"lr": 0.1},
                      warm_start_from=src.model_dir)
    e.train(regression_input_fn(), steps=2)
    caplog.clear()   # (an earlier test may have left the root logger at INFO)
    with caplog.at_level("INFO"):
        e.train(regression_input_fn(), steps=2)
    assert "Resuming from" in caplog.text and "Warm-starting" not in caplog.text
    assert e.get_variable_value("global_step") == 4


def test_warm_start_applies_to_predict_evaluate_and_export_before_any_training(tmp_path, caplog):
    """TF's evaluate, predict and export warm-start when model_dir has no
    checkpoint (_maybe_warm_start; the export is of the warm-start
    checkpoint). They used the initial model, and the export raised."""
    src = make(tmp_path, "src")
    src.train(regression_input_fn(), steps=20)
    e = est.Estimator(regression_model_fn, model_dir=str(tmp_path / "d"), params={"lr": 0.1},
                      warm_start_from=src.model_dir)
    x, _ = regression_data(8)
    want = np.stack([p["y"] for p in src.predict(lambda: [{"x": x}])])
    np.testing.assert_allclose(np.stack([p["y"] for p in e.predict(lambda: [{"x": x}])]), want)
    data = regression_input_fn(repeat=False)
    got = e.evaluate(data)
    assert got["loss"] == pytest.approx(src.evaluate(data)["loss"], rel=1e-6)
    assert got["global_step"] == 0   # (as TF: the step is not warm-started)
    with caplog.at_level("INFO", logger="estimator.export"):
        export_dir = e.export_saved_model(str(tmp_path / "export"),
                                          est.export.build_raw_serving_input_receiver_fn(
                                              {"x": torch.zeros(1, 3)}))
    # (it said "Exported model.ckpt-20 (global step 0)", naming another model_dir's file)
    assert (f"Exported the model warm-started from {src.model_dir}/model.ckpt-20 (global step "
            f"0) to {export_dir}") in caplog.text
    served = est.export.load(export_dir).signatures["serving_default"](x=torch.tensor(x))
    np.testing.assert_allclose(served["y"].numpy(), want, rtol=1e-6)
    assert e.latest_checkpoint() is None


# -- inputs -----------------------------------------------------------------------
def test_input_fn_signatures_and_types(tmp_path):
    e = make(tmp_path)
    x, y = regression_data(64)
    got = {}

    def with_params(params):
        got["params"] = params
        return [({"x": torch.tensor(x[:32])}, torch.tensor(y[:32]))]

    def with_context(input_context):
        got["ctx"] = input_context
        return [(x[:32], y[:32])] and [({"x": x[:32]}, y[:32])]
    e.train(with_params, steps=1)
    e.train(with_context, steps=1)
    assert got["params"] == {"lr": 0.1}
    assert got["ctx"].num_input_pipelines == 1 and got["ctx"].input_pipeline_id == 0
    with pytest.raises(TypeError, match="must return an iterable"):
        e.train(lambda: 3, steps=1)
    # features alone: labels None, as TF; the model_fn's error says where they went
    with pytest.raises(AttributeError, match="'NoneType' object") as info:
        e.train(lambda: [{"x": x}], steps=1)
    assert "the input_fn gave features alone, so model_fn got labels=None" in \
        getattr(info.value, "__notes__", ["(Python < 3.11: no notes)"])[0] or \
        not hasattr(info.value, "add_note")


def test_an_error_in_a_dataset_s_own_iter_is_not_taken_for_a_non_iterable(tmp_path):
    """It said "input_fn must return an iterable of batches ..., got Data",
    hiding the user's TypeError and its traceback."""
    class Data:
        def __iter__(self):
            return iter(None)   # the user's bug
    e = make(tmp_path)
    with pytest.raises(TypeError, match="'NoneType' object is not iterable"):
        e.train(lambda: Data(), steps=1)
    with pytest.raises(TypeError, match="must return an iterable of batches .* got int"):
        e.train(lambda: 3, steps=1)


def test_an_input_fn_taking_an_argument_the_estimator_does_not_give_says_how_to_bind_it(
        tmp_path):
    """`def input_fn(batch_size)` handed over unbound: Python's "missing 1
    required positional argument" from deep in train, as in TF."""
    e = make(tmp_path)
    x, y = regression_data(64)

    def input_fn(data_file, batch_size, mode, shuffle=True):
        return [({"x": x[:batch_size]}, y[:batch_size])]
    for call in (lambda: e.train(input_fn, steps=1), lambda: e.evaluate(input_fn),
                 lambda: next(e.predict(input_fn))):
        with pytest.raises(TypeError, match=(
                r"input_fn '.*input_fn' takes 'data_file', 'batch_size', which the Estimator "
                r"does not give: .* functools.partial\(input_fn, data_file=...\)")):
            call()
    import functools
    e.train(functools.partial(input_fn, "unused", 32), steps=1)   # bound: trains
    assert e.latest_checkpoint().endswith("model.ckpt-1")



def test_input_fn_returning_one_batch_as_tf_does_is_an_error_saying_how(tmp_path):
    """A TF input_fn may return one batch's tensors: `(features, labels)`, a
    features dict or tensor. Iterated, they came apart: the pair gave 'got dict',
    a dict its keys as features, a tensor or array its rows one at a time
    (predict gave an answer per row, each row without its batch dimension)."""
    e = make(tmp_path)
    x, y = regression_data(8)
    one_pair = "returned a \\(features, labels\\) pair.*`\\[batch\\]`.*itertools.repeat"
    for mode_call in (lambda fn: e.train(fn, steps=1), e.evaluate):
        with pytest.raises(ValueError, match=one_pair):
            mode_call(lambda: ({"x": x}, y))
        with pytest.raises(ValueError, match=one_pair):
            mode_call(lambda: (torch.tensor(x), torch.tensor(y)))
    e.train(lambda: [({"x": x}, y)], steps=1)   # the fix the message gives
    for features, what in [({"x": x}, r"a dict of features \(keys \['x'\]\)"),
                           (torch.tensor(x), r"a Tensor of shape \(8, 3\)"),
                           (x, r"a ndarray of shape \(8, 3\)"),
                           (({"x": x}, y), "a \\(features, labels\\) pair")]:
        with pytest.raises(ValueError, match="input_fn returned " + what):
            list(e.predict(lambda: features))
    # lists of batches stay lists of batches, two of them included
    assert len(list(e.predict(lambda: [{"x": x}, {"x": x[:3]}]))) == 11
    assert len(list(e.predict(lambda: ({"x": x}, {"x": x[:3]})))) == 11

def test_no_model_dir_uses_a_temporary_one(caplog):
    with caplog.at_level("WARNING"):
        e = est.Estimator(regression_model_fn)
    assert os.path.isdir(e.model_dir) and "temporary folder" in caplog.text


def _compilable_model_fn(compiled):
    def model_fn(features, labels, mode):
        def make():
            net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                                      torch.nn.Linear(4, 1))
            return torch.compile(net, backend="eager") if compiled else net
        net = est.get_module("net", make)
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, predictions={"y": net(features["x"])},
                                 train_op=est.get_optimizer(
                                     lambda p: torch.optim.SGD(p, lr=0.1)))
    return model_fn


def test_a_compiled_module_is_named_saved_and_restored_as_the_module_it_compiled(tmp_path):
    """torch.compile's wrapper put `_orig_mod` in every variable name and
    checkpoint key, so the same model without compile (or with) could not
    restore the model_dir ("Unexpected key(s) _orig_mod.0.weight")."""
    compiled = est.Estimator(_compilable_model_fn(True), str(tmp_path))
    compiled.train(regression_input_fn(), steps=3)
    names = [n for n in compiled.get_variable_names() if n.startswith("net/")]
    assert names == ["net/0/bias", "net/0/weight", "net/2/bias", "net/2/weight"]
    plain = est.Estimator(_compilable_model_fn(False), str(tmp_path))
    assert plain.evaluate(regression_input_fn(), steps=2) == compiled.evaluate(
        regression_input_fn(), steps=2)
    plain.train(regression_input_fn(), steps=2)
    compiled.train(regression_input_fn(), steps=2)
    assert compiled.get_variable_value("global_step") == 7


def test_a_checkpoint_of_a_compiled_module_with_orig_mod_keys_still_restores():
    from hooks.model_scope import _uncompiled_state
    state = {"_orig_mod.0.weight": 1, "_orig_mod.0.bias": 2}
    assert _uncompiled_state(state) == {"0.weight": 1, "0.bias": 2}
    mixed = {"_orig_mod.w": 1, "b": 2}
    assert _uncompiled_state(mixed) is mixed


def test_a_restored_optimizer_a_torch_scheduler_drove_warns_that_its_schedule_restarts(
        tmp_path, caplog):
    """A LambdaLR made in model_fn restarted its schedule after a restart,
    silently (a probe: the rate 0.01 * 0.8**10 where 0.8**20 was due)."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.01))
        if not hasattr(opt, "scheduler"):
            opt.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.8 ** s)

        def train_op():
            loss.backward()
            opt.step()
            opt.scheduler.step()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    e = est.Estimator(model_fn, str(tmp_path))
    with caplog.at_level("WARNING"):
        e.train(regression_input_fn(), steps=2)
    assert "LR scheduler" not in caplog.text
    with caplog.at_level("WARNING"):
        e.train(regression_input_fn(), steps=2)
    assert "a torch LR scheduler drove this optimizer" in caplog.text
    assert "est.learning_rate_decay" in caplog.text


def test_slots_of_an_optimizer_whose_factory_builds_groups_are_named_by_their_variable(
        tmp_path):
    """BERT's two parameter groups (weights with decay, biases without),
    built in the factory from the modules' names: the checkpoint names each
    slot by its own variable. Before, slots were named by the order the
    factory was given the parameters, not the groups' order (the state
    dict's): `optimizer/net/0/bias/exp_avg` held a weight's slot."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Sequential(
            torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
        loss = net(features["x"]).pow(2).mean()

        def groups(params):
            named = list(net.named_parameters())
            return [{"params": [p for n, p in named if not n.endswith("bias")],
                     "weight_decay": 0.01},
                    {"params": [p for n, p in named if n.endswith("bias")],
                     "weight_decay": 0.0}]
        optimizer = est.get_optimizer(lambda p: torch.optim.AdamW(groups(p), lr=0.1))
        return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(lambda: [({"x": torch.randn(4, 3)}, None)] * 3)
    for var in ("net/0/weight", "net/0/bias", "net/2/weight", "net/2/bias"):
        value = e.get_variable_value(var)
        slot = e.get_variable_value(f"optimizer/{var}/exp_avg")
        assert slot.shape == value.shape, var
    # the slot is that variable's: Adam's first moment of a bias is its gradient's mean
    state = torch.load(e.latest_checkpoint(), weights_only=True)["optimizers"]["optimizer"]
    assert [len(g["params"]) for g in state["param_groups"]] == [2, 2]
    assert e.get_variable_value("optimizer/net/2/bias/exp_avg").tolist() == \
        state["state"][3]["exp_avg"].tolist()
