"""Per-kind element comparisons of one output with its reference (numpy and ml_dtypes).

Float outputs: the normalized error ``d``, its histogram on :data:`REL_DIFF_THRESHOLDS`,
the cosine similarity and examples of non-finite mismatches; integer outputs: the
exact ``|o - r|`` and its histogram on :data:`ABS_DIFF_THRESHOLDS`; bool and string
outputs: exact matches. Each ``_compare_*`` returns the per-output part of the
metrics of :func:`~.metrics.compare_outputs` (JSON-safe: NaN/inf stored as None).
"""

from __future__ import annotations

import math
from typing import Any

from ..core.lazy import ml_dtypes, np

ABS_FLOOR: dict[str, float] = {
    "float64": 1e-7,
    "float32": 1e-5,
    "float16": 1e-3,
    "bfloat16": 1e-2,
}
"""Absolute part of the relative-error floor per reference dtype (about the
dtype's rounding step near 1, so that values that round to zero do not fail).
Other ml_dtypes float types (float8 variants) use their machine epsilon."""

RELATIVE_FLOOR_FRACTION = 1e-3
"""The floor is at least this fraction of the largest finite ``|reference|``."""

_MANTISSAS = ("1", "1.5", "2", "2.5", "3", "4", "5", "6", "7", "8")

REL_DIFF_THRESHOLDS: tuple[float, ...] = (0.0,) + tuple(
    float(f"{m}e{e}") for e in range(-7, 2) for m in _MANTISSAS
) + (1e2,)
"""Thresholds ``t`` (dimensionless) at which the number of float elements with
``d > t`` is stored: 0, then 10 points per decade from 1e-7 to 1e2
(mantissas 1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8). Common tolerances such as 0.01,
0.02, 0.05 or 1.5e-3 are grid points, so their counts are exact."""

ABS_DIFF_THRESHOLDS: tuple[int, ...] = (
    0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256,
)
"""Thresholds ``a`` at which the number of integer elements with ``|diff| > a``
is stored."""

_NONFINITE_EXAMPLES = 3


def _ml_dtypes():
    """The ml_dtypes module, imported on first use: only outputs of its types (kind
    ``V``: bfloat16, float8, int4) need it, and loading its extension costs every
    Snakemake start about 0.4 s (the Snakefile imports the report step, which imports
    this module)."""
    return ml_dtypes


# --------------------------------------------------------------------------
# dtype helpers


def _dtype_name(dtype: np.dtype) -> str:
    return str(np.dtype(dtype))


def _kind_of(dtype: np.dtype) -> str:
    """Return "float", "int", "bool" or "string" for a numpy / ml_dtypes dtype
    (strings: numpy ``U``/``S`` arrays and object arrays, as ONNX Runtime returns them).

    Raises:
        TypeError: complex or other unsupported dtypes.
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "bool"
    if dtype.kind in "USO":  # ONNX string tensors (numpy str, bytes or str objects)
        return "string"
    if dtype.kind == "f":
        return "float"
    if dtype.kind in "iu":
        return "int"
    # ml_dtypes types (bfloat16, float8_*, int4, ...) have numpy kind "V".
    if dtype.kind != "V" or dtype.names is not None:
        raise TypeError(
            f"cannot compare outputs of dtype {dtype}: only float, integer and bool outputs are supported"
        )
    try:
        _ml_dtypes().finfo(dtype)
        return "float"
    except (ValueError, TypeError):
        pass
    try:
        _ml_dtypes().iinfo(dtype)
        return "int"
    except (ValueError, TypeError):
        pass
    raise TypeError(f"cannot compare outputs of dtype {dtype}: only float, integer and bool outputs are supported")


def _is_unsigned(dtype: np.dtype) -> bool:
    dtype = np.dtype(dtype)
    if dtype.kind == "u":
        return True
    if dtype.kind == "i":
        return False
    return int(_ml_dtypes().iinfo(dtype).min) == 0


def _abs_floor(dtype: np.dtype) -> float:
    name = _dtype_name(dtype)
    if name in ABS_FLOOR:
        return ABS_FLOOR[name]
    return float(_ml_dtypes().finfo(dtype).eps)


# --------------------------------------------------------------------------
# JSON-safe number helpers


def _finite_or_none(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _max_or_none(values):
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _min_or_none(values):
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


# --------------------------------------------------------------------------
# per-kind comparisons


def _counts_over(values: np.ndarray, thresholds, extra: int = 0) -> list[int]:
    """Number of ``values`` strictly greater than each threshold, plus ``extra``.

    ``values`` is 1-D, without NaN. Vectorized: one searchsorted + bincount.
    """
    grid = np.asarray(thresholds, dtype=np.float64)
    if values.size == 0:
        return [int(extra)] * len(grid)
    # idx = number of thresholds < value, so value > grid[k] iff idx >= k + 1.
    idx = np.searchsorted(grid, values, side="left")
    hist = np.bincount(idx, minlength=len(grid) + 1)
    over = np.cumsum(hist[::-1])[::-1][1:]
    return [int(c) + int(extra) for c in over]


def _cosine_similarity(o: np.ndarray, r: np.ndarray) -> float | None:
    """Cosine of the angle between two finite float64 vectors.

    Each vector is first divided by its own max-abs value (the cosine does not
    change), so neither huge nor tiny values overflow or underflow.
    None if exactly one of them is all zero (undefined); 1.0 if both are."""
    max_o = float(np.max(np.abs(o))) if o.size else 0.0
    max_r = float(np.max(np.abs(r))) if r.size else 0.0
    if max_o == 0.0 and max_r == 0.0:
        return 1.0
    if max_o == 0.0 or max_r == 0.0:
        return None
    os_ = o / max_o
    rs = r / max_r
    # both norms are >= 1 after the scaling
    denom = math.sqrt(float(np.dot(os_, os_))) * math.sqrt(float(np.dot(rs, rs)))
    cos = float(np.dot(os_, rs)) / denom
    return _finite_or_none(min(1.0, max(-1.0, cos)))


def _element_str(x) -> str:
    """One element as stored in ``nonfinite_examples``: "nan", "inf", "-inf" or the
    number in its own dtype's shortest form (float32 1.569 -> "1.569")."""
    v = float(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return str(x)


def _nonfinite_examples(mask: np.ndarray, o_raw: np.ndarray, r_raw: np.ndarray) -> list[dict]:
    """Up to ``_NONFINITE_EXAMPLES`` flat indices where ``mask`` (1-D, C order) is
    set, with both values as strings."""
    idx = np.flatnonzero(mask)[:_NONFINITE_EXAMPLES]
    o_flat = np.asarray(o_raw).reshape(-1)
    r_flat = np.asarray(r_raw).reshape(-1)
    return [{"index": int(i), "output": _element_str(o_flat[i]), "reference": _element_str(r_flat[i])}
            for i in idx]


def _float_inconclusive(num_elements: int, num_finite_ref: int, max_abs_ref: float,
                        ref_dtype: np.dtype, constant_ref: float | None = None) -> str | None:
    """Why a float comparison cannot tell a wrong output from a right one, or None.

    ``constant_ref``: the one value of a reference whose finite elements (two or more)
    are all equal, else None. Such a comparison checks one number: an output with its
    elements permuted, a wrong index or a wrong channel gives the same values (the
    embedded default model, all weights 0.02, ends in a Softmax that is 1/1000 for
    every class and every input).
    """
    if num_elements == 0:
        return "no elements to compare"
    if num_finite_ref == 0:
        return "reference has no finite elements"
    abs_floor = _abs_floor(ref_dtype)
    dtype = _dtype_name(ref_dtype)
    if max_abs_ref == 0.0:
        return f"reference is all zero (below the absolute floor {abs_floor:.1e} of {dtype})"
    if max_abs_ref < abs_floor:
        return f"reference magnitude {max_abs_ref:.1e} below the absolute floor {abs_floor:.1e} of {dtype}"
    if constant_ref is not None:
        return (f"reference is constant (all {num_finite_ref} finite elements {constant_ref:.6g}): "
                f"a permuted or misindexed output would match it too")
    return None


def _constant_value(r: np.ndarray) -> float | None:
    """The value of ``r`` (finite float64 elements) when it has two or more, all equal."""
    if r.size < 2:
        return None
    first = r[0]
    return float(first) if bool(np.all(r == first)) else None


def uniform_axes(r: np.ndarray) -> list[tuple[int, int]]:
    """The axes along which a reference repeats: ``[(axis, size), ...]`` for each axis of
    size 2 or more along which every slice equals the first one exactly (NaN never
    equals, so a reference with NaN repeats along no axis). An output permuted, shifted
    or wrongly indexed along such an axis matches the reference exactly: the comparison
    is blind there (the embedded default model, every weight 0.02, gives Convs whose
    output channels are all equal). One pass over ``r`` per axis."""
    r = np.asarray(r)
    out = []
    if r.size < 2:
        return out
    for axis, size in enumerate(r.shape):
        if size >= 2 and bool(np.all(r == r.take([0], axis=axis))):
            out.append((axis, int(size)))
    return out


def blind_spot_text(axes: list[tuple[int, int]]) -> str:
    """The note for :func:`uniform_axes`' result, e.g. ``"the reference repeats along axis 1
    (64 equal slices): an output permuted or misindexed along it would match it too"``."""
    where = ", ".join(f"axis {a} ({n} equal slices)" for a, n in axes)
    return (f"the reference repeats along {where}: an output permuted or misindexed along "
            f"{'it' if len(axes) == 1 else 'them'} would match it too")


def _compare_float(o_raw: np.ndarray, r_raw: np.ndarray, ref_dtype: np.dtype) -> dict:
    o = np.asarray(o_raw, dtype=np.float64).reshape(-1)
    r = np.asarray(r_raw, dtype=np.float64).reshape(-1)
    n = int(r.size)
    o_finite = np.isfinite(o)
    r_finite = np.isfinite(r)
    all_finite = bool(o_finite.all()) and bool(r_finite.all())
    nan_mismatch = False
    inf_mismatch = False
    num_special_mismatch = 0
    num_special_equal = 0
    examples: list[dict] = []
    if not all_finite:
        o_nan = np.isnan(o)
        r_nan = np.isnan(r)
        nan_diff = o_nan != r_nan
        nan_mismatch = bool(nan_diff.any())
        special = ~(o_finite & r_finite)
        # equal infinities and NaN in both are equal; everything else is a mismatch
        equal_special = special & ((o_nan & r_nan) | (o == r))
        mismatch_special = special & ~equal_special
        inf_mismatch = bool((mismatch_special & ~nan_diff).any())
        num_special_mismatch = int(mismatch_special.sum())
        num_special_equal = int(equal_special.sum())
        if num_special_mismatch:
            examples = _nonfinite_examples(mismatch_special, o_raw, r_raw)
        valid = o_finite & r_finite
        o = o[valid]
        r = r[valid]
    num_finite_ref = int(np.count_nonzero(r_finite))

    abs_r = np.abs(r)
    max_abs_ref = float(abs_r.max()) if r.size else 0.0
    floor = max(_abs_floor(ref_dtype), RELATIVE_FLOOR_FRACTION * max_abs_ref)
    with np.errstate(over="ignore", invalid="ignore"):
        abs_diff = np.subtract(o, r)
        np.abs(abs_diff, out=abs_diff)
        d = np.maximum(abs_r, floor)  # reuse one buffer: denominator, then d
        np.divide(abs_diff, d, out=d)
    stats: dict[str, Any] = {"max_abs_diff": None, "mean_abs_diff": None, "max_rel_diff": None,
                             "mean_rel_diff": None, "cosine_similarity": None}
    overflow = False
    if num_special_mismatch == 0:
        # with non-finite mismatches these are not computable: left None
        if d.size:
            vals = (float(abs_diff.max()), float(abs_diff.mean(dtype=np.float64)),
                    float(d.max()), float(d.mean(dtype=np.float64)))
        else:
            vals = (0.0, 0.0, 0.0, 0.0)
        overflow = not all(math.isfinite(x) for x in vals)
        stats = {"max_abs_diff": _finite_or_none(vals[0]), "mean_abs_diff": _finite_or_none(vals[1]),
                 "max_rel_diff": _finite_or_none(vals[2]), "mean_rel_diff": _finite_or_none(vals[3]),
                 "cosine_similarity": _cosine_similarity(o, r)}
    return {
        "nan_mismatch": nan_mismatch,
        "inf_mismatch": inf_mismatch,
        "num_nonfinite_mismatches": num_special_mismatch,
        "num_nonfinite_equal": num_special_equal,
        "nonfinite_examples": examples,
        **stats,
        "ref_max_abs": max_abs_ref,
        "floor": floor,
        "rel_diff_counts_over": _counts_over(d, REL_DIFF_THRESHOLDS, extra=num_special_mismatch),
        "metric_overflow": overflow,
        "inconclusive_reason": _float_inconclusive(n, num_finite_ref, max_abs_ref, ref_dtype, _constant_value(r)),
    }


def _int_abs_diff(o: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Exact ``|o - r|`` of two integer arrays as uint64 (any int64/uint64 pair)."""
    o_unsigned = _is_unsigned(o.dtype)
    r_unsigned = _is_unsigned(r.dtype)
    o_big = np.dtype(o.dtype).itemsize == 8 and o_unsigned
    r_big = np.dtype(r.dtype).itemsize == 8 and r_unsigned
    if o_big or r_big:
        if o_unsigned and r_unsigned:
            ou = o.astype(np.uint64)
            ru = r.astype(np.uint64)
            return np.where(ou >= ru, ou - ru, ru - ou)
        # uint64 against a signed type (only with a dtype mismatch): split on sign.
        u, s = (o, r) if o_big else (r, o)
        u = u.astype(np.uint64)
        s = s.astype(np.int64)
        neg = s < 0
        s_abs = np.where(neg, (-(s + 1)).astype(np.uint64) + np.uint64(1), s.astype(np.uint64))
        with np.errstate(over="ignore"):
            # for s < 0: u + |s| can exceed 2**64 - 1 only for absurd values; saturate
            summed = u + s_abs
            summed = np.where(summed < u, np.uint64(np.iinfo(np.uint64).max), summed)
        pos_diff = np.where(u >= s_abs, u - s_abs, s_abs - u)
        return np.where(neg, summed, pos_diff)
    oi = o.astype(np.int64)
    ri = r.astype(np.int64)
    # int64 subtraction can wrap; the wrapped difference viewed as uint64 is exact
    ou = oi.view(np.uint64)
    ru = ri.view(np.uint64)
    return np.where(oi >= ri, ou - ru, ru - ou)


def _compare_int(o_raw: np.ndarray, r_raw: np.ndarray) -> dict:
    r = np.asarray(r_raw).reshape(-1)
    o = np.asarray(o_raw).reshape(-1)
    if _kind_of(r.dtype) == "int" and np.dtype(r.dtype).kind == "V":
        r = r.astype(np.int64)  # ml_dtypes int4 / uint4 ...
    nan_mismatch = False
    inf_mismatch = False
    num_special = 0
    examples: list[dict] = []
    o_kind = _kind_of(o.dtype)
    if o_kind == "float":
        # dtype mismatch: a float output against an integer reference
        of = o.astype(np.float64)
        finite = np.isfinite(of)
        nan_mismatch = bool(np.isnan(of).any())
        inf_mismatch = bool(np.isinf(of).any())
        num_special = int((~finite).sum())
        with np.errstate(over="ignore", invalid="ignore"):
            diff = np.abs(of[finite] - r[finite].astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        mean_abs = float(diff.mean()) if diff.size else 0.0
        max_abs_out: float | int | None = _finite_or_none(max_abs)
        if num_special:  # not computable with non-finite values
            examples = _nonfinite_examples(~finite, o_raw, r_raw)
            max_abs_out, mean_abs = None, math.nan
    else:
        if o_kind == "bool" or np.dtype(o.dtype).kind == "V":
            o = o.astype(np.int64)
        diff = _int_abs_diff(o, r)
        max_abs_out = int(diff.max()) if diff.size else 0
        mean_abs = float(diff.mean(dtype=np.float64)) if diff.size else 0.0
    return {
        "nan_mismatch": nan_mismatch,
        "inf_mismatch": inf_mismatch,
        "num_nonfinite_mismatches": num_special,
        "nonfinite_examples": examples,
        "max_abs_diff": max_abs_out,
        "mean_abs_diff": _finite_or_none(mean_abs),
        "max_rel_diff": None,
        "mean_rel_diff": None,
        "num_mismatches": int(np.count_nonzero(diff)) + num_special,
        "abs_diff_counts_over": _counts_over(
            diff.astype(np.float64), ABS_DIFF_THRESHOLDS, extra=num_special
        ),
        "inconclusive_reason": (None if not r.size or np.any(r) else "reference is all zero"),
    }


def _compare_string(o_raw: np.ndarray, r_raw: np.ndarray) -> dict:
    """Exact comparison of string tensors (ONNX ``tensor(string)``: StringNormalizer,
    RegexFullMatch, ...): the number of elements that differ."""
    def text(a):
        a = np.asarray(a).reshape(-1)
        return np.array([x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in a.tolist()],
                        dtype=object)

    o, r = text(o_raw), text(r_raw)
    n = int(r.size)
    return _exact_result(int(np.count_nonzero(o != r)), n,
                         None if not n or any(r) else "reference is all empty strings")


def _exact_result(mismatches: int, n: int, inconclusive_reason: str | None) -> dict:
    """Metrics of an exact comparison (strings, bools) with ``mismatches`` of ``n``
    elements differing: max_abs_diff 0/1, mean_abs_diff the fraction that differs."""
    return {
        "nan_mismatch": False,
        "inf_mismatch": False,
        "num_nonfinite_mismatches": 0,
        "max_abs_diff": 1 if mismatches else 0,
        "mean_abs_diff": (mismatches / n) if n else 0.0,
        "max_rel_diff": None,
        "mean_rel_diff": None,
        "num_mismatches": mismatches,
        "inconclusive_reason": inconclusive_reason,
    }


def _compare_bool(o_raw: np.ndarray, r_raw: np.ndarray) -> dict:
    r = np.asarray(r_raw).reshape(-1).astype(bool)
    o = np.asarray(o_raw).reshape(-1)
    if o.dtype != np.bool_:
        if _kind_of(o.dtype) == "float":
            o = o.astype(np.float64)
        o = o != 0  # NaN counts as True
    n = int(r.size)
    return _exact_result(int(np.count_nonzero(o != r)), n, None if not n or r.any() else "reference is all False")
