"""Export and serve: train the Iris DNN, export it with
`Estimator.export_saved_model` (a torch.export program, TF's SavedModel), then
serve it from a fresh Python process that loads it with torch alone (our
packages are blocked there) and check that it predicts what
`Estimator.predict` does.

    python examples/export_and_serve.py [--model_dir runs/export_and_serve] [--max_steps 300]

The serving side is the whole of what a server needs:

    program = torch.export.load(export_dir + "/model.pt2").module()
    outputs = program(x=torch.tensor([[5.1, 3.3, 1.7, 0.5]]))   # {"class_ids": ..., ...}
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys

import numpy as np
import torch

EXAMPLES = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(EXAMPLES))
sys.path.insert(0, EXAMPLES)
import estimator as est  # noqa: E402
import iris  # noqa: E402

SAMPLES = np.array([[5.1, 3.3, 1.7, 0.5], [5.9, 3.0, 4.2, 1.5], [6.9, 3.1, 5.4, 2.1],
                    [4.8, 3.4, 1.9, 0.2], [6.4, 2.8, 5.6, 2.2]], dtype=np.float32)

# TF's build_raw_serving_input_receiver_fn: the program takes the raw feature
# `x` ([batch, 4] float32, any batch size). Also used by configs/iris.yaml.
serving_input_receiver_fn = est.export.build_raw_serving_input_receiver_fn(
    {"x": torch.zeros(1, len(iris.FEATURES))})

# Runs in a fresh interpreter: torch only; importing our packages would fail.
_SERVER = r"""
import json, sys
for name in ("estimator", "distribute", "hooks"):
    sys.modules[name] = None          # prove the export needs none of them
import torch
export_dir, rows = sys.argv[1], json.loads(sys.stdin.read())
program = torch.export.load(export_dir + "/model.pt2").module()
outputs = program(x=torch.tensor(rows, dtype=torch.float32))
print(json.dumps({k: v.tolist() for k, v in outputs.items()}))
"""


def serve(export_dir: str, rows: np.ndarray) -> dict:
    """Predictions of the export for `rows`, computed in a fresh process."""
    done = subprocess.run([sys.executable, "-I", "-c", _SERVER, export_dir],
                          input=json.dumps(rows.tolist()), capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"serving process failed ({done.returncode}):\n{done.stderr}")
    return {k: np.asarray(v) for k, v in json.loads(done.stdout).items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/export_and_serve")
    parser.add_argument("--max_steps", type=int, default=300)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    params = {"hidden_units": [16, 16], "learning_rate": 0.1, "batch_size": 32}
    config = est.RunConfig(model_dir=args.model_dir, tf_random_seed=42,
                           save_checkpoints_steps=100)
    classifier = est.Estimator(iris.model_fn, config=config, params=params)
    classifier.train(iris.input_fn, max_steps=args.max_steps)

    export_dir = classifier.export_saved_model(os.path.join(args.model_dir, "export"),
                                               serving_input_receiver_fn)
    export_dir = export_dir.decode() if isinstance(export_dir, bytes) else export_dir
    print(f"Exported to {export_dir}")

    served = serve(export_dir, SAMPLES)
    local = list(classifier.predict(lambda: [{"x": SAMPLES}]))
    expected = np.stack([p["probabilities"] for p in local])
    max_diff = float(np.abs(served["probabilities"] - expected).max())
    same_classes = served["class_ids"].tolist() == [int(p["class_ids"]) for p in local]
    for row, cls, prob in zip(SAMPLES, served["class_ids"], served["probabilities"]):
        print(f"served [{', '.join(f'{v:g}' for v in row)}] -> {iris.SPECIES[cls]} "
              f"({100 * prob[cls]:.1f}%)")
    print(f"served vs Estimator.predict: same classes: {same_classes}, "
          f"max probability difference: {max_diff:.2e}")
    return export_dir, served, expected, same_classes


if __name__ == "__main__":
    main()
