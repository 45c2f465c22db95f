"""One task of a ClusterCoordinator cluster (tests/distribute/test_coordinator.py):

    python coordinator_task.py CLUSTER_JSON ps|worker INDEX
    python coordinator_task.py CLUSTER_JSON chief 0 --out DIR --steps N
        [--model_dir D] [--save-and-crash-at N] [--restore] [--sparse] [--noted] [--bn]
        [--crash-after N] [--check-quiet SECS]
    python coordinator_task.py CLUSTER_JSON chief 0 --out DIR --semantics

The chief is the coordinator: it schedules `coordinator_model.train_step`
N times (steps already in a restored checkpoint are not run again), writes
DIR/progress (results so far) while it waits, and DIR/result.json (every
result, the accuracy, the queue's counts) at the end. `--save-and-crash-at
N`: after step N is done, save a checkpoint to --model_dir and die without
ending training; `--restore`: start from --model_dir's latest checkpoint.
`--crash-after N`: schedule every step, die once N results are in (the
rest queued); `--check-quiet SECS`: before scheduling, say whether the
variables stayed as created for SECS seconds.
`--semantics`: the scenarios of `semantics`, written to DIR/semantics.json.
`--sparse`: `coordinator_model.SparseNet` (a sparse embedding) under Adagrad;
`--noted`: `coordinator_model.NotedNet` (a dense table, its lookups noted)
under `est.optimizers.Ftrl`; `--bn`: `coordinator_model.BNNet` (batch norm).
"""
import argparse
import json
import logging
import os
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]

import distribute  # noqa: E402
import coordinator_model as model  # noqa: E402
from hooks import checkpoint  # noqa: E402


def coordinate(cluster, args):
    resolver = distribute.cluster_resolver.SimpleClusterResolver(
        distribute.cluster_resolver.ClusterSpec(cluster), task_type="chief", task_id=0)
    strategy = distribute.ParameterServerStrategy(resolver, timeout_secs=10,
                                                  init_timeout_secs=60)
    coordinator = distribute.experimental.coordinator.ClusterCoordinator(strategy,
                                                                         lease_secs=2.0)
    with strategy.scope():
        net = coordinator.create_module("net", model.SparseNet if args.sparse else
                                        model.NotedNet if args.noted else
                                        model.BNNet if args.bn else model.make_net)
        optimizer = coordinator.create_optimizer(
            "sgd", net, model.make_adagrad if args.sparse else
            model.make_ftrl if args.noted else model.make_sgd)
    first = 0
    if args.restore:
        path = checkpoint.latest_checkpoint(args.model_dir)
        saved = checkpoint.load(path)
        coordinator.load_state_dict(saved["coordinator"])
        first = int(saved["global_step"])
        restored = coordinator.state_dict()["modules"]["net"]
        same = all(bool((restored[k] == v).all())
                   for k, v in saved["coordinator"]["modules"]["net"].items())
        print(f"restored step {first} from {path}; ps values equal the checkpoint: {same}",
              flush=True)
    if args.check_quiet:   # (no function of an earlier coordinator changes the variables)
        before = coordinator.state_dict()["modules"]["net"]
        time.sleep(args.check_quiet)
        after = coordinator.state_dict()["modules"]["net"]
        print("variables untouched while idle:",
              all(bool((before[k] == v).all()) for k, v in after.items()), flush=True)
    iterator = iter(coordinator.create_per_worker_dataset(model.dataset_fn))
    values = []
    for step in range(first, args.steps):
        values.append(coordinator.schedule(model.train_step,
                                           args=(iterator, net, optimizer, step)))
        if args.save_and_crash_at and step + 1 == args.save_and_crash_at:
            coordinator.join()
            checkpoint.Saver(args.model_dir).save(
                {"coordinator": coordinator.state_dict(), "global_step": step + 1}, step + 1)
            print(f"saved step {step + 1}; crashing", flush=True)
            os._exit(3)
    while args.crash_after and sum(v._event.is_set() for v in values) < args.crash_after:
        time.sleep(0.01)
    if args.crash_after:   # (as kill -9: the functions still queued are left on ps 0)
        print(f"{args.crash_after} results in; crashing", flush=True)
        os._exit(3)
    finished = threading.Event()

    def progress():   # how many results are in, for the test to time its faults
        while not finished.is_set():
            done = sum(v._event.is_set() for v in values)
            with open(os.path.join(args.out, "progress"), "w") as f:
                f.write(str(done))
            time.sleep(0.05)
    # Joined before the exit: a thread that frees the last reference to an
    # unpickled tensor (one carrying a Python hook: `_backward_hooks`) while
    # the interpreter finalizes aborts the process ("terminate called
    # without an active exception", pytorch/pytorch#38228; seen here 1 run in ~35).
    reporter = threading.Thread(target=progress, daemon=True)
    reporter.start()
    try:
        coordinator.join()
    finally:
        finished.set()
        reporter.join()
    results = [v.fetch() for v in values]
    state = coordinator.state_dict()
    out = {"steps": [r["step"] for r in results], "pids": sorted({r["pid"] for r in results}),
           "last_loss": float(results[-1]["loss"]) if results else None,
           "accuracy": model.accuracy(state["modules"]["net"]),
           "stats": coordinator.stats, "first": first}
    if args.bn:
        out["moving"] = {k: state["modules"]["net"][f"norm.{k}"].tolist()
                         for k in ("running_mean", "running_var", "num_batches_tracked")}
        out["moving"]["calls"] = state["modules"]["net"]["calls"].item()
    if args.noted:
        table, first_table = state["modules"]["net"]["table"], model.NotedNet().table
        out["unread_rows_kept"] = torch.equal(table[30:], first_table[30:])
        out["read_rows_moved"] = not torch.equal(table[:30], first_table[:30])
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(out, f, default=lambda v: v.item())   # (numpy scalars)
    coordinator.shutdown()


def semantics(cluster, args):
    """As TF's ClusterCoordinator: each iter() of a per-worker dataset reads
    it from the start; reading past its end is an OutOfRangeError; structures
    keep their types; a failed function cancels those no worker took."""
    resolver = distribute.cluster_resolver.SimpleClusterResolver(
        distribute.cluster_resolver.ClusterSpec(cluster), task_type="chief", task_id=0)
    strategy = distribute.ParameterServerStrategy(resolver, timeout_secs=10,
                                                  init_timeout_secs=60)
    coordinator = distribute.experimental.coordinator.ClusterCoordinator(strategy)
    out = {}

    def outcome(value):
        try:
            return ["ok", value.fetch()]
        except Exception as e:  # noqa: BLE001 - recorded for the test
            return [type(e).__name__, str(e)]

    def joined():
        try:
            coordinator.join()
            return None
        except Exception as e:  # noqa: BLE001
            return [type(e).__name__, str(e)]

    for fn in (model.finite_list, model.finite_generator, model.with_default):
        dataset = coordinator.create_per_worker_dataset(fn)
        epochs = []
        for _ in range(3):
            iterator = iter(dataset)
            values = [coordinator.schedule(model.take, args=(iterator,)) for _ in range(3)]
            epochs.append([joined()] + [outcome(v) for v in values])
        out[fn.__name__] = epochs
    iterator = iter(coordinator.create_per_worker_dataset(model.finite_list))
    values = [coordinator.schedule(model.take, args=(iterator,)) for _ in range(12)]
    out["past_the_end"] = [joined()] + [outcome(v) for v in values]
    pair, ordered = coordinator.schedule(model.swap, args=(model.Pair(1, 2),)).fetch()
    out["structures"] = [type(pair).__name__, list(pair), type(ordered).__name__,
                         list(ordered.items())]
    value = coordinator.schedule(model.swap, args=(model.Pair(torch.tensor(1.5), torch.ones(2)),))
    (fetched, _), (got, _) = value.fetch(), value.get()
    out["tensors"] = [type(fetched.a).__name__, str(fetched.a.dtype), type(fetched.b).__name__,
                      type(got.a).__name__]
    marks = os.path.join(args.out, "marks")
    values = [coordinator.schedule(model.slow_mark, args=(i, marks)) for i in range(4)]
    values.append(coordinator.schedule(model.boom))
    values += [coordinator.schedule(model.slow_mark, args=(i, marks)) for i in range(4, 10)]
    out["after_a_failure"] = [joined()] + [outcome(v) for v in values]
    out["after_a_failure_ran"] = sorted(int(line) for line in open(marks))
    out["join_again"] = joined()
    # Two functions in flight when a third's error is raised: join waits for
    # them; the later error of one is not raised by the calls after it (TF's).
    values = [coordinator.schedule(model.slow_value, args=(2.0, 1)),
              coordinator.schedule(model.boom),
              coordinator.schedule(model.slow_boom, args=(1.0,))]
    time.sleep(0.3)   # (the worker that ran boom has taken slow_boom)
    start = time.monotonic()
    out["in_flight_joined"] = joined()
    out["in_flight_join_secs"] = time.monotonic() - start
    out["in_flight"] = [outcome(v) for v in values]
    later = coordinator.schedule(model.slow_value, args=(0.0, 7))
    out["after_in_flight"] = [joined(), outcome(later)]
    out["number_types"] = [type(v).__name__ for v in coordinator.schedule(
        model.swap, args=(model.Pair(1, 1.5),)).fetch()[0]]
    with open(os.path.join(args.out, "semantics.json"), "w") as f:
        json.dump(out, f, default=lambda v: v.item())   # (numpy scalars)
    coordinator.shutdown()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cluster")
    parser.add_argument("role")
    parser.add_argument("index", type=int)
    parser.add_argument("--out")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--model_dir")
    parser.add_argument("--save-and-crash-at", type=int, default=0)
    parser.add_argument("--restore", action="store_true")
    parser.add_argument("--crash-after", type=int, default=0)
    parser.add_argument("--check-quiet", type=float, default=0.0)
    parser.add_argument("--semantics", action="store_true")
    parser.add_argument("--sparse", action="store_true")
    parser.add_argument("--noted", action="store_true")
    parser.add_argument("--bn", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"{args.role}:{args.index} %(message)s")
    cluster = json.loads(args.cluster)
    if args.role == "chief":
        (semantics if args.semantics else coordinate)(cluster, args)
    else:
        distribute.Server(cluster, job_name=args.role, task_index=args.index, timeout_secs=10,
                          init_timeout_secs=60, end_grace_secs=5).join(timeout=300)


if __name__ == "__main__":
    main()
