"""Multi-label tagging as a TF1 program wrote it with
``tf.contrib.estimator.multi_label_head`` and ``DNNEstimator``: listings
(words of their title, a price) get any of three tags, trained with
``train_and_evaluate``, exported with a parsing receiver by a
``LatestExporter``, served by `estimator serve` and classified over HTTP as a
TF Serving client would (the answer names the tags, as TF Serving does).

    python examples/multi_label_tags.py [--workdir runs/multi_label_tags]
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import estimator as est  # noqa: E402
from examples.serving_client import post, served  # noqa: E402

fc = est.feature_column
WORDS = ["cheap", "fast", "red", "big", "new", "old"]
TAGS = ["bargain", "speedy", "premium"]
COLUMNS = [fc.embedding_column(fc.categorical_column_with_vocabulary_list("title", WORDS), 4),
           fc.numeric_column("price")]


def listings(n: int, seed: int):
    """({"title": up to 4 words a row, padded with "", "price"}, the tags of
    each row padded with ""): a row may have no tag, or all three."""
    rng = np.random.default_rng(seed)
    title = np.where(rng.random((n, 4)) < 0.6, rng.choice(WORDS, (n, 4)), "")
    price = rng.normal(size=(n, 1)).astype(np.float32)
    has = np.stack([(title == "cheap").any(1) | (price[:, 0] < -0.5),
                    (title == "fast").any(1),
                    (title == "new").any(1) & (price[:, 0] > 0)], 1)
    return {"title": title, "price": price}, np.where(has, np.array(TAGS), "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/multi_label_tags")
    parser.add_argument("--train_steps", type=int, default=300)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    (x, tags), (x_eval, tags_eval) = listings(2000, 0), listings(500, 1)

    head = est.MultiLabelHead(len(TAGS), label_vocabulary=TAGS, thresholds=[0.5])
    estimator = est.DNNEstimator(head, [16], COLUMNS, optimizer="Adam",
                                 model_dir=os.path.join(args.workdir, "model"))
    receiver = est.export.build_parsing_serving_input_receiver_fn(
        fc.make_parse_example_spec(COLUMNS))
    result, _ = est.train_and_evaluate(
        estimator,
        est.TrainSpec(est.inputs.numpy_input_fn(x, tags, 64, None, True),
                      max_steps=args.train_steps),
        est.EvalSpec(est.inputs.numpy_input_fn(x_eval, tags_eval, 128, 1, False),
                     throttle_secs=0, exporters=[est.LatestExporter("latest", receiver)]))
    print(f"auc {result['auc']:.3f}, accuracy at 0.5 "
          f"{result['accuracy/positive_threshold_0.5']:.3f}")

    few = {k: v[:3] for k, v in x_eval.items()}
    examples = [{"title": [w for w in few["title"][i] if w], "price": float(few["price"][i, 0])}
                for i in range(3)]
    with served(os.path.join(args.workdir, "model", "export", "latest"), "tags") as (url, _):
        classified = post(url + ":classify", {"examples": examples})
    for example, row in zip(examples, classified["results"]):
        print(example, {tag: round(score, 3) for tag, score in row})
    return {"eval": result, "classify": classified, "examples": few}


if __name__ == "__main__":
    main()
