"""train_and_evaluate: the same program on every task of a cluster, its role
from TF_CONFIG; alone (no TF_CONFIG) it trains and evaluates locally.

    python examples/train_and_evaluate.py --model_dir runs/tae
    estimator launch examples/train_and_evaluate.py --workers 2 --evaluator \\
        -- --model_dir runs/tae --strategy multi_worker_mirrored

A linear regression y = x.w + 1 on 3 features; evaluation after every
checkpoint, the best, the latest and the final model exported as torch.export
programs under model_dir/export/. The process that evaluates (local mode or
the evaluator task) prints its last result as one JSON line:
`FINAL_EVAL {"loss": ..., "global_step": ..., "exports": [...]}`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import distribute  # noqa: E402
import estimator as est  # noqa: E402
import hooks  # noqa: E402

TRUE_W = np.array([[2.0], [-3.0], [0.5]], dtype=np.float32)


def data(n: int, seed: int):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 3).astype(np.float32)
    return x, x @ TRUE_W + 1.0


def train_input_fn(input_context=None):
    """An endless shuffled stream; each input pipeline draws its own examples."""
    seed = 1 + (input_context.input_pipeline_id if input_context else 0)
    x, y = data(1024, seed)
    rng = np.random.RandomState(seed)

    def batches():
        while True:
            for i in rng.permutation(len(x) // 32):
                yield {"x": x[i * 32:(i + 1) * 32]}, y[i * 32:(i + 1) * 32]
    return batches()


def eval_input_fn():
    x, y = data(128, seed=0)
    return [({"x": x[i:i + 32]}, y[i:i + 32]) for i in range(0, len(x), 32)]


def model_fn(features, labels, mode, params):
    net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
    pred = net(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": pred})
    loss = torch.nn.functional.mse_loss(pred, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "mae": est.metrics.mean_absolute_error(labels, pred)})
    optimizer = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=params["learning_rate"]))
    return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)


serving_input_receiver_fn = est.export.build_raw_serving_input_receiver_fn(
    {"x": torch.zeros(1, 3)})


class _SlowSteps(hooks.SessionRunHook):
    """Sleeps after every step: a slow trainer, for demonstrations and tests."""

    def __init__(self, secs: float):
        self._secs = secs

    def after_run(self, run_context, run_values):
        time.sleep(self._secs)


def _strategy(name: str):
    return distribute.MultiWorkerMirroredStrategy() if name == "multi_worker_mirrored" else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default=None)
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--save_checkpoints_steps", type=int, default=20)
    parser.add_argument("--keep_checkpoint_max", type=int, default=5)
    parser.add_argument("--throttle_secs", type=float, default=0)
    parser.add_argument("--start_delay_secs", type=float, default=0)
    parser.add_argument("--checkpoint_policy", default="latest", choices=["latest", "every"])
    parser.add_argument("--strategy", default="default",
                        choices=["default", "multi_worker_mirrored"])
    parser.add_argument("--step_sleep", type=float, default=0.0,
                        help="seconds each training step sleeps (a slow trainer)")
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--stop_if_loss_below", type=float, default=None,
                        help="early stopping on the evaluation loss (even when the "
                             "evaluator is a task of its own)")
    parser.add_argument("--early_stopping_every_steps", type=int, default=100,
                        help="how often the chief's early-stopping hook reads eval results")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    strategy = _strategy(args.strategy)
    config = est.RunConfig(model_dir=args.model_dir, tf_random_seed=7,
                           save_checkpoints_steps=args.save_checkpoints_steps,
                           keep_checkpoint_max=args.keep_checkpoint_max,
                           train_distribute=strategy, log_step_count_steps=50)
    estimator = est.Estimator(model_fn, config=config,
                              params={"learning_rate": args.learning_rate})
    train_hooks = [_SlowSteps(args.step_sleep)] if args.step_sleep else []
    if args.stop_if_loss_below is not None:
        train_hooks.append(hooks.stop_if_lower_hook(
            estimator, "loss", args.stop_if_loss_below, run_every_secs=None,
            run_every_steps=args.early_stopping_every_steps))
    train_spec = est.TrainSpec(train_input_fn, max_steps=args.max_steps, hooks=train_hooks)
    eval_spec = est.EvalSpec(
        eval_input_fn, steps=None, start_delay_secs=args.start_delay_secs,
        throttle_secs=args.throttle_secs, checkpoint_policy=args.checkpoint_policy,
        exporters=[est.BestExporter("best", serving_input_receiver_fn, exports_to_keep=2),
                   est.LatestExporter("latest", serving_input_receiver_fn, exports_to_keep=2),
                   est.FinalExporter("final", serving_input_receiver_fn)])
    outcome = est.train_and_evaluate(estimator, train_spec, eval_spec)
    if outcome is not None and outcome[0] is not None:
        result, exports = outcome
        print("FINAL_EVAL " + json.dumps(dict(result, exports=exports),   # numpy, as TF's
                                         default=lambda v: v.tolist()), flush=True)
    return outcome


if __name__ == "__main__":
    main()
