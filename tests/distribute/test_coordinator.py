"""TF2 parameter-server training: a ClusterCoordinator on the chief schedules
functions onto 2 workers, the variables and the optimizer on 2 ps tasks;
every task a real process on 127.0.0.1 (bounded, killed at the end). Killing
a worker mid-run still completes every step at least once (and the worker,
restarted, takes work again); killing a ps fails join() naming it; a
coordinator that died after a checkpoint resumes from it."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import distribute
from paths import SUPPORT
from tf_cluster import free_ports

pytestmark = pytest.mark.slow
TASK = os.path.join(SUPPORT, "coordinator_task.py")
TIMEOUT = 150


class Cluster:
    def __init__(self, tmp_path):
        ports = free_ports(5)
        self.spec = {"chief": [f"127.0.0.1:{ports[0]}"],
                     "worker": [f"127.0.0.1:{p}" for p in ports[1:3]],
                     "ps": [f"127.0.0.1:{p}" for p in ports[3:5]]}
        self.tmp = tmp_path
        self.procs = {}
        self.logs = {}

    def start(self, role, index, *extra):
        name = f"{role}{index}-{len(self.procs)}"
        log = open(self.tmp / f"{name}.log", "w")
        self.logs[(role, index)] = self.tmp / f"{name}.log"
        proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", TASK, json.dumps(self.spec), role,
             str(index), *extra], stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", COORDINATOR_HOLD_DIR=str(self.tmp)))
        self.procs[(role, index)] = proc
        return proc

    def start_servers(self):
        for i in range(2):
            self.start("ps", i)
        for i in range(2):
            self.start("worker", i)

    def log(self, role, index):
        return self.logs[(role, index)].read_text()

    def wait(self, proc, timeout=TIMEOUT):
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("a task did not finish in time:\n" + self.all_logs())

    def all_logs(self):
        return "\n".join(f"--- {k}\n{p.read_text()[-3000:]}" for k, p in self.logs.items())

    def stop(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def _progress(out):
    try:
        return int((out / "progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


def _wait_progress(cluster, out, n):
    deadline = time.monotonic() + TIMEOUT
    while _progress(out) < n:
        assert cluster.procs[("chief", 0)].poll() is None, cluster.all_logs()
        assert time.monotonic() < deadline, cluster.all_logs()
        time.sleep(0.05)


def test_trains_and_a_killed_worker_s_steps_run_elsewhere(cluster, tmp_path):
    cluster.start_servers()
    chief = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "120")
    _wait_progress(cluster, tmp_path, 20)
    worker = cluster.procs[("worker", 1)]
    (tmp_path / f"hold-{worker.pid}").touch()   # its next step waits to be killed
    deadline = time.monotonic() + TIMEOUT
    while not (tmp_path / f"held-{worker.pid}").exists():
        assert time.monotonic() < deadline, cluster.all_logs()
        time.sleep(0.02)
    worker.send_signal(signal.SIGKILL)   # mid-function
    worker.wait(timeout=30)
    time.sleep(1.0)
    restarted = cluster.start("worker", 1)   # rejoins under a new rank
    assert cluster.wait(chief) == 0, cluster.all_logs()
    result = json.loads((tmp_path / "result.json").read_text())
    assert sorted(result["steps"]) == list(range(120))   # every step, its result once
    assert result["accuracy"] >= 0.9, result
    assert restarted.pid in result["pids"], "the restarted worker took no work"
    assert result["stats"]["rerun"] >= 1, result   # the killed worker's step ran again
    for i in range(2):   # the ps tasks end with the coordinator
        assert cluster.wait(cluster.procs[("ps", i)]) == 0, cluster.all_logs()


def test_a_sparse_embedding_trains(cluster, tmp_path):
    """nn.Embedding(sparse=True): its gradient pushed as its rows, applied
    as sparse on the ps (a sparse gradient failed the worker's push)."""
    cluster.start_servers()
    chief = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "60", "--sparse")
    assert cluster.wait(chief) == 0, cluster.all_logs()
    result = json.loads((tmp_path / "result.json").read_text())
    assert sorted(result["steps"]) == list(range(60))
    assert result["accuracy"] >= 0.9, result


def test_a_noted_table_is_applied_as_tfs_sparse_apply(cluster, tmp_path):
    """A dense table whose lookups are noted (`est.optimizers.looked_up`)
    under Ftrl: the ps updates the rows read alone, so the rows no batch
    read keep their values (before: the dense step set them to 0)."""
    cluster.start_servers()
    chief = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "60", "--noted")
    assert cluster.wait(chief) == 0, cluster.all_logs()
    result = json.loads((tmp_path / "result.json").read_text())
    assert sorted(result["steps"]) == list(range(60))
    assert result["unread_rows_kept"] and result["read_rows_moved"], result
    assert result["accuracy"] >= 0.9, result


def test_batch_norm_statistics_live_on_the_ps_tasks_as_tfs_moving_averages(cluster, tmp_path):
    """A module's buffers stayed on each worker: the coordinator's
    state_dict (its checkpoints) held the initial moving statistics (mean 0,
    variance 1, no batches) after training, so the model evaluated from it
    was wrong (TF's moving averages are ps variables: coordinator probe).
    Each function's changes are added on the ps: every batch of both
    workers counted, the statistics those of the inputs (mean 3, var 4); a
    buffer the forward replaces (`calls`) counted too, a bool flag's
    (`seen`) kept on the workers (attack probe: its change failed every
    function; the replaced one never reached the ps)."""
    cluster.start_servers()
    chief = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "60", "--bn")
    assert cluster.wait(chief) == 0, cluster.all_logs()
    result = json.loads((tmp_path / "result.json").read_text())
    assert sorted(result["steps"]) == list(range(60))
    moving = result["moving"]
    assert moving["num_batches_tracked"] == 60 and moving["calls"] == 60, moving
    assert all(abs(m - 3) < 0.3 for m in moving["running_mean"]), moving
    assert all(abs(v - 4) < 1.0 for v in moving["running_var"]), moving
    assert result["accuracy"] >= 0.9, result


def test_a_dead_ps_fails_join_naming_it(cluster, tmp_path):
    cluster.start_servers()
    chief = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "400")
    _wait_progress(cluster, tmp_path, 10)
    cluster.procs[("ps", 1)].send_signal(signal.SIGKILL)
    assert cluster.wait(chief) != 0
    log = cluster.log("chief", 0)
    assert "ParameterServerError" in log and "ps 1 at 127.0.0.1:" in log, log[-3000:]
    assert "coordinator.join()" in log   # raised from join


def test_a_restarted_coordinator_resumes_from_its_checkpoint(cluster, tmp_path):
    cluster.start_servers()
    model_dir = str(tmp_path / "model")
    first = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "60",
                          "--model_dir", model_dir, "--save-and-crash-at", "30")
    assert cluster.wait(first) == 3, cluster.all_logs()
    assert "saved step 30" in cluster.log("chief", 0)
    second = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "60",
                           "--model_dir", model_dir, "--restore")
    assert cluster.wait(second) == 0, cluster.all_logs()
    assert "restored step 30" in cluster.log("chief", 0)
    assert "ps values equal the checkpoint: True" in cluster.log("chief", 0)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["first"] == 30 and sorted(result["steps"]) == list(range(30, 60))
    assert result["accuracy"] >= 0.9, result


@pytest.mark.parametrize("restart_at_once", [True, False])
def test_a_killed_coordinators_queued_functions_do_not_train_the_next_ones(
        cluster, tmp_path, restart_at_once):
    """Its functions live on ps 0's queue: they went on training, then
    updated the next coordinator's variables (the same names), silently.
    Now a new coordinator drops them (`restart_at_once`: within the first
    one's lease), and ps 0 drops them once a coordinator is silent for its
    lease, as TF's functions end with the coordinator's process."""
    cluster.start_servers()
    first = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "2000",
                          "--crash-after", "10")
    assert cluster.wait(first) == 3, cluster.all_logs()
    if not restart_at_once:
        deadline = time.monotonic() + TIMEOUT
        while "not heard from for" not in cluster.log("ps", 0):
            assert time.monotonic() < deadline, cluster.all_logs()
            time.sleep(0.1)
    second = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", "40",
                           "--check-quiet", "3")
    assert cluster.wait(second, timeout=90) == 0, cluster.all_logs()
    assert "variables untouched while idle: True" in cluster.log("chief", 0), cluster.all_logs()
    assert "waiting function(s) of coordinator chief:0:" in cluster.log("ps", 0)
    result = json.loads((tmp_path / "result.json").read_text())
    assert sorted(result["steps"]) == list(range(40)) and result["stats"]["pending"] == 0


def _stopped_a_while(cluster, tmp_path, steps: int, secs: float) -> int:
    """The exit code of a coordinator scheduling `steps` steps, stopped
    (SIGSTOP, as Ctrl-Z) for `secs` seconds after its tenth result."""
    cluster.start_servers()
    chief = cluster.start("chief", 0, "--out", str(tmp_path), "--steps", str(steps))
    _wait_progress(cluster, tmp_path, 10)
    chief.send_signal(signal.SIGSTOP)
    time.sleep(secs)
    chief.send_signal(signal.SIGCONT)
    return cluster.wait(chief)


def test_a_coordinator_stopped_for_longer_than_its_lease_goes_on(cluster, tmp_path):
    """Ctrl-Z then fg (or a long call holding the GIL) for 5 s with a 2 s
    lease: ps 0 took the coordinator for killed and dropped it for good
    (attack probe); a coordinator's silence is now 3 leases + 10 s."""
    assert _stopped_a_while(cluster, tmp_path, steps=150, secs=5) == 0, cluster.all_logs()
    result = json.loads((tmp_path / "result.json").read_text())
    assert sorted(result["steps"]) == list(range(150))
    assert "dropped" not in cluster.log("ps", 0)


def test_a_coordinator_stopped_past_its_silence_and_rpc_timeout_is_told_what_was_dropped(
        cluster, tmp_path):
    """Stopped for 25 s (silence 16 s, RPC timeout 10 s): its collect timed
    out and it took ps 0 for dead, for good (attack probe); now ps 0 answers
    a check, and join raises once that its waiting functions were dropped."""
    assert _stopped_a_while(cluster, tmp_path, steps=1500, secs=25) != 0
    log = cluster.log("chief", 0)
    assert "ps 0 dropped this function without running it: this coordinator was not heard " \
           "from for" in log, cluster.all_logs()
    assert "ParameterServerError" not in log


def test_a_partitioner_the_coordinator_does_not_apply_is_said(caplog):
    """variable_partitioner was ignored on the coordinator's path without a
    word (coordinator probe: TF2 builds a ShardedVariable)."""
    coordinator = object.__new__(distribute.experimental.coordinator.ClusterCoordinator)
    resolver = distribute.cluster_resolver.SimpleClusterResolver(
        distribute.cluster_resolver.ClusterSpec({
            "chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}),
        task_type="chief", task_id=0)   # (never reached: nothing here connects)
    coordinator.strategy = distribute.ParameterServerStrategy(
        resolver, variable_partitioner=distribute.partitioners.FixedShardsPartitioner(2))
    with caplog.at_level("WARNING", logger="distribute.coordinator"):
        coordinator._say_unpartitioned("net", torch.nn.Sequential(
            torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3)))
    assert [r.getMessage() for r in caplog.records] == [
        "create_module('net'): the strategy's variable_partitioner would cut 0.weight, "
        "1.weight, 1.bias, but the ClusterCoordinator places each parameter whole, on one ps task "
        "(TF2's ShardedVariable is not built here; the Estimator's parameter-server training "
        "partitions)"]


def test_functions_must_be_importable():
    with pytest.raises(TypeError, match="must be importable by every task.*not a lambda"):
        distribute.coordinator._importable(lambda: 0, "schedule: fn")


def test_iterators_errors_and_structures_behave_as_tf_s(cluster, tmp_path):
    """What TF 2.15's coordinator does (a probe ran both): every iter() of a
    per-worker dataset starts it over (each epoch continued the last one's
    iterator); reading past the end is an OutOfRangeError (a bare, empty
    StopIteration); a dataset_fn gets an input context only by that name (a
    default argument got one); namedtuples and OrderedDicts travel (a
    TypeError); a failure cancels the functions no worker took (they ran,
    and TF's users, told to reschedule them, ran them twice)."""
    cluster.start_servers()
    chief = cluster.start("chief", 0, "--out", str(tmp_path), "--semantics")
    assert cluster.wait(chief) == 0, cluster.all_logs()
    out = json.loads((tmp_path / "semantics.json").read_text())
    for fn in ("finite_list", "finite_generator", "with_default"):
        for joined, *outcomes in out[fn]:
            assert joined is None and all(kind == "ok" for kind, _ in outcomes), out[fn]
            if fn == "with_default":   # not tagged by worker: 3 reads from the start
                assert all(tag == 10 and i < 3 for _, (tag, i) in outcomes), out[fn]
                continue
            by_worker = {}
            for _, (tag, i) in outcomes:
                by_worker.setdefault(tag, []).append(i)
            assert all(sorted(i) == list(range(len(i))) for i in by_worker.values()), out[fn]
            assert set(by_worker) <= {0, 1}, out[fn]

    joined, *outcomes = out["past_the_end"]
    assert joined[0] == "OutOfRangeError" and "End of sequence" in joined[1], joined
    ok = [v for kind, v in outcomes if kind == "ok"]
    assert len(set(map(tuple, ok))) == len(ok) <= 10
    assert all(kind in ("ok", "OutOfRangeError") for kind, _ in outcomes), outcomes

    assert out["structures"] == ["Pair", [2, 1], "OrderedDict", [["b", 2], ["a", 1]]]
    # fetch() gives numpy (a scalar tensor a numpy scalar), get() the tensors, as TF's
    assert out["tensors"] == ["ndarray", "float32", "float32", "Tensor"]

    joined, *outcomes = out["after_a_failure"]
    assert joined == ["ValueError", "boom"] and outcomes[4] == ["ValueError", "boom"]
    slow = outcomes[:4] + outcomes[5:]
    ran = [i for i, (kind, _) in zip(list(range(4)) + list(range(4, 10)), slow) if kind == "ok"]
    cancelled = [kind for kind, _ in slow if kind != "ok"]
    assert cancelled and set(cancelled) == {"CancelledError"}, slow
    assert out["after_a_failure_ran"] == ran, (out["after_a_failure_ran"], slow)
    assert out["join_again"] is None
    # Functions in flight at the error's raise (coordinator probe: join raised
    # while one ran on, and its later error failed the next, healthy join).
    assert out["in_flight_joined"] == ["ValueError", "boom"], out["in_flight_joined"]
    assert out["in_flight_join_secs"] >= 1.0, out   # (it waited for them)
    assert out["in_flight"] == [["ok", 1], ["ValueError", "boom"],
                                ["RuntimeError", "boom after 1.0"]], out["in_flight"]
    assert out["after_in_flight"] == [None, ["ok", 7]], out["after_in_flight"]
    assert out["number_types"] == ["float32", "int32"]   # TF's tf.function's: tensors
