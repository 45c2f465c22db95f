"""Sequence feature columns against TensorFlow: `sequence_input_layer`'s
output and lengths (TF 2.15's `SequenceFeatures`), the refusals, a sequence
column in `linear_model`, and `concatenate_context_input`, recorded by
``tests/support/fixtures/record_tf_sequence_columns.py``; TF is not needed
here. Then the columns as a user trains, restores and parses with them."""
import json
import os

import numpy as np
import pytest
import torch

import distribute
import estimator as est
from hooks import model_scope
from paths import FIXTURES

fc = est.feature_column

with open(os.path.join(FIXTURES, "tf_sequence_columns.json"), encoding="utf-8") as _f:
    TF = json.load(_f)

# What our refusal says where TF refuses (TF's words where it has clear ones).
REFUSALS = {
    "numeric_dense": "takes rows of values (a list of lists, TF's SparseTensor; TF: 'Input "
                     "must be a SparseTensor')",
    "unequal_lengths": "Condition x == y did not hold",
    "non_sequence_column": "Items of feature_columns must be a sequence column",
    "non_sequence_embedding": "In embedding_column: ids_embedding. categorical_column must be "
                              "of type SequenceCategoricalColumn to use",
    "input_layer_sequence_embedding": "In embedding_column: ids_embedding. categorical_column "
                                      "must not be of type SequenceCategoricalColumn. "
                                      "Suggested fix A: If you wish to use",
    "input_layer_sequence_indicator": "In indicator_column: ids_indicator. categorical_column "
                                      "must not be of type SequenceCategoricalColumn. "
                                      "Suggested fix A: If you wish to use",
    "input_layer_sequence_numeric": "Items of feature_columns must be a DenseColumn",
}
# TF fails where this library gives a value, on purpose (the reason).
WIDER = {
    "numeric_int_rows": "integer values are read as numbers (TF: 'Cannot convert 0.0 to "
                        "EagerTensor of dtype int64')",
}
NORMALIZERS = {"double": lambda x: x * 2.0}


def _table(rows, dim):
    return (0.1 * (np.arange(rows)[:, None] + 1) + 0.01 * np.arange(dim)[None, :]
            ).astype(np.float32)


def _categorical(spec, tmp_path=None):
    kind, key = spec["kind"], spec["key"]
    if kind == "vocab_file":
        path = tmp_path / "vocab.txt"
        path.write_text("\n".join(spec["lines"]) + "\n")
        return fc.sequence_categorical_column_with_vocabulary_file(
            key, str(path), num_oov_buckets=spec.get("num_oov_buckets", 0))
    if kind == "identity":
        return fc.sequence_categorical_column_with_identity(
            key, spec["num_buckets"], default_value=spec.get("default_value"))
    if kind == "plain_identity":
        return fc.categorical_column_with_identity(key, spec["num_buckets"])
    if kind == "vocab":
        return fc.sequence_categorical_column_with_vocabulary_list(
            key, spec["vocabulary_list"], num_oov_buckets=spec.get("num_oov_buckets", 0))
    assert kind == "hash"
    return fc.sequence_categorical_column_with_hash_bucket(
        key, spec["hash_bucket_size"], dtype=spec.get("dtype", "string"))


def _column(spec, tmp_path=None):
    kind = spec["kind"]
    if kind == "numeric":
        return fc.sequence_numeric_column(
            spec["key"], shape=tuple(spec.get("shape", (1,))),
            default_value=spec.get("default_value", 0.0),
            normalizer_fn=NORMALIZERS.get(spec.get("normalizer")))
    if kind == "plain_numeric":
        return fc.numeric_column(spec["key"])
    if kind == "embedding":
        cat = _categorical(spec["cat"], tmp_path)
        return fc.embedding_column(cat, spec["dimension"], combiner=spec.get("combiner", "mean"),
                                   initializer=lambda shape: _table(*shape))
    if kind == "indicator":
        return fc.indicator_column(_categorical(spec["cat"], tmp_path))
    assert kind == "cat_only"
    return _categorical(spec["cat"])


def _features(spec):
    return {key: np.array(values) if kind == "dense" else values
            for key, (kind, values) in spec.items()}


@pytest.mark.parametrize("name", sorted(TF["cases"]))
def test_sequence_input_layer_as_tf(name, tmp_path):
    case = TF["cases"][name]
    tf = case["tf"]

    def run():
        columns = [_column(s, tmp_path) for s in case["columns"]]
        return fc.sequence_input_layer(_features(case["features"]), columns)

    if name in WIDER:
        value, lengths = run()
        floats = {k: ("rows", [[float(v) for v in r] for r in vals])
                  for k, (_, vals) in case["features"].items()}
        expected, expected_lengths = fc.sequence_input_layer(
            _features(floats), [_column(s) for s in case["columns"]])
        assert torch.equal(value, expected) and torch.equal(lengths, expected_lengths)
        return
    if "error" in tf:
        with pytest.raises(ValueError) as raised:
            run()
        assert REFUSALS[name] in str(raised.value)
        return
    value, lengths = run()
    assert value.dtype == torch.float32 and lengths.dtype == torch.int64
    assert list(value.shape) == tf["shape"]
    np.testing.assert_allclose(value.detach().numpy().reshape(tf["shape"]),
                               np.asarray(tf["output"], np.float32).reshape(tf["shape"]),
                               rtol=1e-6, atol=1e-7)
    assert lengths.tolist() == tf["lengths"]


def test_fixture_covers_every_sequence_column():
    kinds = {s.get("kind") for case in TF["cases"].values() for c in case["columns"]
             for s in (c, c.get("cat", {}))}
    made = {"numeric": "sequence_numeric_column",
            "identity": "sequence_categorical_column_with_identity",
            "vocab": "sequence_categorical_column_with_vocabulary_list",
            "vocab_file": "sequence_categorical_column_with_vocabulary_file",
            "hash": "sequence_categorical_column_with_hash_bucket"}
    assert {made[k] for k in kinds if k in made} == {
        n for n in fc.__all__ if n.startswith("sequence_") and n.endswith(
            ("_column", "_bucket", "_identity", "_list", "_file"))}


@pytest.mark.parametrize("name", sorted(TF["dense_layer"]))
def test_sequence_columns_refused_by_input_layer_as_tf(name):
    case = TF["dense_layer"][name]
    assert "error" in case["tf"]
    with pytest.raises(ValueError) as raised:
        fc.input_layer(_features(case["features"]), [_column(s) for s in case["columns"]])
    assert REFUSALS[name] in str(raised.value)


@pytest.mark.parametrize("name", sorted(TF["linear"]))
def test_sequence_column_in_linear_model_is_a_bag_per_example_as_tf(name):
    """TF's linear_model takes a sequence categorical column as each
    example's bag of ids, its frames' too (weights set to 1, 2, 3, ...,
    bias 0.5)."""
    case = TF["linear"][name]
    columns = [_column(s) for s in case["columns"]]
    cols_to_vars = {}
    with model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy()):
        fc.linear_model(_features(case["features"]), columns, cols_to_vars=cols_to_vars)
        with torch.no_grad():
            for column, variables in cols_to_vars.items():
                for var in variables:
                    var.copy_(torch.full_like(var, 0.5) if column == "bias" else
                              torch.arange(1, var.numel() + 1, dtype=torch.float32).reshape(
                                  var.shape))
        out = fc.linear_model(_features(case["features"]), columns)
    np.testing.assert_allclose(out.detach().numpy(), case["tf"]["output"])


@pytest.mark.parametrize("name", sorted(TF["context"]))
def test_concatenate_context_input_as_tf(name):
    case = TF["context"][name]
    context, sequence = torch.tensor(case["context"]), torch.tensor(case["sequence"])
    if "error" in case["tf"]:
        with pytest.raises(ValueError) as raised:
            fc.concatenate_context_input(context, sequence)
        assert case["tf"]["message"].split(".")[0] in str(raised.value)
        return
    np.testing.assert_allclose(fc.concatenate_context_input(context, sequence).numpy(),
                               case["tf"]["output"], rtol=1e-6)


# -- as a user trains with them ---------------------------------------------------------------
_WORDS = fc.sequence_categorical_column_with_vocabulary_list(
    "words", ["good", "bad", "fine", "meh"], num_oov_buckets=1)
_COLUMNS = [fc.embedding_column(_WORDS, 4), fc.sequence_numeric_column("stars")]


def _reviews(n=48, seed=0):
    """Reviews of 1 to 6 words, a star rating a word (float64, as pandas
    gives), labelled 1 where "good" comes before any "bad"."""
    rng = np.random.RandomState(seed)
    vocab = ["good", "bad", "fine", "meh", "unseen"]
    words, stars, labels = [], [], []
    for _ in range(n):
        row = [vocab[i] for i in rng.randint(0, 5, rng.randint(1, 7))]
        good = [i for i, w in enumerate(row) if w == "good"]
        bad = [i for i, w in enumerate(row) if w == "bad"]
        words.append(row)
        stars.append(list(rng.rand(len(row)).astype(np.float64)))
        labels.append(int(bool(good) and (not bad or good[0] < bad[0])))
    return words, stars, np.asarray(labels, np.int64)


def _review_batches(batch_size=10, **kwargs):   # (uneven: 48 rows in 10s)
    words, stars, labels = _reviews(**kwargs)
    return [({"words": words[i:i + batch_size], "stars": stars[i:i + batch_size]},
             torch.from_numpy(labels[i:i + batch_size]))
            for i in range(0, len(labels), batch_size)]


def _review_model_fn(features, labels, mode):
    net, lengths = fc.sequence_input_layer(features, _COLUMNS)
    lstm = est.get_module("lstm", lambda: torch.nn.LSTM(5, 16, batch_first=True))
    drop = est.get_module("dropout", lambda: torch.nn.Dropout(0.2))
    head = est.get_module("head", lambda: torch.nn.Linear(16, 2))
    packed = torch.nn.utils.rnn.pack_padded_sequence(net, lengths, batch_first=True,
                                                     enforce_sorted=False)
    _, (h, _) = lstm(packed)
    logits = head(drop(h[-1]))
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"logits": logits, "length": lengths})
    loss = torch.nn.functional.cross_entropy(logits, labels)
    return est.EstimatorSpec(
        mode, loss=loss, train_op=est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.03)),
        eval_metric_ops={"accuracy": est.metrics.accuracy(labels, logits.argmax(1))})


def test_a_sequence_classifier_trains_restores_and_predicts(tmp_path):
    data = _review_batches()
    model_dir = str(tmp_path / "model")
    estimator = est.Estimator(_review_model_fn, model_dir=model_dir,
                              config=est.RunConfig(tf_random_seed=3))
    estimator.train(lambda: data * 30, steps=150)
    metrics = estimator.evaluate(lambda: data)
    assert metrics["accuracy"] >= 0.9, metrics
    assert estimator.get_variable_value(
        "sequence_input_layer/words_embedding/embedding_weights").shape == (5, 4)
    predict = [(f, None) for f, _ in data]
    first = list(estimator.predict(lambda: predict))
    again = list(est.Estimator(_review_model_fn, model_dir=model_dir).predict(lambda: predict))
    assert [p["length"] for p in first] == [len(w) for f, _ in data for w in f["words"]]
    for a, b in zip(first, again):   # (restored; no dropout in PREDICT)
        np.testing.assert_array_equal(a["logits"], b["logits"])


def test_sequence_columns_parse_spec_and_sequence_example_frames():
    """make_parse_example_spec gives VarLenFeatures (TF's); the frames
    parse_sequence_example gives for a VarLenFeature list (one word a frame)
    read as the rows of those words."""
    assert fc.make_parse_example_spec(_COLUMNS) == {
        "words": fc.VarLenFeature(str), "stars": fc.VarLenFeature(torch.float32)}
    records = []
    for words, stars in (["good", "meh"], [0.5, 1.0]), (["bad"], [0.25]):
        records.append(est.io.SequenceExample(feature_lists=est.io.FeatureLists(feature_list={
            "words": est.io.FeatureList(feature=[est.io.Feature(
                bytes_list=est.io.BytesList(value=[w.encode()])) for w in words]),
            "stars": est.io.FeatureList(feature=[est.io.Feature(
                float_list=est.io.FloatList(value=[s])) for s in stars])})).SerializeToString())
    _, lists, _ = est.io.parse_sequence_example(
        records, sequence_features={"words": est.io.VarLenFeature(str),
                                    "stars": est.io.VarLenFeature(torch.float32)})
    rows = {"words": [["good", "meh"], ["bad"]], "stars": [[0.5, 1.0], [0.25]]}
    with model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy()):
        framed, framed_lengths = fc.sequence_input_layer(lists, _COLUMNS)
        flat, flat_lengths = fc.sequence_input_layer(rows, _COLUMNS)
    assert torch.equal(framed, flat) and framed_lengths.tolist() == [2, 1] == flat_lengths.tolist()


def test_sequence_column_errors_say_what_is_wrong():
    numbers = fc.sequence_numeric_column("x", shape=(2,))
    with pytest.raises(ValueError, match="takes 2 values a step; the longest row holds 3"):
        fc.sequence_input_layer({"x": [[1.0, 2.0, 3.0]]}, [numbers])
    with pytest.raises(ValueError, match="takes 2 values a frame; a frame holds 3"):
        fc.sequence_input_layer({"x": [[[1.0, 2.0, 3.0]]]}, [numbers])
    with pytest.raises(ValueError, match="needs numbers; feature 'x' holds string"):
        fc.sequence_input_layer({"x": [["a"]]}, [fc.sequence_numeric_column("x")])
    with pytest.raises(ValueError, match="holds rows of frames .* only the sequence columns"):
        fc.input_layer({"x": [[[1.0], [2.0]]]}, [fc.numeric_column("x")])
    with pytest.raises(ValueError, match="holds rows of frames"):
        fc.input_layer({"w": [[["a"], ["b"]]]}, [fc.indicator_column(
            fc.categorical_column_with_vocabulary_list("w", ["a", "b"]))])
    with pytest.raises(ValueError, match=r"rows mix frames .*\(row 0 holds 2.0 at 1\)"):
        fc.sequence_input_layer({"x": [[[1.0], 2.0]]}, [fc.sequence_numeric_column("x")])
    with pytest.raises(ValueError, match="dtype must be convertible to float"):
        fc.sequence_numeric_column("x", dtype=str)
    with pytest.raises(ValueError, match="takes 2 values a frame; a frame holds 1"):
        fc.sequence_input_layer({"x": [[[1.0], [3.0]], [[5.0, 6.0]]]}, [numbers])   # (TF's
    # then give [[[1, 3]], [[5, 0]]] of lengths [2, 1]: a length past its steps)
    with pytest.raises(ValueError, match="Batch size .* must be same"):
        fc.sequence_input_layer({"words": [["good"]], "stars": [[1.0], [2.0]]}, _COLUMNS)


def test_rows_from_pandas_or_an_object_array_are_rows():
    """A DataFrame column of token lists (an object array of lists), as
    pandas_input_fn gives it: the same as a list of lists."""
    rows = {"words": [["good", "bad"], [], ["meh"]], "stars": [[1.0, 2.0], [], [3.0]]}
    objects = {k: np.array(v + [None], dtype=object)[:-1] for k, v in rows.items()}
    with model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy()):
        expected, lengths = fc.sequence_input_layer(rows, _COLUMNS)
        got, got_lengths = fc.sequence_input_layer(objects, _COLUMNS)
        pd = pytest.importorskip("pandas")
        frame = pd.DataFrame(rows)
        from_pandas, _ = fc.sequence_input_layer({k: frame[k] for k in rows}, _COLUMNS)
    assert torch.equal(got, expected) and torch.equal(got_lengths, lengths)
    assert torch.equal(from_pandas, expected)


def test_columns_of_different_steps_are_padded_to_the_longest():
    """A dense id array wider than the numbers' longest row (its padding
    missing): every column padded to the layer's steps (TF's concat fails)."""
    ids = fc.indicator_column(fc.sequence_categorical_column_with_identity("ids", 3))
    out, lengths = fc.sequence_input_layer(
        {"ids": np.array([[1, 2, -1, -1], [0, -1, -1, -1]]), "x": [[0.5, 1.5], [2.5]]},
        [ids, fc.sequence_numeric_column("x", default_value=-1.0)])
    assert lengths.tolist() == [2, 1] and list(out.shape) == [2, 4, 4]
    assert out[0, :, 3].tolist() == [0.5, 1.5, -1.0, -1.0]
    assert out[1, 0].tolist() == [1.0, 0.0, 0.0, 2.5]


def test_an_empty_batch_gives_no_steps():
    """(A replica evaluating nothing gets a batch of no rows.)"""
    out, lengths = fc.sequence_input_layer({"words": [], "stars": []}, _COLUMNS)
    assert list(out.shape) == [0, 0, 5] and lengths.tolist() == []


def _mean_model_fn(features, labels, mode):
    """Steps averaged within their lengths: no RNN, any number of steps."""
    net, lengths = fc.sequence_input_layer(features, _COLUMNS)
    mask = (torch.arange(net.shape[1]) < lengths.unsqueeze(1)).unsqueeze(2)
    mean = (net * mask).sum(1) / lengths.clamp(min=1).unsqueeze(1)
    logits = est.get_module("head", lambda: torch.nn.Linear(5, 2))(mean)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"logits": logits})
    return est.EstimatorSpec(mode, loss=torch.nn.functional.cross_entropy(logits, labels),
                             train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)))


def _gru_model_fn(features, labels, mode):
    """A GRU over the padded steps, its output at each length's last step
    (torch.export keeps a GRU's steps as traced)."""
    net, lengths = fc.sequence_input_layer(features, _COLUMNS)
    out, _ = est.get_module("gru", lambda: torch.nn.GRU(5, 6, batch_first=True))(net)
    last = out.gather(1, (lengths - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, 6)).squeeze(1)
    logits = est.get_module("head", lambda: torch.nn.Linear(6, 2))(last)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"logits": logits})
    return est.EstimatorSpec(mode, loss=torch.nn.functional.cross_entropy(logits, labels),
                             train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)))


def _served(path, features):
    from estimator import serving
    model = serving.Model(path)
    body = {"instances": [dict(zip(features, row)) for row in zip(*features.values())]}
    return np.asarray(model.predict(body)["predictions"], np.float32)


def _predicted(estimator, features):
    return np.stack([p["logits"] for p in estimator.predict(lambda: [(features, None)])])


@pytest.mark.parametrize("model_fn", [_mean_model_fn, _gru_model_fn], ids=["mean", "gru"])
def test_a_sequence_model_exports_and_serves_as_it_predicts(tmp_path, model_fn):
    """The export redoes the sequence columns' work per request (strings to
    ids, rows to padded steps); a model that fixes its steps (the GRU) serves
    sequences up to its example's longest, padded, and refuses longer ones
    by name."""
    data = _review_batches()
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: data, steps=5)
    example = {"words": [["good", "bad", "meh"], ["fine"]], "stars": [[1.0, 2.0, 3.0], [4.0]]}
    path = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(example))
    signature = json.load(open(os.path.join(path, "signature.json")))
    assert {i["name"]: (i["dtype"], i.get("rows")) for i in signature["inputs"]} == {
        "words": ("string", None), "stars": ("float32", True)}
    shorter = {"words": [["bad"], ["good", "unseen"], ["meh"]],
               "stars": [[0.5], [0.25, 0.75], [1.0]]}
    longer = {"words": [["good", "bad", "meh", "fine"]], "stars": [[1.0, 2.0, 3.0, 4.0]]}
    for features in (example, shorter):
        np.testing.assert_allclose(_served(path, features), _predicted(estimator, features),
                                   atol=1e-6)
    transform = json.load(open(os.path.join(path, "transform.json")))
    steps = {r.get("steps") for r in transform["records"] if r["kind"] == "sequence"}
    if model_fn is _gru_model_fn:
        assert steps == {3}
        from estimator import serving
        with pytest.raises(serving.RequestError, match="a sequence of 4 steps, where this "
                                                       "export takes at most 3"):
            _served(path, longer)
    else:
        assert steps == {None}
        np.testing.assert_allclose(_served(path, longer), _predicted(estimator, longer),
                                   atol=1e-6)


def test_an_export_needs_an_example_of_two_steps_or_more(tmp_path):
    estimator = est.Estimator(_mean_model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: _review_batches(), steps=1)
    one_step = {"words": [["good"], ["bad"]], "stars": [[1.0], [2.0]]}
    with pytest.raises(ValueError, match="a sequence of at least 2 steps"):
        estimator.export_saved_model(str(tmp_path / "export"),
                                     est.export.build_raw_serving_input_receiver_fn(one_step))


def test_a_parsing_export_of_an_rnn_serves_up_to_its_max_sequence_length(tmp_path):
    """A parsing receiver's examples are made up (2 values a VarLenFeature):
    a model fixing its steps needs max_sequence_length, then serves tf.Examples
    up to that long and refuses longer ones by name."""
    from estimator import serving
    from estimator.host_transform import example_of
    estimator = est.Estimator(_gru_model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: _review_batches(), steps=2)
    spec = fc.make_parse_example_spec(_COLUMNS)
    with pytest.raises(ValueError, match="max_sequence_length=N"):
        estimator.export_saved_model(str(tmp_path / "export"),
                                     est.export.build_parsing_serving_input_receiver_fn(spec))
    path = estimator.export_saved_model(str(tmp_path / "export"),
                                        est.export.build_parsing_serving_input_receiver_fn(
                                            spec, max_sequence_length=5))
    model = serving.Model(path)
    features = {"words": [["good", "bad", "meh"], ["fine", "good", "bad", "meh", "good"]],
                "stars": [[1.0, 2.0, 3.0], [0.5, 0.25, 1.0, 2.0, 1.5]]}
    body = {"instances": [{"b64": __import__("base64").b64encode(example_of(
        {"words": w, "stars": s}, spec)).decode()} for w, s in zip(*features.values())]}
    np.testing.assert_allclose(np.asarray(model.predict(body)["predictions"], np.float32),
                               _predicted(estimator, features), atol=1e-6)
    longer = {"instances": [{"b64": __import__("base64").b64encode(example_of(
        {"words": ["good"] * 6, "stars": [1.0] * 6}, spec)).decode()}]}
    with pytest.raises(serving.RequestError, match="a sequence of 6 steps, where this export "
                                                   "takes at most 5"):
        model.predict(longer)


def test_a_served_request_whose_columns_differ_in_length_is_told_so(tmp_path):
    estimator = est.Estimator(_mean_model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: _review_batches(), steps=1)
    example = {"words": [["good", "bad"], ["fine"]], "stars": [[1.0, 2.0], [4.0]]}
    path = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(example))
    from estimator import serving
    with pytest.raises(serving.RequestError, match="sequence lengths of the columns 'stars' "
                                                   "and 'words_embedding' differ"):
        _served(path, {"words": [["good", "bad"]], "stars": [[1.0]]})


def test_a_served_number_rows_input_refuses_strings(tmp_path):
    estimator = est.Estimator(_mean_model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: _review_batches(), steps=1)
    example = {"words": [["good", "bad"], ["fine"]], "stars": [[1.0, 2.0], [4.0]]}
    path = estimator.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(example))
    from estimator import serving
    with pytest.raises(serving.RequestError, match="'stars'.*not of expected type float32"):
        _served(path, {"words": [["good"]], "stars": [["high"]]})
    with pytest.raises(serving.RequestError, match="'stars'.*a list of values .* per example"):
        _served(path, {"words": [["good"]], "stars": [1.0]})


@pytest.mark.slow
def test_two_replicas_train_a_sequence_model_as_one_process(tmp_path):
    """Each replica's half of the batch has its own longest row (its own T);
    the packed LSTM makes that padding irrelevant: the weights equal one
    process's on the whole batches."""
    data = [(f, y) for f, y in _review_batches(batch_size=8) if len(y) == 8]
    halves = []
    for features, labels in data:
        for part in (slice(0, 4), slice(4, 8)):
            halves.append(({k: v[part] for k, v in features.items()}, labels[part]))
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=60))

    def model_fn(features, labels, mode):   # (no dropout: replicas draw their own masks)
        net, lengths = fc.sequence_input_layer(features, _COLUMNS)
        lstm = est.get_module("lstm", lambda: torch.nn.LSTM(5, 6, batch_first=True))
        head = est.get_module("head", lambda: torch.nn.Linear(6, 2))
        _, (h, _) = lstm(torch.nn.utils.rnn.pack_padded_sequence(
            net, lengths, batch_first=True, enforce_sorted=False))
        loss = torch.nn.functional.cross_entropy(head(h[-1]), labels)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.5)))

    two = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "two"), tf_random_seed=1, train_distribute=strategy))
    two.train(lambda: halves, steps=len(data))
    one = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "one"), tf_random_seed=1))
    one.train(lambda: data, steps=len(data))
    names = [n for n in one.get_variable_names() if n != "global_step"]
    assert "sequence_input_layer/words_embedding/embedding_weights" in names
    for name in names:
        np.testing.assert_allclose(two.get_variable_value(name), one.get_variable_value(name),
                                   atol=2e-6, err_msg=name)
    start = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "start"), tf_random_seed=1))
    start.train(lambda: data, steps=1)
    moved = start.get_variable_value("sequence_input_layer/words_embedding/embedding_weights")
    assert not np.allclose(moved, one.get_variable_value(
        "sequence_input_layer/words_embedding/embedding_weights"))   # (it trained)
