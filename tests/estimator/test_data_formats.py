"""TFRecord files, tf.Example parsing and CSV against TensorFlow: files TF
wrote (plain, GZIP, ZLIB) and TF's results on them, recorded by
``tests/support/fixtures/record_tf_data.py`` into ``tests/support/fixtures/
tf_data/``; TF is not needed here."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

import distribute
import estimator as est
from hooks import model_scope
from paths import FIXTURES

DATA = os.path.join(FIXTURES, "tf_data")
with open(os.path.join(DATA, "tf_data.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
RECORDS = [bytes.fromhex(r) for r in TF["records"]]
SPEC = {
    "price": est.io.FixedLenFeature([2], torch.float32),
    "ids": est.io.VarLenFeature(torch.int64),
    "city": est.io.FixedLenFeature([], str, default_value=b"none"),
    "seq": est.io.FixedLenSequenceFeature([2], torch.float32, allow_missing=True),
}
FILES = {"": "examples.tfrecord", "GZIP": "examples.tfrecord.gz",
         "ZLIB": "examples.tfrecord.zlib"}


def _value(recorded):
    """A recorded TF value as numpy (bytes from hex)."""
    if recorded["dtype"] == "bytes":
        arr = np.array(recorded["value"], dtype=object)
        out = np.empty(arr.shape, dtype=object)
        for index, h in np.ndenumerate(arr):
            out[index] = bytes.fromhex(h)
        return out
    return np.array(recorded["value"], dtype=recorded["dtype"])


def _rows(sparse):
    """TF's SparseTensor as the list-of-lists form parse_example gives."""
    rows = [[] for _ in range(sparse["dense_shape"][0])]
    for (row, _), value in zip(sparse["indices"], sparse["values"]["value"]):
        rows[row].append(value)
    return rows


# -- TFRecord ----------------------------------------------------------------------------
@pytest.mark.parametrize("compression", sorted(FILES))
def test_tf_written_files_read_record_for_record(compression):
    records = list(est.data.TFRecordDataset(os.path.join(DATA, FILES[compression]),
                                            compression_type=compression or None))
    assert records == RECORDS


@pytest.mark.parametrize("compression", ["", "GZIP", "ZLIB"])
def test_written_files_are_byte_identical_to_tfs(tmp_path, compression):
    path = tmp_path / "out"
    with est.io.TFRecordWriter(str(path), compression or None) as writer:
        for record in RECORDS:
            writer.write(record)
    if compression == "":   # compressed streams may differ in compressor details
        assert path.read_bytes() == (open(os.path.join(DATA, FILES[""]), "rb").read())
    assert list(est.data.TFRecordDataset(str(path), compression or None)) == RECORDS


def test_a_flipped_byte_is_an_error_naming_file_and_offset(tmp_path):
    path = tmp_path / "bad.tfrecord"
    shutil.copy(os.path.join(DATA, FILES[""]), path)
    data = bytearray(path.read_bytes())
    second = 8 + 4 + len(RECORDS[0]) + 4
    data[second + 20] ^= 0x01                # inside the second record's data
    path.write_bytes(bytes(data))
    records = iter(est.data.TFRecordDataset(str(path)))
    assert next(records) == RECORDS[0]
    with pytest.raises(est.io.DataLossError,
                       match=rf"{path}: corrupted record at offset {second} \(the data's CRC"):
        next(records)


def test_a_truncated_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / "cut.tfrecord"
    path.write_bytes(open(os.path.join(DATA, FILES[""]), "rb").read()[:-3])
    with pytest.raises(est.io.DataLossError, match=rf"{path}: truncated record at offset"):
        list(est.data.TFRecordDataset(str(path)))


with open(os.path.join(FIXTURES, "tf_tfrecord_tail.json"), encoding="utf-8") as _f:
    TF_TAIL = json.load(_f)


@pytest.mark.parametrize("case", TF_TAIL["cases"], ids=lambda c: f"{c['kind']}{c['bytes']}")
def test_a_damaged_end_of_file_reads_as_tf_reads_it(tmp_path, case, caplog):
    """TF 2.15 (tf_tfrecord_tail.json): fewer bytes than a record header at the
    end are the end of the file (stray bytes; a last record cut inside its
    header), 12 or more are a corrupted record, a record cut after its header
    is truncated. A DataLossError here read none of the file's records."""
    path = tmp_path / "tail.tfrecord"
    with est.io.TFRecordWriter(str(path)) as writer:
        for i in range(3):
            writer.write(b"x" * (5 + i))
    data = path.read_bytes()
    assert len(data) == TF_TAIL["size"]
    k = case["bytes"]
    path.write_bytes(data + b"\0" * k if case["kind"] == "stray" else data[:-k])
    kind, want = case["tf"]
    if kind == "ok":
        with caplog.at_level("WARNING"):
            assert [r.decode() for r in est.data.TFRecordDataset(str(path))] == want
        at_a_record_end = path.stat().st_size in (0, 21, 43, 66)
        assert ("stray bytes at the end" in caplog.text) == (not at_a_record_end), caplog.text
        assert at_a_record_end or f"{path}: " in caplog.text
    else:
        word = "corrupted" if "corrupted record" in want else "truncated"
        with pytest.raises(est.io.DataLossError, match=rf"{path}: {word} record at offset"):
            list(est.data.TFRecordDataset(str(path)))


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
@pytest.mark.parametrize("damage", ["flipped", "cut"])
def test_damaged_compressed_files_are_data_loss_errors(tmp_path, compression, damage):
    """As TF's DataLossError (zlib.error and EOFError came out, which an
    `except est.io.DataLossError` does not catch)."""
    path = tmp_path / "bad.tfrecord"
    data = bytearray(open(os.path.join(DATA, FILES[compression]), "rb").read())
    if damage == "flipped":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[len(data) // 2:]
    path.write_bytes(bytes(data))
    with pytest.raises(est.io.DataLossError, match=rf"{path}: "):
        list(est.data.TFRecordDataset(str(path), compression))


def test_missing_file_and_bad_options():
    with pytest.raises(ValueError, match="nope.tfrecord: no such file"):
        est.data.TFRecordDataset("nope.tfrecord")
    with pytest.raises(ValueError, match="compression_type must be"):
        est.data.TFRecordDataset(os.path.join(DATA, FILES[""]), compression_type="LZ4")


def test_input_contexts_and_dataloader_workers_read_each_record_once(tmp_path):
    """Two input pipelines (InputContext(2, i)), each read by a DataLoader with
    two workers, over three files: every record exactly once; and so with
    pipelines of other worker counts (a pipeline's records were those of
    its worker count: 7 duplicated and 7 lost with 2 workers and none)."""
    files = []
    for f in range(3):
        path = tmp_path / f"part-{f}.tfrecord"
        with est.io.TFRecordWriter(str(path)) as writer:
            for i in range(7 + f):
                writer.write(f"{f}-{i}".encode())
        files.append(str(path))
    expected = [f"{f}-{i}".encode() for f in range(3) for i in range(7 + f)]
    for workers in ((2, 2), (2, 0), (0, 1)):
        seen = []
        for pipeline, n in enumerate(workers):
            context = distribute.InputContext(2, pipeline)
            dataset = est.data.TFRecordDataset(files, input_context=context)
            seen += list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=n))
        assert sorted(seen) == sorted(expected) and len(seen) == len(expected), workers
    shards = [list(est.data.TFRecordDataset(files).shard(3, i)) for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(expected)


# -- tf.Example ----------------------------------------------------------------------------
def test_a_sequence_feature_must_allow_missing_as_tf():
    """TF 2.15's parse_example refuses FixedLenSequenceFeature(allow_missing=False)
    (it parsed the examples that had the feature)."""
    spec = {"seq": est.io.FixedLenSequenceFeature([2], torch.float32)}
    with pytest.raises(ValueError, match="^Unsupported: FixedLenSequenceFeature requires "
                       "allow_missing to be True \\(key 'seq'\\)$"):
        est.io.parse_example(RECORDS, spec)


def test_parse_example_gives_tfs_values():
    parsed = est.io.parse_example(RECORDS, SPEC)
    tf_batch = TF["parse"]["batch"]
    for key in ("price", "city", "seq"):
        expected = _value(tf_batch[key])
        assert parsed[key].dtype == expected.dtype, key
        np.testing.assert_array_equal(parsed[key], expected, err_msg=key)
    assert parsed["ids"] == _rows(tf_batch["ids"])


def test_parse_single_example_gives_tfs_values():
    parsed = est.io.parse_single_example(RECORDS[0], SPEC)
    single = TF["parse"]["single"]
    np.testing.assert_array_equal(parsed["price"], _value(single["price"]))
    assert parsed["city"] == _value(single["city"]).item()
    np.testing.assert_array_equal(parsed["seq"], _value(single["seq"]))
    assert parsed["ids"] == single["ids"]["values"]["value"]


@pytest.mark.parametrize("case, spec, message", [
    ("missing_required", {"city": est.io.FixedLenFeature([], str)},
     "Feature: city (data type: string) is required but could not be found."),
    ("wrong_type", {"price": est.io.FixedLenFeature([2], torch.int64)},
     "Key: price, Index: 0. Data types don't match. Data type: float but expected type: "
     "int64"),
    ("wrong_size", {"price": est.io.FixedLenFeature([3], torch.float32)},
     "Key: price, Index: 0. Number of float values != expected. Values size: 2 but output "
     "shape: [3]"),
])
def test_parse_errors_say_what_tfs_say(case, spec, message):
    assert TF["parse"]["errors"][case] is not None
    tf_text = " ".join(TF["parse"]["errors"][case].split())
    assert " ".join(message.split()) in tf_text      # the same words as TF's
    with pytest.raises(ValueError) as info:
        est.io.parse_example(RECORDS, spec)
    assert message in str(info.value)


def test_junk_is_not_an_example():
    with pytest.raises(ValueError, match="example 1 is not a serialized tf.Example"):
        est.io.parse_example([RECORDS[0], b"\xff\xff\xff"], {"city": SPEC["city"]})


def test_a_var_len_feature_no_example_has_feeds_its_columns_as_tf(tmp_path):
    """Every row without a value (a batch of examples none of which has the
    VarLenFeature: TF's empty SparseTensor of its dtype) gives zero rows, as
    TF 2.15's input_layer gives (a probe ran both); the rows, holding no
    value, were read as strings and every integer column refused them."""
    fc = est.feature_column
    absent = fc.categorical_column_with_identity("absent", 5)
    columns = [fc.indicator_column(absent),
               fc.embedding_column(absent, 2, initializer=lambda shape: np.ones(shape)),
               fc.indicator_column(fc.categorical_column_with_vocabulary_list(
                   "absent", [3, 7], num_oov_buckets=1)),
               fc.indicator_column(fc.categorical_column_with_hash_bucket(
                   "absent", 4, dtype=torch.int64)),
               fc.indicator_column(fc.weighted_categorical_column(absent, "weight")),
               fc.indicator_column(fc.crossed_column(["absent", "city"], 3))]
    parsed = est.io.parse_example(RECORDS, {
        "absent": est.io.VarLenFeature(torch.int64),
        "weight": est.io.VarLenFeature(torch.float32), "city": SPEC["city"]})
    assert parsed["absent"] == parsed["weight"] == [[]] * len(RECORDS)
    for column, width in zip(columns, (5, 2, 3, 4, 5, 3)):
        with model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy()):
            out = fc.input_layer(parsed, [column])
        assert out.shape == (len(RECORDS), width) and not out.any(), column
    # a string column takes them too, and a numeric one still refuses rows
    words = fc.categorical_column_with_vocabulary_list("absent", ["a", "b"])
    assert not fc.input_layer(parsed, [fc.indicator_column(words)]).any()
    with pytest.raises(ValueError, match="Column 'absent' gave shape"):
        fc.input_layer(parsed, [fc.numeric_column("absent")])


def test_examples_written_here_feed_feature_columns(tmp_path):
    fc = est.feature_column
    columns = [fc.numeric_column("price", shape=(2,)),
               fc.indicator_column(fc.categorical_column_with_vocabulary_list(
                   "city", ["Paris", "Oslo"], num_oov_buckets=1))]
    spec = fc.make_parse_example_spec(columns)
    example = est.io.Example()
    example.features.feature["price"].float_list.value.extend([1.0, 2.0])
    example.features.feature["city"].bytes_list.value.append(b"Oslo")
    parsed = est.io.parse_example([example.SerializeToString()] * 2, spec)
    net = fc.input_layer(parsed, columns)
    assert net.tolist() == [[0.0, 1.0, 0.0, 1.0, 2.0]] * 2


# -- CSV ---------------------------------------------------------------------------------
def _check_features(ours, theirs):
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        expected = _value(value)
        assert ours[key].dtype == expected.dtype, key
        np.testing.assert_array_equal(ours[key], expected, err_msg=key)


def test_make_csv_dataset_gives_tfs_batches():
    path = os.path.join(DATA, "people.csv")
    batches = list(est.data.make_csv_dataset(path, batch_size=4, label_name="score",
                                             num_epochs=1, shuffle=False))
    assert len(batches) == len(TF["csv"]["inferred"])
    for (features, label), (tf_features, tf_label) in zip(batches, TF["csv"]["inferred"]):
        _check_features(features, tf_features)
        np.testing.assert_array_equal(label, _value(tf_label))
        assert label.dtype == _value(tf_label).dtype
    selected = list(est.data.make_csv_dataset(path, batch_size=3, num_epochs=1, shuffle=False,
                                              select_columns=["name", "height"],
                                              column_defaults=["", 0.0]))
    for features, tf_features in zip(selected, TF["csv"]["selected"]):
        _check_features(features, tf_features)


def test_make_csv_dataset_repeats_and_shuffles_reproducibly():
    path = os.path.join(DATA, "people.csv")

    def names(seed):
        dataset = est.data.make_csv_dataset(path, batch_size=4, num_epochs=2, shuffle=True,
                                            shuffle_seed=seed, shuffle_buffer_size=3)
        return [n for batch in dataset for n in batch["name"].tolist()]
    assert names(1) == names(1) and sorted(names(1)) == sorted(names(2))
    assert len(names(1)) == 12


def test_make_csv_dataset_of_a_header_alone_ends_as_tfs_repeat(tmp_path, caplog):
    """Repeating no rows ends (TF's repeat() of an empty dataset); it looped
    for ever, the training that read it hanging without a word."""
    import threading
    path = tmp_path / "header_only.csv"
    path.write_text("a,b,label\n")
    for shuffle in (False, True):
        got = []
        reader = threading.Thread(target=lambda: got.append(list(est.data.make_csv_dataset(
            str(path), batch_size=8, label_name="label", shuffle=shuffle))), daemon=True)
        reader.start()
        reader.join(timeout=20)
        assert not reader.is_alive(), "make_csv_dataset of a header alone did not end"
        assert got == [[]]
    assert f"{path} hold(s) no data rows" in caplog.text


@pytest.mark.parametrize("bad, where", [
    ("5.1,abc,setosa", "column 'width' is not a valid float: abc"),
    ("5.1,,setosa", "column 'width' is required but missing"),
    ("5.1,3.0", "Expect 3 fields but have 2"),
    ("3000000000,3.0,setosa", "column 'length' is not a valid int32: 3000000000"),   # TF's
    ("5.5,3.0,setosa", "column 'length' is not a valid int32: 5.5"),
])
def test_make_csv_dataset_errors_name_the_file_and_line(tmp_path, bad, where):
    """TF (and decode_csv) name the record's index in its batch; a user of a
    file needs its line. Here the bad row is line 8 of the second file, in the
    second batch, shuffled."""
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    rows = [f"{i},{i}.25,setosa" for i in range(9)]
    first.write_text("length,width,species\n" + "\n".join(rows[:4]) + "\n")
    second.write_text("length,width,species\n" + "\n".join(rows[4:]) + "\n\n"
                      + bad + "\n" + rows[0] + "\n")
    dataset = est.data.make_csv_dataset(str(tmp_path / "*.csv"), batch_size=4,
                                        label_name="species", num_epochs=1, shuffle_seed=3,
                                        column_defaults=[[0] if "int" in where else [0.0],
                                                         np.float32, [""]])
    with pytest.raises(ValueError) as info:
        list(dataset)
    assert str(info.value) == f"make_csv_dataset: {second}, line 8: {where}\n  {bad}"


def test_make_csv_dataset_reads_quoted_fields_with_line_breaks(tmp_path):
    """RFC 4180, as TF's CsvDataset: each physical line was a record ("Expect
    2 fields but have 1"). A quote never closed is an error naming its line,
    not the rest of the file read as one field."""
    path = tmp_path / "a.csv"
    path.write_text('id,text\n1,"hello\nworld"\n2,plain\n3,"a ""quoted""\nline\n\nthree"\n'
                    "4,x\n")
    features = next(iter(est.data.make_csv_dataset(str(path), batch_size=10, shuffle=False,
                                                   num_epochs=1)))
    assert features["id"].tolist() == [1, 2, 3, 4]
    assert features["text"].tolist() == [b"hello\nworld", b"plain",
                                         b'a "quoted"\nline\n\nthree', b"x"]
    path.write_text('id,text\n1,a\n2,"oops\n3,c\n4,d\n')
    with pytest.raises(ValueError, match=f"^make_csv_dataset: {path}, line 3: a quoted field "
                       "opened on this line is not closed before the end of the file$"):
        list(est.data.make_csv_dataset(str(path), batch_size=10, shuffle=False, num_epochs=1))
    path.write_text('id,text\n0,x\n1,"a\nb",c\n')   # its line is the record's first
    with pytest.raises(ValueError, match="line 3: Expect 2 fields but have 3"):
        list(est.data.make_csv_dataset(str(path), batch_size=10, shuffle=False, num_epochs=1,
                                       column_defaults=[[0], [""]]))


def test_make_csv_dataset_of_an_empty_file_says_so(tmp_path):
    """It said "`label_name` provided must be one of the columns: []"."""
    path = tmp_path / "a.csv"
    path.write_text("")
    for text in ("", "\nx,y\n1,2\n"):
        path.write_text(text)
        with pytest.raises(ValueError, match=f"^make_csv_dataset: {path} has no header line to "
                           "name the columns \\(it is empty, or its first line is\\)$"):
            est.data.make_csv_dataset(str(path), batch_size=2, label_name="y")


def test_make_csv_dataset_says_when_a_few_values_make_numbers_strings(tmp_path, caplog):
    """TF infers the column as strings, silently; the model then fails far
    from the cause (or a numeric_column hashes bytes)."""
    path = tmp_path / "a.csv"
    path.write_text("x,y,name\n" + "".join(f"{i}.5,{i},n{i}\n" for i in range(20))
                    + "?,3,n\n1.5,?,m\n2.5,n/a,k\n")
    with caplog.at_level("WARNING"):
        features, _ = next(iter(est.data.make_csv_dataset(str(path), batch_size=30,
                                                          label_name="name", shuffle=False)))
    assert features["x"].dtype == object and features["y"].dtype == object   # as TF
    assert ("column 'x' is read as strings, as TF reads it: 22 of its first 23 values are "
            "numbers, but not '?'") in caplog.text
    assert "21 of its first 23 values are numbers, but not '?', 'n/a'" in caplog.text
    assert "column 'name'" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        features, _ = next(iter(est.data.make_csv_dataset(
            str(path), batch_size=30, label_name="name", shuffle=False, na_value="?")))
    assert features["x"].dtype == np.float32 and "column 'x'" not in caplog.text


def test_make_csv_dataset_says_nan_is_what_makes_numbers_strings(tmp_path, caplog):
    """"nan" makes a column strings (TF's inference): it was counted a number,
    and the warning read "... 4 of its first 4 values are numbers, but not ."."""
    path = tmp_path / "a.csv"
    path.write_text("x,y\n1.5,1\n2.5,2\nnan,3\n3.5,4\n")
    with caplog.at_level("WARNING"):
        est.data.make_csv_dataset(str(path), batch_size=2, label_name="y")
    assert "column 'x' is read as strings, as TF reads it: 3 of its first 4 values are " \
        "numbers, but not 'nan'" in caplog.text


def test_make_csv_dataset_ignoring_errors_batches_the_rows_read(tmp_path):
    """`ignore_errors` (TF's: it was ignored, the first bad row an error):
    the rows that cannot be read are left out before batching, so every
    batch is full but the last."""
    path = tmp_path / "a.csv"
    path.write_text("a,b\n1,2\n3,x\n5,6\n7,8\n\n9,10\n11\n12,13\n")
    batches = est.data.make_csv_dataset(str(path), batch_size=2, shuffle=False, num_epochs=1,
                                        column_defaults=[[0], [0]], ignore_errors=True)
    assert [b["a"].tolist() for b in batches] == [[1, 5], [7, 9], [12]]


def test_decode_csv_gives_tfs_columns():
    case = TF["csv"]["decode_csv"]
    columns = est.io.decode_csv(case["records"], record_defaults=[[0], [0.0], ["d"]])
    for ours, theirs in zip(columns, case["value"]):
        expected = _value(theirs)
        assert ours.dtype == expected.dtype
        np.testing.assert_array_equal(ours, expected)
    with pytest.raises(ValueError, match="Field 1 in record 0 is not a valid float: x"):
        est.io.decode_csv(["1,x"], record_defaults=[[0], [0.0]])
    assert "Field 1 in record 0 is not a valid float: x" in TF["csv"]["decode_csv_error"]
    with pytest.raises(ValueError, match="Field 0 is required but missing in record 1!"):
        est.io.decode_csv(["1", '""'], record_defaults=[np.int32])
    # TF 2.15's: an empty record has no field (a default was taken); a
    # delimiter of 2 chars is an error (it split at both); select_cols
    # counts the fields selected (it said "Expect 4 fields but have 3")
    with pytest.raises(ValueError, match="^Expect 1 fields but have 0 in record 1$"):
        est.io.decode_csv(["1", ""], record_defaults=[[7]])
    with pytest.raises(ValueError, match="field_delim should be only 1 char"):
        est.io.decode_csv(["1::2"], record_defaults=[[0], [0]], field_delim="::")
    with pytest.raises(ValueError, match="^Expect 2 fields but have 1 in record 0$"):
        est.io.decode_csv(["1,2,3"], record_defaults=[[0], [0]], select_cols=[1, 3])
    with pytest.raises(ValueError, match="Expect 2 fields but have 3 in record 0"):
        est.io.decode_csv(["1,2,3"], record_defaults=[[0], [0]])
    for default, name in (([0], "int32"), ([np.int64(0)], "int64"), ([np.float64(0)], "double")):
        with pytest.raises(ValueError, match=f"^Field 0 in record 1 is not a valid {name}: x$"):
            est.io.decode_csv(["1", "x"], record_defaults=[default])   # TF's words
    with pytest.raises(ValueError, match="^Field 0 in record 0 is not a valid int32: 2147483648$"):
        est.io.decode_csv(["2147483648"], record_defaults=[[0]])


def test_text_lines(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"one\r\ntwo\nthree")
    assert list(est.data.TextLineDataset(str(path))) == [b"one", b"two", b"three"]


with open(os.path.join(FIXTURES, "tf_csv_inference.json"), encoding="utf-8") as _f:
    TF_CSV_INFERENCE = json.load(_f)["cases"]


@pytest.mark.parametrize("name", list(TF_CSV_INFERENCE))
def test_make_csv_dataset_infers_and_reads_files_as_tf(tmp_path, name):
    """TF's inference (record_tf_csv_inference.py, TF 2.15): float64 where a
    value overflows float32, "nan"/"inf" and empty columns as strings, rows
    read on into the next file; files whose headers differ are an error (the
    second was read by the first one's header, its columns swapped). A blank
    line is a row of one empty field: of the default in a file of one column
    (it was dropped), an error in one of more and in type inference (it was
    dropped); `ignore_errors` leaves out the rows that cannot be read (it was
    ignored: an error); `use_quote_delim=False` reads quotes as text in the
    header and inference too (a column named '"a"' was 'a', its '"1"' an int)."""
    case = TF_CSV_INFERENCE[name]
    for file_name, text in case["files"].items():
        (tmp_path / file_name).write_bytes(text.encode())
    kwargs = dict(case["kwargs"])   # (a dtype's name: a required column)
    if "column_defaults" in kwargs:
        kwargs["column_defaults"] = [np.dtype(d) if isinstance(d, str) else d
                                     for d in kwargs["column_defaults"]]
    try:
        (batch,) = list(est.data.make_csv_dataset(str(tmp_path / "*.csv"), batch_size=100,
                                                  shuffle=False, num_epochs=1, **kwargs))
    except ValueError as e:
        assert "error" in case, e
        # TF's words (TF names neither file nor line: here both, before them)
        words = case["error"].split(" in record")[0].split(" in the header row")[0]
        words = re.sub(r"^Field \d+ ", "", words)   # (here the column's name)
        assert words.lower() in str(e).lower()
        assert "a.csv, line " in str(e) or "b.csv has" in str(e)
        return
    assert "columns" in case, f"read {batch}; TF: {case.get('error')}"
    got = {k: {"dtype": "string" if v.dtype == object else v.dtype.name,
               "values": [x.decode() if isinstance(x, bytes) else
                          repr(float(x)) if v.dtype.kind == "f" else int(x) for x in v]}
           for k, v in batch.items()}
    assert got == case["columns"]


with open(os.path.join(FIXTURES, "tf_text_lines.json"), encoding="utf-8") as _f:
    TF_TEXT_LINES = json.load(_f)["cases"]


@pytest.mark.parametrize("case", TF_TEXT_LINES, ids=lambda c: repr(c["text"]))
def test_text_lines_are_split_as_tf_splits_them(tmp_path, case):
    """record_tf_text_lines.py (TF 2.15): lines end at "\\n" and TF's reader
    drops every "\\r" (a "\\r" inside a line was kept here)."""
    path = tmp_path / "t.txt"
    path.write_bytes(case["text"].encode("latin-1"))
    assert [line.decode("latin-1") for line in est.data.TextLineDataset(str(path))] == \
        case["lines"]


with open(os.path.join(FIXTURES, "tf_interleave.json"), encoding="utf-8") as _f:
    TF_INTERLEAVE = json.load(_f)


@pytest.mark.parametrize("case", TF_INTERLEAVE["cases"], ids=lambda c: str(c["num_parallel_reads"]))
def test_num_parallel_reads_interleaves_files_as_tf(tmp_path, case):
    """record_tf_interleave.py (TF 2.15): with num_parallel_reads the files'
    records (make_csv_dataset's rows) come interleaved, in TF's deterministic
    order (the argument was ignored: the files were read one after the other)."""
    records, lines = [], []
    for f, n in enumerate(TF_INTERLEAVE["sizes"]):
        records.append(str(tmp_path / f"f{f}.tfrecord"))
        lines.append(tmp_path / f"f{f}.txt")
        with est.io.TFRecordWriter(records[-1]) as writer:
            for i in range(n):
                writer.write(f"f{f}-{i}".encode())
        lines[-1].write_text("".join(f"f{f}-{i}\n" for i in range(n)))
        (tmp_path / f"f{f}.csv").write_text("v\n" + "".join(f"f{f}-{i}\n" for i in range(n)))
    reads = case["num_parallel_reads"]
    assert [v.decode() for b in est.data.make_csv_dataset(
        str(tmp_path / "*.csv"), batch_size=100, shuffle=False, num_epochs=1,
        num_parallel_reads=reads) for v in b["v"]] == case["csv"]
    assert [r.decode() for r in est.data.TFRecordDataset(
        records, num_parallel_reads=reads)] == case["tfrecord"]
    assert [r.decode() for r in est.data.TextLineDataset(
        [str(p) for p in lines], num_parallel_reads=reads)] == case["text"]


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_a_writer_dropped_without_close_completes_its_file(tmp_path, compression):
    """As TF's writer when destroyed: a ZLIB stream held its records back, and
    a file dropped unclosed read as empty, without an error."""
    import gc
    path = str(tmp_path / "r.tfrecord")
    writer = est.io.TFRecordWriter(path, compression)
    writer.write(b"abc")
    writer.write("d\u00e9f")   # (a str: its utf-8 bytes, as TF's)
    del writer
    gc.collect()
    assert list(est.data.TFRecordDataset(path, compression)) == [b"abc", "d\u00e9f".encode()]
    closed = est.io.TFRecordWriter(path, compression)
    closed.close()
    with pytest.raises(ValueError, match="TFRecordWriter of .*r.tfrecord is closed"):
        closed.write(b"x")


def _ids_csv(tmp_path, n=16):
    path = tmp_path / "ids.csv"
    path.write_text("id,label\n" + "".join(f"{i},{i % 2}\n" for i in range(n)))
    return str(path)


def test_make_csv_dataset_without_a_seed_shuffles_by_torchs_generator(tmp_path):
    """shuffle_seed=None drew from the OS: tf_random_seed did not make a run
    repeatable (TF's graph seed does), and replicas or DataLoader workers
    each shuffled otherwise. The seed now comes from torch's generator when
    the dataset is made; workers and input pipelines keep every n-th batch
    of that one order."""
    path = _ids_csv(tmp_path)

    def made(seed):
        torch.manual_seed(seed)
        return est.data.make_csv_dataset(path, batch_size=2, label_name="label", num_epochs=2)

    def ids(batches):
        return [i for features, _ in batches for i in features["id"].tolist()]
    order = ids(made(7))
    assert order == ids(made(7)) and order != ids(made(8))
    assert sorted(order) == sorted(list(range(16)) * 2) and order[:16] != order[16:]
    workers = ids(torch.utils.data.DataLoader(made(7), batch_size=None, num_workers=2))
    assert sorted(workers) == sorted(order)   # (the workers' batches in turn: one order)
    assert workers == ids(torch.utils.data.DataLoader(made(7), batch_size=None, num_workers=2))
    # pipelines of other worker counts, and processes of other torch seeds with
    # a shuffle_seed: a worker's order followed the DataLoader's base seed, drawn
    # from torch's generator (rows read twice and others never; attack probe)
    for workers, seeds in (((2, 2), (7, 7)), ((2, 0), (7, 7)), ((2, 2), (7, 8))):
        pipelines = []
        for pipeline, n in enumerate(workers):   # (each the process of a replica)
            torch.manual_seed(seeds[pipeline])
            dataset = est.data.make_csv_dataset(
                path, batch_size=2, label_name="label", num_epochs=1,
                shuffle_seed=None if seeds[0] == seeds[1] else 3,
                input_context=distribute.InputContext(2, pipeline))
            pipelines += ids(torch.utils.data.DataLoader(dataset, batch_size=None,
                                                         num_workers=n))
        assert sorted(pipelines) == list(range(16)), (workers, seeds)
    dataset = made(7)
    assert sorted(sum((ids(dataset.shard(3, i)) for i in range(3)), [])) == sorted(order)


def _ids_seen_model_fn(out_dir):
    def model_fn(features, labels, mode):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(os.path.join(out_dir, f"seen-{rank}"), "a") as f:
            f.write("".join(f"{int(i)}\n" for i in features["id"]))
        x = torch.as_tensor(features["id"], dtype=torch.float32)[:, None]
        loss = torch.nn.functional.mse_loss(est.get_module("w", lambda: torch.nn.Linear(1, 1))(x),
                                            torch.as_tensor(labels, dtype=torch.float32)[:, None])
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=1e-4)))
    return model_fn


@pytest.mark.slow
@pytest.mark.parametrize("read_ahead", [None, 2])
@pytest.mark.parametrize("rows, batch, steps", [(16, 2, 4), (19, 3, 3)])
def test_make_csv_dataset_shuffled_on_two_replicas_trains_each_row_once(
        tmp_path, read_ahead, rows, batch, steps):
    """An input_fn without input_context over make_csv_dataset's default
    shuffle, on 2 replicas (every 2nd batch kept by each): each replica
    shuffled with its own OS-drawn seed, so of 14 rows 4 were never trained
    and 2 trained twice. (19 rows in batches of 3: the 7th batch, of one
    row, has no partner and is not trained, as in TF.)"""
    path = _ids_csv(tmp_path, rows)
    out = tmp_path / "seen"
    out.mkdir()
    e = est.Estimator(_ids_seen_model_fn(str(out)), config=est.RunConfig(
        model_dir=str(tmp_path / "m"), experimental_prefetch_batches=read_ahead,
        train_distribute=distribute.MirroredStrategy(["cpu:0", "cpu:1"])))
    e.train(lambda: est.data.make_csv_dataset(path, batch_size=batch, label_name="label",
                                              num_epochs=1))
    seen = [int(i) for rank in (0, 1) for i in (out / f"seen-{rank}").read_text().split()]
    assert len(set(seen)) == len(seen) == 2 * steps * batch and set(seen) <= set(range(rows))
    assert e.get_variable_value("global_step") == steps


@pytest.mark.parametrize("dtype", [np.float64, np.dtype("float64"), torch.float64, "float64",
                                   torch.float16, np.int32, torch.int32])
def test_parse_example_refuses_the_dtypes_tf_refuses(dtype):
    """float64 was parsed into float32 and int32 into int64 without a word
    (TF 2.15: "not in the list of allowed values: float, int64, string")."""
    for spec in (est.io.VarLenFeature(dtype), est.io.FixedLenFeature([2], dtype)):
        with pytest.raises(ValueError, match=r"Key: price: unsupported dtype .*; a tf.Example "
                           r"holds float32, int64 and string values"):
            est.io.parse_example(RECORDS, {"price": spec})
    for name in (float, "float"):   # (TF's float32)
        parsed = est.io.parse_example(RECORDS, {"price": est.io.FixedLenFeature([2], name),
                                                "ids": est.io.VarLenFeature(int)})
        assert parsed["price"].dtype == np.float32
    assert parsed["ids"] == est.io.parse_example(RECORDS, SPEC)["ids"]


def test_make_csv_dataset_reshuffles_each_iteration_as_tf(tmp_path):
    """TF's shuffle reshuffles on each iteration of the dataset (with a
    shuffle_seed too: the same sequence of orders); a seed fixed when the
    dataset was made gave one order every pass, a DataLoader's every epoch."""
    path = _ids_csv(tmp_path)

    def ids(batches):
        return [i for features, _ in batches for i in features["id"].tolist()]
    for seed in (None, 1):
        dataset = est.data.make_csv_dataset(path, batch_size=2, label_name="label",
                                            num_epochs=1, shuffle_seed=seed)
        passes = [ids(dataset) for _ in range(3)]
        assert all(sorted(p) == list(range(16)) for p in passes)
        assert passes[0] != passes[1] != passes[2]
    again = est.data.make_csv_dataset(path, batch_size=2, label_name="label", num_epochs=1,
                                      shuffle_seed=1)
    assert [ids(again) for _ in range(3)] == passes
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    epochs = [ids(loader) for _ in range(2)]
    assert all(sorted(epoch) == list(range(16)) for epoch in epochs) and epochs[0] != epochs[1]


def test_list_files_expands_a_pattern_for_the_datasets_which_take_names(tmp_path):
    """A literal port: list_files(pattern) then TextLineDataset(files). A
    pattern given to the dataset itself is said, as TF's takes names only."""
    for i in (2, 0, 1):
        (tmp_path / f"train-{i}.csv").write_text(f"{i},a\n{i},b\n")
    pattern = str(tmp_path / "train-*.csv")
    files = est.data.list_files(pattern)
    assert files == [str(tmp_path / f"train-{i}.csv") for i in range(3)]
    assert [line for line in est.data.TextLineDataset(files)][:3] == [b"0,a", b"0,b", b"1,a"]
    shuffled = est.data.list_files(pattern, shuffle=True, seed=3)
    assert sorted(shuffled) == files and shuffled == est.data.list_files(pattern, True, 3)
    # without a seed, one from torch's generator: alike where it is (every replica's)
    torch.manual_seed(5)
    drawn = est.data.list_files(pattern, shuffle=True)
    torch.manual_seed(5)
    assert est.data.list_files(pattern, shuffle=True) == drawn
    # TF's list of patterns: each one's files in turn, a file two match twice
    assert est.data.list_files([str(tmp_path / "train-[12].csv"), str(tmp_path / "*-1.csv")]
                               ) == [files[1], files[2], files[1]]
    with pytest.raises(ValueError, match=r"train-\*\.csv: no such file; a dataset takes file "
                                         r"names, as TF's: for a pattern, est.data.list_files"):
        est.data.TextLineDataset(pattern)
    with pytest.raises(ValueError, match="No files match"):
        est.data.list_files(str(tmp_path / "valid-*.csv"))
