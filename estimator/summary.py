"""`est.summary`: summaries recorded inside a model_fn (tf.compat.v1.summary):
`scalar`, `histogram`, `image`, `text`, `should_record_summaries` (whether
a call records on this step), and `merge_all` (a SummarySaverHook's
`summary_op`). Recorded and written by the session layer (`hooks.summary`);
see there for when a call records."""
from hooks.summary import histogram, image, merge_all, scalar, should_record_summaries, text

__all__ = ["scalar", "histogram", "image", "text", "should_record_summaries", "merge_all"]
