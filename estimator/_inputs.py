"""Calling `input_fn` and `model_fn` the way TF does: arguments chosen by the
function's signature."""
from __future__ import annotations

import inspect
import logging
import queue
import sys
import threading
from typing import Callable, Iterator

import numpy as np
import torch

from hooks.mode_keys import ModeKeys

logger = logging.getLogger(__name__)


def _parameters(fn: Callable) -> dict:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def call_input_fn(input_fn: Callable, mode: str, params: dict, config, input_context):
    """`input_fn()`, `input_fn(params)`, `input_fn(input_context)`, and any of
    `mode`, `config` by name (tf.estimator's rules)."""
    if not callable(input_fn):
        raise TypeError(f"input_fn must be callable, got {type(input_fn).__name__}")
    parameters = _parameters(input_fn)
    available = {"params": params, "mode": mode, "config": config,
                 "input_context": input_context}
    missing = [name for name, p in parameters.items() if name not in available
               and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:   # (TF's call fails with Python's "missing 1 required positional argument")
        listed = ", ".join(repr(name) for name in missing)
        raise TypeError(
            f"input_fn {getattr(input_fn, '__qualname__', input_fn)!r} takes {listed}, which "
            "the Estimator does not give: it passes only mode, params, config and "
            "input_context, by name. Bind the others, as with TF: "
            f"functools.partial(input_fn, {missing[0]}=...) or lambda: input_fn(...)")
    return input_fn(**{k: v for k, v in available.items() if k in parameters})


def iterate(dataset, mode: str = "") -> Iterator:
    """An iterator over what `input_fn` returned: any iterable of
    `(features, labels)` pairs, or of features alone for PREDICT (a
    DataLoader, a generator, a list). One batch returned as a TF input_fn
    returns its tensors (a dict, a tensor, a `(features, labels)` pair),
    which iterating would take apart, is an error saying how to return it."""
    one = _one_batch(dataset, mode)
    if one:
        raise ValueError(
            f"input_fn returned {one}, as a TF input_fn returns the tensors of a batch; "
            "here it returns an iterable of batches: `[batch]` for this one batch, "
            "`itertools.repeat(batch)` for TF's same batch at every step, or "
            "est.inputs.numpy_input_fn(x, y, batch_size=...) to batch arrays")
    kind = type(dataset)
    if not (hasattr(kind, "__iter__") or hasattr(kind, "__getitem__")):
        raise TypeError(f"input_fn must return an iterable of batches (a DataLoader, a "
                        f"generator, a list), got {kind.__name__}")
    return iter(dataset)   # (an error in the dataset's own __iter__ is its own)


def _one_batch(dataset, mode: str) -> str:
    """What `dataset` is if it is one batch rather than an iterable of them
    ('' if not): a dict of features, a tensor or array (which would be read
    row by row), or a (features, labels) pair."""
    if isinstance(dataset, dict):
        return f"a dict of features (keys {sorted(map(str, dataset))[:4]})"
    if isinstance(dataset, (torch.Tensor, np.ndarray)):
        return f"a {type(dataset).__name__} of shape {tuple(dataset.shape)}"
    if isinstance(dataset, tuple) and len(dataset) == 2:
        features, labels = dataset
        if mode == ModeKeys.PREDICT:   # (two feature batches are two dicts)
            pair = isinstance(features, dict) and not isinstance(labels, dict)
        else:   # (a batch is a pair: a dict or tensor is not one)
            pair = isinstance(features, (dict, torch.Tensor, np.ndarray))
        if pair:
            return "a (features, labels) pair"
    return ""


def split_batch(batch, mode: str, predict: bool):
    """(features, labels) from one element of the input, as TF's
    parse_iterator_result: a pair, or features alone (labels None, in any
    mode: an autoencoder's input); in PREDICT the labels are None (TF's
    predict hands the model_fn none, given or not)."""
    if isinstance(batch, (tuple, list)):
        if len(batch) != 2:
            raise ValueError(f"In mode {mode!r} each batch must be (features, labels) or "
                             f"features alone, got a {type(batch).__name__} of length "
                             f"{len(batch)} (TF: input_fn should return (features, labels) as "
                             "a len 2 tuple)")
        return batch[0], None if predict else batch[1]
    if batch is None:
        raise ValueError(f"In mode {mode!r} each batch must be (features, labels) or "
                         "features alone, got None")
    return batch, None


_END = object()
_STOP_SECS = 10.0   # the longest a closed read-ahead waits for its thread


def read_ahead(batches: Iterator, depth: int, leave_a_core: bool = True) -> Iterator:
    """`batches` fetched by a thread up to `depth` batches ahead (TF:
    ``dataset.prefetch(depth)``): the input pipeline's work (a generator's
    code, a DataLoader's collation, the move to the device) overlaps the
    steps. The end of the input ends this iterator; an exception in the
    input is raised here, in order; closing this iterator (the end of
    training, Ctrl-C) stops the thread at its next batch and waits for it
    (up to `_STOP_SECS`): no input code runs on after `train` returns, and
    the thread frees nothing while the interpreter exits (a tensor that
    came through pickle or torch.load, freed by a thread then, aborts the
    process: "terminate called without an active exception",
    pytorch/pytorch#38228).

    With `leave_a_core`, while it runs torch's intra-op threads are one
    fewer (put back at the end, unless changed meanwhile), leaving a core to
    the input thread: otherwise the two compete for the same cores and
    reading ahead is slower than not (measured in ``bench/overhead.py``'s
    mlp_loader: 0.90 of the plain loop on 2 cores, 1.19 with the core left
    free)."""
    out: "queue.Queue" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        """Queue `item`; False once the reading is stopped."""
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
            except queue.Full:
                continue
            return not stop.is_set()
        return False

    def produce():
        try:
            for batch in batches:
                if not put((batch, None)):
                    return
        except BaseException as e:   # handed to the consumer, raised there
            put((_END, e))
            return
        put((_END, None))

    threads = torch.get_num_threads()
    fewer = threads > 1 and leave_a_core
    if fewer:
        torch.set_num_threads(threads - 1)
    thread = threading.Thread(target=produce, name="input-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            batch, error = out.get()
            if batch is _END:
                if error is not None:
                    raise error
                return
            yield batch
    finally:
        stop.set()
        try:
            _drain(out)   # a put waiting for room returns now
            # (Closed while the interpreter exits, a kept traceback's generator:
            # the thread can run no more then, and there is nothing to wait for.)
            if not sys.is_finalizing():
                thread.join(_STOP_SECS)
                if thread.is_alive():
                    logger.warning("The input read-ahead thread is still in the input %.0f s "
                                   "after its end was asked for; leaving it to stop after the "
                                   "batch it is reading", _STOP_SECS)
        finally:   # (a count set meanwhile, by the caller, is theirs)
            if fewer and torch.get_num_threads() == threads - 1:
                torch.set_num_threads(threads)


def _drain(out: "queue.Queue") -> None:
    while True:
        try:
            out.get_nowait()
        except queue.Empty:
            return
