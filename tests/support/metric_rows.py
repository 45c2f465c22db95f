"""Rows for tests/estimator/test_more_metrics.py, the same as
tests/support/fixtures/record_tf_more_metrics.py streams through TF: 23 rows
in batches of 10, 8 and 5, weights with zeros; each case is (tf.compat.v1.metrics
function, its tensor arguments, its other arguments)."""
import numpy as np

BATCHES = (10, 8, 5)
_rng = np.random.default_rng(7)
_N = sum(BATCHES)
WEIGHTS = np.round(_rng.uniform(0.0, 2.0, _N), 2).astype(np.float32)
WEIGHTS[[3, 11]] = 0.0
CLASS_LABELS = _rng.integers(0, 3, _N).astype(np.int64)            # class 3 never a label
CLASS_PREDICTIONS = np.where(_rng.random(_N) < 0.6, CLASS_LABELS,
                             _rng.integers(0, 4, _N)).astype(np.int64)
BINARY = (_rng.random(_N) < 0.45).astype(np.int64)
SCORES = np.clip(0.35 * BINARY + _rng.uniform(0.0, 0.65, _N), 0.0, 1.0).astype(np.float32)
SCORES[[0, 1]] = [0.5, 0.25]                                        # on thresholds
DECISIONS = SCORES > 0.5
TARGETS = _rng.normal(size=_N).astype(np.float32)
ESTIMATES = (TARGETS + 0.3 * _rng.normal(size=_N)).astype(np.float32)
NORMALIZER = np.abs(_rng.normal(size=_N)).astype(np.float32)
NORMALIZER[[2, 9]] = 0.0
_u = _rng.normal(size=(_N, 3))
_v = _u + 0.5 * _rng.normal(size=(_N, 3))
UNIT_LABELS = (_u / np.linalg.norm(_u, axis=1, keepdims=True)).astype(np.float32)
UNIT_PREDICTIONS = (_v / np.linalg.norm(_v, axis=1, keepdims=True)).astype(np.float32)
THRESHOLDS = [0.0, 0.25, 0.5, 0.9]
CLASS_SCORES = _rng.normal(size=(_N, 5)).astype(np.float32)
CLASS_SCORES[4] = 0.0                                              # ties: lower ids first
LABEL_SETS = _rng.integers(-1, 6, (_N, 3)).astype(np.int64)       # -1, 5: out of range
LABEL_SETS[:, 0] = _rng.integers(0, 5, _N)                        # each row has a label
LABEL_SETS[6] = [2, 2, 2]                                          # duplicates
SOME_WITHOUT = LABEL_SETS.copy()
SOME_WITHOUT[7] = [-1, 5, -1]                                      # no label in range

# Ties: 4 negatives scored .9, .6, .6, .1 (specificities 0, .25, .75, 1: a
# target of .5 is .25 from two), then 4 positives scored .95, .55, .55, .15
# (sensitivities 1, .75, .25, 0), among others of the other class
TIE_LABELS = np.array([0, 0, 0, 0] + [1] * 19, np.int64)
TIE_SCORES = np.concatenate([[0.9, 0.6, 0.6, 0.1], _rng.uniform(0.0, 1.0, 19)]).astype(np.float32)
TIE_LABELS_2 = 1 - TIE_LABELS
TIE_SCORES_2 = np.concatenate([[0.95, 0.55, 0.55, 0.15], _rng.uniform(0, 1, 19)]).astype(np.float32)

_classes = dict(labels=CLASS_LABELS, predictions=CLASS_PREDICTIONS)
_decisions = dict(labels=BINARY, predictions=DECISIONS)
_scores = dict(labels=BINARY, predictions=SCORES)
_w = dict(weights=WEIGHTS)
CASES = {
    "mean_per_class_accuracy": ("mean_per_class_accuracy", _classes, dict(num_classes=4)),
    "mean_per_class_accuracy_weighted": ("mean_per_class_accuracy", {**_classes, **_w},
                                         dict(num_classes=4)),
    "mean_iou": ("mean_iou", _classes, dict(num_classes=4)),
    "mean_iou_weighted": ("mean_iou", {**_classes, **_w}, dict(num_classes=4)),
    "mean_iou_two_classes": ("mean_iou", dict(labels=BINARY, predictions=DECISIONS.astype(
        np.int64)), dict(num_classes=2)),
    "true_positives": ("true_positives", {**_decisions, **_w}, {}),
    "false_positives": ("false_positives", {**_decisions, **_w}, {}),
    "true_negatives": ("true_negatives", {**_decisions, **_w}, {}),
    "false_negatives": ("false_negatives", _decisions, {}),
    "true_positives_at_thresholds": ("true_positives_at_thresholds", {**_scores, **_w},
                                     dict(thresholds=THRESHOLDS)),
    "false_positives_at_thresholds": ("false_positives_at_thresholds", _scores,
                                      dict(thresholds=THRESHOLDS)),
    "true_negatives_at_thresholds": ("true_negatives_at_thresholds", {**_scores, **_w},
                                     dict(thresholds=THRESHOLDS)),
    "false_negatives_at_thresholds": ("false_negatives_at_thresholds", {**_scores, **_w},
                                      dict(thresholds=THRESHOLDS)),
    "precision_at_thresholds": ("precision_at_thresholds", {**_scores, **_w},
                                dict(thresholds=THRESHOLDS)),
    "recall_at_thresholds": ("recall_at_thresholds", {**_scores, **_w},
                             dict(thresholds=THRESHOLDS)),
    "sensitivity_at_specificity": ("sensitivity_at_specificity", {**_scores, **_w},
                                   dict(specificity=0.95)),
    "sensitivity_at_specificity_11": ("sensitivity_at_specificity", _scores,
                                      dict(specificity=0.9, num_thresholds=11)),
    "specificity_at_sensitivity": ("specificity_at_sensitivity", {**_scores, **_w},
                                   dict(sensitivity=0.8)),
    "specificity_at_sensitivity_11": ("specificity_at_sensitivity", _scores,
                                      dict(sensitivity=0.95, num_thresholds=11)),
    "mean_relative_error": ("mean_relative_error", dict(labels=TARGETS, predictions=ESTIMATES,
                                                        normalizer=NORMALIZER, **_w), {}),
    "mean_cosine_distance": ("mean_cosine_distance", dict(
        labels=UNIT_LABELS, predictions=UNIT_PREDICTIONS), dict(dim=1)),
    "mean_cosine_distance_weighted": ("mean_cosine_distance", dict(
        labels=UNIT_LABELS, predictions=UNIT_PREDICTIONS, weights=WEIGHTS[:, None]),
        dict(dim=1)),
    "percentage_below": ("percentage_below", dict(values=TARGETS, **_w), dict(threshold=0.2)),
    "average_precision_at_3": ("average_precision_at_k", dict(
        labels=LABEL_SETS, predictions=CLASS_SCORES, **_w), dict(k=3)),
    "average_precision_at_1_single_label": ("average_precision_at_k", dict(
        labels=CLASS_LABELS, predictions=CLASS_SCORES), dict(k=1)),
    "average_precision_at_5": ("average_precision_at_k", dict(
        labels=LABEL_SETS, predictions=CLASS_SCORES), dict(k=5)),
    "average_precision_at_2_a_row_without_labels": ("average_precision_at_k", dict(
        labels=SOME_WITHOUT, predictions=CLASS_SCORES), dict(k=2)),
    "sensitivity_at_specificity_tie": ("sensitivity_at_specificity", dict(
        labels=TIE_LABELS, predictions=TIE_SCORES), dict(specificity=0.5)),
    "specificity_at_sensitivity_tie": ("specificity_at_sensitivity", dict(
        labels=TIE_LABELS_2, predictions=TIE_SCORES_2), dict(sensitivity=0.5)),
}
