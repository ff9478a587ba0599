"""An output against a node test's expected output, by the test's own rule: floats (also
bfloat16, float8, float4) ``|a - e| <= atol + rtol * |e|`` in float64 with NaN equal to NaN
and equal infinities equal; integers (also int4/int2), bools and strings exactly; the dtype
and shape must be the expected ones (docs/comparison.md, "Conformance benchmark")."""

from __future__ import annotations

from ..core.lazy import np
from .cases import as_array


def _kind(a: np.ndarray) -> str:
    if a.dtype.kind in "USO":
        return "string"
    if a.dtype == np.bool_:
        return "bool"
    if a.dtype.kind in "iu" or a.dtype.name in ("int4", "uint4", "int2", "uint2"):
        return "int"
    return "float"


def _same_dtype(a: np.ndarray, e: np.ndarray) -> bool:
    if _kind(a) == "string" and _kind(e) == "string":
        return True
    return a.dtype == e.dtype


def _first(mask) -> int:
    idx = np.flatnonzero(np.asarray(mask))
    return int(idx[0]) if idx.size else 0


def close_to_expected(actual, expected, rtol: float, atol: float) -> str | None:
    """None when ``actual`` matches ``expected`` (the rule above), else why not (one line)."""
    a, e = as_array(actual), as_array(expected)
    if not _same_dtype(a, e):
        return f"dtype {a.dtype} differs from the expected {e.dtype}"
    if a.shape != e.shape:
        return f"shape {a.shape} differs from the expected {e.shape}"
    k = _kind(e)
    if k == "string":
        sa, se = a.astype(str), e.astype(str)
        bad = int(np.sum(sa != se))
        i = _first(sa != se)
        return f"{bad} of {e.size} strings differ (e.g. {sa.flat[i]!r} vs {se.flat[i]!r})" if bad else None
    if k in ("bool", "int"):
        ai = a.astype(np.int64) if k == "int" and a.dtype != np.uint64 else a
        ei = e.astype(np.int64) if k == "int" and e.dtype != np.uint64 else e
        neq = ai != ei
        bad = int(np.sum(neq))
        if not bad:
            return None
        i = _first(neq)
        return f"{bad} of {e.size} elements differ exactly (e.g. {a.flat[i]} vs {e.flat[i]} at {i})"
    af, ef = a.astype(np.float64), e.astype(np.float64)
    with np.errstate(all="ignore"):
        ok = np.isclose(af, ef, rtol=rtol, atol=atol, equal_nan=True)
    bad = int(np.sum(~ok))
    if not bad:
        return None
    i = _first(~ok)
    with np.errstate(all="ignore"):
        d = np.abs(af - ef)
        fin = np.isfinite(d)
        mx = float(np.max(d[fin])) if fin.any() else float("nan")
    return (f"{bad} of {e.size} elements outside rtol {rtol:g} atol {atol:g} (max abs diff {mx:.3g}; "
            f"e.g. {af.flat[i]:.7g} vs {ef.flat[i]:.7g} at {i})")


def same_values(a, e) -> bool:
    """Bit-for-bit equality (strings by value)."""
    a, e = as_array(a), as_array(e)
    if a.shape != e.shape:
        return False
    if _kind(a) == "string" or _kind(e) == "string":
        return _kind(a) == _kind(e) and bool(np.array_equal(a.astype(str), e.astype(str)))
    if a.dtype != e.dtype:
        return False
    return bool(np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(e).view(np.uint8)))
