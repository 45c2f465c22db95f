"""ClusterCoordinator throughput: scheduled training steps per second with 1
and 2 workers (2 ps tasks, every task a process on this machine) against one
process doing the same steps (forward, backward, SGD step) in a plain loop.

    python bench/coordinator_bench.py [--steps 400] [--batch 64]

Each scheduled step is a round trip: the function and its arguments to ps
0's queue, a worker takes it, pulls the changed parameters, computes, pushes
the gradients to the ps tasks (which apply them) and reports the result.
The figure is the price of that protocol per step on a model small enough
for it to dominate (an MLP 32-64-64-2, batch 64).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import distribute  # noqa: E402

FEATURES = 32


def make_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))


def make_sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def dataset_fn(input_context):
    batch = int(os.environ.get("BENCH_BATCH", "64"))
    g = torch.Generator().manual_seed(input_context.input_pipeline_id)
    x = torch.randn(batch * 16, FEATURES, generator=g)
    y = (x[:, 0] > 0).long()

    def batches():
        i = 0
        while True:
            yield x[i:i + batch], y[i:i + batch]
            i = (i + batch) % (batch * 16)
    return batches()


def train_step(iterator, net, optimizer):
    x, y = next(iterator)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def plain(steps: int) -> float:
    net, it = make_net(), dataset_fn(distribute.InputContext(1, 0, 1))
    opt = make_sgd(net.parameters())
    start = time.perf_counter()
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return steps / (time.perf_counter() - start)


def _ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def coordinate(cluster: dict, steps: int, out: str) -> None:
    import coordinator_bench as me   # functions by reference, importable by the workers
    resolver = distribute.cluster_resolver.SimpleClusterResolver(
        distribute.cluster_resolver.ClusterSpec(cluster), task_type="chief", task_id=0)
    strategy = distribute.ParameterServerStrategy(resolver, init_timeout_secs=60)
    coordinator = distribute.experimental.coordinator.ClusterCoordinator(strategy)
    net = coordinator.create_module("net", me.make_net)
    opt = coordinator.create_optimizer("sgd", net, me.make_sgd)
    iterator = iter(coordinator.create_per_worker_dataset(me.dataset_fn))
    for _ in range(20):   # warm-up: connections, first pulls
        coordinator.schedule(me.train_step, args=(iterator, net, opt))
    coordinator.join()
    start = time.perf_counter()
    values = [coordinator.schedule(me.train_step, args=(iterator, net, opt))
              for _ in range(steps)]
    coordinator.join()
    rate = steps / (time.perf_counter() - start)
    with open(out, "w") as f:
        json.dump({"steps_per_sec": rate, "last_loss": float(values[-1].fetch())}, f)
    coordinator.shutdown()


def run_cluster(workers: int, steps: int, batch: int) -> float:
    ports = _ports(3 + workers)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
               "ps": [f"127.0.0.1:{p}" for p in ports[1:3]],
               "worker": [f"127.0.0.1:{p}" for p in ports[3:]]}
    env = dict(os.environ, BENCH_BATCH=str(batch), OMP_NUM_THREADS="1")
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        try:
            for role, count in (("ps", 2), ("worker", workers), ("chief", 1)):
                for i in range(count):
                    procs.append(subprocess.Popen(
                        [sys.executable, __file__, "--role", role, "--index", str(i),
                         "--cluster", json.dumps(cluster), "--steps", str(steps), "--out", out],
                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            chief = procs[-1]
            if chief.wait(timeout=300) != 0:
                raise RuntimeError(chief.stderr.read()[-3000:])
            with open(out) as f:
                return json.load(f)["steps_per_sec"]
        finally:
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--role")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--cluster")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.role == "chief":
        return coordinate(json.loads(args.cluster), args.steps, args.out)
    if args.role:
        distribute.Server(json.loads(args.cluster), job_name=args.role, task_index=args.index,
                          end_grace_secs=5).join(timeout=600)
        return None
    os.environ["BENCH_BATCH"] = str(args.batch)
    torch.set_num_threads(1)
    local = plain(args.steps)
    results = {"one process": local}
    for workers in (1, 2):
        results[f"{workers} worker(s)"] = run_cluster(workers, args.steps, args.batch)
    for name, rate in results.items():
        print(f"{name:14s} {rate:8.1f} steps/s  ({rate / local:.3f} of one process)",
              flush=True)
    return results


if __name__ == "__main__":
    main()
