"""What a checkpoint save costs the step it is made on, for a model of a real
size: a 60-block conv net (conv, batch norm, ReLU; 2.2 M parameters, 360
state tensors, 27 MB with Adam's slots) saving every 10 steps, in the
background (staged, serialized by the writer process) and on the step.
Prints, for each, the median time of a save step beyond the median step.

    python bench/save_step.py [--steps 200] [--runs 2]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import estimator as est  # noqa: E402

EVERY = 10


def _net() -> torch.nn.Module:
    blocks = [torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1, bias=False),
                                  torch.nn.BatchNorm2d(64), torch.nn.ReLU()) for _ in range(60)]
    return torch.nn.Sequential(*blocks, torch.nn.Flatten(), torch.nn.Linear(64 * 16, 10))


def model_fn(features, labels, mode):
    net = est.get_module("net", _net)
    loss = torch.nn.functional.cross_entropy(net(features["x"]), labels)
    opt = est.get_optimizer(lambda p: torch.optim.Adam(p, 1e-3))
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def save_step_cost(steps: int, background: bool) -> float:
    """Median seconds a save step takes beyond the median step."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 64, 4, 4, generator=g), torch.randint(0, 10, (8,), generator=g)
    stamps = []

    def input_fn():
        for _ in range(steps):
            stamps.append(time.perf_counter())
            yield {"x": x}, y
    with tempfile.TemporaryDirectory() as model_dir:
        config = est.RunConfig(model_dir=model_dir, save_checkpoints_steps=EVERY,
                               experimental_async_checkpoint=background)
        est.Estimator(model_fn, config=config).train(input_fn, steps=steps)
    # stamps[k] - stamps[k - 1]: step k, whose after_run saves when k % EVERY == 0
    took = {k: stamps[k] - stamps[k - 1] for k in range(2 * EVERY + 1, steps)}
    saves = [t for k, t in took.items() if k % EVERY == 0]
    others = [t for k, t in took.items() if k % EVERY not in (0, 1)]
    return statistics.median(saves) - statistics.median(others)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)   # (steadier on a shared machine; the save is not threaded)
    results = {}
    for _ in range(args.runs):
        for mode, background in (("background", True), ("on the step", False)):
            cost = save_step_cost(args.steps, background)
            results.setdefault(mode, []).append(cost)
            print(f"conv net, save every {EVERY} steps, {mode:11s}: the save step "
                  f"{1e3 * cost:6.1f} ms beyond a step", flush=True)
    return results


if __name__ == "__main__":
    main()
