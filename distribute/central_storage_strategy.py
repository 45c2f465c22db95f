"""CentralStorageStrategy: variables on one device, compute replicated on the
local devices, synchronous (tf.distribute.experimental.CentralStorageStrategy).

As MirroredStrategy, each compute device runs a replica process and takes
its own batch. Unlike it, the variables and the optimizer's slots have one
home: rank 0 holds the module's master copy on `parameter_device` (the CPU
when there are several compute devices), and only it runs the optimizer.
Each step the replicas' gradients are summed onto rank 0 (`dist.reduce`),
averaged and applied there, and the updated weights are broadcast back
(`dist.broadcast`): TF's "reduce to the parameter device, update, read from
there". Buffers a step moves (batch-norm statistics) are averaged over the
replicas as under MirroredStrategy and copied to the master copy each step.
With the CPU as compute device the master copy is rank 0's module itself.
One compute device: everything on it, no process started.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.distributed as dist

from . import device_util, lookups
from .cross_device_ops import CommunicationOptions, ReductionToOneDevice
from .strategy import free_gradients
from .collective_engine import (_CollectiveExtended, _CollectiveStrategy, _flat_gradients,
                                _gradient_kinds, _local_devices, _set_gradients, _Topology)


class _CentralStorageExtended(_CollectiveExtended):

    def __init__(self, strategy, topology: _Topology, parameter_device: torch.device,
                 timeout: Optional[float]):
        super().__init__(strategy, topology, ReductionToOneDevice(), timeout)
        self._parameter_device = parameter_device
        self._working = {}   # id(master parameter) -> the replica's working parameter
        self._buffers = []   # (master buffer, working buffer): statistics, copied back each step

    @property
    def parameter_devices(self):
        return (str(self._parameter_device),)

    def create_module(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        if (self._group is None or not torch.is_grad_enabled()
                or self._parameter_device == self._device):
            return super().create_module(name, module)
        module.to(self._parameter_device)   # the master copy: saved, and what the optimizer updates
        working = copy.deepcopy(module).to(self._device)
        self._broadcast(list(working.parameters()) + list(working.buffers()))
        self._moving_buffers.watch(working)
        for master, replica in zip(module.parameters(), working.parameters()):
            self._working[id(master)] = replica
        self._buffers += zip(module.buffers(), working.buffers())
        self._copy_to_master(module, working)
        return working

    def _hook_user_steps(self, optimizer) -> None:
        optimizer.register_step_pre_hook(self._to_masters_in_user_step)
        optimizer.register_step_post_hook(self._from_masters_in_user_step)

    def _to_masters_in_user_step(self, optimizer, args, kwargs) -> None:
        """Before an optimizer step of user code (a callable train_op,
        `strategy.run`), as `apply_gradients` does: the replicas' gradients
        reduced onto the master copies, which only replica 0 steps."""
        if not self._user_step:
            return
        masters, working = self._masters_and_working(optimizer)
        flat, local = self._reduced_gradients(working)
        if self._group.rank == 0:
            self._to_masters(masters, flat, local)
        else:
            for m in masters:
                m.grad = None   # (a parameter without a gradient is not stepped)

    def _from_masters_in_user_step(self, optimizer, args, kwargs) -> None:
        """After it: replica 0's new values to every replica's working copy."""
        if not self._user_step:
            return
        masters, working = self._masters_and_working(optimizer)
        if self._group.rank == 0:
            self._copy_back(masters, working)
        self._broadcast(working)
        for w in working:
            w.grad = None
        self._tables_stepped(working)

    @staticmethod
    def _tables_stepped(working) -> None:
        """The rows read of the tables an optimizer just stepped, cleared on
        every replica (only replica 0's optimizer steps, and clears its own)."""
        for table in working:
            if lookups.noted(table):
                lookups.clear(table)

    def _masters_and_working(self, optimizer) -> tuple:
        masters = [p for g in optimizer.param_groups for p in g["params"]]
        return masters, [self._working.get(id(p), p) for p in masters]

    def _reduced_gradients(self, working) -> tuple:
        """(the working copies' gradients summed onto replica 0, as
        `_flat_gradients` gives them; which of them had one here)."""
        local = _gradient_kinds(working)
        flat = _flat_gradients(working)
        dist.reduce(flat, 0)
        return flat, local

    def _to_masters(self, masters, flat, local) -> None:
        """Replica 0: the replicas' mean gradients on the master copies (none
        where no replica had one)."""
        flat.div_(self._group.world_size)
        _set_gradients(masters, flat, local)

    def _copy_back(self, masters, working) -> None:
        """Replica 0, after the step: the masters into the working copies, and
        the working buffers (the replicas' mean statistics) into the masters."""
        with torch.no_grad():
            for m, w in zip(masters, working):
                if w is not m:
                    w.copy_(m)
            for m, w in self._buffers:
                m.copy_(w)

    def _copy_to_master(self, master: torch.nn.Module, working: torch.nn.Module) -> None:
        with torch.no_grad():
            for m, w in zip(master.state_dict().values(), working.state_dict().values()):
                m.copy_(w)

    def apply_gradients(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer):
        if self._group is None:
            return super().apply_gradients(loss, optimizer)
        self._start_step(loss)
        masters, working = self._masters_and_working(optimizer)
        for p in working:
            p.grad = None
        try:
            loss.backward()
            flat, local = self._reduced_gradients(working)
            self._finish_step()   # may stop here, before any update
            if self._group.rank == 0:
                self._to_masters(masters, flat, local)
                optimizer.step()
                free_gradients(optimizer)
                self._copy_back(masters, working)
            self._broadcast(working)
            self._tables_stepped(working)
        except RuntimeError as e:
            raise self._explain(e, "the gradient reduction to the parameter device") from e


class CentralStorageStrategy(_CollectiveStrategy):
    """Variables on one device, compute on several
    (tf.distribute.experimental.CentralStorageStrategy).

        strategy = distribute.CentralStorageStrategy(["cpu:0", "cpu:1"])

    `compute_devices` as MirroredStrategy's `devices` (default every GPU, else
    the CPU); `parameter_device` default: the CPU when there are several
    compute devices, else the compute device.
    """

    def __init__(self, compute_devices=None, parameter_device=None,
                 communication_options: Optional[CommunicationOptions] = None):
        devices, names = _local_devices(compute_devices)
        if parameter_device is None:
            parameter = torch.device("cpu") if len(devices) > 1 else devices[0]
        else:
            parameter = device_util.canonicalize(parameter_device)
        options = communication_options or CommunicationOptions()
        super().__init__(_CentralStorageExtended(self, _Topology(devices, names), parameter,
                                                 options.timeout_seconds))

    def __repr__(self):
        e = self._extended
        return (f"CentralStorageStrategy(compute_devices={list(e.worker_devices)}, "
                f"parameter_device={e._parameter_device})")
