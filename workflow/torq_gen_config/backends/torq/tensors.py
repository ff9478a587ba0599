"""Tensors to and from ``torq-run-module``: raw little-endian ``.bin`` files described
with IREE's type names (``--input=1x3x8x8xf32=@file``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ...core.lazy import ml_dtypes, np


# numpy dtype name -> IREE element type name (the --input=<shape>x<type> syntax).
_IREE_TYPES = {
    "bool": "i1",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "ui8",
    "uint16": "ui16",
    "uint32": "ui32",
    "uint64": "ui64",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
}


def iree_type_name(dtype: Any) -> str:
    """IREE's element type name for a numpy dtype (``float32`` -> ``f32``, ``bool`` -> ``i1``).

    Raises:
        ValueError: a dtype IREE's tools cannot exchange (strings, objects, complex, ...).
    """
    name = np.dtype(dtype).name
    if name not in _IREE_TYPES:
        raise ValueError(f"dtype {name} has no IREE element type (supported: {', '.join(_IREE_TYPES)})")
    return _IREE_TYPES[name]


def input_spec(arr: "np.ndarray") -> str:
    """``<d0>x<d1>x...x<type>`` for an array (``f32`` alone for a scalar)."""
    return "x".join([*(str(int(d)) for d in arr.shape), iree_type_name(arr.dtype)])


def write_input_bin(arr: "np.ndarray", path: str | os.PathLike) -> str:
    """Write ``arr`` as raw little-endian data (row-major) and return its :func:`input_spec`.

    Raises:
        ValueError: unsupported dtype.
    """
    arr = np.asarray(arr)
    spec = input_spec(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.require(arr, requirements="C").tofile(os.fspath(path))
    return spec


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype).newbyteorder("<")


def read_output_bin(path: str | os.PathLike, shape: Sequence[int | None], dtype: str) -> "np.ndarray":
    """Read a raw output file written by ``torq-run-module --output=@<file>.bin``.

    Args:
        path: the file.
        shape: the result's shape; at most one ``None`` (dynamic) dimension, inferred
            from the file size.
        dtype: numpy dtype name (``"float32"``, ``"bool"``, ``"bfloat16"``, ...).

    Returns:
        The array, in native byte order.

    Raises:
        ValueError: unknown dtype, more than one dynamic dimension, or a file size
            that does not fit the shape.
    """
    try:
        dt = _numpy_dtype(dtype)
    except TypeError:
        raise ValueError(f"cannot read a raw output of element type {dtype!r}") from None
    data = np.fromfile(os.fspath(path), dtype=dt)
    shape = list(shape)
    unknown = [i for i, d in enumerate(shape) if d is None]
    if len(unknown) > 1:
        raise ValueError(f"raw output {os.fspath(path)}: shape {shape} has more than one dynamic dimension")
    known = int(np.prod([d for d in shape if d is not None], dtype=np.int64))
    if unknown:
        if known == 0 or data.size % known:
            raise ValueError(f"raw output {os.fspath(path)}: {data.size} values do not fit shape {shape}")
        shape[unknown[0]] = data.size // known
    elif data.size != known:
        raise ValueError(
            f"raw output {os.fspath(path)}: holds {data.size} {dtype} values, expected {known} for shape {shape}"
        )
    arr = data.reshape(shape)
    return arr.astype(arr.dtype.newbyteorder("=")) if arr.dtype.byteorder == ">" else arr
