"""The boosted trees' ensembles compared node by node: ours (the buffers
`boosted_trees/...`) and TF's (its TreeEnsemble proto as JSON, recorded by
tests/support/fixtures/record_tf_boosted_trees*.py)."""
import numpy as np


def trees_of(estimator) -> list:
    """The ensemble as TF's proto lists it: per tree its nodes, a split
    (feature, threshold, left, right, gain) or a leaf value."""
    names = ("feature", "threshold", "left", "right", "value", "gain", "node_count")
    e = {n: estimator.get_variable_value(f"boosted_trees/{n}") for n in names}
    trees = int((e["node_count"] > 1).sum()) + 1
    return [[("split", int(e["feature"][t, i]), int(e["threshold"][t, i]), int(e["left"][t, i]),
              int(e["right"][t, i]), float(e["gain"][t, i])) if e["feature"][t, i] >= 0
             else ("leaf", tuple(e["value"][t, i].tolist()))
             for i in range(int(e["node_count"][t]))]
            for t in range(min(trees, e["feature"].shape[0]))]


def tf_trees(ensemble) -> list:
    """TF's ensemble (its proto as JSON) as `trees_of` lists ours."""
    out = []
    for tree in ensemble["trees"]:
        nodes = []
        for node in tree.get("nodes", [{"leaf": {}}]):
            split = node.get("bucketized_split") or node.get("categorical_split")
            if split is None:
                leaf = node["leaf"]
                nodes.append(("leaf", tuple(leaf["vector"]["value"]) if "vector" in leaf
                              else (leaf.get("scalar", 0.0),)))
            else:
                gain = node["metadata"].get("gain", 0.0)
                nodes.append(("split", split.get("feature_id", 0),   # (an equality's: value)
                              split.get("threshold", split.get("value", 0)),
                              split["left_id"], split["right_id"], gain))
        out.append(nodes)
    return out


def _centered(nodes):
    """A leaf's values less their mean (K logits of a singular hessian: TF's
    QR solve and the least-norm one differ by a constant over the classes)."""
    return [("leaf", tuple(np.asarray(n[1]) - np.mean(n[1]))) if n[0] == "leaf" else n
            for n in nodes]


def assert_trees_are(got, expected, ties=False, singular=False, negligible=0.0):
    """The same trees; `ties`: a split TF made with gain 0 (no candidate better
    than none, K logits solved with another float32 rounding than TF's QR)
    may be another feature's split of nothing (all examples on one side);
    `singular`: leaf values compared less their mean; `negligible`: a split
    TF made with a gain below it (a split of nothing, its gain float32
    rounding) may be another, and its children's values are left out (the
    empty side's is TF's rounding divided by rounding)."""
    if singular:
        got, expected = [_centered(t) for t in got], [_centered(t) for t in expected]
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected):
        if ties:
            ours = [n[:1] + n[2:] if n[0] == "split" and t[-1] == 0.0 else n
                    for n, t in zip(ours, theirs)]
            theirs = [t[:1] + t[2:] if t[0] == "split" and t[-1] == 0.0 else t for t in theirs]
        noise = [i for i, t in enumerate(theirs) if t[0] == "split" and abs(t[-1]) < negligible]
        if noise:
            left_out = set(noise) | {c for i in noise for c in theirs[i][3:5]}
            ours = [n for i, n in enumerate(ours) if i not in left_out]
            theirs = [t for i, t in enumerate(theirs) if i not in left_out]
        assert [n[:-1] for n in ours] == [n[:-1] for n in theirs]   # (the structure)
        np.testing.assert_allclose(np.hstack([n[-1] for n in ours]),
                                   np.hstack([n[-1] for n in theirs]), rtol=1e-5, atol=1e-6)
