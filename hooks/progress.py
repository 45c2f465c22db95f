"""A progress display for train/evaluate/predict on a terminal (no TF
analogue; TF logs `global_step/sec`, which StepCounterHook also does here)."""
from __future__ import annotations

import numbers
import sys
import time
from typing import Optional

from .session_run_hook import NEVER, SessionRunHook


def _clock(secs: float) -> str:
    secs = int(secs)
    return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"


class ProgressHook(SessionRunHook):
    """Shows `train: 1200/5000 (24%), 350.2 steps/s, ETA 0:00:11` on one
    terminal line.

    Writes to `stream` (default `sys.stderr`) only if it is a terminal; to a
    file, a pipe or captured output it writes nothing. It redraws at most
    every `every_secs` seconds and reads only the host clock: nothing is
    fetched from the device, so a step costs a counter increment and a clock
    read. The end (for the percentage and the ETA) is `num_steps` steps of
    this run or global step `last_step`; without either it shows the count
    and the rate. The rate (and so the ETA) is measured from the second step
    on, leaving out the first step's start-up.
    """

    def __init__(self, num_steps: Optional[int] = None, last_step: Optional[int] = None,
                 desc: str = "", stream=None, every_secs: float = 0.25):
        if num_steps is not None and last_step is not None:
            raise ValueError("ProgressHook: only one of num_steps or last_step can be "
                             "specified.")
        for name, value in (("num_steps", num_steps), ("last_step", last_step)):
            if value is not None and (not isinstance(value, numbers.Integral)
                                      or isinstance(value, bool) or value < 0):
                raise ValueError(f"ProgressHook: {name} must be an int >= 0, got {value!r}")
        if not every_secs > 0:
            raise ValueError(f"ProgressHook: every_secs must be > 0, got {every_secs!r}")
        self._num_steps = num_steps
        self._last_step = last_step
        self._desc = desc
        self._stream = stream
        self._every_secs = every_secs
        self._enabled = False

    def begin(self):
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            self._enabled = bool(stream is not None and stream.isatty())
        except (AttributeError, ValueError):   # no isatty, or a closed stream
            self._enabled = False
        self._out = stream

    def after_create_session(self, session, coord):
        total = self._num_steps
        if self._last_step is not None:
            total = max(0, self._last_step - session.global_step)
        self._total = total
        self._next_draw = time.time() + self._every_secs
        self._rate_start = None   # (time, count) after the first step

    # Steps are counted by the session (`session._runs`), so the session need
    # call this hook only after the first step and when a redraw is due.
    def after_run(self, run_context, run_values):
        if not self._enabled:
            return
        done, now = run_context.session._runs + 1, time.time()
        if self._rate_start is None:
            self._rate_start = (now, done)
        elif now >= self._next_draw:
            self._draw(now, done)
            self._next_draw = now + self._every_secs

    def _idle(self, session):
        if not self._enabled:     # off a terminal it never does anything
            return NEVER, NEVER, NEVER
        return NEVER, 0 if self._rate_start is None else NEVER, self._next_draw

    def end(self, session):
        if self._enabled and session._runs:
            self._draw(time.time(), session._runs, final=True)

    def _line(self, now: float, done: int) -> str:
        head = f"{self._desc}: " if self._desc else ""
        rate = None
        t0, n0 = self._rate_start or (now, done)
        if now > t0 and done > n0:
            rate = (done - n0) / (now - t0)
        total = self._total
        parts = [f"{done}/{total} ({100 * done // max(total, 1)}%)" if total
                 else f"{done} steps"]
        if rate is not None:
            parts.append(f"{rate:.1f} steps/s")
            if total and done < total:
                parts.append(f"ETA {_clock((total - done) / rate)}")
        return head + ", ".join(parts)

    def _draw(self, now: float, done: int, final: bool = False) -> None:
        try:
            self._out.write("\r" + self._line(now, done) + "\x1b[K" + ("\n" if final else ""))
            self._out.flush()
        except (OSError, ValueError):   # the terminal went away: stop drawing
            self._enabled = False


def progress_hooks(desc: str, num_steps: Optional[int] = None,
                   last_step: Optional[int] = None) -> list:
    """The Estimator's progress display: `[ProgressHook]` when stderr is a
    terminal, else nothing (no hook, no cost)."""
    try:
        tty = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return [ProgressHook(num_steps=num_steps, last_step=last_step, desc=desc)] if tty else []
