"""The variables of the feature-column layers, and the sparse combines.

`ColumnVariables` is the torch module behind an embedding column of an
`input_layer` (``embedding_weights``), and `LinearModelVariables` the one
behind a whole `linear_model` (each column's ``weights``, an embedding
column's ``embedding_weights``, and ``bias_weights``). They are created
through ``hooks.model_scope.get_module`` under TF's variable-scope names, so
a checkpoint lists ``input_layer/<column>/embedding_weights`` or
``linear_model/<column>/weights`` as TF would. Their `forward` takes only
tensors, so a data-parallel strategy may wrap them (DDP syncs what passes
through forward).

`combine` is TF's ``safe_embedding_lookup_sparse`` on already pruned ids:
``torch.nn.functional.embedding_bag`` in "sum" mode (with
``per_sample_weights`` for weighted columns), divided per row by the count
or weight sum ("mean") or by the root of the sum of squares ("sqrtn"); an
empty row gives zeros; a plain ``embedding`` when every row holds one id.
``max_norm`` clips each looked-up row to that l2 norm (TF's
``clip_by_norm`` in ``embedding_lookup``) without touching the table.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from distribute import lookups

from ._inputs import is_arange

COMBINERS = ("mean", "sqrtn", "sum")

# name -> (shape, initializer(shape) -> values or None for zeros, trainable)
VariableSpecs = Dict[str, Tuple[Tuple[int, ...], Optional[Callable], bool]]


def truncated_normal(stddev: float) -> Callable:
    """TF's ``truncated_normal_initializer(mean=0, stddev)``: normal values
    redrawn beyond two standard deviations."""
    def init(shape):
        t = torch.empty(shape)
        return torch.nn.init.trunc_normal_(t, 0.0, stddev, -2 * stddev, 2 * stddev)
    return init


def _initial_value(name: str, shape, initializer) -> torch.Tensor:
    if initializer is None:
        return torch.zeros(shape)
    value = initializer(tuple(shape))
    value = torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor)
                            else value.detach(), dtype=torch.float32)
    if value.dim() == 0:
        value = value.expand(shape)
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"the initializer of {name} returned shape {list(value.shape)}, "
                         f"expected {list(shape)}")
    return value.clone()


def _register(module: torch.nn.Module, prefix: str, specs: VariableSpecs,
              tables=("embedding_weights",)) -> None:
    """`specs`' variables as parameters of `module`; those named in `tables`
    are read by lookups, which note their rows (`distribute.lookups`)."""
    for name, (shape, initializer, trainable) in specs.items():
        param = torch.nn.Parameter(_initial_value(prefix + name, shape, initializer),
                                   requires_grad=trainable)
        if name in tables:
            lookups.declare(param)
        module.register_parameter(prefix + name, param)


class ColumnVariables(torch.nn.Module):
    """An embedding column's ``embedding_weights`` in an input layer.
    `forward(ids, offsets=None, weights=None, scale=None)` is the combined
    embedding of the id bags (`combine`)."""

    def __init__(self, specs: VariableSpecs, max_norm: Optional[float] = None):
        super().__init__()
        _register(self, "", specs)
        self.max_norm = max_norm

    def forward(self, ids, offsets=None, weights=None, scale=None):
        lookups.note(self.embedding_weights, ids)
        return combine(self.embedding_weights, ids, offsets, weights, scale, self.max_norm)


class LinearModelVariables(torch.nn.Module):
    """Every variable of one `linear_model`, under TF's names below its scope
    (``<column>/weights``, ``<column>/embedding_weights``, ``bias_weights``),
    in one module so that one forward computes the model: one lookup over the
    ``weights`` of all categorical columns (concatenated), one product over the
    dense columns, each embedding column's bags, plus the bias.

    `columns` are ``(name, kind, specs, max_norm)`` in TF's order, kind one of
    "categorical", "dense", "embedding"."""

    def __init__(self, columns, units: int, trainable: bool):
        super().__init__()
        self.column_names = tuple(name for name, _, _, _ in columns)
        self._tables = [name for name, kind, _, _ in columns if kind == "categorical"]
        self._dense = [name for name, kind, _, _ in columns if kind == "dense"]
        self._embedded = [(name, max_norm) for name, kind, _, max_norm in columns
                          if kind == "embedding"]
        for name, kind, specs, _ in columns:
            _register(self, name + "/", specs, ("embedding_weights",) + (
                ("weights",) if kind == "categorical" else ()))
        self.bias_weights = torch.nn.Parameter(torch.zeros(units), requires_grad=trainable)

    def column_parameters(self, name: str) -> list:
        return [p for key, p in self._parameters.items() if key.startswith(name + "/")]

    def _note_lookups(self, ids: torch.Tensor) -> None:
        """The rows each categorical table's lookup read (`ids` index their
        concatenation)."""
        if not torch.is_grad_enabled():
            return
        start = 0
        for name in self._tables:
            param = self._parameters[f"{name}/weights"]
            lookups.note(param, ids, first_row=start)
            start += len(param)

    def _cat(self, names) -> torch.Tensor:
        params = [self._parameters[f"{name}/weights"] for name in names]
        return params[0] if len(params) == 1 else torch.cat(params)

    def forward(self, ids=None, offsets=None, weights=None, dense=None, embedded=()):
        """`ids` index the concatenated tables: [batch, columns] when every
        column has one id per row (no `offsets`), else `embedding_bag`'s flat
        ids, `offsets` and per-sample `weights`; `dense` the dense columns'
        values side by side; `embedded` each embedding column's `combine` inputs."""
        terms = []
        if self._tables:
            table = self._cat(self._tables)
            self._note_lookups(ids)
            if offsets is None:
                # (not table[ids]: its CPU backward adds in an order that varies)
                terms.append(F.embedding(ids, table).sum(1))
            else:
                terms.append(F.embedding_bag(ids, table, offsets, mode="sum",
                                             per_sample_weights=weights))
        if self._dense:
            terms.append(dense.to(self.bias_weights.dtype) @ self._cat(self._dense))
        for (name, max_norm), bag in zip(self._embedded, embedded):
            table = self._parameters[f"{name}/embedding_weights"]
            lookups.note(table, bag["ids"])
            terms.append(combine(table, max_norm=max_norm, **bag)
                         @ self._parameters[f"{name}/weights"])
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total + self.bias_weights


def combine(table: torch.Tensor, ids: torch.Tensor, offsets: Optional[torch.Tensor] = None,
            weights: Optional[torch.Tensor] = None, scale: Optional[torch.Tensor] = None,
            max_norm: Optional[float] = None) -> torch.Tensor:
    """Sum (weighted) of `table` rows per bag, divided by `scale` where given;
    without `offsets`, one row per id (every bag holds one id)."""
    if max_norm is not None:
        unique, ids = torch.unique(ids, return_inverse=True)
        rows = table[unique]
        norm = rows.norm(dim=1, keepdim=True)
        table = rows * max_norm / torch.clamp(norm, min=max_norm)
    if offsets is None:
        return F.embedding(ids, table)
    out = F.embedding_bag(ids, table, offsets, mode="sum", per_sample_weights=weights)
    if scale is not None:
        out = out / scale.unsqueeze(1)
    return out


def _counts(rows: np.ndarray, batch: int) -> np.ndarray:
    return np.bincount(rows, minlength=batch) if len(rows) else np.zeros(batch, np.int64)


def _row_scale(rows, batch, weights, combiner) -> Optional[np.ndarray]:
    """The per-row divisor of "mean" / "sqrtn" (1 for an empty row, whose sum
    is 0; inf for a row of weights adding up to 0, which TF's unsafe lookup
    divides with div_no_nan: zeros); None for "sum"."""
    if combiner == "sum":
        return None
    counts = _counts(rows, batch)
    if weights is None:
        total = counts.astype(np.float64)
        total = total if combiner == "mean" else np.sqrt(total)
    else:
        w = weights.astype(np.float64)   # (bincount of no rows is int64, even weighted)
        if combiner == "mean":
            total = np.bincount(rows, weights=w, minlength=batch).astype(np.float64)
        else:
            total = np.sqrt(np.bincount(rows, weights=w * w, minlength=batch).astype(np.float64))
    if weights is not None and combiner == "mean" and (weights <= 0).any():
        # (unsafe lookups: TF adds a row's weights in float32, in order)
        total32 = np.zeros(batch, np.float32)
        np.add.at(total32, rows, weights.astype(np.float32))
        total[total32 == 0] = np.inf
    total[total == 0] = np.inf
    total[counts == 0] = 1.0
    return total


def bag_inputs(values: np.ndarray, rows: np.ndarray, batch: int,
               weights: Optional[np.ndarray], combiner: str, general: bool = False) -> dict:
    """`combine`'s id arguments (CPU tensors) for pruned id bags: just the ids
    when every row holds one unweighted id (any combiner gives that row) and
    not `general`, else offsets from the row of each id, the weights, and the
    combiner's per-row divisor."""
    ids = _tensor(values.astype(np.int64, copy=False))
    if not general and weights is None and is_arange(rows, batch):
        return {"ids": ids}
    counts = _counts(rows, batch)
    scale = _row_scale(rows, batch, weights, combiner)
    return {"ids": ids, "offsets": _tensor((np.cumsum(counts) - counts).astype(np.int64)),
            "weights": None if weights is None else _tensor(weights.astype(np.float32)),
            "scale": None if scale is None else _tensor(scale.astype(np.float32))}


def fused_bag_inputs(bags, sizes, combiner: str, general: bool = False) -> dict:
    """`LinearModelVariables.forward`'s ids (CPU tensors) for the categorical
    columns' pruned id bags (`Ids`, tables of `sizes` rows, concatenated): a
    [batch, columns] index when each column has one unweighted id per row
    (and not `general`), else the bags merged row by row, each id weighted by
    its weight (1 if none) over its column's `combiner` divisor."""
    batch = bags[0].batch
    starts = [0] + list(itertools.accumulate(sizes[:-1]))
    if not general and all(b.weights is None and is_arange(b.rows, batch) for b in bags):
        ids = np.empty((batch, len(bags)), np.int64)
        for i, (bag, start) in enumerate(zip(bags, starts)):
            np.add(bag.values, start, out=ids[:, i], casting="unsafe")
        return {"ids": torch.from_numpy(ids)}
    weighted = combiner != "sum" or any(b.weights is not None for b in bags)
    values, rows, weights = [], [], []
    for bag, start in zip(bags, starts):
        values.append(bag.values.astype(np.int64, copy=False) + start)
        rows.append(bag.rows)
        if weighted:
            w = (np.ones(len(bag.rows)) if bag.weights is None
                 else bag.weights.astype(np.float64))
            scale = _row_scale(bag.rows, batch, bag.weights, combiner)
            weights.append(w if scale is None else w / scale[bag.rows])
    rows = np.concatenate(rows)
    order = np.argsort(rows, kind="stable")
    counts = _counts(rows, batch)
    return {"ids": _tensor(np.concatenate(values)[order]),
            "offsets": _tensor((np.cumsum(counts) - counts).astype(np.int64)),
            "weights": (_tensor(np.concatenate(weights)[order].astype(np.float32))
                        if weighted else None)}


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def moved(inputs: dict, device: torch.device) -> dict:
    """`inputs` (tensors or None) on `device` (as they are on the CPU)."""
    if device.type == "cpu":
        return inputs
    return {k: None if v is None else v.to(device, non_blocking=True)
            for k, v in inputs.items()}


def default_embedding_initializer(dimension: int) -> Callable:
    """TF's default for embedding columns: truncated normal, stddev 1/sqrt(dimension)."""
    return truncated_normal(1.0 / math.sqrt(dimension))
