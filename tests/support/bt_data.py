"""The rows of the boosted trees tests, the same as
`tests/support/fixtures/record_tf_boosted_trees.py` gives TensorFlow: two
numeric features (float64, as pandas reads them), a color string (one out
of the vocabulary among them), a 0/1 label, a float target, a word label
and a float64 weight."""
import numpy as np

COLORS = ["red", "green", "blue"]
KINDS = ["low", "mid", "high"]
X1_BOUNDARIES = [-1.0, 0.0, 1.0]
X2_BOUNDARIES = [0.5, 1.5, 2.5, 3.5]

# The recorded cases, name: (estimator, arguments,
#     labels ("binary" | "binary_words" | "target" | "kind"), batch size)
CASES = {
    "binary": ("BoostedTreesClassifier",
               dict(n_trees=3, max_depth=2, learning_rate=0.3, n_batches_per_layer=1),
               "binary", 20),
    "binary_pre_pruning": ("BoostedTreesClassifier",
                           dict(n_trees=3, max_depth=3, learning_rate=0.5, n_batches_per_layer=1,
                                l1_regularization=0.01, l2_regularization=0.1,
                                tree_complexity=0.004, min_node_weight=0.02,
                                pruning_mode="pre"), "binary", 20),
    "binary_post_pruning": ("BoostedTreesClassifier",
                            dict(n_trees=3, max_depth=3, learning_rate=0.5,
                                 n_batches_per_layer=1, l1_regularization=0.01,
                                 l2_regularization=0.1, tree_complexity=0.004,
                                 min_node_weight=0.02, pruning_mode="post"), "binary", 20),
    "binary_two_batches_a_layer": ("BoostedTreesClassifier",
                                   dict(n_trees=2, max_depth=2, learning_rate=0.3,
                                        n_batches_per_layer=2), "binary", 25),
    "binary_weighted_vocabulary_center_bias": (
        "BoostedTreesClassifier",
        dict(n_trees=2, max_depth=2, learning_rate=0.3, n_batches_per_layer=1,
             weight_column="w", label_vocabulary=["no", "yes"], center_bias=True),
        "binary_words", 60),
    "regressor_weighted_center_bias": (
        "BoostedTreesRegressor",
        dict(n_trees=3, max_depth=2, learning_rate=0.2, n_batches_per_layer=1,
             weight_column="w", center_bias=True, l2_regularization=0.5), "target", 60),
    "regressor_center_bias_batches_vary": (   # (the batches' means differ: it never ends)
        "BoostedTreesRegressor",
        dict(n_trees=1, max_depth=1, learning_rate=0.2, n_batches_per_layer=1,
             center_bias=True), "target", 16),
    "regressor": ("BoostedTreesRegressor",
                  dict(n_trees=2, max_depth=3, learning_rate=0.5, n_batches_per_layer=1),
                  "target", 60),
    # numeric_*: x1 and x2 as numeric columns, bucketed by TF's quantile sketch
    "numeric_binary": ("BoostedTreesClassifier",
                       dict(n_trees=2, max_depth=2, learning_rate=0.3, n_batches_per_layer=1),
                       "binary", 20),
    "numeric_regressor_weighted_two_batches": (   # (each batch's summary compressed)
        "BoostedTreesRegressor",
        dict(n_trees=2, max_depth=3, learning_rate=0.3, n_batches_per_layer=2,
             weight_column="w", quantile_sketch_epsilon=0.1), "target", 60),
    "numeric_center_bias": (
        "BoostedTreesClassifier",
        dict(n_trees=2, max_depth=2, learning_rate=0.3, n_batches_per_layer=1,
             center_bias=True, quantile_sketch_epsilon=0.05),
        "binary", 60),
    "multiclass": ("BoostedTreesClassifier",
                   dict(n_trees=2, max_depth=2, learning_rate=0.3, n_batches_per_layer=1,
                        n_classes=3, label_vocabulary=KINDS, l2_regularization=1.0),
                   "kind", 20),
    "multiclass_no_l2": ("BoostedTreesClassifier",   # (TF's default: a singular hessian)
                         dict(n_trees=2, max_depth=2, learning_rate=0.3, n_batches_per_layer=1,
                              n_classes=3, label_vocabulary=KINDS), "kind", 20),
}


def rows(n, seed):
    """(features, binary labels, float targets, word labels)."""
    rng = np.random.default_rng(seed)
    x1 = np.round(rng.normal(0.0, 1.2, (n, 1)), 3)
    x2 = np.round(rng.uniform(0.0, 4.0, (n, 1)), 3)
    color = rng.choice(COLORS + ["pink"], (n, 1), p=[0.3, 0.3, 0.3, 0.1])
    w = np.round(rng.uniform(0.5, 2.0, (n, 1)), 3)
    score = x1[:, 0] + 0.6 * x2[:, 0] + (color[:, 0] == "red") - 1.0
    noise = rng.normal(0.0, 0.5, n)
    binary = (score + noise > 0).astype(np.int64)
    target = np.round(score + noise, 3).astype(np.float32)
    kind = np.array(KINDS)[np.digitize(score + noise, [-0.5, 0.8])]
    return {"x1": x1, "x2": x2, "color": color, "w": w}, binary, target, kind


def batches(data, size):
    """(features, labels) batches of `size` rows (the last holds the rest)."""
    features, labels = data
    n = len(labels)
    return [({k: v[i:i + size] for k, v in features.items()}, labels[i:i + size])
            for i in range(0, n, size)]


SHADES = ["dark", "light", "pale"]


def categorical_rows(n, seed):
    """`rows(n, seed)` with two more categorical features and labels that
    depend on them: `code`, an int64 id in [0, 5) (-1, TF's ignored integer,
    for some: absent), and `shade`, a string of SHADES ('' for some: absent;
    'grey', out of the vocabulary, for others); `flag`, 1 where x1 > 0."""
    features, _, _, _ = rows(n, seed)
    rng = np.random.default_rng(seed + 100)
    code = rng.choice([-1, 0, 1, 2, 3, 4], (n, 1), p=[0.06, 0.2, 0.2, 0.2, 0.2, 0.14])
    shade = rng.choice(SHADES + ["", "grey"], (n, 1), p=[0.3, 0.25, 0.25, 0.1, 0.1])
    flag = (features["x1"] > 0).astype(np.int64)
    score = (features["x1"][:, 0] + 0.4 * features["x2"][:, 0] + 1.5 * (code[:, 0] == 3)
             - 1.2 * (shade[:, 0] == "pale") + 0.8 * (features["color"][:, 0] == "red") - 1.3)
    noise = rng.normal(0.0, 0.4, n)
    binary = (score + noise > 0).astype(np.int64)
    target = np.round(score + noise, 3).astype(np.float32)
    kind = np.array(KINDS)[np.digitize(score + noise, [-0.5, 0.8])]
    return dict(features, code=code.astype(np.int64), shade=shade, flag=flag), binary, target, kind
