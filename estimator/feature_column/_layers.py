"""`input_layer` and `linear_model` (TF: ``tf.compat.v1.feature_column``'s).

Both go over the columns sorted by name, as TF does, and keep their
variables in modules of the model scope (``hooks.model_scope.get_module``:
one per embedding column of an input layer, one per linear model, which
computes the model in one lookup), named after TF's variable scopes so a
checkpoint lists them as TF would:

    input_layer/<column>/embedding_weights      [num_buckets, dimension]
    linear_model/<column>/weights               [num_buckets or elements, units]
    linear_model/<column>/embedding_weights     (an embedding column in it)
    linear_model/bias_weights                   [units]

`scope` puts them under an enclosing variable scope, as TF's
``with tf.variable_scope(scope):`` would: ``scope="dnn/input_from_feature_columns"``
gives ``dnn/input_from_feature_columns/input_layer/...``. A second call with
the same scope and columns reuses the variables (TF would open
``input_layer_1``; give another `scope` for separate ones). Outside a
model_fn (no model scope) each call creates fresh variables.

`features` is the features dict, or a `FeatureTransformationCache` of it
(TF2's name) shared by the layers over one batch so that each column is
transformed once (a canned wide & deep model passes one to both parts).
"""
from __future__ import annotations

import re
import weakref
from typing import Callable, Optional

import numpy as np
import torch

from distribute import device_util
from distribute.variable_names import DOT, torch_key
from hooks import model_scope

from ._columns import (CategoricalColumn, DenseColumn, EmbeddingColumn, FeatureColumn,
                       IndicatorColumn, SharedEmbeddingColumn, _Embedding)
from ._inputs import Builder, transformation_cache
from ._sequence import SequenceNumericColumn, is_sequence_categorical, sequence_hosts
from ._variables import (COMBINERS, ColumnVariables, LinearModelVariables, fused_bag_inputs,
                         moved)


def _normalize_feature_columns(feature_columns) -> list:
    if isinstance(feature_columns, FeatureColumn):
        feature_columns = [feature_columns]
    if isinstance(feature_columns, dict):
        raise ValueError("Expected feature_columns to be iterable, found dict.")
    feature_columns = list(feature_columns)
    for column in feature_columns:
        if not isinstance(column, FeatureColumn):
            raise ValueError("Items of feature_columns must be a FeatureColumn. "
                             f"Given (type {type(column)}): {column}.")
    if not feature_columns:
        raise ValueError("feature_columns must not be empty.")
    by_name = {}
    for column in feature_columns:
        if column.name in by_name:
            raise ValueError(
                f"Duplicate feature column name found for columns: {column} and "
                f"{by_name[column.name]}. This usually means that these columns refer to "
                "same base feature. Either one must be discarded or a duplicated but "
                "renamed item must be inserted in features dict.")
        by_name[column.name] = column
    return feature_columns


def _variables(name: str, factory: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The module `name` of the active model scope (created on first use, restored
    from a checkpoint, placed by the strategy), or a fresh one outside any."""
    try:
        model_scope.current()
    except RuntimeError:
        return factory()
    return model_scope.get_module(name, factory)


def _output_device(builder: Builder, modules) -> torch.device:
    """Where the layer's output goes: the batch's device, else the variables',
    else the strategy's single device, else the CPU."""
    device = builder.device()
    if device is not None:
        return device
    for module in modules:
        for p in module.parameters():
            return p.device
    try:
        devices = model_scope.current().strategy.extended.worker_devices
    except (RuntimeError, AttributeError):
        devices = ()
    if len(devices) == 1:
        try:
            return device_util.canonicalize(devices[0])
        except (ValueError, RuntimeError):
            pass
    return torch.device("cpu")


_builder = transformation_cache


def _prefix(scope: Optional[str], name: str) -> str:
    scope = (scope or "").strip("/")
    return f"{scope}/{name}" if scope else name


def _flatten(column, tensor: torch.Tensor) -> torch.Tensor:
    batch, elements = tensor.shape[0], column._num_elements
    if tensor.dim() == 2 and tensor.shape[1] == elements:
        return tensor
    if tensor.numel() != batch * elements:
        raise ValueError(f"Column {column.name!r} gave shape {list(tensor.shape)}, which does "
                         f"not hold {elements} values per example (its shape is "
                         f"{list(column._variable_shape)})")
    return tensor.reshape(batch, elements)


def _check_batch_sizes(sizes, columns) -> None:
    for i, size in enumerate(sizes):
        if size != sizes[0]:
            raise ValueError("Batch size (first dimension) of each feature must be same. "
                             f"Batch size of columns ({columns[0].name}, {columns[i].name}): "
                             f"({sizes[0]}, {size})")


def input_layer(features, feature_columns, weight_collections=None, trainable=True,
                cols_to_vars=None, cols_to_output_tensors=None, *, scope=None,
                name="input_layer") -> torch.Tensor:
    """The dense ``[batch, sum of column sizes]`` float32 input of a model
    (TF: ``tf.compat.v1.feature_column.input_layer``): each dense column's
    tensor flattened per example, concatenated in the order of the column
    names. Categorical columns must be wrapped in `embedding_column` or
    `indicator_column`.

    `trainable=False` freezes the embeddings; `cols_to_vars` (a dict) is filled
    with ``{column: [parameters]}`` and `cols_to_output_tensors` with
    ``{column: its [batch, n] slice}``. `weight_collections` is accepted for
    TF's signature (there are no graph collections). `scope`: see the module
    doc; `name` replaces ``input_layer`` in the variables' names (Keras'
    ``DenseFeatures`` layer is ``dense_features``).
    """
    del weight_collections
    prefix = _prefix(scope, name)
    ordered, factories = _planned(("input_layer", prefix, bool(trainable)), feature_columns,
                                  lambda: _input_layer_plan(feature_columns, prefix, trainable))
    builder = _builder(features)
    modules = _column_modules(ordered, factories, cols_to_vars)
    tensors = [_flatten(column, column._dense(builder, variables))
               for column, variables in zip(ordered, modules)]
    device = _output_device(builder, [m for m in modules if m is not None])
    tensors = [t if t.device == device else t.to(device) for t in tensors]
    _check_batch_sizes([t.shape[0] for t in tensors], ordered)
    if cols_to_output_tensors is not None:
        cols_to_output_tensors.update(zip(ordered, tensors))
    return torch.cat(tensors, 1)


def _column_modules(ordered, factories, cols_to_vars) -> list:
    """Each column's variables module (None for a column without), a shared
    embedding's table made once; `cols_to_vars` filled."""
    modules, shared = [], {}
    for column, (name, factory) in zip(ordered, factories):
        variables = None
        if isinstance(column, SharedEmbeddingColumn):
            variables = shared.get(name)
            if variables is None:
                variables = shared[name] = _variables(_shared_name(name, column), factory)
        elif factory is not None:
            variables = _variables(name, factory)
        modules.append(variables)
        if cols_to_vars is not None:
            cols_to_vars[column] = list(variables.parameters()) if variables is not None else []
    return modules


def sequence_input_layer(features, feature_columns, weight_collections=None, trainable=True,
                         *, scope=None, name="sequence_input_layer") -> tuple:
    """``(input, sequence_length)`` of sequence columns (TF1:
    ``tf.contrib.feature_column.sequence_input_layer``; TF2: Keras'
    ``SequenceFeatures``): `input` the float32 ``[batch, T, D]`` steps, each
    column's ``[batch, T, n]`` concatenated in the order of the column names;
    `sequence_length` each example's steps (int64 ``[batch]``, on the CPU,
    where ``pack_padded_sequence`` takes it). The columns must agree on
    every example's length (TF asserts it at run time). Columns:
    `sequence_numeric_column`, and an `embedding_column` / `indicator_column`
    / `shared_embedding_columns` of a ``sequence_categorical_column_with_*``.
    Variables are ``sequence_input_layer/<column>/embedding_weights`` (TF1's
    names; Keras' ``SequenceFeatures`` layer is ``name="sequence_features"``).
    `scope`, `trainable`: as `input_layer`'s."""
    del weight_collections
    prefix = _prefix(scope, name)
    ordered, factories = _planned(("sequence_input_layer", prefix, bool(trainable)),
                                  feature_columns,
                                  lambda: _sequence_plan(feature_columns, prefix, trainable))
    builder = _builder(features)
    modules = _column_modules(ordered, factories, None)
    host = builder.prepared(("sequence", tuple(ordered)),
                            lambda: sequence_hosts(ordered, builder))
    tensors = [_sequence_dense({k.split("_", 1)[1]: v for k, v in host.items()
                                if k.startswith(f"c{j}_")}, variables)
               for j, variables in enumerate(modules)]
    device = _output_device(builder, [m for m in modules if m is not None])
    tensors = [t if t.device == device else t.to(device) for t in tensors]
    return torch.cat(tensors, 2), host["lengths"]


def _sequence_dense(host: dict, variables) -> torch.Tensor:
    """A sequence column's float32 ``[batch, T, n]`` from its host tensors."""
    if variables is None:   # (numeric, indicator)
        return host["value"].flatten(2)
    grid = host.get("offsets", host.get("ids"))   # [batch, T]: one bag a step
    bags = {k: v.reshape(-1) if k in ("offsets", "scale") or v is grid else v
            for k, v in host.items() if v is not None}
    table = getattr(variables, "module", variables).embedding_weights   # (DDP wraps it)
    flat = variables(**moved(bags, table.device))
    return flat.reshape(grid.shape[0], grid.shape[1], flat.shape[-1])


def _is_sequence_dense(column) -> bool:
    return isinstance(column, SequenceNumericColumn) or (
        isinstance(column, (_Embedding, IndicatorColumn))
        and is_sequence_categorical(column.categorical_column))


def _sequence_plan(feature_columns, prefix: str, trainable) -> tuple:
    columns = _normalize_feature_columns(feature_columns)
    for column in columns:
        if _is_sequence_dense(column):
            continue
        if isinstance(column, (_Embedding, IndicatorColumn)):
            kind = "embedding_column" if isinstance(column, _Embedding) else "indicator_column"
            raise ValueError(
                f"In {kind}: {column.name}. categorical_column must be of type "
                "SequenceCategoricalColumn to use sequence_input_layer. Suggested fix: Use "
                f"one of sequence_categorical_column_with_*. Given (type "
                f"{type(column.categorical_column).__name__}): {column.categorical_column}")
        raise ValueError(
            "Items of feature_columns must be a sequence column (sequence_numeric_column, or "
            "an embedding_column / indicator_column of a "
            f"sequence_categorical_column_with_*). Given: {column}")
    ordered = sorted(columns, key=lambda c: c.name)
    return ordered, _column_factories(ordered, prefix, trainable, "sequence_input_layer")


def concatenate_context_input(context_input: torch.Tensor, sequence_input: torch.Tensor
                              ) -> torch.Tensor:
    """Each example's context ``[batch, d]`` repeated at every step of its
    sequence ``[batch, T, D]`` and appended to it: ``[batch, T, D + d]``
    (TF1: ``tf.contrib.feature_column.concatenate_context_input``; TF2's RNN
    estimators use it)."""
    if context_input.dim() != 2:
        raise ValueError(f"context_input must have rank 2. Received rank "
                         f"{context_input.dim()}, shape {list(context_input.shape)}")
    if sequence_input.dim() != 3:
        raise ValueError(f"sequence_input must have rank 3. Received rank "
                         f"{sequence_input.dim()}, shape {list(sequence_input.shape)}")
    for name, tensor in (("context_input", context_input), ("sequence_input", sequence_input)):
        if tensor.dtype != torch.float32:
            raise TypeError(f"{name} must have dtype float32; got {tensor.dtype}.")
    tiled = context_input.unsqueeze(1).expand(-1, sequence_input.shape[1], -1)
    return torch.cat([sequence_input, tiled.to(sequence_input.device)], 2)


_SHARED_NAMES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # scope -> {name: where}


def _shared_name(name: str, column) -> str:
    """Where a shared embedding's table lives: under the first layer of the
    model that made it (TF's graph collection), else `name` (this layer's).
    Found once per model scope, not on every step."""
    try:
        scope = model_scope.current()
    except RuntimeError:
        return name
    found = _SHARED_NAMES.setdefault(scope, {})
    if name not in found:
        own = "input_layer/" + _scope_name(column)
        found[name] = next((m for m in scope.modules if m == own or m.endswith("/" + own)),
                           name)
    return found[name]


# TF's _sanitize_column_name_for_variable_scope: what is not [A-Za-z0-9_.-]
# is '_'; a space, ':' or a non-ASCII character (which TF's scopes refuse) kept
_NOT_IN_SCOPES = re.compile(r"[^A-Za-z0-9_.\- :\u0080-\U0010ffff]")


def _scope_name(column) -> str:
    """The column's variable scope as TF names it: `linear_model/a_b/weights`
    for column "a/b" (a '.' kept: a linear model's variables hold it as
    `torch_key`s); a shared embedding's collection name as it is, as TF's."""
    if isinstance(column, SharedEmbeddingColumn):
        return column._var_scope_name
    return _NOT_IN_SCOPES.sub("_", column._var_scope_name)


def _refuse_shared_scopes(columns, what: str) -> None:
    """Two columns whose variables TF would name alike ("a/b" and "a_b"):
    TF's "Variable ... already exists", not one variable for both."""
    seen = {}
    for column in columns:
        scope = _scope_name(column).replace(DOT, ".")
        other = seen.setdefault(scope, column)
        if other is not column and other.name != column.name and not (
                isinstance(other, SharedEmbeddingColumn)     # (one collection's
                and isinstance(column, SharedEmbeddingColumn)):   # table, shared)
            raise ValueError(f"{what}: the columns {other.name!r} and {column.name!r} would "
                             f"both be variable scope {scope!r} (TF: Variable {scope}/... "
                             "already exists): rename one of them")


def _input_layer_plan(feature_columns, prefix: str, trainable) -> tuple:
    """The columns in TF's order, each with its module's name and factory
    (None for a column without variables)."""
    columns = _normalize_feature_columns(feature_columns)
    for column in columns:
        if not isinstance(column, DenseColumn):
            raise ValueError("Items of feature_columns must be a DenseColumn. You can wrap a "
                             "categorical column with an embedding_column or "
                             f"indicator_column. Given: {column}")
        if _is_sequence_dense(column):
            kind = "embedding_column" if isinstance(column, _Embedding) else "indicator_column"
            raise ValueError(
                f"In {kind}: {column.name}. categorical_column must not be of type "
                "SequenceCategoricalColumn. Suggested fix A: If you wish to use input_layer, "
                "use a non-sequence categorical_column_with_*. Suggested fix B: If you wish "
                "to create sequence input, use sequence_input_layer instead of input_layer. "
                f"Given (type SequenceCategoricalColumn): {column.categorical_column}")
    ordered = sorted(columns, key=lambda c: c.name)
    return ordered, _column_factories(ordered, prefix, trainable, "input_layer")


def _column_factories(ordered, prefix: str, trainable, what: str) -> list:
    """Each column's module name and factory (None for a column without variables)."""
    _refuse_shared_scopes([c for c in ordered if c._variable_specs(trainable)], what)
    factories = []
    for column in ordered:
        specs = column._variable_specs(trainable)
        factory = None if not specs else (
            lambda specs=specs, column=column: ColumnVariables(
                specs, getattr(column, "max_norm", None)))
        factories.append((f"{prefix}/{_scope_name(column)}", factory))
    return factories


_PLANS: dict = {}   # what each layer works out once per set of columns
_PLANS_MAX = 256


def _planned(key: tuple, feature_columns, make: Callable[[], tuple]) -> tuple:
    """`make()` once per `key` and list of columns (by identity, the columns
    kept alive beside the plan); columns given otherwise are planned each call."""
    if not isinstance(feature_columns, (list, tuple)) or isinstance(feature_columns,
                                                                     FeatureColumn):
        return make()
    key = key + tuple(map(id, feature_columns))
    entry = _PLANS.get(key)
    if entry is None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        entry = _PLANS[key] = (list(feature_columns), make())
    return entry[1]


def linear_model(features, feature_columns, units=1, sparse_combiner="sum",
                 weight_collections=None, trainable=True, cols_to_vars=None, *,
                 scope=None) -> torch.Tensor:
    """A linear prediction ``[batch, units]`` over the columns (TF:
    ``tf.compat.v1.feature_column.linear_model``): the sum over columns of their
    weighted sums, plus ``bias_weights``; every variable starts at zero.

    A categorical column (bucketized included) is weighted as its multi-hot
    indicator: the ``weights`` rows of its ids combined by `sparse_combiner`
    ("sum", "mean" or "sqrtn"; weighted for a weighted column); a dense
    column is ``tensor @ weights``. `cols_to_vars` gets ``{column: [weights,
    ...]}`` and ``"bias"``. `scope`: see the module doc.
    """
    del weight_collections
    if sparse_combiner not in COMBINERS:
        raise ValueError(f"sparse_combiner must be one of {list(COMBINERS)}, got "
                         f"{sparse_combiner!r}")
    if not isinstance(units, int) or isinstance(units, bool) or units < 1:
        raise ValueError(f"units must be a positive int, got {units!r}")
    prefix = _prefix(scope, "linear_model")
    ordered, names, specs = _planned(("linear_model", prefix, units, bool(trainable)),
                                     feature_columns,
                                     lambda: _linear_plan(feature_columns, units, trainable))
    builder = _builder(features)
    variables = _variables(prefix, lambda: LinearModelVariables(specs, units, bool(trainable)))
    raw = getattr(variables, "module", variables)   # (under a DDP wrapper)
    if raw.column_names != names:
        raise ValueError(f"linear_model {prefix!r} was built over the columns "
                         f"{list(raw.column_names)}; this call gives {list(names)}: give "
                         "each set of columns its own scope=")
    if cols_to_vars is not None:
        cols_to_vars.update((c, raw.column_parameters(torch_key(_scope_name(c))))
                            for c in ordered)
        cols_to_vars["bias"] = [raw.bias_weights]
    where = raw.bias_weights.device
    categorical = tuple(c for c in ordered if isinstance(c, CategoricalColumn))
    inputs, dense, embedded, batches = {}, [], [], []
    if categorical:
        inputs = moved(builder.prepared(("linear", categorical, sparse_combiner),
                                        lambda: linear_ids(builder, categorical,
                                                           sparse_combiner)), where)
        batches.append(inputs["ids"].shape[0] if inputs.get("offsets") is None
                       else inputs["offsets"].shape[0])
    for column in ordered:
        if isinstance(column, EmbeddingColumn):
            embedded.append(moved(column._lookup_inputs(builder), where))
            lookup = embedded[-1]
            batches.append(lookup["ids"].shape[0] if lookup.get("offsets") is None
                           else lookup["offsets"].shape[0])
        elif not isinstance(column, CategoricalColumn):
            dense.append(_flatten(column, column._dense(builder, None)))
            batches.append(dense[-1].shape[0])
    _check_batch_sizes(batches, categorical[:1] + tuple(
        c for c in ordered if not isinstance(c, CategoricalColumn)))
    inputs = dict(inputs)
    if dense:
        dense = dense[0] if len(dense) == 1 else torch.cat(
            [d.to(dense[0].device) for d in dense], 1)
        inputs["dense"] = dense if dense.device == where else dense.to(where)
    return variables(**inputs, embedded=embedded)


def categorical_ids(features, column: CategoricalColumn) -> torch.Tensor:
    """[batch, 1] int64: each example's id of the categorical `column`, as
    TF's boosted trees read a bare categorical column (``tf.sparse.to_dense``
    of its ids): an absent value ('' or -1 in a dense input, an empty row)
    0, an id outside the vocabulary its default_value (-1 by default). One
    value an example at most."""
    if not isinstance(column, CategoricalColumn) or is_sequence_categorical(column):
        raise ValueError(f"categorical_ids takes a categorical column, got "
                         f"{type(column).__name__} {getattr(column, 'name', column)!r}")
    builder = _builder(features)
    return builder.prepared(("ids", column), lambda: single_ids(builder, column))["value"]


def single_ids(builder: Builder, column: CategoricalColumn) -> dict:
    """`categorical_ids`' host work: {"value": [batch, 1] int64 (CPU)}."""
    ids = column._ids(builder)
    if ids.weights is not None:
        raise ValueError(f"{column.name!r} is a weighted categorical column: its ids have "
                         "weights, which one id an example cannot hold")
    counts = np.bincount(ids.rows, minlength=ids.batch)
    if len(counts) and counts.max() > 1:
        row = int(np.argmax(counts > 1))
        raise ValueError(f"Column {column.name!r} has {int(counts[row])} values in row {row}: "
                         "one value an example is read here (TF's several feature dimensions "
                         "of a categorical column are not built)")
    if len(ids.values):
        top = int(ids.values.max())
        if top >= column.num_buckets:
            raise column._out_of_range(top)
    dense = np.zeros(ids.batch, np.int64)
    dense[ids.rows] = ids.values
    return {"value": torch.from_numpy(dense).unsqueeze(1)}


def linear_ids(builder: Builder, categorical, combiner: str) -> dict:
    """The ids of a linear model's categorical columns (host work, CPU tensors)."""
    bags = [c._valid_ids(builder, prune_weights=combiner != "sum") for c in categorical]
    _check_batch_sizes([b.batch for b in bags], categorical)
    return fused_bag_inputs(bags, [c.num_buckets for c in categorical], combiner,
                            builder.general)


def _linear_plan(feature_columns, units: int, trainable) -> tuple:
    """The columns in TF's order, their names, and `LinearModelVariables`'
    columns: each one's ``weights`` [rows, units] (rows: its buckets, or its
    values per example), zeros, plus an embedding column's own variables."""
    columns = _normalize_feature_columns(feature_columns)
    for column in columns:
        if not isinstance(column, (DenseColumn, CategoricalColumn)):
            raise ValueError("Items of feature_columns must be either a DenseColumn or "
                             f"CategoricalColumn. Given: {column}")
        if isinstance(column, SharedEmbeddingColumn):
            raise ValueError(f"linear_model: {column.name!r} is a shared embedding column, "
                             "which linear_model does not take here; give it the categorical "
                             "column (or an embedding_column)")
    ordered = sorted(columns, key=lambda c: c._var_scope_name)
    _refuse_shared_scopes(ordered, "linear_model")
    trainable = bool(trainable)
    out = []
    for column in ordered:
        if isinstance(column, CategoricalColumn):
            kind, rows = "categorical", column.num_buckets
        else:
            kind = "embedding" if isinstance(column, EmbeddingColumn) else "dense"
            rows = column._num_elements
        specs = {"weights": ((rows, units), None, trainable)}
        if kind == "embedding":
            specs.update(column._variable_specs(trainable))
        out.append((torch_key(_scope_name(column)), kind, specs,
                    getattr(column, "max_norm", None)))
    return ordered, tuple(name for name, _, _, _ in out), out
