"""TF's data formats without TensorFlow (TF: ``tf.io``): TFRecord files
(`TFRecordWriter`, and `estimator.data.TFRecordDataset` to read them),
tf.Example parsing (`parse_example`, `parse_single_example` and the feature
specs), tf.SequenceExample parsing (`parse_sequence_example`,
`parse_single_sequence_example`) and the messages themselves (`Example`,
`SequenceExample`, `Features`, `Feature`, `FeatureLists`, `FeatureList`,
`BytesList`, `FloatList`, `Int64List`, as ``tf.train.*``)."""
from ._example_pb import (BytesList, Example, Feature, FeatureList, FeatureLists, Features,
                          FloatList, Int64List, SequenceExample)
from ._records import DataLossError, TFRecordWriter
from .csv import DecodeCSVError, decode_csv
from .parsing import (FixedLenFeature, FixedLenSequenceFeature, VarLenFeature, parse_example,
                      parse_sequence_example, parse_single_example,
                      parse_single_sequence_example)

__all__ = [
    "TFRecordWriter", "DataLossError", "parse_example", "parse_single_example",
    "parse_sequence_example", "parse_single_sequence_example",
    "FixedLenFeature", "VarLenFeature", "FixedLenSequenceFeature", "decode_csv", "DecodeCSVError",
    "Example", "Features", "Feature", "BytesList", "FloatList", "Int64List",
    "FeatureList", "FeatureLists", "SequenceExample",
]
