"""Summaries recorded inside a model_fn (tf.compat.v1.summary / tf.summary):

    def model_fn(features, labels, mode, params):
        ...
        est.summary.scalar("lr", optimizer.param_groups[0]["lr"])
        est.summary.histogram("logits", logits)
        return est.EstimatorSpec(mode, loss=loss, train_op=optimizer)

TF builds summary ops into the graph and `SummarySaverHook` runs them every
`save_summary_steps`. Here a call records only on steps where a summary is due
(some hook fetches "summaries" on this step; the session sets
`scope.summaries_due`), which happens on the chief only; on any other step, or
outside a model scope, a call is one attribute check and returns False. A due
call stores a detached copy of the value (on the device, no host sync); the
session copies the records to the host with the step's other fetches and
`hooks.SummarySaverHook` writes them to TensorBoard event files at the global
step (or at `step`, when given).
"""
from __future__ import annotations

import logging
import numbers
import re
import struct
import time
import zlib
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from distribute.host_arrays import to_numpy

from . import model_scope

__all__ = ["scalar", "histogram", "image", "text", "should_record_summaries"]

logger = logging.getLogger(__name__)
_said_illegal: set = set()


class _Record(NamedTuple):
    """One recorded summary: `value` is a detached tensor (or numpy array,
    number, string) until the session copies it to the host."""

    kind: str                  # "scalar" | "histogram" | "image" | "text"
    tag: str
    value: Any
    step: Optional[int]
    max_outputs: int = 1       # images: tagged `tag/image`, or `tag/image/<i>` when > 1


# -- recording (inside model_fn) -------------------------------------------------
def should_record_summaries() -> bool:
    """Whether a summary call records on this step (TF2:
    `tf.summary.should_record_summaries`): compute a summary's value only
    when this is True, so quiet steps pay nothing for it."""
    scope = model_scope._current
    return scope is not None and scope.summaries_due


def scalar(name: str, data, step: Optional[int] = None) -> bool:
    """Record a scalar (tf.summary.scalar). `data`: a one-element tensor or a
    number. Returns whether it was recorded (a summary is due on this step)."""
    scope = model_scope._current
    if scope is None or not scope.summaries_due:
        return False
    _check(name, step, "scalar")
    if isinstance(data, torch.Tensor):
        if data.numel() != 1:
            raise ValueError(f"est.summary.scalar({name!r}): data must hold one value, "
                             f"got a tensor of shape {tuple(data.shape)}")
        value = data.detach().reshape(()).clone()
    elif isinstance(data, (numbers.Real, np.number)) and not isinstance(data, np.ndarray):
        value = float(data)
    else:
        raise TypeError(f"est.summary.scalar({name!r}): data must be a number or a "
                        f"one-element tensor, got {type(data).__name__}")
    scope.summaries.append(_Record("scalar", _tag(scope, name), value, step))
    return True


def histogram(name: str, data, step: Optional[int] = None) -> bool:
    """Record the distribution of the values of `data` (tf.summary.histogram),
    a tensor or array of any shape. Returns whether it was recorded."""
    scope = model_scope._current
    if scope is None or not scope.summaries_due:
        return False
    _check(name, step, "histogram")
    if isinstance(data, torch.Tensor):
        if data.dtype == torch.bool or data.is_complex():
            raise TypeError(f"est.summary.histogram({name!r}): data must be real numbers, "
                            f"got dtype {data.dtype}")
        value = data.detach().clone()
    else:
        try:
            value = np.array(data, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"est.summary.histogram({name!r}): data must be a tensor or "
                            f"an array of numbers, got {type(data).__name__}") from None
    if _numel(value) == 0:
        raise ValueError(f"est.summary.histogram({name!r}): data is empty "
                         f"(shape {tuple(value.shape)})")
    scope.summaries.append(_Record("histogram", _tag(scope, name), value, step))
    return True


def image(name: str, data, step: Optional[int] = None, max_outputs: int = 3) -> bool:
    """Record up to `max_outputs` images (tf.summary.image). `data`: a 4-D
    tensor or array `[k, height, width, channels]`, channels 1 (grayscale),
    3 (RGB) or 4 (RGBA); uint8, or floats rescaled as TF1's image summary
    rescales them (each image to fill 0-255; with negatives, 0 at 128). Tags follow
    tf.compat.v1, by `max_outputs` (not by how many images a batch has):
    `name/image` when it is 1, `name/image/0`, `name/image/1`, ... otherwise.
    Returns whether it was recorded."""
    scope = model_scope._current
    if scope is None or not scope.summaries_due:
        return False
    _check(name, step, "image")
    if not isinstance(max_outputs, numbers.Integral) or isinstance(max_outputs, bool) \
            or max_outputs < 1:
        raise ValueError(f"est.summary.image({name!r}): max_outputs must be an int >= 1, "
                         f"got {max_outputs!r}")
    if not isinstance(data, torch.Tensor):
        data = np.asarray(data)
    shape = tuple(data.shape)
    if len(shape) != 4 or shape[-1] not in (1, 3, 4):
        raise ValueError(f"est.summary.image({name!r}): data must be 4-D [k, height, width, "
                         f"channels] with channels 1, 3 or 4, got shape {shape}")
    if isinstance(data, torch.Tensor):
        ok = data.dtype == torch.uint8 or data.is_floating_point()
    else:
        ok = data.dtype == np.uint8 or np.issubdtype(data.dtype, np.floating)
    if not ok:
        raise TypeError(f"est.summary.image({name!r}): data must be uint8 or floating "
                        f"point, got dtype {data.dtype}")
    value = data[:max_outputs]
    value = value.detach().clone() if isinstance(value, torch.Tensor) else value.copy()
    scope.summaries.append(_Record("image", _tag(scope, name), value, step, max_outputs))
    return True


def text(name: str, data, step: Optional[int] = None) -> bool:
    """Record text (tf.summary.text, Markdown): a string, or a list / array of
    strings (shown as a table). Returns whether it was recorded."""
    scope = model_scope._current
    if scope is None or not scope.summaries_due:
        return False
    _check(name, step, "text")
    if isinstance(data, (str, bytes)):
        value = data
    else:
        value = np.array(data, dtype=object)
        if value.size == 0 or not all(isinstance(v, (str, bytes)) for v in value.flat):
            raise TypeError(f"est.summary.text({name!r}): data must be a string or a "
                            f"non-empty list of strings, got {data!r:.80}")
    scope.summaries.append(_Record("text", _tag(scope, name), value, step))
    return True


class _Merged:
    """What `merge_all()` gives: every summary the model_fn recorded."""

    def __repr__(self):
        return "est.summary.merge_all()"


MERGED = _Merged()


def merge_all() -> _Merged:
    """TF1's `tf.compat.v1.summary.merge_all()`, for a SummarySaverHook's
    `summary_op` made in the model_fn: every summary the model_fn records,
    without the Estimator's own `loss` (TF adds it after the model_fn); those
    it records after the call too (TF's takes those made before it)."""
    return MERGED


_NOT_IN_A_TAG = re.compile(r"[^-/\w.]")


def _tag(scope, name: str) -> str:
    """`name` as TF1 writes it: a character a tag may not hold made "_", and
    no leading or trailing "/" (cifar10's "cross_entropy (raw)" is
    "cross_entropy__raw_"); then `name_1`, `name_2`, ... when this model_fn
    call already recorded a summary of that tag or named a tensor so with
    `est.named_tensor`, compared without case (TF's unique names: two
    `summary.scalar("x", ...)` in one graph write the tags `x` and `x_1`, as
    does official/r1/resnet's `tf.identity(x, name="x")` before
    `summary.scalar("x", x)`). A tensor named "loss" is left out: the
    model_fn's "loss" summary stays the Estimator's loss curve (TF's tags
    would be `loss_1`, and `loss_2` for the Estimator's own)."""
    clean = _NOT_IN_A_TAG.sub("_", name).strip("/")
    if clean != name:
        if name not in _said_illegal:   # (TF logs it at every graph build; once here)
            _said_illegal.add(name)
            logger.info("Summary name %s is illegal; using %s instead.", name, clean)
        name = clean
    used = {record.tag.lower() for record in scope.summaries}
    used.update(n.lower() for n in scope.named_tensors if n.lower() != "loss")
    tag, i = name, 1
    while tag.lower() in used:
        tag, i = f"{name}_{i}", i + 1
    return tag


def _check(name, step, fn: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"est.summary.{fn}: name must be a non-empty string, got {name!r}")
    if step is not None and (not isinstance(step, (int, np.integer)) or isinstance(step, bool)):
        raise TypeError(f"est.summary.{fn}({name!r}): step must be an int or None, "
                        f"got {step!r}")


def _numel(value) -> int:
    return value.numel() if isinstance(value, torch.Tensor) else value.size


# -- to the host (the session, on due steps) ------------------------------------------
def _to_host(records) -> list:
    """The records with their values on the host: scalars as floats,
    histograms as float64 arrays, images as uint8 arrays [k, h, w, c]."""
    out = []
    for record in records:
        value = record.value
        if isinstance(value, torch.Tensor):
            value = value.item() if record.kind == "scalar" else to_numpy(value)
        if record.kind == "image" and value.dtype != np.uint8:
            value = np.stack([_image_pixels(image) for image in value])
        out.append(record._replace(value=value,
                                   step=None if record.step is None else int(record.step)))
    return out


def _image_pixels(image: np.ndarray) -> np.ndarray:
    """A float image [h, w, c] as uint8, as TF1's image summary kernel makes
    it, each image alone: scaled so its largest value is 255, or, with
    negative values, 0 at 128 and the largest magnitude at 1 or 255 (the
    scale in float32, the pixels in the image's precision, truncated); a
    pixel with a NaN or Inf is red."""
    if image.dtype != np.float64:
        image = image.astype(np.float32)
    dtype = image.dtype.type
    good = np.isfinite(image).all(axis=-1)
    values = image[good].astype(np.float32)
    low, high = (values.min(), values.max()) if values.size else (np.float32(0),) * 2
    if low < 0:
        top = max(abs(low), abs(high))
        scale, offset = (0.0 if top < 1e-6 else np.float32(127) / top), 128.0
    else:
        scale, offset = (0.0 if high < 1e-6 else np.float32(255) / high), 0.0
    pixels = image * dtype(scale) + dtype(offset)
    pixels = np.clip(np.where(good[..., None], pixels, 0), 0, 255).astype(np.uint8)
    pixels[~good] = (255, 0, 0, 255)[:image.shape[-1]]   # TF's bad_color
    return pixels


# -- writing (SummarySaverHook, evaluation) ----------------------------------------------
def _write(writer, record: _Record, global_step: int) -> None:
    """Write one host record with a torch.utils.tensorboard.SummaryWriter at
    `record.step`, else `global_step`."""
    step = global_step if record.step is None else record.step
    kind, tag, value = record.kind, record.tag, record.value
    if kind == "scalar":
        _write_scalar(writer, tag, value, step)
    elif kind == "histogram":
        values = np.asarray(value, dtype=np.float64)
        if not np.isfinite(values).all():
            raise ValueError(f"est.summary.histogram({tag!r}) at step {step}: the values "
                             "contain NaN or Inf (TF: 'Nan in summary histogram')")
        writer.add_histogram(tag, values, step)
    elif kind == "image":
        from tensorboard.compat.proto.summary_pb2 import Summary
        values = []
        for i, img in enumerate(value):
            height, width, channels = img.shape
            sub = f"{tag}/image" if record.max_outputs == 1 else f"{tag}/image/{i}"
            values.append(Summary.Value(tag=sub, image=Summary.Image(
                height=height, width=width, colorspace=channels,
                encoded_image_string=_png(img))))
        _add_summary(writer, Summary(value=values), step)
    elif kind == "text":
        from tensorboard.plugins.text.summary_v2 import text_pb
        _add_summary(writer, text_pb(tag, value), step)
    else:
        raise ValueError(f"Unknown summary kind {kind!r} for tag {tag!r}")


def _write_scalar(writer, tag: str, value, step: int, walltime: Optional[float] = None) -> None:
    """`writer.add_scalar(tag, value, step, walltime)` for a host number,
    without its numpy round trip (hooks write these on the training thread)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    _add_summary(writer, Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]),
                 step, walltime)


def _write_session_start(writer, step: int) -> None:
    """TF's SessionLog START at `step` (the first step a training session
    writes): TensorBoard then drops the points at and after `step` that an
    earlier, interrupted run wrote, instead of showing both."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    writer._get_file_writer().add_event(Event(
        wall_time=time.time(), step=step, session_log=SessionLog(status=SessionLog.START)))


def _add_summary(writer, summary, step: int, walltime: Optional[float] = None) -> None:
    """A Summary proto through the SummaryWriter's file writer (what its own
    add_* methods do)."""
    writer._get_file_writer().add_summary(summary, step, walltime)


def _png(img: np.ndarray) -> bytes:
    """PNG bytes of an uint8 [height, width, channels] image (channels 1, 3 or 4)."""
    height, width, channels = img.shape
    color_type = {1: 0, 3: 2, 4: 6}[channels]
    rows = np.ascontiguousarray(img).reshape(height, width * channels)
    raw = np.concatenate([np.zeros((height, 1), np.uint8), rows], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
