"""Feature columns (TF: ``tf.compat.v1.feature_column``) for model_fns.

    price = fc.numeric_column("price")
    words = fc.categorical_column_with_hash_bucket("words", 10000)
    columns = [fc.bucketized_column(price, [10.0, 100.0]), fc.embedding_column(words, 8)]

    def model_fn(features, labels, mode, params):
        net = fc.input_layer(features, columns)            # [batch, 3 + 8]
        ...

TF 1's semantics, checked against values recorded from TF 2.15
(``tests/support/fixtures/tf_feature_columns.json``): the same ids (FarmHash
hashing and crosses bit for bit, vocabulary OOV buckets and defaults, ``''``
/ ``-1`` dropped from dense inputs), the same outputs in the same column order,
and the variables under TF's names (``input_layer/<column>/embedding_weights``,
``linear_model/<column>/weights``, ``linear_model/bias_weights``), kept in the
model scope like any module: checkpointed, restored, warm started and placed
by the strategy.

Features are what the input_fn gives: tensors and numpy arrays are dense
(TF's Tensor), lists of lists are rows of values (TF's SparseTensor, as
parsing a ``VarLenFeature`` gives); strings stay numpy / lists of str. See
`make_parse_example_spec` for the parsing spec of a set of columns.

Sequence columns (``sequence_numeric_column``,
``sequence_categorical_column_with_*``) feed ``sequence_input_layer``: see
`_sequence`.

Not here: the Keras ``DenseFeatures`` / ``LinearModel``
layers, shared embedding columns in ``linear_model``, and
``ckpt_to_load_from`` (warm start instead).
"""
from ._columns import (BucketizedColumn, CategoricalColumn, CrossedColumn, DenseColumn,
                       EmbeddingColumn, FeatureColumn, HashedCategoricalColumn,
                       IdentityCategoricalColumn, IndicatorColumn, NumericColumn,
                       SharedEmbeddingColumn, VocabularyFileCategoricalColumn,
                       VocabularyListCategoricalColumn, WeightedCategoricalColumn,
                       bucketized_column, categorical_column_with_hash_bucket,
                       categorical_column_with_identity, categorical_column_with_vocabulary_file,
                       categorical_column_with_vocabulary_list, crossed_column,
                       embedding_column, indicator_column, numeric_column,
                       shared_embedding_columns, weighted_categorical_column)
from ._inputs import Builder as FeatureTransformationCache
from ._inputs import transformation_cache
from ._layers import (categorical_ids, concatenate_context_input, input_layer, linear_model,
                      sequence_input_layer)
from ._sequence import (SequenceCategoricalColumn, SequenceNumericColumn,
                        sequence_categorical_column_with_hash_bucket,
                        sequence_categorical_column_with_identity,
                        sequence_categorical_column_with_vocabulary_file,
                        sequence_categorical_column_with_vocabulary_list,
                        sequence_numeric_column)
from . import recorded
from ._serialize import deserialize_feature_column, serialize_feature_column
from ._parse_spec import FixedLenFeature, VarLenFeature, make_parse_example_spec

__all__ = [
    "numeric_column", "bucketized_column", "categorical_column_with_vocabulary_list",
    "categorical_column_with_vocabulary_file", "categorical_column_with_hash_bucket",
    "categorical_column_with_identity", "crossed_column", "embedding_column",
    "indicator_column", "weighted_categorical_column", "shared_embedding_columns",
    "make_parse_example_spec",
    "input_layer", "linear_model", "categorical_ids", "FeatureTransformationCache",
    "transformation_cache",
    "serialize_feature_column", "deserialize_feature_column", "recorded", "FixedLenFeature", "VarLenFeature",
    "FeatureColumn", "DenseColumn", "CategoricalColumn", "NumericColumn", "BucketizedColumn",
    "HashedCategoricalColumn", "VocabularyListCategoricalColumn",
    "VocabularyFileCategoricalColumn", "IdentityCategoricalColumn",
    "WeightedCategoricalColumn", "CrossedColumn", "EmbeddingColumn", "SharedEmbeddingColumn",
    "IndicatorColumn",
    "sequence_numeric_column", "sequence_categorical_column_with_identity",
    "sequence_categorical_column_with_hash_bucket",
    "sequence_categorical_column_with_vocabulary_list",
    "sequence_categorical_column_with_vocabulary_file", "sequence_input_layer",
    "concatenate_context_input", "SequenceNumericColumn", "SequenceCategoricalColumn",
]
