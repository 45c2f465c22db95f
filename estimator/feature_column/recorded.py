"""The host-side part of a feature transform, for exports (TF keeps the whole
transform in the SavedModel's graph; a torch program holds no strings).

The layers' work on the host (strings to ids, id bags to lookup inputs; see
`FeatureTransformationCache.prepared`) is *recorded* while an export runs
the PREDICT path once on example features (`Recorder`), *replayed* while
torch.export traces it, the recorded tensors standing as the program's inputs
(`Replayer`), and *redone* by a server on the features of each request
(`redo`), from the records as JSON (`to_json` / `from_json`). Numeric
features reach the program as they are; what the model does with them
(normalizer_fn, bucketizing for a dense input, embeddings) is in the program.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import torch

from ._inputs import Builder
from ._layers import linear_ids, single_ids
from ._sequence import sequence_hosts
from ._serialize import (deserialize_feature_column, function_path, import_function,
                         serialize_feature_column)

Record = tuple   # ("embedding" | "indicator" | "ids", column) or ("linear", columns, combiner)
# or ("sequence", columns[, their fixed steps])


class Recorder(Builder):
    """A transformation cache that keeps each host-side result with its record."""

    general = True

    def __init__(self, features):
        super().__init__(features)
        self.records: List[Tuple[Record, Dict[str, Optional[torch.Tensor]]]] = []

    def prepared(self, record, make):
        def run():
            tensors = make()
            self.records.append((record, tensors))
            return tensors
        return super().prepared(record, run)


class Replayer(Builder):
    """A transformation cache that answers the host-side work, in the order it
    was recorded, with `inputs` (the traced program's inputs); `recorded`
    (JSON records) checks that the same work is asked for."""

    general = True

    def __init__(self, features, inputs: List[dict], recorded: List[dict]):
        super().__init__(features)
        self._next: Iterator = iter(zip(inputs, recorded))

    def prepared(self, record, make):
        def replay():
            try:
                tensors, expected = next(self._next)
            except StopIteration:
                raise RuntimeError("the PREDICT path asked for more feature transforms when "
                                   "traced than when it ran: model_fn must do the same "
                                   "work on every call") from None
            if to_json(record) != expected:
                raise RuntimeError(f"the PREDICT path asked for {to_json(record)} when traced "
                                   f"where it had asked for {expected}")
            return tensors
        return super().prepared(record, replay)


def to_json(record: Record) -> dict:
    """`record` as JSON; a function its columns use on the host (a
    bucketized source's normalizer_fn) must be importable by module path."""
    kind = record[0]
    if kind == "linear":
        return {"kind": kind,
                "columns": [serialize_feature_column(c, strict=True) for c in record[1]],
                "combiner": record[2]}
    if kind == "sequence":
        return {"kind": kind,
                "columns": [serialize_feature_column(c, strict=True) for c in record[1]],
                **({"steps": record[2]} if len(record) > 2 else {})}
    return {"kind": kind, "column": serialize_feature_column(record[1], strict=True)}


def from_json(config: dict) -> Record:
    if config["kind"] == "linear":
        return ("linear", tuple(deserialize_feature_column(c) for c in config["columns"]),
                config["combiner"])
    if config["kind"] == "sequence":
        return ("sequence", tuple(deserialize_feature_column(c) for c in config["columns"])
                ) + ((config["steps"],) if "steps" in config else ())
    return (config["kind"], deserialize_feature_column(config["column"]))


def redo(builder: Builder, record: Record) -> Dict[str, Optional[torch.Tensor]]:
    """The host-side tensors of `record` for the features of `builder` (one
    whose `general` is True)."""
    kind = record[0]
    if kind == "linear":
        return linear_ids(builder, record[1], record[2])
    if kind == "embedding":
        return record[1]._lookup_inputs(builder)
    if kind == "indicator":
        return {"value": record[1]._dense(builder)}
    if kind == "ids":
        return single_ids(builder, record[1])
    if kind == "sequence":
        return sequence_hosts(record[1], builder, *record[2:])
    raise ValueError(f"unknown feature transform record {kind!r}")


def general_builder(features) -> Builder:
    """A transformation cache making lookup inputs of one form (an exported
    program's)."""
    builder = Builder(features)
    builder.general = True
    return builder


__all__ = ["Recorder", "Replayer", "to_json", "from_json", "redo", "general_builder",
           "function_path", "import_function"]
