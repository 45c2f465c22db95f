"""The boosted trees' quantile sketch (`estimator/canned/_quantiles.py`)
against TF 2.8's kernels (tests/support/fixtures/record_tf_quantiles.py):
the stream's final summary of batches pushed as TF pushes them, and the
boundaries flushed from it. Unweighted, the final summary is TF's exactly;
weighted with repeated values, equal values' weights are summed in
another order than TF's sort (float32 ranks a few ulps apart). TF 2.8's
compiled kernel keeps fewer boundaries than its source's compression
reads (29 of these 32 cases as here, with the one before the last
dropped; without that, 11): elsewhere the boundaries differ by one."""
import json
import os

import numpy as np
import pytest

from estimator.canned import _quantiles
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_quantiles.json"), encoding="utf-8") as _f:
    CASES = json.load(_f)["cases"]


def _final(case):
    values = np.asarray(case["values"], np.float32)
    weights = np.asarray(case["weights"], np.float32)
    stream = _quantiles.Stream(case["eps"], _quantiles.MAX_ELEMENTS)
    for part in case["parts"]:
        stream.push_summary(_quantiles.batch_summary(
            values[part], weights if len(weights) == 1 else weights[part], case["eps"]))
    return stream.finalize()


@pytest.mark.parametrize("case", [c for c in CASES if not c["weighted"]],
                         ids=lambda c: f"{len(c['values'])}-{c['eps']}-{c['num_buckets']}")
def test_the_final_summary_of_unweighted_values_is_tfs(case):
    final = _final(case)
    assert [[float(x) for x in entry] for entry in final.entries] == case["final_summary"]


def test_the_boundaries_are_tfs_or_a_boundary_or_two_apart():
    equal = 0
    for case in CASES:
        got = _final(case).boundaries(case["num_buckets"])
        if got == case["boundaries"]:
            equal += 1
            continue
        assert len(got) <= case["num_buckets"] and len(case["boundaries"]) <= len(got) + 2
        assert len(set(got) ^ set(case["boundaries"])) <= 4, case["num_buckets"]
    assert equal >= 0.75 * len(CASES), f"{equal} of {len(CASES)}"


def test_bucketize_is_tfs_lower_bound():
    """TF's BoostedTreesBucketize: the first boundary not below the value, the
    last for larger ones, 0 for NaN or without boundaries."""
    values = np.array([-5.0, 0.0, 0.5, 1.0, 7.0, np.nan], np.float32)
    assert _quantiles.bucketize(values, [0.0, 1.0, 2.0]).tolist() == [0, 0, 1, 1, 2, 0]
    assert _quantiles.bucketize(values, []).tolist() == [0] * 6
