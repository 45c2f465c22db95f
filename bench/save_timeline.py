"""Where a checkpoint save's cost lands: the time of each step around a save.

Trains `bench/overhead.py`'s model with a checkpoint every 100 steps, written
in the background (the writer process) and on the step, and with the default
config (no save until the last), timestamping each step as input_fn hands out
its batch; prints the mean time of the save step and of the steps after it,
the steady step (median of positions 40-99), and what a window of 100 steps
costs beyond 100 steady steps. Positions are global step mod 100: the save is
in step 0 of the window, the logging and summary hooks in step 1 (every mode).

    python bench/save_timeline.py [--model tiny|mlp] [--steps 2000] [--runs 2]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402

MODES = {"background": (100, True), "on the step": (100, False), "no save": (None, None)}


def timeline(name: str, steps: int, ckpt_every, async_checkpoint) -> dict:
    """{position mod 100: mean step seconds} of one run (its first and last
    windows left out)."""
    _, width, out, batch, loss_kind, _ = overhead.MODELS[name]
    stamps = []
    overhead.estimator_loop(name, overhead._data(width, out, batch, loss_kind), steps,
                            ckpt_every, async_checkpoint,
                            on_batch=lambda: stamps.append(time.perf_counter()))
    # stamps[k - 1]: step k begins (the first batch is taken before the loop).
    by_position = defaultdict(list)
    for k in range(150, steps - 50):
        by_position[k % 100].append(stamps[k] - stamps[k - 1])
    return {p: statistics.mean(v) for p, v in by_position.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(overhead.MODELS), default="tiny")
    parser.add_argument("--steps", type=int, default=2000, help="at least 300")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    timeline(args.model, 300, None, None)   # warm-up
    results = defaultdict(list)   # mode: [(save step, window beyond steady) per run]
    for _ in range(args.runs):
        for mode, (every, background) in MODES.items():
            mean = timeline(args.model, args.steps, every, background)
            steady = statistics.median(mean[p] for p in range(40, 100))
            after = " ".join(f"{1e6 * mean[p]:.0f}" for p in range(1, 8))
            excess = sum(mean.values()) - 100 * steady
            print(f"{args.model} {mode:12s} save step {1e6 * mean[0]:7.0f} us, then {after} us; "
                  f"steady {1e6 * steady:.0f} us; window beyond steady {1e3 * excess:.2f} ms",
                  flush=True)
            results[mode].append((mean[0], excess))
    return dict(results)


if __name__ == "__main__":
    main()
