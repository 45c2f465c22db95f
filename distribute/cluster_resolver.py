"""Cluster descriptions and resolvers (tf.train.ClusterSpec and
tf.distribute.cluster_resolver).

A cluster is a dict of jobs ("chief", "worker", "ps", "evaluator", legacy
"master") to task addresses. Resolvers find this process's cluster and role
from the environment: TF_CONFIG (`TFConfigClusterResolver`), torchrun
(`TorchrunClusterResolver`) or SLURM (`SlurmClusterResolver`). Addresses are
"host:port" strings; the strategies rendezvous with torch.distributed at the
chief's address.

`_parse_tf_config` is the one TF_CONFIG parser, shared by
`TFConfigClusterResolver` and `estimator.RunConfig`.
"""

import dataclasses
import json
import logging
import math
import os
import re
from typing import Mapping, Optional

logger = logging.getLogger(__name__)

_TF_CONFIG_ENV = "TF_CONFIG"
_EVALUATOR = "evaluator"


def _format_master_url(master, rpc_layer=None):
    """`rpc_layer://master`, or `master` alone without an rpc layer (as TF)."""
    return "%s://%s" % (rpc_layer, master) if rpc_layer else master


def quote(value, limit=300):
    """A JSON-ish rendering of `value` for error messages, cut to `limit`."""
    try:
        text = json.dumps(value, sort_keys=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def split_address(address: str, what: str):
    """(host, port) of a TF_CONFIG address "host:port" (IPv6 in brackets);
    an error naming `what` (the task) when it is not one, or the port is
    outside 1..65535."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"The address {address!r} of {what} must be host:port")
    if not 0 < int(port) < 65536:
        raise ValueError(f"The address {address!r} of {what} has port {port}, outside "
                         "1..65535")
    return host.strip("[]"), int(port)


class ClusterSpec:
    """Jobs and their task addresses, as `tf.train.ClusterSpec`.

    Built from {job: [address, ...]} or {job: {index: address}} (sparse), or
    from another ClusterSpec. Falsy when it has no job.
    """

    def __init__(self, cluster):
        if isinstance(cluster, ClusterSpec):
            cluster = cluster._cluster_spec
        if not isinstance(cluster, Mapping):
            raise TypeError(
                "`cluster` must be a dict mapping job names to lists of "
                "network addresses, got %s: %s" % (type(cluster).__name__, quote(cluster)))
        self._cluster_spec = {}
        for job, tasks in cluster.items():
            if not isinstance(job, str):
                raise TypeError("Job name %r must be a string" % (job,))
            if isinstance(tasks, (list, tuple)):
                job_tasks = dict(enumerate(tasks))
            elif isinstance(tasks, Mapping):
                job_tasks = {}
                for i, address in tasks.items():
                    try:
                        job_tasks[int(i)] = address
                    except (TypeError, ValueError):
                        raise TypeError("Task index %r of job %r must be an integer"
                                        % (i, job)) from None
            else:
                raise TypeError(
                    "The tasks for job %r must be a list or a dict from integers "
                    "to strings, got %s" % (job, quote(tasks)))
            for i, address in job_tasks.items():
                if not isinstance(address, str):
                    raise TypeError("Task address %s (job %r, index %d) must be a "
                                    "string" % (quote(address), job, i))
            self._cluster_spec[job] = job_tasks

    def __bool__(self):
        return bool(self._cluster_spec)

    def __eq__(self, other):
        if isinstance(other, ClusterSpec):
            return self._cluster_spec == other._cluster_spec
        if isinstance(other, Mapping):
            try:
                return self._cluster_spec == ClusterSpec(other)._cluster_spec
            except TypeError:
                return False
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        items = self.as_dict()
        return "ClusterSpec({%s})" % ", ".join(
            "%r: %r" % (k, items[k]) for k in sorted(items))

    @property
    def jobs(self):
        """Job names, in the order given."""
        return list(self._cluster_spec)

    def _job(self, job_name):
        try:
            return self._cluster_spec[job_name]
        except KeyError:
            raise ValueError("No such job in cluster: %r (jobs: %s)"
                             % (job_name, self.jobs)) from None

    def num_tasks(self, job_name):
        return len(self._job(job_name))

    def task_indices(self, job_name):
        return sorted(self._job(job_name))

    def task_address(self, job_name, task_index):
        job = self._job(job_name)
        try:
            return job[task_index]
        except KeyError:
            raise ValueError("No task with index %r in job %r (indices: %s)"
                             % (task_index, job_name, sorted(job))) from None

    def job_tasks(self, job_name):
        """Addresses by index, `None` where a sparse job has a gap (as TF)."""
        job = self._job(job_name)
        ret = [None] * (max(job) + 1 if job else 0)
        for i, address in job.items():
            ret[i] = address
        return ret

    def as_dict(self):
        """{job: [addresses]} for dense jobs, {job: {index: address}} else (as TF)."""
        ret = {}
        for job, tasks in self._cluster_spec.items():
            indices = sorted(tasks)
            if indices and indices[-1] + 1 == len(indices):
                ret[job] = [tasks[i] for i in indices]
            else:
                ret[job] = {i: tasks[i] for i in indices}
        return ret


@dataclasses.dataclass(frozen=True)
class _TFConfig:
    """TF_CONFIG, parsed and checked for structure (not for roles)."""

    cluster: ClusterSpec
    task_type: Optional[str] = None
    task_id: Optional[int] = None
    environment: Optional[str] = None
    rpc_layer: Optional[str] = None
    task: Optional[dict] = None  # the raw "task" object, for messages
    session_master: Optional[str] = None
    eval_session_master: Optional[str] = None
    model_dir: Optional[str] = None
    service: Optional[dict] = None
    raw: dict = dataclasses.field(default_factory=dict)


def _parse_task_index(index, task):
    """int(index) as TF does, refusing bools, fractions and negatives."""
    value = None
    if isinstance(index, bool):
        pass
    elif isinstance(index, int):
        value = index
    elif isinstance(index, float) and index.is_integer():
        value = int(index)
    elif isinstance(index, str):
        try:
            value = int(index)
        except ValueError:
            pass
    if value is None:
        raise ValueError('Invalid TF_CONFIG: task index must be an integer, got %s '
                         'in "task": %s' % (quote(index), quote(task)))
    if value < 0:
        raise ValueError('Invalid TF_CONFIG: task index must be non-negative, got %d '
                         'in "task": %s' % (value, quote(task)))
    return value


def _optional_str(config, key):
    value = config.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError('Invalid TF_CONFIG: "%s" must be a string, got %s'
                         % (key, quote(value)))
    return value


def _parse_tf_config(text_or_dict):
    """Parses TF_CONFIG (JSON text or a dict) into a `_TFConfig`.

    Checks structure only: JSON object, "cluster" a valid cluster, "task" an
    object with a string "type" and a non-negative integer "index", the task
    type a job of the cluster and the index one of its tasks (an evaluator may
    be outside the cluster), typed optional keys. Role rules (one chief, ...)
    are RunConfig's. Raises ValueError quoting the offending part.
    """
    if isinstance(text_or_dict, Mapping):
        config = dict(text_or_dict)
    else:
        text = text_or_dict
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError("Invalid TF_CONFIG: not valid JSON (%s at line %d column %d, "
                             "char %d): %r" % (e.msg, e.lineno, e.colno, e.pos, text)) from None
        if not isinstance(config, dict):
            raise ValueError("Invalid TF_CONFIG: must be a JSON object with \"cluster\" "
                             "and \"task\", got %s: %s" % (type(config).__name__, quote(config)))

    cluster = config.get("cluster", {})
    try:
        cluster_spec = ClusterSpec(cluster)
    except TypeError as e:
        raise ValueError('Invalid TF_CONFIG: "cluster" %s: %s' % (quote(cluster), e)) from None

    task = config.get("task", {})
    if not isinstance(task, dict):
        raise ValueError('Invalid TF_CONFIG: "task" must be an object like '
                         '{"type": "worker", "index": 0}, got %s' % quote(task))
    task_type = task_id = None
    if "type" in task:
        task_type = task["type"]
        if not isinstance(task_type, str) or not task_type:
            raise ValueError('Invalid TF_CONFIG: task type must be a non-empty string, '
                             'got %s in "task": %s' % (quote(task_type), quote(task)))
    if "index" in task:
        task_id = _parse_task_index(task["index"], task)

    if cluster_spec and task_type is not None and task_type != _EVALUATOR:
        if task_type not in cluster_spec.jobs:
            raise ValueError('Invalid TF_CONFIG: task type %s is not a job of "cluster" '
                             '(jobs: %s): %s' % (quote(task_type), quote(cluster_spec.jobs),
                                                 quote(cluster_spec.as_dict())))
        if task_id is not None and task_id not in cluster_spec.task_indices(task_type):
            raise ValueError(
                'Invalid TF_CONFIG: task index %d is out of range for job %s, which has '
                '%d task(s) (indices %s) in "cluster": %s'
                % (task_id, quote(task_type), cluster_spec.num_tasks(task_type),
                   cluster_spec.task_indices(task_type), quote(cluster_spec.as_dict())))

    service = config.get("service")
    if service is not None and not isinstance(service, dict):
        raise ValueError('Invalid TF_CONFIG: "service" must be an object, got %s'
                         % quote(service))
    model_dir = _optional_str(config, "model_dir")
    if model_dir == "":
        raise ValueError("model_dir in TF_CONFIG should be non-empty.")

    return _TFConfig(
        cluster=cluster_spec, task_type=task_type, task_id=task_id,
        environment=_optional_str(config, "environment"),
        rpc_layer=_optional_str(config, "rpc_layer"),
        task=task if "task" in config else None,
        session_master=_optional_str(config, "session_master"),
        eval_session_master=_optional_str(config, "eval_session_master"),
        model_dir=model_dir, service=service, raw=config)


def load_tf_config(environ=None):
    """Parses the TF_CONFIG environment variable ({} when unset)."""
    environ = os.environ if environ is None else environ
    return _parse_tf_config(environ.get(_TF_CONFIG_ENV, "{}"))


class ClusterResolver:
    """Base class, as `tf.distribute.cluster_resolver.ClusterResolver`."""

    task_type = None
    task_id = None
    rpc_layer = None

    def cluster_spec(self):
        """The `ClusterSpec` of the whole cluster."""
        raise NotImplementedError

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        """The address of a task (by default the rendezvous one)."""
        raise NotImplementedError

    @property
    def environment(self):
        return ""

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        """{"GPU": number of local CUDA devices}."""
        del task_type, task_id, config_proto
        import torch

        return {"GPU": torch.cuda.device_count()}


class SimpleClusterResolver(ClusterResolver):
    """Holds what it is given, as `tf.distribute.cluster_resolver.SimpleClusterResolver`."""

    def __init__(self, cluster_spec, master="", task_type=None, task_id=None,
                 environment="", num_accelerators=None, rpc_layer=None):
        if isinstance(cluster_spec, Mapping):
            cluster_spec = ClusterSpec(cluster_spec)
        if not isinstance(cluster_spec, ClusterSpec):
            raise TypeError("cluster_spec must be a ClusterSpec or a dict, got %r"
                            % (cluster_spec,))
        if not isinstance(master, str):
            raise TypeError("master must be a string, got %r" % (master,))
        self._cluster_spec = cluster_spec
        self._master = master
        self.task_type = task_type
        self.task_id = task_id
        self._environment = environment
        self._num_accelerators = num_accelerators
        self.rpc_layer = rpc_layer

    def cluster_spec(self):
        return self._cluster_spec

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        if task_type is not None and task_id is not None:
            master = self._cluster_spec.task_address(task_type, task_id)
        else:
            master = self._master
        return _format_master_url(master, rpc_layer or self.rpc_layer)

    @property
    def environment(self):
        return self._environment

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        return {} if self._num_accelerators is None else self._num_accelerators


class TFConfigClusterResolver(ClusterResolver):
    """Reads TF_CONFIG on each call, as `tf.distribute.cluster_resolver.TFConfigClusterResolver`.

    Constructor arguments override what TF_CONFIG says. Unlike TF,
    `environment` falls back to TF_CONFIG's "environment".
    """

    def __init__(self, task_type=None, task_id=None, rpc_layer=None, environment=None):
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment

    @property
    def task_type(self):
        if self._task_type is not None:
            return str(self._task_type)
        return load_tf_config().task_type

    @task_type.setter
    def task_type(self, task_type):
        self._task_type = task_type

    @property
    def task_id(self):
        if self._task_id is not None:
            return int(self._task_id)
        return load_tf_config().task_id

    @task_id.setter
    def task_id(self, task_id):
        self._task_id = task_id

    @property
    def rpc_layer(self):
        if self._rpc_layer is not None:
            return self._rpc_layer
        return load_tf_config().rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer):
        self._rpc_layer = rpc_layer

    @property
    def environment(self):
        if self._environment is not None:
            return self._environment
        return load_tf_config().environment

    def cluster_spec(self):
        return load_tf_config().cluster

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        """TF_CONFIG's "session_master", '' for a one-task cluster, else the task's address."""
        config = load_tf_config()
        if config.session_master is not None:
            return config.session_master
        cluster = config.cluster
        if not cluster.jobs or (len(cluster.jobs) == 1
                                and cluster.num_tasks(cluster.jobs[0]) == 1):
            return ""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        return _format_master_url(cluster.task_address(task_type, task_id), rpc_layer)


def _env_int(environ, name, default=None):
    value = environ.get(name)
    if value is None:
        if default is None:
            raise ValueError("%s is not set in the environment" % name)
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError("%s must be an integer, got %r" % (name, value)) from None


class _RankedClusterResolver(ClusterResolver):
    """A cluster of `world_size` ranks, rank 0 the chief and the others workers."""

    def _init_ranks(self, rank, world_size, source):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError("%s: rank %d is out of range for world size %d"
                             % (source, rank, world_size))
        self.rank = rank
        self.world_size = world_size
        self.task_type = "chief" if rank == 0 else "worker"
        self.task_id = 0 if rank == 0 else rank - 1

    def _build_cluster(self, addresses):
        cluster = {"chief": addresses[:1]}
        if len(addresses) > 1:
            cluster["worker"] = addresses[1:]
        self._cluster_spec = ClusterSpec(cluster)
        logger.debug("%s: rank %d of %d (%s %d), cluster %r", type(self).__name__, self.rank,
                     self.world_size, self.task_type, self.task_id, self._cluster_spec)

    def cluster_spec(self):
        return self._cluster_spec

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        """The given task's address, by default the chief's (the rendezvous point)."""
        if task_type is not None and task_id is not None:
            address = self._cluster_spec.task_address(task_type, task_id)
        else:
            address = "%s:%d" % (self.master_addr, self.master_port)
        return _format_master_url(address, rpc_layer or self.rpc_layer)


class TorchrunClusterResolver(_RankedClusterResolver):
    """The cluster torchrun describes: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.

    No TF analogue. Rank 0 is the chief, rank r > 0 is worker r - 1. torchrun
    publishes only the rendezvous address, so every task of `cluster_spec()`
    carries MASTER_ADDR:MASTER_PORT; use `rank` and `world_size` for the rest.
    """

    _REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

    def __init__(self, rpc_layer=None, environ=None):
        environ = os.environ if environ is None else environ
        missing = [n for n in self._REQUIRED if n not in environ]
        if missing:
            raise ValueError("torchrun environment incomplete: %s not set"
                             % ", ".join(missing))
        self._init_ranks(_env_int(environ, "RANK"), _env_int(environ, "WORLD_SIZE"),
                         "torchrun environment")
        self.local_rank = _env_int(environ, "LOCAL_RANK", 0)
        self.master_addr = environ["MASTER_ADDR"]
        self.master_port = _env_int(environ, "MASTER_PORT")
        self.rpc_layer = rpc_layer
        self._build_cluster(["%s:%d" % (self.master_addr, self.master_port)] * self.world_size)

    @classmethod
    def in_environment(cls, environ=None):
        """Whether torchrun's variables are set."""
        environ = os.environ if environ is None else environ
        return all(n in environ for n in cls._REQUIRED)


_NODELIST_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _expand_hostlist(nodelist):
    """Expands a SLURM host list: 'node[01-03,7],gpu1' -> node01 node02 node03 node7 gpu1."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(nodelist + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth < 0 or depth > 1:
            raise ValueError("Bad SLURM node list %r: unbalanced brackets" % nodelist)
        if ch == "," and depth == 0:
            if i > start:
                items.extend(_expand_host(nodelist[start:i], nodelist))
            start = i + 1
    if depth:
        raise ValueError("Bad SLURM node list %r: unbalanced brackets" % nodelist)
    return items


def _expand_host(item, nodelist):
    if "[" not in item:
        return [item]
    head, _, rest = item.partition("[")
    body, _, tail = rest.partition("]")
    tails = _expand_host(tail, nodelist) if tail else [""]
    hosts = []
    for part in body.split(","):
        match = _NODELIST_RANGE.match(part.strip())
        if not match:
            raise ValueError("Bad SLURM node list %r: bad range %r" % (nodelist, part))
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(hi) < int(lo):
            raise ValueError("Bad SLURM node list %r: bad range %r" % (nodelist, part))
        width = len(lo)
        for n in range(int(lo), int(hi) + 1):
            hosts.extend("%s%0*d%s" % (head, width, n, t) for t in tails)
    return hosts


def _expand_tasks_per_node(spec, num_nodes):
    """'2(x3),1' -> [2, 2, 2, 1] (SLURM_TASKS_PER_NODE's format)."""
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ValueError("Bad SLURM tasks per node %r" % spec)
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    if len(counts) != num_nodes:
        raise ValueError("SLURM tasks per node %r names %d nodes, the node list has %d"
                         % (spec, len(counts), num_nodes))
    return counts


class SlurmClusterResolver(_RankedClusterResolver):
    """The cluster of a SLURM step, as `tf.distribute.cluster_resolver.SlurmClusterResolver`.

    Reads SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST (or
    SLURM_JOB_NODELIST) and SLURM_STEP_TASKS_PER_NODE (or
    SLURM_TASKS_PER_NODE; else tasks are spread evenly). Tasks are laid out by
    block over the nodes; the j-th task on a node listens on `port + j`. Task 0
    is the chief, task r > 0 is worker r - 1.
    """

    def __init__(self, port=8888, rpc_layer=None, environ=None):
        environ = os.environ if environ is None else environ
        self._init_ranks(_env_int(environ, "SLURM_PROCID"), _env_int(environ, "SLURM_NTASKS"),
                         "SLURM environment")
        self.local_rank = _env_int(environ, "SLURM_LOCALID", 0)
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise ValueError("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set")
        self.hosts = _expand_hostlist(nodelist)
        per_node = (environ.get("SLURM_STEP_TASKS_PER_NODE")
                    or environ.get("SLURM_TASKS_PER_NODE"))
        if per_node:
            counts = _expand_tasks_per_node(per_node, len(self.hosts))
        else:
            even = math.ceil(self.world_size / len(self.hosts))
            counts = [min(even, max(0, self.world_size - i * even))
                      for i in range(len(self.hosts))]
        if sum(counts) != self.world_size:
            raise ValueError("SLURM_NTASKS=%d but the nodes %s hold %s tasks"
                             % (self.world_size, self.hosts, counts))
        addresses = ["%s:%d" % (host, port + j)
                     for host, n in zip(self.hosts, counts) for j in range(n)]
        self.master_addr = self.hosts[0]
        self.master_port = port
        self.rpc_layer = rpc_layer
        self._build_cluster(addresses)

    @classmethod
    def in_environment(cls, environ=None):
        """Whether this process is a task of a SLURM step."""
        environ = os.environ if environ is None else environ
        return "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ


def environment_resolver(environ=None):
    """The cluster a launcher describes in the environment: torchrun's if its
    variables are set, else SLURM's, else None. (TF_CONFIG is read apart.)"""
    environ = os.environ if environ is None else environ
    if TorchrunClusterResolver.in_environment(environ):
        return TorchrunClusterResolver(environ=environ)
    if SlurmClusterResolver.in_environment(environ):
        return SlurmClusterResolver(environ=environ)
    return None
