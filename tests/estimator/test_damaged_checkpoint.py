"""A damaged latest checkpoint (SPEC, "Failure semantics"): evaluate, predict
and export fall back to the newest good one with a warning naming the bad file,
as training resumes; they used to stop on it with a traceback. Only damaged
checkpoints is an error, not an evaluation of the initial model; a damaged
checkpoint named by `checkpoint_path` is TF's DataLossError."""
import os
import re

import numpy as np
import pytest
import torch

import estimator as est
from estimator import checkpoint
from models import bn_dropout_model_fn, iris_like_input_fn

SERVING = est.export.build_raw_serving_input_receiver_fn({"x": torch.zeros(1, 4)})


@pytest.fixture
def model_dir(tmp_path):
    """A batch-norm + dropout classifier trained 6 steps: model.ckpt-3 and -6."""
    e = make(tmp_path)
    e.train(iris_like_input_fn(epochs=3), max_steps=6)
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(e.model_dir)] == [3, 6]
    return e.model_dir


def make(tmp_path):
    return est.Estimator(bn_dropout_model_fn, params={"width": 16}, config=est.RunConfig(
        model_dir=str(tmp_path / "m"), save_checkpoints_steps=3, tf_random_seed=1))


def damage(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


def predictions(e, **kw):
    return np.stack([p["logits"] for p in e.predict(iris_like_input_fn(n=10), **kw)])


def test_evaluate_predict_export_fall_back_past_a_damaged_latest(tmp_path, model_dir, caplog):
    e = make(tmp_path)
    good = os.path.join(model_dir, "model.ckpt-3")
    want_eval = e.evaluate(iris_like_input_fn(), checkpoint_path=good)
    want_predictions = predictions(e, checkpoint_path=good)
    damage(os.path.join(model_dir, "model.ckpt-6"))
    fallback = re.compile(r"model.ckpt-6' is damaged: its content does not match the digest.*"
                          r"; falling back to model.ckpt-3")
    for call in ("evaluate", "predict", "export"):
        caplog.clear()
        with caplog.at_level("WARNING"):
            if call == "evaluate":
                assert e.evaluate(iris_like_input_fn()) == want_eval
                assert want_eval["global_step"] == 3
            elif call == "predict":
                np.testing.assert_array_equal(predictions(e), want_predictions)
            else:
                export_dir = e.export_saved_model(str(tmp_path / "export"), SERVING)
                served = est.export.load(export_dir)
                x = torch.as_tensor(np.random.RandomState(0).randn(10, 4), dtype=torch.float32)
                np.testing.assert_allclose(served(x=x)["logits"], want_predictions,
                                           rtol=1e-5, atol=1e-6)
        assert any(fallback.search(r.getMessage()) for r in caplog.records), (call, caplog.text)


def test_only_damaged_checkpoints_is_an_error_not_the_initial_model(tmp_path, model_dir):
    """TF would evaluate the initialization only with no checkpoint at all."""
    for step in (3, 6):
        damage(os.path.join(model_dir, f"model.ckpt-{step}"))
    e = make(tmp_path)
    message = f"No good checkpoint in model_dir '{model_dir}' to %s: each is damaged"
    with pytest.raises(ValueError, match=message % "evaluate"):
        e.evaluate(iris_like_input_fn())
    with pytest.raises(ValueError, match=message % "predict"):
        predictions(e)
    with pytest.raises(ValueError, match=message % "export"):
        e.export_saved_model(str(tmp_path / "export"), SERVING)
    assert not os.path.exists(tmp_path / "export")


def test_a_damaged_checkpoint_path_is_tf_s_data_loss_error(tmp_path, model_dir):
    """Named by checkpoint_path, a damaged checkpoint is not passed over."""
    path = os.path.join(model_dir, "model.ckpt-3")
    damage(path)
    e = make(tmp_path)
    for call in (lambda: e.evaluate(iris_like_input_fn(), checkpoint_path=path),
                 lambda: predictions(e, checkpoint_path=path),
                 lambda: e.export_saved_model(str(tmp_path / "x"), SERVING, checkpoint_path=path)):
        with pytest.raises(checkpoint.DataLossError, match=f"Checkpoint '{path}' is damaged"):
            call()


def test_a_directory_as_checkpoint_path_falls_back_as_model_dir_does(tmp_path, model_dir,
                                                                     caplog):
    """TF reads a directory's latest checkpoint; a damaged one is passed over
    there too, and only damaged ones is an error naming the directory."""
    e = est.Estimator(bn_dropout_model_fn, params={"width": 16},
                      model_dir=str(tmp_path / "other"))
    good = predictions(e, checkpoint_path=os.path.join(model_dir, "model.ckpt-3"))
    damage(os.path.join(model_dir, "model.ckpt-6"))
    with caplog.at_level("WARNING"):
        np.testing.assert_array_equal(predictions(e, checkpoint_path=model_dir), good)
    assert "model.ckpt-6' is damaged" in caplog.text
    damage(os.path.join(model_dir, "model.ckpt-3"))
    with pytest.raises(ValueError, match=f"^No good checkpoint in '{model_dir}' to evaluate: "
                       "each is damaged"):
        e.evaluate(iris_like_input_fn(), checkpoint_path=model_dir)
    with pytest.raises(ValueError, match="No checkpoint found in directory"):
        e.evaluate(iris_like_input_fn(), checkpoint_path=str(tmp_path))


def test_an_empty_checkpoint_path_is_the_latest_as_in_tf(tmp_path, model_dir):
    """It was "Checkpoint '' does not exist" in evaluate and predict."""
    e = make(tmp_path)
    assert e.evaluate(iris_like_input_fn(), checkpoint_path="")["global_step"] == 6
    np.testing.assert_array_equal(predictions(e, checkpoint_path=""), predictions(e))
