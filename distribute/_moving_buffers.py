"""The buffers a training step changes (batch-norm moving statistics) under
synchronous replicas, kept as TF keeps them: each replica updates its copy
with its own batch, and the value read (saved, evaluated, exported) is the
mean over the replicas (TF creates moving averages as SyncOnRead variables
with aggregation MEAN). Here the copies are averaged after every forward
pass, so every replica holds what TF would read: the mean of the replicas'
moving averages equals the moving average of their batches' mean moments.

Which buffers move is learnt on the first step after modules are created:
the floating buffers of every module (layer) whose buffers changed on any
replica (batch-norm's kernels update its statistics without a version bump,
so values are compared); constant buffers (position tables, masks) are
never averaged, so they never drift by rounding. A layer that first moves
at a later step (batch norm used only after a warm-up) joins the average in
that step: the layers left out are watched by their buffers' versions
(batch norm counts its batches in one), which the step's agreement carries.
Their integer buffers (batch norm's `num_batches_tracked`, the weight of a
cumulative average with momentum=None) count every replica's own batches,
the same on each: not averaged, but put back, with the floating ones, after
a step agreed away, which makes no update.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist


class MovingBuffers:
    """Averages the moving buffers of the modules it watches, once per step:
    `start` after the forward pass (an asynchronous sum, in flight during the
    backward pass), `finish` when the step is agreed."""

    def __init__(self):
        self._unsorted: List[_Layer] = []
        self._still: List[_Layer] = []        # layers seen not moving (yet)
        self._still_versions = 0              # the sum of their buffers' versions then
        self._moving: List[torch.Tensor] = []
        self._counters: List[torch.Tensor] = []   # the moving layers' integer buffers
        self._counted: List[torch.Tensor] = []    # their values after the last step made
        self._sum: Optional[_Flat] = None     # the step's sum
        self._mean: Optional[_Flat] = None    # the last step's mean
        self._have_mean = False
        self._work = None

    def watch(self, module: torch.nn.Module) -> None:
        """A module every replica has just created (and synchronized). A
        layer whose `same_buffers_on_replicas` is true updates its buffers
        alike on every replica (from values it all-reduced itself, in a
        train_op): never averaged (an average of them, taken after the
        forward pass, would undo the train_op's update)."""
        self._unsorted += [_Layer(m) for m in module.modules()
                           if next(m.buffers(recurse=False), None) is not None
                           and not getattr(m, "same_buffers_on_replicas", False)]

    def start(self, group) -> None:
        """After the step's forward pass: start summing the moving buffers."""
        if self._unsorted:
            self._learn(group)
        if not self._moving:
            return
        if self._sum is None:
            self._sum, self._mean = _Flat(self._moving), _Flat(self._moving)
        torch._foreach_copy_(self._sum.pieces, self._moving)
        self._work = group.start_sum(self._sum.flat)

    def moved_late(self) -> bool:
        """Whether a layer seen not moving has changed on this replica since
        (after the step's forward pass; for the step's agreement to carry)."""
        return bool(self._still) and _versions(self._still) != self._still_versions

    def finish(self, group, step_made: bool, moved_late: bool = False) -> None:
        """The sum is in: every replica takes the mean. A step agreed away
        (`step_made` False: a replica asked to stop) makes no update, so its
        forward pass's change is undone: the buffers go back to the last mean
        (kept as they are on the first step of a training, which has none).
        `moved_late`: a replica's `moved_late()` was true in this step."""
        work, self._work = self._work, None
        if work is not None:
            work.wait()
            if step_made:
                self._sum, self._mean = self._mean, self._sum
                self._mean.flat.mul_(1.0 / group.world_size)
                self._have_mean = True
            if self._have_mean:
                torch._foreach_copy_(self._moving, self._mean.pieces)
        if moved_late:
            self._join(group, step_made)
        if self._counters:
            if step_made:
                torch._foreach_copy_(self._counted, self._counters)
            else:
                torch._foreach_copy_(self._counters, self._counted)

    def _join(self, group, step_made: bool) -> None:
        """Add the layers that moved after the first step (on any replica) to
        the averaged ones, their buffers made the mean over the replicas now
        (TF's reading of them), or, on a step agreed away, put back as they
        were (unchanged until this step)."""
        moved = torch.tensor([float(layer.bumped()) for layer in self._still])
        dist.all_reduce(moved, op=dist.ReduceOp.MAX, group=group.control)
        joining, still = [], []
        for layer, flag in zip(self._still, moved.tolist()):
            (joining if flag else still).append(layer)
        self._still, self._still_versions = still, _versions(still)
        for layer in joining:
            if not step_made:
                layer.restore()
        self._count(joining)
        buffers = [b for layer in joining for b in layer.floating]
        if not buffers:
            return
        if step_made:
            mean = _Flat(buffers)
            torch._foreach_copy_(mean.pieces, buffers)
            group.start_sum(mean.flat).wait()
            mean.flat.mul_(1.0 / group.world_size)
            torch._foreach_copy_(buffers, mean.pieces)
        self._moving += buffers
        self._sum, self._mean = _Flat(self._moving), _Flat(self._moving)
        if self._have_mean:   # the last mean, of the layers averaged before and these
            torch._foreach_copy_(self._mean.pieces, self._moving)

    def _learn(self, group) -> None:
        """The layers whose buffers changed on any replica (one all-reduce,
        so that every replica sums the same list); the others are constant."""
        changed = torch.tensor([float(layer.changed()) for layer in self._unsorted])
        dist.all_reduce(changed, op=dist.ReduceOp.MAX, group=group.control)
        for layer, moved in zip(self._unsorted, changed.tolist()):
            if moved:
                self._moving += layer.floating
                self._count([layer])
            else:
                self._still.append(layer)
        self._still_versions = _versions(self._still)
        self._unsorted = []
        self._sum = self._mean = None
        self._have_mean = False

    def _count(self, layers: List["_Layer"]) -> None:
        """Put the integer buffers of `layers` among the counters, with
        their values now as the last kept."""
        counters = [b for layer in layers for b in layer.counters]
        self._counters += counters
        self._counted += [b.detach().clone() for b in counters]


class _Layer:
    """A module's own buffers as they were when it was created."""

    def __init__(self, module: torch.nn.Module):
        own = list(module.buffers(recurse=False))
        self.floating = [b for b in own if b.is_floating_point()]
        self.counters = [b for b in own if not b.is_floating_point() and not b.is_complex()
                         and b.dtype != torch.bool]
        self._before = [(b, b._version, b.detach().clone()) for b in own]

    def changed(self) -> bool:
        return any(b._version != version or not torch.equal(b, copy)
                   for b, version, copy in self._before)

    def bumped(self) -> bool:
        """Changed by a counted in-place update (cheap: no values compared)."""
        return any(b._version != version for b, version, _ in self._before)

    def restore(self) -> None:
        """The buffers' values as they were when the module was created."""
        with torch.no_grad():
            for b, _, copy in self._before:
                b.copy_(copy)


def _versions(layers: List[_Layer]) -> int:
    return sum(b._version for layer in layers for b, _, _ in layer._before)


class _Flat:
    """One float64 tensor on the buffers' device, viewed as one piece per buffer."""

    def __init__(self, buffers: List[torch.Tensor]):
        self.flat = torch.empty(sum(b.numel() for b in buffers), dtype=torch.float64,
                                device=buffers[0].device)
        self.pieces, offset = [], 0
        for b in buffers:
            self.pieces.append(self.flat[offset:offset + b.numel()].view(b.shape))
            offset += b.numel()
