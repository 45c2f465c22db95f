"""One task of a MultiWorkerMirroredStrategy cluster, for tests/distribute/test_multi_worker.py.

Run with TF_CONFIG (or torchrun's environment) set:

    python tests/support/cluster_task.py MODEL_DIR OUT_DIR --steps 5 [--evaluate] [--export]
        [--fail die|hang|raise|raise_in_input_fn] [--fail-replica RANK]

Trains the regression model on batches of 16 (the input_fn ignores its
input_context, so each task keeps every n-th batch), writes this replica's
weights to OUT_DIR/weights-<rank>.pt and, with --evaluate, the evaluation of
a 7-batch set to OUT_DIR/eval-<rank>.json; with --export, every task exports
(as a TF1 script's train, evaluate, export on every worker does) and writes
the export's path and its RunConfig's is_chief to OUT_DIR/export-<rank>.json.
"""
import argparse
import atexit
import json
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]   # the repository, tests/support

import torch  # noqa: E402

import distribute  # noqa: E402
import estimator as est  # noqa: E402
from models import regression_model_fn  # noqa: E402
from replica_helpers import OnReplica, SaveWeights, batches, rank  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--evaluate", action="store_true")
    parser.add_argument("--export", action="store_true")
    parser.add_argument("--fail", choices=["die", "hang", "raise", "raise_in_input_fn"])
    parser.add_argument("--fail-replica", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    # (registered before the strategy's exit wait: printed after it)
    atexit.register(lambda: print(f"exited at {time.time():.3f}", flush=True))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    strategy = distribute.MultiWorkerMirroredStrategy(
        communication_options=distribute.CommunicationOptions(timeout_seconds=args.timeout))
    e = est.Estimator(regression_model_fn, config=est.RunConfig(
        model_dir=args.model_dir, train_distribute=strategy, eval_distribute=strategy,
        tf_random_seed=3, save_checkpoints_steps=100),
        params={"lr": 0.05, "momentum": 0.9})
    train_hooks = [SaveWeights(args.out_dir)]
    if args.fail in ("die", "hang", "raise"):
        train_hooks.append(OnReplica(args.fail_replica, 2, args.fail))

    def input_fn():
        if args.fail == "raise_in_input_fn" and rank() == args.fail_replica:
            print(f"raising at {time.time():.3f}", flush=True)
            raise ValueError(f"boom on replica {rank()}")
        return batches(batch_size=16)
    e.train(input_fn, steps=args.steps, hooks=train_hooks)
    if args.evaluate:
        result = e.evaluate(lambda: batches(n=210, batch_size=30, seed=1))
        with open(os.path.join(args.out_dir, f"eval-{rank()}.json"), "w") as f:
            json.dump(result, f, default=lambda v: v.tolist())   # (numpy values, as TF's)
    if args.export:
        receiver = est.export.build_raw_serving_input_receiver_fn(
            {"x": est.export.placeholder(torch.float32, [None, 3])})
        path = e.export_saved_model(os.path.join(args.out_dir, "export"), receiver)
        with open(os.path.join(args.out_dir, f"export-{rank()}.json"), "w") as f:
            json.dump({"path": path, "is_chief": e.config.is_chief}, f)


if __name__ == "__main__":
    main()
