"""ProfilerHook: Chrome traces of chosen steps (tf.estimator.ProfilerHook),
recorded with torch.profiler."""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Optional

import torch

from .mode_keys import ModeKeys

from .basic_session_run_hooks import SecondOrStepTimer
from .files import atomic_write
from .session_run_hook import SessionRunHook

logger = logging.getLogger(__name__)


class ProfilerHook(SessionRunHook):
    """Profiles a step every `save_steps` steps or `save_secs` seconds and
    writes it as a Chrome trace `output_dir/timeline-<step>.json`
    (tf.estimator.ProfilerHook; TF's file name). chrome://tracing and
    ui.perfetto.dev open it.

    The profiler (torch.profiler: CPU ops, and CUDA kernels when CUDA is
    available) runs only during the due steps; the first step is never
    profiled (warm-up), as in TF. `<step>` is the global step after the step
    in training, the number of steps run in evaluation/prediction.
    `show_memory` records tensor allocations (torch's `profile_memory`);
    `show_dataflow` records each op's input shapes (torch's
    `record_shapes`; TF draws dataflow arrows instead). `output_dir=""`
    writes into the session's `model_dir` on the chief; a non-chief worker
    needs an `output_dir` of its own (only the chief writes to `model_dir`).
    """

    def __init__(self, save_steps: Optional[int] = None, save_secs: Optional[float] = None,
                 output_dir: str = "", show_dataflow: bool = True, show_memory: bool = False):
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._output_dir = output_dir
        self._show_dataflow = show_dataflow
        self._show_memory = show_memory
        self._profile = None
        self._started = False
        self._count = 0

    def begin(self):
        self._timer.reset()
        self._started = False
        self._count = 0

    def after_create_session(self, session, coord):
        output_dir = self._output_dir
        if not output_dir:
            if not session.is_chief:
                raise ValueError("ProfilerHook on a non-chief worker needs an output_dir of "
                                 "its own: model_dir is written by the chief only")
            output_dir = session.model_dir or "."
        self._dir = output_dir
        self._train = session.mode == ModeKeys.TRAIN

    def _step(self, session) -> int:
        """The number the coming step will have."""
        return session.global_step + 1 if self._train else self._count + 1

    def before_run(self, run_context):
        if self._started and self._timer.should_trigger_for_step(self._step(run_context.session)):
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(
                activities=activities, record_shapes=self._show_dataflow,
                profile_memory=self._show_memory)
            self._profile.__enter__()
        return None

    def after_run(self, run_context, run_values):
        self._count += 1
        step = run_context.session.global_step if self._train else self._count
        if self._profile is not None:
            self._stop_and_save(step)
        elif not self._started:   # (TF's timer starts from the step before the first:
            self._started = True   # its trace of every 10 steps is the 10th's, timeline-10)
            self._timer.update_last_triggered_step(step - 1)

    def end(self, session):
        if self._profile is not None:   # the input ran out during a profiled step
            self._profile.__exit__(None, None, None)
            self._profile = None

    def _stop_and_save(self, step: int) -> None:
        profile, self._profile = self._profile, None
        if torch.cuda.is_available():
            torch.cuda.synchronize()    # the step's kernels belong in its trace
        profile.__exit__(None, None, None)
        self._timer.update_last_triggered_step(step)
        os.makedirs(self._dir, exist_ok=True)
        path = os.path.join(self._dir, f"timeline-{step}.json")
        logger.info("Saving timeline for %d into '%s'.", step, path)
        atomic_write(path, lambda f: _chrome_trace(profile, f))


def _chrome_trace(profile, f) -> None:
    """The profile's Chrome trace (torch writes it to a path) into `f`."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        profile.export_chrome_trace(trace)
        with open(trace, "rb") as src:
            f.write(src.read())
