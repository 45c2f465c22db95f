"""`LinearSDCA`: the linear estimators trained by stochastic dual coordinate
ascent (TF: ``tf.estimator.experimental.LinearSDCA``, TF's ``SdcaOptimizerV2``
kernel with ``_SDCAModel``).

TF's objective, over every example id seen: ``sum_i w_i loss(x_i . beta, y_i)
+ l2 / 2 |beta|^2 + l1 |beta|_1`` (squared loss for `LinearRegressor`,
logistic for a binary `LinearClassifier`; the bias a feature always 1,
regularized as the others). Each example keeps its dual value in a table by
its id (TF's ``ShardedMutableHashTable``, saved with the checkpoint), so a
later epoch continues from it. A step visits the batch's examples one after
the other in a random order (TF's is drawn from ``std::random_device``, no
seed reaches it; here from torch's generator, so `tf_random_seed` repeats a
run), each one's new dual moving the unshrunk weights (TF's ``<var>_unshrunk``
slots) by ``(new - old) w_i x_i / l2``; the model's weights are then
``sign(u) max(|u| - l1 / l2, 0)`` of them. ``num_loss_partitions`` P makes
each step P times more cautious, as TF's: set it to the number of replicas
(TF's workers), each of which steps its batch and applies every replica's
rows and changes, so that all keep one table and the same weights.
"""
from __future__ import annotations

import hashlib
import logging
import math
import numbers
from typing import Dict

import numpy as np
import torch

import distribute
from hooks import model_scope, summary

from .. import feature_column

logger = logging.getLogger(__name__)

SQUARED_LOSS, LOGISTIC_LOSS = "squared_loss", "logistic_loss"
_MODULE = "linear/sdca"   # the unshrunk weights and the example table


class LinearSDCA:
    """The SDCA "optimizer" of `LinearClassifier` (two classes) and
    `LinearRegressor` (one label), TF's arguments and defaults: give it as
    ``optimizer=``; the input's features hold each example's id under
    `example_id_column` (strings or integers: an id seen again continues
    from its dual). `num_table_shards` splits TF's table over ps tasks:
    accepted, one table here. TF's ``adaptive=True`` sampling is not built
    (its kernel revisits the batch's first example and skips others)."""

    def __init__(self, example_id_column, num_loss_partitions=1, num_table_shards=None,
                 symmetric_l1_regularization=0.0, symmetric_l2_regularization=1.0,
                 adaptive=False):
        if not isinstance(example_id_column, str) or not example_id_column:
            raise ValueError(f"LinearSDCA: example_id_column must be the name of the feature "
                             f"holding the example ids, got {example_id_column!r}")
        if not _positive_int(num_loss_partitions):
            raise ValueError(f"LinearSDCA: num_loss_partitions must be a positive int, got "
                             f"{num_loss_partitions!r}")
        if num_table_shards is not None and not _positive_int(num_table_shards):
            raise ValueError(f"LinearSDCA: num_table_shards must be None or a positive int, "
                             f"got {num_table_shards!r}")
        for name, value in (("symmetric_l1_regularization", symmetric_l1_regularization),
                            ("symmetric_l2_regularization", symmetric_l2_regularization)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"LinearSDCA: {name} must be a number, got {value!r}")
        l1, l2 = float(symmetric_l1_regularization), float(symmetric_l2_regularization)
        if not l2 > 0.0:
            raise ValueError("symmetric_l2_regularization should be positive.")
        if not l1 >= 0.0:
            raise ValueError("symmetric_l1_regularization should be non-negative.")
        if adaptive:
            raise ValueError("LinearSDCA: adaptive=True (TF's adaptive sampling) is not built "
                             "here: TF's kernel revisits a batch's first example and skips "
                             "others; use adaptive=False, TF's default")
        if l2 <= 1.0:
            logger.warning("symmetric_l2_regularization for SDCA should typically be larger "
                           "than for online optimization methods. Recommended value is of "
                           "the order of the average L2 norm of the training examples.")
        self._example_id_column = example_id_column
        self._num_loss_partitions = int(num_loss_partitions)
        self._num_table_shards = num_table_shards
        self._symmetric_l1_regularization = l1
        self._symmetric_l2_regularization = l2

    def __repr__(self):
        return (f"LinearSDCA(example_id_column={self._example_id_column!r}, "
                f"num_loss_partitions={self._num_loss_partitions}, "
                f"symmetric_l1_regularization={self._symmetric_l1_regularization}, "
                f"symmetric_l2_regularization={self._symmetric_l2_regularization})")


def _positive_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def check_columns(columns) -> None:
    """TF's refusals of columns SDCA cannot train, at construction."""
    for column in columns:
        if isinstance(column, feature_column.CategoricalColumn):
            continue
        if isinstance(column, feature_column.IndicatorColumn):
            raise ValueError(f"LinearSDCA: {column.name!r} is an indicator_column (TF: Column "
                             "IndicatorColumn has rank 2, larger than 1): give its categorical "
                             "column, which the linear model weights as its indicator")
        if isinstance(column, feature_column.NumericColumn):
            if len(column.shape) != 1:
                raise ValueError(f"LinearSDCA: the numeric column {column.name!r} has shape "
                                 f"{tuple(column.shape)} (TF: Column NumericColumn has rank "
                                 f"{len(column.shape)}, larger than 1): give it a shape of "
                                 "one dimension")
            continue
        raise ValueError(f"LinearSDCA does not support column type {type(column).__name__} "
                         f"here ({column.name!r}): numeric and categorical columns (bucketized, "
                         "crossed, hashed, vocabulary, identity, weighted)")


class _SDCAState(torch.nn.Module):
    """The unshrunk weights (TF's ``<variable>_unshrunk``, one buffer per
    linear-model variable) and the example table (TF's
    ``ShardedMutableHashTable``): per id, a 128-bit hash in `example_ids` and
    ``[dual, primal loss, dual loss, example weight]`` in `example_state`,
    the first `examples_seen` rows in use (room grows by doubling). Replicas
    keep the same table and weights (each applies every replica's step)."""

    same_buffers_on_replicas = True

    def __init__(self, sizes: Dict[str, int]):
        super().__init__()
        self.keys = list(sizes)
        # each variable's first index in one flat numbering (the replicas' changes)
        self.offsets = dict(zip(self.keys, np.cumsum([0] + list(sizes.values())).tolist()))
        for key, size in sizes.items():
            self.register_buffer(key + "_unshrunk", torch.zeros(size))
        self.register_buffer("example_ids", torch.zeros(0, 2, dtype=torch.int64))
        self.register_buffer("example_state", torch.zeros(0, 4))
        self.register_buffer("examples_seen", torch.zeros((), dtype=torch.int64))
        self._rows = None   # id hash -> row, built from the buffers when first needed
        self.agreed = False   # the unshrunk weights give the model's (`_agree`)
        self.warned = False   # of a batch holding an id twice

    def _load_from_state_dict(self, state, prefix, *args, **kwargs):
        for name in ("example_ids", "example_state"):   # (a table of any size)
            saved, own = state.get(prefix + name), getattr(self, name)
            if isinstance(saved, torch.Tensor) and saved.shape != own.shape:
                setattr(self, name, torch.zeros(saved.shape, dtype=own.dtype, device=own.device))
        self._rows, self.agreed = None, False
        super()._load_from_state_dict(state, prefix, *args, **kwargs)

    def unshrunk(self, key: str) -> torch.Tensor:
        return getattr(self, key + "_unshrunk")

    def rows(self, hashes: np.ndarray) -> np.ndarray:
        """The table rows of ids hashed [n, 2] int64, unseen ones added (zeros)."""
        count = int(self.examples_seen)
        if self._rows is None:
            kept = self.example_ids[:count].cpu().numpy()
            self._rows = {row.tobytes(): i for i, row in enumerate(kept)}
        out = np.empty(len(hashes), np.int64)
        new = []
        for i, key in enumerate(map(np.ndarray.tobytes, hashes)):
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = count + len(new)
                new.append(i)
            out[i] = row
        if new:
            need = count + len(new)
            if need > len(self.example_ids):
                room = max(need, 2 * len(self.example_ids), 64)
                self.example_ids = torch.cat([self.example_ids, self.example_ids.new_zeros(
                    room - len(self.example_ids), 2)])
                self.example_state = torch.cat([self.example_state,
                                                self.example_state.new_zeros(
                                                    room - len(self.example_state), 4)])
            self.example_ids[count:need] = torch.from_numpy(hashes[new]).to(
                self.example_ids.device)
            self.examples_seen.fill_(need)
        return out


def _hashes(ids) -> np.ndarray:
    """[n, 2] int64: a 128-bit hash of each example id (TF: ``SdcaFprint``)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.cpu().numpy()
    ids = np.asarray(ids, dtype=object if not isinstance(ids, np.ndarray) else None)
    if ids.ndim != 1:
        if ids.ndim == 2 and ids.shape[1] == 1:
            ids = ids[:, 0]
        else:
            raise ValueError(f"LinearSDCA: the example ids must be one per example, [batch] "
                             f"or [batch, 1]; got shape {list(ids.shape)}")
    out = np.empty((len(ids), 2), np.int64)
    for i, value in enumerate(ids.tolist()):
        if isinstance(value, str):
            raw = b"s" + value.encode()
        elif isinstance(value, bytes):
            raw = b"s" + value
        elif isinstance(value, int) and not isinstance(value, bool):
            raw = b"i" + str(value).encode()
        else:
            raise ValueError(f"LinearSDCA: example ids must be strings or integers, got "
                             f"{value!r} ({type(value).__name__})")
        out[i] = np.frombuffer(hashlib.blake2b(raw, digest_size=16).digest(), np.int64)
    return out


def _shrink(values: np.ndarray, by: float) -> np.ndarray:
    return np.sign(values) * np.maximum(np.abs(values) - by, 0.0)


def _new_dual(loss: str, partitions: int, y: float, weight: float, dual: float, wx: float,
              norm: float) -> float:
    """TF's ``ComputeUpdatedDual`` of one example."""
    if loss == SQUARED_LOSS:
        return dual + (y - dual - wx) / (1.0 + partitions * norm * weight)
    x, scale = 0.0, partitions * norm * weight   # logistic: 10 Newton steps, as TF
    for _ in range(10):
        t = math.tanh(x)
        x -= ((-2 * y * x - wx - scale * (0.5 * (1 + t) / y - dual))
              / (-2 * y - scale * (1 - t * t) * 0.5 / y))
    return 0.5 * (1 + math.tanh(x)) / y


def _primal_losses(loss: str, wx: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    if loss == SQUARED_LOSS:
        return 0.5 * (wx - y) ** 2 * weight
    return np.logaddexp(0.0, -y * wx) * weight


def _dual_losses(loss: str, dual: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    if loss == SQUARED_LOSS:
        return dual * (0.5 * dual - y) * weight
    a = dual * y   # (0 log 0 = 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(a > 0, a * np.log(a), 0.0) + np.where(a < 1, (1 - a) * np.log1p(-a),
                                                                 0.0)
    return terms * weight


class _Batch:
    """A batch as SDCA reads it: each example's features as (positions,
    values) over the weights it touches (CSR: `start`), each model variable's
    touched entries (`touched`: key, flat indices, first position)."""

    def __init__(self, features, groups, size: int):
        rows, positions, values, self.touched = [], [], [], []
        base = 0
        for key, column in groups:
            if isinstance(column, feature_column.CategoricalColumn):
                ids = column._valid_ids(features, prune_weights=False)
                weights = (np.ones(len(ids.values)) if ids.weights is None
                           else ids.weights.astype(np.float64))
                # an id repeated in an example is one feature, weights summed (TF)
                pairs, inverse = np.unique(ids.rows * column.num_buckets + ids.values,
                                           return_inverse=True)
                summed = np.bincount(inverse.reshape(-1), weights=weights,
                                     minlength=len(pairs))
                entries = pairs % column.num_buckets
                flat, local = np.unique(entries, return_inverse=True)
                rows.append(pairs // column.num_buckets)
                positions.append(base + local.reshape(-1))
                values.append(summed)
            else:
                dense = (np.ones((size, 1)) if column is None else feature_column.input_layer(
                    features, [column]).detach().cpu().double().numpy())
                width = dense.shape[1]
                flat = np.arange(width)
                rows.append(np.repeat(np.arange(size), width))
                positions.append(base + np.tile(flat, size))
                values.append(dense.reshape(-1))
            self.touched.append((key, flat, base))
            base += len(flat)
        rows = np.concatenate(rows)
        order = np.argsort(rows, kind="stable")
        self.positions = np.concatenate(positions)[order]
        self.values = np.concatenate(values)[order]
        self.start = np.searchsorted(rows[order], np.arange(size + 1))
        # (every example has a feature, the bias: no empty row for reduceat)
        self.squared_norms = np.add.reduceat(self.values ** 2, self.start[:-1])


def train_op(sdca: LinearSDCA, loss: str, features, ids, variables: dict, columns,
             labels, weights):
    """The step's train_op: one SDCA pass over the batch (`features` the
    columns' cache, `ids` the example ids, `variables` linear_model's
    ``cols_to_vars``), then the model's weights from the unshrunk ones."""
    _check_strategy()
    if ids is None:
        raise ValueError(f"LinearSDCA: the features have no {sdca._example_id_column!r} (its "
                         "example_id_column): give every example's id under that key")
    if labels is None:
        raise ValueError("LinearSDCA: training needs labels: give them as the second value "
                         "of input_fn")
    model = model_scope.current().modules["linear/linear_model"]
    model = getattr(model, "module", model)   # (under a DDP wrapper)
    names = {id(p): key for key, p in model.named_parameters()}
    ordered = sorted(columns, key=lambda c: c.name)   # (TF's order, then the bias)
    groups = [(names[id(variables[c][0])], c) for c in ordered] + [("bias_weights", None)]
    params = {key: p for key, p in model.named_parameters()}
    state = model_scope.get_module(_MODULE, lambda: _SDCAState(
        {key: params[key].numel() for key, _ in groups}))
    size = labels.shape[0]
    hashes = _hashes(ids)
    if len(hashes) != size:
        raise ValueError(f"LinearSDCA: {len(hashes)} example ids in "
                         f"{sdca._example_id_column!r} for a batch of {size}")
    batch = _Batch(features, groups, size)
    y = labels.detach().reshape(-1).cpu().double().numpy()
    if loss == LOGISTIC_LOSS:
        odd = (y != 0) & (y != 1)
        if odd.any():
            raise ValueError(f"Only labels of 0.0 or 1.0 are supported right now. Found "
                             f"example with label: {y[odd][0]:g}")
        y = 2.0 * y - 1.0   # (TF's -1, +1)
    w = (np.ones(size) if weights is None
         else weights.detach().reshape(-1).cpu().double().numpy())
    if summary.should_record_summaries():
        _summaries(sdca, state, params)

    context = distribute.get_replica_context()   # (the train_op runs outside it)
    replicas = context if context is not None and context.num_replicas_in_sync > 1 else None

    def step():
        with torch.no_grad():
            _step(sdca, loss, state, params, batch, hashes, y, w, replicas)
    return step


def _check_strategy() -> None:
    if distribute.get_strategy().extended.uses_parameter_servers:
        raise ValueError("LinearSDCA does not train with parameter servers here (TF shares its "
                         "example table over ps tasks): use MirroredStrategy or "
                         "MultiWorkerMirroredStrategy, each replica's step summed")


def _summaries(sdca: LinearSDCA, state: _SDCAState, params) -> None:
    """TF's ``approximate_duality_gap`` and ``examples_seen`` (the step's
    model, before its update)."""
    count = int(state.examples_seen)
    table = state.example_state[:count].double().sum(0)
    weights = torch.cat([params[key].detach().reshape(-1) for key in state.keys]).double()
    gap = ((table[1] + table[2] + sdca._symmetric_l1_regularization * weights.abs().sum()
            + sdca._symmetric_l2_regularization * (weights ** 2).sum()) / table[3]
           if count else torch.tensor(float("nan")))
    summary.scalar("linear/approximate_duality_gap", gap)
    summary.scalar("linear/examples_seen", torch.tensor(count))


def _step(sdca: LinearSDCA, loss: str, state: _SDCAState, params, batch: _Batch,
          hashes: np.ndarray, y: np.ndarray, w: np.ndarray, replicas) -> None:
    """One SDCA pass over this replica's batch, then the table's rows and the
    unshrunk weights' changes of every replica (`replicas`: the replica
    context, or None alone) applied alike on each, so that the replicas keep
    the same table and weights (TF's workers share them on ps tasks; set
    ``num_loss_partitions`` to the number of replicas, as TF's to its workers)."""
    l1, l2 = sdca._symmetric_l1_regularization, sdca._symmetric_l2_regularization
    partitions, shrinkage = sdca._num_loss_partitions, l1 / l2
    if not state.agreed:
        _agree(state, params, shrinkage)
    rows = state.rows(hashes)
    distinct = len(np.unique(rows))
    if distinct < len(rows) and not state.warned:
        state.warned = True
        logger.warning("LinearSDCA: a batch holds an example id more than once (%d ids for %d "
                       "examples): each copy moves the weights from the same dual and the "
                       "table keeps the last, as TF's, so training settles off the optimum. "
                       "Give each batch distinct ids (batches that do not cross the end of "
                       "the data: a batch size dividing it, or batch before repeat)",
                       distinct, len(rows))
    duals = _at(state.example_state, rows)[:, 0].cpu().double().numpy()
    unshrunk = np.concatenate([_at(state.unshrunk(key), flat).cpu().double().numpy()
                               for key, flat, _ in batch.touched])
    # each example's wx before the step, for its primal loss (TF's table)
    before = _shrink(unshrunk, shrinkage) if shrinkage > 0 else unshrunk
    prev_wx = np.add.reduceat(batch.values * before[batch.positions], batch.start[:-1])
    moved = unshrunk.copy()   # unshrunk + partitions * the step's delta so far
    new = duals.copy()
    positions, values, start = batch.positions, batch.values, batch.start.tolist()
    norms, ys, ws = (batch.squared_norms / l2).tolist(), y.tolist(), w.tolist()
    olds = duals.tolist()
    for i in torch.randperm(len(ys)).tolist():
        at, x = positions[start[i]:start[i + 1]], values[start[i]:start[i + 1]]
        current = moved[at]
        wx = float(x @ (_shrink(current, shrinkage) if shrinkage > 0 else current))
        dual = _new_dual(loss, partitions, ys[i], ws[i], olds[i], wx, norms[i])
        moved[at] = current + (partitions * (dual - olds[i]) * ws[i] / l2) * x
        new[i] = dual
    new_state = torch.from_numpy(np.stack([new, _primal_losses(loss, prev_wx, y, w),
                                           _dual_losses(loss, duals, y, w), w], 1))
    offsets = state.offsets
    where = torch.from_numpy(np.concatenate([offsets[key] + flat
                                             for key, flat, _ in batch.touched]))
    delta = torch.from_numpy((moved - unshrunk) / partitions)
    hashes = torch.from_numpy(hashes)
    if replicas is not None:   # (every replica's rows and changes, in replica order)
        hashes, new_state, where, delta = (replicas.all_gather(t, 0).cpu() for t in (
            hashes, new_state, where, delta))
        rows = state.rows(hashes.numpy())
    # an id twice: its later row is kept, as TF's table insert
    _, last = np.unique(rows[::-1], return_index=True)
    kept = len(rows) - 1 - last
    table = state.example_state
    table[torch.from_numpy(rows[kept]).to(table.device)] = new_state[kept].to(table)
    for key in state.keys:
        inside = (where >= offsets[key]) & (where < offsets[key] + state.unshrunk(key).numel())
        if not inside.any():
            continue
        slot, param = state.unshrunk(key), params[key].data.view(-1)
        index = (where[inside] - offsets[key]).to(slot.device)
        slot.index_add_(0, index, delta[inside].to(slot))   # (a weight two replicas moved)
        param[index.to(param.device)] = _shrunk(slot[index], shrinkage).to(param)


def _agree(state: _SDCAState, params, shrinkage: float) -> None:
    """As a train call begins: the unshrunk weights that do not give the
    model's weights (a warm start loaded the weights, not the slots) are set
    to give them, ``w + sign(w) l1 / l2``, so that training continues from
    the warm-started model (TF's first update replaces weights whose slots a
    warm start did not reach by the slots' shrunk zeros)."""
    for key in state.keys:
        slot, weight = state.unshrunk(key), params[key].data.view(-1).to(state.unshrunk(key))
        off = _shrunk(slot, shrinkage) != weight
        if off.any():
            slot[off] = weight[off] + torch.sign(weight[off]) * shrinkage
    state.agreed = True


def _at(values: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    return values[torch.from_numpy(index).to(values.device)]


def _shrunk(values: torch.Tensor, shrinkage: float) -> torch.Tensor:
    if shrinkage <= 0:
        return values
    return torch.sign(values) * (values.abs() - shrinkage).clamp(min=0.0)
