"""estimator.metrics: streaming tf.compat.v1.metrics equivalents."""
import json
import math
import os

import numpy as np
import pytest
import torch

import distribute

import estimator.metrics as metrics
from hooks import model_scope
from estimator.mode_keys import ModeKeys
from paths import FIXTURES

# -- data -------------------------------------------------------------------------
rng = np.random.default_rng(0)
N, C = 37, 5
SPLITS = [5, 1, 13, 18]                      # uneven batches, sum N
Y = rng.integers(0, C, N)                    # class ids
LOGITS = rng.normal(size=(N, C))
LOGITS[0] = 0.0                              # ties: TF's top_k prefers lower ids
PRED = np.where(rng.random(N) < 0.6, Y, rng.integers(0, C, N))
YM = rng.integers(-1, C + 1, (N, 3))         # label sets: duplicates, out of range
B = rng.integers(0, 2, N).astype(bool)       # binary labels
PB = rng.integers(0, 2, N).astype(bool)      # binary predictions
P = rng.random(N)                            # probabilities, some on thresholds:
P[:6] = [0.0, 1.0, 0.5, 100 / 199, 1 / 199, 198 / 199]
X, T = rng.normal(size=N), rng.normal(size=N)
W = rng.random(N) * 2


def _batches():
    bounds = np.cumsum([0] + SPLITS)
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


# -- numpy references -----------------------------------------------------------------
def _w(w):
    return np.ones(N) if w is None else w


def wmean(v, w):
    return float((v * _w(w)).sum() / _w(w).sum())


def ratio(hit, miss, w):
    tp, other = (hit * _w(w)).sum(), (miss * _w(w)).sum()
    return float(tp / (tp + other)) if tp + other > 0 else 0.0


def tf_auc(labels, preds, w=None, num_thresholds=200, curve="ROC",
           summation_method="trapezoidal"):
    """TF's `metrics.auc`, transcribed: tiled float32 threshold comparisons."""
    n = num_thresholds
    thr = np.array([-1e-7] + [(i + 1) * 1.0 / (n - 1) for i in range(n - 2)] + [1 + 1e-7],
                   dtype=np.float32)
    pos = preds.astype(np.float32)[None, :] > thr[:, None]
    lab, w = labels.astype(bool)[None, :], _w(w)[None, :]
    tp, fp = (pos & lab) @ w.T, (pos & ~lab) @ w.T
    fn, tn = (~pos & lab) @ w.T, (~pos & ~lab) @ w.T
    tp, fp, fn, tn = (a[:, 0] for a in (tp, fp, fn, tn))
    eps = 1e-6
    if curve == "PR" and summation_method == "careful_interpolation":
        dtp, p = tp[:-1] - tp[1:], tp + fp
        dp = np.maximum(p[:-1] - p[1:], 0)
        slope = np.divide(dtp, dp, out=np.zeros_like(dtp), where=dp != 0)
        intercept = tp[1:] - slope * p[1:]
        ok = (p[:-1] > 0) & (p[1:] > 0)
        ratio_ = np.where(ok, p[:-1] / np.where(ok, p[1:], 1), 1.0)
        den = np.maximum(tp[1:] + fn[1:], 0)
        num = slope * (dtp + intercept * np.log(ratio_))
        return float(np.divide(num, den, out=np.zeros_like(num), where=den != 0).sum())
    rec = (tp + eps) / (tp + fn + eps)
    x, y = (fp / (fp + tn + eps), rec) if curve == "ROC" else (rec, (tp + eps) / (tp + fp + eps))
    h = {"minoring": np.minimum(y[:-1], y[1:]), "majoring": np.maximum(y[:-1], y[1:])}.get(
        summation_method, (y[:-1] + y[1:]) / 2)
    return float(((x[:-1] - x[1:]) * h).sum())


def at_k(labels, logits, k, class_id=None, w=None, recall=False):
    """TF's precision/recall_at_k with python sets."""
    labels = labels.reshape(len(labels), -1)
    tp = other = 0.0
    for row, scores, wi in zip(labels, logits, _w(w)):
        top = set(np.argsort(-scores, kind="stable")[:k].tolist())
        lab = set(row.tolist())
        if class_id is not None:
            top, lab = top & {class_id}, lab & {class_id}
        tp += wi * len(top & lab)
        other += wi * len((lab - top) if recall else (top - lab))
    return tp / (tp + other) if tp + other else math.nan


# name -> (function, data arrays, kwargs, reference(weights))
CASES = {
    "mean": (metrics.mean, (X,), {}, lambda w: wmean(X, w)),
    "accuracy": (metrics.accuracy, (Y, PRED), {}, lambda w: wmean(Y == PRED, w)),
    "mse": (metrics.mean_squared_error, (T, X), {}, lambda w: wmean((X - T) ** 2, w)),
    "rmse": (metrics.root_mean_squared_error, (T, X), {},
             lambda w: math.sqrt(wmean((X - T) ** 2, w))),
    "mae": (metrics.mean_absolute_error, (T, X), {}, lambda w: wmean(abs(X - T), w)),
    "precision": (metrics.precision, (B, PB), {}, lambda w: ratio(B & PB, ~B & PB, w)),
    "recall": (metrics.recall, (B, PB), {}, lambda w: ratio(B & PB, B & ~PB, w)),
    "auc": (metrics.auc, (B, P), {}, lambda w: tf_auc(B, P, w)),
    "auc_pr": (metrics.auc, (B, P), {"curve": "PR"}, lambda w: tf_auc(B, P, w, curve="PR")),
    "auc_pr_careful": (metrics.auc, (B, P),
                       {"curve": "PR", "summation_method": "careful_interpolation"},
                       lambda w: tf_auc(B, P, w, curve="PR",
                                        summation_method="careful_interpolation")),
    "auc_minoring_7": (metrics.auc, (B, P), {"num_thresholds": 7, "summation_method": "minoring"},
                       lambda w: tf_auc(B, P, w, 7, summation_method="minoring")),
    "auc_majoring_pr": (metrics.auc, (B, P), {"curve": "PR", "summation_method": "majoring"},
                        lambda w: tf_auc(B, P, w, curve="PR", summation_method="majoring")),
    "precision_at_2": (metrics.precision_at_k, (Y, LOGITS), {"k": 2},
                       lambda w: at_k(Y, LOGITS, 2, w=w)),
    "recall_at_2": (metrics.recall_at_k, (Y, LOGITS), {"k": 2},
                    lambda w: at_k(Y, LOGITS, 2, w=w, recall=True)),
    "precision_at_3_class1": (metrics.precision_at_k, (Y, LOGITS), {"k": 3, "class_id": 1},
                              lambda w: at_k(Y, LOGITS, 3, 1, w)),
    "recall_at_1_class2": (metrics.recall_at_k, (Y, LOGITS), {"k": 1, "class_id": 2},
                           lambda w: at_k(Y, LOGITS, 1, 2, w, recall=True)),
    "precision_at_3_multilabel": (metrics.precision_at_k, (YM, LOGITS), {"k": 3},
                                  lambda w: at_k(YM, LOGITS, 3, w=w)),
    "recall_at_3_multilabel": (metrics.recall_at_k, (YM, LOGITS), {"k": 3},
                               lambda w: at_k(YM, LOGITS, 3, w=w, recall=True)),
}


@pytest.fixture
def registry(monkeypatch):
    """A stand-in model scope: metrics found by name, always updated."""
    found = {}

    def get_metric(name, factory):
        if name not in found:
            found[name] = factory()
        return found[name]

    monkeypatch.setattr(model_scope, "get_metric", get_metric)
    monkeypatch.setattr(model_scope, "updates_metrics", lambda: True)
    return found


def _stream(case, weighted, sl_list=None):
    fn, data, kw, _ = CASES[case]
    metric = None
    for sl in sl_list or _batches():
        weights = torch.as_tensor(W[sl]) if weighted else None
        out = fn(*(torch.as_tensor(a[sl]) for a in data), weights=weights, **kw)
        assert metric is None or out is metric
        metric = out
    return metric


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_streamed_equals_full_data(registry, case, weighted):
    metric = _stream(case, weighted)
    expected = CASES[case][3](W if weighted else None)
    assert isinstance(metric, metrics.Metric)
    assert metric.result().item() == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # a single batch holding everything gives the same
    metric.reset_state()
    assert _stream(case, weighted, [slice(0, N)]).result().item() == pytest.approx(
        expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("case", list(CASES))
def test_buffers_are_sums_so_merging_gives_union(case):
    """What a SUM all-reduce of every buffer relies on."""
    fn, data, kw, ref = CASES[case]
    parts = [slice(0, 11), slice(11, N)]
    replicas = []
    for sl in parts:
        m = fn(*(a[sl] for a in data), weights=W[sl], **kw)   # no scope: fresh metric
        assert all(b.dtype == torch.float64 for b in m.buffers())
        replicas.append(m)
    merged = type(replicas[0])(**replicas[0].config)
    for name, buf in merged.named_buffers():
        buf.copy_(sum(dict(r.named_buffers())[name] for r in replicas))
    assert merged.result().item() == pytest.approx(ref(W), rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("case", ["accuracy", "auc", "recall_at_2", "rmse"])
def test_state_dict_round_trip_and_reset(registry, case):
    metric = _stream(case, weighted=True)
    state = metric.state_dict()
    assert set(state) == {n for n, _ in metric.named_buffers()} and state
    fresh = type(metric)(**metric.config)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.result(), metric.result())
    metric.reset_state()
    assert all((b == 0).all() for b in metric.buffers())
    torch.testing.assert_close(metric.result(), type(metric)(**metric.config).result(),
                               equal_nan=True)


def test_auc_matches_values_from_tf_tests():
    a = lambda *args, **kw: metrics.auc(*args, **kw).result().item()  # noqa: E731
    pred, lab = [1.0, 0.0, 1.0, 0.0], [0, 1, 1, 0]
    assert a(lab, pred) == pytest.approx(0.5, abs=1e-6)
    assert a([lab], [pred], weights=[[1.0, 2.0, 3.0, 4.0]]) == pytest.approx(0.7, abs=1e-6)
    assert a(lab, lab) == pytest.approx(1.0, abs=1e-6)
    assert a([0, 1, 1, 0], [1.0, 0.0, 0.0, 1.0]) == pytest.approx(0.0, abs=1e-6)
    assert a([0, 0, 0], [0.0, 0.0, 0.0]) == pytest.approx(1.0, abs=1e-6)
    assert a([1, 1], [1.0, 1.0], curve="PR") == pytest.approx(1.0, abs=1e-6)
    careful = dict(curve="PR", summation_method="careful_interpolation")
    assert a([[0, 0, 1, 1]], [[0.1, 0.4, 0.35, 0.8]], **careful) == pytest.approx(
        1 - math.log(1.5) / 2, abs=1e-3)
    assert a([0, 0, 1, 0, 1, 0, 1], [0.1, 0.4, 0.35, 0.8, 0.1, 0.135, 0.81],
             **careful) == pytest.approx((2.5 - 2 * math.log(4 / 3) - 0.25 * math.log(7 / 5)) / 3,
                                         abs=1e-3)
    assert a([0, 0, 0, 0, 1, 1, 1], [0.0, 0.1, 0.2, 0.33, 0.3, 0.4, 0.5],
             **careful) == pytest.approx(1 - math.log(4 / 3) / 3, abs=1e-3)


def test_matches_values_computed_with_tensorflow():
    """Expected values: tensorflow-cpu 2.15, tf.compat.v1.metrics, same inputs."""
    lab = [1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1]
    pred = [0.9, 0.1, 0.5, 100 / 199, 0.3, 0.7, 0.2, 0.6, 0.95, 0.05, 0.5, 0.8]
    w = [1, 2, 0.5, 1, 1, 3, 1, 0.2, 1, 1, 2, 1]
    auc = lambda **kw: metrics.auc(lab, pred, **kw).result().item()  # noqa: E731
    assert auc() == pytest.approx(0.7499998807907104, abs=1e-6)
    assert auc(weights=w) == pytest.approx(0.7529643774032593, abs=1e-6)
    assert auc(weights=w, curve="PR") == pytest.approx(0.7556661367416382, abs=1e-6)
    assert auc(weights=w, curve="PR", summation_method="careful_interpolation") == \
        pytest.approx(0.7553970813751221, abs=1e-6)
    assert auc(weights=w, num_thresholds=11) == pytest.approx(0.7747035026550293, abs=1e-6)
    logits = [[0.1, 0.5, 0.2, 0.9, 0.0], [0.3, 0.3, 0.3, 0.1, 0.2],
              [0.9, 0.8, 0.1, 0.2, 0.4], [0.0, 0.1, 0.7, 0.6, 0.5]]
    ids, rw = [[3, 1, -1], [2, 2, 0], [4, 5, 1], [2, 3, 3]], [1.0, 2.0, 0.5, 3.0]
    assert metrics.precision_at_k(ids, logits, 2).result().item() == 0.75
    assert metrics.recall_at_k(ids, logits, 2, weights=rw).result().item() == pytest.approx(
        0.7241379310344828, rel=1e-12)
    assert metrics.precision_at_k(ids, logits, 2, class_id=2).result().item() == 1.0
    assert metrics.recall_at_k(ids, logits, 3, class_id=3, weights=rw).result().item() == 1.0


def test_auc_custom_thresholds_and_bad_arguments():
    custom = metrics.auc(B, P, thresholds=[0.5, 0.25, 0.75]).result().item()
    assert custom == pytest.approx(tf_auc(B, P, num_thresholds=5), abs=1e-12)
    with pytest.raises(ValueError, match="curve"):
        metrics.auc(B, P, curve="XY")
    with pytest.raises(ValueError, match="summation_method"):
        metrics.auc(B, P, summation_method="simpson")


def test_at_k_values_from_tf_tests():
    pred = [[0.1, 0.3, 0.2, 0.4], [0.1, 0.2, 0.3, 0.4]]
    for labels in ([3, 2], [[3], [2]]):
        assert metrics.precision_at_k(labels, pred, k=1, class_id=3).result() == 0.5
        assert metrics.precision_at_k(labels, pred, k=1).result() == 0.5
        assert metrics.recall_at_k(labels, pred, k=1, class_id=3).result() == 1.0
        assert metrics.recall_at_k(labels, pred, k=1).result() == 0.5
        assert metrics.recall_at_k(labels, pred, k=1, class_id=2).result() == 0.0
        for class_id in (-1, 0, 1, 4):        # nothing counts: NaN, as TF
            assert metrics.precision_at_k(labels, pred, 1, class_id).result().isnan()
            assert metrics.recall_at_k(labels, pred, 1, class_id).result().isnan()
    pred = [[0.5, 0.1, 0.6, 0.3, 0.8, 0.0, 0.7, 0.2, 0.4, 0.9],
            [0.3, 0.0, 0.7, 0.2, 0.4, 0.9, 0.5, 0.8, 0.1, 0.6]]
    labels = [[2, 7, -1, 8], [1, 2, 5, 10]]   # out of range: ignored / false negatives
    assert metrics.precision_at_k(labels, pred, k=5).result().item() == pytest.approx(3 / 10)
    assert metrics.recall_at_k(labels, pred, k=5).result().item() == pytest.approx(3 / 8)
    assert metrics.precision_at_k(labels, pred, 5, class_id=2).result() == 1.0
    assert metrics.precision_at_k(labels, pred, 5, class_id=7).result() == 0.0
    top = torch.tensor(pred).argsort(dim=-1, descending=True)[:, :5]
    assert metrics.precision_at_top_k(labels, top).result().item() == pytest.approx(3 / 10)
    assert metrics.recall_at_top_k(labels, top, k=5).result().item() == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="k=11"):
        metrics.precision_at_k(labels, pred, k=11)


def test_precision_recall_without_positives_are_zero():
    assert metrics.precision([1, 1, 0], [0, 0, 0]).result().item() == 0.0
    assert metrics.recall([0, 0, 0], [1, 0, 1]).result().item() == 0.0
    assert metrics.mean([1.0], weights=[0.0]).result().item() == 0.0
    assert metrics.precision([], []).result().item() == 0.0


def test_shapes_weights_and_inputs():
    labels, pred = torch.tensor([1, 2, 3, 4]), torch.tensor([[1], [2], [0], [4]])
    assert metrics.accuracy(labels, pred).result().item() == 0.75          # (N,) vs (N,1)
    assert metrics.accuracy(labels[:, None], pred[:, 0]).result().item() == 0.75
    w = torch.tensor([[1.0], [1.0], [2.0], [0.0]])
    assert metrics.accuracy(labels, pred, weights=w).result().item() == 0.5
    assert metrics.accuracy(labels, pred, weights=3.0).result().item() == 0.75
    # weights of rank one less than the values apply per row, as TF
    v = metrics.mean([[1.0, 3.0], [5.0, 7.0]], weights=[1.0, 0.0]).result().item()
    assert v == 2.0
    # numpy / lists / float predictions; logits requiring grad are not kept
    logits = torch.randn(4, 3, requires_grad=True)
    m = metrics.accuracy(np.array([0, 1, 2, 0]), logits.argmax(-1))
    assert m.result().dtype == torch.float64 and not m.result().requires_grad
    assert not metrics.mean(logits).result().requires_grad
    with pytest.raises(ValueError, match="shape"):
        metrics.accuracy([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="broadcast"):
        metrics.accuracy([1, 2, 3], [1, 2, 3], weights=[1.0, 2.0])


@pytest.mark.parametrize("case", list(CASES))
def test_no_update_mode_does_no_tensor_work(registry, monkeypatch, case):
    fn, data, kw, _ = CASES[case]
    metric = fn(*(torch.as_tensor(a) for a in data), **kw)
    before = {k: v.clone() for k, v in metric.state_dict().items()}
    monkeypatch.setattr(model_scope, "updates_metrics", lambda: False)
    garbage = [object()] * len(data)                 # would fail if touched
    assert fn(*garbage, weights=object(), **kw) is metric
    assert all(torch.equal(before[k], v) for k, v in metric.state_dict().items())


def test_name_reuse_with_other_metric_is_an_error(registry):
    metrics.auc(B, P)
    with pytest.raises(ValueError, match="distinct name"):
        metrics.auc(B, P, curve="PR")
    assert metrics.auc(B, P, curve="PR", name="pr_auc") is registry["pr_auc"]
    with pytest.raises(ValueError, match="distinct name"):
        metrics.mean(X, name="auc")
    assert set(registry) == {"auc", "pr_auc"}
    metrics.precision_at_k(Y, LOGITS, 3, class_id=1)
    metrics.recall_at_k(Y, LOGITS, 3)
    assert {"precision_at_3_class1", "recall_at_3"} <= set(registry)


def _Strategy():
    return distribute.get_strategy()   # the default strategy: one device, no wrapping


def _calls(scope, batches):
    """One model_fn call per batch, as the session makes them."""
    for sl in batches:
        scope.name_uses.clear()
        yield sl


def test_real_model_scope_updates_in_train_and_eval_not_predict():
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
        with model_scope.ModelScope(mode, _Strategy()) as scope:
            for sl in _calls(scope, _batches()):
                m = metrics.accuracy(Y[sl], PRED[sl])
                assert m[1].item() == m[0].item() == m.result().float().item()
                assert m[1].dtype == torch.float32   # (TF's value tensor's; the state float64)
            assert scope.metrics == {"accuracy": m}
        assert m.result().item() == pytest.approx(wmean(Y == PRED, None))
    with model_scope.ModelScope(ModeKeys.PREDICT, _Strategy()) as scope:
        m = metrics.accuracy(None, PRED)   # PREDICT: no labels, no tensor work
        assert scope.metrics == {"accuracy": m}
    assert (m.count == 0).all()


def test_metric_indexes_like_tf_value_update_op_pair():
    m = metrics.accuracy([1, 2, 3, 4], [1, 2, 0, 0])
    value, update_op = m                      # acc, acc_op = tf.metrics.accuracy(...)
    assert value.item() == update_op.item() == m[-1].item() == 0.5
    with pytest.raises(IndexError, match=r"m\[0\] or m\[1\]"):
        m[2]


def test_default_names_are_unique_within_a_call_as_tf():
    with model_scope.ModelScope(ModeKeys.EVAL, _Strategy()) as scope:
        for sl in _calls(scope, _batches()):
            roc = metrics.auc(B[sl], P[sl])
            pr = metrics.auc(B[sl], P[sl], curve="PR")
            m1 = metrics.mean(X[sl])
            m2 = metrics.mean(2 * X[sl])
            named = metrics.mean(X[sl], name="x")
            named_again = metrics.mean(X[sl], name="x")
        assert set(scope.metrics) == {"auc", "auc_1", "mean", "mean_1", "x", "x_1"}
    assert scope.metrics["auc"] is roc and roc.config["curve"] == "ROC"
    assert scope.metrics["auc_1"] is pr and pr.config["curve"] == "PR"
    assert m2.result().item() == pytest.approx(2 * m1.result().item())
    assert named is not named_again and named.count.item() == len(X)


def test_a_name_given_already_is_never_given_again_as_tf():
    """`auc`, `auc`, `auc(name="auc_1")` made the second and third calls one
    metric (both updated, each reporting the mix: 0.7955 where TF has 0.6032
    and 1.0); TF's Graph.unique_name skips names in use (`auc_1_1`) and
    compares them without case. Scopes and values recorded from TF 2.15."""
    with open(os.path.join(FIXTURES, "tf_metric_names.json")) as f:
        tf = json.load(f)
    scores = np.array(tf["scores"], np.float32)
    rows = {"labels": np.array(tf["labels"], np.float32), "scores": scores,
            "squares": scores ** 2, "above": (scores > 0.3).astype(np.float32)}
    with model_scope.ModelScope(ModeKeys.EVAL, _Strategy()) as scope:
        made = [metrics.auc(rows[c["values"]], scores, name=c["name"]) if c["function"] == "auc"
                else metrics.mean(rows[c["values"]], name=c["name"]) for c in tf["calls"]]
    names = {id(m): n for n, m in scope.metrics.items()}
    assert [names[id(m)] for m in made] == [c["scope"] for c in tf["calls"]]
    assert [m.result().item() for m in made] == pytest.approx([c["value"] for c in tf["calls"]],
                                                              rel=1e-5)
