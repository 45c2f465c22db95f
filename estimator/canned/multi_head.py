"""`MultiHead`: several named heads trained together on one network (TF:
``tf.estimator.MultiHead``; TF1 programs: ``tf.contrib.estimator.multi_head``),
multi-task learning.

- **Logits**: a dict {head name: logits}, or one tensor [batch, sum of the
  heads' logits dimensions] split in the heads' order.
- **Labels**: a dict {head name: that head's labels}.
- **Loss**: the sum of each head's loss (reduced as that head says) times
  its `head_weights` entry (default 1).
- **evaluate**: every head's metrics (suffixed with its name, as a named
  head's are), ``loss/<name>`` (the mean of that head's batch losses) and the
  estimator's ``loss`` (of the weighted sum).
- **predict**: keys ``(head name, prediction key)``, as TF's.
- **Exports**: ``serving_default`` (the first head's default), for each head
  ``<name>`` (its default) and ``<name>/<signature>``, and ``predict`` with
  every head's predict outputs as ``<name>/<key>``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from hooks import summary
from hooks.mode_keys import ModeKeys

from .. import export, metrics
from ..model_fn import EstimatorSpec
from ._head import PREDICT, SERVING_DEFAULT, Head, _regularization_loss, _train_op


class MultiHead(Head):
    """Heads of a multi-task model (TF: ``tf.estimator.MultiHead``, same
    arguments)."""

    _NAMED_SUMMARY = False   # (TF: TRAIN's regularization_loss summary unsuffixed)

    def __init__(self, heads: Sequence[Head], head_weights: Optional[Sequence[float]] = None):
        heads = tuple(heads or ())
        if not heads:
            raise ValueError(f"Must specify heads. Given: {heads}")
        for head in heads:
            if not isinstance(head, Head) or isinstance(head, MultiHead):
                raise ValueError(f"heads must be heads of this library other than MultiHead, "
                                 f"got {head!r}")
            if not head.name:
                raise ValueError(f"All given heads must have name specified. Given: {head!r} "
                                 f"(give each head name=...)")
        names = [head.name for head in heads]
        if len(set(names)) != len(names):
            raise ValueError(f"heads must have distinct names, got {names}")
        if head_weights is not None and len(head_weights) != len(heads):
            raise ValueError(f"heads and head_weights must have the same size. Given "
                             f"len(heads): {len(heads)}. Given len(head_weights): "
                             f"{len(head_weights)}.")
        super().__init__(name="_".join(names))
        self._heads = heads
        self._head_weights = None if head_weights is None else tuple(map(float, head_weights))
        self.logits_dimension = sum(head.logits_dimension for head in heads)

    @property
    def heads(self) -> tuple:
        return self._heads

    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None,
                              trainable_variables=None, train_op_fn=None, update_ops=None,
                              regularization_losses=None) -> EstimatorSpec:
        """TF's ``MultiHead.create_estimator_spec``; `labels` a dict by head name;
        the other arguments as a single head's."""
        per_head = self._split(logits)
        if mode == ModeKeys.PREDICT:
            predictions, outputs = {}, {}
            for head, part in zip(self._heads, per_head):
                own = head._all_predictions(part)
                predictions.update({(head.name, k): v for k, v in own.items()})
                outputs.update(self._renamed(head, head._export_outputs(own)))
            merged, named = {}, {}
            for head in self._heads:
                own = outputs.get(f"{head.name}/{PREDICT}")
                if own is not None:
                    merged.update({f"{head.name}/{k}": v for k, v in own.outputs.items()})
                    named.update({f"{head.name}/{k}": (
                        None if spec["ids"] is None else f"{head.name}/{spec['ids']}",
                        spec["names"]) for k, spec in own.named_outputs.items()})
            outputs[PREDICT] = export.PredictOutput(merged, named_outputs=named)
            outputs[SERVING_DEFAULT] = outputs[self._heads[0].name]
            return EstimatorSpec(mode, predictions=predictions, export_outputs=outputs)
        if not isinstance(labels, dict):
            raise ValueError(f"labels must be a dict {{head name: labels}} for MultiHead "
                             f"{[h.name for h in self._heads]}. Given: "
                             f"{type(labels).__name__}")
        missing = [h.name for h in self._heads if h.name not in labels]
        if missing:
            raise ValueError(f"labels has no entry for head(s) {missing}; it has "
                             f"{sorted(labels)}")
        regularization = _regularization_loss(regularization_losses)
        total, ops, predictions = 0.0, {}, {}
        weights = self._head_weights or (1.0,) * len(self._heads)
        for head, part, weight in zip(self._heads, per_head, weights):
            head_labels, head_weights, unreduced, loss = head._losses(
                features, part, labels[head.name], mode)
            if mode == ModeKeys.EVAL:
                own = head._predictions(part)
                predictions.update({(head.name, k): v for k, v in own.items()})
                ops.update(head._metrics(head_labels, own, head_weights, unreduced))
                key = f"loss/{head.name}"
                ops[key] = metrics.mean(loss.detach(), name=key)
            else:
                loss = head._training_loss(loss, head_weights, unreduced)
                if summary.should_record_summaries():   # (TF: each head's own, unweighted)
                    summary.scalar(f"loss/{head.name}", loss.detach())
            total = total + (loss * weight if weight != 1.0 else loss)
        if mode == ModeKeys.EVAL:
            return EstimatorSpec(mode, predictions=predictions,
                                 loss=self._regularized(total, regularization, ops),
                                 eval_metric_ops=ops)
        train_op = _train_op(optimizer, trainable_variables, train_op_fn, update_ops)
        total = self._regularized(total, regularization)
        return EstimatorSpec(mode, loss=total, train_op=train_op(total))

    def _split(self, logits) -> list:
        """Each head's logits, from a dict by name or one concatenated tensor."""
        if isinstance(logits, dict):
            missing = [h.name for h in self._heads if h.name not in logits]
            if missing:
                raise ValueError(f"logits has no entry for head(s) {missing}; it has "
                                 f"{sorted(logits)}")
            parts = [logits[h.name] for h in self._heads]
        else:
            self._check_logits(logits)
            parts = list(torch.split(logits, [h.logits_dimension for h in self._heads], -1))
        for head, part in zip(self._heads, parts):
            head._check_logits(part)
        return parts

    @staticmethod
    def _renamed(head: Head, outputs: dict) -> dict:
        """A head's export outputs as TF's MultiHead names them."""
        return {head.name if k == SERVING_DEFAULT else f"{head.name}/{k}": v
                for k, v in outputs.items()}
