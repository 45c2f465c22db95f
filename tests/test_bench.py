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
                             "--ckpt_steps", "30", "--loader_steps", "3", "--clock", clock])
    assert set(results) == {"tiny", "mlp", "tiny_ckpt_async", "tiny_ckpt_sync",
                            "tiny_ckpt_end only", "mlp_ckpt_async", "mlp_ckpt_sync",
                            "mlp_ckpt_end only", "mlp_loader_read-ahead",
                            "mlp_loader_no read-ahead"}
    assert all(r > 0 for r in results.values())
    out = capsys.readouterr().out
    assert "tiny      plain" in out and "mlp_loader plain" in out and "ratio" in out


def _bench(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_save_timeline_runs_every_mode(capsys):
    results = _bench("save_timeline").main(["--steps", "300", "--runs", "1"])
    assert set(results) == {"background", "on the step", "no save"}
    assert all(save_step > 0 for [(save_step, _)] in results.values())
    assert "window beyond steady" in capsys.readouterr().out


def test_save_step_benchmark_runs_both_modes(capsys):
    results = _bench("save_step").main(["--steps", "40", "--runs", "1"])
    assert set(results) == {"background", "on the step"}
    assert "the save step" in capsys.readouterr().out


def test_step_breakdown_adds_up_and_puts_back_what_it_timed(capsys):
    from distribute import strategy
    update = strategy.StrategyExtended.apply_gradients
    results = _bench("step_breakdown").main(["--steps", "50", "--rounds", "2"])
    assert strategy.StrategyExtended.apply_gradients is update
    for parts in results.values():
        assert all(parts[p] > 0 for p in ("forward", "update", "total"))
        assert parts["forward"] + parts["update"] + parts["rest"] == pytest.approx(parts["total"])
    assert "ours" in capsys.readouterr().out


def test_canned_benchmark_runs(capsys):
    ratio = _bench("canned").main(["--rounds", "1", "--steps", "5", "--batch", "32"])
    assert ratio > 0 and "canned" in capsys.readouterr().out


def test_data_serving_benchmark_runs(capsys):
    _bench("data_serving").main(["--records", "300", "--requests", "20"])
    out = capsys.readouterr().out
    assert "records/s" in out and "8 client(s)" in out


@pytest.mark.slow
def test_coordinator_benchmark_runs(capsys):
    results = _bench("coordinator_bench").main(["--steps", "20"])
    assert set(results) == {"one process", "1 worker(s)", "2 worker(s)"}
    assert all(rate > 0 for rate in results.values())
    assert "2 worker(s)" in capsys.readouterr().out


@pytest.mark.slow
def test_ddp_benchmark_runs_with_batch_norm(capsys):
    ratios = _bench("ddp_bench").main(["--rounds", "1", "--steps", "30", "--batch_norm"])
    assert len(ratios) == 3 and all(r > 0 for r in ratios)
    assert "with batch norm" in capsys.readouterr().out


def test_linear_sdca_benchmark_runs(capsys):
    results = _bench("linear_sdca").main(["--rounds", "1", "--steps", "3", "--batch", "8"])
    assert results["sdca"] > 0 and results["ftrl"] > 0
    assert "us an example" in capsys.readouterr().out
