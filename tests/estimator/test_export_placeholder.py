"""`est.export.placeholder(dtype, [None, None])`, TF's placeholder with a
dimension of any size past the batch: a text classifier (embedding,
convolution, max over time, TF2's BinaryClassHead) trained on padded token
ids exports once and serves sentences of any length, as TF's SavedModel
does from ``tf.placeholder(tf.int64, [None, None])``."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from estimator import serving

VOCAB = 20


def text_rows(n, seed):
    """Token ids padded with 0 to the longest of each batch of 8 (lengths 3 to
    12), a mask, and the label: whether token 7 occurs."""
    rng = np.random.default_rng(seed)
    batches = []
    for start in range(0, n, 8):
        lengths = rng.integers(3, 13, min(8, n - start))
        ids = np.zeros((len(lengths), lengths.max()), np.int64)
        for row, length in enumerate(lengths):
            ids[row, :length] = rng.integers(1, VOCAB, length)
        mask = (ids > 0).astype(np.float32)
        batches.append(({"ids": torch.from_numpy(ids), "mask": torch.from_numpy(mask)},
                        torch.from_numpy((ids == 7).any(1).astype(np.int64))))
    return batches


class TextCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.conv = torch.nn.Conv1d(8, 16, 3, padding=1)
        self.drop = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, ids, mask):
        h = self.embed(ids) * mask.unsqueeze(-1)
        h = torch.relu(self.conv(h.transpose(1, 2))) + (mask.unsqueeze(1) - 1) * 1e4
        return self.out(self.drop(h.amax(2)))


def model_fn(features, labels, mode):
    net = est.get_module("text", TextCNN)
    return est.BinaryClassHead().create_estimator_spec(
        features, mode, net(features["ids"], features["mask"]), labels,
        optimizer=est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.02)))


def per_token_model_fn(features, labels, mode):
    """Predicts per token too ([batch, length]), beside the sentence."""
    if mode != est.ModeKeys.PREDICT:
        return model_fn(features, labels, mode)
    net = est.get_module("text", TextCNN)
    return est.EstimatorSpec(mode, predictions={
        "logistic": torch.sigmoid(net(features["ids"], features["mask"])),
        "token_norm": net.embed(features["ids"]).norm(dim=-1)})


def serving_input_fn():
    return est.export.build_raw_serving_input_receiver_fn({
        "ids": est.export.placeholder(torch.int64, [None, None], name="ids"),
        "mask": est.export.placeholder(torch.float32, [None, None])})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("text"))
    estimator = est.Estimator(per_token_model_fn, model_dir=model_dir)
    estimator.train(lambda: text_rows(400, 0) * 3)
    return estimator


def test_a_text_model_serves_sentences_of_any_length(trained, tmp_path):
    export_dir = trained.export_saved_model(str(tmp_path / "export"), serving_input_fn())
    with open(os.path.join(export_dir, "signature.json"), encoding="utf-8") as f:
        signature = json.load(f)
    assert {i["name"]: i["shape"] for i in signature["inputs"]} == {
        "ids": [None, None], "mask": [None, None]}
    outputs = {o["name"]: o["shape"] for o in signature["outputs"]}
    assert outputs["logistic"] == [None, 1] and outputs["token_norm"] == [None, None]
    served = est.export.load(export_dir)
    for features, _ in text_rows(24, 1) + [({"ids": torch.tensor([[7, 3]]),
                                             "mask": torch.ones(1, 2)}, None)]:
        expected = list(trained.predict(lambda f=features: [f], yield_single_examples=False))[0]
        got = served.signatures["serving_default"](**features)
        assert features["ids"].shape[1] in range(2, 13)
        np.testing.assert_allclose(got["logistic"].numpy(), expected["logistic"], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(got["token_norm"].numpy(), expected["token_norm"],
                                   rtol=1e-5)
    accuracy = trained.evaluate(lambda: text_rows(80, 2))["accuracy"]
    assert accuracy > 0.8
    # TF Serving's REST form, through `estimator serve`'s model
    model = serving.Model(export_dir)
    answer = model.predict({"instances": [{"ids": [7, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13],
                                           "mask": [1.0] * 13}]})
    assert len(answer["predictions"]) == 1
    with pytest.raises(serving.RequestError, match=r"input 'mask': expected shape "
                                                   r"\['batch', 'any'\] per request, got \[1\]"):
        model.predict({"inputs": {"ids": [[1, 2]], "mask": [1.0]}})


def test_without_a_placeholder_the_length_stays_the_examples(trained, tmp_path):
    export_dir = trained.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(
            {"ids": torch.zeros(1, 8, dtype=torch.int64), "mask": torch.ones(1, 8)}))
    served = est.export.load(export_dir)
    served.signatures["serving_default"](ids=torch.ones(3, 8, dtype=torch.int64),
                                         mask=torch.ones(3, 8))
    with pytest.raises(TypeError, match=r"input 'ids' has shape \[3, 5\], where the signature "
                                        r"takes \[None, 8\]"):
        served.signatures["serving_default"](ids=torch.ones(3, 5, dtype=torch.int64),
                                             mask=torch.ones(3, 5))


def test_a_loaded_signature_takes_numpy_and_lists_as_tfs_and_names_what_does_not_fit(
        trained, tmp_path):
    """TF's signature functions convert numpy and lists to their specs'
    dtypes; here numpy failed inside torch's guards ("'int' object is not
    callable"), a float64 tensor in a matmul (attack probe)."""
    export_dir = trained.export_saved_model(
        str(tmp_path / "export"), est.export.build_raw_serving_input_receiver_fn(
            {"ids": torch.zeros(1, 8, dtype=torch.int64), "mask": torch.ones(1, 8)}))
    signature = est.export.load(export_dir).signatures["serving_default"]
    ids, mask = torch.arange(24).reshape(3, 8) % VOCAB, torch.ones(3, 8)
    want = signature(ids=ids, mask=mask)["logistic"]
    for given in ({"ids": ids.numpy(), "mask": mask.numpy().astype(np.float64)},
                  {"ids": ids.tolist(), "mask": mask.tolist()}):
        torch.testing.assert_close(signature(**given)["logistic"], want)
    with pytest.raises(TypeError, match="input 'mask' was expected to be a float32 tensor but "
                                        "is a float64 tensor"):
        signature(ids=ids, mask=mask.double())
    with pytest.raises(TypeError, match=r"the signature takes the inputs \['ids', 'mask'\], "
                                        r"got \['ids', 'masks'\]"):
        signature(ids=ids, masks=mask)
    for bad, problem in (([[1.5] * 8] * 3, "a fraction, NaN or infinity"),   # (truncated, or
                         (np.full((3, 8), 1e19), "a number outside")):       # wrapped: attack)
        with pytest.raises(TypeError, match=f"input 'ids' \\(int64\\) cannot hold its values "
                                            f"without loss: {problem}"):
            signature(ids=bad, mask=mask)
    with pytest.raises(TypeError, match="input 'mask' \\(float32\\) cannot hold its values "
                                        "without loss: a number past float32's range"):
        signature(ids=ids, mask=np.full((3, 8), 1e39))


def test_a_model_that_fixes_a_dimension_of_any_size_is_named(tmp_path):
    def fixed_length(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(8, 1))
        logits = net(features["x"].reshape(-1, 8))   # a length of 8, no other
        return est.BinaryClassHead().create_estimator_spec(
            features, mode, logits, labels, optimizer=est.get_optimizer(
                lambda p: torch.optim.SGD(p, lr=0.1)))
    estimator = est.Estimator(fixed_length, model_dir=str(tmp_path))
    estimator.train(lambda: [({"x": torch.ones(4, 8)}, torch.ones(4, dtype=torch.int64))])
    with pytest.raises(ValueError, match=r"A placeholder's dimension given as None \(x "
                                         r"dimension 1\) must stay of any size"):
        estimator.export_saved_model(str(tmp_path / "export"),
                                     est.export.build_raw_serving_input_receiver_fn(
                                         {"x": est.export.placeholder(shape=[None, None])}))
    assert not os.path.exists(tmp_path / "export") or not os.listdir(tmp_path / "export")


def test_beside_string_inputs_a_dimension_of_any_size_is_refused(trained, tmp_path):
    with pytest.raises(ValueError, match=r"receiver_tensors \['ids'\]: a placeholder's "
                                         r"dimensions of any size past the batch are not "
                                         r"exported with string or tf.Example inputs"):
        trained.export_saved_model(str(tmp_path), est.export.build_raw_serving_input_receiver_fn(
            {"ids": est.export.placeholder(torch.int64, [None, None]),
             "word": np.array(["a", "b"])}))


@pytest.mark.parametrize("args, error", [
    ({"shape": None}, "placeholder: give a shape, a list with None for a dimension of any size"),
    ({"shape": []}, r"placeholder: a serving input needs a batch dimension, got shape \[\]"),
    ({"shape": [None, 0]}, r"placeholder: shape\[1\] must be None or a positive int, got 0"),
    ({"shape": [None, "n"]}, r"placeholder: shape\[1\] must be None or a positive int, "
                             r"got 'n'"),
    ({"dtype": "tf.string", "shape": [None]}, "placeholder: dtype must be a torch.dtype "
                                              r"\(torch.float32, torch.int64, ...\), a numeric "
                                              r"numpy one, or str \(TF's tf.string\), got "
                                              "'tf.string'"),
    ({"dtype": str, "shape": [None, None]}, "placeholder: a string input's dimensions past the "
                                            "batch are given sizes"),
    ({"dtype": None, "shape": [None]}, "placeholder: dtype must be a torch.dtype"),
    ({"dtype": object, "shape": [None]}, "placeholder: dtype must be a torch.dtype"),
    ({"dtype": int, "shape": [None]}, "placeholder: dtype must be a torch.dtype"),   # (TF too)
])
def test_bad_placeholders_are_named(args, error):
    with pytest.raises(ValueError, match=error):
        est.export.placeholder(**args)


def test_a_placeholder_is_zeros_of_its_shape_with_the_batch_at_two_rows():
    t = est.export.placeholder(torch.int64, [None, None, 3])
    assert t.dtype == torch.int64 and t.shape == (2, 8, 3) and not t.any()
    assert est.export.placeholder(shape=[5, 4]).shape == (5, 4)


@pytest.mark.parametrize("dtype, expected", [
    (np.float32, torch.float32), (np.int64, torch.int64), ("int32", torch.int32),
    (np.dtype("float64"), torch.float64), (np.bool_, torch.bool), (np.dtype(">f4"), torch.float32),
    (float, torch.float32), (bool, torch.bool)])
def test_a_placeholder_takes_numpy_dtypes_as_tf(dtype, expected):
    """`tf.compat.v1.placeholder(np.float32, ...)` ports as it is (it was an
    error), Python's types as TF's `as_dtype` takes them (`float`: float32)."""
    assert est.export.placeholder(dtype, [None, 2]).dtype == expected


@pytest.mark.parametrize("canned", ["linear", "dnn"])
def test_integer_ids_for_a_categorical_column_export_from_a_tensor_as_tf(tmp_path, canned):
    """Canned estimators on an integer identity column (padded word ids, -1
    padding): the port of TF's `placeholder(tf.int64, [None, 5])` as a tensor
    exports, as in TF, and serves predict's logits for a tensor, an array or
    rows; the columns' host work (ids read with numpy) runs before the program,
    as for strings. It used to fail (torch.export cannot trace numpy), the
    error's hint naming the batch size."""
    column = est.feature_column.categorical_column_with_identity("x", 10)
    rng = np.random.RandomState(0)
    x = rng.randint(0, 10, (32, 5))
    x[::3, 3:] = -1   # padding: no id
    if canned == "linear":
        e = est.LinearClassifier([column], model_dir=str(tmp_path / "m"))
    else:
        e = est.DNNClassifier([8], [est.feature_column.embedding_column(column, 4)],
                              model_dir=str(tmp_path / "m"), dropout=0.5)
    e.train(lambda: [({"x": x}, (x[:, 0] > 4).astype(np.int64))] * 3, steps=3)
    expected = np.stack([p["logits"] for p in e.predict(lambda: [{"x": x[:7]}])])
    for example in (torch.zeros(1, 5, dtype=torch.int64), torch.as_tensor(x[:4])):
        export_dir = e.export_saved_model(str(tmp_path / "e"),
                                          est.export.build_raw_serving_input_receiver_fn(
                                              {"x": example}))
        loaded = est.export.load(export_dir)
        assert loaded.signature["inputs"] == [{"name": "x", "dtype": "int64",
                                               "shape": [None, 5]}]
        for given in (torch.as_tensor(x[:7]), x[:7], x[:1]):
            served = loaded.signatures["predict"](x=given)["logits"].numpy()
            np.testing.assert_allclose(served, expected[:len(given)], rtol=1e-5, atol=1e-6)
    rows = e.export_saved_model(str(tmp_path / "e"),
                                est.export.build_raw_serving_input_receiver_fn(
                                    {"x": [[0, 1, 2, 3, 4]]}))
    served = est.export.load(rows).signatures["predict"](x=x[:7].tolist())["logits"].numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)


def test_host_code_in_model_fn_that_no_column_does_says_so(tmp_path):
    """model_fn reading a tensor's values with numpy cannot be traced; the
    error says so (not the batch size)."""
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        x = torch.as_tensor(features["x"].numpy() * 2)
        logits = net(x)
        return est.EstimatorSpec(mode, predictions={"y": logits},
                                 loss=logits.mean() if labels is not None else None,
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    e.train(lambda: [({"x": torch.ones(4, 3)}, torch.ones(4, 1))], steps=1)
    with pytest.raises(ValueError, match=r"torch.export could not trace.*computes on a "
                       r"tensor's values") as raised:
        e.export_saved_model(str(tmp_path / "e"), est.export.build_raw_serving_input_receiver_fn(
            {"x": torch.zeros(2, 3)}))
    assert "batch size" not in str(raised.value)


def test_a_receiver_naming_features_otherwise_than_training_says_so(tmp_path):
    """It was a bare KeyError('x') from deep in model_fn; the hint is worded
    for a KeyError model_fn raises for another reason too."""
    def model_fn(features, labels, mode, params):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        if params.get("fail"):
            raise KeyError("a lookup of the user's own")
        logits = net(features["x"])
        return est.EstimatorSpec(mode, predictions={"y": logits},
                                 loss=logits.mean() if labels is not None else None,
                                 train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    e.train(lambda: [({"x": torch.ones(4, 3)}, torch.ones(4, 1))], steps=1)
    receiver = est.export.build_raw_serving_input_receiver_fn({"inputs": torch.zeros(2, 3)})
    failing = est.Estimator(model_fn, model_dir=str(tmp_path / "m"), params={"fail": True})
    for estimator, key in ((e, "'x'"), (failing, '"a lookup of the user\'s own"')):
        with pytest.raises(KeyError) as raised:
            estimator.export_saved_model(str(tmp_path / "e"), receiver)
        assert str(raised.value) == (
            f"model_fn's PREDICT path raised KeyError({key}); the serving_input_receiver_fn's "
            f"features are ['inputs']. If {key} is a feature, the receiver must name its "
            "features as the training input_fn names them")
    assert not os.path.exists(tmp_path / "e")


class MaskedEncoder(torch.nn.Module):
    """A transformer encoder over token ids with a padding mask (0 is padding),
    mean-pooled: torch's nested-tensor fast path cannot run a sequence that
    is all padding, which zeros are (the export runs it without that path)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8, padding_idx=0)
        layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 1)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, ids):
        pad = ids == 0
        h = self.encoder(self.embed(ids), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.out((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def masked_model_fn(features, labels, mode):
    net = est.get_module("encoder", MaskedEncoder)
    return est.BinaryClassHead().create_estimator_spec(
        features, mode, net(features["ids"]), labels,
        optimizer=est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.02)))


def _ids_receiver(fill_value):
    return est.export.build_raw_serving_input_receiver_fn(
        {"ids": est.export.placeholder(torch.int64, [None, None], fill_value=fill_value)})


@pytest.mark.parametrize("fill_value", [0, 1])
def test_a_padding_mask_model_exports_from_a_placeholder(tmp_path, fill_value):
    """Zeros are all padding: the export's run of the PREDICT path (torch's
    nested-tensor fast path, off since the export watches for dropout) and
    its trace take them; the served model equals predict."""
    e = est.Estimator(masked_model_fn, str(tmp_path / "m"))
    rows = text_rows(32, 0)
    e.train(lambda: [(f, y) for f, y in rows], steps=4)
    path = e.export_saved_model(str(tmp_path / "e"), _ids_receiver(fill_value))
    ids = rows[0][0]["ids"]
    want = np.stack([p["logistic"] for p in e.predict(lambda: [{"ids": ids}])])
    got = est.export.load(path).signatures["predict"](ids=ids)["logistic"]
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    assert est.export.placeholder(torch.int64, [None, 3], fill_value=1).eq(1).all()


class PackedGRU(torch.nn.Module):
    """A GRU over the ids' packed lengths (0 is padding): a sequence of zero
    length cannot be packed."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8, padding_idx=0)
        self.gru = torch.nn.GRU(8, 4, batch_first=True)
        self.out = torch.nn.Linear(4, 1)

    def forward(self, ids):
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            self.embed(ids), (ids != 0).sum(1).cpu(), batch_first=True, enforce_sorted=False)
        return self.out(self.gru(packed)[1][-1])


def test_a_path_failing_on_a_placeholders_zeros_says_so(tmp_path):
    """The export runs the PREDICT path on the placeholder's values: zeros,
    all padding here, failed inside torch ("Length of all samples has to be
    greater than 0") without a word about the export. The error now says
    what ran on what, and to trace with fill_value=1."""
    def model_fn(features, labels, mode):
        return est.BinaryClassHead().create_estimator_spec(
            features, mode, est.get_module("gru", PackedGRU)(features["ids"]), labels,
            optimizer=est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.02)))
    e = est.Estimator(model_fn, str(tmp_path / "m"))
    e.train(lambda: [(f, y) for f, y in text_rows(8, 0)], steps=1)
    with pytest.raises(RuntimeError, match="has to be greater than 0") as raised:
        e.export_saved_model(str(tmp_path / "zeros"), _ids_receiver(0))
    assert "ids all zeros" in "".join(getattr(raised.value, "__notes__", []))
    assert "fill_value=1" in "".join(raised.value.__notes__)


class UnpackedInPredictGRU(PackedGRU):
    """PackedGRU trained packed, run in PREDICT on the padded batch: its
    last state the output at `lengths - 1` (padding at the end)."""

    def forward(self, ids, packed=True):
        if packed:
            return super().forward(ids)
        lengths = (ids != 0).sum(1)
        outputs, _ = self.gru(self.embed(ids))
        at = (lengths - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, outputs.shape[2])
        return self.out(outputs.gather(1, at).squeeze(1))


def test_a_packed_sequence_says_it_cannot_be_exported_and_the_padded_run_serves_as_packed(
        tmp_path):
    """At a fixed length and fill_value=1 the packed GRU failed the export
    blaming `.numpy()`/`.item()` the model never called (quickdraw port)."""
    def model_fn(features, labels, mode, params):
        net = est.get_module("gru", UnpackedInPredictGRU)
        logits = net(features["ids"], packed=params["packed"] or mode != est.ModeKeys.PREDICT)
        return est.BinaryClassHead().create_estimator_spec(
            features, mode, logits, labels,
            optimizer=est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.02)))
    rows = text_rows(16, 0)
    receiver = est.export.build_raw_serving_input_receiver_fn(
        {"ids": est.export.placeholder(torch.int64, [None, 12], fill_value=1)})
    packed = est.Estimator(model_fn, str(tmp_path / "m"), params={"packed": True})
    packed.train(lambda: [(f, y) for f, y in rows], steps=2)
    with pytest.raises(ValueError, match=r"packs a sequence \(pack_padded_sequence\), which "
                                         r"torch.export cannot trace at any size"):
        packed.export_saved_model(str(tmp_path / "e"), receiver)
    ids = torch.zeros(8, 12, dtype=torch.int64)
    ids[:, :rows[0][0]["ids"].shape[1]] = rows[0][0]["ids"]
    want = np.stack([p["logistic"] for p in packed.predict(lambda: [{"ids": ids}])])
    padded = est.Estimator(model_fn, str(tmp_path / "m"), params={"packed": False})
    path = padded.export_saved_model(str(tmp_path / "e"), receiver)
    got = est.export.load(path).signatures["predict"](ids=ids)["logistic"]
    np.testing.assert_allclose(got.numpy(), want, atol=1e-6)
