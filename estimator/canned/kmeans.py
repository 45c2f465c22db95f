"""TF's k-means Estimator (``tf.compat.v1.estimator.experimental.KMeans``,
TF1 contrib's ``tf.contrib.factorization.KMeansClustering``): the same
arguments, algorithm (TF's ``clustering_ops.KMeans``: mini-batch updates with
per-cluster counts, several steps an iteration, or full-batch Lloyd
iterations; squared Euclidean or cosine distance; random, k-means++, given
or computed initial centers), loss, evaluation (``score``), predictions
(``cluster_index``, ``all_distances``), exports and methods.

The centers are the buffers of the module ``kmeans`` (TF's variables:
``kmeans/clusters`` for ``clusters``, ``kmeans/counts`` for the mini-batch
counts TF names ``Variable``, ``kmeans/clusters_updated``,
``kmeans/update_in_steps``, ``kmeans/initialized``). As TF's initialization
hook's runs, the batches that choose the initial centers are not training
steps: the global step stays, and no hook sees them.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

import distribute
from hooks import SessionRunArgs, SessionRunHook, model_scope, summary

from .. import export, feature_column, metrics
from ..estimator import Estimator
from ..mode_keys import ModeKeys
from ..model_fn import EstimatorSpec
from ._base import column_tuple

SQUARED_EUCLIDEAN_DISTANCE = "squared_euclidean"
COSINE_DISTANCE = "cosine"
RANDOM_INIT = "random"
KMEANS_PLUS_PLUS_INIT = "kmeans_plus_plus"


class _Clusters(torch.nn.Module):
    """TF's k-means variables as buffers: the centers (``chosen`` of the
    ``k`` rows chosen so far, TF's variable of growing shape), whether they
    are all chosen, and in mini-batch mode the counts and, with several
    steps an iteration, the centers updated each step and the steps left."""

    def __init__(self, k: int, d: int, mini_batch: bool, steps_per_iteration: int):
        super().__init__()
        self.register_buffer("clusters", torch.zeros(k, d))
        self.register_buffer("chosen", torch.zeros((), dtype=torch.int64))
        self.register_buffer("initialized", torch.zeros((), dtype=torch.bool))
        if mini_batch:
            self.register_buffer("counts", torch.full((k,), int(steps_per_iteration == 1),
                                                      dtype=torch.int64))
            if steps_per_iteration > 1:
                self.register_buffer("clusters_updated", torch.zeros(k, d))
                self.register_buffer("update_in_steps",
                                     torch.tensor(steps_per_iteration, dtype=torch.int64))
        self._ready = False   # `initialized` seen true (it stays so): no read a step

    def ready(self) -> bool:
        if not self._ready:
            self._ready = bool(self.initialized)
        return self._ready

    # Replicas choose and update the centers alike (the first replica's
    # choice, every replica's sums): never averaged.
    same_buffers_on_replicas = True


class _LossRelativeChangeHook(SessionRunHook):
    """TF's: stop once the loss changes by less than `tolerance` relative to
    ``1 + |previous loss|`` between training steps (the steps choosing the
    initial centers are hidden from hooks)."""

    def __init__(self, tolerance: float):
        self._tolerance, self._previous = tolerance, None

    def before_run(self, run_context):
        return SessionRunArgs("loss")

    def after_run(self, run_context, run_values):
        loss = float(run_values.results)
        if self._previous:   # (TF's test: a previous loss of 0 is none)
            if abs(loss - self._previous) / (1 + abs(self._previous)) < self._tolerance:
                run_context.request_stop()
        self._previous = loss


def _points(features, columns) -> torch.Tensor:
    """TF's ``_parse_features_if_necessary``: the input layer of `columns`,
    else a dict's features concatenated in the order of their sorted keys,
    else the features themselves; [batch, dimensions] float32 (TF's
    clustering kernels take float32)."""
    if isinstance(features, dict):
        if columns:
            points = feature_column.input_layer(features, list(columns))
        else:
            if not features:
                raise ValueError("KMeans: the features dict is empty")
            parts = []
            for key in sorted(features):
                value = features[key]
                if not isinstance(value, torch.Tensor):
                    value = np.asarray(value)
                    if value.dtype.kind not in "fiub":
                        raise ValueError(f"KMeans: feature {key!r} holds {value.dtype} values; "
                                         "the points are numbers (give feature_columns to "
                                         "make numbers of other features)")
                    value = torch.as_tensor(value)
                parts.append(value)
            rows = parts[0].shape[0] if parts[0].dim() else 1
            parts = [p.reshape(rows, -1) for p in parts]
            points = torch.cat([p.to(torch.float32) for p in parts], 1)
    else:
        points = features if isinstance(features, torch.Tensor) else torch.as_tensor(
            np.asarray(features))
    if points.dim() != 2:
        raise ValueError(f"KMeans: the input points must be a matrix [batch, dimensions], got "
                         f"shape {list(points.shape)}")
    if not (points.is_floating_point() or points.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"KMeans: the input points must be numbers, got {points.dtype}")
    return points.to(torch.float32)


def _normalized(x: torch.Tensor) -> torch.Tensor:
    """TF's ``l2_normalize`` (a zero row stays zero)."""
    return x * torch.rsqrt(torch.clamp((x * x).sum(1, keepdim=True), min=1e-12))


def _all_distances(x: torch.Tensor, centers: torch.Tensor, metric: str) -> torch.Tensor:
    """TF's ``_distance_graph`` [batch, k]: squared Euclidean distances by
    TF's expansion, or ``1 - x.c`` of normalized points and centers."""
    if metric == SQUARED_EUCLIDEAN_DISTANCE:
        return ((x * x).sum(1, keepdim=True) - 2 * x @ centers.T
                + (centers * centers).sum(1)[None, :])
    return 1 - x @ centers.T


def _nearest(x: torch.Tensor, centers: torch.Tensor, metric: str) -> tuple:
    """TF's ``nearest_neighbors`` kernel: (each point's nearest center, its
    squared distance, at least 0; halved for cosine: ``1 - cos``)."""
    squared = ((x * x).sum(1, keepdim=True) - 2 * x @ centers.T
               + (centers * centers).sum(1)[None, :])
    distance, index = squared.min(1)
    distance = distance.clamp(min=0)
    return index, distance * 0.5 if metric == COSINE_DISTANCE else distance


class KMeansClustering(Estimator):
    """An Estimator for k-means clustering (TF's
    ``tf.compat.v1.estimator.experimental.KMeans``); ``input_fn`` gives the
    points (a tensor [batch, dimensions] or a dict of features, no labels)."""

    SQUARED_EUCLIDEAN_DISTANCE = SQUARED_EUCLIDEAN_DISTANCE
    COSINE_DISTANCE = COSINE_DISTANCE
    RANDOM_INIT = RANDOM_INIT
    KMEANS_PLUS_PLUS_INIT = KMEANS_PLUS_PLUS_INIT
    SCORE = "score"
    CLUSTER_INDEX = "cluster_index"
    ALL_DISTANCES = "all_distances"
    CLUSTER_CENTERS_VAR_NAME = "kmeans/clusters"

    def __init__(self, num_clusters, model_dir=None, initial_clusters=RANDOM_INIT,
                 distance_metric=SQUARED_EUCLIDEAN_DISTANCE, seed=None, use_mini_batch=True,
                 mini_batch_steps_per_iteration=1, kmeans_plus_plus_num_retries=2,
                 relative_tolerance=None, config=None, feature_columns=None):
        if isinstance(initial_clusters, str):
            if initial_clusters not in (RANDOM_INIT, KMEANS_PLUS_PLUS_INIT):
                raise ValueError(f"Unsupported initialization algorithm '{initial_clusters}'")
            self._initial = initial_clusters
        elif callable(initial_clusters):
            self._initial = initial_clusters
        else:
            initial = torch.as_tensor(np.asarray(initial_clusters.detach().cpu() if isinstance(
                initial_clusters, torch.Tensor) else initial_clusters, dtype=np.float32))
            if initial.dim() != 2 or not initial.shape[0]:
                raise ValueError(f"initial_clusters must be 'random', 'kmeans_plus_plus', a "
                                 f"callable or centers [k, dimensions], got shape "
                                 f"{list(initial.shape)}")
            self._initial = initial
            num_clusters = initial.shape[0]   # (TF: num_clusters is then ignored)
        if distance_metric not in (SQUARED_EUCLIDEAN_DISTANCE, COSINE_DISTANCE):
            raise ValueError(f"Unsupported distance metric '{distance_metric}'")
        if not isinstance(num_clusters, (int, np.integer)) or isinstance(num_clusters, bool) \
                or num_clusters < 1:
            raise ValueError(f"num_clusters must be a positive int, got {num_clusters!r}")
        steps = mini_batch_steps_per_iteration
        if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"mini_batch_steps_per_iteration must be a positive int, got "
                             f"{steps!r}")
        if relative_tolerance is not None and not (
                isinstance(relative_tolerance, (int, float)) and relative_tolerance >= 0):
            raise ValueError(f"relative_tolerance must be a non-negative number or None, got "
                             f"{relative_tolerance!r}")
        self._k = int(num_clusters)
        self._metric = distance_metric
        self._seed = seed
        self._mini_batch = bool(use_mini_batch)
        self._steps = int(steps) if self._mini_batch else 1
        self._retries = int(kmeans_plus_plus_num_retries)
        self._tolerance = relative_tolerance
        self._columns = column_tuple(feature_columns, "feature_columns")
        self._generator: Optional[torch.Generator] = None
        super().__init__(self._kmeans_model_fn, model_dir=model_dir, config=config)

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """Estimator.train; as TF's (its initialization hook's OutOfRangeError),
        an error if the input ends before the initial centers are all chosen
        (the checkpoint keeps those chosen: training on goes on choosing)."""
        super().train(input_fn, hooks, steps, max_steps, saving_listeners)
        if self.latest_checkpoint() is not None and \
                not self.get_variable_value("kmeans/initialized"):
            chosen = int(self.get_variable_value("kmeans/chosen"))
            raise ValueError(f"KMeans: the input ended with {chosen} of the {self._k} initial "
                             "centers chosen (fewer points than num_clusters?); give more "
                             "points, or fewer clusters")
        return self

    # -- the methods TF adds ------------------------------------------------------
    def predict_cluster_index(self, input_fn):
        """Yield the index of each input point's nearest center."""
        for result in self.predict(input_fn, predict_keys=[self.CLUSTER_INDEX]):
            yield result[self.CLUSTER_INDEX]

    def score(self, input_fn) -> float:
        """The sum of the squared distances of the first batch's points to their
        nearest centers (unlike sklearn's, not negated)."""
        return self.evaluate(input_fn, steps=1)[self.SCORE]

    def transform(self, input_fn):
        """Yield each point's distances to every center (Euclidean, not squared,
        for the squared Euclidean metric, as TF's)."""
        for result in self.predict(input_fn, predict_keys=[self.ALL_DISTANCES]):
            distances = result[self.ALL_DISTANCES]
            yield np.sqrt(distances) if self._metric == SQUARED_EUCLIDEAN_DISTANCE else distances

    def cluster_centers(self) -> np.ndarray:
        """The centers in the latest checkpoint [k, dimensions]."""
        chosen = int(self.get_variable_value("kmeans/chosen"))
        return self.get_variable_value(self.CLUSTER_CENTERS_VAR_NAME)[:chosen]

    # -- model_fn -------------------------------------------------------------------
    def _kmeans_model_fn(self, features, labels, mode):
        points = _points(features, self._columns)
        clusters = model_scope.get_module("kmeans", lambda: _Clusters(
            self._k, points.shape[1], self._mini_batch, self._steps))
        c = getattr(clusters, "module", clusters)   # (a replicated one: its module)
        if points.shape[1] != c.clusters.shape[1]:
            raise ValueError(f"KMeans: the input points have {points.shape[1]} dimensions, "
                             f"the centers {c.clusters.shape[1]}")
        points = points.to(c.clusters.device)
        x = _normalized(points) if self._metric == COSINE_DISTANCE else points
        if mode == ModeKeys.TRAIN and not c.ready():
            if not isinstance(self._initial, torch.Tensor):
                return self._initializing_spec(c, points, mode)
            if self._initial.shape[1] != points.shape[1]:
                raise ValueError(f"KMeans: initial_clusters are centers of "
                                 f"{self._initial.shape[1]} dimensions, the input points have "
                                 f"{points.shape[1]}")
            with torch.no_grad():   # (given centers: TF's init op reads no batch)
                self._add(c, self._initial.to(x.device))
        elif not torch.compiler.is_compiling() and not c.ready():   # (not traced)
            raise ValueError(f"KMeans: {int(c.chosen)} of the {self._k} initial centers are "
                             "chosen (no checkpoint, or training ended while choosing them): "
                             "train on more batches first")
        if mode == ModeKeys.TRAIN and self._mini_batch and self._steps > 1:
            self._sync(c)
        centers = self._assigning(c)
        with torch.no_grad():
            # (TF normalizes the assigning centers once more for its kernel)
            index, distance = _nearest(x, _normalized(centers) if self._metric == COSINE_DISTANCE
                                       and not self._kept_normalized() else centers,
                                       self._metric)
            loss = distance.sum()
        if mode == ModeKeys.PREDICT:
            predictions = {self.ALL_DISTANCES: _all_distances(x, centers, self._metric),
                           self.CLUSTER_INDEX: index}
            return EstimatorSpec(mode, predictions=predictions, export_outputs={
                self.ALL_DISTANCES: export.PredictOutput(predictions[self.ALL_DISTANCES]),
                self.CLUSTER_INDEX: export.PredictOutput(index),
                "serving_default": export.PredictOutput(index)})
        if mode == ModeKeys.EVAL:
            return EstimatorSpec(mode, loss=loss,
                                 eval_metric_ops={self.SCORE: metrics.mean(loss)})
        _check_strategy()
        summary.scalar("loss/raw", loss)
        context = distribute.get_replica_context()   # (the train_op runs outside it)
        return EstimatorSpec(mode, loss=loss, training_hooks=self._hooks(),
                             train_op=lambda: self._train_step(c, x, index, context))

    def _hooks(self) -> list:
        """The training hooks (of the first step's spec, a choosing one too)."""
        return [] if self._tolerance is None else [_LossRelativeChangeHook(self._tolerance)]

    def _assigning(self, c: _Clusters) -> torch.Tensor:
        """The centers points are assigned to (normalized for cosine where TF
        does not keep them so: mini-batch, one step an iteration)."""
        if self._metric == COSINE_DISTANCE and not self._kept_normalized():
            return _normalized(c.clusters)
        return c.clusters

    def _kept_normalized(self) -> bool:
        return self._metric == COSINE_DISTANCE and (not self._mini_batch or self._steps > 1)

    def _train_step(self, c: _Clusters, x, index, context) -> None:
        """One mini-batch step (TF's ``_mini_batch_training_op``: a center
        moves to its ``n`` points by ``1 / (count + n)``, the count TF reads
        being the one after the step's) or one Lloyd iteration
        (``_full_batch_training_op``)."""
        k = c.clusters.shape[0]
        with torch.no_grad():
            sums = torch.zeros_like(c.clusters).index_add_(0, index, x)
            counts = torch.zeros(k, dtype=torch.float32, device=x.device).index_add_(
                0, index, torch.ones_like(index, dtype=torch.float32))
            if context is not None and context.num_replicas_in_sync > 1:
                both = context.all_reduce(distribute.ReduceOp.SUM,
                                          torch.cat([sums, counts[:, None]], 1))
                sums, counts = both[:, :-1], both[:, -1]
            if not self._mini_batch:
                centers = sums / (counts[:, None] + 1e-6)
                c.clusters.copy_(_normalized(centers) if self._kept_normalized() else centers)
                return
            target = c.clusters_updated if self._steps > 1 else c.clusters
            c.counts.add_(counts.to(torch.int64))
            # TF's graph orders nothing between the counts' update and their
            # read for the step size; TF reads them updated in nearly every run:
            # 1 / (count + 2n), where its code means 1 / (count + n)
            rate = torch.where(counts > 0, 1.0 / (c.counts.to(torch.float32) + counts).clamp(
                min=1), 0.0)   # (clusters without points stay)
            target.add_((sums - counts[:, None] * target) * rate[:, None])

    def _sync(self, c: _Clusters) -> None:
        """TF's ``_mini_batch_sync_updates_op``, as a step begins: every
        ``mini_batch_steps_per_iteration`` steps the updated centers become
        the centers (normalized for cosine) and the counts start again."""
        with torch.no_grad():   # (no host read: on a device, no sync a step)
            due = c.update_in_steps <= 0
            updated = c.clusters_updated
            c.clusters.copy_(torch.where(due, _normalized(updated) if self._metric ==
                                         COSINE_DISTANCE else updated, c.clusters))
            c.counts.masked_fill_(due, 0)
            c.update_in_steps.copy_(torch.where(due, self._steps - 1, c.update_in_steps - 1))

    # -- choosing the initial centers --------------------------------------------------
    def _initializing_spec(self, c: _Clusters, points, mode) -> EstimatorSpec:
        """A step that chooses centers from its batch (TF's
        ``_InitializeClustersHook`` running the init op on the batches
        before training), left out of the global step and unseen by hooks."""
        context = distribute.get_replica_context()
        _check_strategy()
        scope = model_scope.current()

        def choose():
            scope.step_uncounted = scope.step_hidden = True
            first = context is None or context.replica_id_in_sync_group == 0
            with torch.no_grad():
                new = self._choose(c, points) if first else None
                if context is not None and context.num_replicas_in_sync > 1:
                    # the first replica's choice on every replica
                    rows = torch.tensor(float(new.shape[0] if first else 0),
                                        device=points.device)
                    rows = int(context.all_reduce(distribute.ReduceOp.SUM, rows))
                    mine = new if first else points.new_zeros(rows, points.shape[1])
                    new = context.all_reduce(distribute.ReduceOp.SUM, mine)
                self._add(c, new)
        return EstimatorSpec(mode, loss=torch.zeros((), device=points.device), train_op=choose,
                             training_hooks=self._hooks())

    def _choose(self, c: _Clusters, points: torch.Tensor) -> torch.Tensor:
        """Centers from the batch `points` (TF's ``_choose_initial_centers``:
        the callable and the random rows take the points as they come,
        k-means++ normalized for cosine; `_add` normalizes what they give)."""
        remaining = self._k - int(c.chosen)
        n = points.shape[0]
        if callable(self._initial):
            new = self._initial([points], remaining)   # (TF's: the list of input shards)
            new = torch.as_tensor(np.asarray(new) if not isinstance(new, torch.Tensor)
                                  else new).to(device=points.device, dtype=torch.float32)
            if new.dim() != 2 or new.shape[1] != points.shape[1] or new.shape[0] > remaining:
                raise ValueError(f"KMeans: initial_clusters(inputs, {remaining}) must give "
                                 f"at most {remaining} centers of {points.shape[1]} dimensions, "
                                 f"got shape {list(new.shape)}")
        elif self._initial == RANDOM_INIT:
            if n <= remaining:
                new = points
            else:
                new = points[torch.randint(0, n, (remaining,), generator=self._rng(),
                                           device="cpu").to(points.device)]
        else:
            if n < remaining:
                raise ValueError(f"KMeans: k-means++ initialization chooses all {remaining} "
                                 f"centers from one batch, which holds {n} points: give "
                                 "batches of at least num_clusters points")
            new = self._kmeans_plus_plus(_normalized(points) if self._metric == COSINE_DISTANCE
                                         else points, remaining)
        return new

    def _add(self, c: _Clusters, new: torch.Tensor) -> None:
        if self._metric == COSINE_DISTANCE:
            new = _normalized(new)
        start = int(c.chosen)
        if start + new.shape[0] > self._k:
            raise ValueError(f"KMeans: {new.shape[0]} initial centers given where "
                             f"{self._k - start} remain to be chosen")
        c.clusters[start:start + new.shape[0]] = new
        c.chosen.add_(new.shape[0])
        if hasattr(c, "clusters_updated"):
            c.clusters_updated.copy_(c.clusters)
        if int(c.chosen) == self._k:
            c.initialized.fill_(True)

    def _rng(self) -> torch.Generator:
        """The draws' generator: seeded by `seed`, else from torch's."""
        if self._generator is None:
            self._generator = torch.Generator()
            self._generator.manual_seed(self._seed if self._seed is not None else
                                        int(torch.randint(0, 2 ** 62, ())))
        return self._generator

    def _kmeans_plus_plus(self, x: torch.Tensor, count: int) -> torch.Tensor:
        """TF's ``KmeansPlusPlusInitialization``: a first center uniformly, then
        each next one the best (least total distance) of ``1 + retries``
        candidates drawn in proportion to the squared distance to the centers
        so far (``retries`` < 0: ``2 + floor(log(count))``)."""
        retries = self._retries if self._retries >= 0 else 2 + int(math.log(count))
        g = self._rng()
        points = x.detach().cpu().to(torch.float64)
        chosen = [int(torch.randint(0, points.shape[0], (), generator=g))]
        nearest = ((points - points[chosen[0]]) ** 2).sum(1)
        for _ in range(1, count):
            total = float(nearest.sum())
            if total <= 0:   # (every point is a center already: any point)
                candidates = torch.randint(0, points.shape[0], (retries + 1,), generator=g)
            else:
                candidates = torch.multinomial(nearest / total, retries + 1, replacement=True,
                                               generator=g)
            best, best_nearest, best_total = None, None, math.inf
            for i in candidates.tolist():
                trial = torch.minimum(nearest, ((points - points[i]) ** 2).sum(1))
                if float(trial.sum()) < best_total:
                    best, best_nearest, best_total = i, trial, float(trial.sum())
            chosen.append(best)
            nearest = best_nearest
        return x[torch.tensor(chosen, device=x.device)]


def _check_strategy() -> None:
    if distribute.get_strategy().extended.uses_parameter_servers:
        raise ValueError("KMeansClustering does not train with parameter servers here: use "
                         "MirroredStrategy or MultiWorkerMirroredStrategy (every replica's "
                         "points update the same centers)")


KMeans = KMeansClustering
