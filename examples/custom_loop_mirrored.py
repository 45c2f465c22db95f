"""A custom training loop with MirroredStrategy: `strategy.run` and
`strategy.reduce` on replicas of the CPU (TF2's custom-loop pattern).

    python examples/custom_loop_mirrored.py [--devices cpu:0,cpu:1] [--steps 200]

`strategy.extended.call_for_each_replica(train)` starts one process per
device and runs `train` in each; there `experimental_distribute_dataset`
gives each replica its slice of every global batch, the model built through
the session's scope is wrapped for gradient all-reduce, `strategy.run` runs
the step, and `strategy.reduce` averages the replicas' losses. Only the
chief (replica 0) writes checkpoints. One device (`--devices cpu:0`) runs
the same loop in this process: the weights come out the same.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import distribute  # noqa: E402
import estimator as est  # noqa: E402
import hooks  # noqa: E402


def global_batches(steps: int, batch_size: int = 64, seed: int = 0):
    """`steps` global batches of y = 3x - 1 + noise (the same on every replica)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(batch_size, 1, generator=g)
        yield x, 3 * x - 1 + 0.01 * torch.randn(batch_size, 1, generator=g)


def train(strategy, model_dir: str, steps: int):
    """The loop one replica runs; returns (global step, mean loss, w, b)."""
    dataset = strategy.experimental_distribute_dataset(global_batches(steps))
    with hooks.MonitoredTrainingSession(
            checkpoint_dir=model_dir, strategy=strategy, save_checkpoint_steps=100,
            log_step_count_steps=None, hooks=[hooks.StopAtStepHook(last_step=steps)]) as sess:
        torch.manual_seed(0)
        net = est.get_module("net", lambda: torch.nn.Linear(1, 1))   # DDP-wrapped
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))

        def step_fn(x, y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()          # gradients are averaged over the replicas here
            opt.step()
            return loss

        mean_loss = None
        for x, y in dataset:
            if sess.should_stop():
                break
            per_replica = sess.run(strategy.run, step_fn, args=(x, y))
            if per_replica is None:   # another replica stopped: so does this one
                break
            mean_loss = strategy.reduce(distribute.ReduceOp.MEAN, per_replica, axis=None)
        step = est.get_global_step()
    module = sess.session.scope.raw_modules["net"]
    return step, mean_loss.item(), module.weight.item(), module.bias.item()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cpu:0,cpu:1")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--model_dir", default="runs/custom_loop_mirrored")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    strategy = distribute.MirroredStrategy(args.devices.split(","))
    results = strategy.extended.call_for_each_replica(train, (strategy, args.model_dir,
                                                              args.steps))
    for replica, (step, loss, w, b) in enumerate(results):
        print(f"replica {replica}: global step {step}, mean loss {loss:.5f}, "
              f"y = {w:.4f} x + {b:.4f}")
    return results


if __name__ == "__main__":
    main()
