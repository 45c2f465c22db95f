"""The rows of a table that a training step's lookups read.

TF's ``embedding_lookup`` gives a sparse gradient (IndexedSlices) of the rows
it read, and the optimizers' sparse applies update those rows alone (a row
read whose gradient is zero included). A dense gradient says only which rows
are non-zero, so a lookup notes its rows on the table (`note`), an optimizer
reads them (`rows`) and clears them after its step (`clear`), and under a
data-parallel strategy the Estimator's step makes them the union over the
replicas (`agree`), as TF's reduction of IndexedSlices gathers every
replica's rows. Until agreed, a replica knows only its own (`agreed`); the
next step's first lookup clears agreed rows no optimizer step cleared (a
replica that does not step: CentralStorageStrategy's others).
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist

_ROWS = "_rows_read"           # on the table tensor: a bool mask of its rows
_AGREED = "_rows_read_agreed"  # on it: the mask is the union over the replicas


def note(table: torch.Tensor, ids: torch.Tensor) -> None:
    """Note that a lookup read the rows `ids` (indices, or a boolean mask of
    the rows) of `table`, in a training step: nothing without gradients or
    for a frozen table."""
    if not (table.requires_grad and torch.is_grad_enabled()):
        return
    mask = table.__dict__.get(_ROWS)
    if mask is None or mask.device != table.device:
        mask = torch.zeros(len(table), dtype=torch.bool, device=table.device)
        setattr(table, _ROWS, mask)
    elif agreed(table):   # a step's rows a replica without an optimizer step kept
        clear(table)
    if ids.dtype == torch.bool:
        mask |= ids
    else:
        mask.index_fill_(0, ids.reshape(-1), True)


def rows(table: torch.Tensor) -> Optional[torch.Tensor]:
    """The mask of the rows read since the last `clear`, or None for a
    tensor no lookup noted."""
    return table.__dict__.get(_ROWS)


def agreed(table: torch.Tensor) -> bool:
    """Whether `rows(table)` is the union over the replicas."""
    return table.__dict__.get(_AGREED, False)


def clear(table: torch.Tensor) -> None:
    mask = table.__dict__.get(_ROWS)
    if mask is not None:
        mask.zero_()
        setattr(table, _AGREED, False)


def tables(modules) -> List[torch.Tensor]:
    """The parameters of `modules` whose lookups were noted."""
    return [p for m in modules for p in m.parameters() if rows(p) is not None]


def agree(noted: List[torch.Tensor], group=None) -> None:
    """Make the masks of `noted` (the same tables, in the same order, on
    every replica) the union over the replicas of `group`: one all-reduce."""
    masks = [rows(t) for t in noted]
    flat = torch.cat(masks).to(torch.uint8)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    offset = 0
    for table, mask in zip(noted, masks):
        mask.copy_(flat[offset:offset + len(mask)].bool())
        setattr(table, _AGREED, True)
        offset += len(mask)
