"""How gradients cross devices: the torch.distributed backend and algorithm
(tf.distribute.CrossDeviceOps, CommunicationImplementation, CommunicationOptions).

TF picks an all-reduce implementation per strategy; here every choice maps to
PyTorch's own engine:

| TF | here |
|---|---|
| `NcclAllReduce(num_packs)` | NCCL backend; DDP's bucketed all-reduce, overlapped with backward |
| `HierarchicalCopyAllReduce(num_packs)` | NCCL backend with `NCCL_ALGO=Tree` (NCCL's hierarchical tree) |
| `ReductionToOneDevice(reduce_to_device)` | gradients summed onto one replica (`dist.reduce`) then broadcast back (`dist.broadcast`); gloo on CPU, NCCL on GPU; not overlapped with backward |
| default (`None`) | DDP's bucketed all-reduce: NCCL on GPUs, gloo on CPUs |
| `CommunicationImplementation.AUTO/RING/NCCL` | NCCL on GPUs else gloo / gloo (its ring all-reduce) / NCCL |

`num_packs` sets DDP's bucket count through `bucket_cap_mb` (TF packs
gradients into that many chunks before reducing them).
"""
from __future__ import annotations

import enum
from typing import Optional


class CommunicationImplementation(enum.Enum):
    """Collective implementation for MultiWorkerMirroredStrategy
    (tf.distribute.experimental.CommunicationImplementation)."""

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


CollectiveCommunication = CommunicationImplementation  # TF1 name


class CommunicationOptions:
    """Options of the collectives (tf.distribute.experimental.CommunicationOptions).

    `timeout_seconds` bounds the rendezvous and every collective: a replica
    that does not arrive, dies or hangs makes the others fail after that long
    with an error naming it (default 1800 s, torch.distributed's own).
    `bytes_per_pack` sets DDP's bucket size (0: DDP's default, 25 MB).
    """

    def __init__(self, bytes_per_pack: int = 0, timeout_seconds: Optional[float] = None,
                 implementation=CommunicationImplementation.AUTO):
        if bytes_per_pack < 0:
            raise ValueError(f"bytes_per_pack must be non-negative, got {bytes_per_pack}")
        if timeout_seconds is not None and timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        self.bytes_per_pack = bytes_per_pack
        self.timeout_seconds = timeout_seconds
        self.implementation = CommunicationImplementation(
            implementation.value if isinstance(implementation, enum.Enum) else implementation)

    def __repr__(self):
        return (f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, "
                f"timeout_seconds={self.timeout_seconds}, "
                f"implementation={self.implementation.name})")


class CrossDeviceOps:
    """Base of the cross-device reductions (tf.distribute.CrossDeviceOps).

    A strategy asks it for the backend of its devices (`_backend`), whether
    gradients go through DDP's all-reduce or are reduced to one replica
    (`_reduce_to_one`), DDP's bucket size and extra environment for NCCL.
    """

    _reduce_to_one = False
    _nccl_env: dict = {}

    def __init__(self, num_packs: int = 1):
        if num_packs < 1:
            raise ValueError(f"num_packs must be at least 1, got {num_packs}")
        self.num_packs = num_packs

    def _backend(self, device_type: str) -> str:
        return "nccl" if device_type == "cuda" else "gloo"

    def _bucket_cap_mb(self, model_bytes: int) -> Optional[float]:
        """DDP's bucket size for `num_packs` packs (None: DDP's default)."""
        if self.num_packs == 1:
            return None
        return max(model_bytes / self.num_packs / 2 ** 20, 1.0)

    def __repr__(self):
        return f"{type(self).__name__}(num_packs={self.num_packs})"


class _DefaultAllReduce(CrossDeviceOps):
    """DDP's all-reduce: NCCL on GPUs, gloo on CPUs."""


class _GpuOnly(CrossDeviceOps):
    def _backend(self, device_type: str) -> str:
        if device_type != "cuda":
            raise ValueError(f"{type(self).__name__} reduces with NCCL, which needs GPU "
                             f"devices; the replicas are on {device_type!r}. Use the "
                             "default (gloo) or ReductionToOneDevice on CPUs")
        return "nccl"


class NcclAllReduce(_GpuOnly):
    """NCCL all-reduce of the gradients, bucketed and overlapped with backward
    by DDP (tf.distribute.NcclAllReduce)."""


class HierarchicalCopyAllReduce(_GpuOnly):
    """NCCL with its hierarchical tree algorithm, `NCCL_ALGO=Tree`
    (tf.distribute.HierarchicalCopyAllReduce)."""

    _nccl_env = {"NCCL_ALGO": "Tree"}


class ReductionToOneDevice(CrossDeviceOps):
    """Sum the gradients onto one replica, then broadcast the result
    (tf.distribute.ReductionToOneDevice): `dist.reduce` + `dist.broadcast` of
    the flattened gradients after backward. `reduce_to_device` names the
    device (one of the strategy's) that receives the sum (default: the first)."""

    _reduce_to_one = True

    def __init__(self, reduce_to_device: Optional[str] = None, accumulation_fn=None):
        super().__init__()
        self.reduce_to_device = reduce_to_device

    def __repr__(self):
        return f"ReductionToOneDevice(reduce_to_device={self.reduce_to_device!r})"


def _from_implementation(implementation: CommunicationImplementation) -> CrossDeviceOps:
    """MultiWorkerMirroredStrategy's `communication` -> cross-device ops."""
    if implementation == CommunicationImplementation.NCCL:
        return NcclAllReduce()
    if implementation == CommunicationImplementation.RING:
        return _RingAllReduce()
    return _DefaultAllReduce()


class _RingAllReduce(CrossDeviceOps):
    """gloo's ring all-reduce, on CPU and GPU tensors alike (TF's RING)."""

    def _backend(self, device_type: str) -> str:
        return "gloo"
