"""The local cluster launcher (`estimator launch`, `launch()`): TF_CONFIG per
task, prefixed output, failure handling, restarts, Ctrl-C; and whole
train_and_evaluate jobs launched with it."""
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import distribute
import estimator as est
import hooks
from estimator.experiment import launch as launch_lib
from estimator.experiment.launch import launch
from paths import ROOT

EXAMPLE = os.path.join(ROOT, "examples", "train_and_evaluate.py")

# One task of a test job: records its pid and TF_CONFIG, says hello, then does
# what `behaviours[<type><index>]` says.
TASK = r"""
import json, os, signal, subprocess, sys, time
config = json.loads(os.environ["TF_CONFIG"])
name = "%s%d" % (config["task"]["type"], config["task"]["index"])
out, behaviours = sys.argv[1], json.loads(sys.argv[2])
action = behaviours.get(name, "exit0")
def record(suffix, text):
    with open(os.path.join(out, name + suffix), "a") as f:
        f.write(text + "\n")
if action == "sigint":
    signal.signal(signal.SIGINT, lambda *a: (record(".sigint", "got it"), sys.exit(0)))
record(".pid", str(os.getpid()))
record(".tf_config", json.dumps(config))
print("hello from %s %d" % (config["task"]["type"], config["task"]["index"]), flush=True)
print("no newline at the end", end="", flush=True)
if action.startswith("exit"):
    sys.exit(int(action[4:]))
if action.startswith("late"):   # exit with this code once two other tasks have started
    deadline = time.time() + 30
    while len([n for n in os.listdir(out) if n.endswith(".child")]) < 2 and time.time() < deadline:
        time.sleep(0.05)
    sys.exit(int(action[4:]))
if action == "fail_once":
    marker = os.path.join(out, name + ".failed")
    if not os.path.exists(marker):
        open(marker, "w").close()
        # fail once every other task has started (else the restart may stop one first)
        others = ["%s%d" % (t, i) for t, addrs in config["cluster"].items()
                  for i in range(len(addrs)) if "%s%d" % (t, i) != name]
        deadline = time.time() + 30
        while (not all(os.path.exists(os.path.join(out, n + ".pid")) for n in others)
               and time.time() < deadline):
            time.sleep(0.05)
        sys.exit(5)
    sys.exit(0)
if action.startswith("wait"):
    time.sleep(float(action[4:]))
    sys.exit(0)
if action == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if action == "preempted_save":   # a preempted chief: its own SIGTERM, then a 3 s save; a
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # second signal meanwhile ends it
    record(".saving", "")
    time.sleep(3)
    record(".saved", "")
    sys.exit(42)
if action == "stop42_when_chief_saves":   # a worker stopping at the step the chief saves
    deadline = time.time() + 30
    while not os.path.exists(os.path.join(out, "chief0.saving")) and time.time() < deadline:
        time.sleep(0.05)
    sys.exit(42)
if action == "sigterm_save":   # a task saving for 2 s on SIGTERM (a preemption save)
    def on_term(*args):
        record(".saving", "")
        time.sleep(2)
        record(".saved", "")
        sys.exit(42)
    signal.signal(signal.SIGTERM, on_term)
    record(".ready", "")
    time.sleep(600)
if action in ("sleep", "sigint"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    record(".child", str(child.pid))
    time.sleep(600)
"""


@pytest.fixture
def task(tmp_path):
    path = tmp_path / "task.py"
    path.write_text(TASK)
    out = tmp_path / "out"
    out.mkdir()

    def command(**behaviours):
        return [str(path), str(out), json.dumps(behaviours)]
    command.out = out
    return command


def pids(out, name, suffix=".pid"):
    path = out / (name + suffix)
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def alive(pid) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pids, within: float = 5.0) -> bool:
    """Whether every pid has ended within `within` seconds (a process killed
    on a loaded machine takes its turn to die)."""
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def run(command, **kwargs):
    output = io.StringIO()
    kwargs.setdefault("stop_grace_secs", 2)
    kwargs.setdefault("timeout", 120)
    start = time.monotonic()
    status = launch(command, output=output, **kwargs)
    return status, output.getvalue(), time.monotonic() - start


@pytest.mark.slow
def test_each_task_gets_its_tf_config_and_prefixed_output(task):
    status, output, _ = run(task(), workers=2, evaluator=True)
    assert status == 0, output
    for name in ("chief", "worker 0", "worker 1", "evaluator"):
        index = name.split()[-1] if " " in name else "0"
        assert f"[{name}] hello from {name.split()[0]} {index}\n" in output
        assert f"[{name}] no newline at the end\n" in output
    assert output.rstrip().endswith("[launch] job succeeded")
    configs = {n: json.loads((task.out / f"{n}.tf_config").read_text())
               for n in ("chief0", "worker0", "worker1", "evaluator0")}
    cluster = configs["chief0"]["cluster"]
    assert all(c["cluster"] == cluster for c in configs.values())
    assert sorted(cluster) == ["chief", "worker"]   # the evaluator is not in the cluster
    addresses = cluster["chief"] + cluster["worker"]
    assert len(addresses) == 3 and len(set(addresses)) == 3
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert configs["worker1"]["task"] == {"type": "worker", "index": 1}
    assert configs["evaluator0"]["task"] == {"type": "evaluator", "index": 0}


@pytest.mark.slow
def test_a_failing_task_stops_the_job_naming_it_and_leaves_no_process(task):
    status, output, took = run(task(chief0="sleep", worker0="late3", evaluator0="sleep"),
                               workers=2, evaluator=True)
    assert status == 3, output
    worker_pid = pids(task.out, "worker0")[0]
    assert (f"[launch] worker 0 (pid {worker_pid}) exited with code 3; stopping the other "
            "tasks") in output
    assert "[launch] job failed: worker 0 exited with code 3" in output
    assert took < 30
    started = (pids(task.out, "chief0") + pids(task.out, "chief0", ".child")
               + pids(task.out, "evaluator0") + pids(task.out, "evaluator0", ".child"))
    assert len(started) == 4
    assert gone(started)   # tasks and what they started


@pytest.mark.slow
def test_a_task_killed_by_a_signal(task):
    status, output, _ = run(task(worker0="sigkill", chief0="sleep"), workers=1)
    assert status == 128 + signal.SIGKILL
    assert "worker 0 (pid" in output and "was killed by SIGKILL" in output


@pytest.mark.slow
def test_restarts_the_training_group_up_to_max_restarts(task):
    """The evaluator restarts with the group: the chief's failure stops it
    (training_failed.json), which spent a second restart before."""
    status, output, _ = run(task(worker0="fail_once", evaluator0="wait5"), workers=2,
                            evaluator=True, max_restarts=1)
    assert status == 0, output
    assert "worker 0 (pid" in output and "exited with code 5; restart 1/1: restarting chief, " \
        "worker 0, worker 1, evaluator\n" in output
    assert len(pids(task.out, "chief0")) == 2 and len(pids(task.out, "worker1")) == 2
    assert len(pids(task.out, "evaluator0")) == 2
    first, second = [json.loads(line) for line in
                     (task.out / "chief0.tf_config").read_text().splitlines()]
    assert first["cluster"] != second["cluster"]   # fresh ports for the new group
    (task.out / "worker0.failed").unlink()
    status, output, _ = run(task(worker0="fail_once"), workers=1, max_restarts=0)
    assert status == 5 and "job failed: worker 0 exited with code 5" in output


@pytest.mark.slow
@pytest.mark.parametrize("max_restarts", [0, 1])
def test_a_preempted_chief_saves_before_anything_is_stopped(task, max_restarts):
    """A worker exits 42 (the job was preempted) while the chief still saves:
    the launcher waits for the chief, names it, and restarts once. Before, it
    stopped the chief at once: a second SIGTERM, which ended it unsaved."""
    status, output, _ = run(task(chief0="preempted_save", worker0="stop42_when_chief_saves"),
                            workers=1, max_restarts=max_restarts, stop_grace_secs=10)
    assert (task.out / "chief0.saved").exists(), output
    if max_restarts:
        assert "chief (pid" in output and "exited with code 42; restart 1/1: restarting " \
            "chief, worker 0\n" in output, output
    else:
        assert status == 42 and "job failed: chief exited with code 42" in output, output


@pytest.mark.slow
def test_a_failed_evaluator_restarts_alone(task):
    status, output, _ = run(task(chief0="wait3", evaluator0="fail_once"), evaluator=True,
                            max_restarts=1)
    assert status == 0, output
    assert "restarting evaluator" in output
    assert len(pids(task.out, "chief0")) == 1 and len(pids(task.out, "evaluator0")) == 2


@pytest.mark.slow
def test_ps_tasks_are_stopped_once_training_is_done(task):
    status, output, _ = run(task(ps0="sleep"), workers=1, ps=1, stop_grace_secs=0.5)
    assert status == 0, output
    assert "stopping the ps tasks still serving" in output
    assert gone([pids(task.out, "ps0")[0], pids(task.out, "ps0", ".child")[0]])


@pytest.mark.slow
def test_a_signal_while_a_task_starts_stops_that_task_too(task, monkeypatch):
    """A SIGTERM inside Popen (after the fork, before it returned) raised
    there: the task was never recorded, so it outlived the launcher
    (attack probe: 6 runs in 150 with a signal in the first 60 ms)."""
    started = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real(*args, **kwargs))
        os.kill(os.getpid(), signal.SIGTERM)   # (handled before Popen would have returned)
        return started[-1]
    monkeypatch.setattr(launch_lib.subprocess, "Popen", popen)
    try:
        status, output, _ = run(task(chief0="sleep"))
        assert status == 128 + signal.SIGTERM, output
        assert len(started) == 1 and gone([started[0].pid]), output
    finally:   # (a failure leaves nothing behind)
        for proc in started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_signal_during_the_clean_up_neither_escapes_nor_skips_it(task, monkeypatch):
    """A SIGINT as the launcher's `finally` ran raised there: kill_groups was
    skipped (a task's child outlived it) and the launcher's handlers stayed
    installed (attack probe)."""
    real = launch_lib._Job.kill_groups

    def kill_groups(job):
        os.kill(os.getpid(), signal.SIGINT)   # (handled before the groups are killed)
        real(job)
    monkeypatch.setattr(launch_lib._Job, "kill_groups", kill_groups)
    status, output, _ = run(task(chief0="exit0"))
    assert status == 0, output
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_timeout_stops_everything(task):
    status, output, took = run(task(chief0="sleep"), timeout=2)
    assert status == 124 and "timeout" in output and took < 20
    assert gone(pids(task.out, "chief0"))


def _signalled(task, tmp_path, behaviour: str, grace: int, ready: str, signals) -> tuple:
    """(exit code, output) of `estimator launch` (a chief and a worker doing
    `behaviour`) sent `signals` [(signal, seconds to wait after)] once both
    tasks wrote their `ready` file."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "estimator", "launch", "--workers", "1", "--stop-grace-secs",
         str(grace), *task(chief0=behaviour, worker0=behaviour)],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((task.out / f"{n}{ready}").exists() for n in ("chief0", "worker0")):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.1)
        for sig, wait in signals:
            launcher.send_signal(sig)
            time.sleep(wait)
        output, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return launcher.returncode, output


@pytest.mark.slow
def test_ctrl_c_is_forwarded_to_every_task(task, tmp_path):
    status, output = _signalled(task, tmp_path, "sigint", 5, ".child", [(signal.SIGINT, 0)])
    assert status == 130, output
    assert "[launch] SIGINT: forwarding to every task" in output
    assert (task.out / "chief0.sigint").exists() and (task.out / "worker0.sigint").exists()
    started = [pids(task.out, n, s)[0] for n in ("chief0", "worker0") for s in (".pid", ".child")]
    assert gone(started)


@pytest.mark.slow
def test_a_second_sigterm_while_the_tasks_save_does_not_kill_them(task, tmp_path):
    """`timeout`, systemd or a second Ctrl-C signal the launcher twice: the
    second raised inside its handling of the first (a KeyboardInterrupt
    traceback, exit -2) and SIGKILLed the tasks in their preemption save."""
    status, output = _signalled(task, tmp_path, "sigterm_save", 20, ".ready", [
        (signal.SIGTERM, 0.3), (signal.SIGTERM, 0), (signal.SIGINT, 0)])
    assert status == 128 + signal.SIGTERM, output
    assert "Traceback" not in output and "[launch] SIGTERM: forwarding to every task" in output
    assert (task.out / "chief0.saved").exists() and (task.out / "worker0.saved").exists()


def test_arguments_and_commands(tmp_path, capsys):
    with pytest.raises(ValueError, match="workers must be an int >= 0, got -1"):
        launch(["x.py"], workers=-1)
    with pytest.raises(ValueError, match="needs a chief or at least one worker"):
        launch(["x.py"], chief=False)
    with pytest.raises(ValueError, match="no program to run"):
        launch([])
    assert launch_lib.main(["--no-chief", "x.py"]) == 2
    assert "needs a chief or at least one worker" in capsys.readouterr().err
    assert launch_lib._command("train.py --steps 3") == [sys.executable, "train.py",
                                                          "--steps", "3"]
    assert launch_lib._command(["configs/a.yaml", "--set", "x=1"]) == [
        sys.executable, "-m", "estimator", "run", "configs/a.yaml", "--set", "x=1"]
    assert launch_lib._command(["bash", "-c", "true"]) == ["bash", "-c", "true"]
    from estimator.experiment import cli
    assert cli.main([]) == 2


# -- whole jobs ---------------------------------------------------------------------------
STRATEGY = ("multi_worker_mirrored" if hasattr(distribute, "MultiWorkerMirroredStrategy")
            else "default")

_SERVE = r"""
import importlib.util, json, sys
import numpy as np, torch
for name in ("estimator", "distribute", "hooks"):
    sys.modules[name] = None   # block our packages (they may be pip-installed): the export must not need them
program = torch.export.load(sys.argv[1] + "/model.pt2").module()
with torch.no_grad():
    np.save(sys.argv[3], program(x=torch.from_numpy(np.load(sys.argv[2])))["y"].numpy())
"""


@pytest.mark.slow
def test_launched_cluster_with_an_evaluator_trains_evaluates_and_exports(tmp_path):
    model_dir = str(tmp_path / "job")
    status, output, _ = run([EXAMPLE, "--model_dir", model_dir, "--max_steps", "120",
                             "--save_checkpoints_steps", "20", "--strategy", STRATEGY,
                             "--step_sleep", "0.02"],
                            workers=2, evaluator=True, timeout=240)
    assert status == 0, output[-4000:]
    final = json.loads(output.split("[evaluator] FINAL_EVAL ", 1)[1].splitlines()[0])
    assert final["global_step"] == 120
    evaluations = hooks.read_eval_metrics(os.path.join(model_dir, "eval"))
    assert max(evaluations) == 120 and all("loss" in m for m in evaluations.values())
    # Only the chief wrote to model_dir (plus the evaluator's eval/ and export/).
    names = os.listdir(model_dir)
    assert len([n for n in names if n.startswith("events.out.tfevents")]) == 1
    assert not [n for n in names if not n.startswith(("model.ckpt-", "events.out.tfevents"))
                and n not in ("checkpoint", "training_complete.json", "eval", "export")]
    ledger = [json.loads(line) for line in open(os.path.join(model_dir, "eval",
                                                            "evaluated_checkpoints.jsonl"))]
    assert [e["global_step"] for e in ledger] == sorted(evaluations)
    # BestExporter kept the best: its newest export is the evaluation with the least loss.
    best_dir = os.path.join(model_dir, "export", "best")
    newest = os.path.join(best_dir, max(os.listdir(best_dir), key=int))
    best_step = json.load(open(os.path.join(newest, "signature.json")))["global_step"]
    assert best_step == min(ledger, key=lambda e: e["metrics"]["loss"])["global_step"]
    # The export serves, without our packages, what Estimator.predict predicts.
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import train_and_evaluate as example
    finally:
        sys.path.remove(os.path.dirname(EXAMPLE))
    x, _ = example.data(9, seed=11)
    np.save(tmp_path / "x.npy", x)
    predictor = est.Estimator(example.model_fn, model_dir=model_dir,
                              params={"learning_rate": 0.1})
    expected = np.stack([p["y"] for p in predictor.predict(
        lambda: [{"x": x}], checkpoint_path=os.path.join(model_dir, f"model.ckpt-{best_step}"))])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    served = subprocess.run([sys.executable, "-I", "-c", _SERVE, newest, str(tmp_path / "x.npy"),
                             str(tmp_path / "y.npy")], cwd=str(tmp_path), env=env,
                            capture_output=True, text=True, timeout=120)
    assert served.returncode == 0, served.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_early_stopping_decided_by_the_evaluator_reaches_every_trainer(tmp_path):
    model_dir = str(tmp_path / "job")
    status, output, took = run([EXAMPLE, "--model_dir", model_dir, "--max_steps", "100000",
                                "--save_checkpoints_steps", "20", "--strategy", STRATEGY,
                                "--step_sleep", "0.01", "--stop_if_loss_below", "1.0",
                                # the chief's own hook reads eval results at step 1 only:
                                # the decision has to come from the evaluator
                                "--early_stopping_every_steps", "1000000"],
                               workers=1, evaluator=True, timeout=240)
    assert status == 0, output[-4000:]
    stop = json.load(open(os.path.join(model_dir, "stop_training.json")))
    done = json.load(open(os.path.join(model_dir, "training_complete.json")))
    assert stop["max_steps"] == done["max_steps"] == 100000
    assert stop["global_step"] <= done["global_step"] < 100000
    saw = [task for task in ("chief", "worker 0")
           if f"[{task}] INFO estimator.training: Stopping: the evaluator requested" in output]
    # Each task polls the marker; under a synchronous strategy the first to see
    # it stops them all on the same step (the session's stop agreement).
    assert saw == ["chief", "worker 0"] if STRATEGY == "default" else saw
    final = json.loads(output.split("[evaluator] FINAL_EVAL ", 1)[1].splitlines()[0])
    assert final["global_step"] == done["global_step"]   # the final checkpoint, evaluated


def test_tfjob_manifest_runs_the_example_with_arguments_it_accepts():
    import yaml
    manifest = yaml.safe_load(open(os.path.join(ROOT, "examples", "tfjob.yaml")))
    assert manifest["kind"] == "TFJob"
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert sorted(specs) == ["Chief", "Evaluator", "Worker"]
    assert specs["Chief"]["replicas"] == 1 and specs["Evaluator"]["replicas"] == 1
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import train_and_evaluate as example
    finally:
        sys.path.remove(os.path.dirname(EXAMPLE))
    for spec in specs.values():
        command = spec["template"]["spec"]["containers"][0]["command"]
        assert command[:2] == ["python", "examples/train_and_evaluate.py"]
        args = example._parser().parse_args(command[2:])   # SystemExit if it did not parse
        assert args.strategy == "multi_worker_mirrored" and args.model_dir.startswith("/mnt/")


def test_launcher_flags_may_follow_an_experiment_file(monkeypatch):
    """SPEC: `estimator launch configs/X.yaml --workers N --ps M --evaluator`."""
    import argparse
    from estimator.experiment import launch as launch_mod
    captured = {}
    monkeypatch.setattr(launch_mod, "launch", lambda cmd, **kw: captured.update(cmd=cmd, **kw) or 0)
    parser = argparse.ArgumentParser()
    launch_mod._add_arguments(parser)
    launch_mod._run_from_args(parser.parse_args(
        ["configs/cluster.yaml", "--workers", "2", "--ps", "1", "--evaluator", "--set", "a=1"]))
    assert (captured["workers"], captured["ps"], captured["evaluator"]) == (2, 1, True)
    assert captured["cmd"] == ["configs/cluster.yaml", "--set", "a=1"]
    launch_mod._run_from_args(parser.parse_args(["train.py", "--workers", "3"]))
    assert captured["workers"] == 0 and captured["cmd"] == ["train.py", "--workers", "3"]
    # --model-dir with an experiment file: also its run_config.model_dir (every
    # shipped config sets one, which disagreed with TF_CONFIG's: every task failed)
    launch_mod._run_from_args(parser.parse_args(["configs/cluster.yaml", "--model-dir", "r"]))
    assert captured["model_dir"] == os.path.abspath("r")
    assert captured["cmd"] == ["configs/cluster.yaml", "--set",
                               f"run_config.model_dir={os.path.abspath('r')}"]
    launch_mod._run_from_args(parser.parse_args(["--model-dir", "r", "train.py"]))
    assert captured["model_dir"] == "r" and captured["cmd"] == ["train.py"]


def test_tasks_import_the_launchers_packages_from_any_directory(tmp_path):
    """The tasks' PYTHONPATH starts with the directory holding `estimator/`
    (it named estimator/ itself, where estimator/estimator.py then shadowed
    the package: every task failed at import outside the repository root)."""
    script = tmp_path / "where.py"
    script.write_text("import estimator, distribute, hooks\nprint('FROM', estimator.__file__)\n")
    output = io.StringIO()
    status = launch([str(script)], output=output, cwd=str(tmp_path), timeout=60,
                    stop_grace_secs=2)
    assert status == 0, output.getvalue()
    assert f"FROM {os.path.join(ROOT, 'estimator', '__init__.py')}" in output.getvalue()
