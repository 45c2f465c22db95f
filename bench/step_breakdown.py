"""Where the tiny model's step time goes, ours against the plain loop's.

Trains `bench/overhead.py`'s tiny model through `Estimator.train` and the
plain loop, alternating, and times three parts of each step: the forward
pass (ours: the whole model_fn call, with `get_module`, `get_optimizer` and
the EstimatorSpec), the update (`backward`, `step`, `zero_grad`: the same
three torch calls on both sides; ours timed around
`StrategyExtended.apply_gradients`) and the rest (ours: the session, the
hooks' schedule, the input and its move to the device; plain: the loop).
Prints microseconds per step, the median of the rounds.

    python bench/step_breakdown.py [--steps 20000] [--rounds 4]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402
import estimator as est  # noqa: E402

from distribute import strategy as _strategy  # noqa: E402

_clock = time.perf_counter_ns


def ours(batches, steps: int) -> dict:
    spent = {"forward": 0, "update": 0}
    update = _strategy.StrategyExtended.apply_gradients

    def timed_update(self, loss, optimizer):
        start = _clock()
        update(self, loss, optimizer)
        spent["update"] += _clock() - start

    def model_fn(features, labels, mode):
        start = _clock()
        net = est.get_module("net", lambda: torch.nn.Linear(10, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        spec = est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.01)))
        spent["forward"] += _clock() - start
        return spec

    _strategy.StrategyExtended.apply_gradients = timed_update
    try:
        with tempfile.TemporaryDirectory() as model_dir:
            e = est.Estimator(model_fn, config=est.RunConfig(model_dir=model_dir))
            start = _clock()
            e.train(lambda: (({"x": x}, y) for x, y in overhead._cycle(batches, steps)),
                    steps=steps)
            total = _clock() - start
    finally:
        _strategy.StrategyExtended.apply_gradients = update
    return dict(spent, rest=total - spent["forward"] - spent["update"], total=total)


def plain(batches, steps: int) -> dict:
    spent = {"forward": 0, "update": 0}
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start_all = _clock()
    for x, y in overhead._cycle(batches, steps):
        start = _clock()
        loss = torch.nn.functional.mse_loss(model(x), y)
        middle = _clock()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        spent["forward"] += middle - start
        spent["update"] += _clock() - middle
    total = _clock() - start_all
    return dict(spent, rest=total - spent["forward"] - spent["update"], total=total)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    _, width, out, batch, loss_kind, _ = overhead.MODELS["tiny"]
    batches = overhead._data(width, out, batch, loss_kind)
    ours(batches, 1000), plain(batches, 1000)   # warm-up
    runs = {"ours": [], "plain": []}
    for i in range(args.rounds):   # alternating, each side first in turn
        for side in (("ours", "plain") if i % 2 == 0 else ("plain", "ours")):
            runs[side].append((ours if side == "ours" else plain)(batches, args.steps))
    parts = ("forward", "update", "rest", "total")
    for side, results in runs.items():
        print(f"{side:5s} " + "  ".join(
            f"{part} {statistics.median(r[part] for r in results) / args.steps / 1e3:5.1f} us"
            for part in parts))
    return {side: {part: statistics.median(r[part] for r in results) / args.steps / 1e3
                   for part in parts} for side, results in runs.items()}


if __name__ == "__main__":
    main()
