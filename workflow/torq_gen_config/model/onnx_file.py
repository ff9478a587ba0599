"""An ONNX file's graph without its weights: the protobuf scanned, not parsed whole.

``onnx.load`` reads a model file into memory and parses it: the weights twice over, and
a model of several GB cannot be loaded at all. :func:`read_skeleton` walks the file's
protobuf wire format through a memory map instead (ModelProto -> graph -> initializers,
node attributes, subgraphs; the field numbers of onnx.proto3) and writes the model's
bytes with the values of each large tensor (``raw_data``, and the packed ``float_data``
/ ``double_data`` whose bytes are the same little-endian values) left out and replaced
by ONNX external data pointing at their place in the file itself. Parsing that skeleton
gives the model with its weights external (read later a tensor at a time, or copied to
the weight store without passing through memory: :mod:`torq_gen_config.core.weight_store`).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

# field numbers (onnx.proto3)
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_GRAPH_NODE, _GRAPH_INITIALIZER = 1, 5
_NODE_ATTRIBUTE = 5
_FUNCTION_NODE = 7
_ATTR_T, _ATTR_G, _ATTR_TENSORS, _ATTR_GRAPHS = 5, 6, 10, 11
_TENSOR_DATA_TYPE, _TENSOR_FLOAT_DATA, _TENSOR_RAW_DATA, _TENSOR_DOUBLE_DATA = 2, 4, 9, 10
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14
_FLOAT, _DOUBLE, _COMPLEX64, _COMPLEX128 = 1, 11, 14, 15
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """``(field number, wire type, field start, payload start, payload end)`` of each
    field of the message ``buf[start:end]``."""
    pos = start
    while pos < end:
        first = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            payload, after = pos, _varint(buf, pos, end)[1]
        elif wire == _I64:
            payload, after = pos, pos + 8
        elif wire == _I32:
            payload, after = pos, pos + 4
        elif wire == _LEN:
            length, payload = _varint(buf, pos, end)
            after = payload + length
        else:
            raise WireError(f"wire type {wire} (groups are not used by ONNX)")
        if after > end:
            raise WireError("truncated: a field runs past the end of its message")
        yield number, wire, first, payload, after
        pos = after


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint((number << 3) | _LEN) + _encode_varint(len(payload)) + payload


class _Skeleton:
    def __init__(self, buf, location: str, min_bytes: int):
        self.buf, self.location, self.min_bytes = buf, location, min_bytes
        self.tensors = 0

    def message(self, start: int, end: int, children: dict[int, str]) -> bytes:
        """The message's bytes, its ``children`` fields (number -> kind) rewritten."""
        out = bytearray()
        for number, wire, first, a, b in _fields(self.buf, start, end):
            kind = children.get(number) if wire == _LEN else None
            if kind is None:
                out += self.buf[first:b]
            else:
                out += _len_field(number, getattr(self, kind)(a, b))
        return bytes(out)

    def graph(self, a: int, b: int) -> bytes:
        return self.message(a, b, {_GRAPH_NODE: "node", _GRAPH_INITIALIZER: "tensor"})

    def node(self, a: int, b: int) -> bytes:
        return self.message(a, b, {_NODE_ATTRIBUTE: "attribute"})

    def function(self, a: int, b: int) -> bytes:
        return self.message(a, b, {_FUNCTION_NODE: "node"})

    def attribute(self, a: int, b: int) -> bytes:
        return self.message(a, b, {_ATTR_T: "tensor", _ATTR_G: "graph", _ATTR_TENSORS: "tensor",
                                   _ATTR_GRAPHS: "graph"})

    def tensor(self, a: int, b: int) -> bytes:
        fields = list(_fields(self.buf, a, b))
        dtype = next((_varint(self.buf, x, y)[0] for n, w, _, x, y in fields if n == _TENSOR_DATA_TYPE and w == _VARINT),
                     0)
        if any(n in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION) for n, *_ in fields):
            return bytes(self.buf[a:b])  # already external (or marked so): as it is
        packed = {_TENSOR_RAW_DATA}
        if dtype in (_FLOAT, _COMPLEX64):
            packed.add(_TENSOR_FLOAT_DATA)
        if dtype in (_DOUBLE, _COMPLEX128):
            packed.add(_TENSOR_DOUBLE_DATA)
        values = [(x, y) for n, w, _, x, y in fields if n in packed and w == _LEN]
        if len(values) != 1 or values[0][1] - values[0][0] < self.min_bytes:
            return bytes(self.buf[a:b])
        (x, y), = values
        out = bytearray()
        for n, w, first, _, end in fields:
            if not (n in packed and w == _LEN):
                out += self.buf[first:end]
        for key, value in (("location", self.location), ("offset", str(x)), ("length", str(y - x))):
            entry = _len_field(1, key.encode()) + _len_field(2, value.encode())
            out += _len_field(_TENSOR_EXTERNAL_DATA, entry)
        out += _encode_varint((_TENSOR_DATA_LOCATION << 3) | _VARINT) + _encode_varint(1)  # EXTERNAL
        self.tensors += 1
        return bytes(out)


def read_skeleton(path: str | os.PathLike, *, min_bytes: int = 1024) -> tuple[bytes, int]:
    """The bytes of the ONNX model file ``path`` with every tensor value of at least
    ``min_bytes`` bytes replaced by an external-data reference to its bytes in ``path``
    itself (``location`` the file's absolute path, ``offset``, ``length``; the
    weight store's loaders read such locations). Memory: the skeleton, plus the pages
    of the file that hold the graph (the weights' pages are not read).

    Returns:
        ``(skeleton bytes, number of tensors referred to)``.

    Raises:
        WireError: the file is not a well-formed protobuf message.
        OSError: the file cannot be read.
    """
    path = Path(path).resolve()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise WireError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            sk = _Skeleton(memoryview(mm), str(path), min_bytes)
            try:
                data = sk.message(0, size, {_MODEL_GRAPH: "graph", _MODEL_FUNCTIONS: "function"})
            finally:
                sk.buf.release()
    return data, sk.tensors
