"""Reading TensorFlow checkpoints without TensorFlow: checkpoints written by
TF 2.15 (three canned estimators, a TF1 Saver checkpoint with a partitioned
variable and several dtypes, a TF2 object-based checkpoint), recorded by
``tests/support/fixtures/record_tf_checkpoints.py`` with TF's own reading of
every variable; and the damaged-file errors."""
import json
import os
import shutil

import numpy as np
import pytest

from estimator import checkpoint
from hooks.tf_checkpoint import CorruptCheckpointError, TFCheckpointReader, find_prefix
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_ckpt", "tf_checkpoints.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
GROUPS = {"saver": TF["saver"], "object": TF["object"], "sharded": TF["sharded"],
          **TF["canned"]}
with open(os.path.join(FIXTURES, "tf_checkpoint_dtypes.json"), encoding="utf-8") as _f:
    DTYPES = json.load(_f)   # (record_tf_checkpoint_dtypes.py)


def _prefix(group):
    if group == "dtypes":
        return os.path.join(FIXTURES, DTYPES["dtypes"]["prefix"])
    return os.path.join(FIXTURES, GROUPS[group]["prefix"])


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_names_shapes_and_values_equal_tfs(group):
    reader = TFCheckpointReader(_prefix(group))
    recorded = GROUPS[group]["variables"]
    assert {n: (d, list(s)) for n, (d, s) in reader.variables().items()} == \
        {n: (r["dtype"], r["shape"]) for n, r in recorded.items()}
    for name, r in recorded.items():
        if r["dtype"] == "string":
            continue
        value = reader.tensor(name)
        assert value.dtype.name == r["dtype"], name
        if "value" in r:
            np.testing.assert_array_equal(value, np.array(r["value"], dtype=r["dtype"]),
                                          err_msg=name)
        else:
            assert float(value.astype(np.float64).sum()) == pytest.approx(r["sum"], rel=1e-6)


def test_a_sharded_checkpoint_reads_from_both_data_files():
    assert TF["sharded"]["shards"] == ["model.ckpt.data-00000-of-00002",
                                       "model.ckpt.data-00001-of-00002"]
    reader = TFCheckpointReader(_prefix("sharded"))
    assert reader.tensor("a").tolist() == [0.0, 1.0, 2.0, 3.0]
    assert reader.tensor("b").tolist() == [0, 1, 2]


def test_partitioned_variable_is_reassembled():
    reader = TFCheckpointReader(_prefix("saver"))
    part = np.array(TF["saver"]["variables"]["part"]["value"], np.float32)
    np.testing.assert_array_equal(reader.tensor("part"), part)
    assert reader.tensor("part").shape == (7, 2)


def test_checkpoint_functions_take_a_tf_model_dir_or_prefix():
    model_dir = os.path.dirname(_prefix("dnn"))
    assert find_prefix(model_dir) == _prefix("dnn")
    assert checkpoint.latest_checkpoint(model_dir) == _prefix("dnn")
    listed = dict((n, s) for n, s in checkpoint.list_variables(model_dir))
    assert listed["dnn/hiddenlayer_0/kernel"] == [17, 8]
    np.testing.assert_array_equal(
        checkpoint.load_variable(_prefix("dnn"), "dnn/logits/bias"),
        np.array(TF["canned"]["dnn"]["variables"]["dnn/logits/bias"]["value"], np.float32))
    with pytest.raises(ValueError, match=r"'dnn/logits/kernl' is not in TF checkpoint .*"
                                         r"closest names: \['dnn/logits/kernel'"):
        checkpoint.load_variable(model_dir, "dnn/logits/kernl")


def _copy(tmp_path, group="saver"):
    src = os.path.dirname(_prefix(group))
    dst = tmp_path / group
    shutil.copytree(src, dst)
    return str(dst / os.path.basename(_prefix(group)))


def test_a_corrupt_shard_names_the_variable_and_file(tmp_path):
    prefix = _copy(tmp_path)
    shard = prefix + ".data-00000-of-00001"
    data = bytearray(open(shard, "rb").read())
    data[0] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    reader = TFCheckpointReader(prefix)
    bad = []
    for name in reader.variables():
        try:
            reader.tensor(name)
        except CorruptCheckpointError as e:
            assert shard in str(e) and "CRC mismatch" in str(e)
            bad.append(name)
    assert len(bad) == 1


def test_a_missing_shard_and_a_truncated_index_are_named(tmp_path):
    prefix = _copy(tmp_path)
    os.remove(prefix + ".data-00000-of-00001")
    with pytest.raises(CorruptCheckpointError, match=r"data-00000-of-00001: no such file"):
        TFCheckpointReader(prefix).tensor("f64")
    prefix = _copy(tmp_path, "dnn")
    index = prefix + ".index"
    open(index, "r+b").truncate(os.path.getsize(index) - 10)
    with pytest.raises(CorruptCheckpointError, match=rf"{index}: not a TF checkpoint index, "
                                                     "or truncated"):
        TFCheckpointReader(prefix)
    prefix = _copy(tmp_path, "linear")
    data = bytearray(open(prefix + ".index", "rb").read())
    data[20] ^= 0x01
    open(prefix + ".index", "wb").write(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="corrupted block at offset 0"):
        TFCheckpointReader(prefix)


def test_estimator_inspect_reads_a_tf_model_dir(capsys):
    from estimator.experiment import cli
    model_dir = os.path.dirname(_prefix("wide_deep"))
    assert cli.main(["inspect", model_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["latest"] == _prefix("wide_deep")
    assert report["checkpoints"][0]["step"] == 20
    names = {v["name"]: v["shape"] for v in report["variables"]}
    assert names["linear/linear_model/education_X_occupation/weights"] == [100, 1]


def test_estimator_inspect_reads_a_tf2_checkpoint_managers_dir(tmp_path, capsys):
    """tf.train.CheckpointManager's index holds `last_preserved_timestamp`
    (TF's CheckpointState): inspect crashed on it with a traceback."""
    from estimator.experiment import cli
    for ext in (".index", ".data-00000-of-00001"):
        shutil.copy(_prefix("object") + ext, tmp_path / ("ckpt-2" + ext))
    # as TF 2.15's CheckpointManager(max_to_keep=2) writes it after two saves
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-2"\n'
        'all_model_checkpoint_paths: "ckpt-1"\n'
        'all_model_checkpoint_paths: "ckpt-2"\n'
        "all_model_checkpoint_timestamps: 1795724711.6111345\n"
        "all_model_checkpoint_timestamps: 1795724711.6170962\n"
        "last_preserved_timestamp: 1795724710.5924592\n")
    assert cli.main(["inspect", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["latest"] == str(tmp_path / "ckpt-2")
    assert {v["name"] for v in report["variables"]} == set(GROUPS["object"]["variables"])
    assert checkpoint.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-2")


def _as_recorded(value):
    """A value as record_tf_checkpoint_dtypes.py writes TF's: strings as hex,
    complex as [real, imag]."""
    if isinstance(value, bytes):
        return value.hex()
    if value.dtype == object:
        return np.vectorize(lambda b: b.hex(), otypes=[object])(value).tolist()
    if np.iscomplexobj(value):
        return np.stack([value.real, value.imag], -1).astype(np.float64).tolist()
    return value.astype(np.float64).tolist()


def test_bfloat16_complex_and_string_variables_read_as_tf_reads_them():
    """bfloat16 (as float32, exact), complex64/128 and string tensors (a
    scalar, an empty string, bytes that are not utf-8, a 200-byte string),
    and a partitioned bfloat16 variable: each raised before ("not read
    here (numbers only)", "dtype 8", a bare KeyError for the partitioned one)."""
    recorded = DTYPES["dtypes"]
    reader = TFCheckpointReader(os.path.join(FIXTURES, recorded["prefix"]))
    assert {n: (d, list(s)) for n, (d, s) in reader.variables().items()} == \
        {n: (r["dtype"], r["shape"]) for n, r in recorded["variables"].items()}
    for name, r in recorded["variables"].items():
        value = reader.tensor(name)
        assert _as_recorded(value) == r["value"], name
        if r["dtype"] == "bfloat16":
            assert value.dtype == np.float32
    words = checkpoint.load_variable(os.path.join(FIXTURES, recorded["prefix"]), "words")
    assert words.dtype == object and words[0, 1] == b"\xff\xfe not utf-8"


def test_a_corrupt_string_tensor_is_named(tmp_path):
    prefix = _copy(tmp_path, "dtypes")
    reader = TFCheckpointReader(prefix)
    name = "words"
    entry = reader._names[name]
    shard = prefix + ".data-00000-of-00001"
    data = bytearray(open(shard, "rb").read())
    data[entry.offset + entry.size - 1] ^= 0x01   # the last string's last byte
    open(shard, "wb").write(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=rf"{shard}: the data of 'words' is "
                                                     r"corrupted \(CRC mismatch\)"):
        TFCheckpointReader(prefix).tensor(name)


def test_a_state_file_path_with_escapes_names_the_checkpoint():
    """TF's state file C-escapes its paths (modèle'q.ckpt-7 is written
    "mod\\303\\250le\\'q.ckpt-7"): the directory was "no checkpoint" before."""
    recorded = DTYPES["escaped"]
    assert "\\303\\250" in recorded["state_file"]
    model_dir = os.path.join(FIXTURES, os.path.dirname(recorded["prefix"]))
    assert find_prefix(model_dir) == os.path.join(FIXTURES, recorded["prefix"])
    assert [n for n, _ in checkpoint.list_variables(model_dir)] == \
        recorded["read_through_directory"]


def test_a_checkpoint_file_path_names_its_prefix():
    """`.../model.ckpt-3.index` or a data file names the checkpoint (it was
    read as a checkpoint of this library: "truncated, damaged or not a
    checkpoint of this library")."""
    prefix = os.path.join(FIXTURES, DTYPES["dtypes"]["prefix"])
    for path in (prefix + ".index", prefix + ".data-00000-of-00001"):
        assert find_prefix(path) == prefix
        assert dict(checkpoint.list_variables(path))["c64"] == [3]


def test_estimator_inspect_lists_every_tf_checkpoint_and_a_prefix_without_a_step(
        tmp_path, capsys):
    """All the state file lists, oldest first (only the latest before); a
    prefix without -N (Keras' save_weights("w")) has no step (inspect
    crashed formatting it)."""
    from estimator.experiment import cli
    prefix = os.path.join(FIXTURES, DTYPES["dtypes"]["prefix"])
    for name in ("model.ckpt-2", "model.ckpt-3"):
        for ext in (".index", ".data-00000-of-00001"):
            shutil.copy(prefix + ext, tmp_path / (name + ext))
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "model.ckpt-3"\n'
        'all_model_checkpoint_paths: "model.ckpt-2"\n'
        'all_model_checkpoint_paths: "model.ckpt-3"\n')
    assert cli.main(["inspect", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["step"] for c in report["checkpoints"]] == [2, 3]
    keras = tmp_path / "keras"
    keras.mkdir()
    for ext in (".index", ".data-00000-of-00001"):
        shutil.copy(prefix + ext, keras / ("w" + ext))
    (keras / "checkpoint").write_text('model_checkpoint_path: "w"\n'
                                      'all_model_checkpoint_paths: "w"\n')
    assert cli.main(["inspect", str(keras)]) == 0
    out = capsys.readouterr().out
    assert "step        -  w " in out and "bf16" in out
