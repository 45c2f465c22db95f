"""`MultiLabelHead`: any number of `n_classes` labels per example (TF:
``tf.estimator.MultiLabelHead``, also ``tf.compat.v1.estimator.MultiLabelHead``;
TF1 programs: ``tf.contrib.estimator.multi_label_head``), for the head-taking
estimators (`DNNEstimator`, `LinearEstimator`, `DNNLinearCombinedEstimator`)
or a model_fn's ``head.create_estimator_spec``.

One logit per class, sigmoid cross entropy per class, averaged over the
classes: an example's loss; the training loss is those times the weight
column, reduced as `loss_reduction` says (default ``'sum_over_batch_size'``:
the sum over the batch size, TF2's default; ``'sum'``). On N replicas a
``'sum_over_batch_size'`` loss steps as one process on the global batch.

Labels: a multi-hot [batch, n_classes] tensor or array of 0 and 1 (float
values in [0, 1] are soft labels, as TF takes them); with `label_vocabulary`,
each example's label words: a string matrix padded with ``""`` (TF's
``tf.sparse.from_dense`` of it) or a list of lists of strings.

Predictions (TF's keys): ``logits``, ``probabilities`` (sigmoid) and
``classes`` (every class name as bytes, per example; PREDICT only). Evaluation
(TF's keys; each suffixed ``/<name>`` when the head has a `name`):
``average_loss``, ``auc``, ``auc_precision_recall`` over every (example,
class) pair; per threshold ``accuracy/positive_threshold_<t>``,
``precision/...``, ``recall/...``; per class of
`classes_for_class_based_metrics` ``probability_mean/class<id>`` (or
``/<word>``), ``auc/...``, ``auc_precision_recall/...``. TF computes these
with Keras metrics; the values are the same.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .. import export, metrics
from ._head import (CLASSIFY, PREDICT, SERVING_DEFAULT, Head, _check_classes,
                    _check_thresholds, _threshold_metrics)


class MultiLabelHead(Head):
    """Multi-label classification head (TF: ``tf.estimator.MultiLabelHead``, same
    arguments and defaults)."""

    _PR_SUMMATION = "careful_interpolation"   # (Keras's AUC, as TF2's heads)

    def __init__(self, n_classes: int, weight_column=None,
                 thresholds: Optional[Sequence[float]] = None,
                 label_vocabulary: Optional[Sequence[str]] = None,
                 loss_reduction: str = "sum_over_batch_size", loss_fn=None,
                 classes_for_class_based_metrics=None, name: Optional[str] = None):
        super().__init__(weight_column, loss_reduction, loss_fn, name)
        self._thresholds = _check_thresholds(thresholds)
        self._vocabulary = self._check_vocabulary(label_vocabulary, n_classes)
        self.logits_dimension = n_classes
        names = self._vocabulary or [str(i) for i in range(n_classes)]
        self._class_names = np.array([n.encode() for n in names], dtype=object)
        self._class_metrics = self._check_classes(classes_for_class_based_metrics)

    @staticmethod
    def _check_vocabulary(vocabulary, n_classes) -> Optional[tuple]:
        vocabulary = _check_classes(n_classes, vocabulary)
        if vocabulary is not None and "" in vocabulary:
            raise ValueError(f"label_vocabulary has an empty string, the padding of string "
                             f"labels: {list(vocabulary)}")
        return vocabulary

    def _check_classes(self, classes) -> tuple:
        """[(key part, class id)] of `classes_for_class_based_metrics`: ids, or
        words of the label vocabulary."""
        out = []
        for c in classes or ():
            if isinstance(c, str):
                if self._vocabulary is None or c not in self._vocabulary:
                    raise ValueError(f"classes_for_class_based_metrics: {c!r} is not in "
                                     f"label_vocabulary {self._vocabulary}")
                out.append((c, self._vocabulary.index(c)))
            elif isinstance(c, (int, np.integer)) and 0 <= c < self.logits_dimension:
                out.append((f"class{int(c)}", int(c)))
            else:
                raise ValueError(f"classes_for_class_based_metrics must be class ids in "
                                 f"[0, {self.logits_dimension - 1}] or label_vocabulary "
                                 f"words. Given: {c!r}")
        return tuple(out)

    # -- predictions ------------------------------------------------------------
    def _predictions(self, logits):
        return {"logits": logits, "probabilities": torch.sigmoid(logits)}

    def _string_predictions(self, predictions):
        batch = predictions["logits"].shape[0]
        return {"classes": np.tile(self._class_names, (batch, 1))}

    def _export_outputs(self, predictions):
        numeric = {k: v for k, v in predictions.items() if isinstance(v, torch.Tensor)}
        probabilities = numeric["probabilities"]
        ids = torch.arange(self.logits_dimension, dtype=torch.int32,
                           device=probabilities.device).expand(probabilities.shape[0], -1)
        classification = export.ClassificationOutput(
            scores=probabilities, classes=ids,
            class_names=[n.decode() for n in self._class_names])
        return {SERVING_DEFAULT: classification, CLASSIFY: classification,
                PREDICT: export.PredictOutput(numeric, classification.class_names,
                                              {"classes": None})}

    # -- labels and loss -------------------------------------------------------------
    def _labels(self, labels, logits) -> torch.Tensor:
        """Multi-hot float labels [batch, n_classes], checked."""
        if self._vocabulary is not None:
            hot = torch.from_numpy(self._multi_hot(labels)).to(logits.device)
        else:
            hot = self._label_tensor(labels, logits)
            if hot.dtype == torch.bool or not hot.is_floating_point():
                hot = hot.to(torch.int64)
            what = ("Multi-label labels must be multi-hot, each value 0 or 1 (soft labels in "
                    "[0, 1])")
            if hot.device.type != "cpu":   # (a device-side assertion: no sync)
                torch._assert_async(((hot >= 0) & (hot <= 1)).all(), what)
            elif hot.numel():
                low, high = torch.aminmax(hot)
                if low.item() < 0 or high.item() > 1:
                    bad = hot[(hot < 0) | (hot > 1)].reshape(-1)[0].item()
                    raise ValueError(f"{what}; got {bad} (give a [batch, "
                                     f"{self.logits_dimension}] tensor, or words with "
                                     "label_vocabulary)")
        return self._shaped(hot, logits, self.logits_dimension).to(logits.dtype)

    def _multi_hot(self, labels) -> np.ndarray:
        """Each example's label words -> a multi-hot row ("" is padding; an
        example may have none)."""
        if isinstance(labels, np.ndarray) and labels.dtype.kind not in "USO" or not isinstance(
                labels, (np.ndarray, list, tuple)):
            raise ValueError("With label_vocabulary, labels must be strings: a string "
                             "matrix padded with \"\", or a list of lists of str. Instead "
                             f"got {getattr(labels, 'dtype', type(labels).__name__)}")
        rows = labels.tolist() if isinstance(labels, np.ndarray) else labels
        out = np.zeros((len(rows), self.logits_dimension), dtype=np.float32)
        index = {v: i for i, v in enumerate(self._vocabulary)}
        for r, row in enumerate(rows):
            for value in ([row] if isinstance(row, (str, bytes)) else row):
                if not isinstance(value, (str, bytes)):
                    raise ValueError(f"With label_vocabulary, labels must be strings; example "
                                     f"{r} has {value!r} ({type(value).__name__})")
                word = value.decode() if isinstance(value, bytes) else value
                if word == "":
                    continue
                if word not in index:
                    raise ValueError(f"Label {word!r} (example {r}) is not in "
                                     f"label_vocabulary {list(self._vocabulary)}")
                out[r, index[word]] = 1.0
        return out

    def _unreduced_loss(self, labels, logits) -> torch.Tensor:
        per_class = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
        return per_class.mean(-1, keepdim=True)

    # -- metrics ------------------------------------------------------------------
    def _metrics(self, labels, predictions, weights, unreduced) -> dict:
        probabilities = predictions["probabilities"]
        key = self._key
        ops = {key("average_loss"): metrics.mean(unreduced, weights, name=key("average_loss")),
               key("auc"): metrics.auc(labels, probabilities, weights, name=key("auc")),
               key("auc_precision_recall"): metrics.auc(
                   labels, probabilities, weights, curve="PR",
                   summation_method=self._PR_SUMMATION, name=key("auc_precision_recall"))}
        ops.update(_threshold_metrics(key, labels, probabilities, weights, self._thresholds))
        for part, i in self._class_metrics:
            k = key(f"probability_mean/{part}")
            ops[k] = metrics.mean(probabilities[:, i], weights, name=k)
            k = key(f"auc/{part}")
            ops[k] = metrics.auc(labels[:, i], probabilities[:, i], weights, name=k)
            k = key(f"auc_precision_recall/{part}")
            ops[k] = metrics.auc(labels[:, i], probabilities[:, i], weights, curve="PR",
                                 summation_method=self._PR_SUMMATION, name=k)
        return ops
