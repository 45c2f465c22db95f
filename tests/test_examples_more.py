"""The examples of issue 7 run (short settings) and do what they say:
conv_net, linear_regression (one device and 2 CPU replicas), export_and_serve,
multi_worker."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))


def test_conv_net_learns_the_generated_shapes(tmp_path, capsys):
    import conv_net
    model_dir = str(tmp_path / "conv")
    result = conv_net.main(["--model_dir", model_dir, "--max_steps", "150"])
    assert result["global_step"] == 150 and result["accuracy"] >= 0.9
    out = capsys.readouterr().out
    assert "Test accuracy" in out and out.count("predicted ") == 3
    events = EventAccumulator(model_dir, size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    assert "inputs/image/0" in events.Tags()["images"]
    assert "logits" in events.Tags()["histograms"]


def test_conv_net_data_is_what_the_labels_say():
    import conv_net
    images, labels = conv_net.make_images(60, seed=5)
    for img, label in zip(images[:, 0], labels):
        rows, cols = np.nonzero(img == 1.0)
        if label == 0:
            assert len(set(rows)) == 1 and len(set(cols)) > 1
        elif label == 1:
            assert len(set(cols)) == 1 and len(set(rows)) > 1
        else:
            assert (np.diff(rows) == 1).all() and (np.diff(cols) == 1).all()


def test_linear_regression_recovers_the_line(tmp_path):
    import linear_regression
    result, w, b = linear_regression.main(["--model_dir", str(tmp_path / "lr"),
                                           "--max_steps", "200"])
    assert result["global_step"] == 200
    assert w == pytest.approx(2.0, abs=0.05) and b == pytest.approx(-1.0, abs=0.05)
    assert result["label/mean"] == pytest.approx(result["prediction/mean"], abs=0.05)


@pytest.mark.slow
def test_linear_regression_on_two_cpu_replicas(tmp_path):
    import linear_regression
    result, w, b = linear_regression.main(["--model_dir", str(tmp_path / "lr2"),
                                           "--max_steps", "100", "--devices", "cpu:0,cpu:1"])
    assert result["global_step"] == 100
    assert w == pytest.approx(2.0, abs=0.1) and b == pytest.approx(-1.0, abs=0.1)


def test_export_and_serve_round_trip(tmp_path, capsys):
    import export_and_serve
    export_dir, served, expected, same_classes = export_and_serve.main(
        ["--model_dir", str(tmp_path / "es"), "--max_steps", "150"])
    assert os.path.isfile(os.path.join(export_dir, "model.pt2"))
    assert same_classes
    np.testing.assert_allclose(served["probabilities"], expected, atol=1e-5)
    assert served["probabilities"].shape == (len(export_and_serve.SAMPLES), 3)
    assert "same classes: True" in capsys.readouterr().out


def test_export_and_serve_server_really_runs_without_our_packages(tmp_path):
    """The serving process blocks our packages (even when pip-installed): a
    program that imports one fails there."""
    import subprocess
    import export_and_serve
    prelude = export_and_serve._SERVER.split("import torch")[0]
    for name in ("estimator", "distribute", "hooks"):
        done = subprocess.run([sys.executable, "-I", "-c", prelude + f"import {name}"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "halted; None in sys.modules" in done.stderr, done.stderr


@pytest.mark.slow
def test_multi_worker_with_hand_written_tf_config(tmp_path):
    import multi_worker
    model_dir = str(tmp_path / "mw")
    result = multi_worker.main(["--local_workers", "1", "--model_dir", model_dir,
                                "--max_steps", "60"])
    assert result["global_step"] == 60 and result["rmse"] < 0.5
    assert sorted(f for f in os.listdir(model_dir) if f.startswith("model.ckpt")) == \
        ["model.ckpt-60", "model.ckpt-60.crc32c"]


@pytest.mark.slow
def test_ps_coordinator_example_trains_iris(tmp_path):
    """examples/ps_coordinator.py: 2 ps and 2 worker processes, the
    coordinator in a process of its own (it joins the RPC group)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from examples import ps_coordinator as m; "
            "print(json.dumps(m.main(['--steps', '200'])))")
    proc = subprocess.run([sys.executable, "-c", code, ROOT], capture_output=True, text=True,
                          timeout=240, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # (the accuracy is a float32: 90% reads 0.8999999761581421)
    assert result["accuracy"] >= np.float32(0.9), result
    assert result["last_loss"] < result["first_loss"], result


def test_census_pandas_evaluates_in_memory_while_it_trains(tmp_path):
    """examples/census_pandas.py: pandas_input_fn and InMemoryEvaluatorHook in
    TF 1.x's tutorial shape; the last in-memory evaluation is the final one."""
    import census_pandas
    from hooks.event_files import read_scalars
    results = census_pandas.run(str(tmp_path), train_steps=300, every_n_iter=100)
    scalars = read_scalars(str(tmp_path / "eval_test" / "*tfevents*"))
    assert sorted(scalars) == [0, 100, 200, 300]
    assert scalars[300]["accuracy"] == pytest.approx(results["accuracy"], rel=1e-6)
    assert results["accuracy"] > results["accuracy_baseline"] + 0.02
    assert scalars[300]["auc"] > scalars[0]["auc"] + 0.05


def test_multi_label_tags_are_classified_by_name_over_http(tmp_path):
    """examples/multi_label_tags.py: MultiLabelHead + DNNEstimator through
    train_and_evaluate, a LatestExporter's parsing export served and
    classified over HTTP: the answer names the tags, with the scores the
    estimator predicts."""
    import estimator as est
    from examples import multi_label_tags as example
    out = example.main(["--workdir", str(tmp_path), "--train_steps", "200"])
    assert out["eval"]["global_step"] == 200 and out["eval"]["auc"] > 0.9
    model = est.DNNEstimator(est.MultiLabelHead(3, label_vocabulary=example.TAGS), [16],
                             example.COLUMNS, model_dir=str(tmp_path / "model"))
    predicted = [p["probabilities"] for p in model.predict(
        est.inputs.numpy_input_fn(out["examples"], None, 3, 1, False))]
    for row, probabilities in zip(out["classify"]["results"], predicted):
        assert [tag for tag, _ in row] == example.TAGS
        np.testing.assert_allclose([score for _, score in row], probabilities, rtol=1e-5,
                                   atol=1e-7)
