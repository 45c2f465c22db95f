"""A local cluster launcher: one process per task, each with its own TF_CONFIG
(`estimator launch`, and `launch()` from Python).

    estimator launch train.py --workers 2 --evaluator -- --train_steps 1000
    estimator launch configs/mnist.yaml --workers 2 --ps 1
    launch(["python", "train.py"], workers=2, evaluator=True)   # -> exit status

Every task runs the same program; `train_and_evaluate` picks its role from
TF_CONFIG. Addresses are free ports on 127.0.0.1. Each line a task prints is
prefixed with the task (`[worker 1] ...`). Ctrl-C is forwarded to every task;
when a task fails, every other task is stopped and the launcher says which
task failed and why, then exits with that task's status. With
`max_restarts`, a failed evaluator is restarted alone (its ledger makes it
resume), and so is a failed worker of a job with ps tasks (asynchronous
training takes it back: it rejoins the ps tasks); a failed chief, worker or
ps restarts the whole job otherwise (the torchrun way: a synchronous group
cannot take back one member; the evaluator too, which the chief's failure
stops), which resumes from the chief's latest checkpoint; so does a
preempted chief (every trainer exits 42 at the step it saved). The job
succeeds when the chief, the workers and the evaluator have exited 0; ps
tasks then exit on the chief's completion marker, and are stopped after
`stop_grace_secs` if still running.

For one machine only. On several machines the scheduler starts each task with
its own TF_CONFIG (see examples/tfjob.yaml for Kubernetes).

torchrun's analogue is `torchrun --nproc-per-node`; TF had no launcher.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence, Union

from hooks.preemption import PREEMPTION_EXIT_CODE

# The directory holding the `estimator` package (this is estimator/experiment/launch.py).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Task:
    """One process of the job: its role, TF_CONFIG, process and output pump."""

    def __init__(self, task_type: str, index: int):
        self.task_type = task_type
        self.index = index
        self.proc: Optional[subprocess.Popen] = None
        self.pump: Optional[threading.Thread] = None
        self.returncode: Optional[int] = None
        self.stopping = False

    @property
    def name(self) -> str:
        single = self.task_type in ("chief", "evaluator")
        return self.task_type if single else f"{self.task_type} {self.index}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.returncode is None


def _free_ports(n: int, host: str = "127.0.0.1") -> List[int]:
    """`n` distinct ports free on `host` now (bound together, then released)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _command(argv_or_command: Union[str, Sequence[str]]) -> List[str]:
    """The argv of each task: a `.py` script runs with this Python, a `.yaml`
    experiment with `python -m estimator run`, anything else as given."""
    if isinstance(argv_or_command, str):
        argv = shlex.split(argv_or_command)
    else:
        argv = [os.fspath(a) for a in argv_or_command]
    if not argv:
        raise ValueError("launch: no program to run")
    first = argv[0]
    if first.endswith(".py"):
        return [sys.executable, *argv]
    if first.endswith((".yaml", ".yml")):
        return [sys.executable, "-m", "estimator", "run", *argv]
    return argv


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def _status(returncode: int) -> int:
    """A shell-style exit status: 128 + signal for a killed task."""
    return 128 - returncode if returncode < 0 else returncode


class _Job:
    def __init__(self, argv, chief, workers, ps, evaluator, max_restarts, model_dir, env, cwd,
                 host, stop_grace_secs, timeout, output):
        self.argv = argv
        self.tasks = ([_Task("chief", 0)] if chief else []) + \
            [_Task("worker", i) for i in range(workers)] + \
            [_Task("ps", i) for i in range(ps)] + \
            ([_Task("evaluator", 0)] if evaluator else [])
        self.max_restarts = max_restarts
        self.restarts = 0
        self.model_dir = model_dir
        self.env = dict(env or {})
        self.cwd = cwd
        self.host = host
        self.stop_grace_secs = stop_grace_secs
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.output = output
        self.lock = threading.Lock()
        self.starting = False      # in start(): a signal's KeyboardInterrupt waits
        self.interrupted = False   # a signal came while starting
        self.cluster: dict = {}
        self.started: List[subprocess.Popen] = []

    # -- output ----------------------------------------------------------------
    def say(self, message: str) -> None:
        self._write(f"[launch] {message}\n")

    def _write(self, text: str) -> None:
        with self.lock:
            self.output.write(text)
            self.output.flush()

    def _pump(self, task: _Task, stream) -> None:
        prefix = f"[{task.name}] "
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            self._write(prefix + (line if line.endswith("\n") else line + "\n"))
        stream.close()

    # -- processes --------------------------------------------------------------
    def assign_addresses(self, tasks) -> None:
        """Fresh ports for `tasks` (the training cluster; the evaluator is not in it)."""
        members = [t for t in tasks if t.task_type != "evaluator"]
        ports = iter(_free_ports(len(members), self.host))
        for task in members:
            self.cluster.setdefault(task.task_type, {})[task.index] = \
                f"{self.host}:{next(ports)}"

    def tf_config(self, task: _Task) -> str:
        cluster = {job: [tasks[i] for i in sorted(tasks)] for job, tasks in self.cluster.items()}
        config = {"cluster": cluster, "task": {"type": task.task_type, "index": task.index}}
        if self.model_dir:
            config["model_dir"] = self.model_dir
        return json.dumps(config)

    def start(self, task: _Task) -> None:
        env = dict(os.environ)
        env.update(self.env)
        env["TF_CONFIG"] = self.tf_config(task)
        # Tasks import the same `estimator` as the launcher (`python -m estimator run`).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.starting = True   # (a signal meanwhile is acted on once the task is known)
        try:
            task.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                start_new_session=True)   # its own group: we signal it
            self.started.append(task.proc)
        finally:
            self.starting = False
        task.returncode = None
        task.stopping = False
        task.pump = threading.Thread(target=self._pump, args=(task, task.proc.stdout),
                                     name=f"launch-{task.name}", daemon=True)
        task.pump.start()
        if self.interrupted:   # (raised inside Popen, it left a task nobody would stop)
            self.interrupted = False
            raise KeyboardInterrupt

    def poll(self, task: _Task) -> Optional[int]:
        if task.running:
            task.returncode = task.proc.poll()
            if task.returncode is not None:
                task.pump.join(timeout=5)
        return task.returncode if task.proc is not None else None

    def send(self, task: _Task, sig: int) -> None:
        if task.proc is None:
            return
        try:
            os.killpg(task.proc.pid, sig)   # the task and anything it started
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, tasks, first_signal: int = signal.SIGTERM) -> None:
        """Signal `tasks`, wait `stop_grace_secs`, SIGKILL what remains, reap."""
        live = [t for t in tasks if t.running]
        for task in live:
            task.stopping = True
            self.send(task, first_signal)
        deadline = time.monotonic() + self.stop_grace_secs
        while any(self.poll(t) is None for t in live) and time.monotonic() < deadline:
            time.sleep(0.05)
        for task in live:
            self.send(task, signal.SIGKILL)   # stragglers, and their children
            if task.returncode is None:
                task.returncode = task.proc.wait()
                task.pump.join(timeout=5)

    def kill_groups(self) -> None:
        """SIGKILL the process group of every process started, exited or not,
        so that nothing a task started outlives the job."""
        for proc in self.started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # -- the job ------------------------------------------------------------------
    def run(self) -> int:
        self.assign_addresses(self.tasks)
        self.say(f"starting {len(self.tasks)} task(s): "
                 + ", ".join(t.name for t in self.tasks) + f"; cluster {json.dumps(self.cluster)}")
        for task in self.tasks:
            self.start(task)
        while True:
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.say("timeout: stopping every task")
                self.stop(self.tasks)
                return 124
            for task in self.tasks:
                code = self.poll(task)
                if code is None or code == 0 or task.stopping:
                    continue
                outcome = self._failed(task)
                if outcome is not None:
                    return outcome
            if self._succeeded():
                return 0
            time.sleep(0.05)

    def _failed(self, task: _Task) -> Optional[int]:
        chief = self._preempted_chief(task)
        if chief is not None:   # the group's preemption, which the chief saved: its exit
            task = chief
        pid, code = task.proc.pid, task.returncode
        if self.restarts < self.max_restarts:
            self.restarts += 1
            alone = task.task_type == "evaluator" or (
                task.task_type == "worker" and any(t.task_type == "ps" for t in self.tasks))
            if alone:   # an evaluator; or a worker of an asynchronous (ps) job, which rejoins
                group = [task]
            else:   # the evaluator too: the chief's failure stops it (its ledger resumes it)
                group = list(self.tasks)
            self.say(f"{task.name} (pid {pid}) {_describe(code)}; restart "
                     f"{self.restarts}/{self.max_restarts}: restarting "
                     + ", ".join(t.name for t in group))
            self.stop(group)
            if not alone:
                self.cluster = {}
                self.assign_addresses(group)
            for t in group:
                self.start(t)
            return None
        self.say(f"{task.name} (pid {pid}) {_describe(code)}; stopping the other tasks")
        self.stop(self.tasks)
        others = [f"{t.name} {_describe(t.returncode)}" for t in self.tasks
                  if t is not task and t.returncode and not t.stopping]
        self.say(f"job failed: {task.name} {_describe(code)}"
                 + (f" (also failed on their own: {', '.join(others)})" if others else ""))
        return _status(code)

    def _preempted_chief(self, task: _Task) -> Optional[_Task]:
        """Another task than the chief exited with PREEMPTION_EXIT_CODE: the
        chief, once it has exited so too (every trainer stopped at the step it
        saves: the job was preempted), else None (a worker of a ps job that
        its own signal stopped: it rejoins). The chief gets `stop_grace_secs`
        to save and exit before anything is stopped: a signal during its save
        would be a second one, which ends it unsaved."""
        chief = next((t for t in self.tasks if t.task_type == "chief"), None) or next(
            (t for t in self.tasks if t.task_type == "worker" and t.index == 0), None)
        if task.returncode != PREEMPTION_EXIT_CODE or chief is None or chief is task:
            return None
        deadline = time.monotonic() + self.stop_grace_secs
        while self.poll(chief) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return chief if chief.returncode == PREEMPTION_EXIT_CODE else None

    def _succeeded(self) -> bool:
        essential = [t for t in self.tasks if t.task_type != "ps"]
        if not all(t.returncode == 0 for t in essential):
            return False
        servers = [t for t in self.tasks if t.task_type == "ps" and t.running]
        if servers:
            deadline = time.monotonic() + self.stop_grace_secs
            while any(self.poll(t) is None for t in servers) and time.monotonic() < deadline:
                time.sleep(0.05)
            if any(t.running for t in servers):
                self.say("training is complete; stopping the ps tasks still serving")
                self.stop(servers)
        self.say("job succeeded")
        return True


def launch(argv_or_command: Union[str, Sequence[str]], chief: bool = True, workers: int = 0,
           ps: int = 0, evaluator: bool = False, max_restarts: int = 0,
           model_dir: Optional[str] = None, env: Optional[dict] = None,
           cwd: Optional[str] = None, host: str = "127.0.0.1", stop_grace_secs: float = 10.0,
           timeout: Optional[float] = None, output=None) -> int:
    """Run a local cluster of the given tasks, each a process running
    `argv_or_command` with its own TF_CONFIG; return the job's exit status
    (0, the failed task's status, 130 after Ctrl-C, 124 after `timeout`).

    `model_dir` is passed in TF_CONFIG (RunConfig takes it from there); `env`
    adds environment variables; `output` receives the prefixed lines
    (default sys.stdout).
    """
    for name, value in (("workers", workers), ("ps", ps), ("max_restarts", max_restarts)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"launch: {name} must be an int >= 0, got {value!r}")
    if not chief and not workers:
        raise ValueError("launch: the cluster needs a chief or at least one worker to train")
    if stop_grace_secs < 0 or (timeout is not None and timeout <= 0):
        raise ValueError(f"launch: stop_grace_secs must be >= 0 and timeout > 0, got "
                         f"{stop_grace_secs!r}, {timeout!r}")
    job = _Job(_command(argv_or_command), bool(chief), workers, ps, bool(evaluator),
               max_restarts, model_dir, env, cwd, host, stop_grace_secs, timeout,
               output or sys.stdout)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    terminated = []
    if in_main_thread:
        def on_signal(signum, frame):
            if signum == signal.SIGTERM:
                terminated.append(signum)
            if job.starting:
                job.interrupted = True
                return
            raise KeyboardInterrupt
        previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_signal),
                    signal.SIGINT: signal.getsignal(signal.SIGINT)}
        if previous[signal.SIGINT] is signal.default_int_handler:   # (a caller's own stays)
            signal.signal(signal.SIGINT, on_signal)

    def ignore_signals():   # a second signal (timeout's to the group too, Ctrl-C twice)
        for sig in previous:   # must not cut the tasks' saves or the clean-up short
            signal.signal(sig, lambda signum, frame: None)
    try:
        return job.run()
    except KeyboardInterrupt:
        ignore_signals()
        sig = signal.SIGTERM if terminated else signal.SIGINT
        job.say(f"{signal.Signals(sig).name}: forwarding to every task")
        job.stop(job.tasks, first_signal=sig)
        return 128 + sig
    finally:
        ignore_signals()
        job.stop(job.tasks, first_signal=signal.SIGKILL)   # nothing outlives the launcher
        job.kill_groups()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- command line ------------------------------------------------------------------
_EXAMPLES = """
examples:
  estimator launch --workers 2 --evaluator configs/cluster.yaml     # chief, 2 workers, evaluator
  estimator launch configs/parameter_server.yaml --workers 2 --ps 1 --model-dir runs/ps
  estimator launch --workers 1 --max-restarts 3 --timeout 3600 configs/cluster.yaml
  estimator launch --workers 1 configs/cluster.yaml -- --set train_spec.max_steps=200
  estimator launch --workers 1 examples/multi_worker.py             # a script of your own
"""
_HELP = dict(description=__doc__.split("\n\n")[0], epilog=_EXAMPLES,
             formatter_class=argparse.RawDescriptionHelpFormatter)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `launch` on the `estimator` CLI's subcommands."""
    parser = subparsers.add_parser(
        "launch", help="run a local cluster: one process per task, each with its TF_CONFIG",
        **_HELP)
    _add_arguments(parser)
    parser.set_defaults(handler=_run_from_args)
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_options(parser)
    parser.add_argument("program", help="a .py script, a .yaml experiment, or a command")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the program")


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chief", action=argparse.BooleanOptionalAction, default=True,
                        help="start a chief task (default: yes)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="number of worker tasks")
    parser.add_argument("--ps", type=int, default=0, metavar="M",
                        help="number of parameter-server tasks")
    parser.add_argument("--evaluator", action="store_true", help="start an evaluator task")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="restarts allowed after a task fails (default: 0)")
    parser.add_argument("--model-dir", default=None,
                        help="model_dir passed to every task in TF_CONFIG (and, for an "
                             "experiment file, set as its run_config.model_dir)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECS",
                        help="stop the job after this many seconds (exit status 124)")
    parser.add_argument("--stop-grace-secs", type=float, default=10.0, metavar="SECS",
                        help="how long stopped tasks get before SIGKILL (default: 10)")


def _run_from_args(args) -> int:
    program_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    if args.program.endswith((".yaml", ".yml")) and args.args[:1] != ["--"]:
        # The documented order, `estimator launch configs/X.yaml --workers N --ps M`: the
        # launcher's flags may follow an experiment file; the rest is for `run`.
        own = argparse.ArgumentParser(prog="estimator launch", add_help=False)
        _add_options(own)
        own.set_defaults(**{k: v for k, v in vars(args).items() if k not in ("program", "args")})
        program = args.program
        args, program_args = own.parse_known_args(program_args)
        args.program = program
    if args.program.endswith((".yaml", ".yml")) and args.model_dir:
        # the experiment's own run_config.model_dir would disagree with TF_CONFIG's
        args.model_dir = os.path.abspath(args.model_dir)
        program_args = [*program_args, "--set", f"run_config.model_dir={args.model_dir}"]
    try:
        return launch([args.program, *program_args], chief=args.chief, workers=args.workers,
                      ps=args.ps, evaluator=args.evaluator, max_restarts=args.max_restarts,
                      model_dir=args.model_dir, timeout=args.timeout,
                      stop_grace_secs=args.stop_grace_secs)
    except (ValueError, OSError) as e:
        print(f"estimator launch: error: {e}", file=sys.stderr)
        return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`estimator launch ...` as a program of its own; returns the exit status."""
    parser = argparse.ArgumentParser(prog="estimator launch", **_HELP)
    _add_arguments(parser)
    return _run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
