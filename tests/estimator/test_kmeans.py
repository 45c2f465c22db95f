"""est.KMeansClustering against TF 2.15's tf.compat.v1.estimator.experimental.KMeans
(tests/support/fixtures/record_tf_kmeans.py): the centers after each train
call, each step's loss, the evaluation's score, predictions and transform,
from given initial centers, in mini-batch (one and several steps an
iteration), full-batch, cosine, dict and feature-column runs; the random
and k-means++ initializations, export and serving, replicas, errors."""
import itertools
import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import estimator as est
from kmeans_cases import CASES
from paths import FIXTURES

TF = json.load(open(os.path.join(FIXTURES, "tf_kmeans.json")))
POINTS = np.array(TF["points"], np.float32)


def _features(x, keys):
    return torch.from_numpy(x) if keys is None else {
        k: torch.from_numpy(x[:, i:i + 1]) for i, k in enumerate(keys)}


def _input_fn(x, batch, keys=None, epochs=1):
    """The points in batches, as TF's dataset.repeat(epochs).batch(batch) (no labels)."""
    def input_fn():
        for _ in range(epochs):
            for i in range(0, len(x), batch):
                yield _features(x[i:i + batch], keys)
    return input_fn


class _Losses(est.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return est.SessionRunArgs("loss")

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def _kmeans(name, model_dir, **more):
    kwargs, _, _, _, columns = CASES[name]
    initial = np.array(TF["far" if name == "empty_cluster" else "initial"], np.float32)
    if columns is not None:
        initial = initial[:, :len(columns)]
        kwargs = dict(kwargs, feature_columns=[est.feature_column.numeric_column(c)
                                               for c in columns])
    return est.KMeansClustering(3, initial_clusters=initial, model_dir=model_dir,
                                **dict(kwargs, **more))


def _sync_steps(name, count):
    """The steps that copy the updated centers back (several steps an
    iteration): TF's loss there differs from run to run (the recorder's
    docstring), so it is not compared."""
    steps = CASES[name][0].get("mini_batch_steps_per_iteration", 1)
    return set(range(steps, count, steps)) if steps > 1 else set()


@pytest.mark.parametrize("name", sorted(CASES))
def test_kmeans_is_tfs(name, tmp_path):
    _, batch, calls, keys, _ = CASES[name]
    recorded = TF["cases"][name]
    kmeans = _kmeans(name, str(tmp_path))
    hook, centers = _Losses(), []
    for steps in calls:
        kmeans.train(_input_fn(POINTS, batch, keys, epochs=100), steps=steps, hooks=[hook])
        centers.append(kmeans.cluster_centers())
    np.testing.assert_allclose(np.array(centers), recorded["centers"], atol=2e-6)
    assert len(hook.losses) == len(recorded["losses"])   # (the tolerance stops 20 steps at 3)
    assert kmeans.get_variable_value("global_step") == recorded["global_step"]
    compared = [i for i in range(len(hook.losses))
                if i not in _sync_steps(name, len(hook.losses))]
    np.testing.assert_allclose(np.array(hook.losses)[compared],
                               np.array(recorded["losses"])[compared], rtol=2e-6, atol=2e-5)
    evaluated = kmeans.evaluate(_input_fn(POINTS, 16, keys))
    assert sorted(evaluated) == sorted(recorded["evaluate"])
    for key, value in recorded["evaluate"].items():
        assert evaluated[key] == pytest.approx(value, rel=2e-6, abs=2e-5), key
    assert kmeans.score(_input_fn(POINTS, 16, keys)) == pytest.approx(
        recorded["score"], rel=2e-6, abs=2e-5)
    predictions = list(kmeans.predict(_input_fn(POINTS[:10], 4, keys)))
    assert [int(p["cluster_index"]) for p in predictions] == recorded["cluster_index"]
    np.testing.assert_allclose([p["all_distances"] for p in predictions],
                               recorded["all_distances"], rtol=2e-6, atol=2e-5)
    np.testing.assert_allclose(list(kmeans.transform(_input_fn(POINTS[:10], 4, keys))),
                               recorded["transform"], rtol=2e-6, atol=2e-5)
    assert list(kmeans.predict_cluster_index(_input_fn(POINTS[:10], 4, keys))) == \
        recorded["cluster_index"]
    # TF's variables, under the module `kmeans` (TF's counts are `Variable`)
    ours = {n.replace("kmeans/", "").replace("counts", "Variable")
            for n in kmeans.get_variable_names()} - {"chosen"}
    assert ours == set(recorded["variables"])


def test_random_initialization_takes_whole_batches_smaller_than_the_clusters(tmp_path):
    """Batches of 3 for 6 clusters: TF's initialization takes the first two
    batches whole (no draw) and trains from the third; those batches are not
    steps: the global step counts the two training steps only, and hooks,
    logs and summaries see those two alone, as TF's."""
    kmeans = est.KMeansClustering(6, model_dir=str(tmp_path),
                                  config=est.RunConfig(save_summary_steps=1))
    hook = _Losses()
    kmeans.train(_input_fn(POINTS, 3, epochs=10), steps=2, hooks=[hook])
    recorded = TF["init_over_batches"]
    np.testing.assert_allclose(kmeans.cluster_centers(), recorded["centers"], atol=2e-6)
    np.testing.assert_allclose(hook.losses, recorded["losses"], rtol=2e-6)
    assert kmeans.get_variable_value("global_step") == recorded["global_step"] == 2
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    np.testing.assert_allclose([e.value for e in events.Scalars("loss/raw")],
                               recorded["losses"], rtol=2e-6)


def test_random_initialization_draws_rows_of_the_first_batch_by_its_seed(tmp_path):
    centers = []
    for run in range(2):
        kmeans = est.KMeansClustering(3, model_dir=str(tmp_path / str(run)), seed=7,
                                      use_mini_batch=False)
        kmeans.train(_input_fn(POINTS, 40, epochs=2), steps=1)
        first = kmeans.get_variable_value("kmeans/clusters")   # (after one Lloyd step)
        centers.append(first)
    np.testing.assert_array_equal(centers[0], centers[1])
    assert kmeans.get_variable_value("global_step") == 1


def test_kmeans_plus_plus_puts_one_center_in_each_separated_blob(tmp_path):
    rng = np.random.RandomState(1)
    blobs = np.array([[0, 0], [100, 0], [0, 100], [100, 100]], np.float32)
    x = (blobs[rng.randint(0, 4, 64)] + rng.normal(0, 1, (64, 2))).astype(np.float32)
    kmeans = est.KMeansClustering(4, initial_clusters=est.KMeansClustering.KMEANS_PLUS_PLUS_INIT,
                                  model_dir=str(tmp_path), seed=3, use_mini_batch=False)
    kmeans.train(_input_fn(x, 64, epochs=3), steps=2)
    nearest_blob = np.abs(kmeans.cluster_centers()[:, None, :] - blobs[None]).sum(-1).argmin(1)
    assert sorted(nearest_blob.tolist()) == [0, 1, 2, 3]
    few = est.KMeansClustering(4, initial_clusters="kmeans_plus_plus",
                               model_dir=str(tmp_path / "few"))
    with pytest.raises(ValueError, match="chooses all 4 centers from one batch, which "
                                         "holds 3 points"):
        few.train(_input_fn(x[:3], 3), steps=1)


def test_the_tolerance_stops_training_after_random_centers_too(tmp_path):
    """The hooks come from the first step's spec, there one choosing the
    centers: the tolerance still stops full-batch steps once they settle."""
    kmeans = est.KMeansClustering(3, model_dir=str(tmp_path), use_mini_batch=False,
                                  relative_tolerance=1e-3, seed=1)
    kmeans.train(_input_fn(POINTS, 40, epochs=50), steps=20)
    assert kmeans.get_variable_value("global_step") < 20


def test_a_callable_chooses_centers_from_the_input_shards(tmp_path):
    """TF's `initial_clusters(inputs, k)`: the list of input shards and the
    number of centers still to choose, called batch after batch."""
    asked = []

    def first_rows(inputs, k):
        asked.append(k)
        return inputs[0][:min(2, k)]
    kmeans = est.KMeansClustering(3, initial_clusters=first_rows, model_dir=str(tmp_path))
    kmeans.train(_input_fn(POINTS, 8, epochs=3), steps=1)
    assert asked == [3, 1]
    assert kmeans.get_variable_value("global_step") == 1
    with pytest.raises(ValueError, match=r"must give at most 3 centers of 3 dimensions, got "
                                         r"shape \[4, 3\]"):
        many = est.KMeansClustering(3, initial_clusters=lambda inputs, k: inputs[0][:4],
                                    model_dir=str(tmp_path / "many"))
        many.train(_input_fn(POINTS, 8), steps=1)


def test_a_callable_gets_the_points_as_they_come_under_cosine(tmp_path):
    """TF hands `initial_clusters(inputs, k)` the input itself (only
    k-means++ takes normalized points) and normalizes what it returns."""
    given = []

    def first_rows(inputs, k):
        given.append(inputs[0].clone())
        return inputs[0][:k]
    kmeans = est.KMeansClustering(3, initial_clusters=first_rows, distance_metric="cosine",
                                  model_dir=str(tmp_path))
    kmeans.train(_input_fn(POINTS, 8, epochs=2), steps=1)
    np.testing.assert_array_equal(given[0].numpy(), POINTS[:8])


def test_a_restart_continues_the_counts_and_centers(tmp_path):
    """A new estimator on the model_dir (a new process's) restores the
    mini-batch counts: 3 + 2 steps there equal TF's one object's."""
    name = "minibatch_iter3"
    _, batch, _, _, _ = CASES[name]
    first = _kmeans(name, str(tmp_path))
    first.train(_input_fn(POINTS, batch, epochs=100), steps=4)
    second = _kmeans(name, str(tmp_path))
    second.train(_input_fn(POINTS, batch, epochs=100), steps=3)
    np.testing.assert_allclose(second.cluster_centers(), TF["cases"][name]["centers"][-1],
                               atol=2e-6)


def test_pandas_float64_columns_cluster_as_float32(tmp_path):
    frame = pd.DataFrame(POINTS.astype(np.float64), columns=["b", "c", "a"])
    kmeans = _kmeans("dict_sorted_keys", str(tmp_path))
    kmeans.train(lambda: itertools.islice(itertools.cycle(
        [{k: frame[k].values[i:i + 8] for k in frame} for i in range(0, 40, 8)]), 100), steps=4)
    np.testing.assert_allclose(kmeans.cluster_centers(),
                               TF["cases"]["dict_sorted_keys"]["centers"][-1], atol=2e-6)


def test_the_loss_summary_is_tfs_tag(tmp_path):
    kmeans = _kmeans("minibatch", str(tmp_path),
                     config=est.RunConfig(save_summary_steps=1))
    kmeans.train(_input_fn(POINTS, 8, epochs=10), steps=3)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [round(e.value, 3) for e in events.Scalars("loss/raw")] == [
        round(v, 3) for v in TF["cases"]["minibatch"]["losses"][:3]]


def test_the_export_serves_cluster_indices_and_distances(tmp_path):
    from estimator import serving
    kmeans = _kmeans("fullbatch", str(tmp_path / "model"))
    kmeans.train(_input_fn(POINTS, 40, epochs=3), steps=3)
    path = kmeans.export_saved_model(str(tmp_path / "export"),
                                     est.export.build_raw_serving_input_receiver_fn(
                                         torch.from_numpy(POINTS[:2])))
    model = serving.Model(path)
    instances = POINTS[:10].tolist()
    served = model.predict({"instances": instances})["predictions"]
    assert served == TF["cases"]["fullbatch"]["cluster_index"]
    distances = model.predict({"signature_name": "all_distances",
                               "instances": instances})["predictions"]
    np.testing.assert_allclose(distances, TF["cases"]["fullbatch"]["all_distances"],
                               rtol=2e-6, atol=2e-5)


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="Unsupported initialization algorithm 'kmc2'"):
        est.KMeansClustering(3, initial_clusters="kmc2")
    with pytest.raises(ValueError, match="Unsupported distance metric 'manhattan'"):
        est.KMeansClustering(3, distance_metric="manhattan")
    with pytest.raises(ValueError, match="num_clusters must be a positive int, got 0"):
        est.KMeansClustering(0)
    with pytest.raises(ValueError, match="mini_batch_steps_per_iteration must be a positive"):
        est.KMeansClustering(3, mini_batch_steps_per_iteration=0)
    with pytest.raises(ValueError, match=r"initial_clusters must be .* got shape \[3\]"):
        est.KMeansClustering(3, initial_clusters=np.zeros(3))
    with pytest.raises(ValueError, match="initial_clusters are centers of 2 dimensions, the "
                                         "input points have 3"):
        est.KMeansClustering(3, initial_clusters=np.zeros((3, 2)),
                             model_dir=str(tmp_path / "narrow")).train(_input_fn(POINTS, 8),
                                                                       steps=1)
    kmeans = _kmeans("minibatch", str(tmp_path))
    kmeans.train(_input_fn(POINTS, 8), steps=1)
    with pytest.raises(ValueError, match=r"kmeans/clusters is \[3, 3\] in the checkpoint, "
                                         r"\[3, 2\] in the model"):
        kmeans.evaluate(_input_fn(POINTS[:, :2], 8))
    with pytest.raises(ValueError, match=r"must be a matrix \[batch, dimensions\], got shape "
                                         r"\[8\]"):
        kmeans.evaluate(lambda: iter([torch.zeros(8)]))


def test_input_ending_before_the_centers_are_chosen_says_so(tmp_path):
    """TF's initialization fails (OutOfRangeError) when the input ends first."""
    kmeans = est.KMeansClustering(6, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="the input ended with 3 of the 6 initial centers "
                                         "chosen"):
        kmeans.train(_input_fn(POINTS[:3], 3), steps=1)
    with pytest.raises(ValueError, match="3 of the 6 initial centers are chosen"):
        kmeans.evaluate(_input_fn(POINTS, 8))
    with pytest.raises(ValueError, match="0 of the 2 initial centers are chosen"):
        est.KMeansClustering(2, model_dir=str(tmp_path / "none")).evaluate(
            _input_fn(POINTS, 8))
    with pytest.raises(ValueError, match="feature 'word' holds <U1 values"):
        est.KMeansClustering(2).train(lambda: iter([{"word": np.array(["a", "b"])}]), steps=1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minibatch", "fullbatch", "cosine_iter2"])
def test_two_replicas_update_the_centers_of_one_process(name, tmp_path):
    """Each replica's half of each batch: the per-cluster sums and counts
    all-reduced, the centers one process's on the whole batches."""
    import distribute
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    _, batch, calls, _, _ = CASES[name]
    halves = [POINTS[i + j:i + j + batch // 2]
              for i in range(0, 40, batch) for j in (0, batch // 2)]
    two = _kmeans(name, None, config=est.RunConfig(model_dir=str(tmp_path / "two"),
                                                   train_distribute=strategy))
    for steps in calls:   # (each call reads the input from its start, as TF's recording)
        two.train(lambda: (torch.from_numpy(h) for h in itertools.islice(
            itertools.cycle(halves), 400)), steps=steps)
    np.testing.assert_allclose(two.cluster_centers(), TF["cases"][name]["centers"][-1],
                               atol=3e-6)


@pytest.mark.slow
def test_two_replicas_take_the_first_replicas_random_centers(tmp_path):
    import distribute
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    kmeans = est.KMeansClustering(4, config=est.RunConfig(
        model_dir=str(tmp_path), train_distribute=strategy), use_mini_batch=False)
    # batches of 2 rows a replica: the first replica's of the first two steps
    # (rows 0-1, 4-5) are the centers; one Lloyd step on rows 8-11
    kmeans.train(lambda: (torch.from_numpy(POINTS[i:i + 2]) for i in range(0, 40, 2)),
                 steps=1)
    initial = POINTS[[0, 1, 4, 5]]
    batch = POINTS[8:12]
    nearest = ((batch[:, None] - initial[None]) ** 2).sum(-1).argmin(1)
    expected = np.stack([batch[nearest == j].sum(0) / ((nearest == j).sum() + 1e-6)
                         for j in range(4)])
    np.testing.assert_allclose(kmeans.cluster_centers(), expected, atol=2e-6)
    assert kmeans.get_variable_value("global_step") == 1


@pytest.mark.slow
def test_two_replicas_choose_by_k_means_plus_plus_from_the_first_replicas_batch(tmp_path):
    """Only the first replica's batch must hold num_clusters points (the
    second's 2 rows are not asked to)."""
    import distribute
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    kmeans = est.KMeansClustering(3, initial_clusters="kmeans_plus_plus", seed=1,
                                  use_mini_batch=False, config=est.RunConfig(
                                      model_dir=str(tmp_path), train_distribute=strategy))
    batches = [POINTS[0:8], POINTS[8:10], POINTS[10:18], POINTS[18:20]]
    kmeans.train(lambda: (torch.from_numpy(b) for b in batches), steps=1)
    initial = kmeans.cluster_centers()
    assert initial.shape == (3, 3) and kmeans.get_variable_value("global_step") == 1
