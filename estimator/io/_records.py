"""TF's TFRecord file format (TF: ``tensorflow/core/lib/io/record_writer.cc``
/ ``record_reader.cc``), read and written without TensorFlow.

Each record is::

    uint64 length (little-endian)
    uint32 masked CRC-32C of the 8 length bytes
    bytes  data[length]
    uint32 masked CRC-32C of the data

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32).
A file may be compressed whole with GZIP or ZLIB (TF's ``compression_type``).
CRC-32C comes from ``google-crc32c`` (Google's package, hardware-accelerated
where the CPU has it).
"""
from __future__ import annotations

import gzip
import io
import logging
import os
import struct
import zlib
from typing import BinaryIO, Iterator, Optional, Tuple

import google_crc32c

from hooks.files import DataLossError   # (the one class: a damaged TFRecord names its offset)

logger = logging.getLogger(__name__)

COMPRESSION_TYPES = (None, "", "GZIP", "ZLIB")
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def check_compression(compression_type) -> Optional[str]:
    if compression_type not in COMPRESSION_TYPES:
        raise ValueError(f"compression_type must be None, '', 'GZIP' or 'ZLIB', got "
                         f"{compression_type!r}")
    return compression_type or None


def open_stream(path: str, compression_type: Optional[str]) -> BinaryIO:
    """A binary stream of `path`'s (decompressed) bytes."""
    raw = open(path, "rb")
    if compression_type == "GZIP":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression_type == "ZLIB":
        return io.BufferedReader(_ZlibReader(raw))
    return raw


class _ZlibReader(io.RawIOBase):
    """A readable stream decompressing a zlib stream (TF's ZLIB option)."""

    def __init__(self, raw: BinaryIO):
        self._raw, self._z, self._buffer = raw, zlib.decompressobj(), b""

    def readable(self):
        return True

    def readinto(self, b) -> int:
        while len(self._buffer) < len(b) and not self._z.eof:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                break
            self._buffer += self._z.decompress(chunk)
        n = min(len(b), len(self._buffer))
        b[:n], self._buffer = self._buffer[:n], self._buffer[n:]
        return n

    def close(self):
        self._raw.close()
        super().close()


def read_records(path: str, compression_type: Optional[str] = None,
                 check_crc: bool = True) -> Iterator[Tuple[int, bytes]]:
    """(offset, data) of each record of `path`, CRCs checked; a truncated or
    damaged record raises DataLossError naming the file and offset (fewer
    bytes than a header at the end are ignored with a warning, as TF's
    reader ends there)."""
    compression_type = check_compression(compression_type)
    try:
        yield from _records(path, compression_type, check_crc)
    except (zlib.error, EOFError, gzip.BadGzipFile) as e:   # damaged compressed data
        raise DataLossError(f"{path}: damaged {compression_type} data ({type(e).__name__}: "
                            f"{e})") from e


def _records(path: str, compression_type: Optional[str], check_crc: bool):
    with open_stream(path, compression_type) as stream:
        offset = 0
        while True:
            header = stream.read(_HEADER.size)
            if not header:
                return
            if len(header) < _HEADER.size:   # TF reads this as the end of the file
                logger.warning("%s: %d stray bytes at the end (offset %d), fewer than a record "
                               "header: ignored, as TF does (a last record cut there is lost)",
                               path, len(header), offset)
                return
            length, length_crc = _HEADER.unpack(header)
            if check_crc and masked_crc(header[:8]) != length_crc:
                raise DataLossError(f"{path}: corrupted record at offset {offset} (the "
                                    "length's CRC does not match)")
            data = stream.read(length)
            footer = stream.read(_FOOTER.size)
            if len(data) < length or len(footer) < _FOOTER.size:
                raise DataLossError(f"{path}: truncated record at offset {offset} (expected "
                                    f"{length} bytes of data)")
            if check_crc and masked_crc(data) != _FOOTER.unpack(footer)[0]:
                raise DataLossError(f"{path}: corrupted record at offset {offset} (the "
                                    "data's CRC does not match)")
            yield offset, data
            offset += _HEADER.size + length + _FOOTER.size


def encode_record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return b"".join((header, _FOOTER.pack(masked_crc(header)), data,
                     _FOOTER.pack(masked_crc(data))))


class TFRecordWriter:
    """Writes records to a TFRecord file (TF: ``tf.io.TFRecordWriter``):
    ``write(bytes)``, ``flush()``, ``close()``; a context manager.
    `options`: None, ``"GZIP"``, ``"ZLIB"`` (TF's compression_type). The
    file is complete once closed."""

    def __init__(self, path: str, options: Optional[str] = None):
        compression = check_compression(getattr(options, "compression_type", options))
        self.path = os.fspath(path)
        self._raw = open(self.path, "wb")
        if compression == "GZIP":
            self._out = gzip.GzipFile(fileobj=self._raw, mode="wb")
        elif compression == "ZLIB":
            self._z = zlib.compressobj()
            self._out = None
        else:
            self._out = self._raw
        self._compression = compression

    def write(self, record: bytes) -> None:
        """Append `record` (bytes; a str is written as its utf-8 bytes, as TF's)."""
        if isinstance(record, str):
            record = record.encode("utf-8")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"TFRecordWriter.write takes bytes (e.g. "
                            f"example.SerializeToString()), got {type(record).__name__}")
        if self._raw.closed:
            raise ValueError(f"TFRecordWriter of {self.path} is closed")
        data = encode_record(bytes(record))
        if self._compression == "ZLIB":
            self._raw.write(self._z.compress(data))
        else:
            self._out.write(data)

    def flush(self) -> None:
        if self._compression == "ZLIB":
            self._raw.write(self._z.flush(zlib.Z_SYNC_FLUSH))
        else:
            self._out.flush()
        self._raw.flush()

    def close(self) -> None:
        if self._raw.closed:
            return
        if self._compression == "ZLIB":
            self._raw.write(self._z.flush())
        elif self._compression == "GZIP":
            self._out.close()
        self._raw.close()

    def __del__(self):
        # A writer dropped without close() still completes its file, as TF's
        # does when destroyed (a ZLIB stream held its data back until then).
        if getattr(self, "_raw", None) is not None:
            try:
                self.close()
            except Exception:   # noqa: BLE001 - nothing to raise to at collection
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
