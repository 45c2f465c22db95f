"""Early stopping on evaluation metrics (tf.estimator.experimental's
early_stopping: make_early_stopping_hook, stop_if_higher_hook,
stop_if_lower_hook, stop_if_no_increase_hook, stop_if_no_decrease_hook,
read_eval_metrics).

As in TF, the metrics are read from the TensorBoard event files evaluation
writes into `estimator.eval_dir()` (scalar tags = metric names, at the
global step of the evaluated checkpoint), and only the chief decides. TF
tells the other workers through a shared variable; here the session's stop
agreement carries the chief's stop to the workers of a synchronous strategy
(they stop on the same step), while an asynchronous (parameter-server)
worker does not learn of it and stops by its own means (steps, input): a
known difference. Unlike TF, `run_every_secs` is allowed under
MultiWorkerMirroredStrategy, since the agreement does not need the workers
to check on the same steps.

    hook = hooks.stop_if_no_decrease_hook(estimator, "loss", 1000)
    est.train_and_evaluate(estimator, est.TrainSpec(input_fn, hooks=[hook]), eval_spec)
"""
from __future__ import annotations

import collections
import difflib
import logging
import numbers
import operator
import os
from typing import Callable, Dict, Optional


from .basic_session_run_hooks import SecondOrStepTimer
from .event_files import EVENT_FILE_PATTERN, read_scalars
from .session_run_hook import NEVER, SessionRunHook

logger = logging.getLogger(__name__)



def make_early_stopping_hook(estimator, should_stop_fn: Callable[[], bool],
                             run_every_secs: Optional[float] = 60,
                             run_every_steps: Optional[int] = None) -> SessionRunHook:
    """A hook that stops training when `should_stop_fn()` returns True, called
    every `run_every_secs` seconds or `run_every_steps` steps on the chief
    (tf.estimator.experimental.make_early_stopping_hook)."""
    _check_estimator(estimator)
    if run_every_secs is not None and run_every_steps is not None:
        raise ValueError("Only one of `run_every_secs` and `run_every_steps` must be set "
                         f"(got {run_every_secs} and {run_every_steps}; run_every_secs "
                         "defaults to 60: pass run_every_secs=None with run_every_steps).")
    if run_every_secs is None and run_every_steps is None:
        raise ValueError("One of `run_every_secs` and `run_every_steps` must be set.")
    if not callable(should_stop_fn):
        raise TypeError("`should_stop_fn` must be callable.")
    return _StopOnPredicateHook(should_stop_fn, run_every_secs, run_every_steps,
                                is_chief=bool(estimator.config.is_chief))


def stop_if_higher_hook(estimator, metric_name: str, threshold, eval_dir: Optional[str] = None,
                        min_steps: int = 0, run_every_secs: Optional[float] = 60,
                        run_every_steps: Optional[int] = None) -> SessionRunHook:
    """Stops training once `metric_name` is higher than `threshold` in an
    evaluation at a global step >= `min_steps`
    (tf.estimator.experimental.stop_if_higher_hook)."""
    return _stop_if_threshold_crossed_hook(estimator, metric_name, threshold, True, eval_dir,
                                           min_steps, run_every_secs, run_every_steps)


def stop_if_lower_hook(estimator, metric_name: str, threshold, eval_dir: Optional[str] = None,
                       min_steps: int = 0, run_every_secs: Optional[float] = 60,
                       run_every_steps: Optional[int] = None) -> SessionRunHook:
    """Stops training once `metric_name` is lower than `threshold`
    (tf.estimator.experimental.stop_if_lower_hook)."""
    return _stop_if_threshold_crossed_hook(estimator, metric_name, threshold, False, eval_dir,
                                           min_steps, run_every_secs, run_every_steps)


def stop_if_no_increase_hook(estimator, metric_name: str, max_steps_without_increase: int,
                             eval_dir: Optional[str] = None, min_steps: int = 0,
                             run_every_secs: Optional[float] = 60,
                             run_every_steps: Optional[int] = None) -> SessionRunHook:
    """Stops training once `metric_name` has not increased for
    `max_steps_without_increase` global steps of evaluations
    (tf.estimator.experimental.stop_if_no_increase_hook)."""
    return _stop_if_no_metric_improvement_hook(
        estimator, metric_name, max_steps_without_increase, True, eval_dir, min_steps,
        run_every_secs, run_every_steps, "max_steps_without_increase")


def stop_if_no_decrease_hook(estimator, metric_name: str, max_steps_without_decrease: int,
                             eval_dir: Optional[str] = None, min_steps: int = 0,
                             run_every_secs: Optional[float] = 60,
                             run_every_steps: Optional[int] = None) -> SessionRunHook:
    """Stops training once `metric_name` has not decreased for
    `max_steps_without_decrease` global steps of evaluations
    (tf.estimator.experimental.stop_if_no_decrease_hook)."""
    return _stop_if_no_metric_improvement_hook(
        estimator, metric_name, max_steps_without_decrease, False, eval_dir, min_steps,
        run_every_secs, run_every_steps, "max_steps_without_decrease")


def read_eval_metrics(eval_dir: str) -> "collections.OrderedDict[int, Dict[str, float]]":
    """{global step: {metric name: value}} from the event files in `eval_dir`,
    by step (tf.estimator.experimental.read_eval_metrics); a missing
    directory reads as empty (see `hooks.event_files.read_scalars`)."""
    return read_scalars(os.path.join(eval_dir, EVENT_FILE_PATTERN))


# -- the predicates --------------------------------------------------------------
def _check_estimator(estimator) -> None:
    """What the predicates need of an Estimator: its evaluation directory
    (`eval_dir()`) and `model_dir`; the class itself lives a layer up."""
    if not (callable(getattr(estimator, "eval_dir", None))
            and isinstance(getattr(estimator, "model_dir", None), str)):
        raise TypeError("`estimator` must have type `estimator.Estimator`. "
                        "Got: {}".format(type(estimator)))


def _check_common(what: str, estimator, metric_name, min_steps) -> None:
    _check_estimator(estimator)
    if not isinstance(metric_name, str) or not metric_name:
        raise TypeError(f"{what}: metric_name must be a non-empty string, got {metric_name!r}")
    if not isinstance(min_steps, numbers.Integral) or isinstance(min_steps, bool) or min_steps < 0:
        raise ValueError(f"{what}: min_steps must be an int >= 0, got {min_steps!r}")


def _metric(metrics: dict, metric_name: str, step: int, eval_dir: str):
    if metric_name not in metrics:
        close = difflib.get_close_matches(metric_name, list(metrics), n=1)
        raise KeyError(f"Early stopping: metric {metric_name!r} is not in the evaluation at "
                       f"global step {step} in {eval_dir}; it has {sorted(metrics)}"
                       + (f": did you mean {close[0]!r}?" if close else ""))
    return metrics[metric_name]


def _stop_if_threshold_crossed_hook(estimator, metric_name, threshold, higher_is_better,
                                    eval_dir, min_steps, run_every_secs, run_every_steps):
    what = "stop_if_higher_hook" if higher_is_better else "stop_if_lower_hook"
    _check_common(what, estimator, metric_name, min_steps)
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise TypeError(f"{what}: threshold must be a number, got {threshold!r}")
    if eval_dir is None:
        eval_dir = estimator.eval_dir()
    is_lhs_better = operator.gt if higher_is_better else operator.lt
    greater_or_lesser = "greater than" if higher_is_better else "less than"

    def stop_if_threshold_crossed_fn():
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            val = _metric(metrics, metric_name, step, eval_dir)
            if is_lhs_better(val, threshold):
                logger.info('At step %s, metric "%s" has value %s which is %s the configured '
                            "threshold (%s) for early stopping.", step, metric_name, val,
                            greater_or_lesser, threshold)
                return True
        return False

    return make_early_stopping_hook(estimator, stop_if_threshold_crossed_fn,
                                    run_every_secs, run_every_steps)


def _stop_if_no_metric_improvement_hook(estimator, metric_name, max_steps_without_improvement,
                                        higher_is_better, eval_dir, min_steps, run_every_secs,
                                        run_every_steps, arg_name):
    what = "stop_if_no_increase_hook" if higher_is_better else "stop_if_no_decrease_hook"
    _check_common(what, estimator, metric_name, min_steps)
    if not isinstance(max_steps_without_improvement, numbers.Integral) or \
            isinstance(max_steps_without_improvement, bool) or max_steps_without_improvement <= 0:
        raise ValueError(f"{what}: {arg_name} must be an int > 0, got "
                         f"{max_steps_without_improvement!r}")
    if eval_dir is None:
        eval_dir = estimator.eval_dir()
    is_lhs_better = operator.gt if higher_is_better else operator.lt
    increase_or_decrease = "increase" if higher_is_better else "decrease"

    def stop_if_no_metric_improvement_fn():
        best_val = best_val_step = None
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            val = _metric(metrics, metric_name, step, eval_dir)
            if best_val is None or is_lhs_better(val, best_val):
                best_val, best_val_step = val, step
            if step - best_val_step >= max_steps_without_improvement:
                logger.info('No %s in metric "%s" for %s steps, which is greater than or equal '
                            "to max steps (%s) configured for early stopping.",
                            increase_or_decrease, metric_name, step - best_val_step,
                            max_steps_without_improvement)
                return True
        return False

    return make_early_stopping_hook(estimator, stop_if_no_metric_improvement_fn,
                                    run_every_secs, run_every_steps)


class _StopOnPredicateHook(SessionRunHook):
    """Requests a stop when `should_stop_fn()` is True (TF's
    _StopOnPredicateHook). Only the chief calls `should_stop_fn`; on other
    workers it does nothing (the session's stop agreement stands in for TF's
    _CheckForStoppingHook)."""

    def __init__(self, should_stop_fn, run_every_secs=60, run_every_steps=None,
                 is_chief=True):
        self._should_stop_fn = should_stop_fn
        self._timer = SecondOrStepTimer(every_secs=run_every_secs, every_steps=run_every_steps)
        self._is_chief = is_chief

    def begin(self):
        self._timer.reset()

    @property
    def should_stop_fn(self):
        """The predicate (read by train_and_evaluate's evaluator, which decides
        for the trainers of a cluster)."""
        return self._should_stop_fn

    def after_run(self, run_context, run_values):
        session = run_context.session
        global_step = session.global_step
        if not (self._is_chief and session.is_chief) or \
                not self._timer.should_trigger_for_step(global_step):
            return
        self._timer.update_last_triggered_step(global_step)
        if self._should_stop_fn():
            logger.info("Requesting early stopping at global step %d", global_step)
            run_context.request_stop()

    def _idle(self, session):
        if not (self._is_chief and session.is_chief):
            return NEVER, NEVER, NEVER
        return self._timer._idle()
