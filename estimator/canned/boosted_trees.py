"""`BoostedTreesClassifier` and `BoostedTreesRegressor` (TF:
``tf.estimator.BoostedTrees*``, TF 1.8 to 2.8; TensorFlow removed them after
2.8), gradient boosted trees grown layer by layer as TF grows them.

Features: `bucketized_column`s (one feature each, its bucket),
`indicator_column`s (one 0/1 feature per category), `numeric_column`s
(one feature per value, bucketed at the boundaries TF's quantile sketch
makes of the first `n_batches_per_layer` batches, steps the global step
does not count) and bare categorical columns (one feature, its id, split
on equality: TF's categorical splits), sorted by column name and numbered
in that order, as TF's feature ids. Each training step (a batch) computes the logits of the
ensemble, the gradient and hessian of the head's loss (mean over the
batch) at each example's logits, and sums them per (node of the tree being
grown, feature, bucket); after
`n_batches_per_layer` steps the layer grows from the mean of those sums:
each node of the last layer splits on the (feature, bucket) of the best
gain, ``G'^2 / (H + l2)`` (G' the gradient sum shrunk by `l1`) of the two
sides less the node's and `tree_complexity`, its children's values the
node's plus ``learning_rate * -G' / (H + l2)``. `pruning_mode`: 'none'
splits every node, 'pre' none of negative gain, 'post' prunes the splits of
negative gain when the tree is done. A node of hessian sum below
`min_node_weight` is not split. A tree is done at `max_depth` layers; the
training stops when `n_trees` are (or after ``2 * n_trees * max_depth``
layer attempts), whatever `steps` or `max_steps` say. `center_bias`: first,
Newton steps on a constant (in tree 0's root) until one moves it by 1% or
less. A prediction sums the leaf each tree sends the example to.

More than two classes: K logits a leaf, TF's full hessian solved (at l2
0, singular: the least-norm solution, TF's logits plus a constant over the
classes). `BoostedTreesEstimator`: the same trees under a given head.
`experimental_predict_with_explanations`: TF's directional feature
contributions along each example's path. Not here: TF's checkpoints of an
ensemble (a serialized proto). The ensemble is saved as buffers of this module
(``boosted_trees/...``).
"""
from __future__ import annotations

import collections
import logging
import math
from typing import List, Optional, Sequence

import numpy as np
import torch

import distribute
from hooks import model_scope, summary
from hooks import SessionRunHook

from . import _quantiles
from .. import checkpoint as checkpoint_lib
from .. import feature_column
from ..losses import Reduction
from ..estimator import Estimator
from ..mode_keys import ModeKeys
from ._base import CannedEstimator, check_head, column_tuple, features_cache
from ._head import ClassificationHead, RegressionHead

logger = logging.getLogger(__name__)

_PRUNING_MODES = ("none", "pre", "post")
_TINY = np.float32(1e-15)   # TF's kEps: ties within it keep the earlier candidate


class _Features:
    """The model's features as TF numbers them: the columns sorted by name, an
    indicator column a 0/1 feature per category, a bucketized column its
    bucket, a numeric column a feature per value, bucketed by the quantiles
    of its first batches, a bare categorical column its id (split on
    equality); and TF's groups of features by number of buckets (indicators
    2, numeric values `num_quantiles`, every bucketized column the most
    buckets among them, a categorical column its own)."""

    def __init__(self, feature_columns, num_quantiles: int):
        self.columns = sorted(feature_columns, key=lambda c: c.name)
        self.names: List[str] = []   # (per feature: the column's name TF reports it under)
        self.numeric: List[int] = []   # the numeric features' ids
        self.equality: List[int] = []   # the bare categorical columns' (equality splits)
        groups = collections.OrderedDict({None: []})   # buckets -> feature ids
        bucketized = 2
        for column in self.columns:
            if isinstance(column, feature_column.NumericColumn):
                if len(column.shape) > 1:
                    raise ValueError(f"For now, we only support Dense column with rank of 1, "
                                     f"but column `{column.name}` got: {list(column.shape)}")
                for _ in range(int(np.prod(column.shape))):
                    groups.setdefault(num_quantiles, []).append(len(self.names))
                    self.numeric.append(len(self.names))
                    self.names.append(column.name)
            elif isinstance(column, feature_column.IndicatorColumn):
                for _ in range(column.categorical_column.num_buckets):
                    groups.setdefault(2, []).append(len(self.names))
                    self.names.append(column.categorical_column.name)
            elif isinstance(column, feature_column.BucketizedColumn):
                if tuple(column.source_column.shape) not in ((), (1,)):
                    raise ValueError(
                        f"BoostedTrees: the bucketized column {column.name!r} has shape "
                        f"{tuple(column.source_column.shape)}: one value an example only "
                        "(TF: rank 2 features)")
                bucketized = max(bucketized, len(column.boundaries) + 1)
                groups[None].append(len(self.names))
                self.names.append(column.name)
            elif _is_bare_categorical(column):
                groups.setdefault(column.num_buckets, []).append(len(self.names))
                self.equality.append(len(self.names))
                self.names.append(column.name)
            else:
                hint = (": its weights cannot be split on; give its categorical column, or "
                        "an indicator_column of it" if isinstance(
                            column, feature_column.WeightedCategoricalColumn) else "")
                raise ValueError(
                    f"BoostedTrees takes numeric_column, bucketized_column, indicator_column "
                    f"and categorical columns (one id an example), got "
                    f"{type(column).__name__} {column.name!r}{hint}")
        # the names TF reports the features under, each once in order, and each feature's
        self.reported = list(dict.fromkeys(self.names))
        self.reported_index = torch.tensor([self.reported.index(n) for n in self.names])
        ids = groups.pop(None)
        if ids:
            groups.setdefault(bucketized, []).extend(ids)
        self.groups = list(groups.items())
        self.count = len(self.names)
        self.buckets = np.zeros(self.count, np.int64)   # per feature: its group's buckets
        for buckets, ids in self.groups:
            self.buckets[ids] = buckets
        self.most = max(b for b, _ in self.groups)
        self._edges = {}   # a bucketized column's boundaries as a tensor, by name

    def values(self, features) -> torch.Tensor:
        """[batch, numeric features] float32: the numeric columns' values."""
        return torch.cat([feature_column.input_layer(features, [column])
                          for column in self.columns
                          if isinstance(column, feature_column.NumericColumn)], -1)

    def of(self, features, ensemble: "_TreeEnsemble") -> torch.Tensor:
        """[batch, features] int64: each example's bucket of each feature (a
        numeric value's: TF's ``BoostedTreesBucketize`` on the boundaries; a
        categorical column's id, 0 where absent and -1, TF's missing
        bucket, outside the vocabulary)."""
        parts, numeric = [], 0
        for column in self.columns:
            if isinstance(column, feature_column.BucketizedColumn):
                # its bucket from its source's values (as the column's Bucketize:
                # upper bound over float32 boundaries), not its one-hot's argmax
                values = feature_column.input_layer(features, [column.source_column])
                edges = self._edges.get(column.name)
                if edges is None or edges.device != values.device:
                    edges = self._edges[column.name] = torch.tensor(
                        column.boundaries, dtype=torch.float32, device=values.device)
                parts.append(torch.bucketize(values.contiguous(), edges, right=True))
                continue
            if _is_bare_categorical(column):
                parts.append(feature_column.categorical_ids(features, column))
                continue
            dense = feature_column.input_layer(features, [column])
            if isinstance(column, feature_column.NumericColumn):
                dense = dense.to(ensemble.boundaries.device)
                for i in range(dense.shape[1]):
                    parts.append(ensemble.bucketize(numeric, dense[:, i:i + 1]))
                    numeric += 1
            else:   # (an indicator: TF's int32 cast of the counts)
                parts.append(dense.to(torch.int64))
        return torch.cat([p.to(ensemble.feature.device) for p in parts], -1)


class _TreeEnsemble(torch.nn.Module):
    """TF's tree ensemble resource as buffers of fixed size (room for `n_trees`
    trees and the empty one TF appends, each a complete tree of `max_depth`):
    per tree and node its split (`feature` -1 for a leaf, `threshold`: a
    bucket, or a categorical feature's id to equal, `left`, `right`), its
    `value` (a leaf's; a split node keeps the one it had, TF's original
    leaf) and `gain`; the growing state; the statistics summed over the
    layer's batches so far."""

    def __init__(self, n_trees: int, max_depth: int, features: _Features,
                 num_quantiles: int, dimension: int = 1):
        super().__init__()
        trees, nodes = n_trees + 1, 2 ** (max_depth + 1) - 1
        splits = 2 ** max_depth - 1   # (the nodes that may split: ids below it)

        def buffer(name, *shape, dtype=torch.int64, fill=None):
            fill = self._SIZED.get(name, 0) if fill is None else fill
            self.register_buffer(name, torch.full(shape, fill, dtype=dtype))
        buffer("feature", trees, nodes)
        buffer("threshold", trees, nodes)
        buffer("left", trees, nodes)
        buffer("right", trees, nodes)
        buffer("value", trees, nodes, dimension, dtype=torch.float32)
        buffer("gain", trees, nodes, dtype=torch.float32)
        buffer("node_count", trees)
        buffer("layers_grown", trees)
        buffer("finalized", trees)
        # [trees in the ensemble, trees attempted, layers attempted, layer start, layer end,
        #  centering the bias, numeric features' boundaries made]
        buffer("growing", 7)
        # The layer's batches so far and, per (node, feature, bucket), their gradients'
        # and hessians' sums (TF's K + K * K): no buffers, neither saved nor exported,
        # as TF's accumulators (a restart sums a layer's batches anew)
        self.batches = 0
        self._sums_shape = (splits, features.count, features.most + 1,
                            dimension * (dimension + 1))
        self._sums = None
        # the numeric features' boundaries (TF's: at most about num_quantiles), +inf past
        buffer("boundaries", len(features.numeric), num_quantiles + 3, dtype=torch.float32,
               fill=math.inf)
        buffer("boundary_count", len(features.numeric))
        self.max_depth = max_depth
        self.sketches = None   # (the numeric features' quantile streams, being filled)
        # per feature whether its splits are equalities (TF's categorical_split), known
        # from the columns: neither saved nor exported as a variable
        equality = torch.zeros(features.count, dtype=torch.bool)
        equality[features.equality] = True
        self.register_buffer("equality", equality, persistent=False)
        self._equalities = bool(features.equality)

    TREES, TREES_ATTEMPTED, LAYERS_ATTEMPTED, START, END, CENTERING, BOUNDARIES_READY = range(7)
    # the buffers sized by n_trees (and max_depth: nodes), with an empty tree's values
    # (their values at construction, and the room a restore adds)
    _SIZED = {"feature": -1, "threshold": 0, "left": 0, "right": 0, "value": 0, "gain": 0,
              "node_count": 1, "layers_grown": 0, "finalized": 0}

    def _load_from_state_dict(self, state, prefix, *args, **kwargs):
        """A checkpoint of another `n_trees` or `max_depth` (TF's ensemble is
        one resource of any size): the buffers take room for the larger of
        the two, the checkpoint's trees in them, so that training grows more
        trees after them (TF's, on a larger `n_trees`) and deeper trees are
        kept whole."""
        saved = state.get(prefix + "feature")
        if isinstance(saved, torch.Tensor) and saved.dim() == 2 and \
                saved.shape != self.feature.shape:
            trees = max(saved.shape[0], self.feature.shape[0])
            nodes = max(saved.shape[1], self.feature.shape[1])
            for name, fill in self._SIZED.items():
                own, theirs = getattr(self, name), state.get(prefix + name)
                shape = (trees, nodes)[:own.dim()] + tuple(own.shape[2:])
                setattr(self, name, torch.full(shape, fill, dtype=own.dtype, device=own.device))
                if isinstance(theirs, torch.Tensor) and theirs.dim() == own.dim():
                    padded = torch.full(shape, fill, dtype=theirs.dtype)
                    padded[tuple(slice(0, n) for n in theirs.shape)] = theirs
                    state[prefix + name] = padded
            self.max_depth = max(self.max_depth, (nodes + 1).bit_length() - 2)
        super()._load_from_state_dict(state, prefix, *args, **kwargs)
    # Replicas grow the same trees from their statistics' mean (all-reduced in
    # the train_op): the buffers are alike on each, never averaged.
    same_buffers_on_replicas = True

    def sums(self) -> tuple:
        """(statistics [nodes, features, buckets + 1, K + K * K], the bias's
        [2]): the layer's so far, zeros at first, on the trees' device."""
        if self._sums is None:
            device = self.feature.device
            self._sums = (torch.zeros(self._sums_shape, device=device),
                          torch.zeros(2, device=device))
        return self._sums

    def bucketize(self, numeric: int, values: torch.Tensor) -> torch.Tensor:
        """TF's ``BoostedTreesBucketize`` of a numeric feature's values [batch,
        1]: the first boundary not below the value (the last for larger
        ones; 0 without boundaries or for NaN)."""
        index = torch.searchsorted(self.boundaries[numeric], values.contiguous())
        last = (self.boundary_count[numeric] - 1).clamp(min=0)
        return torch.where(torch.isnan(values), 0, torch.minimum(index, last))

    def forward(self, buckets: torch.Tensor) -> tuple:
        """(logits [batch, K], each example's node in the last tree [batch])."""
        tree, node = self._descend(buckets)
        logits = self.value[tree, node].sum(1)
        last = (self.growing[self.TREES] - 1).clamp(min=0)
        return logits, node.gather(1, last.expand(buckets.shape[0], 1)).squeeze(1)

    def _descend(self, buckets: torch.Tensor, levels: Optional[list] = None) -> tuple:
        """(tree [batch, trees], each example's leaf in each tree [batch,
        trees]); `levels` gets each level's (split feature, -1 at a leaf;
        node after it)."""
        batch = buckets.shape[0]
        trees = self.feature.shape[0]
        node = buckets.new_zeros(batch, trees)
        tree = torch.arange(trees, device=buckets.device).expand(batch, -1)
        for _ in range(self.max_depth):
            feature = self.feature[tree, node]
            bucket = buckets.gather(1, feature.clamp(min=0))
            threshold = self.threshold[tree, node]
            left = bucket <= threshold
            if self._equalities:   # (TF's categorical split: the id equal to its value)
                left = torch.where(self.equality[feature.clamp(min=0)], bucket == threshold,
                                   left)
            nxt = torch.where(left, self.left[tree, node], self.right[tree, node])
            node = torch.where(feature >= 0, nxt, node)
            if levels is not None:
                levels.append((feature, node))
        return tree, node

    def logits_paths(self, buckets: torch.Tensor) -> tuple:
        """TF's ``BoostedTreesExampleDebugOutputs`` of one logit (float32):
        (the running logit [batch, 1 + trees * max_depth]: tree 0's root
        value, TF's bias, then after each level of each tree in turn the
        trees before's leaves plus the node reached; the feature each level
        splits on [batch, trees * max_depth], -1 past a leaf, where the
        running logit stays as it was)."""
        levels: list = []
        tree, leaf = self._descend(buckets, levels)
        values = self.value[..., 0]
        leaves = values[tree, leaf]
        before = [torch.zeros_like(leaves[:, 0])]   # (summed tree by tree in float32, as TF)
        for t in range(leaves.shape[1] - 1):
            before.append(before[-1] + leaves[:, t])
        before = torch.stack(before, 1)
        running = torch.stack([before + values[tree, node] for _, node in levels], 2)
        batch = buckets.shape[0]
        return (torch.cat([values[0, 0].expand(batch, 1), running.reshape(batch, -1)], 1),
                torch.stack([feature for feature, _ in levels], 2).reshape(batch, -1))


class _StopAtAttemptsHook(SessionRunHook):
    """TF's: stop after the step that finalizes the last tree, or after
    ``2 * n_trees * max_depth`` layer attempts."""

    def __init__(self, ensemble: _TreeEnsemble, n_trees: int, max_depth: int):
        self._ensemble, self._n_trees, self._max_depth = ensemble, n_trees, max_depth

    def after_run(self, run_context, run_values):
        if _done(self._ensemble, self._n_trees, self._max_depth):
            run_context.request_stop()


def _done(ensemble: _TreeEnsemble, n_trees: int, max_depth: int) -> bool:
    attempts = int(ensemble.growing[_TreeEnsemble.LAYERS_ATTEMPTED])
    return int(ensemble.finalized.sum()) >= n_trees or attempts > 2 * n_trees * max_depth


def _weights_and_gains(sums: np.ndarray, l1, l2) -> tuple:
    """TF's ``CalculateWeightsAndGains`` of each (gradient, hessian) pair of
    `sums` [..., 2], elementwise in float32 (as TF's, one by one): the leaf
    weight -G'/(H + l2) and the gain G'^2/(H + l2), G' the gradient sum
    shrunk by `l1` (0 where |G| <= l1 or H + l2 <= 1e-15); for K logits, sums [..., K
    + K * K] (gradients, the full hessian), TF's -(H + l2 I)^-1 G and -G.w
    (l1 not applied, as TF's; a singular matrix: the least-squares weight)."""
    if sums.shape[-1] > 2:
        k = int(round((math.sqrt(4 * sums.shape[-1] + 1) - 1) / 2))
        g = sums[..., :k]
        h = sums[..., k:].reshape(sums.shape[:-1] + (k, k)) + l2 * np.eye(k, dtype=np.float32)
        weight = -(np.linalg.pinv(h, rcond=1e-5) @ g[..., None])[..., 0].astype(np.float32)
        return weight, (-(g * weight).sum(-1)).astype(np.float32)
    g, h = sums[..., 0], sums[..., 1]
    if l1 > 0:
        shrunk = np.where(g > l1, g - l1, np.where(g < -l1, g + l1, np.float32(0)))
        kept = np.abs(g) > l1
        g = shrunk.astype(np.float32)
    else:
        kept = np.ones(g.shape, bool)
    denominator = (h + l2).astype(np.float32)
    kept &= denominator > _TINY
    with np.errstate(divide="ignore", invalid="ignore"):
        weight = np.where(kept, -g / denominator, np.float32(0)).astype(np.float32)
    return weight, (-g * weight).astype(np.float32)


def _is_bare_categorical(column) -> bool:
    """A categorical column given as it is (TF: split on equality of its id)."""
    return isinstance(column, feature_column.CategoricalColumn) and not isinstance(
        column, (feature_column.BucketizedColumn, feature_column.WeightedCategoricalColumn,
                 feature_column.SequenceCategoricalColumn))


def _first_best(scores: np.ndarray) -> int:
    """TF's scan of a feature's candidates: a later one replaces the best if
    it is 1e-15 or more above it. Only a new running maximum can (a score
    within 1e-15 of the best can lift the maximum but never replace it)."""
    previous = np.maximum.accumulate(np.concatenate([[-np.inf], scores[:-1]]))
    best = 0
    for i in np.flatnonzero(scores > previous)[1:]:
        if scores[i] - scores[best] >= _TINY:
            best = int(i)
    return best


def _total(rows: np.ndarray, buckets: int) -> np.ndarray:
    """A feature's sums over its buckets and the missing one, in TF's order."""
    return np.cumsum(np.concatenate([rows[:buckets], rows[-1:]]), 0, dtype=np.float32)[-1]


class _Grower:
    """TF's layer growth (``CalculateBestFeatureSplitV2`` per group of
    features, then ``UpdateEnsembleV2``) and bias centering (``CenterBias``),
    on the host in float32 as TF's kernels compute."""

    def __init__(self, features: _Features, n_trees, max_depth, learning_rate, l1, l2,
                 tree_complexity, min_node_weight, pruning_mode, dimension: int = 1):
        self.features, self.dimension = features, dimension
        self.n_trees, self.max_depth = n_trees, max_depth
        self.lr = np.float32(learning_rate)
        self.l1, self.l2 = np.float32(l1), np.float32(l2)
        self.tree_complexity = np.float32(tree_complexity)
        self.min_node_weight = np.float32(min_node_weight)
        self.pruning_mode = pruning_mode

    def best_splits(self, stats: np.ndarray, nodes: range) -> dict:
        """node: (gain, feature, threshold, left weight, right weight)."""
        best = {}
        for buckets, ids in self.features.groups:
            for node in nodes:
                found = self._best_in_group(stats[node], buckets, ids)
                if found is None:
                    continue
                held = best.get(node)
                if held is None or found[0] - held[0] >= _TINY or (
                        abs(found[0] - held[0]) < _TINY and found[1] < held[1]):
                    best[node] = found
        return best

    def _best_in_group(self, stats: np.ndarray, buckets: int, ids) -> Optional[tuple]:
        """The group's best split of a node from its statistics [features,
        buckets + 1, 2] (the last bucket: TF's missing values): per feature
        its best inequality (two candidates a bucket, the missing values
        left or right) or, for a categorical feature, equality (a bucket
        against the node's other examples, the missing ones among them)."""
        node_total = _total(stats[ids[0]], buckets)
        k = self.dimension
        if np.linalg.norm(node_total[k:]) < self.min_node_weight:   # (TF: the hessian's norm)
            return None
        _, parent_gain = _weights_and_gains(node_total, self.l1, self.l2)
        rows = stats[list(ids)]                     # [features, width, K + K * K]
        missing = rows[:, -1]
        cumulative = np.cumsum(rows[:, :buckets], 1, dtype=np.float32)   # (in order, as TF)
        total = np.cumsum(np.concatenate([rows[:, :buckets], missing[:, None]], 1), 1,
                          dtype=np.float32)[:, -1]
        # per bucket TF's two candidates, the missing values left then right
        left = np.stack([cumulative + missing[:, None], cumulative], 2)   # [f, buckets, 2, S]
        right = total[:, None, None] - left
        lw, lg = _weights_and_gains(left, self.l1, self.l2)
        rw, rg = _weights_and_gains(right, self.l1, self.l2)
        scores = (lg + rg).reshape(len(ids), -1)
        best = None
        for i, feature in enumerate(ids):
            if feature in self.features.equality:   # (TF's: each id against the others)
                one = rows[i, :buckets]
                ew, eg = _weights_and_gains(one, self.l1, self.l2)
                rest_w, rest_g = _weights_and_gains(node_total - one, self.l1, self.l2)
                equality = eg + rest_g
                at = _first_best(equality)
                if best is None or equality[at] > best[0]:
                    best = (equality[at], feature, at, ew[at], rest_w[at])
                continue
            at = _first_best(scores[i])
            if best is None or scores[i, at] > best[0]:   # (a later feature: strictly)
                bucket, side = divmod(at, 2)
                best = (scores[i, at], feature, bucket, lw[i, bucket, side], rw[i, bucket, side])
        score, feature, bucket, lw, rw = best
        gain = np.float32(np.float32(score - parent_gain) - self.tree_complexity)
        return gain, feature, bucket, lw, rw

    def grow(self, ensemble: _TreeEnsemble, stats: np.ndarray) -> None:
        """One layer from the layer's mean statistics (TF: a layer attempt,
        which splits nothing where no node has a split)."""
        e, g = ensemble, ensemble.growing
        if g[e.TREES] == 0:
            g[e.TREES] = 1
        tree = int(g[e.TREES]) - 1
        if int(e.node_count[tree]) == 1:
            g[e.TREES_ATTEMPTED] += 1
        g[e.LAYERS_ATTEMPTED] += 1
        start, end = int(g[e.START]), int(g[e.END])
        splits = self.best_splits(stats, range(start, max(1, end)))
        made = []
        for node in sorted(splits):
            gain, feature, bucket, lw, rw = splits[node]
            if self.pruning_mode == "pre" and gain < 0:
                continue
            count = int(e.node_count[tree])
            parent = e.value[tree, node].cpu().numpy()
            e.feature[tree, node], e.threshold[tree, node] = feature, bucket
            e.left[tree, node], e.right[tree, node] = count, count + 1
            e.gain[tree, node] = float(gain)
            e.value[tree, count] = torch.from_numpy((parent + self.lr * lw).astype(np.float32))
            e.value[tree, count + 1] = torch.from_numpy(
                (parent + self.lr * rw).astype(np.float32))
            e.node_count[tree] = count + 2
            made.append(count)
        if not made:
            return
        e.layers_grown[tree] += 1
        if int(e.layers_grown[tree]) >= self.max_depth:
            e.finalized[tree] = 1
            if self.pruning_mode == "post":
                _post_prune(e, tree)
            if tree + 1 < e.feature.shape[0]:
                g[e.TREES] += 1   # (TF appends an empty tree)
            g[e.START], g[e.END] = 0, 1
        else:
            g[e.START], g[e.END] = made[0], made[-1] + 2

    def center_bias(self, ensemble: _TreeEnsemble, mean_g, mean_h) -> None:
        """TF's ``CenterBias``: a Newton step on tree 0's root; centering
        ends after a step moving it by 1% or less (never the first)."""
        e, g = ensemble, ensemble.growing
        delta = _weights_and_gains(np.array([mean_g, mean_h], np.float32), self.l1, self.l2)[0]
        if g[e.TREES] == 0:
            g[e.TREES] = 1
            e.value[0, 0, 0] = float(delta)
            return
        bias = np.float32(e.value[0, 0, 0])
        g[e.CENTERING] = int(abs(np.float32(delta / bias)) > 0.01)
        e.value[0, 0, 0] = float(np.float32(bias + delta))


def _post_prune(e: _TreeEnsemble, tree: int) -> None:
    """TF's ``PostPruneTree``: from the bottom, a split of negative gain whose
    children are leaves becomes a leaf again (its original value); the
    nodes left are renumbered in their order."""
    def prune(node):
        if int(e.feature[tree, node]) < 0:
            return
        left, right = int(e.left[tree, node]), int(e.right[tree, node])
        prune(left)
        prune(right)
        if float(e.gain[tree, node]) < 0 and int(e.feature[tree, left]) < 0 and \
                int(e.feature[tree, right]) < 0:
            e.feature[tree, node] = -1
            e.gain[tree, node] = 0.0
            removed.update((left, right))
    removed: set = set()
    prune(0)
    if not removed:
        return
    count = int(e.node_count[tree])
    kept = [n for n in range(count) if n not in removed]
    new = {old: i for i, old in enumerate(kept)}
    rows = {name: getattr(e, name)[tree, kept].clone()
            for name in ("feature", "threshold", "left", "right", "value", "gain")}
    for name, values in rows.items():
        getattr(e, name)[tree].fill_(-1 if name == "feature" else 0)
        getattr(e, name)[tree, :len(kept)] = values
    for i in range(len(kept)):
        if int(e.feature[tree, i]) >= 0:
            e.left[tree, i] = new[int(e.left[tree, i])]
            e.right[tree, i] = new[int(e.right[tree, i])]
    e.node_count[tree] = len(kept)


class _BoostedTrees(CannedEstimator):
    def __init__(self, head, feature_columns, n_batches_per_layer, model_dir, n_trees,
                 max_depth, learning_rate, l1_regularization, l2_regularization,
                 tree_complexity, min_node_weight, config, center_bias, pruning_mode,
                 quantile_sketch_epsilon, train_in_memory, warm_start_from=None):
        check_head(head)
        if head.logits_dimension > 1 and not isinstance(head, ClassificationHead):
            raise NotImplementedError(
                f"BoostedTrees with {type(head).__name__} of {head.logits_dimension} logits: "
                "vector leaves of a regression or multi-label head are not built here; one "
                "label dimension only (a multi-class head is taken)")
        if head.logits_dimension > 1 and center_bias:   # (TF's classifier's message; its
            # BoostedTreesEstimator fails in training on a shape error)
            raise ValueError("center_bias not yet support with n_classes > 2.")
        self._sketch_weights = head._weight_column   # (the quantile sketch's weights)
        columns = column_tuple(feature_columns, "feature_columns")
        if not columns:
            raise ValueError("feature_columns must not be empty.")
        if not isinstance(quantile_sketch_epsilon, (int, float)) or \
                not 0 < quantile_sketch_epsilon < 1:
            raise ValueError(f"quantile_sketch_epsilon must be in (0, 1), got "
                             f"{quantile_sketch_epsilon!r}")
        self._eps = quantile_sketch_epsilon
        self._num_quantiles = int(1.0 / quantile_sketch_epsilon)
        self._features = _Features(columns, self._num_quantiles)
        for name, value, low in (("n_batches_per_layer", n_batches_per_layer, 1),
                                 ("n_trees", n_trees, 1), ("max_depth", max_depth, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(learning_rate, (int, float)) or isinstance(learning_rate, bool) or \
                not learning_rate > 0:
            raise ValueError(f"Expected learning_rate > 0, received: {learning_rate!r}")
        for name, value in (("learning_rate", learning_rate),
                            ("l1_regularization", l1_regularization),
                            ("l2_regularization", l2_regularization),
                            ("tree_complexity", tree_complexity),
                            ("min_node_weight", min_node_weight)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                    not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
        if pruning_mode not in _PRUNING_MODES:
            raise ValueError(f"pruning_mode mode must be one of: none, post, pre. Found: "
                             f"{pruning_mode}")
        if tree_complexity > 0 and pruning_mode == "none":
            raise ValueError("Tree complexity have no effect unless pruning mode is chosen.")
        if tree_complexity <= 0 and pruning_mode != "none":
            raise ValueError("For pruning, tree_complexity must be positive.")
        if train_in_memory and n_batches_per_layer != 1:
            raise ValueError("When train_in_memory is enabled, input_fn should return the "
                             "entire dataset as a single batch, and n_batches_per_layer "
                             "should be set as 1.")
        self._n_batches_per_layer = n_batches_per_layer
        self._quantile_batches = 1 if train_in_memory else n_batches_per_layer
        self._n_trees, self._max_depth = n_trees, max_depth
        self._center_bias = center_bias
        self._grower = _Grower(self._features, n_trees, max_depth, learning_rate,
                               l1_regularization, l2_regularization, tree_complexity,
                               min_node_weight, pruning_mode, head.logits_dimension)
        super().__init__(head, model_dir, config, warm_start_from)

    def _ensemble(self) -> _TreeEnsemble:
        def make():
            ensemble = _TreeEnsemble(self._n_trees, self._max_depth, self._features,
                                     self._num_quantiles, self._head.logits_dimension)
            ensemble.growing[_TreeEnsemble.CENTERING] = int(self._center_bias)
            ensemble.growing[_TreeEnsemble.BOUNDARIES_READY] = int(not self._features.numeric)
            return ensemble
        return model_scope.get_module("boosted_trees", make)

    def _canned_model_fn(self, features, labels, mode):
        return self._bt_model_fn(features, labels, mode)

    def _bt_model_fn(self, features, labels, mode, explain: bool = False):
        """TF's ``_bt_model_fn``; `explain`: the predictions with their
        explanations (``bias``, ``dfc``)."""
        cache = features_cache(features)
        ensemble = self._ensemble()
        module = getattr(ensemble, "module", ensemble)   # (a replicated one: its module)
        buckets = self._features.of(cache, module)
        with torch.no_grad():
            logits, nodes = ensemble(buckets)
        if mode != ModeKeys.TRAIN:
            spec = self._head.create_estimator_spec(cache, mode, logits, labels)
            if explain:
                spec = spec._replace(predictions=dict(
                    spec.predictions, **self._contributions(module, buckets)))
            return spec
        _check_strategy()
        if summary.should_record_summaries():   # (TF's, as the step starts)
            growing = module.growing.tolist()
            summary.scalar("boosted_trees/ensemble/num_trees", growing[module.TREES])
            summary.scalar("boosted_trees/ensemble/num_finalized_trees",
                           int(module.finalized.sum()))
            summary.scalar("boosted_trees/ensemble/num_attempted_layers",
                           growing[module.LAYERS_ATTEMPTED])
        logits.requires_grad_(True)
        context = distribute.get_replica_context()   # (the train_op runs outside it)
        if not int(module.growing[module.BOUNDARIES_READY]):   # (the numeric features' first
            sketched = self._sketch_inputs(cache)             # batches: their quantiles)

            def train_op_fn(loss):
                return lambda: self._sketch(module, *sketched, context)
        else:
            def train_op_fn(loss):
                return lambda: self._train_step(module, loss, logits, buckets, nodes, context)
        spec = self._head.create_estimator_spec(cache, mode, logits, labels,
                                                train_op_fn=train_op_fn)
        hook = _StopAtAttemptsHook(module, self._n_trees, self._max_depth)
        return spec._replace(training_hooks=tuple(spec.training_hooks) + (hook,))

    def _train_step(self, e: _TreeEnsemble, loss, logits, buckets, nodes, context) -> None:
        """TF's ``_grow_tree_fn``: the step's statistics added to the layer's,
        the layer grown (or the bias centered) once `n_batches_per_layer`
        batches are in. A finished ensemble stays as it is (TF grows its
        trailing empty tree a layer in each later `train` call)."""
        if _done(e, self._n_trees, self._max_depth):
            return
        g, = torch.autograd.grad(loss, logits, create_graph=True)
        k = g.shape[1]
        if k == 1:
            h = torch.autograd.grad(g.sum(), logits)[0]
        else:   # (TF's full hessian: [batch, K * K], row i the gradient of g_i)
            h = torch.cat([torch.autograd.grad(g[:, i].sum(), logits, retain_graph=i < k - 1)[0]
                           for i in range(k)], 1)
        g = g.detach()
        replicas = 1 if context is None else context.num_replicas_in_sync
        with torch.no_grad():
            if int(e.growing[e.CENTERING]):
                step = torch.stack([g.mean(), h.mean()])   # (one logit: TF's centering)
                if replicas > 1:
                    step = context.all_reduce(distribute.ReduceOp.MEAN, step)
                e.sums()[1].add_(step)
            else:
                step = self._statistics(e, g, h, buckets, nodes)
                if replicas > 1:
                    step = context.all_reduce(distribute.ReduceOp.MEAN, step)
                e.sums()[0].add_(step)
            e.batches += 1
            if int(e.batches) < self._n_batches_per_layer:
                return
            count = np.float32(e.batches)
            if int(e.growing[e.CENTERING]):
                mean_g, mean_h = (e.sums()[1].cpu().numpy() / count).astype(np.float32)
                self._grower.center_bias(e, mean_g, mean_h)
            else:
                self._grower.grow(e, (e.sums()[0].cpu().numpy() / count).astype(np.float32))
            for sums in e.sums():
                sums.zero_()
            e.batches = 0

    def _sketch_inputs(self, features) -> tuple:
        """(numeric values [batch, n], weights [batch] or [1]) as float32 numpy."""
        values = self._features.values(features).detach().cpu().numpy()
        column = self._sketch_weights
        weights = (np.ones(1, np.float32) if column is None else
                   feature_column.input_layer(features, [column]).reshape(-1)
                   .detach().cpu().numpy().astype(np.float32))
        return values, weights

    def _sketch(self, e: _TreeEnsemble, values, weights, context) -> None:
        """TF's ``_update_quantile_fn``: the batch's quantile summary of each
        numeric feature (every replica's, in replica order) added to the
        streams; once `n_batches_per_layer` batches are in (one with
        `train_in_memory`), the boundaries. The step is not counted (TF's
        global step stays), nor are its statistics taken."""
        model_scope.current().step_uncounted = True
        if e.sketches is None:   # (a restart sketches again from its first batch, as TF)
            e.sketches = [_quantiles.Stream(self._eps, _quantiles.MAX_ELEMENTS)
                          for _ in self._features.numeric]
            e.batches = 0
        summaries = [np.asarray(_sketched(values[:, j], weights, self._eps), np.float32)
                     .reshape(-1, 4) for j in range(values.shape[1])]
        for replica in _gathered(summaries, context):
            for stream, entries in zip(e.sketches, replica):
                stream.push_summary([tuple(np.float32(v) for v in row) for row in entries])
        e.batches += 1
        if int(e.batches) < self._quantile_batches:
            return
        for j, stream in enumerate(e.sketches):
            boundaries = stream.finalize().boundaries(self._num_quantiles)
            if len(boundaries) > e.boundaries.shape[1]:
                raise RuntimeError(f"the quantile sketch of {self._features.names[j]!r} made "
                                   f"{len(boundaries)} boundaries, more than "
                                   f"{e.boundaries.shape[1]} (a bug: please report)")
            e.boundaries[j].fill_(math.inf)
            e.boundaries[j, :len(boundaries)] = torch.tensor(boundaries, dtype=torch.float32)
            e.boundary_count[j] = len(boundaries)
        e.growing[e.BOUNDARIES_READY] = 1
        e.batches = 0
        e.sketches = None

    def _statistics(self, e: _TreeEnsemble, g, h, buckets, nodes) -> torch.Tensor:
        """This batch's sums of gradients and hessians per (node, feature,
        bucket) (TF's ``BoostedTreesAggregateStats``: in float64, then
        float32); a bucket past its group's, TF's missing slot."""
        stats = e.sums()[0]
        splits, count, width = stats.shape[0], stats.shape[1], stats.shape[2]
        limits = torch.as_tensor(self._features.buckets, device=buckets.device)
        slot = torch.where((buckets < 0) | (buckets >= limits), width - 1, buckets)
        keep = nodes < splits   # (a leaf of the last layer has nothing to split)
        index = (nodes.unsqueeze(1) * count + torch.arange(count, device=buckets.device)) \
            * width + slot
        values = torch.cat([g, h], -1).to(torch.float64)   # [batch, K + K * K]
        size = values.shape[1]
        values = values.unsqueeze(1).expand(-1, count, -1)[keep]
        out = torch.zeros(splits * count * width, size, dtype=torch.float64,
                          device=buckets.device)
        out.index_add_(0, index[keep].reshape(-1), values.reshape(-1, size))
        return out.to(torch.float32).view_as(stats)

    def _contributions(self, e: _TreeEnsemble, buckets) -> dict:
        """{"bias": [batch], "dfc": [batch, names]} in float64 (TF's
        ``_parse_explanations_from_prediction``): the running logit (a
        probability, the sigmoid of it, for a classifier) at the bias and
        each level's change of it, summed per feature name."""
        with torch.no_grad():
            path, features = e.logits_paths(buckets)
            path = path.to(torch.float64)
            if self._classifies():
                path = torch.sigmoid(path)
            index = self._features.reported_index.to(features.device)
            steps = torch.where(features >= 0, path[:, 1:] - path[:, :-1], 0.0)
            dfc = path.new_zeros(path.shape[0], len(self._features.reported)).scatter_add_(
                1, index[features.clamp(min=0)], steps)
        return {"bias": path[:, 0], "dfc": dfc}

    def _classifies(self) -> bool:
        """Whether explanations are in probabilities (TF: ``is_classification``)."""
        return isinstance(self._head, ClassificationHead)

    def experimental_predict_with_explanations(self, input_fn, predict_keys=None, hooks=None,
                                               checkpoint_path=None):
        """TF's: `predict`'s dicts, each with ``bias`` and ``dfc``, its
        directional feature contributions (an OrderedDict of feature names,
        largest change first; every feature, 0.0 for those no split on its
        path used): along each example's path through the trees in turn,
        the change at each split of the logit (of the probability, for a
        binary classifier) credited to the split's feature, so that bias +
        sum(dfc) is the prediction (the probability of class 1). Needs
        `center_bias=True` (the bias: tree 0's root), one logit, and a
        regression head without `inverse_link_fn`."""
        if not self._center_bias:
            raise ValueError("center_bias must be enabled during estimator instantiation when "
                             "using experimental_predict_with_explanations.")
        if self._head.logits_dimension > 1:
            raise ValueError("experimental_predict_with_explanations does not yet support "
                             "multi-class classification and multi-label regression.")
        if not self._classifies() and getattr(self._head, "_inverse_link_fn", None) is not None:
            raise ValueError("For now only identity inverse_link_fn in regression_head is "
                             "supported for experimental_predict_with_explanations.")

        def model_fn(features, labels, mode):
            return self._bt_model_fn(features, labels, mode, explain=True)
        explaining = Estimator(model_fn, model_dir=self.model_dir, config=self.config)
        if predict_keys is not None:   # (TF's: the given keys and the explanations)
            keys = [predict_keys] if isinstance(predict_keys, str) else list(predict_keys)
            predict_keys = keys + ["bias", "dfc"]
        names = self._features.reported
        for prediction in explaining.predict(input_fn, predict_keys, hooks, checkpoint_path):
            dfc = prediction["dfc"]
            order = sorted(range(len(names)), key=lambda i: -abs(dfc[i]))   # (stable)
            prediction["dfc"] = collections.OrderedDict((names[i], dfc[i]) for i in order)
            yield prediction

    def experimental_feature_importances(self, normalize: bool = False) -> dict:
        """TF's: each column's split gains summed over the trees of the latest
        checkpoint (an indicator column's categories under the categorical
        column's key), largest first."""
        path = checkpoint_lib.latest_checkpoint(self.model_dir)
        if path is None:
            raise ValueError(f"No checkpoint in {self.model_dir} to read the trees from: "
                             "train first")
        feature = self.get_variable_value("boosted_trees/feature")
        gain = self.get_variable_value("boosted_trees/gain")
        totals = dict.fromkeys(self._features.reported, 0.0)
        for f, value in zip(feature.reshape(-1), gain.reshape(-1)):
            if f >= 0:
                totals[self._features.names[f]] += float(value)
        if normalize:
            total = sum(totals.values())
            if any(v < 0 for v in totals.values()) or total <= 0:
                raise ValueError("Cannot normalize the feature importances: some are "
                                 "negative or they sum to 0")
            totals = {k: v / total for k, v in totals.items()}
        return collections.OrderedDict(sorted(totals.items(), key=lambda kv: -abs(kv[1])))


def _sketched(values: np.ndarray, weights: np.ndarray, eps: float) -> list:
    """A batch's quantile summary of a feature's values, NaN left out (TF's
    sketch takes them in, and its boundaries then hold NaN, out of order; a
    NaN value is bucket 0 either way)."""
    kept = ~np.isnan(values)
    if not kept.all():
        values = values[kept]
        weights = weights if len(weights) == 1 else weights[kept]
    return _quantiles.batch_summary(values, weights, eps)


def _gathered(summaries: List[np.ndarray], context) -> List[List[np.ndarray]]:
    """Each replica's summaries (one per numeric feature), in replica order."""
    if context is None or context.num_replicas_in_sync == 1:
        return [summaries]
    counts = torch.tensor([len(s) for s in summaries], dtype=torch.int64)
    flat = torch.from_numpy(np.concatenate(summaries)) if summaries else torch.zeros(0, 4)
    all_counts = context.all_gather(counts, axis=0).view(-1, len(summaries)).tolist()
    all_flat = context.all_gather(flat, axis=0).numpy()
    out, at = [], 0
    for replica_counts in all_counts:
        replica = []
        for n in replica_counts:
            replica.append(all_flat[at:at + n])
            at += n
        out.append(replica)
    return out


def _check_strategy() -> None:
    strategy = distribute.get_strategy()
    if strategy.extended.uses_parameter_servers:
        raise NotImplementedError(
            "BoostedTrees under a ParameterServerStrategy is not built here (TF grows the "
            "trees on the chief from the workers' statistics): train it on one machine or "
            "with MirroredStrategy / MultiWorkerMirroredStrategy")


class BoostedTreesClassifier(_BoostedTrees):
    """A boosted trees classifier (TF: ``tf.estimator.BoostedTreesClassifier``,
    same arguments and defaults). Its head is TF1's with the loss the
    batch's mean (SUM_OVER_BATCH_SIZE; more classes: over the nonzero
    weights, TF's maxent loss)."""

    def __init__(self, feature_columns, n_batches_per_layer: int, model_dir=None,
                 n_classes: int = 2, weight_column=None,
                 label_vocabulary: Optional[Sequence[str]] = None, n_trees: int = 100,
                 max_depth: int = 6, learning_rate: float = 0.1,
                 l1_regularization: float = 0.0, l2_regularization: float = 0.0,
                 tree_complexity: float = 0.0, min_node_weight: float = 0.0, config=None,
                 center_bias: bool = False, pruning_mode: str = "none",
                 quantile_sketch_epsilon: float = 0.01, train_in_memory: bool = False):
        head = ClassificationHead(n_classes, weight_column, label_vocabulary,
                                  Reduction.SUM_OVER_BATCH_SIZE if n_classes == 2
                                  else Reduction.SUM_OVER_NONZERO_WEIGHTS)
        super().__init__(head, feature_columns, n_batches_per_layer, model_dir, n_trees,
                         max_depth, learning_rate, l1_regularization, l2_regularization,
                         tree_complexity, min_node_weight, config, center_bias, pruning_mode,
                         quantile_sketch_epsilon, train_in_memory)


class BoostedTreesRegressor(_BoostedTrees):
    """A boosted trees regressor (TF: ``tf.estimator.BoostedTreesRegressor``,
    same arguments and defaults; one label dimension here). Its head is
    TF1's regression head with the loss the batch's mean."""

    def __init__(self, feature_columns, n_batches_per_layer: int, model_dir=None,
                 label_dimension: int = 1, weight_column=None, n_trees: int = 100,
                 max_depth: int = 6, learning_rate: float = 0.1,
                 l1_regularization: float = 0.0, l2_regularization: float = 0.0,
                 tree_complexity: float = 0.0, min_node_weight: float = 0.0, config=None,
                 center_bias: bool = False, pruning_mode: str = "none",
                 quantile_sketch_epsilon: float = 0.01, train_in_memory: bool = False):
        if label_dimension != 1:
            raise NotImplementedError(
                f"BoostedTreesRegressor with label_dimension={label_dimension}: vector "
                "leaves are not built here; one label dimension only")
        head = RegressionHead(1, weight_column, Reduction.SUM_OVER_BATCH_SIZE)
        super().__init__(head, feature_columns, n_batches_per_layer, model_dir, n_trees,
                         max_depth, learning_rate, l1_regularization, l2_regularization,
                         tree_complexity, min_node_weight, config, center_bias, pruning_mode,
                         quantile_sketch_epsilon, train_in_memory)


class BoostedTreesEstimator(_BoostedTrees):
    """Boosted trees under a given head (TF: ``tf.estimator.BoostedTreesEstimator``,
    same arguments and defaults): the gradients and hessians of the head's
    loss grow the trees, as the classifier's and regressor's. A head of one
    logit (`BinaryClassHead`, `RegressionHead`, ...) or `MultiClassHead`
    (without `center_bias`, as TF, whose training of that fails). As TF's,
    `weight_column` is unused (the head's weights the loss; the quantile
    sketch is unweighted). `experimental_predict_with_explanations` gives a
    classification head's in probabilities (TF fails on `BinaryClassHead`)."""

    def __init__(self, feature_columns, n_batches_per_layer: int, head, model_dir=None,
                 weight_column=None, n_trees: int = 100, max_depth: int = 6,
                 learning_rate: float = 0.1, l1_regularization: float = 0.0,
                 l2_regularization: float = 0.0, tree_complexity: float = 0.0,
                 min_node_weight: float = 0.0, config=None, center_bias: bool = False,
                 pruning_mode: str = "none", quantile_sketch_epsilon: float = 0.01):
        super().__init__(head, feature_columns, n_batches_per_layer, model_dir, n_trees,
                         max_depth, learning_rate, l1_regularization, l2_regularization,
                         tree_complexity, min_node_weight, config, center_bias, pruning_mode,
                         quantile_sketch_epsilon, False)
        self._sketch_weights = None   # (TF's: the model_fn gets no weight column)
        if weight_column is not None:
            logger.warning(
                "BoostedTreesEstimator(weight_column=%r) is unused, as TF's: give the head a "
                "weight_column to weight the loss (the quantile sketch stays unweighted)",
                getattr(weight_column, "key", weight_column))
