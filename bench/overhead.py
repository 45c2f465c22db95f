"""Per-step overhead of Estimator.train against a plain PyTorch loop.

Two models, each trained for a fixed number of steps through `Estimator.train`
(default RunConfig: checkpoints every 600 s and at the end, summaries every
100 steps, step counter and loss logging every 100 steps) and through the
plain loop `zero_grad / forward / backward / step`, alternating in one run;
prints steps/s of each (median of the rounds) and the ratio (the median of
the rounds' ratios).

    python bench/overhead.py [--rounds 9] [--tiny_steps 20000] [--mlp_steps 1000] [--clock cpu]

On a shared machine, load from other tenants slows single runs by 10-30%;
the median of nine rounds' ratios keeps one slowed run from setting the figure.

Targets (issue 2): MLP >= 0.97 of the plain loop, tiny model >= 0.85.
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

MODELS = {
    # name: (factory, input width, output width, batch, loss, lr)
    "tiny": (lambda: torch.nn.Linear(10, 1), 10, 1, 32, "mse", 0.01),
    "mlp": (lambda: torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
        torch.nn.ReLU(), torch.nn.Linear(512, 10)), 784, 10, 128, "xent", 0.01),
}


_clock = time.perf_counter   # --clock cpu: time.process_time (every thread's CPU time)


def _data(width, out, batch, loss, n=64):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(batch, width, generator=g) for _ in range(n)]
    ys = [torch.randn(batch, out, generator=g) if loss == "mse"
          else torch.randint(0, out, (batch,), generator=g) for _ in range(n)]
    return list(zip(xs, ys))


def _loss_fn(kind):
    return torch.nn.functional.mse_loss if kind == "mse" else torch.nn.functional.cross_entropy


def _cycle(batches, steps):
    for i in range(steps):
        yield batches[i % len(batches)]


def plain_loop(name, batches, steps):
    factory, _, _, _, loss_kind, lr = MODELS[name]
    loss_fn = _loss_fn(loss_kind)
    torch.manual_seed(0)
    start = _clock()   # model creation counts on both sides
    model = factory()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in _cycle(batches, steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return steps / (_clock() - start)


def estimator_loop(name, batches, steps):
    factory, _, _, _, loss_kind, lr = MODELS[name]
    loss_fn = _loss_fn(loss_kind)

    def model_fn(features, labels, mode):
        net = est.get_module("net", factory)
        loss = loss_fn(net(features["x"]), labels)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)

    def input_fn():
        return (({"x": x}, y) for x, y in _cycle(batches, steps))

    with tempfile.TemporaryDirectory() as model_dir:
        torch.manual_seed(0)
        e = est.Estimator(model_fn, config=est.RunConfig(model_dir=model_dir))
        start = _clock()
        e.train(input_fn, steps=steps)
        return steps / (_clock() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Estimator.train vs a plain PyTorch loop")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tiny_steps", type=int, default=20000)
    parser.add_argument("--mlp_steps", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: keep)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: elapsed time; cpu: the process's CPU time, all threads "
                             "(steadier where other machines' load steals time)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    global _clock
    _clock = time.process_time if args.clock == "cpu" else time.perf_counter
    results = {}
    for name, steps in (("tiny", args.tiny_steps), ("mlp", args.mlp_steps)):
        _, width, out, batch, loss_kind, _ = MODELS[name]
        batches = _data(width, out, batch, loss_kind)
        plain_loop(name, batches, min(steps, 200))        # warm-up both paths
        estimator_loop(name, batches, min(steps, 200))
        plain, ours = [], []
        for i in range(args.rounds):   # alternate in one run, each side first in turn
            if i % 2:
                ours.append(estimator_loop(name, batches, steps))
                plain.append(plain_loop(name, batches, steps))
            else:
                plain.append(plain_loop(name, batches, steps))
                ours.append(estimator_loop(name, batches, steps))
        p, o = statistics.median(plain), statistics.median(ours)
        # The ratio of each round's neighbouring runs: load from other processes
        # on a shared machine slows both sides of a round alike.
        ratio = statistics.median(b / a for a, b in zip(plain, ours))
        results[name] = ratio
        print(f"{name:5s} plain {p:9.1f} steps/s   Estimator.train {o:9.1f} steps/s   "
              f"ratio {ratio:.3f} (median of {args.rounds} rounds; of the medians "
              f"{o / p:.3f})", flush=True)
    return results


if __name__ == "__main__":
    main()
