"""TF 1.x's wide & deep tutorial in its pandas form, ported: the census rows
in a DataFrame, fed with `pandas_input_fn`, evaluated in memory while it
trains (TF's `InMemoryEvaluatorHook`).

    python examples/census_pandas.py [--train_steps 1000] [--every_n_iter 200]

The TF 1.x program read the census CSV with `pd.read_csv` and trained with
`tf.estimator.inputs.pandas_input_fn(x=df, y=labels, num_epochs=None,
shuffle=True)`; here the rows are the synthetic census of
`examples/census_data.py` as a DataFrame (strings as pandas reads them, ages
float64), the model `census_wide_deep.build_estimator`'s. Needs pandas.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import estimator as est  # noqa: E402
from examples.census_data import make_census  # noqa: E402
from examples.census_wide_deep import build_estimator  # noqa: E402


def census_frame(n: int, seed: int):
    """(DataFrame of the census columns, Series of 0/1 labels)."""
    features, labels = make_census(n, seed)
    frame = pd.DataFrame(features)
    frame["age"] = frame["age"].astype("float64")          # as read_csv gives it
    return frame, pd.Series(labels, index=frame.index, name="income_bracket")


def run(model_dir, train_steps=1000, every_n_iter=200, batch_size=256, seed=0):
    """Train on 20000 rows with an in-memory evaluation on 5000 others every
    `every_n_iter` steps; return the final evaluation."""
    train_x, train_y = census_frame(20000, 0)
    test_x, test_y = census_frame(5000, 1)
    model = build_estimator(model_dir, "wide_deep", config=est.RunConfig(tf_random_seed=seed))
    test_input_fn = est.inputs.pandas_input_fn(test_x, test_y, batch_size=batch_size,
                                               num_epochs=1, shuffle=False)
    evaluator = est.experimental.InMemoryEvaluatorHook(model, test_input_fn,
                                                       every_n_iter=every_n_iter, name="test")
    model.train(est.inputs.pandas_input_fn(train_x, train_y, batch_size=batch_size,
                                           num_epochs=None, shuffle=True),
                max_steps=train_steps, hooks=[evaluator])
    return model.evaluate(test_input_fn, name="test")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/census_pandas")
    parser.add_argument("--train_steps", type=int, default=1000)
    parser.add_argument("--every_n_iter", type=int, default=200)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    results = run(args.model_dir, args.train_steps, args.every_n_iter)
    for key in sorted(results):
        print(f"{key}: {results[key]}")
    return results


if __name__ == "__main__":
    main()
