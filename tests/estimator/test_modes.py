"""Train and eval mode (issue 12): a model with Dropout and BatchNorm, as real
TF1 programs have, is in train() mode in TRAIN only; evaluate, predict and
exports run it in eval() mode."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import estimator as est
import hooks

rng = np.random.RandomState(0)
X = rng.randn(96, 4).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1).astype(np.int64)


def _net():
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 3))


SEEN = []   # (mode, net.training, est.is_training()) per model_fn call


def model_fn(features, labels, mode):
    net = est.get_module("net", _net)
    SEEN.append((mode, net.training, est.is_training()))
    logits = net(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"logits": logits,
                                                    "probabilities": logits.softmax(-1)})
    loss = torch.nn.functional.cross_entropy(logits, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": est.metrics.accuracy(labels, logits.argmax(-1))})
    opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.01))
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def train_input_fn():
    return [({"x": X[i:i + 16]}, Y[i:i + 16]) for i in range(0, len(X), 16)] * 3


def eval_input_fn():   # uneven batches: 40 + 40 + 16
    return [({"x": X[i:i + 40]}, Y[i:i + 40]) for i in range(0, len(X), 40)]


def predict_input_fn():
    return [{"x": X[i:i + 40]} for i in range(0, len(X), 40)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("modes") / "m")
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=model_dir, tf_random_seed=1))
    e.train(train_input_fn)
    return e


def _by_hand(e):
    """The checkpoint's weights run by hand in eval() mode."""
    net = _net()
    state = torch.load(e.latest_checkpoint(), weights_only=True)["modules"]["net"]
    net.load_state_dict(state)
    net.eval()
    with torch.no_grad():
        return net(torch.as_tensor(X)).numpy(), state


def test_predict_is_deterministic_and_equals_eval_mode_by_hand(trained):
    SEEN.clear()
    first = np.stack([p["logits"] for p in trained.predict(predict_input_fn)])
    second = np.stack([p["logits"] for p in trained.predict(predict_input_fn)])
    np.testing.assert_array_equal(first, second)
    want, _ = _by_hand(trained)
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-6)
    assert SEEN and all(s == (est.ModeKeys.PREDICT, False, False) for s in SEEN)


class _KeepModules(hooks.SessionRunHook):
    def end(self, session):
        self.state = {k: v.clone() for k, v in
                      session.scope.raw_modules["net"].state_dict().items()}


def test_evaluate_uses_and_keeps_batch_norm_statistics(trained):
    SEEN.clear()
    keep = _KeepModules()
    a = trained.evaluate(eval_input_fn, hooks=[keep])
    b = trained.evaluate(eval_input_fn)
    assert a == b
    logits, state = _by_hand(trained)
    assert a["accuracy"] == pytest.approx(float((logits.argmax(-1) == Y).mean()))
    for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
        torch.testing.assert_close(keep.state[name], state[name], rtol=0, atol=0)
    assert SEEN and all(s == (est.ModeKeys.EVAL, False, False) for s in SEEN)


class _EvaluateAfterSave(hooks.CheckpointSaverListener):
    def __init__(self, estimator):
        self.estimator, self.results = estimator, []

    def after_save(self, session, global_step_value):
        self.results.append(self.estimator.evaluate(eval_input_fn))


def test_training_goes_on_in_train_mode_after_an_evaluation_inside_it(tmp_path):
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path / "m"),
                                                     save_checkpoints_steps=5))
    listener = _EvaluateAfterSave(e)
    SEEN.clear()
    e.train(train_input_fn, steps=12, saving_listeners=[listener])
    assert len(listener.results) >= 2
    modes = [s for s in SEEN]
    assert (est.ModeKeys.EVAL, False, False) in modes
    assert all(s == (est.ModeKeys.TRAIN, True, True) for s in modes
               if s[0] == est.ModeKeys.TRAIN)
    assert sum(s[0] == est.ModeKeys.TRAIN for s in modes) == 12


_SERVE = r"""
import json, sys
for name in ("estimator", "distribute", "hooks"):
    sys.modules[name] = None
import torch
program = torch.export.load(sys.argv[1] + "/model.pt2").module()
x = torch.tensor(json.loads(sys.stdin.read()))
outs = [program(x=x)["logits"].tolist() for _ in range(2)]
print(json.dumps(outs))
"""


@pytest.mark.slow
def test_export_served_in_a_fresh_process_is_deterministic_and_equals_predict(trained, tmp_path):
    receiver = est.export.build_raw_serving_input_receiver_fn({"x": torch.zeros(2, 4)})
    export_dir = trained.export_saved_model(str(tmp_path / "export"), receiver)
    done = subprocess.run([sys.executable, "-I", "-c", _SERVE, export_dir],
                          input=json.dumps(X[:10].tolist()), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = (np.array(o, dtype=np.float32) for o in json.loads(done.stdout))
    np.testing.assert_array_equal(first, second)
    predicted = np.stack([p["logits"] for p in trained.predict(lambda: [{"x": X[:10]}])])
    np.testing.assert_allclose(first, predicted, rtol=1e-5, atol=1e-5)
    assert os.path.basename(trained.export_savedmodel(str(tmp_path / "export"), receiver)) \
        > os.path.basename(export_dir)   # TF1's name writes a newer export


def test_torchs_own_dropout_left_on_is_warned_too(tmp_path, caplog):
    """`torch.dropout(x, p, True)` (what F.dropout calls) was not watched:
    predict and the export were random without a word (attack probe)."""
    import logging

    def model_fn(features, labels, mode):
        h = torch.dropout(features["x"], 0.3, True)
        h = torch.feature_dropout(h, 0.0, True)   # (p=0: nothing dropped, nothing said)
        logits = est.get_module("net", lambda: torch.nn.Linear(4, 3))(h)
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"logits": logits})
        return est.EstimatorSpec(mode, loss=torch.nn.functional.cross_entropy(logits, labels),
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))
    x = np.random.RandomState(0).rand(8, 4).astype(np.float32)
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(lambda: [({"x": x}, np.arange(8) % 3)], steps=1)
    with caplog.at_level(logging.WARNING):
        list(e.predict(lambda: [{"x": x}]))
    warned = [r.getMessage() for r in caplog.records if "applies dropout" in r.getMessage()]
    assert len(warned) == 1 and "(dropout(p=0.3)) with training=True" in warned[0], warned


def test_functional_dropout_left_on_outside_train_is_warned(tmp_path, caplog):
    """`torch.nn.functional.dropout(x, p)` defaults to training=True: a port
    of `tf.layers.dropout(x, rate, training=...)` that drops the argument
    kept dropping in evaluate and predict, silently (random results). Now
    the first call in EVAL and PREDICT warns (dropout there can be meant:
    Monte Carlo dropout); passing training=est.is_training() is quiet."""
    import logging

    def fn(training_given):
        def model_fn(features, labels, mode):
            net = est.get_module("net", lambda: torch.nn.Linear(4, 3))
            h = features["x"]
            h = (torch.nn.functional.dropout(h, 0.3, training=est.is_training())
                 if training_given else torch.nn.functional.dropout(h, 0.3))
            logits = net(h)
            if mode == est.ModeKeys.PREDICT:
                return est.EstimatorSpec(mode, predictions={"logits": logits})
            loss = torch.nn.functional.cross_entropy(logits, labels)
            return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
                lambda p: torch.optim.SGD(p, lr=0.1)))
        return model_fn

    x = np.random.RandomState(0).rand(8, 4).astype(np.float32)
    y = np.arange(8) % 3
    for training_given in (False, True):
        e = est.Estimator(fn(training_given), model_dir=str(tmp_path / str(training_given)))
        e.train(lambda: [({"x": x}, y)] * 3)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            e.evaluate(lambda: [({"x": x}, y)] * 2)
            list(e.predict(lambda: [{"x": x}]))
            e.export_saved_model(str(tmp_path / "export"),
                                 est.export.build_raw_serving_input_receiver_fn(
                                     {"x": torch.from_numpy(x)}))
        warned = [r.getMessage() for r in caplog.records if "applies dropout" in r.getMessage()]
        if training_given:
            assert warned == []
        else:   # (an export traced it: every request's outputs random, it was not said)
            assert len(warned) == 3, warned   # evaluate, predict and export, once each
            assert warned[2].startswith("The export (its served outputs would be random): "
                                        "the model_fn applies dropout (dropout(p=0.3))")
            assert "'eval' mode: the model_fn applies dropout (dropout(p=0.3)) with " \
                   "training=True" in warned[0]
            assert "training=est.is_training()" in warned[0]
