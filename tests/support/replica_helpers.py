"""Hooks and inputs for the multi-replica tests (they run inside the replica
processes, so what they observe goes to files outside model_dir)."""
import os
import time

import numpy as np
import torch
import torch.distributed as dist

import hooks
from models import regression_data


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def batches(n=256, batch_size=16, seed=0):
    """The regression data as a list of (features, labels) batches."""
    x, y = regression_data(n, seed)
    return [({"x": x[i:i + batch_size]}, y[i:i + batch_size]) for i in range(0, n, batch_size)]


def concatenated(parts, k):
    """Batches of `parts` concatenated k by k (what one process sees of k replicas' step)."""
    out = []
    for i in range(0, len(parts) - k + 1, k):
        group = parts[i:i + k]
        out.append(({"x": np.concatenate([f["x"] for f, _ in group])},
                    np.concatenate([lab for _, lab in group])))
    return out


class SaveWeights(hooks.SessionRunHook):
    """At the end, writes this replica's modules to `out_dir/weights-<rank>.pt`."""

    def __init__(self, out_dir):
        self._out_dir = out_dir

    def end(self, session):
        state = {n: {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
                 for n, m in session.scope.raw_modules.items()}
        state["global_step"] = session.global_step
        torch.save(state, os.path.join(self._out_dir, f"weights-{rank()}.pt"))


class RecordSaves(hooks.CheckpointSaverListener):
    """Appends "<replica> <step>" to `path` after each save it is told of."""

    def __init__(self, path):
        self._path = path

    def after_save(self, session, global_step_value):
        with open(self._path, "a", encoding="utf-8") as f:
            f.write(f"{rank()} {global_step_value}\n")


class RecordLoss(hooks.SessionRunHook):
    """Records the loss every step (in replica 0 under MirroredStrategy; the
    list comes back to the caller's hook)."""

    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return hooks.SessionRunArgs("loss")

    def after_run(self, run_context, run_values):
        self.losses.append(run_values.results)


class OnReplica(hooks.SessionRunHook):
    """On replica `replica`, after global step `step`: do `what` ("stop",
    "raise", "die", "hang")."""

    def __init__(self, replica, step, what):
        self._replica, self._step, self._what = replica, step, what

    def after_run(self, run_context, run_values):
        if rank() != self._replica or run_context.session.global_step != self._step:
            return
        if self._what == "stop":
            run_context.request_stop()
        elif self._what == "raise":
            print(f"raising at {time.time():.3f}", flush=True)
            raise ValueError(f"boom on replica {self._replica}")
        elif self._what == "die":
            os._exit(3)
        elif self._what == "hang":
            time.sleep(120)


class WritePid(hooks.SessionRunHook):
    """Writes the replica's pid to `out_dir/pid-<rank>` and sleeps each step."""

    def __init__(self, out_dir, sleep=0.05):
        self._out_dir, self._sleep = out_dir, sleep

    def begin(self):
        with open(os.path.join(self._out_dir, f"pid-{rank()}"), "w") as f:
            f.write(str(os.getpid()))

    def after_run(self, run_context, run_values):
        time.sleep(self._sleep)
