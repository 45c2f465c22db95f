"""A train_and_evaluate program for the standalone client test: run by the
client (which sends it to every task's `estimator server`) and, with
TF_CONFIG set by its server, by each task.

    python remote_program.py MODEL_DIR CLUSTER_JSON
"""
import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]

import estimator as est  # noqa: E402
from models import regression_input_fn, regression_model_fn  # noqa: E402


def main():
    model_dir, cluster = sys.argv[1], json.loads(sys.argv[2])
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(f"program started as {os.environ.get('TF_CONFIG', 'the client')} (pid {os.getpid()})",
          flush=True)
    config = est.RunConfig(model_dir=model_dir, save_checkpoints_steps=20,
                           experimental_distribute=est.DistributeConfig(remote_cluster=cluster))
    estimator = est.Estimator(regression_model_fn, config=config)
    est.train_and_evaluate(
        estimator, est.TrainSpec(regression_input_fn(), max_steps=60),
        est.EvalSpec(regression_input_fn(repeat=False), steps=4, throttle_secs=0,
                     start_delay_secs=0))


if __name__ == "__main__":
    main()
