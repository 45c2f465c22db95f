"""The rows of a table that a training step's lookups read.

TF's ``embedding_lookup`` gives a sparse gradient (IndexedSlices) of the rows
it read, and the optimizers' sparse applies update those rows alone (a row
read whose gradient is zero included). A dense gradient says only which rows
are non-zero, so a lookup notes the ids it read on the table (`note`: kept
as they are, made a mask of rows when an optimizer asks, `rows`), and
they are cleared when an optimizer steps the table (`stepped`), a step
is skipped (`clear`) or a backward pass finds the table's gradient set
aside since the last one: the rows of several micro-batches before a step
are all its rows, those of a gradient set aside are not. A table made by a
feature column is declared where it is made (`declare`): under a
data-parallel strategy the Estimator's step makes its rows the union over
the replicas (`agree`), as TF's reduction of IndexedSlices gathers every
replica's rows, while an optimizer asks for them (`asks`); a table only
noted is known to each replica alone (`agreed` is False).
"""
from __future__ import annotations

import functools
from typing import List, Optional

import torch
import torch.distributed as dist

_IDS = "_rows_read_ids"        # on the table: [(ids, first row)] noted since the last clear
_ROWS = "_rows_read"           # on it: a bool mask of its rows (made by `rows`)
_AGREED = "_rows_read_agreed"  # on it: the mask is the union over the replicas
_DECLARED = "_rows_read_declared"
_UNASKED = "_rows_read_unasked"  # on it: no optimizer asks for them (torch's own)
_NOTES = "_rows_read_notes"    # on it: notes since an optimizer last asked or cleared
_ASKED = "_rows_read_asked"    # on it: an optimizer asked for its rows since `asks`
_SINCE_ASKED = "_rows_read_since_asked"  # on it: agreements in a row nobody asked for
_EVER_ASKED = "_rows_read_ever_asked"  # on it: an optimizer asked, or will (`will_ask`)
_TAKEN = "_rows_read_taken"    # on it: how many of its first notes a backward pass took
_HOOKED = "_rows_read_hooked"  # on it: the backward hooks below are registered
_PENDING = 64                  # notes kept as they are before those taken join the mask
_UNASKED_AFTER = 4096          # notes nothing asked for before a table's are not kept
_LEFT_OUT_AFTER = 100          # agreements nobody asked for before a table is left out


def declare(table: torch.Tensor) -> torch.Tensor:
    """`table` is read by lookups that note their rows, on every replica
    alike (a feature column's table): its rows are agreed over the replicas."""
    setattr(table, _DECLARED, True)
    return table


@torch.compiler.disable   # (attributes of a parameter: outside a compiled graph)
def note(table: torch.Tensor, ids: torch.Tensor, first_row: Optional[int] = None) -> None:
    """Note that a lookup read the rows `ids` (indices, or a boolean mask of
    the rows) of `table` in a training step; `first_row`: `ids` index a
    concatenation of tables in which `table`'s rows start there. Nothing
    without gradients or for a frozen table."""
    if not (table.requires_grad and torch.is_grad_enabled()):
        return
    d = table.__dict__
    if d.get(_UNASKED):
        return
    if _HOOKED not in d:   # (the agreement of the replicas may have made _IDS before)
        d[_HOOKED] = True
        table.register_hook(functools.partial(_backward_begins, table))
        table.register_post_accumulate_grad_hook(_backward_took)
    pending = d.setdefault(_IDS, [])
    pending.append((ids, first_row))
    d[_NOTES] = d.get(_NOTES, 0) + 1
    if d[_NOTES] > _UNASKED_AFTER and not d.get(_EVER_ASKED):   # no optimizer asks for
        clear(table)                                             # them (torch's): not kept
        d[_UNASKED] = True
    elif len(pending) > _PENDING:   # (the mask holds rows taken by backward passes
        _fold_taken(table)           # alone: those read since stay apart)
        if len(pending) > _UNASKED_AFTER:   # (notes no backward pass takes: bounded)
            _mask(table)


def _backward_begins(table: torch.Tensor, grad: torch.Tensor) -> None:
    """A backward pass reaches `table`: with its gradient set aside since
    the last one (`.grad = None`, `zero_grad()`: a step not taken), the rows
    read for that gradient are dropped with it, those read since kept."""
    if table.grad is None:
        set_aside(table)


def set_aside(table: torch.Tensor) -> None:
    """`table`'s gradient is set aside (a step not taken): the rows a
    backward pass took for it are dropped, those read since kept; called by
    a backward pass finding it None, and by an optimizer zeroing it in place
    (`zero_grad(set_to_none=False)`) without a step."""
    d = table.__dict__
    del d[_IDS][:d.get(_TAKEN, 0)]
    d[_TAKEN] = 0
    if _ROWS in d:
        d[_ROWS].zero_()


def _backward_took(table: torch.Tensor) -> None:
    """A backward pass added the gradient of the rows noted so far."""
    d = table.__dict__
    d[_TAKEN] = len(d[_IDS])


def will_ask(table: torch.Tensor) -> None:
    """An optimizer that takes the rows read (`rows`, `stepped`) steps
    `table`: its lookups' notes are kept however many backward passes come
    before that optimizer's first step (and resume, if they had stopped)."""
    table.__dict__[_EVER_ASKED] = True
    table.__dict__.pop(_UNASKED, None)


def noted(table: torch.Tensor) -> bool:
    """Whether `table` is declared or a lookup noted its rows."""
    d = table.__dict__
    return _IDS in d or _DECLARED in d


def rows(table: torch.Tensor) -> Optional[torch.Tensor]:
    """The mask of the rows read since the last `clear`, or None for a
    tensor not `noted` (an optimizer asking: its notes are kept)."""
    d = table.__dict__
    if not noted(table):
        return None
    d.pop(_UNASKED, None)
    d[_NOTES] = 0
    d[_ASKED] = d[_EVER_ASKED] = True
    return _mask(table)


def _mask(table: torch.Tensor, notes: Optional[int] = None) -> torch.Tensor:
    """The table's mask with its first `notes` notes (all by default) made
    part of it. Outside an optimizer's step (which clears it), it holds rows
    taken by backward passes alone."""
    d = table.__dict__
    mask = d.get(_ROWS)
    if mask is None or mask.device != table.device:
        mask = torch.zeros(len(table), dtype=torch.bool, device=table.device)
        setattr(table, _ROWS, mask)
    pending = d.get(_IDS, [])
    _fold(mask, pending[:notes])
    del pending[:notes]
    d[_TAKEN] = 0
    return mask


def _fold_taken(table: torch.Tensor) -> None:
    """The notes a backward pass took made part of the mask."""
    if table.__dict__.get(_TAKEN, 0):
        _mask(table, table.__dict__[_TAKEN])


def _fold(mask: torch.Tensor, notes) -> torch.Tensor:
    """`mask` with the rows of `notes` ([(ids, first row)]) set."""
    for ids, first_row in notes:
        if ids.dtype == torch.bool:
            mask |= ids
            continue
        ids = ids.reshape(-1).to(mask.device)
        if first_row is not None:
            ids = ids - first_row
            ids = ids[(ids >= 0) & (ids < len(mask))]
        mask.index_fill_(0, ids, True)
    return mask


def received(table: torch.Tensor, mask: torch.Tensor) -> None:
    """The rows `mask` of `table` are those a trainer's step read (a ps task
    applying that step, as TF's ps applies a worker's IndexedSlices): its
    rows read until the next `clear`, for that step alone."""
    clear(table)
    d = table.__dict__
    d[_IDS] = [(mask, None)]
    d[_AGREED] = True


def agreed(table: torch.Tensor) -> bool:
    """Whether `rows(table)` is the union over the replicas."""
    return table.__dict__.get(_AGREED, False)


def clear(table: torch.Tensor) -> None:
    """Forget the rows read (a step made with them, or skipped)."""
    d = table.__dict__
    d.get(_IDS, []).clear()
    d[_TAKEN] = 0
    if _ROWS in d:
        d[_ROWS].zero_()
    d[_AGREED] = False
    d[_NOTES] = 0


def stepped(table: torch.Tensor) -> None:
    """An optimizer that takes the rows read (TF's sparse apply, whether it
    needed them this step or not) stepped `table`: `clear`, and count its
    rows asked for (`asks`)."""
    clear(table)
    table.__dict__[_ASKED] = table.__dict__[_EVER_ASKED] = True


def tables(modules) -> List[torch.Tensor]:
    """The declared tables among the parameters of `modules`."""
    return [p for m in modules for p in m.parameters() if _DECLARED in p.__dict__]


def agree(declared: List[torch.Tensor], group=None) -> None:
    """Make the rows read of the `declared` tables (the same, in the same
    order, on every replica) the union over the replicas of `group`: one
    all-reduce. A table whose rows no replica's optimizer asked for in its
    last 100 agreements (one of torch's optimizers steps it: see `asks`) is
    left out until one asks again (that step, the rows with a gradient)."""
    kept = []
    for table in declared:
        if table.__dict__.get(_SINCE_ASKED, 0) < _LEFT_OUT_AFTER:
            kept.append(table)
        else:   # (each replica's own rows now)
            setattr(table, _AGREED, False)
    declared = kept
    if not declared:
        return
    # Per table: the rows backward passes took (dropped with a gradient set
    # aside) and those read since, apart.
    parts = []
    for table in declared:
        mask = _mask(table, table.__dict__.get(_TAKEN, 0))
        parts += [mask, _fold(torch.zeros_like(mask), table.__dict__.get(_IDS, []))]
    flat = torch.cat(parts).to(torch.uint8)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    offset = 0
    for table, part in zip(declared, parts[1::2]):
        table.__dict__[_ROWS].copy_(flat[offset:offset + len(part)].bool())
        part.copy_(flat[offset + len(part):offset + 2 * len(part)].bool())
        offset += 2 * len(part)
        table.__dict__[_IDS] = [(part, None)]   # (not taken yet)
        table.__dict__[_AGREED] = True


def asks(declared: List[torch.Tensor]) -> List[float]:
    """For each of the `declared` tables, 1.0 if an optimizer asked for its
    rows (`rows`, `stepped`) since the last call, else 0.0: summed over the replicas
    (with the step's other flags) and given to `asked`, every replica
    learns whether any asked, as central storage's replica 0 alone steps."""
    return [1.0 if t.__dict__.pop(_ASKED, False) else 0.0 for t in declared]


def asked(declared: List[torch.Tensor], sums) -> None:
    """`asks`' flags summed over the replicas: a table nobody asked for
    counts one more agreement unused (the same count on every replica)."""
    for table, n in zip(declared, sums):
        d = table.__dict__
        d[_SINCE_ASKED] = 0 if n > 0 else d.get(_SINCE_ASKED, 0) + 1
