"""A TF-data pipeline end to end without TensorFlow: census-style rows written
as a TFRecord file of tf.Examples, a canned estimator trained from it through
`est.data.TFRecordDataset` + `est.io.parse_example`, exported, served by
`estimator serve` (TF Serving's REST API) and queried with plain HTTP as a TF
Serving client would.

    python examples/census_tfrecord_serving.py [--workdir runs/census_tfrecord]

The model is a wide & deep classifier over numeric and string columns
(education by vocabulary, occupation hashed, their cross, gender). It is
exported with a parsing receiver (TF's
``build_parsing_serving_input_receiver_fn``): the export's torch program
takes numbers, and its ``transform.json`` holds the parse spec and the
columns' string work, which the server runs first. The client sends
serialized tf.Examples (base64) to ``:predict`` and JSON examples to
``:classify``, as it would to TF Serving.
"""
from __future__ import annotations

import argparse
import base64
import logging
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import estimator as est  # noqa: E402
from examples.census_data import make_census  # noqa: E402
from examples.serving_client import post, served  # noqa: E402

fc = est.feature_column


def age_scaled(x):
    return (x - 50.0) / 20.0


def hours_scaled(x):
    return (x - 40.0) / 12.0


AGE = fc.numeric_column("age", normalizer_fn=age_scaled)
HOURS = fc.numeric_column("hours_per_week", normalizer_fn=hours_scaled)
EDUCATION = fc.categorical_column_with_vocabulary_list(
    "education", ["Bachelors", "HS-grad", "11th", "Masters", "9th", "Some-college",
                  "Assoc-acdm", "Doctorate"], num_oov_buckets=1)
OCCUPATION = fc.categorical_column_with_hash_bucket("occupation", 50)
GENDER = fc.categorical_column_with_vocabulary_list("gender", ["Female", "Male"])
WIDE = [EDUCATION, OCCUPATION, GENDER, fc.crossed_column(["education", "occupation"], 100)]
DEEP = [AGE, HOURS, fc.embedding_column(OCCUPATION, 4), fc.indicator_column(EDUCATION),
        fc.indicator_column(GENDER)]
FEATURE_SPEC = fc.make_parse_example_spec(WIDE + DEEP)
SPEC = {**FEATURE_SPEC, "label": est.io.FixedLenFeature([], torch.int64)}


def example_of(features: dict, i: int, label=None) -> est.io.Example:
    """Row `i` of `features` as a tf.Example (floats, and strings as bytes)."""
    example = est.io.Example()
    feature = example.features.feature
    for key, values in features.items():
        value = values[i]
        if isinstance(value, str):
            feature[key].bytes_list.value.append(value.encode())
        else:
            feature[key].float_list.value.append(float(value))
    if label is not None:
        feature["label"].int64_list.value.append(int(label))
    return example


def write_tfrecord(path: str, n: int, seed: int) -> None:
    """`n` census rows as tf.Examples (what a TF pipeline would have on disk)."""
    features, labels = make_census(n, seed)
    with est.io.TFRecordWriter(path, "GZIP") as writer:
        for i in range(n):
            writer.write(example_of(features, i, labels[i]).SerializeToString())


def input_fn(path: str, batch_size: int, repeat: bool):
    """Batches parsed from the TFRecord file (TF: TFRecordDataset + parse_example)."""
    def fn(input_context=None):
        records = est.data.TFRecordDataset(path, "GZIP", input_context=input_context)
        loader = torch.utils.data.DataLoader(
            records, batch_size=batch_size,
            collate_fn=lambda batch: est.io.parse_example(batch, SPEC))
        while True:
            for features in loader:
                yield features, features.pop("label")
            if not repeat:
                return
    return fn


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/census_tfrecord")
    parser.add_argument("--train_steps", type=int, default=300)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.makedirs(args.workdir, exist_ok=True)
    train, test = (os.path.join(args.workdir, f"{n}.tfrecord.gz") for n in ("train", "test"))
    write_tfrecord(train, 4000, seed=0)
    write_tfrecord(test, 1000, seed=1)

    classifier = est.DNNLinearCombinedClassifier(
        model_dir=os.path.join(args.workdir, "model"), linear_feature_columns=WIDE,
        dnn_feature_columns=DEEP, dnn_hidden_units=[16, 8],
        linear_optimizer=lambda p: est.optimizers.Ftrl(p, learning_rate=0.1),
        dnn_optimizer=lambda p: torch.optim.Adagrad(p, lr=0.05,
                                                    initial_accumulator_value=0.1))
    classifier.train(input_fn(train, 128, repeat=True), max_steps=args.train_steps)
    result = classifier.evaluate(input_fn(test, 256, repeat=False))
    print(f"test auc {result['auc']:.3f}, accuracy {result['accuracy']:.3f}")

    export_base = os.path.join(args.workdir, "export")
    classifier.export_saved_model(
        export_base, est.export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC))

    with served(export_base, "census") as (url, status):
        print("model status:", status["model_version_status"][0]["state"])
        examples = [{"age": 38.0, "hours_per_week": 50.0, "education": "Masters",
                     "occupation": "Exec-managerial", "gender": "Female"},
                    {"age": 23.0, "hours_per_week": 20.0, "education": "11th",
                     "occupation": "Handlers-cleaners", "gender": "Male"}]
        classified = post(url + ":classify", {"examples": examples})
        columns = {k: [e[k] for e in examples] for k in examples[0]}
        serialized = [example_of(columns, i).SerializeToString() for i in range(2)]
        predicted = post(url + ":predict", {"signature_name": "predict", "instances": [
            {"b64": base64.b64encode(s).decode()} for s in serialized]})
        for example, result_row, prediction in zip(examples, classified["results"],
                                                   predicted["predictions"]):
            print(f"{example}: P(>50K) = {result_row[1][1]:.3f} (predict: "
                  f"{prediction['logistic'][0]:.3f})")
    return {"eval": result, "classify": classified, "predict": predicted}


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
