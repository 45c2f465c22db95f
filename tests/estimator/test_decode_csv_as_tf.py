"""How decode_csv splits records with quotes and line breaks, against TF
2.15's recording (tests/support/fixtures/record_tf_decode_csv_quotes.py):
a quoted field ends at a quote followed by the delimiter or the end, `""`
is a quote, and a stray quote or line break is an error in TF's words (no
silent `"ab"c` -> `abc`, as Python's csv module reads it); and
make_csv_dataset names the file and line of such a record. Which texts are
numbers, against TF's recording (record_tf_decode_csv_numbers.py)."""
import json
import os

import numpy as np
import pytest

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_decode_csv_quotes.json"), encoding="utf-8") as _f:
    TF = json.load(_f)["cases"]


def _decode(record, use_quote_delim):
    try:
        columns = est.io.decode_csv([record], record_defaults=[[""], [""]],
                                    use_quote_delim=use_quote_delim)
    except est.io.DecodeCSVError as e:
        return {"error": str(e)}
    return {"fields": [c[0].decode() for c in columns]}


@pytest.mark.parametrize("case", TF, ids=[repr(c["record"]) for c in TF])
@pytest.mark.parametrize("quoting", ["quoted", "unquoted"])
def test_records_split_as_tf(case, quoting):
    got, want = _decode(case["record"], quoting == "quoted"), case[quoting]
    if "error" in want:   # TF's words, then where (the field, the record)
        assert got.keys() == {"error"} and got["error"].startswith(
            want["error"].replace(" in record 0", "")), got
        assert got["error"].endswith("in record 0")
    else:
        assert got == want


def test_make_csv_dataset_names_the_line_of_a_stray_quote(tmp_path):
    """`"big"ger`: a quote not followed by the delimiter or a line break does
    not close the field, which goes on to the end of the file, as in TF 2.15
    ("Reached end of file without closing quoted field"); a quote inside a
    field not quoted is that record's error alone."""
    path = tmp_path / "data.csv"
    path.write_text('name,size\n"ok",1\n"big"ger,2\n')
    dataset = est.data.make_csv_dataset(str(path), batch_size=4, num_epochs=1, shuffle=False)
    with pytest.raises(ValueError, match=rf'{path}, line 3: a quoted field opened on this line '
                                         'is not closed before the end of the file'):
        list(dataset)
    path.write_text('name,size\n"ok",1\nbig"ger,2\n')
    dataset = est.data.make_csv_dataset(str(path), batch_size=4, num_epochs=1, shuffle=False)
    with pytest.raises(ValueError, match=rf'{path}, line 3: Unquoted fields cannot have quotes '
                                         r'inside \(field 0\)'):
        list(dataset)


with open(os.path.join(FIXTURES, "tf_decode_csv_numbers.json"), encoding="utf-8") as _f:
    NUMBERS = json.load(_f)["cases"]
_DTYPES = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "float64": np.float64}


@pytest.mark.parametrize("case", NUMBERS, ids=[repr(c["text"]) for c in NUMBERS])
@pytest.mark.parametrize("dtype", list(_DTYPES))
def test_numbers_read_as_tf(case, dtype):
    """What TF reads as a number and as which (recorded by
    record_tf_decode_csv_numbers.py): Python's int() and float() take more
    ('1_000', '+7' as an int, 'Infinity', other scripts' digits)."""
    want = case[dtype]
    try:
        (column,) = est.io.decode_csv([case["text"]], record_defaults=[_DTYPES[dtype]])
    except est.io.DecodeCSVError as e:
        assert str(e) == want.get("error"), want
        return
    assert "value" in want, f"read {column[0]!r}; TF: {want['error']}"
    assert column.dtype == _DTYPES[dtype]
    if dtype.startswith("int"):
        assert int(column[0]) == want["value"]
    else:
        assert repr(float(column[0])) == want["value"]


def test_bytes_that_are_not_utf8_come_back_as_they_were():
    """TF's decode_csv works on bytes (b'\\xff' comes back b'\\xff'); it was a
    UnicodeDecodeError here, in make_csv_dataset too."""
    columns = est.io.decode_csv([b"\xff,0", b"a\xfe,1"], record_defaults=[[""], [0]])
    assert columns[0].tolist() == [b"\xff", b"a\xfe"] and columns[1].tolist() == [0, 1]
