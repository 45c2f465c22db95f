"""Estimator: train, evaluate and predict a model_fn (tf.estimator.Estimator).

The data flows one way: input_fn batches -> the strategy moves them to the
device -> model_fn builds/uses modules in the model scope -> the strategy
applies gradients -> the session loop runs the hooks.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import pickle
import random
import tempfile
from typing import Callable, Iterable, Optional

import numpy as np
import torch

import distribute
from distribute.launcher import in_replica_process
from distribute.host_arrays import to_numpy, to_numpy_value
import hooks as hooks_lib
from hooks.monitored_session import nan_checks_first, training_hooks
from hooks.preemption import TrainingPreempted
from hooks.session_run_hook import NEVER, SessionRunHook, check_hooks
from hooks.progress import progress_hooks
from hooks.summary_hooks import write_dict_to_summary
from hooks.training_lock import TrainingLock

from hooks import model_scope, tf_checkpoint

from . import _checks, _console, _inputs, checkpoint, host_transform, metrics
from ._eval_metric_ops import EvalMetricOps
from hooks.mode_keys import ModeKeys
from ._dropout_check import DropoutWatch
from .model_fn import EstimatorSpec, describe, model_fn_caller
from .run_config import RunConfig, async_checkpoint, writes_checkpoints
from .warm_start import _settings, _WarmStarter

logger = logging.getLogger(__name__)


def _saved_past(latest: Optional[str], max_steps: int) -> bool:
    """Whether `latest` is a checkpoint at `max_steps` or past it, and loads:
    a damaged one is passed over by the restore (with a warning), training
    then going on from the one before it (it was skipped: the run said done,
    its model 10 steps short)."""
    if not latest or checkpoint.step_of(latest) < max_steps:
        return False
    if not os.path.isfile(latest):   # (a TF checkpoint's prefix: not one of ours to check)
        return True
    try:
        checkpoint.load(latest)
    except (OSError, ValueError):   # (as restore_latest: it says what it found)
        return False
    return True


class Estimator:
    """Trains, evaluates and predicts with a `model_fn` (tf.estimator.Estimator).

        est = Estimator(model_fn, model_dir="runs/iris", params={"lr": 0.1})
        est.train(train_input_fn, max_steps=1000)
        print(est.evaluate(eval_input_fn))
        for p in est.predict(predict_input_fn): ...
    """

    def __init__(self, model_fn: Callable, model_dir: Optional[str] = None,
                 config: Optional[RunConfig] = None, params: Optional[dict] = None,
                 warm_start_from=None):
        _console.use_console_by_default()
        if model_dir is not None:
            model_dir = os.fspath(model_dir)   # a pathlib.Path, as TF takes it
        if config is None:
            config = RunConfig()
        elif not isinstance(config, RunConfig):
            raise TypeError(f"config must be a RunConfig, got {type(config).__name__}")
        if model_dir and config.model_dir and os.path.abspath(model_dir) != os.path.abspath(
                config.model_dir):
            raise ValueError(f"`model_dir` are set both in constructor and `RunConfig`, but "
                             f"with different values. In constructor: '{model_dir}', in "
                             f"`RunConfig`: '{config.model_dir}'.")
        model_dir = model_dir or config.model_dir
        if model_dir and os.path.exists(model_dir) and not os.path.isdir(model_dir):
            raise ValueError(f"model_dir {model_dir!r} is a file, not a directory: give the "
                             "directory the checkpoints and summaries go to")
        cluster = config.cluster_spec
        tasks = sum(cluster.num_tasks(job) for job in cluster.jobs) if cluster else 0
        # (TF's tasks each take a temp dir of their own: the job hangs)
        if not model_dir and (tasks > 1 or config.task_type == "evaluator"):
            what = (f"TF_CONFIG's cluster has {tasks} tasks ({', '.join(cluster.jobs)})"
                    if tasks > 1 else "this task is TF_CONFIG's evaluator")
            raise ValueError(
                f"model_dir: none given, and {what}: the tasks share checkpoints through one "
                f"model_dir; each would write its own temporary directory, and the chief's "
                f"checkpoints would never reach the others. Give every task the same "
                f"model_dir (a path they all see)")
        if not model_dir:
            model_dir = tempfile.mkdtemp(prefix="estimator-")
            logger.warning("Using temporary folder as model directory: %s", model_dir)
        self._config = config.replace(model_dir=model_dir)
        if config.num_ps_replicas and config.train_distribute is None:
            # TF1's between-graph replication: a cluster with ps tasks and no
            # strategy trains the parameter-server way (replica_device_setter).
            self._config = self._config.replace(
                train_distribute=distribute.ParameterServerStrategy())
            logger.info("TF_CONFIG has %d ps task(s) and no train_distribute: training with "
                        "ParameterServerStrategy", config.num_ps_replicas)
        self._model_dir = model_dir
        self._params = copy.deepcopy(params or {})
        self._model_fn = model_fn
        self._call_model_fn = model_fn_caller(model_fn, None if params is None else self._params,
                                              self._config)
        self._warm_start_settings = _settings(warm_start_from)
        logger.info("Using config: %s", self._config)

    # -- properties --------------------------------------------------------------
    @property
    def model_dir(self) -> str:
        return self._model_dir

    @property
    def config(self) -> RunConfig:
        return self._config

    @property
    def params(self) -> dict:
        return copy.deepcopy(self._params)

    @property
    def model_fn(self) -> Callable:
        return self._model_fn

    # -- checkpoints -------------------------------------------------------------
    def latest_checkpoint(self) -> Optional[str]:
        """The newest checkpoint in `model_dir`, or None."""
        return checkpoint.latest_checkpoint(self._model_dir)

    def get_variable_names(self):
        """Names of every variable in the latest checkpoint (`net/0/weight`, ...)."""
        return [name for name, _ in checkpoint.list_variables(self._require_checkpoint())]

    def get_variable_value(self, name: str):
        """The value of variable `name` in the latest checkpoint (numpy; a
        scalar as a numpy scalar, as TF's)."""
        return checkpoint.load_variable(self._require_checkpoint(), name)

    def _require_checkpoint(self) -> str:
        latest = self.latest_checkpoint()
        if latest is None:
            raise ValueError(f"Could not find a trained model in model_dir {self._model_dir!r} "
                             "to read: train first")
        return latest

    # -- train ---------------------------------------------------------------------
    def train(self, input_fn: Callable, hooks: Optional[Iterable] = None,
              steps: Optional[int] = None, max_steps: Optional[int] = None,
              saving_listeners: Optional[Iterable] = None) -> "Estimator":
        """Train until `steps` more steps, global step `max_steps`, or the end
        of the input, whichever comes first (tf.estimator.Estimator.train)."""
        if steps is not None and max_steps is not None:
            raise ValueError("Can not provide both steps and max_steps.")
        steps, max_steps = _checks.steps(steps, "steps"), _checks.steps(max_steps, "max_steps")
        if max_steps is not None and _saved_past(self.latest_checkpoint(), max_steps):
            logger.info("Skipping training since max_steps has already saved.")
            return self
        strategy = self._config.train_distribute or distribute.get_strategy()
        user_hooks = check_hooks(hooks)
        listeners = list(saving_listeners or ())
        _run(strategy, self._train, user_hooks + listeners,
             strategy, input_fn, user_hooks, steps, max_steps, listeners)
        return self

    def _train(self, strategy, *args):
        """The body of `train`, in this process or on each replica; the chief
        holds its model_dir's training lock (hooks.training_lock) from before
        it restores until its last save."""
        # tf_random_seed seeds the training's own stream (as TF's graph seed):
        # the caller's generators are put back after (a random search drawing
        # between train calls drew the same values each time).
        with (checkpoint.rng_preserved() if self._config.tf_random_seed is not None
              else contextlib.nullcontext()), \
                (TrainingLock(self._model_dir) if self._is_chief(strategy)
                 else contextlib.nullcontext()), _failures_told(strategy):
            outcome = self._train_held(strategy, *args)
        _ended_at[os.path.abspath(self._model_dir)] = (
            os.getpid(), checkpoint.latest_checkpoint(self._model_dir))
        return outcome

    def _train_held(self, strategy, input_fn, user_hooks, steps, max_steps, listeners):
        scope, warm = self._training_scope(strategy)
        if warm is None and max_steps is not None and scope.global_step >= max_steps and \
                strategy.num_replicas_in_sync == 1:   # saved while this one waited for the lock
            logger.info("Skipping training since max_steps has already saved.")
            return _outcome(None, user_hooks + listeners)
        scope.loss_summary = True   # TF's Estimator records its loss as the summary `loss`
        stop = [hooks_lib.StopAtStepHook(num_steps=steps, last_step=max_steps)] \
            if steps is not None or max_steps is not None else []
        # The input closed on the way out, an error's too: its read-ahead thread
        # and DataLoader workers end now, not when a kept traceback is freed.
        with scope, strategy.scope(), contextlib.closing(
                self._batches(input_fn, ModeKeys.TRAIN, strategy)) as batches:
            call = strategy.extended.in_replica_context(self._call_model_fn, ModeKeys.TRAIN)
            first = self._first_spec(batches, scope, ModeKeys.TRAIN, strategy, call)
            if first is None:
                logger.warning("input_fn returned no data: nothing to train on")
                return _outcome(None, user_hooks + listeners)
            if warm is not None:   # the model is built: TF's check of the settings
                warm.check_used()
            first = first[0]
            _check_parameters_in_scope(first.loss, scope)
            if isinstance(first.train_op, torch.optim.Optimizer) and not first.loss.requires_grad:
                raise ValueError(
                    "EstimatorSpec(mode='train'): the loss has no gradient, so the optimizer "
                    "cannot train: it was detached (.detach(), .item(), computed under "
                    "torch.no_grad) or uses no module of est.get_module")
            is_chief = self._is_chief(strategy)
            defaults = self._default_training_hooks(
                is_chief, listeners,
                user_hooks + list(first.training_hooks) + list(first.training_chief_hooks))
            savers = [h for h in defaults if isinstance(h, hooks_lib.CheckpointSaverHook)]
            # TF's MonitoredTrainingSession order on the chief: the saver and
            # chief-only hooks first, so a step's checkpoint (and a listener's
            # evaluation of it) is there when the user's hooks see the step
            all_hooks = nan_checks_first(
                savers + (list(first.training_chief_hooks) if is_chief else [])
                + [h for h in defaults if h not in savers] + user_hooks + stop
                + self._default_worker_hooks() + list(first.training_hooks)
                + progress_hooks("train", num_steps=steps, last_step=max_steps))
            step = self._train_step_fn(batches, strategy, scope, call)
            last, start = first, scope.global_step
            with hooks_lib.MonitoredSession(scope, all_hooks, self._model_dir,
                                            is_chief) as session:
                if not session.should_stop():
                    session.run(step, first)
                while not session.should_stop():
                    last = session.run(step) or last
            strategy.extended.end_training()   # replicas return once the chief has saved
            logger.info("Loss for final step: %s.",
                        _as_tf_prints(_python(scope.reported_loss(last.loss))))
            target = max_steps if max_steps is not None else (
                start + steps if steps is not None else None)
            if session.preempted and target is not None and scope.global_step >= target:
                logger.warning("%s received as training ended at global step %d: its last "
                               "step, checkpoint and listeners done, training is complete",
                               session.preempted, scope.global_step)
            elif session.preempted:   # saved at the agreed step: exit for a restart
                preempted = TrainingPreempted(scope.global_step, session.preempted,
                                              strategy.extended.preemption_rejoins)
                logger.warning("%s", preempted)
                raise preempted
        return _outcome(None, user_hooks + listeners)

    def _training_scope(self, strategy) -> tuple:
        """(scope, warm starter or None): resume from the newest good
        checkpoint (falling back past a damaged one), else start fresh:
        seeded, warm-started."""
        latest, state = checkpoint.restore_latest(self._model_dir)
        if latest is not None:
            if strategy.extended.uses_parameter_servers and not self._is_chief(strategy):
                logger.info("Found %s in model_dir %s; the ps tasks' values and global step, "
                            "as they are now, take its place", latest, self._model_dir)
            else:
                logger.info("Resuming from %s (model_dir %s)", latest, self._model_dir)
            # The checkpoint's random state where another process wrote it (a
            # restart) or the training's stream is its own (tf_random_seed);
            # where unseeded training in this process ended there, the
            # process's stream goes on as it is: put back, it rewound the
            # caller's draws since (a np.random.permutation between two train
            # calls came out the same each time).
            if self._config.tf_random_seed is not None or \
                    _ended_at.get(os.path.abspath(self._model_dir)) != (os.getpid(), latest):
                checkpoint.restore_rng(state["rng"])
            return model_scope.ModelScope(ModeKeys.TRAIN, strategy, restore=state,
                                          restore_path=latest), None
        self._check_not_tf_model_dir(self._model_dir, "training here does not resume from (it "
                                     "would start from step 0 and overwrite the directory's "
                                     "checkpoint index)")
        _seed(self._config.tf_random_seed)
        return self._initial_scope(ModeKeys.TRAIN, strategy)

    @staticmethod
    def _check_not_tf_model_dir(directory: Optional[str], why: str) -> None:
        tf_prefix = tf_checkpoint.find_prefix(directory) if directory else None
        if tf_prefix is not None:
            raise ValueError(
                f"model_dir {directory} holds TensorFlow's checkpoint "
                f"{os.path.basename(tf_prefix)}, which {why}. To start from its variables "
                f"give warm_start_from={tf_prefix!r} (they load by TF's names) and a new "
                "model_dir")

    def _checkpoint_to_read(self, checkpoint_path: Optional[str], what: str) -> tuple:
        """(path, contents) of the checkpoint to `what`: `checkpoint_path` (a
        file, or a directory's newest good checkpoint), else model_dir's newest
        good one; past a damaged one with a warning naming it (as training
        resumes). (None, None) when model_dir has none; an error when a
        directory holds only damaged ones, a DataLossError for a damaged file
        named. An empty checkpoint_path is none, as in TF."""
        checkpoint_path = checkpoint_path or None
        if checkpoint_path is not None and not os.path.isdir(checkpoint_path):
            path = checkpoint.resolve(checkpoint_path)
            return path, checkpoint.load(path)
        directory = self._model_dir if checkpoint_path is None else checkpoint_path
        if checkpoint.latest_checkpoint(directory) is None:
            if checkpoint_path is not None:
                raise ValueError(f"No checkpoint found in directory {checkpoint_path!r}")
            return None, None
        path, state = checkpoint.restore_latest(directory, none_left=f"nothing to {what}")
        if path is None:
            self._check_not_tf_model_dir(directory, f"{what} does not read")
            raise ValueError(f"No good checkpoint in "
                             f"{'model_dir ' if checkpoint_path is None else ''}{directory!r} "
                             f"to {what}: each is damaged (the warnings above name them); train "
                             "again, or pass checkpoint_path")
        return path, state

    def _initial_scope(self, mode: str, strategy) -> tuple:
        """(scope, warm starter or None) of the model before any training, as
        TF builds it with no checkpoint in model_dir: warm-started by
        `warm_start_from` (in training, and as TF's _maybe_warm_start in
        evaluate, predict and export), initial values elsewhere."""
        warm = _WarmStarter(self._warm_start_settings) if self._warm_start_settings else None
        scope = model_scope.ModelScope(mode, strategy, warm_start=warm)
        step = warm.global_step() if warm is not None else None
        if step is not None:
            scope.global_step = step
        return scope, warm

    def _train_step_fn(self, batches, strategy, scope, call) -> Callable:
        """The per-step function: next batch -> model_fn -> apply train_op.
        `step(spec)` applies a spec already built (the first batch's). After
        a callable train_op the gradients of the scope's optimizers that
        stepped are freed: each step's are its own, as in TF, whose
        apply_gradients leaves nothing to zero (a train_op that does not zero
        them would otherwise add them up across steps); an optimizer that did
        not step keeps them (PyTorch's gradient accumulation over calls),
        unless a grad scaler skipped its step (they are not finite). A call
        in which grad scalers skipped every step they were asked to make is
        not counted in the global step (TF's skipped loss-scaled update)."""
        extended, train = strategy.extended, ModeKeys.TRAIN
        apply_gradients, run_train_op = extended.apply_gradients, extended.run_train_op
        optimizer, optimizers = torch.optim.Optimizer, scope.optimizers
        checked = [None]   # the optimizer last found to be the scope's
        watched, stepped = {}, set()   # ids of the optimizers hooked / stepped in the call
        counts_own_steps = not extended.uses_parameter_servers

        def note_step(opt, args, kwargs):
            stepped.add(id(opt))

        def step(spec=None):
            if spec is None:
                features, labels = next(batches)
                spec = call(features, labels, train)
                if type(spec) is not EstimatorSpec or spec.mode != train:
                    _check_spec(spec, train, self._model_fn)
            train_op = spec.train_op
            if isinstance(train_op, optimizer):
                if train_op is not checked[0]:
                    _check_scope_optimizer(train_op, optimizers)
                    _check_no_grad_scaler(scope)
                    checked[0] = train_op
                apply_gradients(spec.loss, train_op)
                return spec
            if len(watched) != len(optimizers):
                for opt in optimizers.values():
                    if id(opt) not in watched:
                        watched[id(opt)] = opt.register_step_post_hook(note_step)
            stepped.clear()
            scope.scaler_stepped = False
            run_train_op(train_op, spec.loss)
            if scope.scaler_skipped:   # (a loss scale found the gradients not finite)
                stepped.update(scope.scaler_skipped)
                scope.scaler_skipped.clear()
                if not scope.scaler_stepped and counts_own_steps:
                    scope.step_uncounted = True   # (the session leaves the global step)
            for opt in optimizers.values():
                if id(opt) in stepped or id(opt) not in watched:   # (made in the train_op)
                    for group in opt.param_groups:
                        for p in group["params"]:
                            p.grad = None
            return spec
        return step

    def _default_worker_hooks(self) -> list:
        """TF's hooks on every worker (`_train_with_estimator_spec`): a
        NanTensorHook on the loss and, every `log_step_count_steps`, a
        LoggingTensorHook of loss and step. Unlike TF the NaN check runs only
        on those logging steps (every 100 steps without logging), where the
        loss is on the host anyway, so the steps between never wait on the
        device; add `hooks.NanTensorHook()` to check every step."""
        every_n = self._config.log_step_count_steps
        out = [hooks_lib.NanTensorHook("loss", every_n_iter=every_n or 100)]
        if every_n:
            out.append(hooks_lib.LoggingTensorHook({"loss": "loss", "step": "global_step"},
                                                   every_n_iter=every_n))
        return out

    def _default_training_hooks(self, is_chief: bool, listeners, given_hooks) -> list:
        """TF's defaults, from RunConfig (hooks.monitored_session.training_hooks);
        summaries where the strategy also says `should_save_summary`; no
        checkpoint saver when `given_hooks` (the user's, the EstimatorSpec's)
        hold one, which then takes the `listeners` (TF's Estimator)."""
        c = self._config
        strategy = c.train_distribute or distribute.get_strategy()
        return training_hooks(
            self._model_dir, is_chief, save_checkpoint_secs=c.save_checkpoints_secs,
            save_checkpoint_steps=c.save_checkpoints_steps,
            save_summaries_steps=c.save_summary_steps,
            log_step_count_steps=c.log_step_count_steps,
            keep_checkpoint_max=c.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=c.keep_checkpoint_every_n_hours, listeners=listeners,
            save_summaries=is_chief and strategy.extended.should_save_summary,
            async_checkpoint=async_checkpoint(c), given_hooks=given_hooks)

    def eval_dir(self, name: Optional[str] = None) -> str:
        """Where evaluation summaries go: `model_dir/eval` or `model_dir/eval_<name>`."""
        return os.path.join(self._model_dir, "eval" if not name else "eval_" + name)

    # -- evaluate -------------------------------------------------------------------
    def evaluate(self, input_fn: Callable, steps: Optional[int] = None,
                 hooks: Optional[Iterable] = None, checkpoint_path: Optional[str] = None,
                 name: Optional[str] = None) -> dict:
        """Evaluate a checkpoint (the latest by default) over `steps` batches or
        the whole input; returns `loss`, `global_step` and every metric."""
        steps = _checks.steps(steps, "steps")
        # (read here: a damaged checkpoint fails before any replica starts)
        path, state = self._checkpoint_to_read(checkpoint_path, "evaluate")
        return self._evaluate_checkpoint(input_fn, steps, hooks, name, path, state)

    def _evaluate_checkpoint(self, input_fn, steps, hooks, name, path, state) -> dict:
        """`evaluate` of the checkpoint at `path`, read (`state`), or of the
        initial model when `path` is None."""
        strategy = self._config.eval_distribute or distribute.get_strategy()
        if path is None:   # TF evaluates the initialization (seeded as training would start it)
            logger.warning("Could not find trained model in model_dir: %s, running "
                           "initialization to evaluate.", self._model_dir)
        user_hooks = check_hooks(hooks)
        return _run(strategy, self._evaluate, user_hooks,   # sharded over replicas: rank 0's
                    strategy, input_fn, steps, user_hooks, path, name, state)

    def _evaluate_in_memory(self, training: model_scope.ModelScope, input_fn, steps,
                            user_hooks, name) -> dict:
        """An evaluation of the training's current state, no checkpoint read
        (InMemoryEvaluatorHook); the training's random state is left as it was."""
        with checkpoint.rng_preserved():
            return self._evaluate(training.strategy, input_fn, steps, user_hooks, None, name,
                                  state=training.state())[0]

    def _evaluate(self, strategy, input_fn, steps, user_hooks, path, name, state=None):
        """The body of `evaluate`, in this process or on each replica; of
        `state` (the checkpoint at `path`'s, or a ModelScope's) when given, else of
        the initial model (seeded by `tf_random_seed` as training would seed
        it; the random state is left as it was)."""
        if path is None and state is None:
            with checkpoint.rng_preserved():
                _seed(self._config.tf_random_seed)
                return self._evaluate(strategy, input_fn, steps, user_hooks, path, name,
                                      state={})
        if path is None and not state:   # the initial model, warm-started if asked
            scope, warm = self._initial_scope(ModeKeys.EVAL, strategy)
            what = "the initial model" + (f" warm-started from {warm.path}" if warm else "")
        else:
            scope = model_scope.ModelScope(ModeKeys.EVAL, strategy, restore=state,
                                           restore_path=path or "the training's state")
            what = path or f"the training's state at global step {scope.global_step}"
        logger.info("Starting evaluation of %s", what)
        with _failures_told(strategy), scope, strategy.scope(), torch.no_grad(), \
                contextlib.closing(self._batches(input_fn, ModeKeys.EVAL, strategy)) as batches:
            call = strategy.extended.in_replica_context(self._call_model_fn, ModeKeys.EVAL)
            first = self._first_spec(batches, scope, ModeKeys.EVAL, strategy, call)
            if first is None:
                raise ValueError(
                    "The evaluation input_fn gave no batch (an iterator or generator an "
                    "earlier evaluation consumed? input_fn must return a new one at each "
                    "call). TF reports every metric at 0 over no batch, a result exporters "
                    "and early stopping would act on: evaluate refuses it instead")
            mode, pending = ModeKeys.EVAL, [first]
            first = first[0]
            # (a replica whose shard had no batch: model_fn ran on an empty
            # one for the metrics, which it declares without a step)
            nothing = strategy.extended.evaluates_nothing
            loss = scope.create_metric("eval/loss", metrics.Mean)
            metric_ops = EvalMetricOps(scope)

            def step():
                if pending:
                    spec, features, labels = pending.pop()
                else:
                    features, labels = next(batches)
                    spec = call(features, labels, mode)
                    if type(spec) is not EstimatorSpec or spec.mode != mode:
                        _check_spec(spec, mode, self._model_fn)
                loss.update_state(spec.loss)   # TF: metrics.mean(loss), per batch
                metric_ops.update(spec.eval_metric_ops, features, labels)
                return spec

            stop = [_StopAfterNSteps(steps)] if steps is not None else []
            all_hooks = (stop + user_hooks + list(first.evaluation_hooks)
                         + progress_hooks("evaluate", num_steps=steps))
            if not nothing:   # (a replica evaluating nothing runs no hook: no step)
                with hooks_lib.MonitoredSession(scope, all_hooks, self._model_dir) as session:
                    while not session.should_stop():
                        session.run(step)
            if pending:   # no step ran here: the metrics are the other replicas' alone
                metric_ops.declare(first.eval_metric_ops)
            strategy.extended.reduce_metrics(list(scope.metrics.values()))
            results = {key: _metric_value(value) for key, value in metric_ops.results().items()}
            results["loss"] = _metric_value(loss.result())
            # TF's order: the metrics sorted by name (loss among them), global_step last
            results = dict(sorted(results.items()), global_step=np.int64(scope.global_step))
        writes = self._writes_eval_summaries(strategy)
        if writes:   # with the evaluated checkpoint's path, as TF
            write_dict_to_summary(self.eval_dir(name), results, scope.global_step, path)
        logger.info("Saving dict for global step %d: %s", scope.global_step,
                    ", ".join(f"{k} = {_as_tf_prints(v)!s}" for k, v in sorted(results.items())))
        if writes and path is not None:
            logger.info("Saving 'checkpoint_path' summary for global step %d: %s",
                        scope.global_step, path)
        return _outcome(results, user_hooks)

    # -- predict ---------------------------------------------------------------------
    def predict(self, input_fn: Callable, predict_keys=None, hooks: Optional[Iterable] = None,
                checkpoint_path: Optional[str] = None, yield_single_examples: bool = True):
        """Yield predictions for every input batch (as dicts of numpy values, one
        per example when `yield_single_examples`)."""
        path, state = self._checkpoint_to_read(checkpoint_path, "predict")
        if path is None:
            logger.warning("Could not find trained model in model_dir: %s, running "
                           "initialization to predict.", self._model_dir)
        keys = [predict_keys] if isinstance(predict_keys, str) else predict_keys
        user_hooks = check_hooks(hooks)
        strategy = self._config.eval_distribute or distribute.get_strategy()
        scope = model_scope.ModelScope(ModeKeys.PREDICT, strategy, restore=state,
                                       restore_path=path) if path else \
            self._initial_scope(ModeKeys.PREDICT, strategy)[0]
        # No torch.no_grad() spans a yield: held over the caller while this
        # generator waits, it made a `train` between two predictions (or any
        # torch work of the caller's) run without gradients, and closing the
        # generator later put back a stale mode in whatever ran then.
        with scope, strategy.scope(), contextlib.closing(
                self._batches(input_fn, ModeKeys.PREDICT, strategy)) as batches:
            with torch.no_grad():
                call = strategy.extended.in_replica_context(self._call_model_fn,
                                                            ModeKeys.PREDICT)
                first = self._first_spec(batches, scope, ModeKeys.PREDICT, strategy, call)
            if first is None:
                return
            first = first[0]
            mode, pending = ModeKeys.PREDICT, [first]

            def step():
                if pending:
                    return pending.pop()
                features, labels = next(batches)
                spec = call(features, labels, mode)
                if type(spec) is not EstimatorSpec or spec.mode != mode:
                    _check_spec(spec, mode, self._model_fn)
                return spec

            all_hooks = user_hooks + list(first.prediction_hooks) + progress_hooks("predict")
            with hooks_lib.MonitoredSession(scope, all_hooks, self._model_dir) as session:
                while True:
                    with torch.no_grad():
                        spec = None if session.should_stop() else session.run(step)
                    if spec is None:
                        break
                    predictions = _select(spec.predictions, keys, warn=spec is first)
                    if yield_single_examples:
                        examples = _examples(predictions)
                    else:
                        examples = [predictions]
                    if isinstance(spec.predictions, dict):
                        yield from examples
                    else:  # a single tensor: yield its values, as TF
                        yield from (e["predictions"] for e in examples)

    # -- export -----------------------------------------------------------------------
    def export_saved_model(self, export_dir_base: str, serving_input_receiver_fn: Callable,
                           assets_extra: Optional[dict] = None, as_text: bool = False,
                           checkpoint_path: Optional[str] = None,
                           experimental_mode: str = ModeKeys.PREDICT) -> str:
        """Export the PREDICT path as a torch.export program in a new
        `export_dir_base/<timestamp>` directory; returns it (see estimator.export).
        TF's `experimental_mode` TRAIN and EVAL exports are not built here."""
        if experimental_mode != ModeKeys.PREDICT:
            raise NotImplementedError(
                f"export_saved_model(experimental_mode={experimental_mode!r}): only "
                f"{ModeKeys.PREDICT!r} exports are built here (TF's TRAIN/EVAL exports hold "
                "a graph's training or evaluation ops; there is no graph)")
        from .export import export_saved_model
        return export_saved_model(self, export_dir_base, serving_input_receiver_fn,
                                  assets_extra=assets_extra, as_text=as_text,
                                  checkpoint_path=checkpoint_path)

    def export_savedmodel(self, export_dir_base: str, serving_input_receiver_fn: Callable,
                          assets_extra: Optional[dict] = None, as_text: bool = False,
                          checkpoint_path: Optional[str] = None,
                          strip_default_attrs: bool = False) -> str:
        """TF1's name of `export_saved_model` (tf.estimator.Estimator.export_savedmodel);
        `strip_default_attrs` has no meaning here (no graph) and is ignored."""
        return self.export_saved_model(export_dir_base, serving_input_receiver_fn,
                                       assets_extra=assets_extra, as_text=as_text,
                                       checkpoint_path=checkpoint_path)

    # -- shared -----------------------------------------------------------------------
    def _writes_eval_summaries(self, strategy) -> bool:
        """The chief writes evaluation summaries, and so does the evaluator task
        (TF's evaluator is not the chief); never another worker."""
        config = self._config
        return ((bool(config.is_chief) or config.task_type == "evaluator")
                and strategy.extended.should_save_summary)

    def _is_chief(self, strategy) -> bool:
        return writes_checkpoints(self._config, strategy)

    def _batches(self, input_fn, mode: str, strategy):
        """(features, labels) pairs on the strategy's device."""
        to_device = strategy.extended.to_device
        depth = self._config.experimental_prefetch_batches
        predict = mode == ModeKeys.PREDICT

        def read(dataset):   # moved to the device, by a read-ahead thread if asked
            moved = map(to_device, _inputs.iterate(dataset, mode))
            # (predict yields to its caller between batches: torch's threads are
            # the caller's then, none set aside for the reading thread)
            return _inputs.read_ahead(moved, depth, leave_a_core=not predict) if depth \
                else moved
        moved = strategy.extended.distribute_input(
            lambda context: _inputs.call_input_fn(input_fn, mode, self.params, self._config,
                                                  context), input_fn, mode, read)
        try:
            for batch in moved:
                if type(batch) is tuple and len(batch) == 2 and not predict:
                    yield batch
                else:   # (PREDICT: labels given are dropped, as TF's predict passes None)
                    yield _inputs.split_batch(batch, mode, predict)
        finally:   # closed: a read-ahead thread stops, its thread count put back
            getattr(moved, "close", lambda: None)()

    def _first_spec(self, batches, scope, mode, strategy, call) -> Optional[tuple]:
        """Call model_fn (`call`: in the replica's context) on the first batch
        before the loop starts, so the spec's hooks are known when the session
        begins (TF builds the graph first): (spec, features, labels), None
        without a batch. Summaries are due on the first step, as in TF."""
        try:
            features, labels = next(batches)
        except StopIteration:
            return None
        # Summaries are recorded on the first call: in training the chief's
        # summaries are due on the first step, as in TF; in evaluation and
        # prediction a SummarySaverHook among the hooks saves the first
        # batch's too (they were lost: it asks only from the first step on).
        # Kept only where a hook then fetches them.
        # (none from an empty batch a replica evaluating nothing builds its metrics on)
        scope.summaries_due = (self._is_chief(strategy) or mode != ModeKeys.TRAIN) and not (
            mode == ModeKeys.EVAL and strategy.extended.evaluates_nothing)
        try:
            if mode == ModeKeys.TRAIN:
                spec = call(features, labels, mode)
            else:   # (once: functional dropout left on here is said)
                with DropoutWatch() as watch:
                    spec = call(features, labels, mode)
                watch.warn(f"{mode!r} mode")
        except Exception as e:
            if hasattr(e, "add_note"):   # (Python 3.11+) where the first call's inputs are odd
                for note in _input_notes(features, labels, mode, e):
                    e.add_note(note)
                if mode == ModeKeys.EVAL and strategy.extended.evaluates_nothing:
                    e.add_note(
                        "(this replica's shard of the evaluation has no batch: fewer batches "
                        "than replicas. As TF's, it runs model_fn once on an empty batch, the "
                        "first batch with no rows, to build its metrics, and code that cannot "
                        "take 0 rows fails there: give the evaluation at least one batch a "
                        "replica, or evaluate without eval_distribute)")
            raise
        _check_spec(spec, mode, self._model_fn)
        return spec, features, labels


def _input_notes(features, labels, mode, error: Exception) -> list:
    """What to add to an error of the first model_fn call that its inputs may
    explain: labels None for features alone, strings where a tensor is wanted
    (a TypeError: torch's for a numpy array of strings; not a checkpoint
    that does not fit the model)."""
    notes = []
    if labels is None and mode != ModeKeys.PREDICT:
        notes.append("(the input_fn gave features alone, so model_fn got labels=None, as in "
                     "TF; give (features, labels) pairs to train with labels)")
    host = sorted((str(k), v) for k, v in features.items() if host_transform.is_host_value(v)
                  ) if isinstance(features, dict) and isinstance(error, TypeError) else []
    lists = [k for k, v in host if isinstance(v, (list, tuple)) and not _holds_strings(v)]
    strings = [k for k, _ in host if k not in lists]
    if strings:
        notes.append(f"(features {strings} are strings, given to model_fn as numpy arrays on "
                     "the host: map them to ids (a feature column, a vocabulary) before a "
                     "torch layer)")
    if lists:
        notes.append(f"(features {lists} are Python lists, given to model_fn as they are: "
                     "have the input_fn give arrays or tensors, e.g. np.asarray(values, "
                     "np.float32))")
    if mode != ModeKeys.TRAIN and isinstance(error, RuntimeError) \
            and "does not require grad" in str(error):
        notes.append(f"(in {mode} the model_fn runs under torch.no_grad(): a loss that takes "
                     "gradients, a gradient penalty, computes them inside `with "
                     "torch.enable_grad():`, as TF's tf.gradients runs in any mode)")
    return notes


def _holds_strings(rows) -> bool:
    """Whether a list of a feature's values (nested lists) holds strings."""
    stack = list(rows)
    while stack:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            return True
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, np.ndarray) and item.dtype.kind in "USO":
            return True
    return False


def _run(strategy, body: Callable, shared: list, *args):
    """`body(*args)` here, or on each replica through the strategy's launcher;
    returns its (rank 0's) result. What comes back from the replicas is what
    the body returns (`_outcome`): its result and the state of the hooks and
    listeners in `shared`, which is set on the caller's objects, so what they
    gathered in rank 0 (a listener's evaluation results) is seen as if they
    had run here."""
    launcher = strategy.extended.launcher
    if launcher is None:
        return body(*args)[0]
    result, states = launcher.launch(body, *args)[0]
    for obj, state in zip(shared, states or ()):
        obj.__dict__.update(state)
    return result


@contextlib.contextmanager
def _failures_told(strategy):
    """An error of this replica's own (its input_fn, its model_fn, a hook),
    told to the other replicas, whose collectives then fail naming it."""
    try:
        yield
    except Exception as e:
        strategy.extended.report_failure(e)
        raise


# {model_dir: (pid, checkpoint)}: where training in process pid last ended
# (a forked replica process inherits this, and its pid tells it apart).
_ended_at: dict = {}


def _seed(seed: Optional[int]) -> None:
    """RunConfig.tf_random_seed: Python's, numpy's and torch's generators."""
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)


def _outcome(result, shared: list) -> tuple:
    """(result, the picklable state of each object in `shared`, only in a
    forked replica: elsewhere the objects are the caller's own)."""
    if not in_replica_process():
        return result, None
    states = []
    for obj in shared:
        state = {}
        for key, value in getattr(obj, "__dict__", {}).items():
            try:
                pickle.dumps(value)
            except Exception:
                continue
            state[key] = value
        states.append(state)
    return result, states


class _StopAfterNSteps(SessionRunHook):
    """Stops evaluation after `num_steps` batches (TF's _StopAfterNEvalStepsHook)."""

    def __init__(self, num_steps: int):
        self._num_steps = num_steps

    def after_run(self, run_context, run_values):
        if run_context.session._runs + 1 >= self._num_steps:
            run_context.request_stop()

    def _idle(self, session):
        return NEVER, self._num_steps - 1, NEVER


def _check_parameters_in_scope(loss: torch.Tensor, scope) -> None:
    """Once, on the first step's loss: every `torch.nn.Parameter` it depends
    on belongs to a module of the scope. A module the model_fn builds itself
    (TF1's `tf.layers.dense(x, 10)` ported as `torch.nn.Linear(4, 10)(x)`) is
    a new one every step: it never trains and is never saved."""
    known = {id(p) for modules in (scope.raw_modules, scope.modules)
             for m in modules.values() for p in m.parameters()}
    stray, seen = [], set()
    todo = [loss.grad_fn] if loss.grad_fn is not None else []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)   # (AccumulateGrad: a leaf)
        if isinstance(variable, torch.nn.Parameter) and id(variable) not in known:
            stray.append(tuple(variable.shape))
        todo.extend(fn for fn, _ in node.next_functions)
    if stray:
        raise ValueError(
            f"The loss depends on parameters not made by est.get_module (shapes "
            f"{', '.join(map(str, stray))}): the model_fn runs every step, so a module it "
            f"builds itself (torch.nn.Linear(...)(x) in the model_fn) is a new one each step, "
            f"never trained and never saved. Build it with est.get_module(name, lambda: "
            f"torch.nn.Linear(...)), which builds it once")


def _check_no_grad_scaler(scope) -> None:
    """A grad scaler scales a loss only in a callable train_op."""
    enabled = [name for name, scaler in scope.grad_scalers.items() if scaler.is_enabled()]
    if enabled:
        raise ValueError(
            f"get_grad_scaler({enabled[0]!r}) made a loss scaler, but "
            "EstimatorSpec's train_op is an optimizer, which the framework steps without it: "
            "return a callable train_op that uses it (`scaler.scale(loss).backward(); "
            "scaler.step(optimizer); scaler.update()`)")


def _check_scope_optimizer(train_op, optimizers: dict) -> None:
    """A train_op optimizer must be the model scope's: a model_fn runs every
    step, so one it constructs itself (TF1's `tf.train.AdamOptimizer(...)`
    ported as `torch.optim.Adam(net.parameters())`) is a new one each step."""
    if not any(train_op is o for o in optimizers.values()):
        raise ValueError(
            f"EstimatorSpec(train_op=...): the {type(train_op).__name__} was not made by "
            f"est.get_optimizer. The model_fn runs every step, so an optimizer it builds "
            f"itself is a new one each step: its state (momentum, Adam's moments) would start "
            f"over at every step and never be saved. Build it with "
            f"est.get_optimizer(lambda params: torch.optim.{type(train_op).__name__}(params, "
            f"...)), which builds it once")


def _check_spec(spec, mode: str, model_fn) -> None:
    if not isinstance(spec, EstimatorSpec):
        raise TypeError(f"model_fn in mode {mode!r} must return an EstimatorSpec, got "
                        f"{type(spec).__name__} (model_fn: {describe(model_fn)})")
    if spec.mode != mode:
        raise ValueError(f"model_fn was called in mode {mode!r} but returned an "
                         f"EstimatorSpec for mode {spec.mode!r}")


def _as_tf_prints(value):
    """A float as TF's logs print it, a float32 (0.6931472, not 0.6931471824645996)."""
    return np.float32(value) if isinstance(value, float) else value


def _python(value):
    if isinstance(value, torch.Tensor):
        return value.item() if value.dim() == 0 else to_numpy(value)
    return value


def _metric_value(value):
    """A metric's result as TF's `evaluate` returns it: numpy, floats in torch's
    default dtype (TF's metric variables are float32: `np.float32(0.85)` prints
    0.85, where the float64 the state is summed in printed 0.8500000238418579)."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point():
        value = value.to(torch.get_default_dtype())
    return to_numpy_value(value)


def _select(predictions, keys, warn: bool = False):
    """The predictions `keys` names, in the model_fn's order, as TF's
    `_extract_keys`: all of them for no keys (None or []); keys that name
    none are ignored (with a warning, where `warn`) unless no key names one."""
    if keys and not isinstance(predictions, dict):
        raise ValueError("predict_keys argument is not valid in case of non-dict predictions "
                         f"(the model_fn returned one tensor); got predict_keys={keys!r}")
    if not isinstance(predictions, dict):
        predictions = {"predictions": predictions}
    if keys:
        unknown = [k for k in keys if k not in predictions]
        if len(unknown) == len(keys):
            raise ValueError(f"Expected to run at least one output from "
                             f"{list(predictions)}, provided {list(keys)}")
        if unknown and warn:
            logger.warning("predict_keys %s are not in the predictions (%s): ignored, as TF "
                           "ignores them", unknown, ", ".join(predictions))
        predictions = {k: v for k, v in predictions.items() if k in keys}
    return {k: _host(v) for k, v in predictions.items()}


def _host(value) -> np.ndarray:
    """A prediction as a numpy array; strings as bytes (utf-8), as TF's
    string tensors come out of `predict` (b"a", an object array of bytes)."""
    if isinstance(value, torch.Tensor):
        return to_numpy(value)
    if isinstance(value, np.ndarray) and value.dtype.kind not in "UOS":
        return value
    return host_transform.as_bytes(value)


def _examples(predictions: dict):
    sizes = {k: v.shape[0] if v.ndim else None for k, v in predictions.items()}
    batch = set(sizes.values())
    if len(batch) != 1 or None in batch:
        raise ValueError(f"Batch length of predictions should be same and at least 1 "
                         f"dimension to yield single examples; got sizes {sizes}")
    for i in range(batch.pop()):
        yield {k: v[i] for k, v in predictions.items()}
