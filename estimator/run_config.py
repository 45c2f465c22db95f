"""RunConfig: how an Estimator runs, and where it sits in the cluster
(tf.estimator.RunConfig).

The cluster comes from the TF_CONFIG environment variable, read with
tf.estimator 2.15's rules (parsed by `distribute.cluster_resolver`).
"""

import collections
import copy
import inspect
import logging
import numbers
import os
from typing import Optional

import distribute
from distribute.cluster_resolver import (ClusterSpec, environment_resolver,
                                         load_tf_config, quote, split_address)

from ._checks import is_int, is_number

logger = logging.getLogger(__name__)

_USE_DEFAULT = object()

_DEFAULT_REPLACEABLE_LIST = [
    "model_dir", "tf_random_seed", "random_seed", "save_summary_steps",
    "save_checkpoints_steps", "save_checkpoints_secs", "session_config",
    "keep_checkpoint_max", "keep_checkpoint_every_n_hours",
    "log_step_count_steps", "train_distribute", "device_fn", "protocol",
    "eval_distribute", "experimental_distribute",
    "experimental_max_worker_delay_secs", "session_creation_timeout_secs",
    "checkpoint_save_graph_def", "experimental_async_checkpoint",
    "experimental_prefetch_batches",
]

# Checkpoints made durable off the step unless RunConfig says otherwise: the
# step serializes the state into a temp file (what a plain loop's torch.save
# costs), a writer process fsyncs, renames and writes the index. Measured with
# `python bench/overhead.py --workloads tiny_ckpt,mlp_ckpt --rounds 9` (2-core
# VM, ratio to a plain loop calling torch.save every 100 steps, three runs):
# tiny model 0.824 / 0.848 / 0.805 in the background against 0.791 / 0.833 /
# 0.799 on the step; MLP 0.984 / 0.972 / 0.953 against 0.957 / 0.945 / 0.945.
# Later (the last save of a train call on the step, three runs): tiny 0.791 /
# 0.752 / 0.774 against 0.767 / 0.750 / 0.769; MLP 0.959 / 0.982 / 0.977
# against 0.946 / 0.930 / 0.975. With saves streamed into their file (one run):
# tiny 0.747 against 0.732, MLP 0.962 against 0.948; saving only at the end,
# the most either can reach, tiny 0.913 and MLP 0.973. With gradients freed
# without zero_grad's profiler record and a save in flight looked at after 1,
# 2, 4... ms (`--rounds 5 --ckpt_steps 5000`, then 1000 for the MLP; one run):
# tiny 0.869 against 0.796, MLP 0.976 against 0.912; end only 0.966 and 0.966.
# With the state staged and serialized by a forked writer (a noisier machine,
# one run each): tiny 0.713 against 0.601 (end only 0.860); MLP 0.997 against
# 1.058 (end only 1.069; 5 rounds, ranges 0.86-1.26); the save step of a
# 60-block conv net with Adam (bench/save_step.py) 20 ms against 60-84 ms.
# With the NaN check in the writer (two runs each, alternating with the code
# before it, which read 0.767 / 0.785): tiny 0.923 / 0.832 against 0.802 /
# 0.665 (end only 1.095 / 0.949); conv net save step 11-22 ms against 20-31;
# MLP 0.927 / 0.987 against 1.000 / 1.171 (end only 0.958 / 1.208): on 2
# cores the writer competes with torch's two compute threads.
ASYNC_CHECKPOINT_DEFAULT = True
# ... which the environment may change for every RunConfig that leaves it None
# (a cluster on network storage; the fault-injection tests run both ways).
ASYNC_CHECKPOINT_ENV = "ESTIMATOR_ASYNC_CHECKPOINT"


def async_checkpoint(config) -> bool:
    """Whether `config`'s chief writes checkpoints in the background."""
    value = config.experimental_async_checkpoint
    if value is not None:
        return value
    setting = os.environ.get(ASYNC_CHECKPOINT_ENV, "").strip().lower()
    if setting in ("1", "true", "yes"):
        return True
    if setting in ("0", "false", "no"):
        return False
    if setting:
        raise ValueError(f"{ASYNC_CHECKPOINT_ENV}={os.environ[ASYNC_CHECKPOINT_ENV]!r}: give "
                         "1 or 0")
    return ASYNC_CHECKPOINT_DEFAULT


_SAVE_CKPT_ERR = "`save_checkpoints_steps` and `save_checkpoints_secs` cannot be both set."
_LOCAL_MASTER = ""
_GRPC_SCHEME = "grpc://"


class TaskType:
    """Job names in a TF_CONFIG cluster (tf.estimator's TaskType)."""

    MASTER = "master"
    PS = "ps"
    WORKER = "worker"
    CHIEF = "chief"
    EVALUATOR = "evaluator"


# -- TF_CONFIG rules (tf.estimator 2.15's run_config.py helpers) --------------

def _get_session_master(cluster_spec, task_type, task_id, tf_config):
    """TF_CONFIG's "session_master", '' for a one-task cluster, else grpc://<task address>."""
    if tf_config.session_master is not None:
        return tf_config.session_master
    jobs = cluster_spec.jobs
    if len(jobs) == 1 and cluster_spec.num_tasks(jobs[0]) == 1:
        return _LOCAL_MASTER
    return _GRPC_SCHEME + cluster_spec.task_address(task_type, task_id)


def _get_eval_session_master(task_type, tf_config):
    if task_type == TaskType.EVALUATOR and tf_config.eval_session_master is not None:
        return tf_config.eval_session_master
    return _LOCAL_MASTER


def _count_ps(cluster_spec):
    return cluster_spec.num_tasks(TaskType.PS) if TaskType.PS in cluster_spec.jobs else 0


def _count_worker(cluster_spec, chief_task_type):
    """Workers plus the chief (or legacy master)."""
    return sum(cluster_spec.num_tasks(job) for job in (TaskType.WORKER, chief_task_type)
               if job in cluster_spec.jobs)


def _job_size(cluster_spec, job):
    """Number of index slots of a job (max index + 1), as TF's len(job_tasks(job))."""
    return len(cluster_spec.job_tasks(job))


def _validate_task_type_and_task_id(cluster_spec, tf_config, chief_task_type):
    """Checks the one chief and the task's type and index; returns (type, index)."""
    cluster = quote(cluster_spec.as_dict())
    if chief_task_type not in cluster_spec.jobs:
        raise ValueError('If "cluster" is set in TF_CONFIG, it must have one "%s" node; '
                         "its jobs are %s: %s" % (chief_task_type, cluster_spec.jobs, cluster))
    chiefs = cluster_spec.num_tasks(chief_task_type)
    if chiefs != 1:
        raise ValueError('The "cluster" in TF_CONFIG must have exactly one "%s" node, got %d: %s'
                         % (chief_task_type, chiefs, cluster))
    task = quote(tf_config.task if tf_config.task is not None else {})
    if tf_config.task_type is None:
        raise ValueError('If "cluster" is set in TF_CONFIG, task type must be set; '
                         '"task" is %s' % task)
    if tf_config.task_id is None:
        raise ValueError('If "cluster" is set in TF_CONFIG, task index must be set; '
                         '"task" is %s' % task)
    # Index >= 0, type in the cluster and index in range were checked by the
    # parser (an evaluator is not part of the training cluster).
    return tf_config.task_type, tf_config.task_id


def _get_global_id_in_cluster(cluster_spec, task_type, task_id, chief_task_type):
    """Chief first, then the other jobs sorted by name, ps last."""
    ordered = [chief_task_type]
    ordered += [t for t in sorted(cluster_spec.jobs)
                if t not in (chief_task_type, TaskType.PS)]
    if TaskType.PS in cluster_spec.jobs:
        ordered.append(TaskType.PS)
    next_global_id = 0
    for t in ordered:
        if t == task_type:
            return next_global_id + task_id
        next_global_id += _job_size(cluster_spec, t)
    raise RuntimeError("Internal error: task type %r is not in %r" % (task_type, cluster_spec))


def _get_model_dir(tf_config, model_dir):
    """The model_dir argument, or TF_CONFIG's "model_dir"; both must agree."""
    if model_dir == "":
        raise ValueError("model_dir should be non-empty.")
    in_tf_config = tf_config.model_dir
    if in_tf_config:
        if model_dir and in_tf_config != model_dir:
            raise ValueError(
                "`model_dir` provided in RunConfig construct, if set, must have the same "
                "value as the model_dir in TF_CONFIG. model_dir: %s\n"
                'TF_CONFIG["model_dir"]: %s.\n' % (model_dir, in_tf_config))
        logger.info("Using model_dir in TF_CONFIG: %s", in_tf_config)
    return model_dir or in_tf_config


# -- argument validation (tf.estimator's _validate_properties) ------------------

def _check(name, value, kind, minimum=None, strict=False):
    """Raises ValueError naming `name` unless `value` is None or of `kind` within bounds."""
    if value is None:
        return
    ok_type = is_int(value) if kind == "integer" else is_number(value)
    if not ok_type:
        article = "an" if kind == "integer" else "a"
        raise ValueError("%s must be %s %s, got %r" % (name, article, kind, value))
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError("%s should be %s %s, got %r"
                         % (name, ">" if strict else ">=", minimum, value))


def _validate_device_fn(device_fn):
    if device_fn is None:
        return
    message = "device_fn must be callable with exactly one argument \"op\", got %r" % (device_fn,)
    if not callable(device_fn):
        raise ValueError(message)
    try:
        params = inspect.signature(device_fn).parameters.values()
    except (TypeError, ValueError):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) != 1 or len(params) != 1:
        raise ValueError(message)


def _validate_properties(config):
    if config._model_dir is not None and not isinstance(config._model_dir, str):
        raise ValueError("model_dir must be a string or a path, got %r" % (config._model_dir,))
    if config._model_dir == "":
        raise ValueError("model_dir should be non-empty.")
    _check("save_summary_steps", config._save_summary_steps, "integer", 0)
    _check("save_checkpoints_steps", config._save_checkpoints_steps, "integer", 0)
    _check("save_checkpoints_secs", config._save_checkpoints_secs, "number", 0)
    _check("keep_checkpoint_max", config._keep_checkpoint_max, "integer", 0)
    _check("keep_checkpoint_every_n_hours", config._keep_checkpoint_every_n_hours,
           "number", 0, strict=True)
    _check("log_step_count_steps", config._log_step_count_steps, "integer", 0, strict=True)
    if config._tf_random_seed is not None and not isinstance(config._tf_random_seed,
                                                              numbers.Integral):
        raise ValueError("tf_random_seed must be integer, got %r" % (config._tf_random_seed,))
    _check("experimental_max_worker_delay_secs", config._experimental_max_worker_delay_secs,
           "integer")
    _check("session_creation_timeout_secs", config._session_creation_timeout_secs,
           "number", 0, strict=True)
    _validate_device_fn(config._device_fn)
    if config._protocol not in (None, "grpc", "grpc+verbs"):
        raise ValueError("protocol should be grpc or grpc+verbs, got %r" % (config._protocol,))
    if config._experimental_async_checkpoint not in (None, True, False):
        raise ValueError("experimental_async_checkpoint must be True, False or None (the "
                         "default), got %r" % (config._experimental_async_checkpoint,))
    _check("experimental_prefetch_batches", config._experimental_prefetch_batches, "integer",
           0)
    if not isinstance(config._checkpoint_save_graph_def, bool):
        raise ValueError("checkpoint_save_graph_def must be a bool, got %r"
                         % (config._checkpoint_save_graph_def,))


def _validate_save_ckpt_with_replaced_keys(config, replaced_keys):
    """Exactly TF's: setting one of steps/secs clears the other; both set is an error."""
    steps, secs = config._save_checkpoints_steps, config._save_checkpoints_secs
    if "save_checkpoints_steps" in replaced_keys and "save_checkpoints_secs" in replaced_keys:
        if steps is not None and secs is not None:
            raise ValueError("%s Got save_checkpoints_steps=%r, save_checkpoints_secs=%r."
                             % (_SAVE_CKPT_ERR, steps, secs))
    elif "save_checkpoints_steps" in replaced_keys and steps is not None:
        config._save_checkpoints_secs = None
    elif "save_checkpoints_secs" in replaced_keys and secs is not None:
        config._save_checkpoints_steps = None


class RunConfig:
    """Configuration of an Estimator run, as `tf.estimator.RunConfig`.

    Cluster properties (`cluster_spec`, `task_type`, `task_id`, `is_chief`,
    `master`, `num_worker_replicas`, `num_ps_replicas`,
    `global_id_in_cluster`, ...) come from TF_CONFIG with tf.estimator 2.15's
    rules, whether or not a strategy is given; without TF_CONFIG, under
    torchrun or SLURM's srun, the rank gives `task_type`, `task_id`, `is_chief` (rank 0
    alone), `global_id_in_cluster` and `num_worker_replicas`.
    `session_config`, `device_fn`, `protocol`, `checkpoint_save_graph_def` and
    `session_creation_timeout_secs` are kept for API compatibility and do
    nothing (there are no sessions or graphs here; the transport is
    torch.distributed; `session_config`'s device count, visible devices and
    thread pools are CUDA_VISIBLE_DEVICES and torch.set_num_threads):
    setting one of the first three logs a warning.
    `experimental_max_worker_delay_secs=cap`: a worker task of a
    parameter-server job waits min(cap, 5 * (task_id + 1)) seconds before
    training, as TF's; without it, none (TF waits as with cap 60).
    `random_seed` is an alias of `tf_random_seed`.
    `experimental_async_checkpoint`: checkpoints made durable by a background
    writer process with the same guarantees (TF2's
    ``CheckpointOptions(experimental_enable_async_checkpoint)``); on unless
    False or ``ESTIMATOR_ASYNC_CHECKPOINT=0``.
    `experimental_prefetch_batches=N`: a thread reads the input N batches
    ahead of the step (TF's ``dataset.prefetch(N)``); the input_fn's
    iterator then runs on that thread, and what it draws from torch's
    default generator interleaves with the model's draws (under several
    replicas too: docs/distribute.md, "Agreeing replicas").
    """

    def __init__(self, model_dir=None, tf_random_seed=None, save_summary_steps=100,
                 save_checkpoints_steps=_USE_DEFAULT, save_checkpoints_secs=_USE_DEFAULT,
                 session_config=None, keep_checkpoint_max=5,
                 keep_checkpoint_every_n_hours=10000, log_step_count_steps=100,
                 train_distribute=None, device_fn=None, protocol=None, eval_distribute=None,
                 experimental_distribute=None, experimental_max_worker_delay_secs=None,
                 session_creation_timeout_secs=7200, checkpoint_save_graph_def=True,
                 random_seed=None, experimental_async_checkpoint=None,
                 experimental_prefetch_batches=0):
        if save_checkpoints_steps is _USE_DEFAULT and save_checkpoints_secs is _USE_DEFAULT:
            save_checkpoints_steps, save_checkpoints_secs = None, 600
        elif save_checkpoints_secs is _USE_DEFAULT:
            save_checkpoints_secs = None
        elif save_checkpoints_steps is _USE_DEFAULT:
            save_checkpoints_steps = None
        elif save_checkpoints_steps is not None and save_checkpoints_secs is not None:
            raise ValueError("%s Got save_checkpoints_steps=%r, save_checkpoints_secs=%r."
                             % (_SAVE_CKPT_ERR, save_checkpoints_steps, save_checkpoints_secs))
        ignored = [name for name, value in (
            ("session_config", session_config), ("device_fn", device_fn),
            ("protocol", protocol)) if value is not None]
        if ignored:
            logger.warning("RunConfig: %s %s accepted for TF compatibility and ignored (there "
                           "is no session, graph placement or gRPC here; the transport is "
                           "torch.distributed)", ", ".join(ignored),
                           "is" if len(ignored) == 1 else "are")
        tf_random_seed = _merge_seed(tf_random_seed, random_seed)
        train_distribute, eval_distribute = _merge_experimental_distribute(
            experimental_distribute, train_distribute, eval_distribute)

        tf_config = load_tf_config()
        if tf_config.raw:
            logger.info("TF_CONFIG environment variable: %s", tf_config.raw)
        if model_dir is not None and hasattr(model_dir, "__fspath__"):
            model_dir = os.fspath(model_dir)
        model_dir = _get_model_dir(tf_config, model_dir)

        self._replace_in_place(
            model_dir=model_dir, tf_random_seed=tf_random_seed,
            save_summary_steps=save_summary_steps,
            save_checkpoints_steps=save_checkpoints_steps,
            save_checkpoints_secs=save_checkpoints_secs, session_config=session_config,
            keep_checkpoint_max=keep_checkpoint_max,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            log_step_count_steps=log_step_count_steps, train_distribute=train_distribute,
            device_fn=device_fn, protocol=protocol, eval_distribute=eval_distribute,
            experimental_distribute=experimental_distribute,
            experimental_max_worker_delay_secs=experimental_max_worker_delay_secs,
            session_creation_timeout_secs=session_creation_timeout_secs,
            checkpoint_save_graph_def=checkpoint_save_graph_def,
            experimental_async_checkpoint=experimental_async_checkpoint,
            experimental_prefetch_batches=experimental_prefetch_batches)
        self._init_distributed_setting_from_environment_var(tf_config)

    # -- TF_CONFIG ------------------------------------------------------------

    def _init_distributed_setting_from_environment_var(self, tf_config):
        self._service = tf_config.service
        self._cluster_spec = tf_config.cluster
        if self._cluster_spec and TaskType.MASTER in self._cluster_spec.jobs:
            return self._init_distributed_setting_with_master(tf_config)

        if self._cluster_spec and TaskType.CHIEF not in self._cluster_spec.jobs and (
                self._train_distribute or self._eval_distribute):
            return self._init_distributed_setting_without_chief(tf_config)

        if self._cluster_spec:
            self._task_type, self._task_id = _validate_task_type_and_task_id(
                self._cluster_spec, tf_config, TaskType.CHIEF)
            self._evaluation_master = _get_eval_session_master(self._task_type, tf_config)
            if self._task_type != TaskType.EVALUATOR:
                self._master = _get_session_master(
                    self._cluster_spec, self._task_type, self._task_id, tf_config)
                self._num_ps_replicas = _count_ps(self._cluster_spec)
                self._num_worker_replicas = _count_worker(self._cluster_spec, TaskType.CHIEF)
                self._global_id_in_cluster = _get_global_id_in_cluster(
                    self._cluster_spec, self._task_type, self._task_id, TaskType.CHIEF)
            else:
                # The evaluator is not part of the training cluster.
                self._cluster_spec = ClusterSpec({})
                self._master = _LOCAL_MASTER
                self._num_ps_replicas = 0
                self._num_worker_replicas = 0
                self._global_id_in_cluster = None
            self._is_chief = self._task_type == TaskType.CHIEF
            return

        # Local mode.
        self._task_type = tf_config.task_type or TaskType.WORKER
        self._task_id = 0 if tf_config.task_id is None else tf_config.task_id
        if self._task_type != TaskType.WORKER:
            raise ValueError('If "cluster" is not set in TF_CONFIG, task type must be '
                             '"worker", got %s in "task": %s'
                             % (quote(self._task_type), quote(tf_config.task)))
        if self._task_id != 0:
            raise ValueError('If "cluster" is not set in TF_CONFIG, task index must be 0, '
                             'got %d in "task": %s' % (self._task_id, quote(tf_config.task)))
        self._global_id_in_cluster = 0
        self._master = tf_config.session_master or _LOCAL_MASTER
        self._evaluation_master = tf_config.eval_session_master or _LOCAL_MASTER
        self._is_chief = True
        self._num_ps_replicas = 0
        self._num_worker_replicas = 1
        if not tf_config.raw:
            self._init_ranks_from_launcher()

    def _init_ranks_from_launcher(self):
        """Under torchrun or srun (no TF_CONFIG), the rank gives the role, as it
        does to MultiWorkerMirroredStrategy: rank 0 the chief, rank r worker
        r - 1, so `is_chief` is true on rank 0 alone. The cluster_spec stays
        empty: train_and_evaluate runs in local mode on every rank."""
        resolver = environment_resolver()
        if resolver is not None and resolver.world_size > 1:
            self._task_type, self._task_id = resolver.task_type, resolver.task_id
            self._is_chief = resolver.rank == 0
            self._global_id_in_cluster = resolver.rank
            self._num_worker_replicas = resolver.world_size

    def _init_distributed_setting_without_chief(self, tf_config):
        """A cluster of workers (and maybe ps) with no chief, under a strategy:
        worker 0 acts as chief, as TF's distribute coordinator does."""
        if TaskType.WORKER not in self._cluster_spec.jobs:
            raise ValueError('A "cluster" in TF_CONFIG without a "chief" must have '
                             '"worker" tasks; its jobs are %s' % self._cluster_spec.jobs)
        task = quote(tf_config.task if tf_config.task is not None else {})
        if tf_config.task_type is None or tf_config.task_id is None:
            raise ValueError('If "cluster" is set in TF_CONFIG, task type and index must be '
                             'set; "task" is %s' % task)
        self._task_type, self._task_id = tf_config.task_type, tf_config.task_id
        self._evaluation_master = _get_eval_session_master(self._task_type, tf_config)
        if self._task_type == TaskType.EVALUATOR:
            self._cluster_spec = ClusterSpec({})
            self._master, self._num_ps_replicas = _LOCAL_MASTER, 0
            self._num_worker_replicas, self._global_id_in_cluster = 0, None
            self._is_chief = False
            return
        self._master = _get_session_master(self._cluster_spec, self._task_type, self._task_id,
                                           tf_config)
        self._num_ps_replicas = _count_ps(self._cluster_spec)
        self._num_worker_replicas = _count_worker(self._cluster_spec, TaskType.CHIEF)
        self._global_id_in_cluster = _get_global_id_in_cluster(
            self._cluster_spec, self._task_type, self._task_id, TaskType.WORKER)
        self._is_chief = self._task_type == TaskType.WORKER and self._task_id == 0

    def _init_distributed_setting_with_master(self, tf_config):
        """Legacy cluster whose chief is a "master" job (no "chief", no evaluator)."""
        if TaskType.CHIEF in self._cluster_spec.jobs:
            raise ValueError('If "master" node exists in "cluster", job "chief" is not '
                             "supported; jobs: %s" % self._cluster_spec.jobs)
        self._task_type, self._task_id = _validate_task_type_and_task_id(
            self._cluster_spec, tf_config, TaskType.MASTER)
        if self._task_type == TaskType.EVALUATOR:
            raise ValueError('If "master" node exists in "cluster", task type "evaluator" '
                             'is not supported; "task": %s' % quote(tf_config.task))
        self._global_id_in_cluster = _get_global_id_in_cluster(
            self._cluster_spec, self._task_type, self._task_id, TaskType.MASTER)
        self._master = _get_session_master(
            self._cluster_spec, self._task_type, self._task_id, tf_config)
        self._evaluation_master = _get_eval_session_master(self._task_type, tf_config)
        self._num_ps_replicas = _count_ps(self._cluster_spec)
        self._num_worker_replicas = _count_worker(self._cluster_spec, TaskType.MASTER)
        self._is_chief = self._task_type == TaskType.MASTER

    # -- replace ----------------------------------------------------------------

    def replace(self, **kwargs):
        """A copy with the given properties replaced (those of TF's list, plus `random_seed`).

        Setting one of save_checkpoints_steps/secs clears the other, as in TF.
        The copy is shallow: strategies are shared, not copied.
        """
        return copy.copy(self)._replace_in_place(**kwargs)

    def _replace_in_place(self, **kwargs):
        for key in kwargs:
            if key not in _DEFAULT_REPLACEABLE_LIST:
                raise ValueError("Replacing %s is not supported. Allowed properties are %s."
                                 % (key, _DEFAULT_REPLACEABLE_LIST))
        if "random_seed" in kwargs:
            seed = kwargs.pop("random_seed")
            kwargs["tf_random_seed"] = _merge_seed(kwargs.get("tf_random_seed"), seed)
        if "model_dir" in kwargs and hasattr(kwargs["model_dir"], "__fspath__"):
            kwargs["model_dir"] = os.fspath(kwargs["model_dir"])
        for key, value in kwargs.items():
            setattr(self, "_" + key, value)
        _validate_save_ckpt_with_replaced_keys(self, kwargs.keys())
        _validate_properties(self)
        return self

    def __repr__(self):
        return ("RunConfig(model_dir=%r, task_type=%r, task_id=%r, is_chief=%r, "
                "cluster_spec=%r)" % (self._model_dir, self._task_type, self._task_id,
                                      self._is_chief, self._cluster_spec))

    # -- properties -------------------------------------------------------------

    cluster_spec = property(lambda self: self._cluster_spec)
    task_type = property(lambda self: self._task_type)
    task_id = property(lambda self: self._task_id)
    is_chief = property(lambda self: self._is_chief)
    master = property(lambda self: self._master, doc="grpc://<address> of this task, "
                      "'' locally or in a one-task cluster (TF's session master).")
    evaluation_master = property(lambda self: self._evaluation_master)
    num_worker_replicas = property(lambda self: self._num_worker_replicas,
                                   doc="Workers plus the chief (or legacy master).")
    num_ps_replicas = property(lambda self: self._num_ps_replicas)
    global_id_in_cluster = property(
        lambda self: self._global_id_in_cluster,
        doc="Unique id in the training cluster: chief 0, then the other jobs sorted "
            "by name, ps last; None for the evaluator.")
    service = property(lambda self: self._service, doc="TF_CONFIG's \"service\" dict.")
    model_dir = property(lambda self: self._model_dir)
    tf_random_seed = property(lambda self: self._tf_random_seed)
    random_seed = property(lambda self: self._tf_random_seed, doc="Alias of tf_random_seed.")
    save_summary_steps = property(lambda self: self._save_summary_steps)
    save_checkpoints_steps = property(lambda self: self._save_checkpoints_steps)
    save_checkpoints_secs = property(lambda self: self._save_checkpoints_secs)
    session_config = property(lambda self: self._session_config)
    keep_checkpoint_max = property(lambda self: self._keep_checkpoint_max)
    keep_checkpoint_every_n_hours = property(lambda self: self._keep_checkpoint_every_n_hours)
    log_step_count_steps = property(lambda self: self._log_step_count_steps)
    train_distribute = property(lambda self: self._train_distribute)
    eval_distribute = property(lambda self: self._eval_distribute)
    device_fn = property(lambda self: self._device_fn)
    protocol = property(lambda self: self._protocol)
    session_creation_timeout_secs = property(lambda self: self._session_creation_timeout_secs)
    experimental_max_worker_delay_secs = property(
        lambda self: self._experimental_max_worker_delay_secs)
    checkpoint_save_graph_def = property(lambda self: self._checkpoint_save_graph_def)

    @property
    def experimental_async_checkpoint(self):
        """Whether the chief's checkpoints are made durable by a writer process
        (the step only serializes the state into a temp file); None:
        ``ESTIMATOR_ASYNC_CHECKPOINT=1`` / ``0`` in the environment, else
        `ASYNC_CHECKPOINT_DEFAULT` (on)."""
        return self._experimental_async_checkpoint

    @property
    def experimental_prefetch_batches(self) -> int:
        """Batches an input thread reads ahead of the step (TF: `dataset.prefetch`);
        0, the default: read on the step."""
        return self._experimental_prefetch_batches


def _merge_seed(tf_random_seed, random_seed):
    if random_seed is not None and tf_random_seed is not None and random_seed != tf_random_seed:
        raise ValueError("random_seed is an alias of tf_random_seed; got different values: "
                         "random_seed=%r, tf_random_seed=%r" % (random_seed, tf_random_seed))
    return tf_random_seed if tf_random_seed is not None else random_seed


class DistributeConfig(collections.namedtuple(
        "DistributeConfig", ("train_distribute", "eval_distribute", "remote_cluster"))):
    """TF1's `tf.contrib.distribute.DistributeConfig`: the strategies, and
    `remote_cluster` ({job: [host:port]}) for the standalone client mode:
    `train_and_evaluate` then runs each task on the `estimator server`
    listening at its address (see `estimator.remote`)."""

    def __new__(cls, train_distribute=None, eval_distribute=None, remote_cluster=None):
        if remote_cluster is not None:
            if not isinstance(remote_cluster, dict) or not remote_cluster or not all(
                    isinstance(v, (list, tuple)) and v and all(isinstance(a, str) for a in v)
                    for v in remote_cluster.values()):
                raise ValueError(f"remote_cluster must be {{job: [host:port, ...]}}, got "
                                 f"{remote_cluster!r}")
            remote_cluster = {job: list(v) for job, v in remote_cluster.items()}
            _check_remote_cluster(remote_cluster)
        return super().__new__(cls, train_distribute, eval_distribute, remote_cluster)


def _check_remote_cluster(cluster: dict) -> None:
    """The standalone client's cluster, checked before any task starts: known
    jobs, one chief (or workers alone), one evaluator at most, host:port
    addresses, none twice (each is one task's server)."""
    known = (TaskType.CHIEF, TaskType.WORKER, TaskType.PS, TaskType.EVALUATOR)
    unknown = [job for job in cluster if job not in known]
    if unknown:
        raise ValueError(f"remote_cluster: unknown job(s) {unknown}; the jobs are {list(known)}")
    if len(cluster.get(TaskType.CHIEF, [])) > 1 or len(cluster.get(TaskType.EVALUATOR, [])) > 1:
        raise ValueError(f"remote_cluster: one chief and one evaluator at most, got {cluster}")
    if TaskType.CHIEF not in cluster and TaskType.WORKER not in cluster:
        raise ValueError(f"remote_cluster: no chief or worker to train, got {cluster}")
    seen = {}
    for job, addresses in cluster.items():
        for i, address in enumerate(addresses):
            split_address(address, f"remote_cluster {job}:{i}")
            if address in seen:
                raise ValueError(f"remote_cluster: {job}:{i} and {seen[address]} have one "
                                 f"address, {address}: each task needs a server of its own")
            seen[address] = f"{job}:{i}"


def remote_cluster(config) -> Optional[dict]:
    """The standalone client's cluster, None unless `config` names one."""
    return getattr(getattr(config, "_experimental_distribute", None), "remote_cluster", None)


def _merge_experimental_distribute(experimental_distribute, train_distribute, eval_distribute):
    """Takes the strategies of a DistributeConfig-like object, as TF does."""
    if experimental_distribute is None:
        return train_distribute, eval_distribute
    for name in ("train_distribute", "eval_distribute"):
        inner = getattr(experimental_distribute, name, None)
        if inner is None:
            continue
        if (train_distribute if name == "train_distribute" else eval_distribute) is not None:
            raise ValueError("Either `%s` or `experimental_distribute.%s` can be set."
                             % (name, name))
        if name == "train_distribute":
            train_distribute = inner
        else:
            eval_distribute = inner
    return train_distribute, eval_distribute


def writes_checkpoints(config: RunConfig, strategy=None) -> bool:
    """The chief rule, in one place: whether this task writes checkpoints and
    training summaries. TF_CONFIG's chief (worker 0 of a chief-less cluster
    under a strategy) that is also its strategy's writer (rank 0 of the
    replicas, under torchrun or SLURM too). `strategy` defaults to the
    config's `train_distribute`, else the current one."""
    if strategy is None:
        strategy = config.train_distribute or distribute.get_strategy()
    return bool(config.is_chief) and strategy.extended.should_checkpoint
