"""Static dims and dtype classes of graph inputs, as the generator and its rules read them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import ml_dtypes, np

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_SUB_BYTE_INTS = ("int4", "uint4", "int2", "uint2")
_INT64_MAX = 2**63 - 1


def _dims(type_proto) -> tuple | None:
    """Static dims of a tensor type: ints, None for an unknown/symbolic dim; None when
    the rank is unknown or the type is not a tensor."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in type_proto.tensor_type.shape.dim)


def input_shape(vi: "onnx.ValueInfoProto") -> tuple[int, ...]:
    """The static shape of graph input ``vi``; a 0 dim is a real (empty) dim.

    Raises:
        ValueError: ``vi`` is not a tensor, has no shape, or a dim is symbolic
            (``dim_param``) or unknown; the message names the input and the dim.
    """
    t = vi.type
    if not t.HasField("tensor_type"):
        raise ValueError(f"input {vi.name!r} is not a tensor ({t.WhichOneof('value')}); inputs are generated "
                         f"for tensors only")
    if not t.tensor_type.HasField("shape"):
        raise ValueError(f"input {vi.name!r} has no shape (unknown rank); give it a static shape")
    dims = []
    for i, d in enumerate(t.tensor_type.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            raise ValueError(f"input {vi.name!r}: dim {i} is symbolic ({d.dim_param!r}); give it a static size")
        else:
            raise ValueError(f"input {vi.name!r}: dim {i} is unknown; give it a static size")
    return tuple(dims)


def _match(expected, declared) -> bool:
    """``expected`` (ints) agrees with ``declared`` (ints or None per dim; None = unknown)."""
    if declared is None:
        return True
    return len(expected) == len(declared) and all(d is None or int(e) == d for e, d in zip(expected, declared))


def _known(shape) -> bool:
    return shape is not None and all(d is not None for d in shape)


def _is_float(dt) -> bool:
    return dt.kind == "f" or dt.name.startswith(("bfloat16", "float"))


def _is_int(dt) -> bool:
    return dt.kind in "iu" or dt.name in _SUB_BYTE_INTS


def _int_info(dt) -> tuple[int, int]:
    """[min, max] of an integer dtype (ml_dtypes int4/uint4/int2/uint2 included)."""
    if dt.name in _SUB_BYTE_INTS:
        info = ml_dtypes.iinfo(dt)
    else:
        info = np.iinfo(dt)
    return int(info.min), int(info.max)
