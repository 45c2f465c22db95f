"""MultiWorkerMirroredStrategy: a chief and a worker started as two processes
with their own TF_CONFIG (and under torchrun), plus the cluster plumbing
without processes."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import distribute
import estimator as est
from models import regression_model_fn
from paths import SUPPORT
from replica_helpers import batches, concatenated
from tf_cluster import free_ports, tf_config

TASK = os.path.join(SUPPORT, "cluster_task.py")


def run_cluster(tmp_path, args, tasks=("chief", "worker"), timeout=90, wait=None, ports=None):
    """Start one process per task with its TF_CONFIG (`ports`: the chief's and
    the worker's, default free ones); wait for those in `wait` (default all),
    then kill every one left; return [(returncode, output)] in task order."""
    ports = ports or free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs = []
    for task in tasks:
        env = dict(os.environ, TF_CONFIG=tf_config(cluster, task), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, TASK, *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        for task, p in zip(tasks, procs):
            if wait is None or task in wait:
                p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for p in procs:
            p.kill()
    outputs = [p.communicate()[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outputs)], cluster


def single_process(model_dir, steps):
    e = est.Estimator(regression_model_fn, config=est.RunConfig(
        model_dir=str(model_dir), tf_random_seed=3, save_checkpoints_steps=100),
        params={"lr": 0.05, "momentum": 0.9})
    e.train(lambda: concatenated(batches(batch_size=16), 2), steps=steps)
    return e


def load_estimator(model_dir):
    return est.Estimator(regression_model_fn, model_dir=str(model_dir))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_chief_and_worker_equal_one_process_and_restart_from_the_chiefs_checkpoint(tmp_path):
    model_dir, out = tmp_path / "cluster", tmp_path / "out"
    out.mkdir()
    results, cluster = run_cluster(tmp_path, [str(model_dir), str(out), "--steps", "5",
                                              "--evaluate"])
    assert [code for code, _ in results] == [0, 0], "\n".join(o[-3000:] for _, o in results)
    chief_log, worker_log = results[0][1], results[1][1]
    assert "MultiWorkerMirroredStrategy: chief:0, rank 0 of 2" in chief_log
    assert "MultiWorkerMirroredStrategy: worker:0, rank 1 of 2" in worker_log
    assert f"rendezvous {cluster['chief'][0]}" in worker_log and "backend gloo" in worker_log

    one = single_process(tmp_path / "one", 5)
    two = load_estimator(model_dir)
    assert est.checkpoint.step_of(two.latest_checkpoint()) == 5
    for name in one.get_variable_names():
        np.testing.assert_allclose(two.get_variable_value(name), one.get_variable_value(name),
                                   atol=1e-6, rtol=0, err_msg=name)
    w0, w1 = torch.load(out / "weights-0.pt"), torch.load(out / "weights-1.pt")
    for key in w0["linear"]:
        assert torch.equal(w0["linear"][key], w1["linear"][key])

    want = one.evaluate(lambda: batches(n=210, batch_size=30, seed=1))
    for r in (0, 1):
        got = json.load(open(out / f"eval-{r}.json"))
        assert got["global_step"] == 5
        for key in ("loss", "mae"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key
    names = os.listdir(model_dir)   # the chief's files only
    assert len([n for n in names if n.startswith("events.out.tfevents")]) == 1
    assert sorted(n for n in names if not n.startswith("events") and n != "eval") == \
        sorted(n for n in os.listdir(one.model_dir) if not n.startswith("events") and n != "eval")
    assert len(os.listdir(model_dir / "eval")) == 1

    # The whole cluster restarts: both tasks resume from the chief's checkpoint.
    results, _ = run_cluster(tmp_path, [str(model_dir), str(out), "--steps", "3"])
    assert [code for code, _ in results] == [0, 0], "\n".join(o[-3000:] for _, o in results)
    for _, output in results:
        assert "Resuming from" in output and "model.ckpt-5" in output
    one.train(lambda: concatenated(batches(batch_size=16), 2), steps=3)
    two = load_estimator(model_dir)
    assert est.checkpoint.step_of(two.latest_checkpoint()) == 8
    for name in one.get_variable_names():
        np.testing.assert_allclose(two.get_variable_value(name), one.get_variable_value(name),
                                   atol=1e-6, rtol=0, err_msg=name)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_task_that_does_not_arrive_is_named_with_its_address(tmp_path):
    results, cluster = run_cluster(tmp_path, [str(tmp_path / "m"), str(tmp_path),
                                              "--timeout", "3"], tasks=("chief",), timeout=60)
    code, output = results[0]
    assert code != 0
    assert f"worker:0 at {cluster['worker'][0]} (rank 1) did not arrive" in output


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_reaching_a_port_that_never_answers_fails_in_its_timeout(tmp_path):
    """Another service at the chief's address, accepting connections and never
    answering: torch's store client waited there for good, in silence
    (attack probe); the rendezvous fails within its timeout, saying so."""
    import socket
    ports = free_ports(2)
    silent = socket.create_server(("127.0.0.1", ports[0]))   # (the kernel accepts for it)
    try:
        start = time.monotonic()
        results, cluster = run_cluster(tmp_path, [str(tmp_path / "m"), str(tmp_path),
                                                  "--timeout", "4"], tasks=("worker",),
                                       timeout=60, ports=ports)
    finally:
        silent.close()
    code, output = results[0]
    assert code != 0 and time.monotonic() - start < 30
    assert f"chief:0 at {cluster['chief'][0]} could not be reached within 4 s (127.0.0.1:" \
        f"{ports[0]} accepts connections but does not answer as a rendezvous store" in output


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_waiting_for_a_chief_that_is_not_there_says_so(tmp_path):
    """A worker restarted after its chief failed waited in silence for the
    rendezvous timeout (30 minutes by default); it says it waits, four
    times a timeout at most (every minute), and then fails naming the chief,
    without torch's C++ stack trace for each attempt."""
    results, cluster = run_cluster(tmp_path, [str(tmp_path / "m"), str(tmp_path),
                                              "--timeout", "4"], tasks=("worker",), timeout=60)
    code, output = results[0]
    assert code != 0
    waits = [line for line in output.splitlines() if
             f"waiting for chief:0 at {cluster['chief'][0]} for the rendezvous" in line]
    assert 1 <= len(waits) <= 4, output
    assert "if it failed and its job ended, restart the whole job" in waits[0]
    assert f"chief:0 at {cluster['chief'][0]} could not be reached within 4 s" in output
    assert "[c10d]" not in output and "frame #0" not in output, output


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_reaching_a_group_formed_before_it_fails_at_once_saying_so(tmp_path):
    """A worker restarted at once after a kill -9 reached its chief, still
    failing, and joined the group the chief had formed with the worker that
    died: it waited in torch's rendezvous, in silence, for the collective
    timeout (30 minutes by default; chaos probe, 3 runs of 5)."""
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    args = [sys.executable, TASK, str(tmp_path / "m"), str(tmp_path), "--steps", "10",
            "--fail", "hang", "--timeout", "60"]   # (the worker hangs: the group stays)
    logs, procs = [], []
    try:
        for task in ("chief", "worker", "worker"):
            logs.append(tmp_path / f"{task}-{len(procs)}.log")
            env = dict(os.environ, TF_CONFIG=tf_config(cluster, task), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(args, env=env, stdout=open(logs[-1], "w"),
                                          stderr=subprocess.STDOUT))
            if len(procs) == 2:   # the late worker starts once the group is formed
                deadline = time.monotonic() + 60
                while "rank 0 of 2" not in logs[0].read_text():
                    assert time.monotonic() < deadline and procs[0].poll() is None, \
                        logs[0].read_text()[-3000:]
                    time.sleep(0.2)
        start = time.monotonic()
        code = procs[2].wait(timeout=40)
        late = logs[2].read_text()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert code != 0 and time.monotonic() - start < 30, late[-3000:]
    assert (f"Rendezvous at {cluster['chief'][0]}: the group there was formed before worker:0 "
            f"at {cluster['worker'][0]} (rank 1) arrived") in late, late[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fail", ["die", "hang"])
def test_a_dead_or_hung_worker_fails_the_chief_naming_it(tmp_path, fail):
    start = time.monotonic()
    results, cluster = run_cluster(tmp_path, [str(tmp_path / "m"), str(tmp_path), "--steps",
                                              "10", "--fail", fail, "--timeout", "3"],
                                   timeout=60, wait=("chief",))
    (chief_code, chief_log), (worker_code, _) = results
    assert chief_code != 0 and worker_code != 0   # the hung worker is killed by this test
    assert "ReplicaFailedError" in chief_log
    assert f"worker:0 at {cluster['worker'][0]} (rank 1) did not respond" in chief_log
    assert time.monotonic() - start < 50


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("failing, where", [(1, "raise"), (0, "raise"),
                                            (1, "raise_in_input_fn"), (0, "raise_in_input_fn")])
def test_a_replica_failing_on_its_own_error_fails_the_other_naming_it(tmp_path, failing, where):
    """A worker's input_fn or hook raising: the chief waited in its all-reduce
    until the worker had exited (its 10 s exit wait), then said the worker
    "did not respond (died, or hung ...)"; the error was in the worker's log
    only, not in the chief's, its failure marker or the evaluator's (chaos
    probe, 15.5 s). The chief raising: the worker said the chief "died or
    hung" (its store was gone by then). An input_fn raising, before the
    session starts, was named so too (attack probe). Then the failing replica
    waited its whole exit wait (10 s) for the other, which waited in a
    collective on the failing one's connections, closed only with its process;
    the chief's store went with it, at times before the worker read the
    chief's error (1 in 12 runs under load)."""
    start = time.monotonic()
    results, cluster = run_cluster(tmp_path, [str(tmp_path / "m"), str(tmp_path), "--steps",
                                              "10", "--fail", where, "--fail-replica",
                                              str(failing), "--timeout", "30"], timeout=60)
    (chief_code, chief_log), (worker_code, worker_log) = results
    assert chief_code != 0 and worker_code != 0
    names = [f"chief:0 at {cluster['chief'][0]} (rank 0)",
             f"worker:0 at {cluster['worker'][0]} (rank 1)"]
    failed, other = (worker_log, chief_log) if failing else (chief_log, worker_log)
    assert f"ValueError: boom on replica {failing}" in failed
    assert (f"failed on {names[1 - failing]}: {names[failing]} failed: ValueError: boom on "
            f"replica {failing}") in other, other[-3000:]
    assert time.monotonic() - start < 40
    # The peer reads the error and exits within the failing one's exit wait.
    raised = float(re.search(r"raising at ([\d.]+)", failed).group(1))
    exited = float(re.search(r"exited at ([\d.]+)", failed).group(1))
    assert exited - raised < 9.5, exited - raised   # (the exit wait: 10 s)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_under_torchrun(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", TASK,   # a free port
                           str(tmp_path / "m"), str(out), "--steps", "4", "--evaluate",
                           "--export"], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=100)
    assert proc.returncode == 0, proc.stdout[:1500] + "\n...\n" + proc.stdout[-3000:]
    assert "rank 1 of 2" in proc.stdout
    one = single_process(tmp_path / "one", 4)
    two = load_estimator(tmp_path / "m")
    np.testing.assert_allclose(two.get_variable_value("linear/weight"),
                               one.get_variable_value("linear/weight"), atol=1e-6, rtol=0)
    # RunConfig takes the role from the rank, as the strategy does: rank 1 is
    # no chief, and only rank 0 writes the evaluation's summaries (before,
    # every rank was the chief and each wrote an event file into eval/).
    exports = [json.loads((out / f"export-{r}.json").read_text()) for r in (0, 1)]
    assert [x["is_chief"] for x in exports] == [True, False]
    assert len(os.listdir(tmp_path / "m" / "eval")) == 1
    # Both ranks exported at once into one export_dir_base, each into its own
    # timestamped directory (before, they shared a temp directory: one failed).
    paths = {x["path"] for x in exports}
    assert len(paths) == 2 and all(os.path.isfile(os.path.join(p, "signature.json"))
                                   for p in paths)
    assert sorted(os.listdir(out / "export")) == sorted(os.path.basename(p) for p in paths)


# -- without processes --------------------------------------------------------------------
CLUSTER = {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"],
           "ps": ["10.0.0.4:2222"]}


@pytest.mark.parametrize("task, index, rank, chief", [
    ("chief", 0, 0, True), ("worker", 0, 1, False), ("worker", 1, 2, False)])
def test_ranks_and_roles_from_tf_config(set_tf_config, task, index, rank, chief):
    cluster = {k: v for k, v in CLUSTER.items() if k != "ps"}
    set_tf_config(cluster, task, index)
    s = distribute.MultiWorkerMirroredStrategy()
    assert s.num_replicas_in_sync == 3
    assert s.extended._rank() == rank
    assert s.extended.should_checkpoint is chief and s.extended.should_save_summary is chief
    assert isinstance(s.cluster_resolver, distribute.cluster_resolver.TFConfigClusterResolver)
    topo = s.extended._topology
    assert (topo.host, topo.port) == ("10.0.0.1", 2222)
    assert topo.describe(2) == "worker:1 at 10.0.0.3:2222 (rank 2)"
    assert distribute.CollectiveAllReduceStrategy is distribute.MultiWorkerMirroredStrategy


def test_a_cluster_without_chief_makes_worker_0_rank_0(set_tf_config):
    set_tf_config({"worker": CLUSTER["worker"]}, "worker", 0)
    s = distribute.MultiWorkerMirroredStrategy()
    assert s.extended._rank() == 0 and s.num_replicas_in_sync == 2


def test_ps_and_evaluator_tasks(set_tf_config):
    set_tf_config(CLUSTER, "ps", 0)
    with pytest.raises(ValueError, match="no parameter servers: this task is ps:0"):
        distribute.MultiWorkerMirroredStrategy()
    set_tf_config(CLUSTER, "evaluator", 0)
    s = distribute.MultiWorkerMirroredStrategy()
    assert s.num_replicas_in_sync == 1 and s.extended.should_checkpoint


def test_torchrun_and_slurm_environments(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[01-02]")
    s = distribute.MultiWorkerMirroredStrategy()
    assert isinstance(s.cluster_resolver, distribute.cluster_resolver.SlurmClusterResolver)
    assert s.extended._rank() == 2 and s.num_replicas_in_sync == 4
    assert (s.extended._topology.host, s.extended._topology.port) == ("node01", 8888)
    # RunConfig reads the same roles (under srun too, is_chief on task 0 alone)
    c = est.RunConfig()
    assert (c.task_type, c.task_id, c.is_chief, c.global_id_in_cluster,
            c.num_worker_replicas, c.cluster_spec.as_dict()) == ("worker", 1, False, 2, 4, {})
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert est.RunConfig().is_chief
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    s = distribute.MultiWorkerMirroredStrategy()   # torchrun's environment comes first
    assert isinstance(s.cluster_resolver, distribute.cluster_resolver.TorchrunClusterResolver)
    assert s.extended._rank() == 1 and not s.extended.should_checkpoint
    assert s.extended._topology.env_rendezvous
    # RunConfig reads the same roles from the rank (no cluster_spec: local mode)
    c = est.RunConfig()
    assert (c.task_type, c.task_id, c.is_chief, c.global_id_in_cluster,
            c.num_worker_replicas, c.cluster_spec.as_dict()) == ("worker", 0, False, 1, 2, {})
    monkeypatch.setenv("RANK", "0")
    c = est.RunConfig()
    assert (c.task_type, c.task_id, c.is_chief) == ("chief", 0, True)
    monkeypatch.setenv("WORLD_SIZE", "1")
    c = est.RunConfig()
    assert (c.task_type, c.task_id, c.is_chief, c.num_worker_replicas) == ("worker", 0, True, 1)


def test_communication_choices():
    ring = distribute.CollectiveAllReduceStrategy(distribute.CollectiveCommunication.RING)
    assert ring.extended._backend == "gloo"
    auto = distribute.MultiWorkerMirroredStrategy(
        communication_options=distribute.CommunicationOptions(timeout_seconds=5))
    assert auto.extended._timeout == 5 and auto.num_replicas_in_sync == 1
    if not torch.cuda.device_count():
        with pytest.raises(ValueError, match="needs GPU devices"):
            distribute.MultiWorkerMirroredStrategy(
                communication=distribute.CommunicationImplementation.NCCL)
    with pytest.raises(TypeError, match="must be a ClusterResolver"):
        distribute.MultiWorkerMirroredStrategy(cluster_resolver={"chief": ["a:1"]})
    with pytest.raises(ValueError, match="timeout_seconds must be positive"):
        distribute.CommunicationOptions(timeout_seconds=0)


@pytest.mark.slow
def test_a_cluster_on_127_0_0_1_listens_on_loopback_only(tmp_path):
    """The chief's rendezvous store and the process group listen on the
    address TF_CONFIG names (127.0.0.1), not on every interface."""
    from sockets import is_loopback, watching_listeners
    with watching_listeners() as seen:
        results, _ = run_cluster(tmp_path, [str(tmp_path / "m"), str(tmp_path), "--steps",
                                            "40"])
    assert [code for code, _ in results] == [0, 0], results
    assert seen, "no listening socket was seen"
    assert all(is_loopback(ip) for ip, _ in seen), sorted(map(str, seen))
