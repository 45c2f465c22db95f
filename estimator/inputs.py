"""Input functions over numpy arrays and pandas DataFrames
(TF1: `tf.compat.v1.estimator.inputs.numpy_input_fn` / `pandas_input_fn`).

The batches are TF's: rows in order (or shuffled anew each epoch), the epochs
one stream, so a batch may hold the end of one epoch and the start of the
next; with `num_epochs=None` the stream never ends, otherwise its last batch
may be short. There is no queue: `queue_capacity` and `num_threads` are
accepted and ignored. A shuffled order is drawn from torch's random state when
the input function is called, so `RunConfig(tf_random_seed=...)` makes it
repeatable and each `train` call reads a new order. Under a distribution
strategy each input pipeline takes every n-th batch of the one stream.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from ._checks import is_int


def _check_common(shuffle, batch_size, num_epochs) -> None:
    if not isinstance(shuffle, bool):
        raise ValueError("shuffle must be provided and explicitly set as boolean (it is "
                         f"recommended to set it as True for training); got {shuffle!r}")
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if num_epochs is not None and (not is_int(num_epochs) or num_epochs < 1):
        raise ValueError(f"num_epochs must be a positive integer or None, got {num_epochs!r}")


def _check_lengths(arrays: dict) -> int:
    """The common length of `arrays` ({description: array})."""
    lengths = {what: len(value) for what, value in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError("Length of tensors in x and y is mismatched. All elements in x and "
                         "y must have the same length: "
                         + ", ".join(f"{what} has {n}" for what, n in lengths.items()))
    return next(iter(lengths.values()))


def _batches(rows: int, batch_size: int, num_epochs: Optional[int], shuffle: bool,
             take: Callable, input_context=None):
    """Every batch of the epochs' stream of row ids (this pipeline's), as
    `take(ids)` makes it."""
    pipelines = input_context.num_input_pipelines if input_context is not None else 1
    pipeline = input_context.input_pipeline_id if input_context is not None else 0
    seed = int(torch.randint(2 ** 62, (), dtype=torch.int64)) if shuffle else 0

    def stream():
        rng = np.random.default_rng(seed)
        carry, epoch, index = np.empty(0, np.int64), 0, 0
        while num_epochs is None or epoch < num_epochs:
            order = rng.permutation(rows) if shuffle else np.arange(rows)
            carry, epoch = np.concatenate([carry, order]), epoch + 1
            while len(carry) >= batch_size:
                if index % pipelines == pipeline:
                    yield take(carry[:batch_size])
                carry, index = carry[batch_size:], index + 1
        if len(carry) and index % pipelines == pipeline:
            yield take(carry)
    return stream()


def _rows(value, ids):
    """`value` (an array or a dict of arrays) at rows `ids`."""
    if isinstance(value, dict):
        return {k: v[ids] for k, v in value.items()}
    return value[ids]


def _input_fn(rows, batch_size, num_epochs, shuffle, features, labels) -> Callable:
    def take(ids):
        if labels is None:
            return _rows(features, ids)
        return _rows(features, ids), _rows(labels, ids)

    def input_fn(input_context=None):
        return _batches(rows, batch_size, num_epochs, shuffle, take, input_context)
    return input_fn


def numpy_input_fn(x, y=None, batch_size: int = 128, num_epochs: Optional[int] = 1,
                   shuffle: Optional[bool] = None, queue_capacity: int = 1000,
                   num_threads: int = 1) -> Callable:
    """An input function giving `(features, labels)` batches of `x` (a dict of
    arrays, or one array: then the features are an array) and `y` (an array,
    a dict of arrays, or None: then the features alone)."""
    _check_common(shuffle, batch_size, num_epochs)
    if isinstance(x, dict):
        if not x:
            raise ValueError("x cannot be an empty dict")
        features = {k: np.asarray(v) for k, v in sorted(x.items())}
        arrays = {f"x[{k!r}]": v for k, v in features.items()}
    elif isinstance(x, np.ndarray):
        if x.size == 0:
            raise ValueError("x cannot be an empty array")
        features, arrays = x, {"x": x}
    else:
        raise TypeError(f"x must be a dict or array; got {type(x).__name__}")
    if isinstance(y, dict):
        if not y:
            raise ValueError("y cannot be empty dict, use None instead.")
        both = sorted(set(y) & set(x)) if isinstance(x, dict) else []
        if both:
            raise ValueError(f"{len(both)} duplicate keys are found in both x and y: {both}")
        labels = {k: np.asarray(v) for k, v in sorted(y.items())}
        arrays.update((f"y[{k!r}]", v) for k, v in labels.items())
    elif y is not None:
        labels = arrays["y"] = np.asarray(y)
    else:
        labels = None
    return _input_fn(_check_lengths(arrays), batch_size, num_epochs, shuffle, features, labels)


def pandas_input_fn(x, y=None, batch_size: int = 128, num_epochs: Optional[int] = 1,
                    shuffle: Optional[bool] = None, queue_capacity: Optional[int] = 1000,
                    num_threads: int = 1, target_column: str = "target") -> Callable:
    """An input function giving `(features, labels)` batches of the DataFrame
    `x` (features: a dict of its columns, as numpy) and `y` (a Series; a
    DataFrame: labels a dict of its columns; or None: the features alone);
    `y`'s index must equal `x`'s. `target_column` only checks, as TF's does,
    that `x` has no column of that name."""
    _check_common(shuffle, batch_size, num_epochs)
    if not isinstance(target_column, str):
        raise TypeError("target_column must be a string type")
    if not (hasattr(x, "columns") and hasattr(x, "index")):
        raise TypeError(f"x must be a pandas DataFrame; got {type(x).__name__}")
    features = {c: x[c].to_numpy(copy=True) for c in x.columns}   # TF copies x too
    labels = None
    if y is not None:
        if not (hasattr(y, "index") and hasattr(y, "to_numpy")):
            raise TypeError(f"y must be a pandas Series or DataFrame; got {type(y).__name__}")
        if target_column in features:
            raise ValueError(f"Cannot use name {target_column} for target column: DataFrame "
                             f"already has a column with that name: {list(x.columns)}")
        if not np.array_equal(np.asarray(x.index), np.asarray(y.index)):
            raise ValueError("Index for x and y are mismatched: x's index "
                             f"{_head(x.index)}, y's index {_head(y.index)}")
        labels = ({c: y[c].to_numpy(copy=True) for c in y.columns} if hasattr(y, "columns")
                  else y.to_numpy(copy=True))
    return _input_fn(len(x), batch_size, num_epochs, shuffle, features, labels)


def _head(index) -> str:
    values = np.asarray(index)[:5].tolist()
    return f"{values}{' ...' if len(index) > 5 else ''} ({len(index)} rows)"
