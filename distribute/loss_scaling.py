"""TF2's custom-loop loss helpers (`tf.nn.compute_average_loss`,
`tf.nn.scale_regularization_loss`), ported unchanged.

TF2's optimizer adds the replicas' gradients up, so TF2 divides a replica's
summed loss by the global batch size and a regularization loss by the
replicas in sync: `strategy.reduce(SUM, loss)` is then the global batch's
mean, and the summed gradients are one device's on the global batch. The
strategies here average the replicas' gradients instead (DDP's rule), so
each helper returns TF2's value with its gradient times the replicas in
sync: the reduced loss and the step are TF2's.
"""
from __future__ import annotations

from typing import Optional

import torch

from .strategy import get_strategy, has_strategy, in_cross_replica_context


def compute_average_loss(per_example_loss: torch.Tensor, sample_weight=None,
                         global_batch_size: Optional[int] = None) -> torch.Tensor:
    """The replica's per-example losses (times `sample_weight`) summed and
    divided by `global_batch_size` (default: the replica's batch times the
    replicas in sync), in a replica context (`strategy.run`)."""
    losses = torch.as_tensor(per_example_loss)
    if losses.dim() == 0:
        raise ValueError("compute_average_loss: per_example_loss must have at least rank 1 "
                         "(one loss per example), got a scalar")
    if sample_weight is not None:
        losses = losses * torch.as_tensor(sample_weight, dtype=losses.dtype,
                                          device=losses.device)
    replicas = _replicas("compute_average_loss")
    if global_batch_size is None:
        global_batch_size = losses.shape[0] * replicas
    elif isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) \
            or global_batch_size <= 0:
        raise ValueError(f"compute_average_loss: global_batch_size must be a positive "
                         f"integer, got {global_batch_size!r}")
    if global_batch_size == 0:   # (an empty last batch: TF's div_no_nan gives 0, not NaN)
        return gradients_summed(losses.sum() * 0.0, replicas)
    return gradients_summed(losses.sum() / global_batch_size, replicas)


def scale_regularization_loss(regularization_loss) -> torch.Tensor:
    """A regularization loss (a tensor, or a list of them, summed) divided
    by the replicas in sync, in a replica context."""
    if isinstance(regularization_loss, (list, tuple)):
        total = torch.stack([torch.as_tensor(x).sum() for x in regularization_loss]).sum()
    else:
        total = torch.as_tensor(regularization_loss).sum()
    replicas = _replicas("scale_regularization_loss")
    return gradients_summed(total / replicas, replicas)


def _replicas(name: str) -> int:
    if has_strategy() and in_cross_replica_context():
        raise RuntimeError(f"{name} is called in cross-replica context; call it in the "
                           "function given to strategy.run (a replica context), as in TF2")
    return get_strategy().num_replicas_in_sync


def gradients_summed(loss: torch.Tensor, replicas: int) -> torch.Tensor:
    """`loss`'s value, its gradient times `replicas` (`x - x.detach()` is 0):
    under strategies that average the replicas' gradients, theirs add up."""
    if replicas == 1:
        return loss
    extra = loss * (replicas - 1)
    return loss + (extra - extra.detach())
