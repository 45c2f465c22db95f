"""estimator.feature_column against values recorded from real TensorFlow.

The fixture ``tests/support/fixtures/tf_feature_columns.json`` (and the
vocabulary file beside it) was written by
``tests/support/fixtures/record_tf_feature_columns.py`` under TensorFlow 2.15
from ``tf.compat.v1.feature_column`` in graph mode; TF is not needed here.
Each recorded case gives column specs (the keyword arguments of the TF
functions), a feature batch, the output of ``input_layer`` / ``linear_model``
and TF's variable names and shapes.
"""
import json
import os
import random
import re

import numpy as np
import pytest
import torch

import distribute
import estimator as est
from estimator import feature_column as fc
from hooks import model_scope
from hooks.mode_keys import ModeKeys
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_feature_columns.json"), encoding="utf-8") as _f:
    DATA = json.load(_f)
CASES = {c["name"]: c for c in DATA["cases"]}
DTYPES = {"string": str, "int64": torch.int64, "float32": torch.float32}
ATOL = RTOL = 1e-6   # absolute, and relative for the large linear-model outputs


# -- building columns and features from the recorded specs --------------------------------
def build(spec):
    kw = {k: v for k, v in spec.items() if k != "fn"}
    for k in ("source_column", "categorical_column"):
        if k in kw:
            kw[k] = build(kw[k])
    if "keys" in kw:
        kw["keys"] = [k if isinstance(k, str) else build(k) for k in kw["keys"]]
    if "dtype" in kw:
        kw["dtype"] = DTYPES[kw["dtype"]]
    if "shape" in kw:
        kw["shape"] = tuple(kw["shape"])
    if "vocabulary_file" in kw:
        kw["vocabulary_file"] = os.path.join(FIXTURES, kw["vocabulary_file"])
    if "initializer" in kw:
        matrix = np.array(kw["initializer"], np.float32)
        kw["initializer"] = lambda shape, m=matrix: m
    return getattr(fc, spec["fn"])(**kw)


def feature(value, form):
    """One recorded feature in an input form the pipeline may deliver:
    "numpy" (numpy arrays, str arrays, rows as lists), "torch" (tensors, bytes
    arrays, rows as tuples), "lists" (Python lists for rank 1, object arrays
    for rank 2, rows as numpy arrays). A dense rank-2 feature is never a list
    of lists: that is a SparseTensor, where '' and -1 count as values."""
    dtype = value["dtype"]
    if "rows" in value:
        rows = value["rows"]
        if form == "torch":
            return [tuple(r) for r in rows]
        if form == "lists":
            return [np.array(r, dtype=object if dtype == "string" else np.float32
                             if dtype == "float32" else np.int64) for r in rows]
        return [list(r) for r in rows]
    dense = value["dense"]
    if dtype == "string":
        if form == "torch":
            return np.array(dense, dtype=bytes)
        if form == "lists":
            return list(dense) if not isinstance(dense[0], list) else np.array(dense, object)
        return np.array(dense, dtype=str)
    np_dtype = np.float32 if dtype == "float32" else np.int64
    if form == "torch":
        return torch.tensor(np.array(dense, np_dtype))
    if form == "lists":
        return dense if not isinstance(dense[0], list) else np.array(dense, object)
    return np.array(dense, np_dtype)


def features_of(keys, form="numpy", source=None):
    source = source or DATA["features"]
    return {k: feature(source[k], form) for k in keys}


def scope(mode=ModeKeys.TRAIN):
    return model_scope.ModelScope(mode, distribute.get_strategy())


def variables_of(s):
    """{TF-style name: shape} of the modules of model scope `s`."""
    flat = est.checkpoint.flat_variables(s.state())
    flat.pop("global_step")
    return {name: list(t.shape) for name, t in flat.items()}


def run_case(case, form="numpy", columns=None):
    columns = columns or [build(spec) for spec in case["columns"]]
    feats = features_of(case["features"], form)
    s = scope()
    with s:
        if case.get("kind") == "linear_model":
            call = lambda: fc.linear_model(feats, columns, units=case["units"],  # noqa: E731
                                           sparse_combiner=case["sparse_combiner"],
                                           scope=case.get("scope"))
            call()
            for owner, module in s.raw_modules.items():
                for key, param in module.named_parameters():
                    name = owner + "/" + key.replace(".", "/")
                    with torch.no_grad():
                        param.copy_(torch.tensor(case["values"][name]).reshape(param.shape))
            out = call()
        else:
            out = fc.input_layer(feats, columns, scope=case.get("scope"))
    return out, variables_of(s)


# -- the recorded values -------------------------------------------------------------------------
def test_fixture_covers_every_column_kind():
    assert DATA["tf_version"].startswith("2.15")
    assert DATA["num_recorded_values"] >= 1000
    fns = set()

    def walk(spec):
        fns.add(spec["fn"])
        for k in ("source_column", "categorical_column"):
            if k in spec:
                walk(spec[k])
        for k in spec.get("keys", []):
            if isinstance(k, dict):
                walk(k)
    for case in DATA["cases"]:
        for spec in case["columns"]:
            walk(spec)
    assert fns == {n for n in fc.__all__ if (n.endswith("_column")   # (sequence columns:
                   or n.startswith("categorical_column")) and "serialize" not in n   # their
                   and not n.startswith("sequence_")}   # own fixture, test_sequence_columns)


@pytest.mark.parametrize("form", ["numpy", "torch", "lists"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_output_and_variables(name, form):
    case = CASES[name]
    out, variables = run_case(case, form)
    want = np.array(case["output"], np.float32)
    assert out.dtype == torch.float32
    assert tuple(out.shape) == want.shape
    np.testing.assert_allclose(out.detach().numpy(), want, atol=ATOL, rtol=RTOL)
    assert variables == {n: s for n, s in case["variables"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_does_not_depend_on_the_order_of_the_columns(name):
    case = CASES[name]
    columns = [build(spec) for spec in case["columns"]]
    random.Random(0).shuffle(columns)
    out, _ = run_case(case, columns=columns[::-1])
    np.testing.assert_allclose(out.detach().numpy(), np.array(case["output"]), atol=ATOL,
                               rtol=RTOL)


def test_linear_model_gradients_repeat_bit_for_bit():
    """A linear model's weights of one-id-a-row columns were read with
    `table[ids]`, whose CPU backward adds repeated ids' gradients in an
    order that varies with the threads: two runs of one seed parted by
    float32 rounding (a text-classification port's losses, 1e-3 apart after
    120 steps), where TF's repeat bit for bit."""
    rng = np.random.RandomState(0)
    feats = {"a": rng.randint(0, 5, (40000, 1)), "b": rng.randint(0, 7, (40000, 1))}
    columns = [fc.categorical_column_with_identity("a", 5),
               fc.categorical_column_with_identity("b", 7)]
    weights = torch.randn(40000, 3, generator=torch.Generator().manual_seed(1))
    grads = set()
    with scope() as s:
        for _ in range(8):
            (fc.linear_model(feats, columns, units=3) * weights).sum().backward()
            for module in s.raw_modules.values():
                grads.add(b"".join(p.grad.numpy().tobytes() for p in module.parameters()))
                module.zero_grad()
    assert len(grads) == 1


def test_standalone_input_layer_matches_without_a_model_scope():
    case = CASES["embedding_combiners"]
    columns = [build(spec) for spec in case["columns"]]
    out = fc.input_layer(features_of(case["features"]), columns)
    np.testing.assert_allclose(out.detach().numpy(), np.array(case["output"]), atol=ATOL,
                               rtol=RTOL)


# -- input forms -----------------------------------------------------------------------------------
def test_a_dense_input_drops_missing_cells_a_sparse_one_keeps_them():
    col = fc.indicator_column(fc.categorical_column_with_hash_bucket("s", 5))
    dense = fc.input_layer({"s": np.array([["", "x"], ["y", ""]])}, [col])
    rows = fc.input_layer({"s": [["", "x"], ["y"]]}, [col])
    empty = fc.input_layer({"s": np.array([[""], [""]])}, [col])
    assert dense.sum().item() == 2 and rows.sum().item() == 3
    assert empty.sum().item() == 0
    # TF's values for these (see record_tf_feature_columns: '' hashes to bucket 0 of 5)
    assert rows[0].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_list_of_str_bytes_and_object_arrays_are_the_same_feature():
    col = fc.indicator_column(fc.categorical_column_with_vocabulary_list("s", ["a", "b", "é"]))
    want = [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    for value in (["a", "é", "b"], np.array(["a", "é", "b"]), np.array(["a", "é", "b"], object),
                  np.array([s.encode() for s in ["a", "é", "b"]]), ("a", "é", "b")):
        assert fc.input_layer({"s": value}, [col]).tolist() == want


def test_multivalent_rows_as_lists_of_lists():
    col = fc.indicator_column(fc.categorical_column_with_vocabulary_list("s", ["a", "b", "c"]))
    out = fc.input_layer({"s": [["a", "a", "c"], [], ["b"]]}, [col])
    assert out.tolist() == [[2, 0, 1], [0, 0, 0], [0, 1, 0]]
    ints = fc.indicator_column(fc.categorical_column_with_identity("i", 3))
    assert fc.input_layer({"i": [[2, 2], [0]]}, [ints]).tolist() == [[0, 0, 2], [1, 0, 0]]


def test_numeric_features_in_every_form():
    col = fc.numeric_column("x", shape=(2,), normalizer_fn=lambda t: t * 2)
    for value in ([[1, 2], [3, 4]], np.array([[1.0, 2.0], [3.0, 4.0]]),
                  torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])):
        out = fc.input_layer({"x": value}, [col])
        assert out.dtype == torch.float32 and out.tolist() == [[2, 4], [6, 8]]


@pytest.mark.parametrize("combiner", ["mean", "sqrtn", "sum"])
def test_a_weighted_column_with_no_id_in_the_whole_batch_gives_tfs_zeros(combiner):
    """Every example's list empty (a replica's slice of a sparse feature):
    "mean" raised OverflowError (numpy's bincount of no rows is int64); TF
    2.15 gives zeros for each combiner, and for the linear model's mean
    (canned probe)."""
    col = fc.weighted_categorical_column(fc.categorical_column_with_hash_bucket("t", 7), "w")
    empty = {"t": [[], [], []], "w": [[], [], []]}
    with model_scope.ModelScope(est.ModeKeys.TRAIN, distribute.get_strategy()):
        out = fc.input_layer(empty, [fc.embedding_column(col, 2, combiner=combiner)])
        assert out.tolist() == [[0.0, 0.0]] * 3
        assert fc.linear_model(empty, [col], sparse_combiner=combiner).tolist() == [[0.0]] * 3


# -- errors ------------------------------------------------------------------------------------------
def test_unknown_feature_key_names_it_and_the_known_keys():
    with pytest.raises(ValueError, match=r"'price'.*\['age', 'city'\]"):
        fc.input_layer({"age": np.ones(2), "city": ["a", "b"]}, [fc.numeric_column("price")])
    col = fc.weighted_categorical_column(
        fc.categorical_column_with_identity("i", 3), "w")
    with pytest.raises(ValueError, match=r"'w'.*\['i'\]"):
        fc.input_layer({"i": [[1]]}, [fc.indicator_column(col)])


@pytest.mark.parametrize("error", DATA["errors"][:2], ids=lambda e: e["name"])
def test_identity_out_of_range_is_an_error_naming_column_and_value(error):
    # TF: "indices[1] == 4 out of range [0, 4)" at run time
    assert "out of range" in error["tf_message"]
    columns = [build(spec) for spec in error["columns"]]
    feats = features_of(["ident"], source=error["features"])
    call = fc.input_layer if error["kind"] == "input_layer" else fc.linear_model
    with pytest.raises(ValueError, match=r"'ident': value 4 is out of range \[0, 4\)"):
        call(feats, columns)
    # an indicator (TF silently gives a zero row) is the same error here
    with pytest.raises(ValueError, match="value 4 is out of range"):
        fc.input_layer(feats, [fc.indicator_column(fc.categorical_column_with_identity(
            "ident", 4))])


def test_identity_negative_values_are_dropped_and_default_value_replaces():
    col = fc.categorical_column_with_identity("i", 3)
    assert fc.input_layer({"i": [[-5, 1]]}, [fc.indicator_column(col)]).tolist() == [[0, 1, 0]]
    col = fc.categorical_column_with_identity("i", 3, default_value=2)
    assert fc.input_layer({"i": [[-5, 7]]}, [fc.indicator_column(col)]).tolist() == [[0, 0, 2]]


def test_missing_vocabulary_file_is_an_error_naming_the_path(tmp_path):
    error = DATA["errors"][2]
    assert error["tf_error"] == "NotFoundError" and "no_such_vocab.txt" in error["tf_message"]
    path = str(tmp_path / "no_such_vocab.txt")
    col = fc.categorical_column_with_vocabulary_file("color", path, vocabulary_size=3)
    with pytest.raises(ValueError, match="no_such_vocab.txt.*does not exist"):
        fc.input_layer({"color": ["red"]}, [fc.indicator_column(col)])
    with pytest.raises(ValueError, match="no_such_vocab.txt.*does not exist"):
        fc.categorical_column_with_vocabulary_file("color", path)
    (tmp_path / "empty.txt").write_text("")   # ("Invalid vocabulary_size in color." before)
    with pytest.raises(ValueError, match=r"vocabulary_file '.*empty.txt' in color is empty"):
        fc.categorical_column_with_vocabulary_file("color", str(tmp_path / "empty.txt"))


def test_vocabulary_file_rules(tmp_path):
    path = tmp_path / "v.txt"
    path.write_bytes(b"a\r\nb\nc\n")
    col = fc.categorical_column_with_vocabulary_file("s", str(path))
    assert col.vocabulary_size == 3
    out = fc.input_layer({"s": ["a", "b", "c", "d"]}, [fc.indicator_column(col)])
    assert out.tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]]
    short = fc.categorical_column_with_vocabulary_file("s", str(path), vocabulary_size=2)
    assert fc.input_layer({"s": ["c"]}, [fc.indicator_column(short)]).tolist() == [[0, 0]]
    big = fc.categorical_column_with_vocabulary_file("s", str(path), vocabulary_size=5)
    with pytest.raises(ValueError, match="larger than the 3 lines"):
        fc.input_layer({"s": ["a"]}, [fc.indicator_column(big)])
    (tmp_path / "dup.txt").write_text("a\nb\na\n")
    dup = fc.categorical_column_with_vocabulary_file("s", str(tmp_path / "dup.txt"))
    with pytest.raises(ValueError, match="'a' twice"):
        fc.input_layer({"s": ["a"]}, [fc.indicator_column(dup)])
    (tmp_path / "ints.txt").write_text("7\n3\n")
    ints = fc.categorical_column_with_vocabulary_file("n", str(tmp_path / "ints.txt"),
                                                      dtype=torch.int64, num_oov_buckets=1)
    assert fc.input_layer({"n": [[3, 7, 9]]}, [fc.indicator_column(ints)]).tolist() == [[1, 1, 1]]


@pytest.mark.parametrize("content, refused", [
    (b" 7\n2\t\n-3\n", None), (b"+7\n2\n", "'+7'"), (b"7\n1_000\n", "'1_000'"),
    ("\u0663\n2\n".encode(), "'\u0663'"), (b"0x10\n", "'0x10'"),
    (b"2\n99999999999999999999\n", "'99999999999999999999'"),
    (b"7\n" + b"9" * 5000 + b"\n", "'" + "9" * 5000 + "'")],
    ids=["spaces", "plus", "underscores", "arabic_digit", "hex", "too_big", "5000_digits"])
def test_integer_vocabulary_file_lines_are_read_as_tf(tmp_path, content, refused):
    """TF 2.15 (a probe ran it): "Field +7 in line 0 is not a valid int64."
    for a sign, underscores, other scripts' digits, hex and too big a
    number, where Python's int() took the first three (1_000 as id 1000);
    spaces around a number are TF's too."""
    path = tmp_path / "ints.txt"
    path.write_bytes(content)
    col = fc.categorical_column_with_vocabulary_file("n", str(path), dtype=torch.int64)
    features = {"n": [[7], [2], [-3], [1000]]}
    if refused is None:
        assert fc.input_layer(features, [fc.indicator_column(col)]).tolist() == [
            [1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]]
        return
    with pytest.raises(ValueError, match=rf"line \d of {re.escape(repr(str(path)))}, "
                                         rf"{re.escape(refused)}, is not a valid int64"):
        fc.input_layer(features, [fc.indicator_column(col)])


def test_a_vocabulary_list_of_a_string_and_its_bytes_is_refused_as_tf():
    """TF's table refuses the duplicate key (both are one tf.string); "a"
    took id 0 and b"a" an id no input reaches."""
    with pytest.raises(ValueError, match="Duplicate keys in vocabulary_list"):
        fc.categorical_column_with_vocabulary_list("s", ["a", b"a", "b"])
    assert fc.categorical_column_with_vocabulary_list("s", ["\ud800", "b"]).num_buckets == 2


@pytest.mark.parametrize("content, tf_position, line", [
    (b"a\n\nc\n", 3, 2), (b"a\nb\n\n", 5, 3), (b"a\n\n", 3, 2)])
def test_an_empty_line_in_a_vocabulary_file_is_refused_as_tf(tmp_path, content, tf_position,
                                                             line):
    """TF 2.15's table refuses it at initialization, "Invalid content in
    <path>: empty line found at position N" (N as it printed for these files,
    a probe ran it); an empty line here was the id of "" (a trailing empty
    line too)."""
    path = tmp_path / "v.txt"
    path.write_bytes(content)
    col = fc.categorical_column_with_vocabulary_file("s", str(path))
    with pytest.raises(ValueError) as raised:
        fc.input_layer({"s": ["a", ""]}, [fc.indicator_column(col)])
    assert (f"Invalid content in {path}: empty line found at position {tf_position} "
            f"(line {line})") in str(raised.value)
    short = fc.categorical_column_with_vocabulary_file("s", str(path), vocabulary_size=1)
    assert fc.input_layer({"s": ["a"]}, [fc.indicator_column(short)]).tolist() == [[1.0]]


def test_a_default_value_outside_the_vocabulary_is_named():
    """TF's indicator gives such a value a zero row; here it is refused, and
    the message says the id is the column's default_value (it said only the
    id and the range)."""
    col = fc.categorical_column_with_vocabulary_list("s", ["a", "b", "c"], default_value=5)
    with pytest.raises(ValueError, match=r"produced id 5, outside \[0, 3\): its default_value"):
        fc.input_layer({"s": ["a", "zz"]}, [fc.indicator_column(col)])


def test_missing_strings_from_pandas_are_named_with_the_fix():
    col = fc.indicator_column(fc.categorical_column_with_vocabulary_list("s", ["a"]))
    with pytest.raises(TypeError, match=r"Feature 's': 2 missing value\(s\) among its strings "
                                        r"\(nan: .*df\['s'\]\.fillna\(''\)"):
        fc.input_layer({"s": np.array(["a", np.nan, None], dtype=object)}, [col])


@pytest.mark.parametrize("make, error, match", [
    (lambda: fc.numeric_column("x", shape=(0,)), ValueError, "greater than 0"),
    (lambda: fc.numeric_column("x", shape=(1.5,)), TypeError, "must be integer"),
    (lambda: fc.numeric_column("x", dtype=str), ValueError, "convertible to float"),
    (lambda: fc.numeric_column("x", normalizer_fn=3), TypeError, "callable"),
    (lambda: fc.numeric_column("x", shape=(2,), default_value=[1.0]), ValueError, "shape"),
    (lambda: fc.numeric_column(3), ValueError, "key must be a string"),
    (lambda: fc.bucketized_column(fc.numeric_column("x"), [2.0, 1.0]), ValueError, "sorted"),
    (lambda: fc.bucketized_column(fc.numeric_column("x"), []), ValueError, "empty"),
    (lambda: fc.bucketized_column("x", [1.0]), ValueError, "numeric_column"),
    (lambda: fc.bucketized_column(fc.numeric_column("x", shape=(2, 2)), [1.0]), ValueError,
     "one-dimensional"),
    (lambda: fc.categorical_column_with_hash_bucket("s", 0), ValueError, "at least 1"),
    (lambda: fc.categorical_column_with_hash_bucket("s", 5, dtype=torch.float32), ValueError,
     "string or integer"),
    (lambda: fc.categorical_column_with_vocabulary_list("s", []), ValueError, "non-empty"),
    (lambda: fc.categorical_column_with_vocabulary_list("s", ["a", "a"]), ValueError,
     "Duplicate"),
    (lambda: fc.categorical_column_with_vocabulary_list("s", ["a"], default_value=0,
                                                       num_oov_buckets=2),
     ValueError, "both num_oov_buckets and default_value"),
    (lambda: fc.categorical_column_with_vocabulary_list("s", ["a"], num_oov_buckets=-1),
     ValueError, "Invalid num_oov_buckets"),
    (lambda: fc.categorical_column_with_vocabulary_list("s", ["a"], dtype=torch.int64),
     ValueError, "do not match"),
    (lambda: fc.categorical_column_with_vocabulary_file("s", ""), ValueError, "Missing"),
    (lambda: fc.categorical_column_with_identity("i", 0), ValueError, "num_buckets 0 < 1"),
    (lambda: fc.categorical_column_with_identity("i", 3, default_value=3), ValueError,
     r"not in range \[0, 3\)"),
    (lambda: fc.crossed_column(["a"], 5), ValueError, "length > 1"),
    (lambda: fc.crossed_column(["a", "b"], 0), ValueError, "hash_bucket_size"),
    (lambda: fc.crossed_column(["a", fc.categorical_column_with_hash_bucket("b", 3)], 5),
     ValueError, "not supported for crossing"),
    (lambda: fc.crossed_column(["a", fc.numeric_column("b")], 5), ValueError,
     "Unsupported key type"),
    (lambda: fc.embedding_column(fc.categorical_column_with_identity("i", 3), 0), ValueError,
     "Invalid dimension"),
    (lambda: fc.embedding_column(fc.categorical_column_with_identity("i", 3), 2,
                                 combiner="max"), ValueError, "combiner"),
    (lambda: fc.embedding_column(fc.categorical_column_with_identity("i", 3), 2,
                                 initializer=1.0), ValueError, "callable"),
    (lambda: fc.embedding_column(fc.categorical_column_with_identity("i", 3), 2,
                                 tensor_name_in_ckpt="emb"), ValueError, "Must specify both"),
    (lambda: fc.embedding_column(fc.categorical_column_with_identity("i", 3), 2,
                                 ckpt_to_load_from="/ckpt"), NotImplementedError,
     "ckpt_to_load_from is not supported"),
    (lambda: fc.embedding_column(fc.categorical_column_with_identity("i", 3), 2,
                                 ckpt_to_load_from="/ckpt", tensor_name_in_ckpt="emb"),
     NotImplementedError, "ckpt_to_load_from is not supported.*WarmStartSettings"),
    (lambda: fc.embedding_column(fc.numeric_column("x"), 2), ValueError, "categorical"),
    (lambda: fc.indicator_column(fc.numeric_column("x")), ValueError, "CategoricalColumn"),
    (lambda: fc.weighted_categorical_column(fc.categorical_column_with_identity("i", 3), "w",
                                            dtype=str), ValueError, "convertible to float"),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("features, columns, match", [
    ({"x": np.ones(2)}, [fc.categorical_column_with_identity("x", 3)], "DenseColumn"),
    ({"x": np.ones(2)}, [], "must not be empty"),
    ({"x": np.ones(2)}, [fc.numeric_column("x"), fc.numeric_column("x")], "Duplicate"),
    ({"x": np.ones(2)}, {"a": fc.numeric_column("x")}, "found dict"),
    ({"s": [1, 2]}, [fc.indicator_column(fc.categorical_column_with_hash_bucket("s", 3))],
     "dtype must be compatible"),
    ({"s": ["a"]}, [fc.indicator_column(fc.categorical_column_with_identity("s", 3))],
     "not integer"),
    ({"s": np.ones(2, np.float32)},
     [fc.indicator_column(fc.categorical_column_with_vocabulary_list("s", [1, 2]))],
     "string or integer values"),
    ({"x": ["a", "b"]}, [fc.numeric_column("x")], "holds strings"),
    ({"x": np.float32(1.0)}, [fc.numeric_column("x")], "rank 0"),
    ({"x": np.ones((2, 3), np.float32)}, [fc.numeric_column("x", shape=(2,))],
     "does not hold 2 values"),
    ({"a": np.ones(2), "b": np.ones(3)}, [fc.numeric_column("a"), fc.numeric_column("b")],
     "Batch size"),
    ({"i": [1], "w": [1.0], "t": ["a"]},
     [fc.indicator_column(fc.crossed_column(
         [fc.weighted_categorical_column(fc.categorical_column_with_identity("i", 3), "w"),
          "t"], 5))], "does not support weight_tensor"),
    ({"i": [[1, 2]], "w": [[1.0]]},
     [fc.indicator_column(fc.weighted_categorical_column(
         fc.categorical_column_with_identity("i", 3), "w"))], "layout"),
    # (an int column pandas made float64 by a missing value: TF truncates it silently)
    ({"hours": np.array([40.0, np.nan]), "t": ["a", "b"]},
     [fc.indicator_column(fc.crossed_column(["hours", "t"], 5))],
     r"feature 'hours' must hold strings or ints, got float64 \(TF's cross casts floats to "
     r"int64, 40.7 to 40, with no word.*cast the column to int64, or bucketize it"),
])
def test_bad_inputs(features, columns, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fc.input_layer(features, columns)


def test_linear_model_arguments():
    with pytest.raises(ValueError, match="sparse_combiner"):
        fc.linear_model({"x": np.ones(2)}, [fc.numeric_column("x")], sparse_combiner="max")
    with pytest.raises(ValueError, match="units"):
        fc.linear_model({"x": np.ones(2)}, [fc.numeric_column("x")], units=0)


# -- other behaviour ---------------------------------------------------------------------------
def test_default_embedding_initializer_is_tf_truncated_normal():
    torch.manual_seed(0)
    dim = 16
    col = fc.embedding_column(fc.categorical_column_with_identity("i", 4000), dim)
    cols_to_vars = {}
    fc.input_layer({"i": [[0]]}, [col], cols_to_vars=cols_to_vars)
    (w,) = cols_to_vars[col]
    std = 1 / np.sqrt(dim)
    assert w.shape == (4000, dim)
    assert w.abs().max().item() <= 2 * std
    # a normal truncated at 2 sigma has standard deviation 0.8796 sigma
    assert abs(w.std().item() - 0.8796 * std) < 0.01 * std
    assert abs(w.mean().item()) < 0.01 * std


def test_cols_to_vars_outputs_and_trainable():
    emb = fc.embedding_column(fc.categorical_column_with_identity("i", 3), 2,
                              initializer=lambda shape: np.ones(shape))
    num = fc.numeric_column("x")
    cols_to_vars, outputs = {}, {}
    s = scope()
    with s:
        out = fc.input_layer({"i": [[1]], "x": [5.0]}, [num, emb], trainable=False,
                             cols_to_vars=cols_to_vars, cols_to_output_tensors=outputs)
    assert out.tolist() == [[1.0, 1.0, 5.0]]   # i_embedding sorts before x
    assert cols_to_vars[num] == [] and not cols_to_vars[emb][0].requires_grad
    assert outputs[num].tolist() == [[5.0]]
    lin_vars = {}
    with scope():
        fc.linear_model({"i": [[1]], "x": [5.0]}, [num, emb], units=3, cols_to_vars=lin_vars)
    assert [tuple(p.shape) for p in lin_vars[emb]] == [(2, 3), (3, 2)]
    assert [tuple(p.shape) for p in lin_vars["bias"]] == [(3,)]


def test_variables_are_created_once_per_scope_and_reused():
    col = fc.embedding_column(fc.categorical_column_with_identity("i", 3), 2)
    s = scope()
    with s:
        a = fc.input_layer({"i": [[1]]}, [col])
        b = fc.input_layer({"i": [[1]]}, [col])
        c = fc.input_layer({"i": [[1]]}, [col], scope="tower")
    assert torch.equal(a, b)
    assert sorted(variables_of(s)) == ["input_layer/i_embedding/embedding_weights",
                                       "tower/input_layer/i_embedding/embedding_weights"]
    assert not torch.equal(a, c)


def test_gradients_reach_the_embedding_and_linear_weights():
    emb = fc.embedding_column(fc.weighted_categorical_column(
        fc.categorical_column_with_vocabulary_list("s", ["a", "b"]), "w"), 2,
        combiner="sqrtn", initializer=lambda shape: np.ones(shape))
    cols_to_vars = {}
    with scope():
        out = fc.linear_model({"s": [["a", "b", "a"]], "w": [[1.0, 2.0, 2.0]]}, [emb],
                              cols_to_vars=cols_to_vars)
    out.sum().backward()
    assert all(p.grad is not None for p in cols_to_vars[emb] + cols_to_vars["bias"])


def test_make_parse_example_spec():
    price = fc.numeric_column("price", shape=(2,), default_value=0.0)
    columns = [
        fc.bucketized_column(price, [1.0]),
        fc.embedding_column(fc.categorical_column_with_hash_bucket("words", 10), 2),
        fc.weighted_categorical_column(fc.categorical_column_with_identity("ids", 5), "w"),
        fc.crossed_column(["a", fc.categorical_column_with_vocabulary_list("n", [1, 2])], 7),
    ]
    assert fc.make_parse_example_spec(columns) == {
        "price": fc.FixedLenFeature((2,), torch.float32, (0.0, 0.0)),
        "words": fc.VarLenFeature(str),
        "ids": fc.VarLenFeature(torch.int64),
        "w": fc.VarLenFeature(torch.float32),
        "a": fc.VarLenFeature(str),
        "n": fc.VarLenFeature(torch.int64),
    }
    with pytest.raises(ValueError, match="different parse_spec for key price"):
        fc.make_parse_example_spec([price, fc.numeric_column("price")])


def test_column_names_follow_tf():
    price = fc.numeric_column("price")
    color = fc.categorical_column_with_vocabulary_list("color", ["r"])
    assert fc.bucketized_column(price, [1.0]).name == "price_bucketized"
    assert fc.embedding_column(color, 2).name == "color_embedding"
    assert fc.indicator_column(color).name == "color_indicator"
    assert fc.weighted_categorical_column(color, "w").name == "color_weighted_by_w"
    cross = fc.crossed_column(["z", fc.bucketized_column(price, [1.0]), "a"], 5)
    assert cross.name == "a_X_price_bucketized_X_z"
    assert fc.crossed_column([cross, "b"], 5).name == "a_X_b_X_price_bucketized_X_z"
    assert fc.numeric_column("p") == fc.numeric_column("p")   # columns compare by value


# -- end to end --------------------------------------------------------------------------------------
CITIES = ["paris", "rome", "oslo", "lima"]


def _e2e_columns():
    city = fc.categorical_column_with_vocabulary_list("city", CITIES, num_oov_buckets=1)
    age = fc.bucketized_column(fc.numeric_column("age"), [20.0, 40.0, 60.0])
    return [fc.embedding_column(city, 3), age]


def _e2e_model_fn(features, labels, mode, params):
    net = fc.input_layer(features, _e2e_columns())            # [batch, 3 + 4]
    head = est.get_module("head", lambda: torch.nn.Linear(7, 1))
    pred = head(net)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": pred})
    loss = torch.nn.functional.mse_loss(pred, labels)
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def _e2e_data(n=64, seed=0):
    rng = np.random.RandomState(seed)
    city = rng.choice(CITIES + ["tokyo"], n)
    age = rng.uniform(0, 80, n).astype(np.float32)
    y = (np.array([CITIES.index(c) if c in CITIES else 2 for c in city]) * 0.5
         + (age > 40)).astype(np.float32)[:, None]
    return city, age, y


def _e2e_input_fn(repeat=True):
    city, age, y = _e2e_data()

    def input_fn():
        def gen():
            while True:
                for i in range(0, len(y), 16):
                    yield {"city": city[i:i + 16], "age": age[i:i + 16]}, y[i:i + 16]
                if not repeat:
                    return
        return gen()
    return input_fn


def test_estimator_trains_saves_restores_and_predicts_identically(tmp_path):
    torch.manual_seed(0)
    model_dir = str(tmp_path / "model")
    first = est.Estimator(_e2e_model_fn, config=est.RunConfig(model_dir=model_dir))
    first.train(_e2e_input_fn(), steps=20)
    names = first.get_variable_names()
    assert "input_layer/city_embedding/embedding_weights" in names
    assert est.checkpoint.list_variables(model_dir)[names.index(
        "input_layer/city_embedding/embedding_weights")][1] == [5, 3]
    before = [p["y"] for p in first.predict(_e2e_input_fn(repeat=False))]

    second = est.Estimator(_e2e_model_fn, config=est.RunConfig(model_dir=model_dir))
    after = [p["y"] for p in second.predict(_e2e_input_fn(repeat=False))]
    assert len(after) == 64
    np.testing.assert_array_equal(np.array(before), np.array(after))

    # the predictions are the restored variables at work
    table = second.get_variable_value("input_layer/city_embedding/embedding_weights")
    w = second.get_variable_value("head/weight")
    b = second.get_variable_value("head/bias")
    city, age, _ = _e2e_data()
    ids = [CITIES.index(c) if c in CITIES else 4 for c in city]
    buckets = np.eye(4)[np.searchsorted([20.0, 40.0, 60.0], age, side="right")]
    net = np.concatenate([buckets, table[ids]], 1)   # age_bucketized sorts before city_embedding
    np.testing.assert_allclose(np.array(after), net @ w.T + b, atol=1e-5)


def test_large_batches_take_the_same_ids_as_small_ones():
    """Batches over 64 strings look up and hash each distinct value once
    (np.unique); the ids equal those of the same values taken a few at a time."""
    rng = np.random.default_rng(0)
    words = np.array(["a", "b", "", "zebra", "b" * 70, "οδός", "c"])[rng.integers(0, 7, 300)]
    vocab = fc.categorical_column_with_vocabulary_list("w", ["a", "b", "zebra"],
                                                       num_oov_buckets=3)
    hashed = fc.categorical_column_with_hash_bucket("h", 20)
    cross = fc.crossed_column(["w", vocab], 50)
    columns = [fc.indicator_column(vocab), fc.indicator_column(hashed),
               fc.indicator_column(cross)]
    whole = fc.input_layer({"w": words, "h": words}, columns)
    parts = torch.cat([fc.input_layer({"w": words[i:i + 5], "h": words[i:i + 5]}, columns)
                       for i in range(0, len(words), 5)])
    assert torch.equal(whole, parts)


# -- the linear model's one lookup, and transforms shared between layers ----------------------
def _wide_columns():
    return [fc.categorical_column_with_vocabulary_list("color", ["red", "green", "blue"],
                                                       num_oov_buckets=1),
            fc.categorical_column_with_hash_bucket("word", 5),
            fc.crossed_column(["color", "word"], 7),
            fc.bucketized_column(fc.numeric_column("price"), [0.0, 10.0]),
            fc.numeric_column("price")]


def _by_hand(features, columns, variables):
    """The linear model column by column: weights rows of each id summed (a
    row's empty bag adds nothing), dense values times weights, plus bias."""
    from estimator.feature_column._inputs import Builder   # the ids, TF-checked above
    builder = Builder(features)
    out = variables["linear_model/bias_weights"].detach().clone().expand(len(features["price"]), -1).clone()
    for column in columns:
        weights = variables[f"linear_model/{column.name}/weights"].detach()
        if isinstance(column, fc.CategoricalColumn):
            ids = column._valid_ids(builder, prune_weights=False)
            for value, row in zip(ids.values, ids.rows):
                out[row] += weights[value]
        else:
            out += torch.as_tensor(features[column.key], dtype=torch.float32)[:, None] @ weights
    return out


@pytest.mark.parametrize("one_per_row", [True, False])
def test_linear_model_lookup_equals_column_by_column(one_per_row):
    """The fused lookup (an index of one id per row, or one embedding_bag over
    the merged bags when a row holds none or several) against the sum column
    by column, on trained-looking weights."""
    columns = _wide_columns()
    features = {"color": np.array(["red", "blue", "pink", "green"]),
                "word": np.array(["a", "b", "c", "a"]),
                "price": np.array([-1.0, 5.0, 20.0, 3.0], np.float32)}
    if not one_per_row:   # rows of 2, 0, 1 and 3 words; '' counts in a list, as in TF
        features["word"] = [["a", "b"], [], ["c"], ["a", "", "b"]]
    s = scope()
    with s:
        fc.linear_model(features, columns, units=2)   # creates the variables
        torch.manual_seed(0)
        for module in s.modules.values():
            for p in module.parameters():
                torch.nn.init.uniform_(p.data, -1, 1)
        out = fc.linear_model(features, columns, units=2)
    named = est.checkpoint.flat_variables(s.state())
    torch.testing.assert_close(out, _by_hand(features, columns, named))


def test_linear_model_refuses_other_columns_under_the_same_scope():
    with scope():
        fc.linear_model({"x": np.ones(2)}, [fc.numeric_column("x")])
        with pytest.raises(ValueError, match=r"built over the columns \['x'\]; this call "
                                             r"gives \['y'\].*scope="):
            fc.linear_model({"y": np.ones(2)}, [fc.numeric_column("y")])


def test_one_transformation_cache_transforms_each_column_once():
    calls = []

    def normalize(t):
        calls.append(1)
        return t * 2
    price = fc.numeric_column("price", normalizer_fn=normalize)
    color = fc.categorical_column_with_vocabulary_list("color", ["a", "b"])
    features = {"price": np.array([1.0, 2.0]), "color": np.array(["a", "b"])}
    with scope():
        cache = fc.FeatureTransformationCache(features)
        dense = fc.input_layer(cache, [price, fc.indicator_column(color)])
        fc.linear_model(cache, [price, color])
        assert len(calls) == 1
        fc.input_layer(features, [price])   # a plain dict: transformed again
    assert len(calls) == 2
    assert dense.tolist() == [[1.0, 0.0, 2.0], [0.0, 1.0, 4.0]]


def test_columns_made_on_each_call_are_planned_each_time():
    """Columns built inside a model_fn are new objects on every call: each call
    plans its own, and the plans kept stay bounded."""
    from estimator.feature_column import _layers
    with scope():
        for i in range(_layers._PLANS_MAX + 10):
            out = fc.input_layer({"x": np.full(2, float(i))},
                                 [fc.numeric_column("x", normalizer_fn=lambda t, i=i: t + i)])
            assert out.tolist() == [[2.0 * i], [2.0 * i]]
    assert len(_layers._PLANS) <= _layers._PLANS_MAX


def test_features_of_an_empty_batch_as_lists_fit_every_column():
    """An empty list (a batch with no rows: the empty batch of a replica
    without data) was read as float64, and string and id columns refused it."""
    def model_fn(features, labels, mode):
        columns = [
            fc.numeric_column("x"),
            fc.indicator_column(fc.categorical_column_with_vocabulary_list("c", ["a", "b"])),
            fc.embedding_column(fc.categorical_column_with_hash_bucket("h", 5), 2),
            fc.indicator_column(fc.crossed_column(["c", "h"], 7)),
            fc.embedding_column(fc.categorical_column_with_identity("t", 9), 3)]
        net, linear = fc.input_layer(features, columns), fc.linear_model(features, columns[:2])
        shapes.append((tuple(net.shape), tuple(linear.shape)))
        return est.EstimatorSpec(mode, loss=net.sum(), train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    shapes = []
    e = est.Estimator(model_fn)
    e.train(lambda: [({"x": [1.0, 2.0], "c": ["a", "b"], "h": ["q", "r"], "t": [[1, 2], [3]]},
                      None), ({"x": [], "c": [], "h": [], "t": []}, None)], steps=2)
    assert shapes == [((2, 15), (2, 1)), ((0, 15), (0, 1))]
