"""The rows of the canned-head tests, the same as
`tests/support/fixtures/record_tf_heads.py` gives TensorFlow, and a model_fn
handing a linear layer's logits to a head."""
import numpy as np
import torch

import estimator as est

LABELS = ["low", "mid", "high"]


def rows(n, seed):
    """Features (x: 3 floats, w: a float64 weight), a 2-d regression target,
    a 1-d one, a word label and a 0/1 label."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    w = np.linspace(0.5, 2.0, n)
    y2 = np.stack([x @ [1.0, -2.0, 0.5], x[:, 0] * x[:, 1]], 1).astype(np.float32)
    y1 = (x @ [0.5, 1.0, -1.0]).astype(np.float32)[:, None]
    words = np.array(LABELS)[np.digitize(x[:, 0], [-0.5, 0.5])]
    return {"x": x, "w": w}, y2, y1, words, (y1[:, 0] > 0).astype(np.int64)


TAGS = ["red", "green", "blue", "grey"]


def tag_rows(n, seed):
    """Multi-valued rows: `tags` 0 to 3 strings a row (a string matrix padded
    with "", repeats included), `ids` and `scores` (two weighted ids a row),
    `flag` one string; and 0/1 labels."""
    rng = np.random.default_rng(seed)
    words = np.array(TAGS + ["pink"])
    count = rng.integers(0, 4, n)
    tags = np.where(np.arange(3) < count[:, None], rng.choice(words, (n, 3)), "")
    ids = rng.integers(0, 5, (n, 2))
    scores = rng.uniform(0.5, 2.0, (n, 2)).astype(np.float32)
    flag = rng.choice(["y", "n"], (n, 1))
    labels = ((tags == "red").sum(1) + (ids == 2).sum(1) > 0).astype(np.int64)
    return {"tags": tags, "ids": ids.astype(np.int64), "scores": scores, "flag": flag}, labels


def multi_label_rows(n, seed):
    """Features (x: 3 floats, w: a float64 weight) and each row's labels of
    three classes: multi-hot ids [n, 3] (rows with none and with all three)
    and the same as words (`LABELS`), a string matrix padded with ""."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    w = np.linspace(0.5, 2.0, n)
    hot = np.stack([x[:, 0] > 0, x[:, 1] + x[:, 2] > 0.3, x[:, 0] * x[:, 2] > 0.2], 1)
    words = np.where(hot, np.array(LABELS), "")
    words = np.array([sorted(r, key=lambda v: v == "") for r in words.tolist()])
    return {"x": x, "w": w}, hot.astype(np.int64), words


def v2_labels(data, target):
    """`rows(...)`'s labels of the TF2-head tests: an index into the rows, or
    "yes_no" (words), "positive" (0 or 2), "counts" (0 to 4), "fraction" (in
    [0, 1]), "multi" (a dict: "kind", the words, and "score", the 1-d target),
    "multi_hot" (three 0/1 labels a row: which features are positive)."""
    if target == "multi":
        return {"kind": data[3], "score": data[2]}
    if target == "multi_hot":
        return (data[0]["x"] > 0).astype(np.int64)
    if target == "yes_no":
        return np.where(data[4] == 1, "yes", "no")
    y = data[2][:, 0]
    if target == "positive":
        return ((y > 0) * 2.0).astype(np.float32)
    if target == "counts":
        return np.clip(np.round(y + 2), 0, 4).astype(np.float32)
    if target == "fraction":
        return (1 / (1 + np.exp(-y))).astype(np.float32)
    return data[target]


def fixed_layer(dim):
    """A first kernel [3, dim] (TF's layout) and bias [dim] for a layer on
    ``features["x"]``, made the same here and in TF."""
    return (np.linspace(-0.5, 0.5, 3 * dim).reshape(3, dim).astype(np.float32),
            np.full(dim, 0.1, np.float32))


def head_model_fn(head, lr=0.1):
    """A model_fn of one linear layer on ``features["x"]`` (3 values) whose
    logits go to ``head.create_estimator_spec`` (TF's custom-model_fn use of a
    head), trained by SGD at `lr`."""
    def model_fn(features, labels, mode):
        net = est.get_module("logits", lambda: torch.nn.Linear(3, head.logits_dimension))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=lr))
        return head.create_estimator_spec(features, mode, net(features["x"]), labels,
                                          train_op_fn=lambda loss: opt)
    return model_fn
