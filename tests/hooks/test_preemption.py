"""Preemption (SIGTERM, SIGINT): training saves at one agreed step and exits
with PREEMPTION_EXIT_CODE; a restart resumes there, so no step runs twice and
none is lost (TF's PreemptionCheckpointHandler)."""
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import hooks
from estimator import checkpoint
from paths import ROOT, SUPPORT

_TRAINER = textwrap.dedent("""
    import os, sys, time
    sys.path[:0] = [{root!r}, {support!r}]
    import distribute, torch
    import estimator as est
    from models import regression_input_fn

    out, model_dir, max_steps, replicas = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

    def model_fn(features, labels, mode, params):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(os.path.join(out, "steps-%d" % rank), "a") as f:   # every step's start
            f.write("%d\\n" % est.get_global_step())
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.05)))

    def slow_input():
        for batch in regression_input_fn()():
            time.sleep(0.02)
            yield batch

    strategy = distribute.MirroredStrategy(["cpu:0", "cpu:1"]) if replicas == 2 else None
    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=10 ** 6, train_distribute=strategy))
    e.train(slow_input, max_steps=max_steps)
    print("finished at", est.checkpoint.step_of(e.latest_checkpoint()), flush=True)
""")


def _steps(out, rank):
    path = os.path.join(out, f"steps-{rank}")
    return [int(line) for line in open(path)] if os.path.exists(path) else []


@pytest.mark.slow
@pytest.mark.parametrize("replicas, sig", [(1, signal.SIGTERM), (1, signal.SIGINT),
                                           (2, signal.SIGTERM)])
def test_a_signal_saves_at_an_agreed_step_and_a_restart_resumes_exactly(tmp_path, replicas,
                                                                        sig):
    out, model_dir = tmp_path / "out", tmp_path / "m"
    out.mkdir()
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER.format(root=ROOT, support=SUPPORT))
    args = [sys.executable, str(script), str(out), str(model_dir), "60", str(replicas)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while len(_steps(out, 0)) < 8:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == hooks.PREEMPTION_EXIT_CODE, err[-3000:]
    assert "training preempted by" in err
    saved = checkpoint.step_of(checkpoint.latest_checkpoint(str(model_dir)))
    assert 8 <= saved < 60
    first = {rank: _steps(out, rank) for rank in range(replicas)}
    for rank in range(replicas):   # every replica made exactly the saved steps
        made = [s for s in first[rank] if s < saved]
        assert len(first[rank]) - len(made) <= (replicas > 1), first[rank]
        assert made == list(range(saved)), (rank, first[rank], saved)
    # The restart resumes at the saved step and finishes; no step twice, none lost.
    for rank in range(replicas):
        os.rename(out / f"steps-{rank}", out / f"first-{rank}")
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished at 60" in done.stdout
    for rank in range(replicas):   # (under a strategy the stop vote rides on one more
        # forward pass that makes no update: a started step past the last one)
        assert [s for s in _steps(out, rank) if s < 60] == list(range(saved, 60)), rank
    assert not glob.glob(str(tmp_path / "m" / "*.tmp-*"))


_WORKER = textwrap.dedent("""
    import os, sys, time
    sys.path[:0] = [{root!r}, {support!r}]
    import distribute, torch
    import estimator as est
    from models import regression_data

    out, model_dir, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    x, y = regression_data(16)
    task = (__import__("json").loads(os.environ["TF_CONFIG"])["task"]["type"]
            if "TF_CONFIG" in os.environ else ("chief", "worker")[int(os.environ["RANK"])])
    with open(os.path.join(out, "pid-" + task), "w") as f:
        f.write(str(os.getpid()))

    def model_fn(features, labels, mode, params):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        with open(os.path.join(out, "steps-%d" % torch.distributed.get_rank()), "a") as f:
            f.write("%d\\n" % est.get_global_step())
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)))

    def input_fn(input_context):   # the same batch every step: any resume point fits
        while True:
            time.sleep(0.02)
            yield {{"x": x}}, y

    strategy = distribute.MultiWorkerMirroredStrategy()
    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=10 ** 6, train_distribute=strategy,
        tf_random_seed=3))
    e.train(input_fn, max_steps=max_steps)
""")


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_sigterm_to_one_of_two_multi_worker_workers_then_a_restart(tmp_path, tf_config,
                                                                   free_ports):
    """Both workers stop at the agreed step (the chief saves there) and exit
    with PREEMPTION_EXIT_CODE; restarted, they finish at max_steps with the
    weights of an uninterrupted run."""
    out, model_dir = tmp_path / "out", tmp_path / "m"
    out.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(root=ROOT, support=SUPPORT))

    def start():
        ports = free_ports(2)
        cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
        return [subprocess.Popen(
            [sys.executable, str(script), str(out), str(model_dir), "40"], text=True,
            env=dict(os.environ, TF_CONFIG=tf_config(cluster, task), OMP_NUM_THREADS="1"),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for task in ("chief", "worker")]

    procs = start()
    try:
        deadline = time.monotonic() + 120
        while len(_steps(out, 1)) < 8:
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, \
                [p.stderr.read()[-2000:] for p in procs if p.poll() is not None]
            time.sleep(0.02)
        procs[1].send_signal(signal.SIGTERM)          # the worker only
        errs = [p.communicate(timeout=60)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [hooks.PREEMPTION_EXIT_CODE] * 2, errs[1][-3000:]
    assert "by a peer's signal" in errs[0] and "by SIGTERM" in errs[1]
    saved = checkpoint.step_of(checkpoint.latest_checkpoint(str(model_dir)))
    assert 8 <= saved < 40
    for rank in (0, 1):
        assert [s for s in _steps(out, rank) if s < saved] == list(range(saved)), rank
        os.rename(out / f"steps-{rank}", out / f"first-{rank}")
    procs = start()
    try:
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:]
    assert checkpoint.step_of(checkpoint.latest_checkpoint(str(model_dir))) == 40
    for rank in (0, 1):
        assert [s for s in _steps(out, rank) if s < 40] == list(range(saved, 40)), rank
    _assert_weights_of_an_uninterrupted_run(tmp_path, model_dir)


def _assert_restarted_once_and_resumed_exactly(tmp_path, out, model_dir):
    """Both ranks' step logs go back once, to the saved step, and on from
    there to 40; the weights are an uninterrupted run's."""
    assert checkpoint.step_of(checkpoint.latest_checkpoint(str(model_dir))) == 40
    for rank in (0, 1):
        steps = _steps(out, rank)
        drop = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
        first, second = steps[:drop], steps[drop:]
        saved = second[0]
        assert 8 <= saved < 40, steps
        assert [s for s in first if s < saved] == list(range(saved)), (rank, steps)
        assert [s for s in second if s < 40] == list(range(saved, 40)), (rank, steps)
    _assert_weights_of_an_uninterrupted_run(tmp_path, model_dir)


def _assert_weights_of_an_uninterrupted_run(tmp_path, model_dir):
    """The uninterrupted run: one process, the same batch (two replicas
    average the gradients of two copies of it), the same seed."""
    import numpy as np
    import torch
    import estimator as est
    from models import regression_data
    x, y = regression_data(16)

    def model_fn(features, labels, mode, params):
        net = est.get_module("linear", lambda: torch.nn.Linear(3, 1))
        loss = torch.nn.functional.mse_loss(net(features["x"]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)))
    one = est.Estimator(model_fn, config=est.RunConfig(model_dir=str(tmp_path / "one"),
                                                       tf_random_seed=3))
    one.train(lambda: ([({"x": x}, y)] * 40), max_steps=40)
    for name in ("linear/weight", "linear/bias"):
        np.testing.assert_allclose(checkpoint.load_variable(str(model_dir), name),
                                   one.get_variable_value(name), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_estimator_launch_restarts_a_preempted_group_which_resumes_exactly(tmp_path):
    """`estimator launch --max-restarts 1`: SIGTERM to the worker of a
    MultiWorkerMirrored pair; both stop at the agreed step with exit 42, the
    launcher restarts the group, which resumes at the saved step and ends at
    max_steps with no step run twice and the weights of an uninterrupted run."""
    import io
    import threading
    from estimator.experiment.launch import launch
    out, model_dir = tmp_path / "out", tmp_path / "m"
    out.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(root=ROOT, support=SUPPORT))
    output, result = io.StringIO(), {}
    runner = threading.Thread(target=lambda: result.setdefault("status", launch(
        [str(script), str(out), str(model_dir), "40"], workers=1, max_restarts=1,
        output=output, timeout=200, env=dict(os.environ, OMP_NUM_THREADS="1"))))
    runner.start()
    deadline = time.monotonic() + 120
    while len(_steps(out, 1)) < 8 and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(int((out / "pid-worker").read_text()), signal.SIGTERM)
    runner.join(240)
    text = output.getvalue()
    assert result.get("status") == 0, text[-4000:]
    assert "restart 1/1" in text, text[-4000:]
    _assert_restarted_once_and_resumed_exactly(tmp_path, out, model_dir)


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_torchrun_restarts_a_preempted_group_which_resumes_exactly(tmp_path):
    """torchrun --max-restarts 1 (its world instead of TF_CONFIG): SIGTERM to
    rank 1; both ranks stop at the agreed step with exit 42, torchrun restarts
    them, they resume at the saved step and end at max_steps with the weights
    of an uninterrupted run."""
    import shutil
    import threading
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    out, model_dir = tmp_path / "out", tmp_path / "m"
    out.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(root=ROOT, support=SUPPORT))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen([torchrun, "--standalone", "--nproc_per_node=2", "--max-restarts=1",
                             str(script), str(out), str(model_dir), "40"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    output = []
    reader = threading.Thread(target=lambda: output.append(proc.stdout.read()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while len(_steps(out, 1)) < 8:
            assert proc.poll() is None and time.monotonic() < deadline, output
            time.sleep(0.02)
        os.kill(int((out / "pid-worker").read_text()), signal.SIGTERM)
        assert proc.wait(timeout=200) == 0, "".join(output)[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    reader.join(10)
    _assert_restarted_once_and_resumed_exactly(tmp_path, out, model_dir)


class _SignalAfterSave(hooks.CheckpointSaverListener):
    """Sends this process SIGINT after the save of `step` (Ctrl-C during
    the evaluation a listener runs there)."""

    def __init__(self, step):
        self.step = step

    def after_save(self, session, global_step):
        if global_step == self.step:
            signal.raise_signal(signal.SIGINT)


def test_a_signal_as_training_ends_is_no_preemption(tmp_path):
    """Ctrl-C during the final evaluation (fault probe): the evaluation and
    exports of the last checkpoint done, the run still exited 42 saying a
    restart resumes, and a supervisor restarted a finished job."""
    import estimator as est
    from models import regression_input_fn, regression_model_fn
    config = est.RunConfig(model_dir=str(tmp_path / "model"), save_checkpoints_steps=5)
    estimator = est.Estimator(regression_model_fn, config=config)
    estimator.train(regression_input_fn(), max_steps=10, saving_listeners=[_SignalAfterSave(10)])
    assert checkpoint.step_of(estimator.latest_checkpoint()) == 10
    with pytest.raises(hooks.TrainingPreempted) as raised:   # (before the end: a preemption)
        estimator.train(regression_input_fn(), max_steps=30,
                        saving_listeners=[_SignalAfterSave(15)])
    assert raised.value.global_step in (15, 16)
