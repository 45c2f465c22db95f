"""A small convolutional network on a data set we generate: 16x16 grayscale
images of a horizontal bar, a vertical bar or a diagonal, at random places,
with noise. The TF1 "layers" tutorial shape (conv -> pool -> conv -> dense)
as a model_fn, with image and histogram summaries for TensorBoard.

    python examples/conv_net.py [--model_dir runs/conv_net] [--max_steps 300]
    tensorboard --logdir runs/conv_net
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import estimator as est  # noqa: E402

SIZE = 16
CLASSES = ["horizontal", "vertical", "diagonal"]


def make_images(n: int, seed: int):
    """(images [n, 1, SIZE, SIZE] float32 in [0, 1], labels [n] int64)."""
    rng = np.random.RandomState(seed)
    images = rng.uniform(0, 0.3, size=(n, 1, SIZE, SIZE)).astype(np.float32)
    labels = rng.randint(0, len(CLASSES), size=n).astype(np.int64)
    for img, label in zip(images[:, 0], labels):
        length = rng.randint(6, SIZE - 2)
        r, c = rng.randint(0, SIZE - length, size=2)
        idx = np.arange(length)
        if label == 0:
            img[r, c + idx] = 1.0
        elif label == 1:
            img[r + idx, c] = 1.0
        else:
            img[r + idx, c + idx] = 1.0
    return images, labels


def input_fn(params, mode):
    """Fresh random images for training (an endless stream), a fixed test set otherwise."""
    batch = params.get("batch_size", 32)
    if mode == est.ModeKeys.TRAIN:
        def stream():
            seed = params.get("seed", 0)
            while True:
                seed += 1
                x, y = make_images(batch, seed + 1000)
                yield {"image": x}, y
        return stream()
    x, y = make_images(256, seed=0)
    return [({"image": x[i:i + batch]}, y[i:i + batch]) for i in range(0, len(x), batch)]


def model_fn(features, labels, mode, params):
    """conv(8) -> max pool -> conv(16) -> global max pool -> dense(3)."""
    def build():
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(16, len(CLASSES)))

    net = est.get_module("conv_net", build)
    images = features["image"]
    logits = net(images)
    classes = logits.argmax(-1)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"classes": classes,
                                                    "probabilities": logits.softmax(-1)})
    loss = torch.nn.functional.cross_entropy(logits, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": est.metrics.accuracy(labels, classes)})
    est.summary.image("inputs", images.permute(0, 2, 3, 1), max_outputs=3)  # NHWC, as TF
    est.summary.histogram("logits", logits)
    optimizer = est.get_optimizer(
        lambda p: torch.optim.Adam(p, lr=params.get("learning_rate", 0.01)))
    return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/conv_net")
    parser.add_argument("--max_steps", type=int, default=300)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    config = est.RunConfig(model_dir=args.model_dir, tf_random_seed=0,
                           save_checkpoints_steps=100, save_summary_steps=50)
    classifier = est.Estimator(model_fn, config=config,
                               params={"batch_size": 32, "learning_rate": 0.01})
    classifier.train(input_fn, max_steps=args.max_steps)
    result = classifier.evaluate(input_fn)
    print(f"\nTest accuracy: {result['accuracy']:.3f}  loss: {result['loss']:.4f}  "
          f"global_step: {result['global_step']}")

    samples, truth = make_images(3, seed=123)
    for pred, label in zip(classifier.predict(lambda: [{"image": samples}]), truth):
        print(f"predicted {CLASSES[pred['classes']]!r} "
              f"({100 * pred['probabilities'][pred['classes']]:.1f}%), "
              f"drawn {CLASSES[label]!r}")
    return result


if __name__ == "__main__":
    main()
