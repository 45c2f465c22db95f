"""Evaluation during training without a checkpoint
(tf.estimator.experimental.InMemoryEvaluatorHook).

    evaluator = est.experimental.InMemoryEvaluatorHook(estimator, eval_input_fn,
                                                       every_n_iter=100)
    estimator.train(train_input_fn, hooks=[evaluator])

As in TF: one evaluation when the session starts (the model before its first
update; batch-norm statistics have seen the first batch, as the first batch's
forward pass ran before the session), one every `every_n_iter` iterations of
this `train` call, and one at the end; each evaluates the training's current
weights (no checkpoint is written or read), logs its results and writes them
to `estimator.eval_dir(name)` at the training's global step. Training goes on
as if it had not evaluated: its modules stay in train mode and its random
state is unchanged. When training is preempted (SIGTERM/SIGINT) the final
evaluation is skipped, so the preemption checkpoint is not delayed by it.
Single machine only (TF's rule: no ps, one worker); under
a local MirroredStrategy every replica evaluates its share of the input and the
metrics are reduced over the replicas, as `evaluate` does.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

from hooks.session_run_hook import SessionRunHook, check_hooks

from . import _checks

logger = logging.getLogger(__name__)


class InMemoryEvaluatorHook(SessionRunHook):
    """Runs `estimator`'s evaluation on `input_fn` (`steps`, `hooks`, `name`
    as in `Estimator.evaluate`) every `every_n_iter` training iterations."""

    def __init__(self, estimator, input_fn: Callable, steps: Optional[int] = None,
                 hooks=None, name: Optional[str] = None, every_n_iter: int = 100):
        if not _checks.is_int(every_n_iter) or every_n_iter <= 0:
            raise ValueError(f"invalid every_n_iter={every_n_iter!r}.")
        config = estimator.config
        if config.num_ps_replicas > 0 or config.num_worker_replicas > 1:
            raise ValueError("InMemoryEvaluator supports only single machine (aka Local) "
                             f"setting; the cluster has {config.num_ps_replicas} ps and "
                             f"{config.num_worker_replicas} workers.")
        if not callable(input_fn):
            raise TypeError(f"input_fn must be callable, got {type(input_fn).__name__}")
        self._estimator, self._input_fn, self._name = estimator, input_fn, name
        self._steps = _checks.steps(steps, "steps")
        self._hooks = check_hooks(hooks)
        self._every_n_iter = every_n_iter
        self._iter_count = 0

    def begin(self):
        self._iter_count = 0

    def after_create_session(self, session, coord):
        self._evaluate(session)

    def after_run(self, run_context, run_values):
        self._iter_count += 1
        if self._iter_count % self._every_n_iter == 0:
            self._evaluate(run_context.session)

    def end(self, session):
        if session.preempted:   # the preemption checkpoint waits for the hooks' end
            logger.warning("Skipping the final in-memory evaluation: training was preempted "
                           "(%s); the checkpoint is saved next", session.preempted)
            return
        self._evaluate(session)

    def _evaluate(self, session) -> None:
        self._estimator._evaluate_in_memory(session.scope, self._input_fn, self._steps,
                                            self._hooks, self._name)
