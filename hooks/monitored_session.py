"""The session loop: MonitoredSession and MonitoredTrainingSession.

The only thing that calls hooks. The Estimator's train/evaluate/predict run on
it, and custom loops use it directly as TF1 pipelines used
`tf.compat.v1.train.MonitoredTrainingSession`:

    with hooks.MonitoredTrainingSession(checkpoint_dir="runs/x",
                                        hooks=[hooks.StopAtStepHook(last_step=100)]) as sess:
        net = est.get_module("net", lambda: torch.nn.Linear(4, 1))  # restored if saved
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        while not sess.should_stop():
            sess.run(train_step, batch)   # train_step returns the loss (or a dict)

One `run` is one step: in training the session increments the global step
after it. A step that no hook asks anything of never copies to the host.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

import numpy as np
import torch

import distribute
from distribute.host_arrays import to_numpy_value

from . import checkpoint, model_scope, preemption
from . import summary as _summary
from .mode_keys import ModeKeys
from .scaffold import check_scaffold

from .session_run_hook import (NEVER, SessionRunArgs, SessionRunContext, SessionRunHook,
                               SessionRunValues, check_hooks)
from .summary_hooks import SummaryWriterCache
from .training_lock import TrainingLock

logger = logging.getLogger(__name__)


def _to_host(values: Dict[str, Any]) -> Dict[str, Any]:
    """Copy the fetched tensors to the host, once per step for all hooks, as
    numpy values (TF's `session.run`: a float32 scalar is a `np.float32`)."""
    out = {}
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            value = to_numpy_value(value)
        elif name == "summaries":
            value = _summary._to_host(value)
        out[name] = value
    return out


_NO_ARGS = SessionRunArgs(None)
_NO_STEP = object()
_NO_VALUES = SessionRunValues(None)


class _Coordinator:
    """The `coord` of `after_create_session` (tf.train.Coordinator, minimal)."""

    def __init__(self):
        self._stop = False
        self.error: Optional[BaseException] = None

    def request_stop(self, ex=None):
        """Stop after the step in flight (from a hook's thread too); `ex` (an
        exception, or `sys.exc_info()`), the first given, is raised when the
        session closes, after the hooks' `end` (TF's Coordinator.join). The
        session's close stops it too (a hook's thread waiting on
        `should_stop()` ends)."""
        if ex is not None and self.error is None:
            self.error = ex[1] if isinstance(ex, tuple) else ex
        self._stop = True

    def should_stop(self) -> bool:
        return self._stop


class _Session:
    """What hooks receive as `session` (there is no tf.Session): the model scope,
    the global step, the strategy and where the chief writes."""

    def __init__(self, scope, model_dir: Optional[str], is_chief: bool, fetch_last=None,
                 preempted: Optional[Callable[[], Optional[str]]] = None):
        self.scope = scope
        self.model_dir = model_dir
        self.is_chief = is_chief
        self.diverged_at_step: Optional[int] = None  # set by NanTensorHook: save no checkpoint
        self.fails_on_nan = False   # a NanTensorHook(fail_on_nan_loss=True) is in the session
        self._fetch_last = fetch_last
        self._preempted = preempted or (lambda: None)
        self._runs = 0   # steps run in this session (hooks' iteration count)

    @property
    def preempted(self) -> Optional[str]:
        """Why the session is stopping early, when a SIGTERM/SIGINT made it
        (the signal's name, or "a peer's signal"), else None. The hooks' `end`
        runs before the preemption checkpoint is saved: one that would do
        slow work (an evaluation) should skip it then, or the grace period
        before the kill may run out first."""
        return self._preempted()

    def run(self, fetches, feed_dict: Optional[dict] = None):
        """The host values of `fetches` (a name, a list or dict of names) as the
        last step exposed them, for hooks' `end` (TF: `session.run(fetches)`;
        no step is run here). A name in `feed_dict` is answered with its value."""
        return self._fetch_last(fetches, feed_dict)

    @property
    def strategy(self):
        return self.scope.strategy

    @property
    def mode(self) -> str:
        return self.scope.mode

    @property
    def global_step(self) -> int:
        return self.scope.global_step


class MonitoredSession:
    """Runs steps with hooks around them (tf.compat.v1.train.MonitoredSession).

    `scope` is the model scope the steps build into (its mode says whether a
    step increments the global step). Exiting the `with` block normally, or
    because the input ran out (StopIteration from the step), calls every hook's
    `end`; an exception propagates without it, as in TF.
    """

    def __init__(self, scope, hooks: Iterable[SessionRunHook] = (),
                 model_dir: Optional[str] = None, is_chief: Optional[bool] = None):
        self._scope = scope
        self._hooks: List[SessionRunHook] = check_hooks(hooks)
        _share_savers(self._hooks)
        if is_chief is None:
            is_chief = scope.strategy.extended.should_checkpoint
        self._session = _Session(scope, model_dir, is_chief, self._fetch_last,
                                 lambda: self.preempted)
        self._last_outputs = _NO_STEP  # the last step's outputs and named tensors,
        self._last_named: dict = {}    # for session.run in hooks (`end`)
        self._train = scope.mode == ModeKeys.TRAIN
        # Training replicas stop together (None: one replica, nothing to agree on).
        self._agree_to_stop = scope.strategy.extended.all_agree_to_stop if self._train else None
        # SIGTERM/SIGINT while training: stop at an agreed step and save (hooks.preemption).
        self._preemption = preemption.Watcher()
        # Only hooks that override a method are called for it; hooks with an
        # `_idle` schedule only on the steps where they may do something (not
        # a subclass whose own before_run/after_run may act on any step).
        self._before_run_hooks = [h for h in self._hooks
                                  if type(h).before_run is not SessionRunHook.before_run]
        self._after_run_hooks = [h for h in self._hooks
                                 if type(h).after_run is not SessionRunHook.after_run]
        called = {id(h) for h in self._before_run_hooks + self._after_run_hooks}
        self._scheduled = [h for h in self._hooks if id(h) in called and _schedulable(h)]
        self._scheduled_ids = {id(h) for h in self._scheduled}
        self._idle_until: Dict[int, tuple] = {}   # id(hook) -> its `_idle` bounds
        self._always_before = self._calls(self._before_run_hooks, ())
        self._always_after = self._calls(self._after_run_hooks, ())
        self._quiet = not (self._always_before or self._always_after)   # every hook scheduled
        self._wake_step = self._wake_run = self._wake_time = NEVER
        self._stop = False
        self._coord = _Coordinator()   # the hooks' `coord`: its stop and error are this one's
        self._uncounted = False   # this step left the global step as it was
        self._entered = False
        self._lock = None   # MonitoredTrainingSession's model_dir lock, released at the end

    # -- context -------------------------------------------------------------
    def __enter__(self) -> "MonitoredSession":
        if self._train:
            self._preemption.__enter__()
        self._scope.__enter__()
        self._strategy_scope = self._scope.strategy.scope()
        self._strategy_scope.__enter__()
        self._entered = True
        try:
            for hook in self._hooks:
                hook.begin()
            for hook in self._hooks:
                hook.after_create_session(self._session, self._coord)
            self._stop = self._coord.should_stop() and (
                self._agree_to_stop is None   # (else every replica stops at its first step)
                or self._scope.strategy.extended.stop_before_first_step())
            self._reschedule(self._scheduled)
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None or issubclass(exc_type, StopIteration):
                try:
                    for hook in self._hooks:
                        hook.end(self._session)
                finally:   # (after the ends, raising or not)
                    self._raise_coordinator_error()
            else:   # no `end` on an error (as TF), but work a hook started completes
                # (for custom loops: the Estimator's train and evaluate tell theirs
                # too, errors before the session included; not a preemption's SystemExit)
                if issubclass(exc_type, Exception):
                    self._scope.strategy.extended.report_failure(exc)
                for hook in self._hooks:
                    settle = getattr(hook, "settle", None)
                    if settle is not None:
                        try:
                            settle()
                        except Exception as e:   # the error in flight is the one to see
                            logger.error("%s could not finish after the error: %s",
                                         type(hook).__name__, e)
                self._raise_coordinator_error(exc)
        finally:
            self._coord.request_stop()
            self._leave()
        return exc_type is not None and issubclass(exc_type, StopIteration)

    def _raise_coordinator_error(self, context: Optional[BaseException] = None) -> None:
        """TF's coordinator join in the session's close: a hook's
        `coord.request_stop(e)` raises `e`, whatever else ended the session
        (`context`, or an error in flight: its context)."""
        self._coord.request_stop()
        error = self._coord.error
        if error is not None and error is not context:
            if context is not None:
                error.__context__ = context
            raise error

    def close(self) -> None:
        self.__exit__(None, None, None)

    def _leave(self):
        if self._entered:
            self._entered = False
            # On disk even when an error skipped the hooks' `end` (the loss
            # curve up to a NaN is what one looks at next).
            SummaryWriterCache._write_held(flush=True)
            self._strategy_scope.__exit__(None, None, None)
            self._scope.__exit__(None, None, None)
        self._preemption.__exit__()
        if self._lock is not None:
            self._lock.release()

    # -- the loop ------------------------------------------------------------
    @property
    def session(self) -> _Session:
        return self._session

    @property
    def preempted(self) -> Optional[str]:
        """Why training stopped early, when a SIGTERM/SIGINT did it: the
        signal's name here, or "a peer's signal" when another replica got it."""
        if self._preemption.signalled is not None:
            return self._preemption.signalled
        return "a peer's signal" if self._scope.strategy.extended.preempted else None

    def should_stop(self) -> bool:
        return self._stop

    def run(self, step_fn: Callable, *args, **kwargs):
        """Run one step `step_fn(*args, **kwargs)` with the hooks around it.

        The step returns its loss tensor, a dict of named tensors, or an
        EstimatorSpec; those (and `est.named_tensor`s) are what fetches name.
        A step that raises StopIteration (input exhausted) ends the loop.
        """
        scope = self._scope
        if not callable(step_fn):
            raise TypeError(_not_a_step(step_fn))
        if scope.name_uses or scope.collections:
            scope.forget_call()
        due = (scope.global_step + 1 >= self._wake_step or self._session._runs >= self._wake_run
               or self._wake_time != NEVER and time.time() >= self._wake_time)
        if self._quiet and not due and not scope.summaries_due:
            # No hook is due: the step alone (most steps, so kept short).
            try:
                outputs = step_fn(*args, **kwargs)
            except StopIteration:
                self._stop = True
                return None
            if self._train:
                if scope.after_update:
                    scope.run_after_update()
                scope.check_left_out()
                if scope.step_uncounted:
                    scope.step_uncounted = False
                else:
                    scope.global_step += 1
            if scope.step_hidden:
                return self._hidden(outputs)
            if (self._agree_to_stop is None and not scope.named_tensors and not self._coord._stop
                    and not self._due_after_step() and self._preemption.signalled is None):
                self._last_outputs, self._last_named = outputs, scope.named_tensors
                self._session._runs += 1
                return outputs
            self._after_step(outputs, None, None, (), None)
            return outputs
        return self._run_with_hooks(step_fn, args, kwargs, due)

    def _run_with_hooks(self, step_fn: Callable, args, kwargs, due: bool):
        scope, session = self._scope, self._session
        woken = None
        if due:   # a scheduled hook is due
            woken = self._due(scope.global_step + 1, session._runs, time.time())
            before = self._calls(self._before_run_hooks, woken)
            after = self._calls(self._after_run_hooks, woken)
        else:
            before, after = self._always_before, self._always_after
        context = SessionRunContext(_NO_ARGS, session)
        requests = feeds = None
        for hook in before:
            request = hook.before_run(context)
            if request is not None:
                if request.fetches is not None:
                    requests = requests or []
                    requests.append((hook, request.fetches, _names(request.fetches)))
                if request.feed_dict:
                    feeds = _merge_feeds(feeds, request.feed_dict)
        if feeds:
            scope.feed_dict = feeds
        if requests:
            scope.summaries_due = any("summaries" in names for _, _, names in requests)
        elif scope.summaries_due:   # due before the loop (first step), but nobody fetches them
            scope.summaries_due = False
            scope.summaries.clear()
        try:
            outputs = step_fn(*args, **kwargs)
        except StopIteration:
            self._stop = True
            scope.summaries_due = False
            return None
        finally:
            if feeds:
                scope.feed_dict = None
        if feeds and not feeds.keys() <= scope.named_tensors.keys():   # (TF: a feed_dict key
            name = min(feeds.keys() - scope.named_tensors.keys())   # no tensor has: an error)
            raise KeyError(f"A hook feeds {name!r}, which this step does not expose; "
                           f"available: {sorted(scope.named_tensors)}. Name the tensor to feed "
                           "in the model_fn with est.named_tensor(name, tensor)")
        self._uncounted = False
        if self._train:
            if scope.after_update:
                scope.run_after_update()
            scope.check_left_out()
            if scope.step_uncounted:   # (TF: a skipped update leaves the step as it was)
                scope.step_uncounted, self._uncounted = False, True
            else:
                scope.global_step += 1
        if scope.step_hidden:
            return self._hidden(outputs)
        self._after_step(outputs, context, requests, after, woken)
        return outputs

    def _hidden(self, outputs):
        """A step no hook's after_run sees and no summary records (its hooks
        were asked before it ran: they are asked again at the next step)."""
        scope = self._scope
        scope.step_hidden = scope.summaries_due = False
        scope.summaries.clear()
        scope.named_tensors = {}
        return outputs

    def _after_step(self, outputs, context, requests, after, woken) -> None:
        """After a step (the global step counted): call `after_run` of the
        hooks in `after` and of scheduled hooks due by the global step or the
        time the step made, count the run, decide on stopping."""
        scope, session = self._scope, self._session
        if self._due_after_step():
            more = self._due(scope.global_step, -1, time.time())
            if more - (woken or set()):
                woken = (woken or set()) | more
                after = self._calls(self._after_run_hooks, woken)
                context = context or SessionRunContext(_NO_ARGS, session)
        self._last_outputs, self._last_named = outputs, scope.named_tensors
        if requests is None:
            for hook in after:
                hook.after_run(context, _NO_VALUES)
        else:
            self._answer(context, requests, outputs, after)
        if self._last_named:
            scope.named_tensors = {}
        session._runs += 1
        if woken:
            self._reschedule([h for h in self._scheduled if id(h) in woken])
        stop = context is not None and context._stop_requested or self._coord._stop
        preempted = self._preemption.signalled is not None
        if self._agree_to_stop is not None:   # every replica stops at one step
            stop = self._agree_to_stop(stop or preempted, preempted)
        elif preempted:
            stop = True
        if stop:
            self._stop = True

    # -- the schedule of hooks with `_idle` -----------------------------------
    def _due_after_step(self) -> bool:
        """A scheduled hook is due by the global step the step made, or by the
        time it took (TF's hooks check both in after_run)."""
        return (self._scope.global_step >= self._wake_step
                or self._wake_time != NEVER and time.time() >= self._wake_time)

    def _calls(self, hooks: List[SessionRunHook], woken) -> List[SessionRunHook]:
        """`hooks` (in order) less the scheduled ones not in `woken` (ids)."""
        return [h for h in hooks if id(h) not in self._scheduled_ids or id(h) in woken]

    def _due(self, step: int, runs: int, now: float) -> set:
        """Ids of the scheduled hooks whose idle time ends at this step, run or time."""
        return {key for key, (s, r, t) in self._idle_until.items()
                if step >= s or runs >= r or now >= t}

    def _reschedule(self, hooks: List[SessionRunHook]) -> None:
        for hook in hooks:
            self._idle_until[id(hook)] = hook._idle(self._session) or (0, 0, 0.0)
        bounds = list(self._idle_until.values())
        self._wake_step = min((b[0] for b in bounds), default=NEVER)
        self._wake_run = min((b[1] for b in bounds), default=NEVER)
        self._wake_time = min((b[2] for b in bounds), default=NEVER)

    def _answer(self, context, requests, outputs, after) -> None:
        """Copy every requested value to the host once, and call `after_run`."""
        scope = self._scope
        names = {n for _, _, fetched in requests for n in fetched}
        try:
            host = _to_host({n: self._resolve(n, outputs) for n in names})
        except KeyError as e:   # name the hooks that asked
            if not hasattr(e, "fetch"):
                raise
            askers = sorted({type(h).__name__ for h, _, got in requests if e.fetch in got})
            raise _not_exposed(e.fetch, e.available, " and ".join(askers)) from None
        if self._train and "global_step" in host:
            # TF's fetch reads the step beside the train_op, before its update
            # (a hook sees 0 on the first step; `session.global_step` is the new one)
            host["global_step"] = np.int64(scope.global_step - (0 if self._uncounted else 1))
        answers = {id(hook): _structure(fetches, host) for hook, fetches, _ in requests}
        for hook in after:
            results = answers.get(id(hook))
            hook.after_run(context, _NO_VALUES if results is None
                           else SessionRunValues(results))
        scope.summaries_due = False
        scope.summaries.clear()

    def _fetch_last(self, fetches, feed_dict: Optional[dict] = None):
        feed = feed_dict or {}
        if self._last_outputs is _NO_STEP and any(
                n not in feed and n != "global_step" for n in _names(fetches)):
            # (the global step is known without one, as TF's session reads its variable)
            raise RuntimeError(f"session.run({fetches!r}): no step has run in this session, "
                               "so there are no step values to fetch (only global_step)")
        names = _names(fetches)
        unknown = sorted(set(feed) - set(names) - set(self._last_named or ())
                         - {"loss", "global_step", "summaries"})
        if unknown:   # (TF: a feed_dict key no tensor has is an error; a typo here was lost)
            raise KeyError(f"session.run feeds {unknown[0]!r}, which the last step does not "
                           f"expose; available: {sorted(self._last_named or ())}")
        values = {n: feed[n] if n in feed else
                  self._resolve(n, self._last_outputs, self._last_named)
                  for n in names}
        return _structure(fetches, _to_host(values))

    def _resolve(self, name: str, outputs, named: Optional[dict] = None):
        scope = self._scope
        named = scope.named_tensors if named is None else named
        if name == "global_step":
            return np.int64(scope.global_step)   # (TF's int64 variable, read by session.run)
        if name == "summaries":
            return list(scope.summaries)
        if name == "loss":   # the step's own loss, as TF's hooks fetch its loss tensor
            loss = getattr(outputs, "loss", None)   # (an EstimatorSpec's)
            if loss is None and isinstance(outputs, dict):
                loss = outputs.get("loss")
            if loss is None and name not in named and isinstance(outputs, torch.Tensor):
                loss = outputs   # (a custom loop's step returning its loss alone)
            if loss is not None:
                return scope.reported_loss(loss)
        if name in named:
            return named[name]
        exposed = getattr(outputs, "predictions", outputs)
        if isinstance(exposed, dict) and name in exposed:
            return exposed[name]
        available = ["global_step", "summaries", "loss", *named,
                     *(exposed if isinstance(exposed, dict) else ())]
        raise _not_exposed(name, sorted(set(available)))


def _not_exposed(name: str, available: list, asker: str = "A hook") -> KeyError:
    graph_name = ("; TF's graph tensor names (a canned estimator's "
                  "'dnn/head/weighted_loss/value') are not here: a step's loss is 'loss'"
                  if "/" in name or ":" in name else "")
    error = KeyError(f"{asker} fetches {name!r}, which this step does not expose; available: "
                     f"{available}. Name a tensor in the model_fn with "
                     f"est.named_tensor(name, tensor){graph_name}")
    error.fetch, error.available = name, available
    return error


def training_hooks(checkpoint_dir: Optional[str], is_chief: bool,
                   save_checkpoint_secs=None, save_checkpoint_steps=None,
                   save_summaries_steps=None, save_summaries_secs=None,
                   log_step_count_steps=None, keep_checkpoint_max=5,
                   keep_checkpoint_every_n_hours=10000.0, listeners=(),
                   summary_dir: Optional[str] = None,
                   save_summaries: Optional[bool] = None,
                   async_checkpoint: bool = False, given_hooks: Iterable = ()) -> list:
    """The hooks TF installs around training, in one place for the Estimator
    and MonitoredTrainingSession: on the chief, checkpoints every N steps or
    seconds (and at the end); where `save_summaries` (default `is_chief`),
    `global_step/sec` every `log_step_count_steps` and the summaries every
    `save_summaries_steps` or `save_summaries_secs` into `summary_dir`
    (default `checkpoint_dir`).

    `given_hooks` are the Estimator's others (the user's and the
    EstimatorSpec's), as TF's Estimator looks at them: a CheckpointSaverHook
    among them saves instead of the default one and takes the `listeners`;
    listeners with no saver at all are TF's ValueError."""
    from .basic_session_run_hooks import CheckpointSaverHook
    from .summary_hooks import StepCounterHook, SummarySaverHook
    given = _saving_with(given_hooks, keep_checkpoint_max, keep_checkpoint_every_n_hours,
                         async_checkpoint)
    if given:   # TF: the first takes the listeners; no default saver
        for listener in listeners:
            if listener not in given[0]._listeners:
                given[0]._listeners.append(listener)
            if callable(getattr(listener, "protect_checkpoint", None)):
                for hook in given:   # (the session shares one of their Savers)
                    hook._saver.protect(listener.protect_checkpoint)
        save_checkpoint_steps = save_checkpoint_secs = None
    elif listeners and not (save_checkpoint_steps or save_checkpoint_secs):
        raise ValueError("There should be a CheckpointSaverHook to use saving_listeners. Please "
                         "set one of the RunConfig.save_checkpoints_steps or "
                         "RunConfig.save_checkpoints_secs.")
    out = []
    summary_dir = summary_dir or checkpoint_dir
    if (is_chief if save_summaries is None else save_summaries) and summary_dir:
        if log_step_count_steps:
            out.append(StepCounterHook(every_n_steps=log_step_count_steps,
                                       output_dir=summary_dir))
        if save_summaries_steps or save_summaries_secs:
            out.append(SummarySaverHook(
                save_steps=save_summaries_steps or None,
                save_secs=None if save_summaries_steps else save_summaries_secs,
                output_dir=summary_dir))
    if is_chief and checkpoint_dir and (save_checkpoint_steps or save_checkpoint_secs):
        saver = checkpoint.Saver(checkpoint_dir, keep_checkpoint_max,
                                 keep_checkpoint_every_n_hours, background=async_checkpoint)
        for listener in listeners:  # e.g. train_and_evaluate keeping unevaluated checkpoints
            if callable(getattr(listener, "protect_checkpoint", None)):
                saver.protect(listener.protect_checkpoint)
        out.append(CheckpointSaverHook(checkpoint_dir, save_secs=save_checkpoint_secs,
                                       save_steps=save_checkpoint_steps, saver=saver,
                                       listeners=listeners))
    return out


def _saving_with(hooks, keep_checkpoint_max, keep_checkpoint_every_n_hours,
                 async_checkpoint: bool) -> list:
    """The CheckpointSaverHooks among `hooks`, those made without a saver given
    one with these settings (TF: the graph's Saver, which the Estimator makes
    with RunConfig's, MonitoredTrainingSession's Scaffold with its own)."""
    from .basic_session_run_hooks import CheckpointSaverHook
    given = [h for h in hooks if isinstance(h, CheckpointSaverHook)]
    for hook in given:
        if hook._own_saver:
            hook._saver = checkpoint.Saver(hook._saver.model_dir, keep_checkpoint_max,
                                           keep_checkpoint_every_n_hours,
                                           background=async_checkpoint)
    return given


def _share_savers(hooks: List[SessionRunHook]) -> None:
    """CheckpointSaverHooks of one directory made without a `saver` save
    through one Saver, as TF's share the graph's: one list of checkpoints
    kept, one index (with a Saver each, each index listed its own saves and
    each kept its own newest five). The one: the first given its Saver (the
    session's own), else the first hook's."""
    from .basic_session_run_hooks import CheckpointSaverHook
    savers = [h for h in hooks if isinstance(h, CheckpointSaverHook)]
    shared = {}
    for hook in sorted(savers, key=lambda h: h._own_saver):
        shared.setdefault(os.path.realpath(hook._saver.model_dir), hook._saver)
    for hook in savers:
        if hook._own_saver:
            hook._saver = shared[os.path.realpath(hook._saver.model_dir)]


def nan_checks_first(hooks: Iterable[SessionRunHook]) -> list:
    """`hooks` in their order (TF's on the chief: checkpoint saver and
    chief-only hooks before the others) but every NanTensorHook first, so a
    diverged step is known before a save (TF would save it)."""
    from .basic_session_run_hooks import NanTensorHook
    hooks = list(hooks)
    return ([h for h in hooks if isinstance(h, NanTensorHook)]
            + [h for h in hooks if not isinstance(h, NanTensorHook)])


_USE_DEFAULT = object()


def MonitoredTrainingSession(master: str = "", is_chief: Optional[bool] = None,
                             checkpoint_dir: Optional[str] = None, scaffold=None,
                             hooks: Iterable[SessionRunHook] = (),
                             chief_only_hooks: Iterable[SessionRunHook] = (),
                             save_checkpoint_secs=_USE_DEFAULT,
                             save_summaries_steps=_USE_DEFAULT,
                             save_summaries_secs=_USE_DEFAULT, config=None,
                             stop_grace_period_secs=120, log_step_count_steps=100,
                             max_wait_secs=7200, save_checkpoint_steps=_USE_DEFAULT,
                             summary_dir=None,
                             save_graph_def=True, keep_checkpoint_max=5,
                             strategy=None) -> MonitoredSession:
    """A training MonitoredSession for a custom loop
    (tf.compat.v1.train.MonitoredTrainingSession).

    Restores the latest checkpoint of `checkpoint_dir` (modules and optimizers
    are restored as the loop creates them with `est.get_module` /
    `est.get_optimizer`), and on the chief saves checkpoints every
    `save_checkpoint_secs` or `save_checkpoint_steps` and the summaries every
    `save_summaries_steps` or `save_summaries_secs`, by TF's rules: neither
    given, 600 seconds and 100 steps; one given, the other off; None, off. `strategy`
    defaults to the current one; `is_chief` to its `should_checkpoint`.
    TF's arguments in TF's order; `master`, `config`,
    `stop_grace_period_secs`, `max_wait_secs` and `save_graph_def` do nothing
    here (no graph, no session to create or wait for): setting one logs a
    warning; a `scaffold` with a part set is refused (`hooks.scaffold`).
    `keep_checkpoint_max` and `strategy` are this project's.
    """
    check_scaffold(scaffold, "MonitoredTrainingSession")
    ignored = [name for name, value, default in (
        ("master", master, ""), ("config", config, None),
        ("stop_grace_period_secs", stop_grace_period_secs, 120),
        ("max_wait_secs", max_wait_secs, 7200), ("save_graph_def", save_graph_def, True))
        if value != default]
    if ignored:
        logger.warning("MonitoredTrainingSession: %s ignored (TF arguments with no meaning "
                       "here: there is no graph or tf.Session)", ", ".join(ignored))
    save_summaries_steps, save_summaries_secs = _either(save_summaries_steps,
                                                        save_summaries_secs, 100, None)
    save_checkpoint_steps, save_checkpoint_secs = _either(save_checkpoint_steps,
                                                          save_checkpoint_secs, None, 600)
    strategy = strategy or distribute.get_strategy()
    if is_chief is None:
        is_chief = strategy.extended.should_checkpoint
    # the chief trains into checkpoint_dir alone (hooks.training_lock),
    # from before it restores until the session ends
    lock = TrainingLock(checkpoint_dir) if is_chief and checkpoint_dir else None
    latest, state = checkpoint.restore_latest(checkpoint_dir)
    if latest:
        logger.info("Restoring from %s", latest)
        checkpoint.restore_rng(state["rng"])
    scope = model_scope.ModelScope(ModeKeys.TRAIN, strategy, restore=state, restore_path=latest)
    _saving_with(list(chief_only_hooks) + list(hooks), keep_checkpoint_max, 10000.0, False)
    # TF's order on the chief: chief-only hooks, its own, then `hooks` (so a
    # hook's `end` sees the final checkpoint)
    all_hooks = (list(chief_only_hooks) if is_chief else []) + training_hooks(
        checkpoint_dir, is_chief, save_checkpoint_secs=save_checkpoint_secs,
        save_checkpoint_steps=save_checkpoint_steps, save_summaries_steps=save_summaries_steps,
        save_summaries_secs=save_summaries_secs, log_step_count_steps=log_step_count_steps,
        keep_checkpoint_max=keep_checkpoint_max, summary_dir=summary_dir) + list(hooks)
    session = MonitoredSession(scope, nan_checks_first(all_hooks), checkpoint_dir, is_chief)
    session._lock = lock
    return session


def _not_a_step(what) -> str:
    return (f"MonitoredSession.run takes a step function, which computes the loss and "
            f"updates the model (TF1's sess.run(train_op) is sess.run(step_fn, batch)), "
            f"got a {type(what).__module__}.{type(what).__qualname__}: e.g. "
            f"`def step_fn(batch): loss = ...; "
            f"optimizer.zero_grad(); loss.backward(); optimizer.step(); return loss`")


def _either(steps, secs, default_steps, default_secs) -> tuple:
    """TF's USE_DEFAULT rule for a (steps, secs) pair: neither given, the
    defaults; one given, the other None."""
    if steps is _USE_DEFAULT and secs is _USE_DEFAULT:
        return default_steps, default_secs
    return (None if steps is _USE_DEFAULT else steps), (None if secs is _USE_DEFAULT else secs)


def _merge_feeds(feeds: Optional[dict], feed_dict: dict) -> dict:
    """The step's feeds, merged over hooks; a name fed twice is an error (as TF)."""
    if feeds is None:
        return dict(feed_dict)
    twice = sorted(set(feeds) & set(feed_dict))
    if twice:
        raise RuntimeError(f"Same tensor is fed by two hooks: {twice}")
    feeds.update(feed_dict)
    return feeds


def _names(fetches) -> List[str]:
    if isinstance(fetches, str):
        return [fetches]
    if isinstance(fetches, dict):
        return [n for v in fetches.values() for n in _names(v)]
    if isinstance(fetches, (list, tuple)):
        return [n for v in fetches for n in _names(v)]
    hint = ("; a model_fn's tensor is a new object every step (TF's graph tensor is one "
            "for the session): name it in the model_fn with est.named_tensor(name, tensor) "
            "and fetch the name" if isinstance(fetches, torch.Tensor) else
            "; est.get_global_step() is the step's number, not TF's tensor: fetch the name "
            "'global_step'" if isinstance(fetches, int) and not isinstance(fetches, bool)
            else "")
    raise TypeError(f"SessionRunArgs fetches must be names (str), lists or dicts of "
                    f"names, got {fetches!r}{hint}")


def _structure(fetches, host):
    if isinstance(fetches, str):
        return host[fetches]
    if isinstance(fetches, dict):
        return {k: _structure(v, host) for k, v in fetches.items()}
    values = (_structure(v, host) for v in fetches)
    return type(fetches)(*values) if hasattr(fetches, "_fields") else type(fetches)(values)


def _schedulable(hook: SessionRunHook) -> bool:
    """Whether `hook` may be skipped on the steps its `_idle` says it does
    nothing: only where its before_run and after_run are those of the class
    that defines `_idle` (or of its bases), not a subclass's, a mixin's or
    the instance's own (a user's StopAtStepHook that also stops on the loss),
    which TF calls on every step like any hook."""
    mro = type(hook).__mro__
    owner = next(c for c in mro if "_idle" in vars(c))
    if owner is SessionRunHook:
        return False
    for method in ("before_run", "after_run"):
        definer = next(c for c in mro if method in vars(c))
        if method in getattr(hook, "__dict__", ()) or not issubclass(owner, definer):
            return False
    return True
