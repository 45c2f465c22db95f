"""Input distribution across replicas (tf.distribute's input_lib and
AutoShardPolicy).

- `shard`: the input of one replica when `input_fn` did not take an
  `input_context`. A `DataLoader` over a map-style dataset is rebuilt on a
  sampler that keeps every n-th example of the (shuffled) order (TF's
  AutoShardPolicy.FILE idea: read only your part); anything else is read
  whole and every n-th batch kept, with a warning (AutoShardPolicy.DATA).
  Nothing is padded, so no example is seen twice and evaluation is exact;
  shards may differ in length by one batch.
- `TrainBatches`: a replica's training input, one batch ahead, so the
  replicas can agree to stop when any of them has no next batch (uneven
  shards end training for all at the same step instead of hanging).
- `EvalBatches`: a replica's evaluation batches; one whose shard has none
  gets an empty batch to build its model_fn's metrics on (TF's partial batch).
- `SplitBatches` / `AgreedBatches`: what `experimental_distribute_dataset`
  and `distribute_datasets_from_function` return in a custom loop.
"""
from __future__ import annotations

import hashlib
import inspect
import logging
from typing import Callable, Iterable, Optional

import numpy as np
import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, IterableDataset,
                              RandomSampler, Sampler, SequentialSampler)

logger = logging.getLogger(__name__)

_END = object()


def takes_input_context(input_fn: Callable) -> bool:
    """Whether `input_fn` declares an `input_context` argument (then it shards itself)."""
    try:
        return "input_context" in inspect.signature(input_fn).parameters
    except (TypeError, ValueError):
        return False


def _iterate(dataset):
    try:
        return iter(dataset)
    except TypeError:
        raise TypeError(f"input_fn must return an iterable of batches (a DataLoader, a "
                        f"generator, a list), got {type(dataset).__name__}") from None


# -- sharding --------------------------------------------------------------------------
class ShardSampler(Sampler):
    """Every `num_shards`-th example of a (shuffled) order, from `index` on;
    no padding. The order is the same on every replica (seeded with `seed`);
    each pass (`__iter__`) is a new epoch, shuffled anew, and `set_epoch`
    sets it as DistributedSampler's does."""

    def __init__(self, num_examples: int, num_shards: int, index: int, shuffle: bool,
                 seed: int = 0):
        self.num_examples, self.num_shards, self.index = num_examples, num_shards, index
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_examples, generator=g)[self.index::self.num_shards]
            self.epoch += 1
            return iter(order.tolist())
        self.epoch += 1
        return iter(range(self.index, self.num_examples, self.num_shards))

    def __len__(self):
        return len(range(self.index, self.num_examples, self.num_shards))


class ShardBatchSampler(Sampler):
    """Every `num_shards`-th batch of a (shuffled) order cut into batches of
    `batch_size`, from `index` on: the replicas read, in turn, the very
    batches one process reads (as TF's Estimator hands them whole batches),
    so that a mean over batches (the evaluation loss) is one process's."""

    def __init__(self, num_examples: int, batch_size: int, drop_last: bool, num_shards: int,
                 index: int, shuffle: bool, seed: int = 0):
        self.sampler = ShardSampler(num_examples, 1, 0, shuffle, seed)   # the whole order
        self.batch_size, self.drop_last = batch_size, drop_last
        self.num_shards, self.index = num_shards, index

    def _batches(self, order: list) -> list:
        size = self.batch_size
        batches = [order[i:i + size] for i in range(0, len(order), size)]
        if self.drop_last and batches and len(batches[-1]) < size:
            batches.pop()
        return batches[self.index::self.num_shards]

    def __iter__(self):
        return iter(self._batches(list(self.sampler)))

    def __len__(self):
        return len(self._batches(list(range(self.sampler.num_examples))))


def _reshard_loader(loader: DataLoader, num_shards: int, index: int, seed: int,
                    by_batch: bool) -> Optional[DataLoader]:
    """`loader` rebuilt on a ShardSampler (every n-th example) or, `by_batch`,
    a ShardBatchSampler (every n-th batch); None if its sampling cannot be
    sharded that way (iterable dataset, custom sampler or batch sampler)."""
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
        return None
    if type(loader.batch_sampler) is not BatchSampler:
        return None
    sampler = loader.sampler
    if type(sampler) is RandomSampler and not sampler.replacement \
            and sampler._num_samples is None:
        shuffle = True
    elif type(sampler) is SequentialSampler:
        shuffle = False
    else:
        return None
    kwargs = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                  pin_memory=loader.pin_memory, timeout=loader.timeout,
                  worker_init_fn=loader.worker_init_fn,
                  multiprocessing_context=loader.multiprocessing_context,
                  persistent_workers=loader.persistent_workers)
    if loader.num_workers:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if by_batch:
        return DataLoader(loader.dataset, batch_sampler=ShardBatchSampler(
            len(loader.dataset), loader.batch_size, loader.drop_last, num_shards, index,
            shuffle, seed), **kwargs)
    return DataLoader(loader.dataset, sampler=ShardSampler(
        len(loader.dataset), num_shards, index, shuffle, seed), batch_size=loader.batch_size,
        drop_last=loader.drop_last, **kwargs)


def shard(dataset, num_shards: int, index: int, seed: int = 0,
          by_batch: bool = False) -> Iterable:
    """Replica `index`'s part of what an `input_fn` without `input_context`
    returned (TF's AutoShardPolicy.AUTO). A DataLoader is rebuilt to read
    every n-th example (training), or every n-th batch (`by_batch`:
    evaluation, whose loss is a mean over batches)."""
    if isinstance(dataset, DataLoader):
        loader = _reshard_loader(dataset, num_shards, index, seed, by_batch)
        if loader is not None:
            logger.info("Sharding the DataLoader by sampler: replica %d of %d reads every "
                        "%d-th %s", index, num_shards, num_shards,
                        "batch" if by_batch else "example")
            return loader
    # said once (replica 0), not by every replica
    logger.log(logging.WARNING if index == 0 else logging.DEBUG,
               "input_fn does not take an input_context: each of the %d replicas reads the "
               "whole input and keeps one batch in %d (TF's AutoShardPolicy.DATA: the "
               "batches are those TF's one-machine MirroredStrategy hands its replicas from "
               "one input; across machines TF's Estimator would have each worker read it "
               "all). Take `input_context` and read only `input_context.input_pipeline_id`'s "
               "part to save the reading; an input_fn that already reads its part (by "
               "TF_CONFIG) must take it too, or it is sharded twice",
               num_shards, num_shards)
    return _every_nth(dataset, num_shards, index)


def _every_nth(dataset, n: int, index: int):
    for i, batch in enumerate(_iterate(dataset)):
        if i % n == index:
            yield batch


def ordered_by_sampler(dataset) -> bool:
    """Whether `dataset` is a DataLoader whose order comes from a sampler
    drawing from a generator of its own (ShardSampler, DistributedSampler),
    not from torch's default one."""
    if not isinstance(dataset, DataLoader):
        return False
    sampler = getattr(dataset.batch_sampler, "sampler", None) \
        if dataset.batch_sampler is not None else dataset.sampler
    return isinstance(sampler, (ShardSampler, DistributedSampler))


def set_epoch(dataset, epoch: int) -> None:
    """Start a new epoch on a DataLoader's sampler that shuffles by epoch
    (DistributedSampler and the like), so every call shuffles anew."""
    for sampler in (getattr(dataset, "sampler", None),
                    getattr(getattr(dataset, "batch_sampler", None), "sampler", None)):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
            return


# -- per-replica iterators ---------------------------------------------------------------
class TrainBatches:
    """A replica's training batches, read one ahead: `exhausted` tells,
    before the step ends, whether this replica has a batch for the next one.

    The first batch is agreed on at once (`all_have(flag)`, a collective):
    if any replica has none, no replica trains.
    """

    def __init__(self, dataset, all_have: Callable[[bool], bool],
                 first: Optional[Callable[[object], bool]] = None):
        self._dataset = dataset
        self._all_have = all_have
        self._first = first   # (the first batch, None if none) -> all have one: instead
        self._it = None
        self._next = _END
        self.exhausted = False

    def __iter__(self):
        return self

    def _fetch(self):
        try:
            return next(self._it)
        except StopIteration:
            return _END

    def __next__(self):
        if self._it is None:
            self._it = _iterate(self._dataset)
            self._next = self._fetch()
            have = self._next is not _END
            if not (self._first(self._next if have else None) if self._first
                    else self._all_have(have)):
                if self._next is not _END:
                    logger.warning("Another replica's input is empty: no replica trains")
                self._next = _END
        if self._next is _END:
            self.exhausted = True
            raise StopIteration
        batch, self._next = self._next, self._fetch()
        self.exhausted = self._next is _END
        return batch


def batch_digest(batch) -> int:
    """A 48-bit digest of `batch` (each tensor's shape, dtype and values, up
    to 65536 of them spread evenly over it; a sequence's items, up to 4096
    so spread), to tell whether replicas read the same batch; one
    device-to-host copy of that sample per tensor."""
    digest = hashlib.blake2b(digest_size=6)
    _digest_into(digest, batch)
    return int.from_bytes(digest.digest(), "little")


def _spread(values, n: int):
    """At most `n` of `values` (a flat tensor, array or list), evenly spaced."""
    return values[::max(1, -(-len(values) // n))]


def _digest_into(digest, obj) -> None:
    digest.update(type(obj).__name__.encode())
    if isinstance(obj, dict):
        for key, value in obj.items():
            digest.update(repr(key).encode())
            _digest_into(digest, value)
    elif isinstance(obj, (list, tuple)):
        digest.update(str(len(obj)).encode())
        for value in _spread(obj, 4096):
            _digest_into(digest, value)
    elif isinstance(obj, torch.Tensor) and obj.layout == torch.strided:
        sample = _spread(obj.detach().reshape(-1), 65536).cpu().contiguous()
        digest.update(f"{tuple(obj.shape)}{obj.dtype}".encode())
        digest.update(sample.view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        digest.update(f"{obj.shape}{obj.dtype}".encode())
        if obj.dtype == object:
            for value in _spread(obj.reshape(-1), 4096):
                _digest_into(digest, value)
        else:
            digest.update(np.ascontiguousarray(_spread(obj.reshape(-1), 65536)).tobytes())
    elif isinstance(obj, (str, bytes)):
        digest.update(obj.encode() if isinstance(obj, str) else obj)
    else:   # (numbers; other objects by their repr)
        digest.update(repr(obj)[:65536].encode())


class EvalBatches:
    """A replica's evaluation batches. Whether each replica has a first one
    is checked on every replica at once (`gather(flag)` -> every replica's
    flag). A replica whose shard has none (fewer batches than replicas)
    gets the first replica's first batch with no rows (`share(obj)` ->
    every replica's obj, `to_device` moving the one received): its
    model_fn builds the metrics on it, and `placeholder` says that it
    evaluates nothing (TF hands such a replica an empty partial batch).
    Where no empty batch can be made of it (see `_empty_like`), that
    replica is named instead of hanging the others."""

    def __init__(self, dataset, gather: Callable[[bool], list], describe: Callable[[int], str],
                 share: Callable[[object], list], to_device: Callable):
        self._dataset, self._gather, self._describe = dataset, gather, describe
        self._share, self._to_device = share, to_device
        self._it = None
        self.placeholder = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is not None:
            return next(self._it)
        self._it = _iterate(self._dataset)
        first = next(self._it, _END)
        flags = self._gather(first is not _END)
        if not any(flags):
            raise StopIteration
        if not all(flags):
            empties = self._share(_to_host(_empty_like(first)) if first is not _END else None)
            template = next(e for e, f in zip(empties, flags) if f)
            if template is None:
                empty = ", ".join(self._describe(r) for r, f in enumerate(flags) if not f)
                raise ValueError(
                    f"The evaluation input has no batch for {empty}: evaluation is sharded "
                    f"over {len(flags)} replicas, and a batch with no rows, on which such a "
                    f"replica builds its metrics, cannot be made of this input's batches "
                    f"(tensors, numpy arrays, lists of values, in dicts, lists and tuples); "
                    f"give it at least {len(flags)} batches")
            if first is _END:
                self.placeholder = True
                return self._to_device(template)
        return first


class AgreedBatches:
    """Batches of one replica's own dataset, read in the input's random
    `stream`, until no replica has one (one small all-gather per batch,
    `gather([value])` -> every replica's): a replica whose dataset ran out
    while others' go on gets empty batches (its last one's structure, no
    rows), as TF's partial batches; where one cannot be made (see
    `_empty_like`), every replica stops there, with a warning. The first
    batch, checked by `first(batch or None)` where given, must be on every
    replica."""

    def __init__(self, dataset, gather: Callable[[list], list], to_device: Callable,
                 stream, first: Optional[Callable[[object], bool]] = None):
        self._dataset, self._gather, self._first = dataset, gather, first
        self.to_device, self._stream = to_device, stream
        self._passes = 0

    def __iter__(self):
        again, self._passes = self._passes > 0, self._passes + 1
        it = self._stream.iterate(self._dataset, _iterate)
        batch = next(it, _END)
        have = batch is not _END
        if not (self._first(batch if have else None) if self._first and not again
                else all(v[0] > 0 for v in self._gather([1.0 if have else 0.0]))):
            _warn_if_spent(self._dataset, again, "distribute_datasets_from_function")
            return
        last, done = batch, False
        while True:
            yield self.to_device(batch)
            if not done:
                batch = next(it, _END)
                done = batch is _END
                last = last if done else batch
            empty = _empty_like(last) if done else None
            # 1: a batch; 0: ran out, an empty one made; -1: ran out, none can be
            states = [v[0] for v in self._gather(
                [0.0 if empty is not None else -1.0] if done else [1.0])]
            if 1.0 not in states:
                return
            if -1.0 in states:
                if empty is None and done:
                    logger.warning(
                        "distribute_datasets_from_function: this replica's dataset ran out "
                        "while another's goes on, and an empty batch (TF's partial batch) "
                        "cannot be made of its batches (%s): every replica stops here, the "
                        "others' last batches unread", type(last).__name__)
                return
            if done:
                batch = empty


def _to_host(batch):
    """`batch` (as `_empty_like` makes them) with its tensors on the CPU."""
    if isinstance(batch, torch.Tensor):
        return batch.cpu()
    if isinstance(batch, dict):
        return {k: _to_host(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        values = [_to_host(v) for v in batch]
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):
            return type(batch)(*values)
        return type(batch)(values)
    return batch


def _empty_like(batch):
    """`batch` with no rows, or None where it cannot be made: tensors and
    arrays cut to 0 along the first dimension, a list of values (strings,
    numbers) or of rows (lists, arrays: a ragged feature) empty, dicts,
    tuples and other lists mapped; scalars and None as they are. Anything
    else (a sparse tensor, a PackedSequence, a dataclass) has no empty form
    here: None."""
    if isinstance(batch, torch.Tensor):
        return (batch[:0] if batch.dim() else batch) if batch.layout == torch.strided else None
    if isinstance(batch, np.ndarray):
        return batch[:0] if batch.ndim else batch
    if batch is None or isinstance(batch, (bool, int, float, str, bytes)):
        return batch
    if isinstance(batch, torch.nn.utils.rnn.PackedSequence):
        return None
    if isinstance(batch, (list, tuple)) and batch and all(
            isinstance(v, (str, bytes, bool, int, float)) for v in batch):
        return type(batch)() if type(batch) in (list, tuple) else None   # (a batch of values)
    if type(batch) is list and batch and all(isinstance(v, (list, tuple, np.ndarray))
                                             for v in batch):
        return []   # (a batch of rows, each of its own length: no rows)
    named = isinstance(batch, tuple) and hasattr(batch, "_fields")   # (a namedtuple)
    if type(batch) in (dict, list, tuple) or named:
        items = batch.items() if isinstance(batch, dict) else enumerate(batch)
        empty = {k: _empty_like(v) for k, v in items}
        if any(v is None and batch[k] is not None for k, v in empty.items()):
            return None
        if isinstance(batch, dict):
            return empty
        values = list(empty.values())
        return type(batch)(*values) if named else type(batch)(values)
    return None


class SplitBatches:
    """Each global batch of `dataset`, split along its first dimension
    (ceil(size / replicas) rows a replica, in order, as TF's), replica
    `index` keeping its part (TF2's experimental_distribute_dataset). Every
    replica must read the same global batches: read in the input's random
    `stream`, alike on every replica, a shuffle drawn from torch's default
    generator is the same (other randomness: seed it)."""

    def __init__(self, dataset, num_replicas: int, index: int, to_device: Callable, stream):
        self._dataset, self._n, self._index = dataset, num_replicas, index
        self.to_device, self._stream = to_device, stream
        self._passes = 0

    def __iter__(self):
        again, self._passes = self._passes > 0, self._passes + 1
        empty = True
        for batch in self._stream.iterate(self._dataset, _iterate):
            empty = False
            yield self.to_device(_split(batch, self._n, self._index))
        if empty:
            _warn_if_spent(self._dataset, again, "experimental_distribute_dataset")


def _warn_if_spent(dataset, again: bool, what: str) -> None:
    """A pass after the first over an iterator (a generator) yields nothing:
    say so (TF's datasets can be iterated again; a generator cannot)."""
    if again and iter(dataset) is dataset:
        logger.warning(
            "%s: this pass yields nothing: the dataset is an iterator (%s), read through by "
            "an earlier pass. Give a re-iterable (a list, a DataLoader, a class with "
            "__iter__) to iterate it once an epoch", what, type(dataset).__name__)


def _split(obj, n: int, index: int):
    if isinstance(obj, np.ndarray):
        obj = torch.as_tensor(obj)
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0:
            return obj
        size = len(obj)
        part = -(-size // n)   # (TF's: ceil(size / n) rows a replica, the last few short)
        return obj[min(index * part, size):(index + 1) * part]
    if isinstance(obj, dict):
        return {k: _split(v, n, index) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, n, index) for v in obj)
    return obj
