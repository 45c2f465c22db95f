"""TF2 parameter-server training with a ClusterCoordinator, on this machine:
2 ps tasks and 2 workers started as processes (`distribute.Server(...).join()`),
this process the coordinator, training an Iris classifier from data/iris.csv.

    python examples/ps_coordinator.py [--steps 300]

On a real cluster each task runs `distribute.Server(cluster, job_name, i).join()`
(TF_CONFIG names it) and the chief runs `coordinate`. The functions the
coordinator ships (the step, the model and optimizer factories, the dataset
function) are module-level functions of this module, importable by every
task: torch.distributed.rpc sends functions by name.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import distribute  # noqa: E402

SPECIES = ["setosa", "versicolor", "virginica"]


def iris(split: str):
    """(features, labels) of data/iris.csv: every 5th row is the test split."""
    rows = np.genfromtxt(os.path.join(ROOT, "data", "iris.csv"), delimiter=",", dtype=None,
                         names=True, encoding="utf-8")
    x = np.stack([rows[n] for n in rows.dtype.names[:4]], 1).astype(np.float32)
    y = np.array([SPECIES.index(s) for s in rows["species"]])
    test = np.arange(len(y)) % 5 == 0
    keep = test if split == "test" else ~test
    return torch.from_numpy(x[keep]), torch.from_numpy(y[keep])


def make_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def make_adagrad(params):
    return torch.optim.Adagrad(params, lr=0.1)


def dataset_fn(input_context):
    """Each worker's shard of the training rows, shuffled, batches of 16, endless."""
    x, y = iris("train")
    x, y = x[input_context.input_pipeline_id::input_context.num_input_pipelines], \
        y[input_context.input_pipeline_id::input_context.num_input_pipelines]
    g = torch.Generator().manual_seed(input_context.input_pipeline_id)

    def batches():
        while True:
            order = torch.randperm(len(y), generator=g)
            for i in range(0, len(y) - 15, 16):
                yield x[order[i:i + 16]], y[order[i:i + 16]]
    return batches()


def train_step(iterator, net, optimizer):
    x, y = next(iterator)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def coordinate(cluster: dict, steps: int) -> dict:
    from examples import ps_coordinator as me   # by reference: importable on the workers
    resolver = distribute.cluster_resolver.SimpleClusterResolver(
        distribute.cluster_resolver.ClusterSpec(cluster), task_type="chief", task_id=0)
    strategy = distribute.ParameterServerStrategy(resolver, init_timeout_secs=60)
    coordinator = distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        net = coordinator.create_module("net", me.make_net)
        optimizer = coordinator.create_optimizer("adagrad", net, me.make_adagrad)
    iterator = iter(coordinator.create_per_worker_dataset(me.dataset_fn))
    losses = [coordinator.schedule(me.train_step, args=(iterator, net, optimizer))
              for _ in range(steps)]
    coordinator.join()
    model = me.make_net()
    model.load_state_dict(coordinator.state_dict()["modules"]["net"])
    x, y = iris("test")
    accuracy = float((model(x).argmax(1) == y).float().mean())
    coordinator.shutdown()
    return {"accuracy": accuracy, "first_loss": float(losses[0].fetch()),
            "last_loss": float(losses[-1].fetch())}


def _ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    ports = _ports(5)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
               "ps": [f"127.0.0.1:{p}" for p in ports[1:3]],
               "worker": [f"127.0.0.1:{p}" for p in ports[3:5]]}
    server = ("import sys, json, distribute; c = json.loads(sys.argv[1]); "
              "distribute.Server(c, job_name=sys.argv[2], task_index=int(sys.argv[3]), "
              "end_grace_secs=5).join(timeout=600)")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    tasks = [subprocess.Popen([sys.executable, "-c", server, json.dumps(cluster), job, str(i)],
                              env=env, cwd=ROOT)
             for job, count in (("ps", 2), ("worker", 2)) for i in range(count)]
    try:
        result = coordinate(cluster, args.steps)
        print(f"loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}; "
              f"test accuracy {result['accuracy']:.3f}")
        return result
    finally:
        for task in tasks:
            try:
                task.wait(timeout=30)
            except subprocess.TimeoutExpired:
                task.kill()
                task.wait()


if __name__ == "__main__":
    main()
