"""A TF_CONFIG multi-worker program: the TF1 "multi-worker training with
Estimator" tutorial. The same script runs on every task; TF_CONFIG says which
task it is, MultiWorkerMirroredStrategy joins the chief and the workers into one
synchronous group, and `train_and_evaluate` does what the role says.

On each machine, with its own TF_CONFIG (the chief's shown; a worker says
"type": "worker"):

    TF_CONFIG='{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]},
                "task": {"type": "chief", "index": 0}}' \\
        python examples/multi_worker.py --model_dir /shared/runs/multi_worker

On one machine, to try it: `--local_workers N` starts the chief and N workers
as processes of this script, each with a TF_CONFIG written by hand below.
(`estimator launch --workers N examples/multi_worker.py` does the same, with
restarts and output prefixes.)

    python examples/multi_worker.py --local_workers 1 --model_dir runs/multi_worker
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import distribute  # noqa: E402
import estimator as est  # noqa: E402


def input_fn(params, mode, input_context=None):
    """Each worker reads its own shard (input_pipeline_id of num_input_pipelines)
    of y = x . [1, -2, 3, 0.5] + 0.5."""
    w = np.array([[1.0], [-2.0], [3.0], [0.5]], dtype=np.float32)
    shard = input_context.input_pipeline_id if input_context else 0
    rng = np.random.RandomState(10 + shard if mode == est.ModeKeys.TRAIN else 0)
    batch = params["batch_size"]

    def batches(n):
        for _ in range(n):
            x = rng.randn(batch, 4).astype(np.float32)
            yield {"x": x}, x @ w + 0.5
    return batches(10_000 if mode == est.ModeKeys.TRAIN else 8)


def model_fn(features, labels, mode, params):
    net = est.get_module("dense", lambda: torch.nn.Linear(4, 1))
    pred = net(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": pred})
    loss = torch.nn.functional.mse_loss(pred, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "rmse": est.metrics.root_mean_squared_error(labels, pred)})
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=params["learning_rate"]))
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def train(model_dir: str, max_steps: int):
    """What every task runs. Returns the chief's evaluation, else None."""
    strategy = distribute.MultiWorkerMirroredStrategy()     # the cluster comes from TF_CONFIG
    config = est.RunConfig(model_dir=model_dir, train_distribute=strategy,
                           save_checkpoints_steps=max_steps, tf_random_seed=3)
    print(f"task {config.task_type}:{config.task_id} of {config.num_worker_replicas} "
          f"trainers; TF_CONFIG={os.environ.get('TF_CONFIG', '(none)')}", flush=True)
    estimator = est.Estimator(model_fn, config=config,
                              params={"batch_size": 16, "learning_rate": 0.05})
    est.train_and_evaluate(estimator, est.TrainSpec(input_fn, max_steps=max_steps),
                           est.EvalSpec(input_fn, steps=None, start_delay_secs=0,
                                        throttle_secs=0))
    if not config.is_chief:
        return None
    result = estimator.evaluate(input_fn)    # the chief reports; a cluster would use an evaluator
    print("CHIEF_EVAL " + json.dumps({k: float(v) for k, v in result.items()}), flush=True)
    return result


def _free_ports(n: int):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_local_cluster(workers: int, model_dir: str, max_steps: int, timeout: float = 300):
    """Start the chief and `workers` workers of this script with hand-written
    TF_CONFIGs; wait for all; return the chief's output. A failed task stops
    the others."""
    ports = _free_ports(workers + 1)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
               "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    tasks = [("chief", 0)] + [("worker", i) for i in range(workers)]
    procs, logs = [], []
    deadline = time.monotonic() + timeout
    try:
        for task_type, index in tasks:
            tf_config = {"cluster": cluster, "task": {"type": task_type, "index": index}}
            env = dict(os.environ, TF_CONFIG=json.dumps(tf_config))
            logs.append(tempfile.TemporaryFile("w+"))
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--model_dir", model_dir,
                 "--max_steps", str(max_steps)], env=env, stdout=logs[-1],
                stderr=subprocess.STDOUT, text=True))
        while any(p.poll() is None for p in procs):
            failed = [t for t, p in zip(tasks, procs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        for p in procs:          # nothing outlives us: failure, timeout or Ctrl-C
            if p.poll() is None:
                p.kill()
            p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    for (task_type, index), p, out in zip(tasks, procs, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"{task_type} {index} exited with {p.returncode}:\n{out}")
    return outputs[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/multi_worker")
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--local_workers", type=int, default=None,
                        help="start a chief and this many workers here, TF_CONFIG by hand")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.local_workers is None:
        return train(args.model_dir, args.max_steps)
    chief_output = run_local_cluster(args.local_workers, args.model_dir, args.max_steps)
    print(chief_output, end="")
    line = next(l for l in chief_output.splitlines() if l.startswith("CHIEF_EVAL "))
    return json.loads(line[len("CHIEF_EVAL "):])


if __name__ == "__main__":
    main()
