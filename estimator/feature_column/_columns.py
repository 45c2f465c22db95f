"""The feature columns (TF: ``tf.compat.v1.feature_column``'s constructors and
the column classes of ``feature_column_v2``), with TF 1's semantics.

Columns are immutable named tuples, hashable and compared by value, with TF's
`name`s (``price_bucketized``, ``color_embedding``, ``a_X_b``). Dense columns
(`numeric_column`, `bucketized_column`, `embedding_column`,
`indicator_column`) give a float32 ``[batch, ...]`` tensor; categorical
columns give id bags (`Ids`) that an embedding, an indicator or a linear
model consumes. Ids are computed on the host with numpy (string lookups,
hashing); dense numeric work stays in torch on the features' device.

The id rules, as TF's: a dense string / int feature drops its ``''`` / ``-1``
cells; a vocabulary maps an unknown value to an OOV bucket
(``vocab_size + Fingerprint64(value) % num_oov_buckets``) or to
`default_value` (-1: dropped); an identity column maps values outside
``[0, num_buckets)`` to its `default_value` when it has one. Consumers drop
negative ids and raise on ids ``>= num_buckets`` (TF's embedding lookup and
linear model fail at run time there; TF's indicator would silently give a
zero row, here it is the same error).
"""
from __future__ import annotations

import collections
import math
import os
from typing import Optional, Tuple

import numpy as np
import torch

from distribute.host_arrays import to_numpy

from .. import _hashing
from ._inputs import STRING, Builder, Ids, arange, as_dtype, dtype_name, is_arange, is_floating, \
    is_integer
from ._memo import KeyMemo, mapped, memo_of, pack
from ._parse_spec import FixedLenFeature, VarLenFeature
from ._variables import (COMBINERS, VariableSpecs, bag_inputs, default_embedding_initializer,
                         moved)
from ._vocabulary import Vocabulary, read_vocabulary_file


# -- bases ---------------------------------------------------------------------------
class FeatureColumn:
    """A feature column (TF: ``_FeatureColumn``)."""

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def _parse_example_spec(self) -> dict:
        raise NotImplementedError

    @property
    def parse_example_spec(self) -> dict:
        return self._parse_example_spec

    @property
    def _var_scope_name(self) -> str:
        return self.name

    def __getstate__(self):
        """Pickled (and copied) without its memos: they are keyed by this
        process's string tables (`_memo`)."""
        state = dict(self.__dict__)
        state.pop("_memos", None)
        return state


class DenseColumn(FeatureColumn):
    """A column giving a dense tensor (TF: ``_DenseColumn``)."""

    @property
    def _variable_shape(self) -> tuple:
        raise NotImplementedError

    @property
    def _num_elements(self) -> int:
        n = self.__dict__.get("_n_elements")   # (asked on every step)
        if n is None:
            n = self.__dict__["_n_elements"] = math.prod(self._variable_shape)
        return n

    def _variable_specs(self, trainable: bool) -> VariableSpecs:
        """The variables this column creates in an input layer (none by default)."""
        return {}

    def _dense(self, builder: Builder, variables) -> torch.Tensor:
        """The ``[batch, ...]`` float32 tensor; `variables` is the
        `ColumnVariables` holding `_variable_specs`, or None."""
        raise NotImplementedError


class CategoricalColumn(FeatureColumn):
    """A column giving id bags (TF: ``_CategoricalColumn``)."""

    @property
    def num_buckets(self) -> int:
        raise NotImplementedError

    @property
    def _num_buckets(self) -> int:
        return self.num_buckets

    def _ids(self, builder: Builder) -> Ids:
        raise NotImplementedError

    @property
    def _ids_in_range(self) -> bool:
        """Whether every id `_ids` gives lies in [0, num_buckets) by construction
        (a hash, a bucket; then `_valid_ids` checks nothing)."""
        return False

    def _out_of_range(self, value: int) -> ValueError:
        default = getattr(self, "default_value", None)
        why = (f": its default_value, which values outside its vocabulary get; give one "
               f"in [0, {self.num_buckets}) or num_oov_buckets" if value == default else "")
        return ValueError(f"Column {self.name!r} produced id {value}, outside "
                          f"[0, {self.num_buckets}){why}")

    def _valid_ids(self, builder: Builder, prune_weights: bool) -> Ids:
        """The ids a lookup uses: negative ids dropped (and non-positive weights
        when `prune_weights`, as TF's safe_embedding_lookup_sparse does for the
        "mean" and "sqrtn" combiners); an id >= num_buckets is an error."""
        return builder.get(self, lambda: self._pruned(builder, prune_weights),
                           ("valid", prune_weights))

    def _pruned(self, builder: Builder, prune_weights: bool) -> Ids:
        ids = self._ids(builder)
        values, rows, weights = ids.values, ids.rows, ids.weights
        prune = weights is not None and prune_weights
        if self._ids_in_range and not prune:
            return ids
        if not len(values):
            return Ids(values, rows, ids.batch, weights)
        if values.min() < 0 or prune:
            keep = values >= 0
            if prune:
                keep &= weights > 0
            values, rows = values[keep], rows[keep]
            weights = None if weights is None else weights[keep]
        if len(values):
            top = int(values.max())
            if top >= self.num_buckets:
                raise self._out_of_range(top)
        return Ids(values, rows, ids.batch, weights)


def _check_key(key) -> None:
    if not isinstance(key, str):
        raise ValueError(f"key must be a string. Got: type {type(key)}. Given key: {key!r}")


def _check_string_or_int(dtype, prefix: str) -> None:
    if dtype is not STRING and not is_integer(dtype):
        raise ValueError(f"{prefix} dtype must be string or integer. dtype: "
                         f"{dtype_name(dtype) if dtype is not None else None}.")


def _check_int(value, what: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int, got {value!r}")
    return int(value)


def _check_input_kind(column_dtype, feature, key: str) -> None:
    """TF: 'Column dtype and SparseTensors dtype must be compatible'."""
    if feature.kind == "empty":   # (rows without a value: no dtype to compare)
        return
    if feature.kind not in ("string", "int"):
        raise ValueError(f"Column {key!r} needs string or integer values; feature {key!r} "
                         f"holds {feature._dtype_text()} values")
    if (column_dtype is STRING) != (feature.kind == "string"):
        raise ValueError(f"Column dtype and SparseTensors dtype must be compatible. key: "
                         f"{key}, column dtype: {dtype_name(column_dtype)}, tensor dtype: "
                         f"{'string' if feature.kind == 'string' else 'int64'}")


def _columns_repr(self) -> str:
    fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields)
    return f"{type(self).__name__}({fields})"


# -- numeric / bucketized --------------------------------------------------------------
class NumericColumn(DenseColumn, collections.namedtuple(
        "NumericColumn", ("key", "shape", "default_value", "dtype", "normalizer_fn"))):
    """See `numeric_column`."""

    @property
    def name(self) -> str:
        return self.key

    @property
    def _parse_example_spec(self) -> dict:
        return {self.key: FixedLenFeature(self.shape, self.dtype, self.default_value)}

    @property
    def _variable_shape(self) -> tuple:
        return tuple(self.shape)

    def _transform(self, builder: Builder) -> torch.Tensor:
        def transform():
            tensor = builder.raw(self.key).dense_tensor()
            if self.normalizer_fn is not None:
                tensor = self.normalizer_fn(tensor)
            return torch.as_tensor(tensor).to(torch.float32)
        return builder.get(self, transform)

    def _dense(self, builder, variables=None):
        return self._transform(builder)


class BucketizedColumn(DenseColumn, CategoricalColumn, collections.namedtuple(
        "BucketizedColumn", ("source_column", "boundaries"))):
    """See `bucketized_column`."""

    @property
    def name(self) -> str:
        return f"{self.source_column.name}_bucketized"

    @property
    def _parse_example_spec(self) -> dict:
        return self.source_column._parse_example_spec

    @property
    def _variable_shape(self) -> tuple:
        return tuple(self.source_column.shape) + (len(self.boundaries) + 1,)

    @property
    def num_buckets(self) -> int:
        return (len(self.boundaries) + 1) * self.source_column.shape[0]

    _ids_in_range = True

    def _buckets(self, builder: Builder) -> torch.Tensor:
        """Bucket index of each source value: the number of boundaries <= it
        (TF's Bucketize: upper_bound over float32 boundaries)."""
        def transform():
            source = self.source_column._transform(builder)
            edges = self.__dict__.get("_edges")
            if edges is None or edges.device != source.device:
                edges = self.__dict__["_edges"] = torch.tensor(
                    self.boundaries, dtype=torch.float32, device=source.device)
            return torch.bucketize(source.contiguous(), edges, right=True)   # (a column
            # view of a batch: torch warns on non-contiguous values)
        return builder.get(self, transform)

    def _dense(self, builder, variables=None):
        buckets = self._buckets(builder)
        hot = torch.zeros(buckets.shape + (len(self.boundaries) + 1,), dtype=torch.float32,
                          device=buckets.device)
        return hot.scatter_(-1, buckets.unsqueeze(-1), 1.0)

    def _ids(self, builder):
        buckets = self._buckets(builder)
        batch, width = int(buckets.shape[0]), self.source_column.shape[0]
        flat = to_numpy(buckets).astype(np.int64).reshape(-1)
        if flat.size != batch * width:
            raise ValueError(f"Column {self.name!r}: feature {self.source_column.key!r} has "
                             f"shape {list(buckets.shape)}, expected [batch, {width}]")
        if width == 1:
            return Ids(flat, arange(batch), batch)
        dim = np.tile(arange(width), batch)
        return Ids(flat + (len(self.boundaries) + 1) * dim, np.repeat(arange(batch), width),
                   batch)


# -- categorical columns reading one feature ---------------------------------------------------
class _LeafCategorical(CategoricalColumn):
    """A categorical column that maps the values of feature `key`."""

    @property
    def name(self) -> str:
        return self.key

    @property
    def _parse_example_spec(self) -> dict:
        return {self.key: VarLenFeature(self.dtype)}

    def _map(self, values: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _ids(self, builder):
        return builder.get(self, lambda: self._mapped_ids(builder, frames=False))

    def _mapped_ids(self, builder: Builder, frames: bool) -> Ids:
        """The ids of feature `key`'s values, `positions` their places among
        them; rows of frames only for a sequence column (`frames`)."""
        feature = builder.raw(self.key)
        self._check_input(feature)
        values, rows, positions = feature.flat(drop_missing=True, frames=frames)
        if values.dtype.kind in "US":
            ids = mapped(self, "", values, *feature.codes(positions), self._map)
        else:
            ids = self._map(values)
        return Ids(ids, rows, feature.batch, None, positions)

    def _check_input(self, feature) -> None:
        _check_input_kind(self.dtype, feature, self.key)


class HashedCategoricalColumn(_LeafCategorical, collections.namedtuple(
        "HashedCategoricalColumn", ("key", "hash_bucket_size", "dtype"))):
    """See `categorical_column_with_hash_bucket`."""

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    _ids_in_range = True

    def _map(self, values):
        return _hashing.hash_bucket(values, self.hash_bucket_size)


class VocabularyListCategoricalColumn(_LeafCategorical, collections.namedtuple(
        "VocabularyListCategoricalColumn",
        ("key", "vocabulary_list", "dtype", "default_value", "num_oov_buckets"))):
    """See `categorical_column_with_vocabulary_list`."""

    @property
    def num_buckets(self) -> int:
        return len(self.vocabulary_list) + self.num_oov_buckets

    @property
    def _ids_in_range(self) -> bool:
        return self.num_oov_buckets > 0 or 0 <= self.default_value < self.num_buckets

    def _map(self, values):
        table = self.__dict__.get("_table")
        if table is None:
            table = self.__dict__["_table"] = Vocabulary(
                self.vocabulary_list, self.dtype is STRING, self.default_value,
                self.num_oov_buckets)
        return table.lookup(values)


class VocabularyFileCategoricalColumn(_LeafCategorical, collections.namedtuple(
        "VocabularyFileCategoricalColumn",
        ("key", "vocabulary_file", "vocabulary_size", "num_oov_buckets", "dtype",
         "default_value"))):
    """See `categorical_column_with_vocabulary_file`. The file is read on first
    use (TF: at table initialization) and kept."""

    @property
    def num_buckets(self) -> int:
        return self.vocabulary_size + self.num_oov_buckets

    @property
    def _ids_in_range(self) -> bool:
        return self.num_oov_buckets > 0 or 0 <= self.default_value < self.num_buckets

    def _map(self, values):
        table = self.__dict__.get("_table")
        if table is None:
            entries = read_vocabulary_file(self.vocabulary_file, self.key,
                                           self.vocabulary_size, self.dtype is STRING)
            table = self.__dict__["_table"] = Vocabulary(
                entries, self.dtype is STRING, self.default_value, self.num_oov_buckets)
        return table.lookup(values)


class IdentityCategoricalColumn(_LeafCategorical, collections.namedtuple(
        "IdentityCategoricalColumn", ("key", "number_buckets", "default_value"))):
    """See `categorical_column_with_identity`."""

    @property
    def num_buckets(self) -> int:
        return self.number_buckets

    @property
    def dtype(self):
        return torch.int64

    def _check_input(self, feature):
        if feature.kind not in ("int", "empty"):
            raise ValueError(f"Invalid input, not integer. key: {self.key} dtype: "
                             f"{feature._dtype_text()}")

    def _map(self, values):
        values = values.astype(np.int64, copy=False)
        if self.default_value is not None:
            values = np.where((values < 0) | (values >= self.number_buckets),
                              np.int64(self.default_value), values)
        return values

    def _out_of_range(self, value):
        return ValueError(
            f"categorical_column_with_identity {self.key!r}: value {value} is out of range "
            f"[0, {self.number_buckets}) and the column has no default_value (TF fails "
            "the lookup at run time; give default_value to map such values to one id)")


_ONES = np.ones(1 << 16, np.int64)   # a cross input's counts when each row has one value
_ONES.flags.writeable = False


# -- weighted / crossed ------------------------------------------------------------------------
class WeightedCategoricalColumn(CategoricalColumn, collections.namedtuple(
        "WeightedCategoricalColumn", ("categorical_column", "weight_feature_key", "dtype"))):
    """See `weighted_categorical_column`."""

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_weighted_by_{self.weight_feature_key}"

    @property
    def _parse_example_spec(self) -> dict:
        config = dict(self.categorical_column._parse_example_spec)
        if self.weight_feature_key in config:
            raise ValueError(f"Parse config {config[self.weight_feature_key]} already exists "
                             f"for {self.weight_feature_key}.")
        config[self.weight_feature_key] = VarLenFeature(self.dtype)
        return config

    @property
    def num_buckets(self) -> int:
        return self.categorical_column.num_buckets

    def _ids(self, builder):
        def transform():
            ids = self.categorical_column._ids(builder)
            feature = builder.raw(self.weight_feature_key)
            weights, layout, dense = feature.weights()
            source = builder.raw(self.categorical_column.key)
            if layout != source.layout():
                raise ValueError(
                    f"Column {self.name!r}: the weights {self.weight_feature_key!r} must have "
                    f"the layout of feature {self.categorical_column.key!r}: {layout} vs "
                    f"{source.layout()}")
            w = weights[ids.positions]
            values, rows = ids.values, ids.rows
            if dense:   # TF drops the 0.0 cells of dense weights
                keep = w != 0
                values, rows, w = values[keep], rows[keep], w[keep]
            return Ids(values, rows, ids.batch, w)
        return builder.get(self, transform)


def _collect_leaf_level_keys(cross) -> list:
    keys = []
    for k in cross.keys:
        keys.extend(_collect_leaf_level_keys(k) if isinstance(k, CrossedColumn) else [k])
    return keys


class CrossedColumn(CategoricalColumn, collections.namedtuple(
        "CrossedColumn", ("keys", "hash_bucket_size", "hash_key"))):
    """See `crossed_column`."""

    @property
    def name(self) -> str:
        names = [k.name if isinstance(k, FeatureColumn) else k
                 for k in _collect_leaf_level_keys(self)]
        return "_X_".join(sorted(names))

    @property
    def _parse_example_spec(self) -> dict:
        config = {}
        for key in self.keys:
            if isinstance(key, FeatureColumn):
                config.update(key._parse_example_spec)
            else:
                config[key] = VarLenFeature(STRING)
        return config

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    _ids_in_range = True

    def _packed_codes(self, builder) -> Optional[Tuple[np.ndarray, str]]:
        """Each row's input strings as one number (`_memo.pack`) when the cross
        is of up to three dense string features with one value a row, and the
        name of the memo of those numbers (codes come from a table per feature
        and str / bytes kind: one memo per kinds); else None."""
        codes, kinds, batch = [], "", None
        for key in self.keys:
            if not isinstance(key, str):
                return None
            feature = builder.raw(key)
            if feature.array is None or feature.array.shape[1] != 1 or \
                    feature.array.dtype.kind not in "US" or batch not in (None, feature.batch):
                return None
            batch = feature.batch
            values, _, positions = feature.flat(drop_missing=False)
            found, _ = feature.codes(positions)
            if found is None:
                return None
            codes.append(found)
            kinds += feature.array.dtype.kind
        packed = pack(codes)
        return None if packed is None else (packed, "(crossed)" + kinds)

    def _ids(self, builder):
        def transform():
            packed = self._packed_codes(builder)
            if packed is not None:
                found = memo_of(self, packed[1], KeyMemo).find(packed[0])
                if found is not None:
                    return Ids(found, arange(len(found)), len(found))
            ids = crossed()
            if packed is not None:
                memo_of(self, packed[1], KeyMemo).learn(packed[0], ids.values)
            return ids

        def crossed():
            sparse, dense = [], []   # TF's SparseCross takes sparse inputs first
            batch = None
            for key in _collect_leaf_level_keys(self):
                if isinstance(key, str):
                    feature = builder.raw(key)
                    if feature.kind not in ("string", "int", "empty"):   # (TF: 40.7 -> 40)
                        raise ValueError(f"crossed_column {self.name!r}: feature {key!r} "
                                         f"must hold strings or ints, got "
                                         f"{feature._dtype_text()} (TF's cross casts floats "
                                         f"to int64, 40.7 to 40, with no word; pandas makes "
                                         f"an int column float where a value is missing). "
                                         f"Fill the missing values and cast the column to "
                                         f"int64, or bucketize it (bucketized_column)")
                    values, rows, positions = feature.flat(drop_missing=False)
                    if values.dtype.kind in "US":
                        values = mapped(self, key, values, *feature.codes(positions),
                                        _hashing.cross_values)
                    else:
                        values = _hashing.cross_values(values)
                    size, into = feature.batch, (sparse if feature.sparse else dense)
                else:
                    ids = key._ids(builder)
                    if ids.weights is not None:
                        raise ValueError("crossed_column does not support weight_tensor, but "
                                         "the given column populates weight_tensor. Given "
                                         f"column: {key.name}")
                    values, rows, size, into = (_hashing.cross_values(ids.values), ids.rows,
                                                ids.batch, sparse)
                if batch is not None and size != batch:
                    raise ValueError(f"crossed_column {self.name!r}: inputs of different "
                                     f"batch sizes ({batch} and {size})")
                batch = size
                counts = (_ONES[:size] if is_arange(rows, size) and size <= len(_ONES) else
                          np.bincount(rows, minlength=size) if len(rows)
                          else np.zeros(size, np.int64))
                into.append((values, counts))
            flat, per_row = _hashing.cross_hash_bags(sparse + dense, self.hash_bucket_size,
                                                     self.hash_key, hashed=True)
            one_each = len(flat) == batch and (per_row == 1).all()
            rows = arange(batch) if one_each else np.repeat(arange(batch), per_row)
            return Ids(flat, rows, batch)
        return builder.get(self, transform)


# -- embedding / indicator -------------------------------------------------------------------
class _Embedding(DenseColumn):
    """An embedding's lookup: `categorical_column`'s ids in a table
    [num_buckets, `dimension`], combined by `combiner`."""

    @property
    def _parse_example_spec(self) -> dict:
        return self.categorical_column._parse_example_spec

    @property
    def _variable_shape(self) -> tuple:
        return (self.dimension,)

    def _variable_specs(self, trainable):
        shape = (self.categorical_column.num_buckets, self.dimension)
        return {"embedding_weights": (shape, self.initializer, bool(self.trainable and trainable))}

    def _lookup_inputs(self, builder) -> dict:
        """The embedding lookup's inputs (CPU tensors: ids, offsets, ...), made
        on the host."""
        return builder.prepared(("embedding", self),
                                lambda: self._bags(builder, self.categorical_column))

    def _bags(self, builder, categorical: CategoricalColumn) -> dict:
        """The lookup inputs of `categorical`'s bags (this column's, or a
        sequence column's one bag a step)."""
        ids = categorical._valid_ids(
            builder, prune_weights=self.combiner != "sum" and self.use_safe_embedding_lookup)
        return bag_inputs(ids.values, ids.rows, ids.batch, ids.weights, self.combiner,
                          builder.general)

    def _dense(self, builder, variables):
        table = getattr(variables, "module", variables).embedding_weights   # (DDP wraps it)
        return variables(**moved(self._lookup_inputs(builder), table.device))


class EmbeddingColumn(_Embedding, collections.namedtuple(
        "EmbeddingColumn", ("categorical_column", "dimension", "combiner", "initializer",
                            "ckpt_to_load_from", "tensor_name_in_ckpt", "max_norm",
                            "trainable", "use_safe_embedding_lookup"), defaults=(True,))):
    """See `embedding_column`."""

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_embedding"


class SharedEmbeddingColumn(_Embedding, collections.namedtuple(
        "SharedEmbeddingColumn", ("categorical_column", "dimension", "combiner",
                                  "initializer", "shared_embedding_collection_name",
                                  "ckpt_to_load_from", "tensor_name_in_ckpt", "max_norm",
                                  "trainable", "use_safe_embedding_lookup"),
        defaults=(True,))):
    """See `shared_embedding_columns`."""

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_shared_embedding"

    @property
    def _var_scope_name(self) -> str:
        return self.shared_embedding_collection_name


class IndicatorColumn(DenseColumn, collections.namedtuple(
        "IndicatorColumn", ("categorical_column",))):
    """See `indicator_column`."""

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_indicator"

    @property
    def _parse_example_spec(self) -> dict:
        return self.categorical_column._parse_example_spec

    @property
    def _variable_shape(self) -> tuple:
        return (1, self.categorical_column.num_buckets)

    def _dense(self, builder, variables=None):
        return builder.prepared(("indicator", self), lambda: {
            "value": self._multi_hot(builder, self.categorical_column)})["value"]

    def _multi_hot(self, builder, categorical: CategoricalColumn) -> torch.Tensor:
        """[bags, num_buckets] of `categorical`'s bags (this column's, or a
        sequence column's one bag a step)."""
        size = self.categorical_column.num_buckets
        ids = categorical._valid_ids(builder, prune_weights=False)
        if ids.weights is None and is_arange(ids.rows, ids.batch):   # one id a row
            hot = torch.zeros(ids.batch, size, dtype=torch.float32)
            index = torch.from_numpy(ids.values.astype(np.int64, copy=False))
            return hot.scatter_(1, index.unsqueeze(1), 1.0)
        weights = ids.weights.astype(np.float64) if ids.weights is not None else None
        flat = np.bincount(ids.rows * size + ids.values, weights=weights,
                           minlength=ids.batch * size)
        return torch.from_numpy(flat.astype(np.float32).reshape(ids.batch, size))


# -- constructors ------------------------------------------------------------------------------
def _check_shape(shape, key) -> tuple:
    if not isinstance(shape, (list, tuple)):
        shape = [shape]
    shape = tuple(shape)
    for dimension in shape:
        if not isinstance(dimension, int) or isinstance(dimension, bool):
            raise TypeError(f"shape dimensions must be integer. shape: {shape}, key: {key}")
        if dimension < 1:
            raise ValueError(f"shape dimensions must be greater than 0. shape: {shape}, "
                             f"key: {key}")
    return shape


def _check_default_value(shape, default_value, dtype, key):
    """TF's ``fc_utils.check_default_value``: a scalar filled over `shape`, or
    nested values of exactly `shape`, compatible with `dtype`; as tuples."""
    if default_value is None:
        return None

    def fill(dims, value):
        return tuple(fill(dims[1:], value) for _ in range(dims[0])) if dims else value

    if isinstance(default_value, int) and not isinstance(default_value, bool):
        return fill(shape, default_value) if len(shape) > 1 else (default_value,) * shape[0]
    if isinstance(default_value, float) and is_floating(dtype):
        return fill(shape, default_value) if len(shape) > 1 else (default_value,) * shape[0]
    if callable(getattr(default_value, "tolist", None)):
        default_value = default_value.tolist()
    if isinstance(default_value, (list, tuple)):
        arr = np.asarray(default_value, dtype=object)
        if arr.shape != tuple(shape):
            raise ValueError(f"The shape of default_value must be equal to given shape. "
                             f"default_value: {default_value}, shape: {shape}, key: {key}")
        flat = arr.ravel().tolist()
        all_int = all(isinstance(v, int) and not isinstance(v, bool) for v in flat)
        has_float = any(isinstance(v, float) for v in flat)
        if all_int or (has_float and is_floating(dtype)):
            def as_tuple(v):
                return tuple(as_tuple(x) for x in v) if isinstance(v, (list, tuple)) else v
            return as_tuple(default_value)
    raise TypeError(f"default_value must be compatible with dtype. default_value: "
                    f"{default_value}, dtype: {dtype_name(dtype)}, key: {key}")


def numeric_column(key, shape=(1,), default_value=None, dtype=torch.float32,
                   normalizer_fn=None) -> NumericColumn:
    """Real-valued feature `key` of `shape` per example (TF: ``numeric_column``).

    Its dense value is ``normalizer_fn(feature)`` (when given; it receives the
    raw tensor, rank 1 expanded to ``[batch, 1]``) cast to float32.
    `default_value` only matters to parsing (`make_parse_example_spec`).
    """
    shape = _check_shape(shape, key)
    dtype = as_dtype(dtype, f"numeric_column({key!r})")
    if not (is_integer(dtype) or is_floating(dtype)):
        raise ValueError(f"dtype must be convertible to float. dtype: {dtype_name(dtype)}, "
                         f"key: {key}")
    default_value = _check_default_value(shape, default_value, dtype, key)
    if normalizer_fn is not None and not callable(normalizer_fn):
        raise TypeError(f"normalizer_fn must be a callable. Given: {normalizer_fn}")
    _check_key(key)
    return NumericColumn(key, shape, default_value, dtype, normalizer_fn)


def bucketized_column(source_column, boundaries) -> BucketizedColumn:
    """`source_column` discretized by `boundaries` (TF: ``bucketized_column``):
    buckets ``(-inf, b0), [b0, b1), ..., [bn, +inf)``, compared in float32."""
    if not isinstance(source_column, NumericColumn):
        raise ValueError("source_column must be a column generated with numeric_column(). "
                         f"Given: {source_column}")
    if len(source_column.shape) > 1:
        raise ValueError(f"source_column must be one-dimensional column. Given: {source_column}")
    if not boundaries:
        raise ValueError("boundaries must not be empty.")
    if not isinstance(boundaries, (list, tuple)):
        raise ValueError("boundaries must be a sorted list.")
    for i in range(len(boundaries) - 1):
        if boundaries[i] >= boundaries[i + 1]:
            raise ValueError("boundaries must be a sorted list.")
    return BucketizedColumn(source_column, tuple(float(b) for b in boundaries))


def categorical_column_with_hash_bucket(key, hash_bucket_size, dtype=STRING
                                        ) -> HashedCategoricalColumn:
    """Ids ``Fingerprint64(value) % hash_bucket_size`` (ints hashed as their
    decimal string), TF's ``categorical_column_with_hash_bucket``."""
    if hash_bucket_size is None:
        raise ValueError(f"hash_bucket_size must be set. key: {key}")
    hash_bucket_size = _check_int(hash_bucket_size, "hash_bucket_size")
    if hash_bucket_size < 1:
        raise ValueError(f"hash_bucket_size must be at least 1. hash_bucket_size: "
                         f"{hash_bucket_size}, key: {key}")
    _check_key(key)
    dtype = as_dtype(dtype, f"categorical_column_with_hash_bucket({key!r})")
    _check_string_or_int(dtype, f"column_name: {key}")
    return HashedCategoricalColumn(key, hash_bucket_size, dtype)


def _vocabulary_dtype(vocabulary_list, key):
    values = list(vocabulary_list)
    if all(isinstance(v, (str, bytes)) for v in values):
        return STRING
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
           for v in values):
        return torch.int64
    raise ValueError(f"column_name: {key} vocabulary dtype must be string or integer. "
                     f"vocabulary_list: {vocabulary_list}")


def categorical_column_with_vocabulary_list(key, vocabulary_list, dtype=None, default_value=-1,
                                            num_oov_buckets=0
                                            ) -> VocabularyListCategoricalColumn:
    """Ids from an in-memory vocabulary (TF: ``categorical_column_with_vocabulary_list``)."""
    if vocabulary_list is None or len(vocabulary_list) < 1:
        raise ValueError(f"vocabulary_list {vocabulary_list} must be non-empty, column_name: "
                         f"{key}")
    if isinstance(vocabulary_list, np.ndarray):
        vocabulary_list = vocabulary_list.tolist()
    # numpy scalars (pandas' sorted(df[c].unique())) as Python's: an export writes them
    vocabulary_list = [v.item() if isinstance(v, np.generic) else v for v in vocabulary_list]
    if len({v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v
            for v in vocabulary_list}
           ) != len(vocabulary_list):   # ("a" and b"a": one TF string)
        raise ValueError(f"Duplicate keys in vocabulary_list {vocabulary_list}, column_name: "
                         f"{key}")
    vocabulary_dtype = _vocabulary_dtype(vocabulary_list, key)
    num_oov_buckets = _check_int(num_oov_buckets, "num_oov_buckets")
    default_value = _check_int(default_value, "default_value")
    if num_oov_buckets:
        if default_value != -1:
            raise ValueError(f"Can't specify both num_oov_buckets and default_value in {key}.")
        if num_oov_buckets < 0:
            raise ValueError(f"Invalid num_oov_buckets {num_oov_buckets} in {key}.")
    dtype = as_dtype(dtype, f"categorical_column_with_vocabulary_list({key!r})")
    if dtype is None:
        dtype = vocabulary_dtype
    elif is_integer(dtype) != is_integer(vocabulary_dtype):
        raise ValueError(f"dtype {dtype_name(dtype)} and vocabulary dtype "
                         f"{dtype_name(vocabulary_dtype)} do not match, column_name: {key}")
    _check_string_or_int(dtype, f"column_name: {key}")
    _check_key(key)
    return VocabularyListCategoricalColumn(key, tuple(vocabulary_list), dtype, default_value,
                                           num_oov_buckets)


def categorical_column_with_vocabulary_file(key, vocabulary_file, vocabulary_size=None,
                                            num_oov_buckets=0, default_value=None,
                                            dtype=STRING) -> VocabularyFileCategoricalColumn:
    """Ids from a vocabulary file, one entry a line (TF:
    ``categorical_column_with_vocabulary_file``). Without `vocabulary_size` the
    file is read now to count its lines (a missing file is an error here);
    otherwise on first use."""
    if not vocabulary_file:
        raise ValueError(f"Missing vocabulary_file in {key}.")
    vocabulary_file = os.fspath(vocabulary_file)
    if vocabulary_size is None:
        if not os.path.isfile(vocabulary_file):
            raise ValueError(f"vocabulary_file {vocabulary_file!r} in {key} does not exist.")
        with open(vocabulary_file, "rb") as f:
            vocabulary_size = sum(1 for _ in f)
        if vocabulary_size == 0:
            raise ValueError(f"vocabulary_file {vocabulary_file!r} in {key} is empty (one "
                             "entry a line)")
    vocabulary_size = _check_int(vocabulary_size, "vocabulary_size")
    if vocabulary_size < 1:
        raise ValueError(f"Invalid vocabulary_size in {key}.")
    num_oov_buckets = _check_int(num_oov_buckets or 0, "num_oov_buckets")
    if num_oov_buckets:
        if default_value is not None:
            raise ValueError(f"Can't specify both num_oov_buckets and default_value in {key}.")
        if num_oov_buckets < 0:
            raise ValueError(f"Invalid num_oov_buckets {num_oov_buckets} in {key}.")
    dtype = as_dtype(dtype, f"categorical_column_with_vocabulary_file({key!r})")
    _check_string_or_int(dtype, f"column_name: {key}")
    _check_key(key)
    default_value = -1 if default_value is None else _check_int(default_value, "default_value")
    return VocabularyFileCategoricalColumn(key, vocabulary_file, vocabulary_size,
                                           num_oov_buckets, dtype, default_value)


def categorical_column_with_identity(key, num_buckets, default_value=None
                                     ) -> IdentityCategoricalColumn:
    """Integer values used as ids in ``[0, num_buckets)`` (TF:
    ``categorical_column_with_identity``). Outside that range a value becomes
    `default_value` when given; otherwise a value >= num_buckets is an error
    at lookup and a negative one is dropped, as in TF."""
    num_buckets = _check_int(num_buckets, "num_buckets")
    if num_buckets < 1:
        raise ValueError(f"num_buckets {num_buckets} < 1, column_name {key}")
    if default_value is not None:
        default_value = _check_int(default_value, "default_value")
        if default_value < 0 or default_value >= num_buckets:
            raise ValueError(f"default_value {default_value} not in range [0, {num_buckets}), "
                             f"column_name {key}")
    _check_key(key)
    return IdentityCategoricalColumn(key, num_buckets, default_value)


def weighted_categorical_column(categorical_column, weight_feature_key, dtype=torch.float32
                                ) -> WeightedCategoricalColumn:
    """`categorical_column`'s ids weighted by feature `weight_feature_key`, whose
    values pair with the ids element by element (same shape, or same row
    lengths for rows given as lists; TF: ``weighted_categorical_column``). The
    0.0 cells of dense weights are dropped, as TF does. Where dense ids hold
    missing cells (-1, "") TF drops those and the 0.0 weights each on its own
    and pairs what is left in order (wrong cells paired, or an
    InvalidArgumentError where the counts differ); here each id keeps the
    weight of its own cell."""
    dtype = as_dtype(dtype, "weighted_categorical_column")
    if dtype is None or not (is_integer(dtype) or is_floating(dtype)):
        raise ValueError(f"dtype {dtype_name(dtype) if dtype else None} is not convertible "
                         "to float.")
    if not isinstance(categorical_column, _LeafCategorical):
        raise ValueError("weighted_categorical_column needs a categorical_column_with_* "
                         f"column (one feature's ids). Given: {categorical_column}")
    _check_key(weight_feature_key)
    return WeightedCategoricalColumn(categorical_column, weight_feature_key, dtype)


def crossed_column(keys, hash_bucket_size, hash_key=None) -> CrossedColumn:
    """Hashed cross of features / categorical columns (TF: ``crossed_column``),
    ids exactly as TF's SparseCrossHashed gives them (string keys read their
    raw feature; a categorical key contributes its ids)."""
    if not hash_bucket_size or hash_bucket_size < 1:
        raise ValueError(f"hash_bucket_size must be > 1. hash_bucket_size: {hash_bucket_size}")
    hash_bucket_size = _check_int(hash_bucket_size, "hash_bucket_size")
    if not keys or len(keys) < 2:
        raise ValueError(f"keys must be a list with length > 1. Given: {keys}")
    for key in keys:
        if not isinstance(key, (str, CategoricalColumn)):
            raise ValueError("Unsupported key type. All keys must be either string, or "
                             "categorical column except HashedCategoricalColumn. "
                             f"Given: {key}")
        if isinstance(key, HashedCategoricalColumn):
            raise ValueError("categorical_column_with_hash_bucket is not supported for "
                             "crossing. Hashing before crossing will increase probability of "
                             f"collision. Instead, use the feature name as a string. Given: {key}")
    if hash_key is not None:
        hash_key = _check_int(hash_key, "hash_key")
    return CrossedColumn(tuple(keys), hash_bucket_size, hash_key)


def embedding_column(categorical_column, dimension, combiner="mean", initializer=None,
                     ckpt_to_load_from=None, tensor_name_in_ckpt=None, max_norm=None,
                     trainable=True, use_safe_embedding_lookup=True) -> EmbeddingColumn:
    """Dense embedding of a categorical column (TF: ``embedding_column``): a
    variable ``embedding_weights`` [num_buckets, dimension] combined per
    example by `combiner` ("mean", "sqrtn" or "sum", weighted for a weighted
    column). `initializer(shape)` returns the initial values (default TF's:
    truncated normal, mean 0, stddev 1/sqrt(dimension)). `max_norm` clips each
    looked-up vector to that l2 norm. Loading from a TF checkpoint
    (`ckpt_to_load_from`) is not supported: warm start instead.
    `use_safe_embedding_lookup=False` is TF's embedding_lookup_sparse: a
    weighted column's weights <= 0 count in "mean" and "sqrtn" (the safe
    lookup drops them; a row whose weights add up to 0 gives zeros). Either
    way an empty row gives zeros and negative ids are dropped, where TF's
    unsafe lookup fails on them or, for empty last rows, returns fewer rows."""
    if not isinstance(categorical_column, CategoricalColumn):
        raise ValueError("embedding_column needs a categorical column. Given: "
                         f"{categorical_column}")
    dimension, initializer, max_norm = _embedding_arguments(
        f"embedding_column({categorical_column.name!r})", dimension, combiner, initializer,
        ckpt_to_load_from, tensor_name_in_ckpt, max_norm)
    return EmbeddingColumn(categorical_column, dimension, combiner, initializer, None, None,
                           max_norm, bool(trainable), bool(use_safe_embedding_lookup))


def _embedding_arguments(what: str, dimension, combiner, initializer, ckpt_to_load_from,
                         tensor_name_in_ckpt, max_norm) -> tuple:
    """(dimension, initializer, max_norm) checked as TF checks an embedding's."""
    if dimension is None or not isinstance(dimension, (int, np.integer)) or dimension < 1:
        raise ValueError(f"Invalid dimension {dimension}.")
    if ckpt_to_load_from is not None:
        raise NotImplementedError(
            f"{what}: ckpt_to_load_from is not supported (it reads a TensorFlow checkpoint). "
            "Initialise the embedding from a checkpoint with est.WarmStartSettings("
            "ckpt_to_initialize_from=..., vars_to_warm_start=..., "
            "var_name_to_prev_var_name=...) instead.")
    if tensor_name_in_ckpt is not None:
        raise ValueError("Must specify both `ckpt_to_load_from` and `tensor_name_in_ckpt` or "
                         "none of them.")
    if combiner not in COMBINERS:
        raise ValueError(f"combiner must be one of {list(COMBINERS)}, got {combiner!r} "
                         f"({what})")
    if initializer is not None and not callable(initializer):
        raise ValueError(f"initializer must be callable if specified. {what}")
    if initializer is None:
        initializer = default_embedding_initializer(int(dimension))
    if max_norm is not None:
        max_norm = float(max_norm)
        if not max_norm > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm}")
    return int(dimension), initializer, max_norm


def shared_embedding_columns(categorical_columns, dimension, combiner="mean", initializer=None,
                             shared_embedding_collection_name=None, ckpt_to_load_from=None,
                             tensor_name_in_ckpt=None, max_norm=None, trainable=True,
                             use_safe_embedding_lookup=True) -> list:
    """One embedding column per categorical column, all looking up one table
    (TF: ``tf.compat.v1.feature_column.shared_embedding_columns``). The
    columns must be of one type (a weighted column's: its categorical
    column's) with one number of buckets. The table is
    ``<scope>/input_layer/<collection>/embedding_weights`` [num_buckets,
    dimension], `<collection>` the columns' names joined by ``_`` (sorted) +
    ``_shared_embedding`` unless `shared_embedding_collection_name` is given;
    as TF's graph collection, it is made by the first `input_layer` of the
    model that uses the columns and shared by every later one (two towers).
    Not usable in `linear_model` here."""
    columns = list(categorical_columns)
    if not columns:
        raise ValueError("shared_embedding_columns needs at least one categorical column")
    for column in columns:
        if not isinstance(column, CategoricalColumn):
            raise ValueError("All categorical_columns must be categorical columns "
                             f"(est.feature_column.categorical_column_with_*). Given: "
                             f"{column}, of type: {type(column).__name__}")
    kind = lambda c: type(c.categorical_column if isinstance(   # noqa: E731
        c, WeightedCategoricalColumn) else c)
    for column in columns[1:]:
        if kind(column) is not kind(columns[0]):
            raise ValueError(
                "To use shared_embedding_column, all categorical_columns must have the same "
                f"type, or be weighted_categorical_column of the same type. Given column: "
                f"{column} of type: {kind(column).__name__} does not match given column: "
                f"{columns[0]} of type: {kind(columns[0]).__name__}")
        if column.num_buckets != columns[0].num_buckets:
            raise ValueError(
                "To use shared_embedding_column, all categorical_columns must have the same "
                f"number of buckets. Given column: {columns[0]} with buckets: "
                f"{columns[0].num_buckets} does not match column: {column} with buckets: "
                f"{column.num_buckets}")
    if not shared_embedding_collection_name:
        shared_embedding_collection_name = "_".join(
            c.name for c in sorted(columns, key=lambda c: c.name)) + "_shared_embedding"
    dimension, initializer, max_norm = _embedding_arguments(
        f"shared_embedding_columns({shared_embedding_collection_name!r})", dimension, combiner,
        initializer, ckpt_to_load_from, tensor_name_in_ckpt, max_norm)
    return [SharedEmbeddingColumn(c, dimension, combiner, initializer,
                                  shared_embedding_collection_name, None, None, max_norm,
                                  bool(trainable), bool(use_safe_embedding_lookup))
            for c in columns]


def indicator_column(categorical_column) -> IndicatorColumn:
    """Multi-hot counts (weight sums for a weighted column) over the
    categorical column's buckets (TF: ``indicator_column``)."""
    if not isinstance(categorical_column, CategoricalColumn):
        raise ValueError("Unsupported input type. Input must be a CategoricalColumn. "
                         f"Given: {categorical_column}")
    return IndicatorColumn(categorical_column)


for _cls in (NumericColumn, BucketizedColumn, HashedCategoricalColumn,
             VocabularyListCategoricalColumn, VocabularyFileCategoricalColumn,
             IdentityCategoricalColumn, WeightedCategoricalColumn, CrossedColumn,
             EmbeddingColumn, SharedEmbeddingColumn, IndicatorColumn):
    _cls.__repr__ = _columns_repr
