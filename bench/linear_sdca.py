"""What a step of `LinearClassifier(optimizer=est.experimental.LinearSDCA(...))`
costs against the same classifier trained by FTRL (TF1's default), on the
same batches: a numeric column of 10 values, a 100-word vocabulary column and
a hashed column (`--buckets`), batches of `--batch` examples with distinct
ids. SDCA visits a batch's examples one after another (TF's kernel does the
same in C++); FTRL is one vectorized update. Prints steps/s of each (median
of alternating rounds), their ratio and SDCA's microseconds per example.

    python bench/linear_sdca.py [--rounds 3] [--steps 200] [--batch 128] [--buckets 1000]

For reference, TF 2.15's SDCA kernel on the same model: 1.45 ms a step over
1000 steps including its graph build (measured on the machine of the
session-53 note).
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import estimator as est  # noqa: E402

fc = est.feature_column


def _data(n: int, seed: int = 0) -> tuple:
    rng = np.random.RandomState(seed)
    words = np.array([f"w{i}" for i in range(100)])
    features = {"id": np.array([f"e{i}" for i in range(n)]),
                "x": rng.randn(n, 10).astype(np.float32),
                "c": words[rng.randint(0, 100, n)], "h": words[rng.randint(0, 100, n)]}
    return features, (features["x"][:, 0] > 0).astype(np.float32)[:, None], list(words)


def _steps_per_second(optimizer, data, batch: int, steps: int, buckets: int) -> float:
    features, labels, words = data
    n = len(labels)
    columns = [fc.numeric_column("x", shape=(10,)),
               fc.categorical_column_with_vocabulary_list("c", words),
               fc.categorical_column_with_hash_bucket("h", buckets)]

    def input_fn():
        start = 0
        while True:   # (batches of distinct ids: no batch crosses the end of the data)
            rows = np.arange(start, start + batch) % n
            yield {k: v[rows] for k, v in features.items()}, labels[rows]
            start = (start + batch) % (n - n % batch)
    with tempfile.TemporaryDirectory() as model_dir:
        e = est.LinearClassifier(columns, model_dir=model_dir, optimizer=optimizer())
        e.train(input_fn, steps=5)   # (the model built, the first checkpoint written)
        start = time.perf_counter()
        e.train(input_fn, steps=steps)
        return steps / (time.perf_counter() - start)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="LinearSDCA against FTRL, per step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--buckets", type=int, default=1000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    data = _data(32 * args.batch)
    sides = {"sdca": lambda: est.experimental.LinearSDCA(
        "id", symmetric_l2_regularization=2.0), "ftrl": lambda: "Ftrl"}
    runs = {side: [] for side in sides}
    for i in range(args.rounds):   # alternating, each side first in turn
        for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            runs[side].append(_steps_per_second(sides[side], data, args.batch, args.steps,
                                                args.buckets))
    sdca, ftrl = (statistics.median(runs[s]) for s in ("sdca", "ftrl"))
    ratio = statistics.median(a / b for a, b in zip(runs["sdca"], runs["ftrl"]))
    print(f"batch {args.batch}, {args.buckets} hash buckets: sdca {sdca:.1f} steps/s "
          f"({1e6 / sdca / args.batch:.1f} us an example), ftrl {ftrl:.1f} steps/s, "
          f"ratio sdca/ftrl {ratio:.3f} (median of {args.rounds} rounds)", flush=True)
    return {"sdca": sdca, "ftrl": ftrl, "ratio": ratio}


if __name__ == "__main__":
    main()
