"""export_saved_model (a torch.export program of the PREDICT path) and the
Latest/Best/Final exporters."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import estimator as est
from estimator import export as export_lib
from hooks.summary_hooks import write_dict_to_summary
from models import regression_data, regression_input_fn, regression_model_fn


def trained(tmp_path, steps=30, name="m", **params):
    e = est.Estimator(regression_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / name), save_checkpoints_steps=10),
        params=dict({"lr": 0.1}, **params))
    e.train(regression_input_fn(), max_steps=steps)
    return e


SERVING = export_lib.build_raw_serving_input_receiver_fn({"x": torch.zeros(1, 3)})

# Runs in a fresh interpreter: isolated mode (-I: no PYTHONPATH, no script or
# working directory on sys.path), our packages blocked, only torch and numpy.
_SERVE = r"""
import importlib.util, json, sys
import numpy as np, torch
for name in ("estimator", "distribute", "hooks"):
    sys.modules[name] = None   # block our packages (they may be pip-installed): the export must not need them
export_dir, x_path, out_path = sys.argv[1:]
signature = json.load(open(export_dir + "/signature.json"))
program = torch.export.load(export_dir + "/" + signature["program"]).module()
x = torch.from_numpy(np.load(x_path))
with torch.no_grad():
    outputs = {"all": program(x=x)["y"], "one": program(x=x[:1])["y"],
               "five": program(x=x[:5])["y"]}
np.savez(out_path, **{k: v.numpy() for k, v in outputs.items()})
"""


def serve_in_fresh_process(tmp_path, export_dir, x):
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    run = subprocess.run([sys.executable, "-I", "-c", _SERVE, export_dir,
                          str(tmp_path / "x.npy"), str(tmp_path / "out.npz")],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return np.load(tmp_path / "out.npz")


@pytest.mark.slow
def test_export_serves_in_a_fresh_process_without_our_packages(tmp_path):
    e = trained(tmp_path)
    export_dir = e.export_saved_model(str(tmp_path / "export"), SERVING)
    assert os.path.dirname(export_dir) == str(tmp_path / "export")
    assert os.path.basename(export_dir).isdigit()
    assert sorted(os.listdir(export_dir)) == ["model.pt2", "signature.json"]
    signature = json.load(open(os.path.join(export_dir, "signature.json")))
    assert signature["inputs"] == [{"name": "x", "dtype": "float32", "shape": [None, 3]}]
    assert signature["outputs"] == [{"name": "y", "dtype": "float32", "shape": [None, 1]}]
    assert signature["dynamic_batch"] and signature["global_step"] == 30
    assert signature["checkpoint"] == "model.ckpt-30"

    x, _ = regression_data(17, seed=3)
    expected = np.stack([p["y"] for p in e.predict(lambda: [{"x": x}])])
    served = serve_in_fresh_process(tmp_path, export_dir, x)
    np.testing.assert_allclose(served["all"], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served["one"], expected[:1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served["five"], expected[:5], rtol=1e-6, atol=1e-6)


def test_export_of_a_given_checkpoint_with_assets_and_text(tmp_path):
    e = trained(tmp_path)
    asset = tmp_path / "vocab.txt"
    asset.write_text("a\nb\n")
    path = e.export_saved_model(str(tmp_path / "export"), SERVING, as_text=True,
                                assets_extra={"dict/vocab.txt": str(asset)},
                                checkpoint_path=str(tmp_path / "m" / "model.ckpt-10"))
    assert json.load(open(os.path.join(path, "signature.json")))["global_step"] == 10
    assert open(os.path.join(path, "assets.extra", "dict", "vocab.txt")).read() == "a\nb\n"
    assert "linear" in open(os.path.join(path, "model.txt")).read()
    program = torch.export.load(os.path.join(path, "model.pt2")).module()
    w = torch.tensor(e.get_variable_value("linear/weight"))
    x = torch.randn(4, 3)
    assert not torch.allclose(program(x=x)["y"], x @ w.T + torch.tensor(
        e.get_variable_value("linear/bias")))  # step 10's weights, not the latest
    again = e.export_saved_model(str(tmp_path / "export"), SERVING)
    assert int(os.path.basename(again)) > int(os.path.basename(path))  # ordered even in 1 s


def test_export_with_preprocessing_features_and_a_single_tensor(tmp_path):
    e = trained(tmp_path)

    def receiver_fn():   # serving takes raw values scaled by 10; model_fn sees features["x"]
        raw = torch.zeros(3, 3)
        return export_lib.ServingInputReceiver(lambda r: {"x": r["raw"] / 10.0}, {"raw": raw})
    path = e.export_saved_model(str(tmp_path / "export"), receiver_fn)
    program = torch.export.load(os.path.join(path, "model.pt2")).module()
    x, _ = regression_data(6, seed=1)
    expected = np.stack([p["y"] for p in e.predict(lambda: [{"x": x}])])
    np.testing.assert_allclose(program(raw=torch.tensor(x) * 10.0)["y"].numpy(), expected,
                               rtol=1e-5, atol=1e-5)

    def tensor_model_fn(features, labels, mode):   # features is a tensor, predictions too
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        return est.EstimatorSpec(mode, predictions=net(features))
    single = est.Estimator(tensor_model_fn, model_dir=str(tmp_path / "m"))
    path = single.export_saved_model(
        str(tmp_path / "single"),
        export_lib.build_raw_serving_input_receiver_fn(torch.zeros(2, 3), default_batch_size=4))
    signature = json.load(open(os.path.join(path, "signature.json")))
    assert signature["inputs"] == [{"name": "feature", "dtype": "float32", "shape": [4, 3]}]
    assert not signature["dynamic_batch"] and not signature["outputs_are_dict"]
    out = torch.export.load(os.path.join(path, "model.pt2")).module()(feature=torch.ones(4, 3))
    assert out.shape == (4, 1)


def test_export_errors(tmp_path):
    untrained = est.Estimator(regression_model_fn, model_dir=str(tmp_path / "none"))
    with pytest.raises(ValueError, match="Couldn't find trained model at"):
        untrained.export_saved_model(str(tmp_path / "x"), SERVING)
    e = trained(tmp_path, steps=10)
    with pytest.raises(TypeError, match="must return a ServingInputReceiver"):
        e.export_saved_model(str(tmp_path / "x"), lambda: {"x": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"features\['x'\] is not one of the receiver_tensors"):
        e.export_saved_model(str(tmp_path / "x"), lambda: export_lib.ServingInputReceiver(
            {"x": torch.zeros(2, 3)}, {"x": torch.zeros(2, 3)}))
    with pytest.raises(ValueError, match="must be a Python identifier"):
        export_lib.ServingInputReceiver({"x": torch.zeros(2)}, {"my-input": torch.zeros(2)})
    with pytest.raises(ValueError, match="share their first"):
        a, b = torch.zeros(2, 3), torch.zeros(3, 3)
        e.export_saved_model(str(tmp_path / "x"), lambda: export_lib.ServingInputReceiver(
            {"x": a}, {"a": a, "b": b}))
    with pytest.raises(ValueError, match="default_batch_size must be a positive int"):
        export_lib.build_raw_serving_input_receiver_fn({"x": torch.zeros(1, 3)}, 0)
    with pytest.raises(ValueError, match="leaves the export directory"):
        e.export_saved_model(str(tmp_path / "x"), SERVING,
                             assets_extra={"../evil": str(tmp_path / "m" / "checkpoint")})
    assert not [n for n in os.listdir(tmp_path / "x") if n.startswith("temp-")]


def test_a_full_disk_during_an_export_names_it_and_leaves_nothing(tmp_path, monkeypatch):
    """A write failing for want of space (a bare ENOSPC, no file named: before,
    the error said only that) names the export; no directory is left."""
    import errno
    e = trained(tmp_path, steps=10)
    real_open = open

    def full(path, mode="r", *args, **kwargs):
        if "w" in mode and "temp-" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)
    monkeypatch.setattr("builtins.open", full)
    with pytest.raises(OSError, match=r"No space left on device writing the export "
                                      r"\S*x.\d+ \(nothing was exported") as info:
        e.export_saved_model(str(tmp_path / "x"), SERVING)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path / "x") == []


# -- exporters -----------------------------------------------------------------------
def test_latest_exporter_keeps_the_newest(tmp_path):
    e = trained(tmp_path)
    exporter = est.LatestExporter("latest", SERVING, exports_to_keep=2)
    base = str(tmp_path / "m" / "export" / "latest")
    made = [exporter.export(e, base, str(tmp_path / "m" / f"model.ckpt-{s}"), {"loss": 1.0,
                            "global_step": s}, False) for s in (10, 20, 30)]
    assert sorted(os.listdir(base)) == [os.path.basename(p) for p in made[1:]]
    steps = [json.load(open(os.path.join(p, "signature.json")))["global_step"] for p in made[1:]]
    assert steps == [20, 30]
    with pytest.raises(ValueError, match="must be a positive number"):
        est.LatestExporter("latest", SERVING, exports_to_keep=0)


def test_final_exporter_exports_only_the_final(tmp_path):
    e = trained(tmp_path, steps=10)
    exporter = est.FinalExporter("final", SERVING)
    base = str(tmp_path / "export")
    ckpt = e.latest_checkpoint()
    assert exporter.export(e, base, ckpt, {"loss": 1.0, "global_step": 10}, False) is None
    assert not os.path.exists(base)
    path = exporter.export(e, base, ckpt, {"loss": 1.0, "global_step": 10}, True)
    assert os.listdir(base) == [os.path.basename(path)]


def test_exports_to_keep_counts_only_timestamps_as_tf(tmp_path):
    """A user's `123/` beside the exports was deleted as the oldest export
    (TF's exporters count only names of 10 digits), and the next export's
    number was taken after it."""
    e = trained(tmp_path, steps=10)
    base = tmp_path / "m" / "export" / "latest"
    (base / "123").mkdir(parents=True)
    (base / "99999999999").mkdir()   # (11 digits: not TF's either)
    exporter = est.LatestExporter("latest", SERVING, exports_to_keep=2)
    result = {"loss": 1.0, "global_step": 10}
    made = [exporter.export(e, str(base), e.latest_checkpoint(), result, False)
            for _ in range(3)]
    assert sorted(os.listdir(base)) == sorted(
        ["123", "99999999999"] + [os.path.basename(p) for p in made[1:]])
    assert all(len(os.path.basename(p)) == 10 for p in made)

def test_best_exporter_exports_improvements_only(tmp_path):
    e = trained(tmp_path)
    exporter = est.BestExporter(serving_input_receiver_fn=SERVING, exports_to_keep=5)
    base = str(tmp_path / "m" / "export" / "best")
    ckpt = lambda s: str(tmp_path / "m" / f"model.ckpt-{s}")  # noqa: E731
    assert exporter.name == "best_exporter"
    assert exporter.export(e, base, ckpt(10), {"loss": 0.5, "global_step": 10}, False)
    assert exporter.export(e, base, ckpt(20), {"loss": 0.7, "global_step": 20}, False) is None
    best = exporter.export(e, base, ckpt(30), {"loss": 0.2, "global_step": 30}, False)
    assert best and len(os.listdir(base)) == 2
    assert json.load(open(os.path.join(best, "signature.json")))["global_step"] == 30


def test_best_exporter_survives_a_restart_by_reading_earlier_eval_results(tmp_path):
    """A fresh BestExporter (a restarted evaluator) reads the evaluations
    Estimator.evaluate wrote to model_dir/eval and does not export a model
    worse than those."""
    e = trained(tmp_path)
    eval_input = regression_input_fn(repeat=False)
    results = {s: e.evaluate(eval_input, checkpoint_path=str(tmp_path / "m" / f"model.ckpt-{s}"))
               for s in (10, 20)}
    results[30] = e.evaluate(eval_input)
    assert results[10]["loss"] > results[20]["loss"] > results[30]["loss"]  # training helps

    def higher_loss_is_better(best_eval_result, current_eval_result):   # like an accuracy
        return current_eval_result["loss"] > best_eval_result["loss"]
    base = str(tmp_path / "m" / "export" / "best")
    first = est.BestExporter("best", SERVING, compare_fn=higher_loss_is_better)
    assert first.export(e, base, str(tmp_path / "m" / "model.ckpt-10"), results[10], False)
    restarted = est.BestExporter("best", SERVING, compare_fn=higher_loss_is_better)
    assert restarted.export(e, base, e.latest_checkpoint(), results[30], False) is None
    assert len(os.listdir(base)) == 1
    # Without the event files it would have exported: the reading is what stopped it.
    forgetful = est.BestExporter("best", SERVING, compare_fn=higher_loss_is_better,
                                 event_file_pattern=None)
    assert forgetful.export(e, base, e.latest_checkpoint(), results[30], False)
    # With the default compare_fn the step-30 result is the best: exported.
    default = est.BestExporter("best2", SERVING)
    assert default.export(e, str(tmp_path / "b2"), e.latest_checkpoint(), results[30], False)


def test_a_restarted_best_exporter_counts_only_the_evaluations_it_exported(tmp_path):
    """Its evaluator killed between step 20's summaries and its export, the
    restarted exporter took step 20's loss (0.2, never exported) as the one
    to beat: step 30's 0.5 was not exported, export/best kept step 10's
    1.0 (evaluator probe)."""
    e = trained(tmp_path)
    eval_dir = str(tmp_path / "m" / "eval")
    for step, loss in ((10, 1.0), (20, 0.2), (30, 0.5)):
        write_dict_to_summary(eval_dir, {"loss": loss}, step)
    base = str(tmp_path / "m" / "export" / "best")

    def ckpt(step):
        return str(tmp_path / "m" / f"model.ckpt-{step}")
    assert est.BestExporter("best", SERVING).export(
        e, base, ckpt(10), {"loss": 1.0, "global_step": 10}, False)
    restarted = est.BestExporter("best", SERVING)   # (step 20 evaluated, not exported)
    path = restarted.export(e, base, ckpt(30), {"loss": 0.5, "global_step": 30}, False)
    assert path and json.load(open(os.path.join(path, "signature.json")))["global_step"] == 30
    # and what it exported is then the one to beat, in the process and after a restart
    write_dict_to_summary(eval_dir, {"loss": 0.6}, 40)
    assert restarted.export(e, base, ckpt(30), {"loss": 0.6, "global_step": 40}, False) is None
    assert est.BestExporter("best", SERVING).export(
        e, base, ckpt(30), {"loss": 0.6, "global_step": 40}, False) is None


def test_best_exporter_validation(tmp_path):
    with pytest.raises(ValueError, match="`compare_fn` must not be None"):
        est.BestExporter(serving_input_receiver_fn=SERVING, compare_fn=None)
    with pytest.raises(ValueError, match="must include best_eval_result argument"):
        est.BestExporter(serving_input_receiver_fn=SERVING, compare_fn=lambda a, b: True)
    with pytest.raises(ValueError, match="not expected args"):
        est.BestExporter(serving_input_receiver_fn=SERVING,
                         compare_fn=lambda best_eval_result, current_eval_result, x: True)
    with pytest.raises(ValueError, match="must be a positive number"):
        est.BestExporter(serving_input_receiver_fn=SERVING, exports_to_keep=-1)
    e = trained(tmp_path, steps=10)
    exporter = est.BestExporter(serving_input_receiver_fn=SERVING, event_file_pattern=None)
    exporter.export(e, str(tmp_path / "b"), e.latest_checkpoint(), {"loss": 1.0,
                                                                    "global_step": 10}, False)
    with pytest.raises(ValueError, match="current_eval_result cannot be empty or no loss"):
        exporter.export(e, str(tmp_path / "b"), e.latest_checkpoint(), {"mae": 1.0}, False)


_FULL_DISK_EXPORT = r"""
import os, resource, sys
import estimator as est
from models import regression_input_fn, regression_model_fn
model_dir, base = sys.argv[1], sys.argv[2]
estimator = est.Estimator(regression_model_fn, model_dir=model_dir)
estimator.train(regression_input_fn(), steps=1)
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))   # (ulimit -f: no file past 3 kB)
try:
    estimator.export_saved_model(base, est.export.build_raw_serving_input_receiver_fn(
        {"x": __import__("torch").zeros(2, 3)}))
except OSError as e:
    print("OSError:", e)
print("alive", sorted(os.listdir(base)))
"""


def test_an_export_onto_a_full_disk_says_so_and_the_process_lives(tmp_path):
    """torch's archive writer, failing on a full disk (here a file size
    limit), raised a RuntimeError without a path, then aborted the whole
    process from its destructor (exit 134, fault probe)."""
    from paths import SUPPORT
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_EXPORT, str(tmp_path / "model"), str(tmp_path / "x")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [SUPPORT, os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "writing the export" in done.stdout and "nothing was exported" in done.stdout
    assert "File too large" in done.stdout
    assert "alive []" in done.stdout   # (no temp directory left)
