"""MirroredStrategy (2 CPU replicas, gloo) against a plain DDP loop.

The same MLP (784-512-512-10, batch 128 per replica, SGD, cross-entropy) is
trained for a fixed number of steps by

- `plain`: two forked processes, `init_process_group("gloo")`,
  `DistributedDataParallel`, `zero_grad / forward / backward / step`;
- `ours`:  `Estimator.train` under `MirroredStrategy(["cpu:0", "cpu:1"])`
  with the default RunConfig (checkpoint at the end, summaries, step counter,
  loss logging and NaN check every 100 steps, the replicas' stop agreement
  and the loss mean every step),

alternating in one run. Two figures each: steps/s of the whole call, started
from the parent process (processes, rendezvous, model creation and our final
checkpoint count), and the steady rate from step 20 to the last, measured in
replica 0; and the steady steps per CPU second of replica 0's process (all its
threads), which other load on a shared machine disturbs far less. The
medians of the rounds are reported with their ratio, and the median of each
round's ratio.

    python bench/ddp_bench.py [--rounds 5] [--steps 1000] [--batch_norm]

`--batch_norm`: a BatchNorm1d after each hidden layer; plain DDP broadcasts
rank 0's statistics before each forward (its default), ours averages the
replicas' after it (TF's reading of per-replica moving averages).

Target (issue 4): ours >= 0.95 of plain DDP.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import distribute  # noqa: E402
import estimator as est  # noqa: E402
from estimator.experiment.launch import _free_ports  # noqa: E402
import hooks  # noqa: E402

REPLICAS = 2
BATCH_NORM = False   # --batch_norm (set before the processes fork)


def _mlp():
    def hidden(n_in):
        norm = [torch.nn.BatchNorm1d(512)] if BATCH_NORM else []
        return [torch.nn.Linear(n_in, 512), *norm, torch.nn.ReLU()]
    return torch.nn.Sequential(*hidden(784), *hidden(512), torch.nn.Linear(512, 10))


def _data(n=64, batch=128):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(n)]


def _cycle(batches, steps):
    for i in range(steps):
        yield batches[i % len(batches)]


def _threads() -> int:
    return max(1, (os.cpu_count() or 1) // REPLICAS)   # as MirroredStrategy sets them


WARM = 20   # steps excluded from the steady-state figure


def _plain_replica(rank, port, batches, steps, clock):
    torch.set_num_threads(_threads())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=REPLICAS, timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(_cycle(batches[rank::REPLICAS], steps), 1):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step == WARM:
            start, cpu = time.perf_counter(), time.process_time()
    if rank == 0:
        clock.put(((steps - WARM) / (time.perf_counter() - start),
                   (steps - WARM) / (time.process_time() - cpu)))
    dist.barrier()   # then exit (destroying the group can deadlock in torch 2.13's gloo)


def plain_ddp(batches, steps):
    """(steps/s of the whole call, steady steps/s after WARM steps, steady steps per
    CPU second of replica 0's process)."""
    port, = _free_ports(1)
    ctx = multiprocessing.get_context("fork")
    clock = ctx.SimpleQueue()
    start = time.perf_counter()
    procs = [ctx.Process(target=_plain_replica, args=(r, port, batches, steps, clock))
             for r in range(REPLICAS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        if p.exitcode != 0:
            raise RuntimeError(f"plain DDP replica failed with exit code {p.exitcode}")
    return (steps / (time.perf_counter() - start), *clock.get())


class _SteadyClock(hooks.SessionRunHook):
    """Steps/s from the end of step WARM to the end of the last step (in
    replica 0; its attributes come back to the caller's hook)."""

    def __init__(self, steps):
        self.steps, self.rates = steps, None

    def after_run(self, run_context, run_values):
        step = run_context.session.global_step
        if step == WARM:
            self._start, self._cpu = time.perf_counter(), time.process_time()
        elif step == self.steps:
            self.rates = ((self.steps - WARM) / (time.perf_counter() - self._start),
                          (self.steps - WARM) / (time.process_time() - self._cpu))


def ours(batches, steps):
    """As `plain_ddp`, for `Estimator.train` under MirroredStrategy."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", _mlp)
        loss = torch.nn.functional.cross_entropy(net(features), labels)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.01))
        return est.EstimatorSpec(mode, loss=loss, train_op=opt)

    def input_fn(input_context):
        mine = batches[input_context.input_pipeline_id::input_context.num_input_pipelines]
        return _cycle(mine, steps)

    strategy = distribute.MirroredStrategy([f"cpu:{i}" for i in range(REPLICAS)])
    clock = _SteadyClock(steps)
    with tempfile.TemporaryDirectory() as model_dir:
        torch.manual_seed(0)
        e = est.Estimator(model_fn, config=est.RunConfig(model_dir=model_dir,
                                                         train_distribute=strategy))
        start = time.perf_counter()
        e.train(input_fn, steps=steps, hooks=[clock])
        return (steps / (time.perf_counter() - start), *clock.rates)


def main(argv=None):
    parser = argparse.ArgumentParser(description="MirroredStrategy vs a plain DDP loop")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch_norm", action="store_true",
                        help="a BatchNorm1d after each hidden layer")
    args = parser.parse_args(argv)
    global BATCH_NORM
    BATCH_NORM = args.batch_norm
    logging.basicConfig(level=logging.WARNING)
    batches = _data()
    plain_ddp(batches, WARM + 10)   # warm-up both paths
    ours(batches, WARM + 10)
    plain, mine = [], []
    for _ in range(args.rounds):
        plain.append(plain_ddp(batches, args.steps))
        mine.append(ours(batches, args.steps))
        print("round: plain %6.1f steps/s (steady %6.1f, per CPU s %6.1f)   ours %6.1f steps/s "
              "(steady %6.1f, per CPU s %6.1f)" % (*plain[-1], *mine[-1]), flush=True)
    print(f"mlp 784-512-512-10{' with batch norm' if BATCH_NORM else ''}, batch 128 x "
          f"{REPLICAS} CPU replicas (gloo), {args.steps} steps, "
          f"{args.rounds} rounds:")
    ratios = []
    for what, k in (("whole call", 0), (f"steady (after step {WARM})", 1),
                    ("steady, per CPU second", 2)):
        p = statistics.median(r[k] for r in plain)
        o = statistics.median(r[k] for r in mine)
        paired = statistics.median(b[k] / a[k] for a, b in zip(plain, mine))
        ratios.append(o / p)
        print(f"  {what:24s} plain DDP {p:6.1f}   MirroredStrategy {o:6.1f}   "
              f"ratio {o / p:.3f} (median of the rounds' ratios {paired:.3f})", flush=True)
    return ratios


if __name__ == "__main__":
    main()
