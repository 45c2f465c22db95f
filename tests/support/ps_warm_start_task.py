"""One task of a ParameterServerStrategy cluster training the linear
regression of tests/support/linear_port.py warm-started, as a list, from a
TF checkpoint with Adam's slots (tests/estimator/test_warm_start_slots.py).

Run by the launcher (estimator.launch) with TF_CONFIG set:

    python tests/support/ps_warm_start_task.py MODEL_DIR TF_CHECKPOINT --max-steps 5
"""
import argparse
import itertools
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]   # the repository, tests/support

import torch  # noqa: E402

import distribute  # noqa: E402
import estimator as est  # noqa: E402
from linear_port import BATCHES, dense  # noqa: E402


def model_fn(features, labels, mode):
    loss = est.losses.mean_squared_error(labels, dense(features))
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: est.optimizers.Adam(p, 0.1)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("tf_checkpoint")
    parser.add_argument("--max-steps", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    strategy = distribute.ParameterServerStrategy(timeout_secs=20, init_timeout_secs=60)
    config = est.RunConfig(model_dir=args.model_dir, train_distribute=strategy,
                           log_step_count_steps=None)
    estimator = est.Estimator(model_fn, config=config, warm_start_from=est.WarmStartSettings(
        args.tf_checkpoint, vars_to_warm_start=[".*"],
        var_name_to_prev_var_name={"dense/weight": "dense/kernel"}))
    est.train_and_evaluate(
        estimator, est.TrainSpec(lambda: itertools.cycle(BATCHES), max_steps=args.max_steps),
        est.EvalSpec(lambda: BATCHES, steps=None, start_delay_secs=0, throttle_secs=0))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
