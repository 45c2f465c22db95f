"""Columns remember what they gave each string (`feature_column._memo`): the
ids must be those of the plain computation whatever came before — new strings
arriving late, missing cells, bytes beside str, several columns and a cross on
one feature, and a feature with more distinct strings than the memo keeps."""
import itertools

import numpy as np
import pytest

from estimator import _hashing
from estimator import feature_column as fc
from estimator.feature_column import _memo
from estimator.feature_column._inputs import Builder

_fresh = itertools.count()


def _words(rng, n, pool):
    return np.array(pool)[rng.integers(0, len(pool), n)]


def _expected(city, job, vocab):
    """Ids by the plain definitions: the vocabulary (OOV hashed into 2 buckets
    after it), Fingerprint64 % 30, and TF's cross of the two strings."""
    def vocab_id(v):
        return vocab.index(v) if v in vocab else len(vocab) + _hashing.hash_bucket([v], 2)[0]
    keep = [i for i, v in enumerate(city) if v not in ("", b"")]
    city_text = [v.decode() if isinstance(v, bytes) else v for v in city]
    return ([vocab_id(city_text[i]) for i in keep],
            _hashing.hash_bucket([v for v in job if v not in ("", b"")], 30).tolist(),
            [row[0] for row in _hashing.cross_hash([list(city), list(job)], 40)])


def _ids(columns, features):
    builder = Builder(features)
    return [column._valid_ids(builder, prune_weights=False).values.tolist()
            for column in columns]


@pytest.mark.parametrize("limit", [None, 5])
def test_remembered_ids_equal_the_plain_ones_batch_after_batch(monkeypatch, limit):
    if limit is not None:   # a memo that overflows: every later batch computed afresh
        monkeypatch.setattr(_memo, "LIMIT", limit)
    n = next(_fresh)
    city_key, job_key = f"city{n}", f"job{n}"
    vocab = ["paris", "oslo", "lima"]
    city = fc.categorical_column_with_vocabulary_list(city_key, vocab, num_oov_buckets=2)
    job = fc.categorical_column_with_hash_bucket(job_key, 30)
    cross = fc.crossed_column([city_key, job_key], 40)
    rng = np.random.default_rng(n)
    cities, jobs = ["paris", "oslo", "", "rome"], ["cook", "pilot", "", "nurse", "οδός"]
    for step in range(12):
        if step == 6:   # new strings arrive late
            cities, jobs = cities + ["lima", "kyiv", "x" * 40], jobs + ["judge", "miner"]
        size = int(rng.integers(1, 70))
        c, j = _words(rng, size, cities), _words(rng, size, jobs)
        if step % 3 == 2:
            c = np.char.encode(c, "utf-8")   # bytes beside str: the same ids
        got = _ids([city, job, cross], {city_key: c, job_key: j})
        assert got == [list(map(int, e)) for e in _expected(list(c), list(j), vocab)], step


def test_a_cross_given_bytes_after_str_crosses_the_bytes():
    """Codes come from one table per feature and str / bytes kind, each
    numbering its strings from 0: a cross remembered str rows' ids by their
    codes, and gave a bytes batch's rows those of the str rows of the same
    codes (b"b" x b"y" crossed as "a" x "x")."""
    n = next(_fresh)
    keys = [f"c{n}", f"h{n}"]
    cross = fc.crossed_column(keys, 1000)
    batches = [(["a"], ["x"]), ([b"b"], [b"y"]), (["b"], [b"x"]), ([b"a"], ["y"])]
    for c, h in batches:
        got = _ids([cross], {keys[0]: np.array(c), keys[1]: np.array(h)})[0]
        assert got == [_hashing.cross_hash([c, h], 1000)[0][0]], (c, h)


def test_a_cross_of_four_features_and_of_a_column_still_matches():
    """Crosses the packed-code memo does not take (more than three features, a
    column among the keys) go the plain way."""
    n = next(_fresh)
    keys = [f"k{n}_{i}" for i in range(4)]
    rng = np.random.default_rng(1)
    four = fc.crossed_column(keys, 50)
    vocab = fc.categorical_column_with_vocabulary_list(keys[0], ["a", "b"], num_oov_buckets=1)
    mixed = fc.crossed_column([vocab, keys[1]], 50)
    for _ in range(3):
        features = {k: _words(rng, 9, ["a", "b", "c"]) for k in keys}
        got_four, got_mixed = _ids([four, mixed], features)
        assert got_four == [r[0] for r in _hashing.cross_hash(
            [list(features[k]) for k in keys], 50)]
        ids0 = [{"a": 0, "b": 1}.get(v, 2) for v in features[keys[0]]]
        assert got_mixed == [r[0] for r in _hashing.cross_hash(
            [ids0, list(features[keys[1]])], 50)]


def test_string_codes_number_strings_in_order_of_arrival_and_stop_at_the_limit():
    table = _memo.StringCodes(limit=4)
    assert table.codes(np.array(["b", "a", "b"])).tolist() == [1, 0, 1]
    assert table.codes(np.array(["c", "a"])).tolist() == [2, 0]
    assert table.strings(0).tolist() == ["a", "b", "c"] and table.strings(2).tolist() == ["c"]
    assert table.codes(np.array(["d", "e"])) is None and table.full
    assert table.codes(np.array(["a"])) is None   # full: no codes from then on


def test_a_used_column_pickles_and_copies_without_its_memos():
    """Memos are keyed by this process's tables: a pickled or copied column
    starts without them and gives the same ids."""
    import copy
    import pickle
    n = next(_fresh)
    key = f"w{n}"
    column = fc.crossed_column([key, fc.categorical_column_with_vocabulary_list(
        key, ["a", "b"], num_oov_buckets=1)], 20)
    words = np.array(["a", "b", "c", "a", "zz"])
    want = _ids([column], {key: words})
    assert "_memos" in column.__dict__
    for other in (pickle.loads(pickle.dumps(column)), copy.deepcopy(column)):
        assert "_memos" not in other.__dict__ and other == column
        assert _ids([other], {key: words}) == want


def test_long_strings_stop_the_table_at_its_size_limit(monkeypatch):
    monkeypatch.setattr(_memo, "BYTES_LIMIT", 4096)
    table = _memo.StringCodes()
    assert table.codes(np.array(["x" * 100, "y"])) is not None   # 2 x 400 bytes
    assert table.codes(np.array(["z" * 400, "y"])) is None and table.full   # 3 x 1600
