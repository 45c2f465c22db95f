"""Every example runs (short settings) and does what it says."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))


def test_iris_reaches_090_accuracy(tmp_path, capsys):
    import iris
    result = iris.main(["--model_dir", str(tmp_path / "iris"), "--max_steps", "400"])
    assert result["accuracy"] >= 0.9
    assert result["global_step"] == 400
    out = capsys.readouterr().out
    assert "Test set accuracy" in out and out.count("Prediction is") == 3


def test_monitored_training_session_resumes_from_its_checkpoint(tmp_path):
    import monitored_training_session as mts
    d = str(tmp_path / "mts")
    start, step, _, _ = mts.main(["--checkpoint_dir", d, "--last_step", "120"])
    assert (start, step) == (0, 120)
    start, step, w, b = mts.main(["--checkpoint_dir", d, "--last_step", "250"])
    assert (start, step) == (120, 250)
    assert w == pytest.approx(3.0, abs=0.05) and b == pytest.approx(-1.0, abs=0.05)
