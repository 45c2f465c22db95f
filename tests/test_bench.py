"""The overhead benchmark runs end to end (its figures are reported in the
issues, never asserted in tests)."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_overhead_benchmark_runs_both_models(capsys, clock):
    path = os.path.join(ROOT, "bench", "overhead.py")
    spec = importlib.util.spec_from_file_location("overhead", path)
    overhead = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overhead)
    results = overhead.main(["--rounds", "2", "--tiny_steps", "30", "--mlp_steps", "3",
                             "--clock", clock])
    assert set(results) == {"tiny", "mlp"} and all(r > 0 for r in results.values())
    out = capsys.readouterr().out
    assert "tiny  plain" in out and "mlp   plain" in out and "ratio" in out
