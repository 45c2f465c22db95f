"""A custom training loop on MonitoredTrainingSession, as TF1 pipelines wrote
them without an Estimator: hooks, checkpoints and resuming come from the
session; the loop body is plain PyTorch.

    python examples/monitored_training_session.py [--checkpoint_dir runs/mts] [--last_step 200]

Run it twice: the second run resumes from the first one's checkpoint.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import estimator as est  # noqa: E402
import hooks  # noqa: E402


def batches(seed: int = 0, batch_size: int = 32):
    """An endless stream of y = 3x - 1 + noise."""
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(batch_size, 1, generator=g)
        yield x, 3 * x - 1 + 0.01 * torch.randn(batch_size, 1, generator=g)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint_dir", default="runs/mts")
    parser.add_argument("--last_step", type=int, default=200)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    with hooks.MonitoredTrainingSession(
            checkpoint_dir=args.checkpoint_dir, save_checkpoint_steps=50,
            hooks=[hooks.StopAtStepHook(last_step=args.last_step)]) as sess:
        net = est.get_module("net", lambda: torch.nn.Linear(1, 1))   # restored if saved
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.05))
        start = est.get_global_step()
        print(f"starting at global step {start}")

        def train_step(x, y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            return loss

        data = batches(seed=start)
        while not sess.should_stop():
            sess.run(train_step, *next(data))
        step = est.get_global_step()
    w, b = net.weight.item(), net.bias.item()
    print(f"finished at global step {step}: y = {w:.3f} x + {b:.3f}")
    return start, step, w, b


if __name__ == "__main__":
    main()
