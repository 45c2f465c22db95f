"""tf.SequenceExample parsing against TensorFlow: TF 2.15's
`parse_single_sequence_example` and `parse_sequence_example` results (and
refusals) on the same records, recorded by
``tests/support/fixtures/record_tf_sequence_example.py``; TF is not needed
here."""
import base64
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_sequence_example.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
DTYPES = {"string": str, "int64": torch.int64, "float32": torch.float32}
# What our refusal says of each case TF refuses (TF's words where it has clear ones).
REFUSALS = {
    "single_missing_not_allowed": "Feature list 'tokens' is required but could not be found",
    "batch_missing_not_allowed": "Feature list 'tokens' is required but could not be found",
    "single_required_context_missing": "Feature: id (data type: int64) is required",
    "batch_required_context_missing": "Feature: id (data type: int64) is required",
    "single_wrong_count": "Total values size: 5 is not consistent with output shape",
    "batch_wrong_count": "Total values size: 5 is not consistent with output shape",
    "single_misaligned": "Key: frames, Index: 0. Number of values != expected. values size: 1",
    "single_empty_frame": "Key: tokens, Index: 1. Number of values != expected. values size: 0",
    "single_no_list_frame": "Key: tokens, Index: 1. Number of values != expected",
    "single_two_values_a_frame": "Key: tokens, Index: 0. Number of values != expected",
    "single_wrong_type": "Feature list: tokens, Index: 1. Data types don't match",
    "single_wrong_type_varlen": "Feature list: tokens, Index: 1. Data types don't match",
    "single_wrong_context_type": "Key: id, Index: 0. Data types don't match",
    "single_padding_default": "Value feature_list.dense_defaults[frames] must be None",
    "batch_padding_default": "Value feature_list.dense_defaults[frames] must be None",
    "single_sequence_spec_in_context": "Unsupported FixedLenSequenceFeature",
    "single_fixed_spec_in_sequence": "Unsupported FixedLenFeature",
}


def _feature(kind, values):
    if kind == "none":
        return est.io.Feature()
    if kind == "bytes":
        return est.io.Feature(bytes_list=est.io.BytesList(value=[v.encode() for v in values]))
    if kind == "float":
        return est.io.Feature(float_list=est.io.FloatList(value=values))
    return est.io.Feature(int64_list=est.io.Int64List(value=values))


def _record(name) -> bytes:
    spec = TF["examples"][name]
    return est.io.SequenceExample(
        context=est.io.Features(feature={k: _feature(*v) for k, v in spec["context"].items()}),
        feature_lists=est.io.FeatureLists(feature_list={
            k: est.io.FeatureList(feature=[_feature(*f) for f in frames])
            for k, frames in spec["lists"].items()})).SerializeToString()


def _spec(entry):
    kind, shape, dtype = entry[0], entry[1], DTYPES[entry[2]]
    if kind == "fixed":
        return est.io.FixedLenFeature(shape, dtype, default_value=entry[3])
    if kind == "varlen":
        return est.io.VarLenFeature(dtype)
    return est.io.FixedLenSequenceFeature(shape, dtype, allow_missing=entry[3],
                                          default_value=entry[4])


def _parse(case):
    context = {k: _spec(case["changes"].get("ctx:" + k, TF["context"].get(k)))
               for k in case["context_keys"]}
    sequence = {k: _spec(case["changes"].get(k, TF["sequence"].get(k)))
                for k in case["sequence_keys"]}
    records = [_record(name) for name in case["examples"]]
    if case["function"] == "single":
        parsed_context, parsed_lists = est.io.parse_single_sequence_example(
            records[0], context_features=context, sequence_features=sequence)
        return parsed_context, parsed_lists, {}, context, sequence
    return (*est.io.parse_sequence_example(records, context_features=context,
                                           sequence_features=sequence), context, sequence)


def _sparse(nested, depth):
    """Our nested lists (VarLenFeature: a list of values; in a feature list
    a list of frames; batched, a list of those) as TF's SparseTensor."""
    indices, values, shape = [], [], [0] * depth

    def walk(node, at):
        if len(at) == depth - 1:
            for j, value in enumerate(node):
                indices.append(at + [j])
                values.append(value.decode() if isinstance(value, bytes) else value)
            shape[-1] = max(shape[-1], len(node))
            return
        shape[len(at)] = max(shape[len(at)], len(node))
        for i, child in enumerate(node):
            walk(child, at + [i])
    walk(nested, [])
    return {"indices": indices, "values": values, "dense_shape": shape}


def _same(ours, tf_value, spec, batched, in_list):
    if "indices" in tf_value:
        assert isinstance(spec, est.io.VarLenFeature)
        depth = 1 + int(batched) + int(in_list)
        mine = _sparse(ours, depth)
        assert mine["indices"] == tf_value["indices"]
        assert mine["dense_shape"] == tf_value["dense_shape"]
        assert mine["values"] == pytest.approx(tf_value["values"]) if mine["values"] and \
            not isinstance(mine["values"][0], str) else mine["values"] == tf_value["values"]
        return
    ours = np.asarray(ours)
    assert list(ours.shape) == tf_value["shape"]
    flat = [v.decode() if isinstance(v, bytes) else v for v in ours.reshape(-1).tolist()]
    if tf_value["dtype"] in ("float32", "int64"):
        assert ours.dtype == np.dtype(tf_value["dtype"])
        np.testing.assert_array_equal(np.asarray(flat, dtype=ours.dtype),
                                      np.asarray(tf_value["values"], dtype=ours.dtype))
    else:   # strings: bytes in object arrays, as TF's
        assert flat == tf_value["values"]


@pytest.mark.parametrize("name", sorted(n for n, c in TF["cases"].items()
                                        if "error" not in c["result"]))
def test_parsed_as_tf_parses(name):
    case = TF["cases"][name]
    expected = case["result"]
    context, lists, lengths, context_specs, sequence_specs = _parse(case)
    batched = case["function"] == "batch"
    assert sorted(context) == sorted(expected["context"])
    assert sorted(lists) == sorted(expected["lists"])
    assert sorted(lengths) == sorted(expected["lengths"])
    for key, value in expected["context"].items():
        _same(context[key], value, context_specs[key], batched, False)
    for key, value in expected["lists"].items():
        _same(lists[key], value, sequence_specs[key], batched, True)
    for key, value in expected["lengths"].items():
        _same(lengths[key], value, None, batched, False)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refused_as_tf_refuses(name):
    case = TF["cases"][name]
    assert "error" in case["result"], name   # TF refused it too
    with pytest.raises(ValueError) as caught:
        _parse(case)
    assert REFUSALS[name] in str(caught.value)
    if case["function"] == "batch" and "Index" in REFUSALS[name]:
        assert "example 1" in str(caught.value)   # which record


def test_every_recorded_refusal_is_covered():
    refused = {n for n, c in TF["cases"].items() if "error" in c["result"]}
    # TF 2.15 refuses an empty batch with a required context feature
    # ("Inconsistent max number of elements for feature id"): none is missing
    # there, so ours gives empty results (below).
    assert refused - set(REFUSALS) == {"batch_none"}


def test_an_empty_batch_gives_empty_results():
    context, lists, lengths, _, _ = _parse(TF["cases"]["batch_none"])
    assert context["id"].shape == (0,) and context["tags"] == []
    assert lists["tokens"].shape == (0, 0) and lists["words"] == []
    assert lengths["tokens"].shape == (0,)


@pytest.mark.parametrize("name", sorted(TF["serialized"]))
def test_records_are_tfs_messages(name):
    """TF's bytes read as the message written here (their maps' order on
    the wire is protobuf's to choose)."""
    recorded = est.io.SequenceExample.FromString(base64.b64decode(TF["serialized"][name]))
    assert recorded == est.io.SequenceExample.FromString(_record(name))
    assert recorded.feature_lists.feature_list["tokens"].feature or name not in (
        "full", "short")


def test_junk_and_a_single_record_for_a_batch_are_refused():
    with pytest.raises(ValueError, match="example 1 is not a serialized tf.SequenceExample"):
        est.io.parse_sequence_example([_record("full"), b"\xff\xff junk"], {},
                                      {"words": est.io.VarLenFeature(str)})
    with pytest.raises(ValueError, match="takes a batch"):
        est.io.parse_sequence_example(_record("full"), {}, {})
    with pytest.raises(ValueError, match="at least one should have values"):   # (TF's)
        est.io.parse_single_sequence_example(_record("full"))


def test_a_sequence_model_trains_on_tfrecord_sequence_examples(tmp_path):
    """The user's path: SequenceExamples in a TFRecord file, read and parsed
    in a DataLoader, an LSTM over the padded frames with their lengths."""
    path = str(tmp_path / "seq.tfrecord")
    rng = np.random.RandomState(0)
    with est.io.TFRecordWriter(path) as writer:
        for i in range(10):
            frames = rng.randint(1, 5)
            label = i % 2
            writer.write(est.io.SequenceExample(
                context=est.io.Features(feature={
                    "label": est.io.Feature(int64_list=est.io.Int64List(value=[label]))}),
                feature_lists=est.io.FeatureLists(feature_list={"x": est.io.FeatureList(
                    feature=[est.io.Feature(float_list=est.io.FloatList(
                        value=[float(label), rng.rand()])) for _ in range(frames)])})
            ).SerializeToString())
    context_spec = {"label": est.io.FixedLenFeature([], torch.int64)}
    sequence_spec = {"x": est.io.FixedLenSequenceFeature([2], torch.float32)}

    def collate(records):
        context, lists, lengths = est.io.parse_sequence_example(
            records, context_spec, sequence_spec)
        return ({"x": torch.from_numpy(lists["x"]), "length": torch.from_numpy(lengths["x"])},
                torch.from_numpy(context["label"]))

    def input_fn(epochs=1):
        loader = torch.utils.data.DataLoader(est.data.TFRecordDataset(path), batch_size=4,
                                             collate_fn=collate)
        return (batch for _ in range(epochs) for batch in loader)

    seen = []

    def model_fn(features, labels, mode):
        lstm = est.get_module("lstm", lambda: torch.nn.LSTM(2, 4, batch_first=True))
        head = est.get_module("head", lambda: torch.nn.Linear(4, 2))
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            features["x"], features["length"], batch_first=True, enforce_sorted=False)
        _, (h, _) = lstm(packed)
        logits = head(h[-1])
        seen.append(tuple(features["x"].shape))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return est.EstimatorSpec(
            mode, loss=loss,
            train_op=est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.05)),
            eval_metric_ops={"accuracy": est.metrics.accuracy(labels, logits.argmax(1))})

    estimator = est.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(lambda: input_fn(epochs=10), steps=30)
    metrics = estimator.evaluate(input_fn)
    assert metrics["global_step"] == 30
    assert metrics["accuracy"] == 1.0   # the label is in every frame
    assert seen[0][0] == 4 and seen[0][2] == 2   # [batch, longest, 2]
