"""MultiWorkerMirroredStrategy (alias CollectiveAllReduceStrategy):
synchronous data parallelism across the chief and workers of a cluster
(tf.distribute.MultiWorkerMirroredStrategy).

The cluster comes from a cluster resolver: TF_CONFIG by default, torchrun's
environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) or SLURM's when set. The
chief and workers form one torch.distributed group: the chief hosts the
rendezvous store at its own address, every task registers there, and one
that does not arrive within the timeout is named with its address. Ranks:
the chief is 0, worker i is i + 1 (worker i is i when the cluster has no
chief). `ps` tasks have no place here; an `evaluator` task evaluates alone.

Each TF_CONFIG task uses every local GPU (one replica process per GPU, forked
as MirroredStrategy does), or its CPU; under torchrun or SLURM each process
is one replica on `cuda:LOCAL_RANK` (or the CPU). Everything else (DDP,
agreeing to stop, input sharding, chief-only writing) is MirroredStrategy's;
see `collective_engine`.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from . import cluster_resolver as cr
from .cross_device_ops import (CommunicationImplementation, CommunicationOptions,
                               _from_implementation)
from .collective_engine import _CollectiveExtended, _CollectiveStrategy, _local_devices, _Topology

logger = logging.getLogger(__name__)


def _default_resolver() -> cr.ClusterResolver:
    """TF_CONFIG's cluster if it has one, else torchrun's, else SLURM's, else
    TF_CONFIG's (a cluster of this process alone)."""
    if cr.load_tf_config().cluster:
        return cr.TFConfigClusterResolver()
    return cr.environment_resolver() or cr.TFConfigClusterResolver()


def _topology(resolver: cr.ClusterResolver) -> _Topology:
    if hasattr(resolver, "world_size"):   # torchrun / SLURM: one process per device
        rank, world = resolver.rank, resolver.world_size
        local = getattr(resolver, "local_rank", 0)
        device = (torch.device("cuda", local) if torch.cuda.device_count() > local
                  else torch.device("cpu"))
        spec = resolver.cluster_spec()
        tasks = [("chief", 0)] + [("worker", r - 1) for r in range(1, world)]
        names = [f"{t}:{i} at {spec.task_address(t, i)}" for t, i in tasks]
        return _Topology([device], [str(device)], world, rank, resolver.master_addr,
                         resolver.master_port, names, f"{resolver.task_type}:{resolver.task_id}",
                         env_rendezvous=isinstance(resolver, cr.TorchrunClusterResolver))
    spec = resolver.cluster_spec()
    task_type, task_id = resolver.task_type, resolver.task_id
    devices, device_names = _local_devices(None)
    if not spec or task_type == "evaluator":
        return _Topology(devices, device_names)
    if task_type == "ps":
        raise ValueError("MultiWorkerMirroredStrategy has no parameter servers: this task is "
                         "ps:%s; use ParameterServerStrategy for a cluster with ps tasks"
                         % task_id)
    chief_job = "chief" if "chief" in spec.jobs else "master" if "master" in spec.jobs else None
    tasks = [(chief_job, i) for i in spec.task_indices(chief_job)] if chief_job else []
    if "worker" in spec.jobs:
        tasks += [("worker", i) for i in spec.task_indices("worker")]
    if (task_type, task_id) not in tasks:
        raise ValueError(f"This task, {task_type}:{task_id}, is not a chief or worker of the "
                         f"cluster {spec.as_dict()}")
    names = [f"{t}:{i} at {spec.task_address(t, i)}" for t, i in tasks]
    host, port = cr.split_address(spec.task_address(*tasks[0]), names[0])
    return _Topology(devices, device_names, len(tasks), tasks.index((task_type, task_id)), host,
                     port, names, f"{task_type}:{task_id}")


class MultiWorkerMirroredStrategy(_CollectiveStrategy):
    """Synchronous training across workers (tf.distribute.MultiWorkerMirroredStrategy).

        # every task runs the same program with its own TF_CONFIG
        strategy = distribute.MultiWorkerMirroredStrategy()
        est.Estimator(model_fn, config=est.RunConfig(train_distribute=strategy)).train(...)

    `cluster_resolver`: default TF_CONFIG, torchrun or SLURM (in that order,
    whichever describes a cluster). `communication_options`
    (`CommunicationOptions(timeout_seconds=..., implementation=...)`) or TF1's
    `communication=CommunicationImplementation.AUTO|RING|NCCL`: AUTO is NCCL on
    GPUs and gloo on CPUs, RING gloo, NCCL NCCL. The process group is joined
    at the first train/evaluate call (or `call_for_each_replica`), within
    `timeout_seconds` (default 1800).
    """

    def __init__(self, cluster_resolver: Optional[cr.ClusterResolver] = None,
                 communication_options: Optional[CommunicationOptions] = None,
                 communication: Optional[CommunicationImplementation] = None):
        if isinstance(cluster_resolver, (CommunicationImplementation, str)):
            communication, cluster_resolver = cluster_resolver, None   # TF1's argument order
        if cluster_resolver is not None and not isinstance(cluster_resolver, cr.ClusterResolver):
            raise TypeError(f"cluster_resolver must be a ClusterResolver, got {cluster_resolver!r}")
        options = communication_options or CommunicationOptions()
        implementation = CommunicationImplementation(
            communication.value if isinstance(communication, CommunicationImplementation)
            else communication) if communication is not None else options.implementation
        self._cluster_resolver = cluster_resolver or _default_resolver()
        topology = _topology(self._cluster_resolver)
        super().__init__(_CollectiveExtended(self, topology, _from_implementation(implementation),
                                             options.timeout_seconds))

    @property
    def cluster_resolver(self) -> cr.ClusterResolver:
        return self._cluster_resolver

    def __repr__(self):
        topo = self._extended._topology
        return (f"MultiWorkerMirroredStrategy(task={topo.role!r}, tasks={topo.num_tasks}, "
                f"devices={list(self._extended.worker_devices)})")


CollectiveAllReduceStrategy = MultiWorkerMirroredStrategy   # TF1 name
