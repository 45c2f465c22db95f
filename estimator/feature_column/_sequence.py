"""Sequence feature columns (TF: ``tf.feature_column.sequence_*``, TF1's
``tf.contrib.feature_column``): each example is a sequence of steps, which
`sequence_input_layer` reads into a ``[batch, T, D]`` tensor and the
sequence lengths, for an RNN.

    tokens = fc.sequence_categorical_column_with_identity("tokens", 1000)
    columns = [fc.embedding_column(tokens, 16), fc.sequence_numeric_column("rating")]
    net, lengths = fc.sequence_input_layer(features, columns)   # [batch, T, 17], [batch]

A feature is what TF's SparseTensor held: rows of values (a list of lists,
as ``parse_example`` gives a ``VarLenFeature``), each value one step (a
`sequence_numeric_column` of shape ``(2,)`` takes two values a step), or
rows of frames (a list of lists of lists, as ``parse_sequence_example``
gives a ``VarLenFeature`` feature list), each frame one step. A categorical
column also reads a dense ``[batch, T]`` array, whose ``''`` / ``-1`` cells
are missing, as TF's. T is the longest row's steps (a dense array's width);
shorter rows are padded with zeros (a numeric column's `default_value`).
An example's length is the last step holding a value, plus one, as TF's
``sequence_length_from_sparse_tensor`` counts it (an id later dropped, an
out-of-vocabulary one, still counts).
"""
from __future__ import annotations

import collections
import math
from typing import Optional

import numpy as np
import torch

from ._columns import (CategoricalColumn, FeatureColumn, IndicatorColumn, _check_key,
                       _check_shape, _columns_repr, categorical_column_with_hash_bucket,
                       categorical_column_with_identity, categorical_column_with_vocabulary_file,
                       categorical_column_with_vocabulary_list)
from ._inputs import STRING, Builder, Ids, as_dtype, dtype_name, is_floating, is_integer
from ._parse_spec import VarLenFeature


def _lengths(rows: np.ndarray, steps: np.ndarray, batch: int) -> np.ndarray:
    """Each row's last step holding a value, plus one (0 for none)."""
    lengths = np.zeros(batch, np.int64)
    np.maximum.at(lengths, rows, steps + 1)
    return lengths


def _place_in_group(groups: np.ndarray) -> np.ndarray:
    """Each element's index within its run of equal, consecutive `groups`."""
    index = np.arange(len(groups), dtype=np.int64)
    if not len(groups):
        return index
    starts = np.r_[True, groups[1:] != groups[:-1]]
    return index - np.maximum.accumulate(np.where(starts, index, 0))


class SequenceNumericColumn(FeatureColumn, collections.namedtuple(
        "SequenceNumericColumn", ("key", "shape", "default_value", "dtype", "normalizer_fn"))):
    """See `sequence_numeric_column`."""

    @property
    def name(self) -> str:
        return self.key

    @property
    def _parse_example_spec(self) -> dict:
        return {self.key: VarLenFeature(self.dtype)}

    @property
    def _variable_shape(self) -> tuple:
        return tuple(self.shape)

    def _variable_specs(self, trainable: bool) -> dict:
        return {}

    def _feature(self, builder: Builder):
        feature = builder.raw(self.key)
        if not feature.sparse:
            raise ValueError(
                f"sequence_numeric_column {self.key!r} takes rows of values (a list of lists, "
                f"TF's SparseTensor; TF: 'Input must be a SparseTensor'), got a dense "
                f"{feature._dtype_text()} feature: a padded array would count its padding "
                "as steps. Give each example's values as a list (parse a VarLenFeature, or "
                "cut a padded array's rows at their lengths)")
        if feature.kind not in ("float", "int", "empty"):
            raise ValueError(f"sequence_numeric_column {self.key!r} needs numbers; feature "
                             f"{self.key!r} holds {feature._dtype_text()} values")
        return feature

    def _natural_steps(self, builder: Builder) -> int:
        """The batch's steps: its longest row's values over `shape`'s, or its
        most frames."""
        feature, n = self._feature(builder), math.prod(self.shape)
        if not feature.batch:
            return 0
        if feature.steps is not None:
            return int(feature.frame_counts.max())
        longest = int(feature.lengths.max())
        if longest % n:
            raise ValueError(
                f"sequence_numeric_column {self.key!r} of shape {list(self.shape)} takes "
                f"{n} values a step; the longest row holds {longest} (TF fails "
                "reshaping it)")
        return longest // n

    def _sequence_host(self, builder: Builder, fixed: Optional[int] = None) -> dict:
        """{"value": float32 [batch, T] + shape, "lengths": int64 [batch]}; T
        `fixed` when given (`_fixed_steps`)."""
        feature = self._feature(builder)
        steps = _fixed_steps(self.key, self._natural_steps(builder), fixed)
        values = torch.from_numpy(np.asarray(feature.values, np.float64)).to(
            self.dtype if is_floating(self.dtype) else torch.float32)
        if self.normalizer_fn is not None:   # (TF: on the values, not the padding)
            values = torch.as_tensor(self.normalizer_fn(values))
        values = values.to(torch.float32)
        n, batch = math.prod(self.shape), feature.batch
        if feature.steps is None:
            starts = np.cumsum(feature.lengths) - feature.lengths
            where = np.arange(len(values)) - starts[feature.rows]
            dense = torch.full((batch, steps * n), float(self.default_value))
            dense[feature.rows, where] = values
            lengths = -(-feature.lengths // n)
        else:
            frames = feature.rows * max(steps, 1) + feature.steps
            where = _place_in_group(frames)
            sizes = np.unique(frames, return_counts=True)[1]
            if len(sizes) and (sizes != n).any():   # (TF's then disagree with its lengths)
                raise ValueError(
                    f"sequence_numeric_column {self.key!r} of shape {list(self.shape)} takes "
                    f"{n} values a frame; a frame holds {int(sizes[sizes != n][0])}")
            dense = torch.full((batch, steps, n), float(self.default_value))
            dense[feature.rows, feature.steps, where] = values
            lengths = _lengths(feature.rows, feature.steps, batch)
        return {"value": dense.reshape((batch, steps) + tuple(self.shape)),
                "lengths": torch.from_numpy(np.asarray(lengths, np.int64))}


class _Wrapping(CategoricalColumn):
    """A categorical column whose name, buckets and parsing are those of the
    column it wraps (`_wrapped`)."""

    @property
    def _wrapped(self) -> CategoricalColumn:
        return self[0]

    @property
    def name(self) -> str:
        return self._wrapped.name

    @property
    def _parse_example_spec(self) -> dict:
        return self._wrapped._parse_example_spec

    @property
    def num_buckets(self) -> int:
        return self._wrapped.num_buckets

    @property
    def _ids_in_range(self) -> bool:
        return self._wrapped._ids_in_range

    def _out_of_range(self, value):
        return self._wrapped._out_of_range(value)


class SequenceCategoricalColumn(_Wrapping, collections.namedtuple(
        "SequenceCategoricalColumn", ("categorical_column",))):
    """A categorical column read step by step (see
    `sequence_categorical_column_with_identity`). Its `embedding_column` /
    `indicator_column` go to `sequence_input_layer`; in a `linear_model` it
    is each example's bag of ids, as in TF."""

    @property
    def key(self) -> str:
        return self.categorical_column.key

    def _ids(self, builder):   # (linear_model's: each example's ids, its frames' too)
        return builder.get(self, lambda: self.categorical_column._mapped_ids(
            builder, frames=True))

    def _steps(self, fixed: Optional[int] = None) -> "SequenceSteps":
        if fixed is not None:
            return SequenceSteps(self, fixed)
        steps = self.__dict__.get("_step_column")
        if steps is None:
            steps = self.__dict__["_step_column"] = SequenceSteps(self, None)
        return steps


class SequenceSteps(_Wrapping, collections.namedtuple(
        "SequenceSteps", ("sequence_column", "fixed"))):
    """A sequence categorical column's ids as one bag per step: ``batch * T``
    bags, step t of example b the bag ``b * T + t`` (TF's id SparseTensor
    reshaped to ``[batch, T, 1]``), which an embedding or indicator combines
    as it does any bags. T is the batch's longest, or `fixed`."""

    def _layout(self, builder: Builder) -> tuple:
        """(ids, each id's step, T, lengths) of the batch."""
        def layout():
            if self.fixed is not None:   # (the padding past the last value: no step)
                ids, steps, _, lengths = self.sequence_column._steps()._layout(builder)
                longest = int(lengths.max()) if len(lengths) else 0
                return ids, steps, _fixed_steps(self.name, longest, self.fixed), lengths
            leaf = self.sequence_column.categorical_column
            ids = leaf._mapped_ids(builder, frames=True)
            feature = builder.raw(leaf.key)
            if feature.steps is not None:
                steps = feature.steps[ids.positions]
                longest = int(feature.frame_counts.max()) if ids.batch else 0
            elif feature.sparse:
                starts = np.cumsum(feature.lengths) - feature.lengths
                steps = ids.positions - starts[ids.rows]
                longest = int(feature.lengths.max()) if ids.batch else 0
            else:
                longest = int(feature.layout()[1][1])
                steps = ids.positions % max(longest, 1)
            return ids, steps, longest, _lengths(ids.rows, steps, ids.batch)
        return builder.get(self, layout, "layout")

    def _ids(self, builder):
        def transform():
            ids, steps, longest, _ = self._layout(builder)
            return Ids(ids.values, ids.rows * longest + steps, ids.batch * longest)
        return builder.get(self, transform)


def _fixed_steps(key: str, steps: int, fixed: Optional[int]) -> int:
    """The steps of a batch whose longest sequence has `steps`: `fixed` when
    given (an export whose model fixed them), which no sequence may pass."""
    if fixed is None:
        return steps
    if steps > fixed:
        raise ValueError(
            f"feature {key!r}: a sequence of {steps} steps, where this export takes at most "
            f"{fixed} (its model fixes the steps at its example inputs' longest sequence, as "
            "an RNN does; shorter ones are padded): export with a longer example")
    return fixed


def sequence_hosts(columns, builder: Builder, fixed: Optional[int] = None) -> dict:
    """The work on the host of `sequence_input_layer` over `columns` (an
    export records it, a server redoes it): CPU tensors, "lengths" [batch],
    which the columns must agree on (TF asserts it), and each column j's
    ``c<j>_...`` (`_sequence_host`), all of T steps: the longest column's
    (a dense array's width may pass another's longest row), or `fixed`."""
    if fixed is None:
        fixed = max(_natural_steps(c, builder) for c in columns)
    hosts = [_sequence_host(c, builder, fixed) for c in columns]
    for column, host in zip(columns[1:], hosts[1:]):
        if len(host["lengths"]) != len(hosts[0]["lengths"]):
            raise ValueError(
                "Batch size (first dimension) of each feature must be same. Batch size of "
                f"columns ({columns[0].name}, {column.name}): ({len(hosts[0]['lengths'])}, "
                f"{len(host['lengths'])})")
        if not torch.equal(host["lengths"], hosts[0]["lengths"]):
            raise ValueError(
                f"sequence_input_layer: the sequence lengths of the columns "
                f"{columns[0].name!r} and {column.name!r} differ (TF: 'Condition x == y did "
                f"not hold'): {hosts[0]['lengths'].tolist()} and {host['lengths'].tolist()}; "
                "every sequence feature of an example must have its number of steps")
    out = {"lengths": hosts[0]["lengths"]}
    for j, host in enumerate(hosts):
        out.update((f"c{j}_{k}", v) for k, v in host.items() if k != "lengths")
    return out


def _natural_steps(column, builder: Builder) -> int:
    if isinstance(column, SequenceNumericColumn):
        return column._natural_steps(builder)
    return column.categorical_column._steps()._layout(builder)[2]


def _sequence_host(column, builder: Builder, fixed: Optional[int] = None) -> dict:
    """One column's: "lengths" [batch] and, T the steps (`fixed` if given),
    a numeric column's "value" [batch, T] + shape, an indicator's "value"
    [batch, T, num_buckets], an embedding's lookup inputs over one bag a
    step with "offsets" and "scale" [batch, T] ("ids" [batch, T] alone when
    every step holds one id)."""
    if isinstance(column, SequenceNumericColumn):
        return column._sequence_host(builder, fixed)
    steps = column.categorical_column._steps(fixed)
    _, _, longest, lengths = steps._layout(builder)
    shape, lengths = (len(lengths), longest), torch.from_numpy(lengths)
    if isinstance(column, IndicatorColumn):
        hot = column._multi_hot(builder, steps)
        return {"value": hot.reshape(shape + (hot.shape[1],)), "lengths": lengths}
    bags = column._bags(builder, steps)
    if "offsets" not in bags:   # (one id a step)
        return {"ids": bags["ids"].reshape(shape), "lengths": lengths}
    return {**bags, "offsets": bags["offsets"].reshape(shape), "lengths": lengths,
            "scale": None if bags["scale"] is None else bags["scale"].reshape(shape)}


def sequence_numeric_column(key, shape=(1,), default_value=0., dtype=torch.float32,
                            normalizer_fn=None) -> SequenceNumericColumn:
    """A sequence of numbers, `shape` of them a step (TF:
    ``sequence_numeric_column``): rows of values, each row's steps padded to
    the batch's longest with `default_value`. `normalizer_fn` maps the values
    (a tensor of them in `dtype`, float32 for an integer one; not the
    padding), as TF's."""
    _check_key(key)
    shape = _check_shape(shape, key)
    dtype = as_dtype(dtype, f"sequence_numeric_column({key!r})")
    if dtype is STRING or not (is_integer(dtype) or is_floating(dtype)):
        raise ValueError(f"dtype must be convertible to float. dtype: "
                         f"{dtype_name(dtype) if dtype else None}, key: {key}")
    if isinstance(default_value, bool) or not isinstance(default_value, (int, float)):
        raise ValueError(f"default_value must be a number, got {default_value!r} (key: {key})")
    if normalizer_fn is not None and not callable(normalizer_fn):
        raise TypeError(f"normalizer_fn must be a callable. Given: {normalizer_fn}")
    return SequenceNumericColumn(key, shape, float(default_value), dtype, normalizer_fn)


def sequence_categorical_column_with_identity(key, num_buckets, default_value=None
                                              ) -> SequenceCategoricalColumn:
    """`categorical_column_with_identity`, read step by step (TF:
    ``sequence_categorical_column_with_identity``)."""
    return SequenceCategoricalColumn(
        categorical_column_with_identity(key, num_buckets, default_value))


def sequence_categorical_column_with_hash_bucket(key, hash_bucket_size, dtype=STRING
                                                 ) -> SequenceCategoricalColumn:
    """`categorical_column_with_hash_bucket`, read step by step (TF:
    ``sequence_categorical_column_with_hash_bucket``)."""
    return SequenceCategoricalColumn(
        categorical_column_with_hash_bucket(key, hash_bucket_size, dtype))


def sequence_categorical_column_with_vocabulary_list(key, vocabulary_list, dtype=None,
                                                     default_value=-1, num_oov_buckets=0
                                                     ) -> SequenceCategoricalColumn:
    """`categorical_column_with_vocabulary_list`, read step by step (TF:
    ``sequence_categorical_column_with_vocabulary_list``)."""
    return SequenceCategoricalColumn(categorical_column_with_vocabulary_list(
        key, vocabulary_list, dtype, default_value, num_oov_buckets))


def sequence_categorical_column_with_vocabulary_file(key, vocabulary_file, vocabulary_size=None,
                                                     num_oov_buckets=0, default_value=None,
                                                     dtype=STRING) -> SequenceCategoricalColumn:
    """`categorical_column_with_vocabulary_file`, read step by step (TF:
    ``sequence_categorical_column_with_vocabulary_file``)."""
    return SequenceCategoricalColumn(categorical_column_with_vocabulary_file(
        key, vocabulary_file, vocabulary_size, num_oov_buckets, default_value, dtype))


def is_sequence_categorical(column) -> bool:
    return isinstance(column, SequenceCategoricalColumn)


for _cls in (SequenceNumericColumn, SequenceCategoricalColumn, SequenceSteps):
    _cls.__repr__ = _columns_repr
