"""Reading TensorBoard event files back: the one reader of the scalars this
library writes (early stopping reads evaluation metrics with it, BestExporter
the earlier evaluation results). Writing goes through
`torch.utils.tensorboard` (`hooks.summary`, `hooks.summary_hooks`)."""
from __future__ import annotations

import collections
import glob
from typing import Dict, Tuple

EVENT_FILE_PATTERN = "events.out.tfevents.*"


def read_scalars(pattern: str) -> "collections.OrderedDict[int, Dict[str, float]]":
    """{global step: {tag: value}} of the scalar summaries in the event files
    matching the glob `pattern`, by step; later values of a tag at one step
    win. A scalar is a `simple_value` (TF, torch's SummaryWriter) or a
    0-dimensional numeric tensor (TensorBoard's scalars plugin). A truncated
    record (a file still being written) ends that file's events; no file
    reads as empty."""
    return collections.OrderedDict(
        (step, values) for step, (_, values) in read_scalar_events(pattern).items())


def read_scalar_events(pattern: str
                       ) -> "collections.OrderedDict[int, Tuple[float, Dict[str, float]]]":
    """`read_scalars`, each step's values with the wall time (seconds since
    the epoch) of the last event that wrote one: {step: (time, {tag: value})}."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    from tensorboard.util import tensor_util
    scalars: Dict[int, Dict[str, float]] = collections.defaultdict(dict)
    times: Dict[int, float] = {}
    for path in sorted(glob.glob(pattern)):
        for event in LegacyEventFileLoader(path).Load():
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = value.simple_value
                elif value.HasField("tensor") and not value.tensor.tensor_shape.dim:
                    number = tensor_util.make_ndarray(value.tensor).item()
                    if isinstance(number, bool) or not isinstance(number, (int, float)):
                        continue
                else:
                    continue
                scalars[int(event.step)][value.tag] = float(number)
                times[int(event.step)] = max(times.get(int(event.step), 0.0), event.wall_time)
    return collections.OrderedDict(
        (step, (times[step], values)) for step, values in sorted(scalars.items()))
