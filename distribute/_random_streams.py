"""Two random streams for each replica: the input's, alike on every replica,
and the model's, its own.

TF gives each replica's random ops (dropout) seeds of their own, while the
input pipeline's shuffle is one for all. Here the replicas are processes
that draw from torch's one default generator, started alike (one seed, or
forked): every replica drew the same dropout masks, and an input_fn
shuffling with torch (`torch.randperm` in a generator) shuffled alike only
while the models had drawn alike, so a short last batch on one replica made
the next epoch's shards overlap (examples read twice, others never,
silently).

`InputStream.iterate` reads a replica's input: the input_fn's call and its
first batch draw from the stream one process would have (every replica
starts from rank 0's state), so rank 0 goes on as one process would (the
model's weights are drawn as one process's, and are every replica's: the
wrap broadcasts rank 0's); from there the input draws from a stream of its
own, alike on every replica, and every replica but rank 0 reseeds the
default generators (CPU and accelerators) for its model. A DataLoader
ordered by a sampler with a generator of its own (resharded here, or a
DistributedSampler) needs no alike stream: each replica's input then draws
its own, so augmentations differ between replicas (on replicas but rank 0
from the first batch on).

Only the draws of the input code run by the step's thread are separated:
with read-ahead (`RunConfig(experimental_prefetch_batches)`) the input runs
on a thread of its own and its torch draws interleave with the model's;
give such an input_fn a `torch.Generator` of its own.
"""
from __future__ import annotations

import threading
from typing import Iterable, Iterator

import numpy as np
import torch

_END = object()


def _mixed(*entropy: int) -> int:
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


class InputStream:
    """The input's stream on replica `rank`; `seed` (agreed on by the
    replicas) makes it and the model's of every replica but rank 0.
    `alike`: the same on every replica, for an input whose order may come
    from it; else the replica's own (a DataLoader ordered by a sampler of
    its own generator: its per-example draws, augmentations, then differ
    between replicas as TF's one pipeline's do), from the first batch on
    except on rank 0."""

    def __init__(self, seed: int, rank: int, alike: bool = True):
        self._seed, self._rank, self._alike = seed, rank, alike
        self._generator = torch.default_generator
        self._state = None   # the input's, from the split on
        self._owner = threading.get_ident()   # the step's thread
        if rank and not alike:
            self._split()

    def iterate(self, dataset: Iterable, iterate=iter) -> Iterator:
        """`iterate(dataset)`'s items; after the stream's first, each fetched
        in this stream on the step's thread (on a read-ahead thread, as it
        comes). Each call is a pass (an epoch) of one stream."""
        it = self._call(iterate, dataset)
        while True:
            item = self._call(next, it, _END)
            if self._state is None:
                self._split()
            if item is _END:
                return
            yield item

    def _split(self) -> None:
        """The input's stream and the model's go their ways (after the first
        batch, read in one process's stream)."""
        entropy = (self._seed,) if self._alike else (self._seed, self._rank, 1)
        self._state = torch.Generator().manual_seed(_mixed(*entropy)).get_state()
        if self._rank:
            torch.manual_seed(_mixed(self._seed, self._rank))

    def _call(self, fn, *args):
        if self._state is None or threading.get_ident() != self._owner:
            return fn(*args)
        model = self._generator.get_state()
        self._generator.set_state(self._state)
        try:
            return fn(*args)
        finally:
            self._state = self._generator.get_state()
            self._generator.set_state(model)
