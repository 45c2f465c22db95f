"""Reading TensorFlow's checkpoints (the V2 "tensor bundle" format of TF1's
Saver and TF2's ``tf.train.Checkpoint``) without TensorFlow.

A checkpoint `prefix` is

    <prefix>.index                   a table (LevelDB's SSTable layout) mapping
                                     each tensor name to a BundleEntryProto; the
                                     entry under "" is the BundleHeaderProto
    <prefix>.data-NNNNN-of-MMMMM     the tensors' bytes, little-endian

A partitioned variable's entry lists its slices; each slice is stored under
its own key (the name and the slice, TF's ordered-code encoding), and is
reassembled here. Every block of the index and every tensor is CRC-32C
checked (masked, as TF writes them); a mismatch or a missing or truncated
file is an error naming the file (and the variable).

The few protobuf fields needed are decoded by hand (field numbers from TF's
``tensor_bundle.proto``, ``tensor_shape.proto`` and ``tensor_slice.proto``),
so neither TensorFlow nor generated code is needed. Values come back as
numpy arrays of TF's dtype, except bfloat16 (numpy has none): float32,
which holds every bfloat16 value exactly; strings are object arrays of
bytes (a scalar: bytes), as TF's reader gives them.
"""
from __future__ import annotations

import codecs
import difflib
import os
import re
import struct
from typing import Dict, List, NamedTuple, Optional, Tuple

import google_crc32c
import numpy as np

from .files import DataLossError

_MAGIC = 0xDB4775248B80FB57
_FOOTER = 48
_MASK_DELTA = 0xA282EAD8
# TF's DataType enum -> numpy dtype.
_STRING, _BFLOAT16 = 7, 14
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8,
           _STRING: np.object_, 8: np.complex64, 9: np.int64, 10: np.bool_,
           _BFLOAT16: np.float32, 17: np.uint16, 18: np.complex128, 19: np.float16,
           22: np.uint32, 23: np.uint64}
_DTYPE_NAMES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8",
                _STRING: "string", 8: "complex64", 9: "int64", 10: "bool",
                _BFLOAT16: "bfloat16", 17: "uint16", 18: "complex128", 19: "float16",
                22: "uint32", 23: "uint64"}


class CorruptCheckpointError(DataLossError):
    """A TF checkpoint file is damaged, truncated or missing; the message names it."""


def _unmask(crc: int) -> int:
    rot = (crc - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# -- protobuf wire format ---------------------------------------------------------------
def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> List[Tuple[int, object]]:
    """(field number, value) pairs of a message: ints for varint/fixed fields,
    bytes for length-delimited ones."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", data, pos)[0], pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = struct.unpack_from("<I", data, pos)[0], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, value))
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


class _Extent(NamedTuple):
    start: int
    length: Optional[int]   # None: the whole dimension


class Entry(NamedTuple):
    """A BundleEntryProto: where a tensor's bytes are and what they hold."""
    dtype: int
    shape: Tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: Optional[int]
    slices: Tuple[Tuple[_Extent, ...], ...]


def _shape(data: bytes) -> Tuple[int, ...]:
    dims = []
    for number, value in _fields(data):
        if number == 2:   # Dim { int64 size = 1; string name = 2; }
            size = next((v for n, v in _fields(value) if n == 1), 0)
            dims.append(_signed(size))
    return tuple(dims)


def _slice(data: bytes) -> Tuple[_Extent, ...]:
    extents = []
    for number, value in _fields(data):
        if number == 1:   # Extent { int64 start = 1; int64 length = 2; }
            fields = dict(_fields(value))
            extents.append(_Extent(_signed(fields.get(1, 0)),
                                   _signed(fields[2]) if 2 in fields else None))
    return tuple(extents)


def _entry(data: bytes) -> Entry:
    dtype, shape, shard, offset, size, crc, slices = 0, (), 0, 0, 0, None, []
    for number, value in _fields(data):
        if number == 1:
            dtype = value
        elif number == 2:
            shape = _shape(value)
        elif number == 3:
            shard = value
        elif number == 4:
            offset = _signed(value)
        elif number == 5:
            size = _signed(value)
        elif number == 6:
            crc = value
        elif number == 7:
            slices.append(_slice(value))
    return Entry(dtype, shape, shard, offset, size, crc, tuple(slices))


# -- the index table ------------------------------------------------------------------
def _read_block(data: bytes, offset: int, size: int, path: str) -> bytes:
    end = offset + size
    if end + 5 > len(data):
        raise CorruptCheckpointError(f"{path}: truncated (a block at offset {offset} runs "
                                     "past the end of the file)")
    block, kind = data[offset:end], data[end]
    crc = struct.unpack_from("<I", data, end + 1)[0]
    if google_crc32c.value(block + bytes([kind])) != _unmask(crc):
        raise CorruptCheckpointError(f"{path}: corrupted block at offset {offset} (CRC "
                                     "mismatch)")
    if kind != 0:
        raise CorruptCheckpointError(f"{path}: block at offset {offset} is compressed "
                                     f"(type {kind}); TF writes bundle indexes uncompressed")
    return block


def _block_entries(block: bytes):
    """(key, value) of a table block (prefix-compressed keys, restarts at the end)."""
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    limit = len(block) - 4 - 4 * restarts
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + length]
        pos += length


def read_index(path: str) -> Dict[bytes, bytes]:
    """{key: value} of an SSTable file (a checkpoint's `.index`)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{path}: no such file (the checkpoint's index)") from None
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _MAGIC:
        raise CorruptCheckpointError(f"{path}: not a TF checkpoint index, or truncated (no "
                                     "table footer)")
    footer = data[len(data) - _FOOTER:]
    try:
        _, pos = _varint(footer, 0)            # metaindex handle: offset,
        _, pos = _varint(footer, pos)          # size (unused)
        index_offset, pos = _varint(footer, pos)
        index_size, pos = _varint(footer, pos)
        out = {}
        for _, handle in _block_entries(_read_block(data, index_offset, index_size, path)):
            offset, p = _varint(handle, 0)
            size, _ = _varint(handle, p)
            out.update(_block_entries(_read_block(data, offset, size, path)))
    except (ValueError, struct.error, IndexError) as e:
        if isinstance(e, CorruptCheckpointError):
            raise
        raise CorruptCheckpointError(f"{path}: damaged index ({e})") from None
    return out


# -- slices (ordered-code keys of partitioned variables) ----------------------------------
def _read_unsigned(key: bytes, pos: int) -> Tuple[int, int]:
    """TF's OrderedCode::ReadNumIncreasing: a length byte, then big-endian bytes."""
    n = key[pos]
    return int.from_bytes(key[pos + 1:pos + 1 + n], "big"), pos + 1 + n


def _read_signed(key: bytes, pos: int) -> Tuple[int, int]:
    """TF's OrderedCode::ReadSignedNumIncreasing (values below 2**55): n bytes
    whose first n bits are ones (zeros for a negative number, whose bytes are
    complemented), a zero bit, then the value."""
    xor = 0 if key[pos] & 0x80 else 0xFF
    first = key[pos] ^ xor
    n = 8 - (first ^ 0xFF).bit_length() if first != 0xFF else 8
    if n >= 8:
        raise ValueError("slice offset too large")
    raw = int.from_bytes(bytes(b ^ xor for b in key[pos:pos + n]), "big")
    value = raw & ((1 << (7 * n - 1)) - 1)
    return (-value - 1 if xor else value), pos + n


def _read_string(key: bytes, pos: int) -> Tuple[bytes, int]:
    out = bytearray()
    while True:
        byte = key[pos]
        if byte == 0x00:
            if key[pos + 1] == 0x01:
                return bytes(out), pos + 2
            out.append(0x00)          # \x00\xff is an escaped 0x00
        elif byte == 0xFF:
            out.append(0xFF)          # \xff\x00 is an escaped 0xff
        else:
            out.append(byte)
            pos += 1
            continue
        pos += 2


def decode_slice_key(key: bytes) -> Tuple[str, Tuple[_Extent, ...]]:
    """(variable name, extents) of a slice's index key (TF's
    DecodeTensorNameSlice); a length of -1 is a whole dimension."""
    _, pos = _read_unsigned(key, 0)
    name, pos = _read_string(key, pos)
    dims, pos = _read_unsigned(key, pos)
    extents = []
    for _ in range(dims):
        start, pos = _read_signed(key, pos)
        length, pos = _read_signed(key, pos)
        extents.append(_Extent(start, None if length == -1 else length))
    return name.decode(), tuple(extents)


# -- the reader --------------------------------------------------------------------------
# A `checkpoint` state file (CheckpointState in protobuf text format, which
# C-escapes its strings: a non-ASCII byte as \ooo, a quote as \" or \').
_STATE_RE = re.compile(rb'^(model_checkpoint_path|all_model_checkpoint_paths):\s*'
                       rb'"((?:[^"\\]|\\.)*)"\s*$', re.M)
_FILE_RE = re.compile(r"(.+)\.(index|data-\d{5}-of-\d{5})$")


def state_prefixes(model_dir: str) -> Tuple[Optional[str], List[str]]:
    """(latest, all listed) prefixes of `model_dir`'s `checkpoint` state file,
    as paths (relative ones joined to model_dir); (None, []) without one."""
    try:
        with open(os.path.join(model_dir, "checkpoint"), "rb") as f:
            text = f.read()
    except OSError:
        return None, []
    latest, listed = None, []
    for match in _STATE_RE.finditer(text):
        path = os.fsdecode(codecs.escape_decode(match.group(2))[0])
        path = path if os.path.isabs(path) else os.path.join(model_dir, path)
        if match.group(1) == b"model_checkpoint_path":
            latest = path
        else:
            listed.append(path)
    return latest, listed


def find_prefix(path: str) -> Optional[str]:
    """The TF checkpoint prefix `path` names (a prefix, one of its files, or a
    model_dir whose `checkpoint` state file names one), or None when it is not
    a TF checkpoint."""
    if os.path.isfile(path + ".index"):
        return path
    named = _FILE_RE.match(path)
    if named and os.path.isfile(path) and os.path.isfile(named.group(1) + ".index"):
        return named.group(1)   # (TF's reader, given a file, finds no variables)
    if os.path.isdir(path):   # (this project's model_dirs have the same state file, no .index)
        latest, _ = state_prefixes(path)
        if latest is not None and os.path.isfile(latest + ".index"):
            return latest
    return None


class TFCheckpointReader:
    """The variables of a TF checkpoint `prefix` (TF: ``tf.train.load_checkpoint``)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        index = read_index(prefix + ".index")
        header = index.pop(b"", None)
        if header is None:
            raise CorruptCheckpointError(f"{prefix}.index: no bundle header")
        self.num_shards = dict(_fields(header)).get(1, 1)
        self._names: Dict[str, Entry] = {}
        self._slices: Dict[str, list] = {}   # name -> [(extents, entry)] of its parts
        for key, value in index.items():
            if key.startswith(b"\x00"):     # a slice: ordered-code keys start with 0
                name, extents = decode_slice_key(key)
                self._slices.setdefault(name, []).append((extents, _entry(value)))
            else:
                self._names[key.decode("utf-8", "replace")] = _entry(value)

    def variables(self) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
        """{name: (dtype name, shape)}."""
        return {name: (_DTYPE_NAMES.get(e.dtype, f"dtype {e.dtype}"), e.shape)
                for name, e in sorted(self._names.items())}

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def tensor(self, name: str) -> np.ndarray:
        """The value of variable `name` (a partitioned one reassembled)."""
        entry = self._names.get(name)
        if entry is None:
            close = difflib.get_close_matches(name, list(self._names), n=3, cutoff=0.5)
            raise KeyError(f"{name!r} is not in TF checkpoint {self.prefix}"
                           + (f"; the closest names: {close}" if close else ""))
        if not entry.slices:
            return self._read(name, entry)
        parts = self._slices.get(name, [])
        if len(parts) != len(entry.slices):
            raise CorruptCheckpointError(f"{self.prefix}.index: {name!r} lists "
                                         f"{len(entry.slices)} slices, {len(parts)} are there")
        out = np.empty(entry.shape, dtype=self._dtype(name, entry))
        for extents, part in parts:
            where = tuple(slice(e.start, None if e.length is None else e.start + e.length)
                          for e in extents)
            out[where] = self._read(name, part)
        return out

    def _dtype(self, name: str, entry: Entry):
        dtype = _DTYPES.get(entry.dtype)
        if dtype is None:   # (TF's quantized types, resources, variants)
            raise ValueError(f"{name!r} in {self.prefix} has TF dtype "
                             f"{_DTYPE_NAMES.get(entry.dtype, f'enum {entry.dtype}')}, which is "
                             "not read here (numbers, bool and strings are)")
        return dtype

    def _read(self, name: str, entry: Entry) -> np.ndarray:
        dtype = self._dtype(name, entry)
        shard = f"{self.prefix}.data-{entry.shard_id:05d}-of-{self.num_shards:05d}"
        try:
            with open(shard, "rb") as f:
                f.seek(entry.offset)
                data = f.read(entry.size)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{shard}: no such file (it holds {name!r})") from None
        if len(data) != entry.size:
            raise CorruptCheckpointError(f"{shard}: truncated ({name!r} needs bytes "
                                         f"{entry.offset}..{entry.offset + entry.size})")
        if entry.dtype == _STRING:
            return self._strings(name, entry, data, shard)
        if entry.crc32c is not None and google_crc32c.value(data) != _unmask(entry.crc32c):
            raise self._corrupted(shard, name)
        if entry.dtype == _BFLOAT16:   # the high half of a float32
            high = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
            return high.view(np.float32).reshape(entry.shape)
        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(
            entry.shape).astype(dtype)

    def _strings(self, name: str, entry: Entry, data: bytes, shard: str):
        """A string tensor: [varint64 length]... [masked CRC-32C of the lengths]
        [the bytes]; its entry's CRC covers each length as a little-endian
        uint32 (uint64 past 4 GiB), that CRC, then the bytes (TF's
        WriteStringTensor)."""
        count = int(np.prod(entry.shape, dtype=np.int64))
        lengths, pos, crc = [], 0, 0
        try:
            for _ in range(count):
                length, pos = _varint(data, pos)
                lengths.append(length)
                crc = google_crc32c.extend(crc, struct.pack(
                    "<I" if length <= 0xFFFFFFFF else "<Q", length))
            stored = data[pos:pos + 4]
            valid = len(stored) == 4 and _unmask(struct.unpack("<I", stored)[0]) == crc
        except ValueError:
            valid = False
        crc = google_crc32c.extend(crc, stored) if valid else crc
        pos += 4
        valid = valid and pos + sum(lengths) == len(data)
        if valid and entry.crc32c is not None:
            valid = google_crc32c.extend(crc, data[pos:]) == _unmask(entry.crc32c)
        if not valid:
            raise self._corrupted(shard, name)
        out = np.empty(count, dtype=object)
        for i, length in enumerate(lengths):
            out[i], pos = data[pos:pos + length], pos + length
        return out.reshape(entry.shape) if entry.shape else out[0]

    @staticmethod
    def _corrupted(shard: str, name: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"{shard}: the data of {name!r} is corrupted (CRC "
                                      "mismatch)")
