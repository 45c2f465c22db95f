"""`RNNClassifier` against TF2's (`tf.estimator.experimental.RNNClassifier`):
models TF 2.15 trained (tests/support/fixtures/record_tf_rnn.py: an LSTM with
context columns, two stacked GRUs with a label vocabulary, a simple RNN with
a weight column) warm-start here from TF's checkpoints, then evaluate (23
rows in batches of 8, empty sequences among them) and predict what TF did,
one SGD step moves every weight as TF's did, and the default optimizer
(Adagrad, each gradient clipped to norm 5) trains 3 steps as TF's."""
import functools
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES
from rnn_data import LABELS, VOCABULARY, batches, rows
from tf_recorded import (assert_evaluation_is_tfs, assert_predictions_are_tfs,
                         assert_variables_are_tfs)

fc = est.feature_column
with open(os.path.join(FIXTURES, "tf_rnn.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
CKPT = os.path.join(FIXTURES, "tf_ckpt", "rnn")


def _columns():
    words = fc.sequence_categorical_column_with_vocabulary_list("words", VOCABULARY)
    sequence = [fc.embedding_column(words, 3), fc.sequence_numeric_column("stars")]
    city = fc.categorical_column_with_vocabulary_list("city", ["paris", "quito"])
    return sequence, [fc.numeric_column("age"), fc.embedding_column(city, 2)]


def _models():
    """As the recorder's: name: (RNNClassifier arguments, labels)."""
    sequence, context = _columns()
    return {
        "lstm": (dict(units=[4], cell_type="lstm", context_feature_columns=context), 1),
        "gru_stacked": (dict(units=[4, 3], cell_type="gru", n_classes=3,
                             label_vocabulary=LABELS, context_feature_columns=context[:1]), 2),
        "simple_rnn_weighted": (dict(units=[5], cell_type="simple_rnn", weight_column="w"),
                                1),
    }


def _make(name, model_dir, **more):
    arguments, labels = _models()[name]
    arguments = {**arguments, **more}
    sequence, _ = _columns()
    return est.RNNClassifier(sequence, model_dir=model_dir,
                             warm_start_from=os.path.join(CKPT, name), **arguments), labels


def test_every_model_is_recorded():
    assert sorted(_models()) == sorted(TF["models"])


@pytest.mark.parametrize("name", sorted(TF["models"]))
def test_evaluation_predictions_and_a_step_are_tfs(name, tmp_path):
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    estimator, pick = _make(name, str(tmp_path / "model"), optimizer=sgd)
    eval_rows = rows(23, 1)
    evaluation = batches((eval_rows[0], eval_rows[pick]), 8)
    assert_evaluation_is_tfs(estimator.evaluate(lambda: evaluation),
                             TF["models"][name]["evaluation"])
    few = [(f, None) for f, _ in batches((eval_rows[0], eval_rows[pick]), 5)[:1]]
    assert_predictions_are_tfs(list(estimator.predict(lambda: few)),
                               TF["models"][name]["predictions"])
    train_rows = rows(60, 0)
    first = batches((train_rows[0], train_rows[pick]), 12)[:1]
    estimator.train(lambda: first, steps=1)
    assert_variables_are_tfs(estimator, TF["models"][name]["after_one_sgd_step"])


def test_the_default_optimizer_clips_each_gradient_as_tfs(tmp_path):
    """Adagrad at 0.05 from accumulators of 0.1, each gradient clipped to
    norm 5.0 (the weights made large so that it clips), 3 steps from the
    LSTM's checkpoint."""
    recorded = TF["adagrad_clipped"]
    estimator, _ = _make("lstm", str(tmp_path / "model"), weight_column="w")
    features, labels, _ = rows(60, 0)
    features = {**features, "w": features["w"] * recorded["weight_scale"]}
    estimator.train(lambda: batches((features, labels), 12)[:3], steps=3)
    assert_variables_are_tfs(estimator, recorded["after_three_steps"])
    unclipped, _ = _make("lstm", str(tmp_path / "unclipped"), weight_column="w",
                         optimizer=lambda p: torch.optim.Adagrad(
                             p, lr=0.05, initial_accumulator_value=0.1, eps=1e-7))
    unclipped.train(lambda: batches((features, labels), 12)[:3], steps=3)
    name = "rnn_model/logits/kernel"
    assert not np.allclose(unclipped.get_variable_value(name),
                           recorded["after_three_steps"][name], atol=1e-4)   # (it clipped)


def test_bad_arguments_are_refused_by_name():
    sequence, _ = _columns()
    with pytest.raises(ValueError, match="Unsupported cell_type 'rnn'"):
        est.RNNClassifier(sequence, units=[4], cell_type="rnn")
    with pytest.raises(ValueError, match="units must be a positive int"):
        est.RNNClassifier(sequence, units=[4, 0])
    with pytest.raises(ValueError, match="units must be given"):   # (it said "got []")
        est.RNNClassifier(sequence)
    with pytest.raises(NotImplementedError, match="rnn_cell_fn"):
        est.RNNClassifier(sequence, rnn_cell_fn=lambda: None)
    with pytest.raises(ValueError, match="give units or num_units"):
        est.RNNClassifier(sequence, units=[4], num_units=[4])
    with pytest.raises(ValueError, match="Items of feature_columns must be a sequence column"):
        est.RNNClassifier([fc.numeric_column("age")], units=[4]).train(
            lambda: [({"age": np.ones((2, 1), np.float32)}, np.zeros(2, np.int64))], steps=1)


def test_num_units_is_tf1_contribs_name_for_units(tmp_path):
    sequence, _ = _columns()
    classifier = est.RNNClassifier(sequence, num_units=[3], cell_type="gru",
                                   model_dir=str(tmp_path / "model"))
    features, labels, _ = rows(12, 2)
    classifier.train(lambda: batches((features, labels), 6), steps=2)
    assert classifier.get_variable_value(
        "rnn_model/rnn/gru_cell/recurrent_kernel").shape == (3, 9)


def test_training_summaries_are_tfs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    estimator, pick = _make("lstm", str(tmp_path / "model"))
    features, labels, _ = rows(60, 0)
    estimator.train(lambda: batches((features, labels), 12), steps=5)
    tags = EventAccumulator(str(tmp_path / "model")).Reload().Tags()
    for kind, expected in TF["training_summaries"].items():
        assert sorted(t for t in tags[kind] if t != "global_step/sec") == expected, kind


@pytest.mark.slow
def test_two_replicas_train_an_rnn_classifier_as_one_process(tmp_path):
    """Each replica's half of a batch (its own longest sequence) and the
    default optimizer's clipping after the gradients are averaged: the
    weights equal one process's on the whole batches."""
    import distribute
    features, labels, _ = rows(48, 3)
    features = {**features, "w": features["w"] * 100.0}   # (large: the clipping acts)
    whole = batches((features, labels), 12)
    halves = [part for f, y in whole for part in batches((f, y), 6)]
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    two, _ = _make("lstm", None, weight_column="w", config=est.RunConfig(
        model_dir=str(tmp_path / "two"), train_distribute=strategy))
    two.train(lambda: halves, steps=len(whole))
    one, _ = _make("lstm", str(tmp_path / "one"), weight_column="w")
    one.train(lambda: whole, steps=len(whole))
    names = [n for n in one.get_variable_names() if not n.startswith(("optimizer/", "global"))]
    assert "rnn_model/rnn/lstm_cell/recurrent_kernel" in names
    for name in names:
        np.testing.assert_allclose(two.get_variable_value(name), one.get_variable_value(name),
                                   atol=2e-6, err_msg=name)


def test_another_optimizer_name_is_clipped_too(tmp_path):
    """TF2 clips every named optimizer's gradients to norm 5: 'SGD' at 0.05
    with huge weights moves each variable by 0.05 * 5 at most."""
    features, labels, _ = rows(12, 0)
    features = {**features, "w": features["w"] * 1e4}
    data = batches((features, labels), 12)
    still, _ = _make("lstm", str(tmp_path / "still"), weight_column="w",
                     optimizer=lambda p: torch.optim.SGD(p, lr=0.0))
    still.train(lambda: data, steps=1)
    estimator, _ = _make("lstm", str(tmp_path / "model"), weight_column="w", optimizer="SGD")
    estimator.train(lambda: data, steps=1)
    moves = {name: np.linalg.norm(estimator.get_variable_value(name)
                                  - still.get_variable_value(name))
             for name in TF["models"]["lstm"]["after_one_sgd_step"]}
    assert max(moves.values()) == pytest.approx(0.05 * 5.0, rel=1e-4), moves


@pytest.mark.parametrize("name", ["Adam", "RMSProp", "SGD", "Ftrl"])
def test_an_optimizer_name_is_keras_legacy_optimizer_as_tfs(name, tmp_path):
    """TF2 builds a name as Keras' legacy optimizer at 0.05, clipped to norm
    5 (here RMSProp was TF1's, its mean square from ones: 0.2-0.47 off TF's
    weights after 3 steps, and Adam's epsilon TF1's 1e-8; RNN attack)."""
    recorded = TF["named_optimizers"]
    estimator, _ = _make("simple_rnn_weighted", str(tmp_path / "model"), optimizer=name)
    features, labels, _ = rows(60, 0)
    features = {**features, "w": features["w"] * recorded["weight_scale"]}
    estimator.train(lambda: batches((features, labels), 12)[:3], steps=3)
    assert_variables_are_tfs(estimator, recorded[name])


@pytest.mark.slow
def test_a_replica_whose_sequences_are_all_empty_trains_as_one_process(tmp_path):
    """Stacked cells over no step (RNN attack): the first cell's outputs were
    not in the graph, so on that replica the loss did not reach the
    embedding and DDP's check failed, where one process trains."""
    import distribute
    features, labels, _ = rows(24, 5)
    for i in list(range(0, 6)) + list(range(12, 18)):
        features["words"][i], features["stars"][i] = [], []
    whole = batches((features, labels), 12)
    halves = [part for f, y in whole for part in batches((f, y), 6)]
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    sequence, context = _columns()
    arguments = dict(units=[4, 3], cell_type="gru", context_feature_columns=context[:1])
    two = est.RNNClassifier(sequence, config=est.RunConfig(
        model_dir=str(tmp_path / "two"), train_distribute=strategy, tf_random_seed=2),
        **arguments)
    two.train(lambda: halves, steps=len(whole))
    one = est.RNNClassifier(sequence, config=est.RunConfig(
        model_dir=str(tmp_path / "one"), tf_random_seed=2), **arguments)
    one.train(lambda: whole, steps=len(whole))
    for name in one.get_variable_names():
        if not name.startswith(("optimizer/", "global")):
            np.testing.assert_allclose(two.get_variable_value(name),
                                       one.get_variable_value(name), atol=2e-6, err_msg=name)


def test_an_rnn_classifier_exports_and_serves_examples_as_it_predicts(tmp_path):
    """TF's export path for a canned RNN: a parsing receiver of the columns'
    spec (its sequences up to max_sequence_length: the cells fix the steps
    when traced), served tf.Examples equal to predict."""
    import base64
    from estimator import serving
    from estimator.host_transform import example_of
    sequence, context = _columns()
    classifier = est.RNNClassifier(sequence, context[:1], units=[4, 3], cell_type="lstm",
                                   model_dir=str(tmp_path / "model"))
    features, labels, _ = rows(24, 0)
    classifier.train(lambda: batches((features, labels), 12), steps=2)
    spec = fc.make_parse_example_spec(sequence + context[:1])
    path = classifier.export_saved_model(str(tmp_path / "export"),
                                         est.export.build_parsing_serving_input_receiver_fn(
                                             spec, max_sequence_length=6))
    few = {k: v[:5] for k, v in features.items()}

    def example(words, stars, age):
        return {"b64": base64.b64encode(example_of(
            {"words": words, "stars": stars, "age": [float(age)]}, spec)).decode()}
    body = {"instances": [example(few["words"][i], few["stars"][i], few["age"][i][0])
                          for i in range(5)]}
    served = serving.Model(path).predict(body)["predictions"]
    predicted = list(classifier.predict(lambda: [(few, None)]))
    np.testing.assert_allclose([s["scores"] for s in served],
                               [p["probabilities"] for p in predicted], atol=1e-6)
    with pytest.raises(serving.RequestError, match="a sequence of 7 steps"):
        serving.Model(path).predict({"instances": [example(["good"] * 7, [1.0] * 7, 30.0)]})
