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


def _prefix(group):
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
