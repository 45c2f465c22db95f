"""The k-means runs recorded from TF (fixtures/record_tf_kmeans.py) and
replayed by tests/estimator/test_kmeans.py: name -> (KMeans arguments,
batch size, the steps of each train call, the dict keys the points' columns
go under (None: a plain tensor), the feature columns' keys (None: none))."""
CASES = {
    "minibatch": (dict(use_mini_batch=True), 8, [3, 2], None, None),
    "minibatch_iter3": (dict(use_mini_batch=True, mini_batch_steps_per_iteration=3), 8,
                        [4, 3], None, None),
    "fullbatch": (dict(use_mini_batch=False), 40, [1, 2], None, None),
    "cosine_minibatch": (dict(use_mini_batch=True, distance_metric="cosine"), 8, [3, 2],
                         None, None),
    "cosine_iter2": (dict(use_mini_batch=True, distance_metric="cosine",
                          mini_batch_steps_per_iteration=2), 8, [5], None, None),
    "cosine_fullbatch": (dict(use_mini_batch=False, distance_metric="cosine"), 40, [3],
                         None, None),
    "dict_sorted_keys": (dict(use_mini_batch=True), 8, [4], ["b", "c", "a"], None),
    "feature_columns": (dict(use_mini_batch=True), 8, [4], ["b", "c", "a"], ["c", "a"]),
    "tolerance": (dict(use_mini_batch=False, relative_tolerance=1e-3), 40, [20], None, None),
    "empty_cluster": (dict(use_mini_batch=False), 40, [2], None, None),
}
