"""ONNX Runtime I/O for every tensor dtype: numpy/ml_dtypes arrays in, numpy/ml_dtypes arrays out.

onnxruntime's numpy binding converts only numpy's own dtypes. It refuses
``ml_dtypes`` arrays as feeds ("Numpy_type 263 can't be converted to MLDataType")
and cannot return most non-numpy outputs from ``InferenceSession.run`` ("No
corresponding Numpy type for Tensor Type. Float8E5M2FNUZ"; float8e4m3fn outputs come
back as plain ``uint8``). This module moves such tensors through ``OrtValue``s:

- feeds: :func:`to_ort_value` reinterprets the array's bit patterns with
  ``OrtValue.ortvalue_from_numpy_with_onnx_type`` (bfloat16 as uint16, the 8-bit floats
  as uint8). Sub-byte types are packed as ONNX and onnxruntime store them
  (https://onnx.ai/onnx/technical/int4.html, .../float4.html): int4/uint4/float4e2m1
  two elements per byte, int2/uint2 four per byte, element ``i`` in the lowest bits
  first (element 0 in bits 0-3 of byte 0, element 1 in bits 4-7; checked against
  onnxruntime 1.32's ``Cast`` output). The packed bytes lie at the start of a uint8
  buffer of the tensor's logical shape, from which onnxruntime reads
  ``ceil(n * bits / 8)`` bytes.
- outputs: :func:`from_ort_value` reads the tensor's bytes from ``OrtValue.data_ptr()``
  (``tensor_size_in_bytes()`` of them, on the CPU) and views or unpacks them as the
  ml_dtypes type (:func:`numpy_dtype`).
- :func:`run` uses ``session.run`` when every fed array and every fetched output has a
  numpy dtype (:data:`NUMPY_NATIVE`), else ``run_with_ort_values`` with every feed an
  ``OrtValue``.

String tensors have no ``OrtValue`` constructor in onnxruntime's Python API (``Creation
of OrtValues is currently only supported from non-string numpy arrays``): they work
on the ``session.run`` path only (numpy ``object`` or ``str`` arrays).

onnx type -> numpy dtype (:func:`numpy_dtype`): ``onnx.helper.tensor_dtype_to_np_dtype``
(onnx >= 1.18 maps every type, the non-numpy ones to ml_dtypes), with an ml_dtypes
table as a fall-back for onnx versions whose helper lacks a type.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .lazy import helper, ml_dtypes, np, onnx, ort


__all__ = [
    "NUMPY_NATIVE", "SUB_BYTE_BITS", "numpy_dtype", "onnx_elem_type", "pack_sub_byte", "unpack_sub_byte",
    "to_ort_value", "from_ort_value", "needs_ort_values", "prepare_feed", "run",
]

#: onnx element types (TensorProto.DataType values) that onnxruntime's numpy binding
#: feeds and returns as numpy arrays of the same dtype: FLOAT, UINT8, INT8, UINT16,
#: INT16, INT32, INT64, STRING, BOOL, FLOAT16, DOUBLE, UINT32, UINT64.
NUMPY_NATIVE = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})

#: bits per element of the packed sub-byte types: UINT4 (21), INT4 (22),
#: FLOAT4E2M1 (23), UINT2 (25), INT2 (26).
SUB_BYTE_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2}

#: onnx element type -> ml_dtypes name, used where onnx's helper has no mapping.
_ML_DTYPES = {
    16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
    21: "uint4", 22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2",
    27: "float6_e2m3fn", 28: "float6_e3m2fn",
}


def numpy_dtype(elem_type: int) -> "np.dtype":
    """The numpy dtype of an onnx element type (``TensorProto.DataType`` value).

    Numpy types for numpy's own ones (STRING -> ``object``), ml_dtypes types for the
    others (BFLOAT16 -> ``ml_dtypes.bfloat16``, FLOAT8E4M3FN -> ``float8_e4m3fn``,
    FLOAT8E8M0 -> ``float8_e8m0fnu``, INT4 -> ``int4``, FLOAT4E2M1 -> ``float4_e2m1fn``,
    INT2 -> ``int2``, ...; one element per byte, unpacked).

    Raises:
        ValueError: UNDEFINED or an element type that neither onnx nor the installed
            ml_dtypes knows.
    """
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(elem_type)))
    except (KeyError, ValueError, TypeError):
        pass
    name = _ML_DTYPES.get(int(elem_type))
    if name is not None:
        if hasattr(ml_dtypes, name):
            return np.dtype(getattr(ml_dtypes, name))
    raise ValueError(f"no numpy or ml_dtypes dtype for onnx element type {elem_type}")


def onnx_elem_type(dtype: Any) -> int:
    """The onnx element type of a numpy or ml_dtypes dtype (the inverse of
    :func:`numpy_dtype`; numpy ``str`` arrays map to STRING).

    Raises:
        ValueError: a dtype with no onnx type (e.g. ``datetime64``).
    """
    dt = np.dtype(dtype)
    if dt.kind in "US":
        return 8
    try:
        return int(helper.np_dtype_to_tensor_dtype(dt))
    except (KeyError, ValueError, TypeError):
        pass
    for k, name in _ML_DTYPES.items():
        if dt.name == name:
            return k
    raise ValueError(f"numpy dtype {dt} has no onnx element type")


def pack_sub_byte(a: "np.ndarray", bits: int) -> "np.ndarray":
    """Pack a sub-byte array (ml_dtypes int4/uint4/float4_e2m1fn/int2/uint2, one element
    per byte) into ``ceil(a.size * bits / 8)`` bytes, element 0 in the lowest bits.

    Returns:
        1-D uint8 array (a trailing partial byte is zero-padded).
    """
    per_byte = 8 // bits
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8) & np.uint8((1 << bits) - 1)
    pad = (-flat.size) % per_byte
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, np.uint8)])
    groups = flat.reshape(-1, per_byte).astype(np.uint8)
    out = np.zeros(groups.shape[0], np.uint8)
    for j in range(per_byte):
        out |= (groups[:, j] << np.uint8(j * bits)).astype(np.uint8)
    return out


def unpack_sub_byte(packed: "np.ndarray", bits: int, shape: tuple[int, ...], dtype: Any) -> "np.ndarray":
    """Inverse of :func:`pack_sub_byte`: ``shape`` elements of ``dtype`` (an ml_dtypes
    sub-byte type) from packed bytes; signed types come back sign-extended as ml_dtypes
    stores them."""
    per_byte = 8 // bits
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.asarray(packed, dtype=np.uint8).reshape(-1)
    mask = np.uint8((1 << bits) - 1)
    vals = np.stack([(raw >> np.uint8(j * bits)) & mask for j in range(per_byte)], axis=1).reshape(-1)[:count]
    dt = np.dtype(dtype)
    if dt.name.startswith("int"):  # ml_dtypes int4/int2 hold the sign-extended byte
        sign = np.uint8(1 << (bits - 1))
        vals = np.where(vals & sign, vals | np.uint8(0xFF ^ int(mask)), vals).astype(np.uint8)
    return vals.astype(np.uint8).view(dt).reshape(shape)


def to_ort_value(a: "np.ndarray", elem_type: int | None = None):
    """``a`` as a CPU ``onnxruntime.OrtValue`` of onnx type ``elem_type`` (default: the
    type of ``a``'s dtype, :func:`onnx_elem_type`).

    Numpy-native dtypes go through ``OrtValue.ortvalue_from_numpy``; the others
    through ``ortvalue_from_numpy_with_onnx_type`` on their bit patterns (uint16 for
    bfloat16, uint8 for the 8-bit floats, packed bytes for the sub-byte types, see
    the module doc). The OrtValue keeps a reference to the buffer it reads.

    Raises:
        TypeError: a string array (onnxruntime's Python API cannot make string
            OrtValues; feed it through ``session.run``, see :func:`run`).
        ValueError: a dtype with no onnx type.
    """
    a = np.asarray(a)
    if not a.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        a = a.copy(order="C")
    et = onnx_elem_type(a.dtype) if elem_type is None else int(elem_type)
    if et == 8:
        raise TypeError("onnxruntime cannot make an OrtValue of a string tensor; strings are fed with session.run")
    if et in NUMPY_NATIVE:
        return ort.OrtValue.ortvalue_from_numpy(a)
    if et in SUB_BYTE_BITS:
        packed = pack_sub_byte(a, SUB_BYTE_BITS[et])
        buf = np.zeros(a.shape, dtype=np.uint8)  # onnxruntime reads the first ceil(n*bits/8) bytes
        buf.reshape(-1)[:packed.size] = packed
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buf, et)
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(bits), et)


def _elem_type_of_value(v) -> int:
    """The onnx element type of an OrtValue's tensor."""
    et = getattr(v, "element_type", None)
    if callable(et):
        try:
            return int(et())
        except Exception:  # pragma: no cover - older onnxruntime: parse data_type()
            pass
    name = v.data_type()  # "tensor(float8e4m3fn)"
    inner = name[len("tensor("):-1].upper()
    TensorProto = onnx.TensorProto
    return int({"FLOAT": TensorProto.FLOAT, "DOUBLE": TensorProto.DOUBLE}.get(inner, TensorProto.DataType.Value(inner)))


def from_ort_value(v) -> "np.ndarray":
    """A copy of a CPU tensor ``OrtValue`` as a numpy array of :func:`numpy_dtype` of its
    type (ml_dtypes arrays for bfloat16, float8, int4/uint4, float4e2m1, int2/uint2).

    Raises:
        TypeError: ``v`` is not a tensor (a sequence or map output).
        RuntimeError: a non-numpy tensor on a device other than the CPU.
    """
    if not v.is_tensor():
        raise TypeError(f"OrtValue of type {v.data_type()} is not a tensor")
    et = _elem_type_of_value(v)
    if et in NUMPY_NATIVE:
        return v.numpy()
    if v.device_name().lower() != "cpu":  # pragma: no cover - outputs of run_with_ort_values are on the CPU
        raise RuntimeError(f"{v.data_type()} output on device {v.device_name()!r} cannot be read")
    dt = numpy_dtype(et)
    shape = tuple(v.shape())
    nbytes = int(v.tensor_size_in_bytes())
    raw = (np.frombuffer((ctypes.c_uint8 * nbytes).from_address(v.data_ptr()), dtype=np.uint8).copy()
           if nbytes else np.zeros(0, np.uint8))
    if et in SUB_BYTE_BITS:
        return unpack_sub_byte(raw, SUB_BYTE_BITS[et], shape, dt)
    return raw.view(dt).reshape(shape)


def _session_output_types(session) -> dict[str, str]:
    return {o.name: o.type for o in session.get_outputs()}


def _native_type_string(t: str) -> bool:
    """True for onnxruntime type strings of :data:`NUMPY_NATIVE` tensors."""
    return t in {"tensor(float)", "tensor(uint8)", "tensor(int8)", "tensor(uint16)", "tensor(int16)",
                 "tensor(int32)", "tensor(int64)", "tensor(string)", "tensor(bool)", "tensor(float16)",
                 "tensor(double)", "tensor(uint32)", "tensor(uint64)"}


def needs_ort_values(session, output_names: list[str] | None) -> bool:
    """True when one of ``output_names`` (None: all outputs) is a tensor whose type
    ``session.run`` cannot return as numpy (then :func:`run` uses ``run_with_ort_values``)."""
    types = _session_output_types(session)
    names = list(types) if output_names is None else list(output_names)
    return any(types.get(n, "").startswith("tensor(") and not _native_type_string(types[n]) for n in names)


def _is_native_array(a) -> bool:
    dt = np.asarray(a).dtype
    return dt.kind in "OUS" or (dt.kind in "biuf" and dt.name in {
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64"})


def prepare_feed(session, feeds: dict, output_names: list[str] | None = None) -> dict:
    """The feed for :func:`run`, converted once (e.g. before a timing loop).

    Arrays whose dtype onnxruntime's numpy binding takes stay numpy arrays; the others
    (ml_dtypes) become OrtValues (:func:`to_ort_value`). When an output among
    ``output_names`` needs ``run_with_ort_values`` (:func:`needs_ort_values`), every feed
    becomes an OrtValue. Values that already are OrtValues are kept.

    Raises:
        TypeError: a string input where every feed must be an OrtValue (a string
            input together with a non-numpy output: onnxruntime's Python API cannot
            run that combination).
    """
    return _prepare(feeds, needs_ort_values(session, output_names))


def _prepare(feeds: dict, all_values: bool) -> dict:
    out = {}
    for name, a in feeds.items():
        if isinstance(a, ort.OrtValue):
            out[name] = a
            continue
        a = np.asarray(a)
        if all_values or not _is_native_array(a):
            if a.dtype.kind in "OUS":
                raise TypeError(f"input {name!r} is a string tensor, but an output has a type that session.run cannot "
                                f"return; onnxruntime's Python API cannot feed strings to run_with_ort_values")
            out[name] = to_ort_value(a)
        else:
            out[name] = a
    return out


def run(session, output_names: list[str] | None, feeds: dict, run_options=None) -> list["np.ndarray"]:
    """Run ``session`` on ``feeds`` and return the ``output_names`` (None: all) as arrays.

    ``session.run`` when every feed and fetched output has a numpy dtype (the feeds
    may be numpy arrays or OrtValues, e.g. from :func:`prepare_feed`); else
    ``run_with_ort_values`` with every feed an OrtValue, the outputs read back with
    :func:`from_ort_value` (ml_dtypes arrays for the non-numpy types).

    Args:
        session: an ``onnxruntime.InferenceSession``.
        output_names: the outputs to fetch, in order.
        feeds: input name -> numpy/ml_dtypes array or OrtValue.
        run_options: an ``onnxruntime.RunOptions`` or None.

    Raises:
        TypeError: see :func:`prepare_feed`.
        onnxruntime's exceptions: whatever the run raises.
    """
    fetch = [o.name for o in session.get_outputs()] if output_names is None else list(output_names)
    all_values = needs_ort_values(session, fetch)
    feed = _prepare(feeds, all_values)  # (a prepared feed passes through unchanged)
    if not all_values:
        return session.run(fetch, feed, run_options)
    return [from_ort_value(v) for v in session.run_with_ort_values(fetch, feed, run_options)]
