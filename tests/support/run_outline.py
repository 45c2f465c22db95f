"""What a run yielded or wrote, in the form TF's recordings keep it; shared by
the recorders (tests/support/fixtures/record_tf_*.py, run under TF) and the
tests comparing with them, so that both sides are described alike."""
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def predictions_outline(predictions: list) -> dict:
    """How many predictions, the first one's keys in order, the Python type of
    its "id" (and of an element, for a batch) and its "labelled" flag."""
    first = predictions[0]
    out = {"count": len(predictions), "keys": list(first)}
    if "id" in first:
        value = first["id"]
        out["id_type"] = type(value).__name__
        if isinstance(value, np.ndarray):
            out["id_item_type"] = type(value.flat[0]).__name__
    if "labelled" in first:
        out["labelled"] = bool(np.asarray(first["labelled"]).flat[0])
    return out


def summaries_outline(logdir: str) -> dict:
    """Every scalar of the event files in `logdir` as {tag: [[step, value]]}
    (global_step/sec left out: a speed), and the image and histogram tags."""
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0, "images": 0,
                                                  "histograms": 0}).Reload()
    tags = acc.Tags()
    return {"scalars": {tag: [[e.step, e.value] for e in acc.Scalars(tag)]
                        for tag in sorted(tags["scalars"]) if tag != "global_step/sec"},
            "images": sorted(tags["images"]), "histograms": sorted(tags["histograms"])}
