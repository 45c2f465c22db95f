"""Datasets of TF's file formats (TF: ``tf.data``), as torch
``IterableDataset``s: `TFRecordDataset` (serialized records, CRC checked),
`TextLineDataset` (lines), and `make_csv_dataset` (batches of parsed CSV).

Sharding: a dataset given `input_context` (``distribute.InputContext``, what
an ``input_fn(input_context)`` receives) or `.shard(n, i)` keeps every n-th
record; inside a ``torch.utils.data.DataLoader`` with workers, each worker
keeps every n-th of those. Together the shards read every record exactly once,
whatever each pipeline's number of workers (`make_csv_dataset`'s shuffled
rows too: a sharded one shuffles each of its iterations alike, so that its
pipelines agree whatever their workers and torch seeds).

    def input_fn(input_context=None):
        records = est.data.TFRecordDataset(files, input_context=input_context)
        spec = est.feature_column.make_parse_example_spec(columns + [label])
        loader = torch.utils.data.DataLoader(
            records, batch_size=256, num_workers=2,
            collate_fn=lambda batch: est.io.parse_example(batch, spec))
        for features in loader:
            yield features, features.pop("label")
"""
from .csv_dataset import make_csv_dataset
from .datasets import TextLineDataset, TFRecordDataset, list_files

__all__ = ["TFRecordDataset", "TextLineDataset", "list_files", "make_csv_dataset"]
