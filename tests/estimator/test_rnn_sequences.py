"""`RNNClassifier(return_sequences=True)` against TF2's (a label at each
step: TF's `SequentialHeadWrapper` over the classifier's head): models TF
2.15 trained (tests/support/fixtures/record_tf_rnn_sequences.py: an LSTM
with context columns and 0/1 labels, two stacked GRUs with word labels and
a weight at each step) warm-start here from TF's checkpoints, then
evaluate (23 rows in batches of 8, empty sequences among them) and predict
(the steps past a sequence's end its last step's) what TF did, and a step
moves every weight as TF's did."""
import functools
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES
from rnn_data import LABELS, batches, step_rows
from test_rnn_estimator import _columns   # (the same columns as the RNN tests')
from tf_recorded import (assert_evaluation_is_tfs, assert_predictions_are_tfs,
                         assert_variables_are_tfs)

fc = est.feature_column
with open(os.path.join(FIXTURES, "tf_rnn_sequences.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
CKPT = os.path.join(FIXTURES, "tf_ckpt", "rnn_sequences")


def _models():
    """As the recorder's: name: (RNNClassifier arguments, labels)."""
    _, context = _columns()
    return {
        "lstm": (dict(units=[4], cell_type="lstm", context_feature_columns=context), 1),
        "gru_stacked_weighted": (dict(units=[4, 3], cell_type="gru", n_classes=3,
                                      label_vocabulary=LABELS, weight_column="w"), 2),
    }


def _make(name, model_dir, **more):
    arguments, labels = _models()[name]
    sequence, _ = _columns()
    return est.RNNClassifier(sequence, model_dir=model_dir, return_sequences=True,
                             warm_start_from=os.path.join(CKPT, name),
                             **{**arguments, **more}), labels


def test_every_model_is_recorded():
    assert sorted(_models()) == sorted(TF["models"])


@pytest.mark.parametrize("name", sorted(TF["models"]))
def test_evaluation_predictions_and_a_step_are_tfs(name, tmp_path):
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    estimator, pick = _make(name, str(tmp_path / "model"), optimizer=sgd)
    eval_rows = step_rows(23, 1)
    evaluation = batches((eval_rows[0], eval_rows[pick]), 8)
    assert_evaluation_is_tfs(estimator.evaluate(lambda: evaluation),
                             TF["models"][name]["evaluation"])
    few = [(f, None) for f, _ in batches((eval_rows[0], eval_rows[pick]), 5)[:1]]
    predictions = list(estimator.predict(lambda: few))
    assert_predictions_are_tfs(predictions, TF["models"][name]["predictions"])
    train_rows = step_rows(60, 0)
    first = batches((train_rows[0], train_rows[pick]), 12)[:1]
    estimator.train(lambda: first, steps=1)
    assert_variables_are_tfs(estimator, TF["models"][name]["after_one_sgd_step"])


def test_the_default_optimizer_trains_as_tfs(tmp_path):
    estimator, _ = _make("lstm", str(tmp_path / "model"))
    features, labels, _ = step_rows(60, 0)
    estimator.train(lambda: batches((features, labels), 12)[:3], steps=3)
    assert_variables_are_tfs(estimator, TF["adagrad"]["after_three_steps"])


def test_training_summaries_are_tfs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    estimator, pick = _make("gru_stacked_weighted", str(tmp_path / "model"))
    features, _, labels = step_rows(60, 0)
    estimator.train(lambda: batches((features, labels), 12), steps=5)
    tags = EventAccumulator(str(tmp_path / "model")).Reload().Tags()
    expected = TF["models"]["gru_stacked_weighted"]["training_summaries"]
    for kind, names in expected.items():
        assert sorted(t for t in tags[kind] if t != "global_step/sec") == names, kind


def _padded(rows_, fill):
    """Rows of per-step values as a [batch, T] array padded with `fill`."""
    steps = max(len(r) for r in rows_)
    return np.array([list(r) + [fill] * (steps - len(r)) for r in rows_])


def test_padded_labels_and_weights_are_the_rows_of_per_step_values(tmp_path):
    """A padded [batch, T] array of labels (and of weights) gives what the
    rows of per-step values give: the padding never counts."""
    estimator, _ = _make("gru_stacked_weighted", str(tmp_path / "model"))
    features, _, labels = step_rows(23, 1)
    rowed = estimator.evaluate(lambda: batches((features, labels), 8))
    padded = []
    for f, y in batches((features, labels), 8):
        padded.append(({**f, "w": _padded(f["w"], 1e6)}, _padded(y, "high")))
    assert estimator.evaluate(lambda: padded) == pytest.approx(rowed)


def test_a_sequence_mask_given_by_input_fn_is_the_one_used(tmp_path):
    """TF: the head flattens with the features' `sequence_mask` where
    input_fn gives one (here keeping each sequence's first step alone)."""
    estimator, _ = _make("lstm", str(tmp_path / "model"))
    features, labels, _ = step_rows(23, 1)
    firsts, masked = [], []
    for f, y in batches((features, labels), 8):
        steps = max(len(w) for w in f["words"])
        mask = np.zeros((len(y), steps), bool)
        mask[:, 0] = [len(w) > 0 for w in f["words"]]
        masked.append(({**f, "sequence_mask": mask}, [r[:1] for r in y]))
        firsts.append(({**f, "words": [w[:1] for w in f["words"]],
                        "stars": [s[:1] for s in f["stars"]]}, [r[:1] for r in y]))
    got = estimator.evaluate(lambda: masked)
    # (the first step's logits do not depend on the later steps)
    assert got == pytest.approx(estimator.evaluate(lambda: firsts))
    assert got["loss"] != pytest.approx(TF["models"]["lstm"]["evaluation"]["loss"])


def test_labels_not_one_a_step_are_refused_by_example(tmp_path):
    """TF fails in the graph ("Tensor shape is incompatible with provided
    mask.", or aligns wrong labels where only the total matches); here the
    example and the counts are named."""
    assert TF["labels_longer_than_sequence"]["type"] == "InvalidArgumentError"
    estimator, _ = _make("lstm", str(tmp_path / "model"))
    features, labels, _ = step_rows(8, 1)
    first = next(i for i, y in enumerate(labels) if y)
    longer = [list(y) + [0] if i == first else y for i, y in enumerate(labels)]
    with pytest.raises(ValueError, match=f"labels: example {first} has {len(labels[first]) + 1}"
                                         f" values, its sequence {len(labels[first])} steps"):
        estimator.evaluate(lambda: [(features, longer)])
    with pytest.raises(ValueError, match=r"labels must hold a value at each step: \[batch, T\]"):
        estimator.evaluate(lambda: [(features, np.zeros((8, 1), np.int64))])
    with pytest.raises(ValueError, match="labels have 7 rows, the sequences 8"):
        estimator.evaluate(lambda: [(features, labels[:7])])
    weighted, _ = _make("gru_stacked_weighted", str(tmp_path / "weighted"))
    features, _, kinds = step_rows(8, 1)
    with pytest.raises(ValueError, match="`w` column expected in features dictionary"):
        weighted.evaluate(lambda: [({k: v for k, v in features.items() if k != "w"}, kinds)])
    short = [w[:-1] if w else w for w in features["w"]]
    with pytest.raises(ValueError, match="feature 'w': example"):
        weighted.evaluate(lambda: [({**features, "w": short}, kinds)])


def test_heads_and_return_sequences_must_agree():
    sequence, _ = _columns()
    with pytest.raises(ValueError, match="must be a `_SequentialHead` object when "
                                         "`return_sequences` is set to True"):
        est.RNNEstimator(est.BinaryClassHead(), sequence, units=[4], return_sequences=True)
    wrapped = est.SequentialHeadWrapper(est.BinaryClassHead(), "sequence_mask")
    with pytest.raises(ValueError, match="give return_sequences=True"):
        est.RNNEstimator(wrapped, sequence, units=[4])
    with pytest.raises(TypeError, match="`sequence_mask` column must be a string"):
        est.SequentialHeadWrapper(est.BinaryClassHead(), 3)
    with pytest.raises(TypeError, match="Column must a string"):
        est.SequentialHeadWrapper(est.BinaryClassHead(), feature_columns=[3])
    with pytest.raises(ValueError, match="`MultiHead` is not supported"):
        est.SequentialHeadWrapper(est.MultiHead([est.BinaryClassHead(name="a"),
                                                 est.RegressionHead(name="b")]))


def test_a_sequential_regression_head_in_rnn_estimator(tmp_path):
    """`RNNEstimator(SequentialHeadWrapper(RegressionHead()),
    return_sequences=True)`: a float target at each step; the loss is the
    mean over the steps of all sequences (TF2's SUM_OVER_BATCH_SIZE of the
    flattened steps), which a model_fn computing it by hand agrees with."""
    sequence, _ = _columns()
    head = est.SequentialHeadWrapper(est.RegressionHead(), "sequence_mask")
    regressor = est.RNNEstimator(head, sequence, units=[3], cell_type="lstm",
                                 return_sequences=True, model_dir=str(tmp_path / "model"),
                                 config=est.RunConfig(tf_random_seed=1))
    features, _, _ = step_rows(24, 2)
    targets = [[2.0 * s for s in stars] for stars in features["stars"]]
    regressor.train(lambda: batches((features, targets), 12), steps=2)
    few = batches((features, targets), 8)[:1]
    (f, y), = few
    predicted = list(regressor.predict(lambda: [(f, None)]))
    squares = [(p["predictions"][t, 0] - y[i][t]) ** 2 for i, p in enumerate(predicted)
               for t in range(len(y[i]))]
    assert all(p["predictions"].shape == (max(map(len, y)), 1) for p in predicted)
    assert regressor.evaluate(lambda: few)["average_loss"] == pytest.approx(
        np.mean(squares), rel=1e-5)


def test_an_rnn_classifier_of_sequences_exports_and_serves_as_it_predicts(tmp_path):
    """Served per-step predictions (the classification signature's scores;
    the predict signature's every key and the mask) equal predict's."""
    import base64
    from estimator import serving
    from estimator.host_transform import example_of
    sequence, _ = _columns()
    classifier = est.RNNClassifier(sequence, units=[4], cell_type="gru", n_classes=3,
                                   label_vocabulary=LABELS, return_sequences=True,
                                   model_dir=str(tmp_path / "model"))
    features, _, labels = step_rows(24, 0)
    classifier.train(lambda: batches((features, labels), 12), steps=2)
    spec = fc.make_parse_example_spec(sequence)
    path = classifier.export_saved_model(str(tmp_path / "export"),
                                         est.export.build_parsing_serving_input_receiver_fn(
                                             spec, max_sequence_length=6))
    few = {k: v[:5] for k, v in features.items()}
    body = {"instances": [{"b64": base64.b64encode(example_of(
        {"words": few["words"][i], "stars": few["stars"][i]}, spec)).decode()}
        for i in range(5)]}
    predicted = list(classifier.predict(lambda: [(few, None)]))
    model = serving.Model(path)
    served = model.predict(body)["predictions"]
    every = model.predict({**body, "signature_name": "predict"})["predictions"]
    for p, s, e in zip(predicted, served, every):
        steps = int(p["sequence_mask"].sum())
        assert steps == sum(e["sequence_mask"])
        np.testing.assert_allclose(np.asarray(s["scores"])[:steps],
                                   p["probabilities"][:steps], atol=1e-6)
        np.testing.assert_allclose(np.asarray(e["logits"])[:steps], p["logits"][:steps],
                                   atol=1e-6)
        assert [c[0] for c in e["classes"][:steps]] == [
            c.decode() for c in p["classes"][:steps, 0]]


@pytest.mark.slow
def test_two_replicas_train_sequences_as_one_process(tmp_path):
    """Each replica's half of the batch, one replica's sequences all empty
    in a step (no step to flatten: the model still in its loss's graph, as
    DDP needs): the weights equal one process's on the whole batches (each
    replica's mean over its steps, averaged: the halves hold equal steps)."""
    import distribute
    features, labels, _ = step_rows(24, 5)
    for i in range(6):   # (the first half of the first batch: no step)
        features["words"][i], features["stars"][i], labels[i] = [], [], []
        features["w"][i] = []
    for i in range(6, 12):   # (the other half: one step each)
        for key in ("words", "stars", "w"):
            features[key][i] = features[key][i][:1] or (["good"] if key == "words" else [1.0])
        labels[i] = labels[i][:1] or [1]
    whole = batches((features, labels), 12)
    halves = [part for f, y in whole for part in batches((f, y), 6)]
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))
    two, _ = _make("lstm", None, config=est.RunConfig(
        model_dir=str(tmp_path / "two"), train_distribute=strategy),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    two.train(lambda: halves[:2], steps=1)
    one, _ = _make("lstm", str(tmp_path / "one"),
                   optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    one.train(lambda: whole[:1], steps=1)
    # one replica's loss is its 6 steps' mean, the other's 0 (no step): their
    # mean's gradient is half the whole batch's (6 steps' mean)
    half, _ = _make("lstm", str(tmp_path / "half"),
                    optimizer=functools.partial(torch.optim.SGD, lr=0.05))
    half.train(lambda: [halves[1]], steps=1)
    for name in one.get_variable_names():
        if not name.startswith(("optimizer/", "global")):
            np.testing.assert_allclose(two.get_variable_value(name),
                                       half.get_variable_value(name), atol=2e-6,
                                       err_msg=name)


def test_a_batch_of_no_step_with_word_labels_counts_no_step(tmp_path):
    """RNN sequences attack: a batch whose sequences are all empty failed for
    string labels ("Labels dtype should be string") and multi-class ids
    (TF fails on any such batch); its steps count none: the step-weighted
    metrics are those without it."""
    estimator, _ = _make("gru_stacked_weighted", str(tmp_path / "model"))
    features, _, labels = step_rows(23, 1)
    parts = batches((features, labels), 8)
    empty = ({**parts[0][0], "words": [[]] * 8, "stars": [[]] * 8, "w": [[]] * 8}, [[]] * 8)
    got = estimator.evaluate(lambda: parts + [empty])
    expected = TF["models"]["gru_stacked_weighted"]["evaluation"]
    for key in ("accuracy", "average_loss"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5), key
    ids, _ = _make("gru_stacked_weighted", str(tmp_path / "ids"), label_vocabulary=None)
    as_ids = [(f, [[LABELS.index(v) for v in row] for row in y]) for f, y in parts + [empty]]
    accuracy = ids.evaluate(lambda: as_ids)["accuracy"]
    assert accuracy == pytest.approx(expected["accuracy"], rel=1e-5)


def test_padded_word_labels_as_parse_example_gives_them(tmp_path):
    """A FixedLenSequenceFeature's padded [batch, T] object array of bytes
    (RNN sequences attack: it was taken for rows) evaluates as the rows."""
    estimator, _ = _make("gru_stacked_weighted", str(tmp_path / "model"))
    features, _, labels = step_rows(23, 1)
    padded = [(f, _padded([[v.encode() for v in row] for row in y], b"").astype(object))
              for f, y in batches((features, labels), 8)]
    assert padded[0][1].dtype == object and padded[0][1].ndim == 2
    assert_evaluation_is_tfs(estimator.evaluate(lambda: padded),
                             TF["models"]["gru_stacked_weighted"]["evaluation"])


def test_bad_labels_and_masks_are_named(tmp_path):
    estimator, _ = _make("lstm", str(tmp_path / "model"))
    features, labels, _ = step_rows(8, 1)
    with pytest.raises(ValueError, match="labels: example 0 is 0, not a row of per-step "
                                         "values"):
        estimator.evaluate(lambda: [(features, [0] * 8)])
    ragged = [[True] * len(w) for w in features["words"]]
    with pytest.raises(ValueError, match=r"features\['sequence_mask'\], the sequence mask, "
                                         r"must be a \[batch, T\] array"):
        estimator.evaluate(lambda: [({**features, "sequence_mask": ragged}, labels)])
    with pytest.raises(ValueError, match=r"features\['sequence_mask'\], the sequence mask, is "
                                         r"\[8, 1\]"):
        estimator.evaluate(lambda: [({**features, "sequence_mask": np.ones((8, 1), bool)},
                                     labels)])


def test_classify_refuses_scores_at_every_step(tmp_path):
    """TF Serving's classifier takes a score per class per example; scores
    at every step were cut to the first step's, silently (RNN sequences
    attack); :predict answers with them."""
    from estimator import serving
    sequence, _ = _columns()
    classifier = est.RNNClassifier(sequence, units=[3], return_sequences=True,
                                   model_dir=str(tmp_path / "model"))
    features, labels, _ = step_rows(24, 0)
    classifier.train(lambda: batches((features, labels), 12), steps=1)
    raw = {"words": features["words"][:2], "stars": features["stars"][:2]}
    path = classifier.export_saved_model(str(tmp_path / "export"),
                                         est.export.build_raw_serving_input_receiver_fn(raw))
    model = serving.Model(path)
    body = {"examples": [{"words": ["good", "bad"], "stars": [1.0, 0.5]}]}
    with pytest.raises(serving.RequestError, match=r"Expected Tensor shape: \[batch_size "
                                                   r"num_classes\] but got \[1, \d+, 2\]"):
        model.classify(body)
