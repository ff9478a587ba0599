"""Numerical comparison of a backend's layer outputs with the reference outputs.

This module is a pure numerics library (numpy and ml_dtypes only, no ONNX, no
command line). It has three public entry points:

* :func:`compare_outputs` compares the outputs of one (layer, executor) run with
  the reference (ONNX Runtime) outputs and returns a JSON-safe *metrics* dict.
  The metrics hold everything needed to decide the verdict for **any**
  tolerance later, without the arrays.
* :func:`derive_status` turns a metrics dict and a tolerance into the verdict
  ``"success"`` or ``"difference"`` plus a one-line summary.
* :func:`count_over_tolerance` re-derives how many elements exceed a tolerance
  from the stored per-output histograms.

The metric is documented for users in ``docs/comparison.md``. In short (the
rule replaces the original tool's strict symmetric relative check, see
``notes/reference_tool.md`` section 2 and its bugs in section 10):

Float outputs (float16, bfloat16, float32, float64; computed in float64)
    ``d_i = |o_i - r_i| / max(|r_i|, F)`` with the floor
    ``F = max(ABS_FLOOR[reference dtype], 1e-3 * max_j |r_j|)``.
    Verdict success iff ``max_i d_i <= fp_max_tol`` and
    ``mean_i d_i <= fp_avg_tol`` (defaults from seed 002 section 4 /
    ``notes/reference_tool.md`` section 1: both 0.01).
Integer outputs
    ``max |o_i - r_i|`` in exact integer arithmetic; success iff it is
    ``<= int_atol`` (default 1 for 8/16-bit types, the original tool's integer
    rule ``|diff| <= 1``, ``notes/reference_tool.md`` section 2; 0 for 32/64-bit).
Bool outputs
    exact match.

Structural problems (a missing output, a different output count, shape or
dtype, NaN at different positions, unequal infinities) always give
``"difference"``.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Mapping

import ml_dtypes
import numpy as np

__all__ = [
    "DEFAULT_TOLERANCE",
    "ABS_FLOOR",
    "RELATIVE_FLOOR_FRACTION",
    "REL_DIFF_THRESHOLDS",
    "ABS_DIFF_THRESHOLDS",
    "compare_outputs",
    "derive_status",
    "status_details",
    "count_over_tolerance",
    "default_int_atol",
    "normalize_tolerance",
    "float_tolerance_keys",
    "dequantized_outputs",
    "to_quantized_levels",
    "arrays_as_levels",
    "dequantized_outputs_of_file",
]

DEFAULT_TOLERANCE: dict[str, float] = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01,
                                       "bf16_avg_tol": 0.01, "bf16_max_tol": 0.05}
"""Seed defaults (seed 002 section 4, ``default_tolerance`` of the report) for
float outputs, and the bounds used instead for outputs whose reference is
bfloat16 (``--auto-convert-bf16``): bf16 keeps 8 significant bits, so one unit in
the last place is 2**-8 to 2**-7 (0.4 % to 0.8 %) of a value, and an executor
that accumulates in another order or rounds once more differs by one or two such
units (docs/comparison.md, "bf16 outputs")."""

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

_TOLERANCE_KEYS = ("fp_avg_tol", "fp_max_tol", "bf16_avg_tol", "bf16_max_tol", "int_atol")
_SUMMARY_MAX_CHARS = 512


# --------------------------------------------------------------------------
# dtype helpers


def _dtype_name(dtype: np.dtype) -> str:
    return str(np.dtype(dtype))


def _kind_of(dtype: np.dtype) -> str:
    """Return "float", "int" or "bool" for a numpy / ml_dtypes dtype.

    Raises:
        TypeError: complex, string, object or other non-numeric dtypes.
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "bool"
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
        ml_dtypes.finfo(dtype)
        return "float"
    except (ValueError, TypeError):
        pass
    try:
        ml_dtypes.iinfo(dtype)
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
    return int(ml_dtypes.iinfo(dtype).min) == 0


def _abs_floor(dtype: np.dtype) -> float:
    name = _dtype_name(dtype)
    if name in ABS_FLOOR:
        return ABS_FLOOR[name]
    return float(ml_dtypes.finfo(dtype).eps)


def default_int_atol(dtype: Any) -> int:
    """Default absolute tolerance for an integer output of ``dtype``.

    1 for 8- and 16-bit (and narrower) integers, which carry quantized data: the
    original tool's integer rule ``|diff| <= 1`` (``notes/reference_tool.md``
    section 2). 0 (exact) for 32- and 64-bit integers (indices, shapes, counts).
    ``dtype`` may be a numpy dtype or its name (as stored in metrics).
    """
    if isinstance(dtype, str):
        dtype = np.dtype(getattr(ml_dtypes, dtype, dtype))
    return 1 if np.dtype(dtype).itemsize <= 2 else 0


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
    """Cosine of the angle between two float64 vectors, computed after scaling
    both by their joint max-abs value (no overflow for huge values).
    None if exactly one of them is all zero; 1.0 if both are all zero."""
    max_o = float(np.max(np.abs(o))) if o.size else 0.0
    max_r = float(np.max(np.abs(r))) if r.size else 0.0
    if max_o == 0.0 and max_r == 0.0:
        return 1.0
    if max_o == 0.0 or max_r == 0.0:
        return None
    scale = max(max_o, max_r)
    os_ = o / scale
    rs = r / scale
    denom = math.sqrt(float(np.dot(os_, os_))) * math.sqrt(float(np.dot(rs, rs)))
    if denom == 0.0:  # only subnormal values left after scaling
        return None
    cos = float(np.dot(os_, rs)) / denom
    return _finite_or_none(min(1.0, max(-1.0, cos)))


def _compare_float(o_raw: np.ndarray, r_raw: np.ndarray, ref_dtype: np.dtype) -> dict:
    o = np.asarray(o_raw, dtype=np.float64).reshape(-1)
    r = np.asarray(r_raw, dtype=np.float64).reshape(-1)
    o_finite = np.isfinite(o)
    r_finite = np.isfinite(r)
    all_finite = bool(o_finite.all()) and bool(r_finite.all())
    nan_mismatch = False
    inf_mismatch = False
    num_special_mismatch = 0
    num_special_equal = 0
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
        valid = o_finite & r_finite
        o = o[valid]
        r = r[valid]

    abs_r = np.abs(r)
    max_abs_ref = float(abs_r.max()) if r.size else 0.0
    floor = max(_abs_floor(ref_dtype), RELATIVE_FLOOR_FRACTION * max_abs_ref)
    with np.errstate(over="ignore", invalid="ignore"):
        abs_diff = np.subtract(o, r)
        np.abs(abs_diff, out=abs_diff)
        d = np.maximum(abs_r, floor)  # reuse one buffer: denominator, then d
        np.divide(abs_diff, d, out=d)
    if d.size:
        max_abs = float(abs_diff.max())
        mean_abs = float(abs_diff.mean(dtype=np.float64))
        max_rel = float(d.max())
        mean_rel = float(d.mean(dtype=np.float64))
    else:
        max_abs = mean_abs = max_rel = mean_rel = 0.0
    overflow = not all(math.isfinite(x) for x in (max_abs, mean_abs, max_rel, mean_rel))
    return {
        "nan_mismatch": nan_mismatch,
        "inf_mismatch": inf_mismatch,
        "num_nonfinite_mismatches": num_special_mismatch,
        "num_nonfinite_equal": num_special_equal,
        "max_abs_diff": _finite_or_none(max_abs),
        "mean_abs_diff": _finite_or_none(mean_abs),
        "max_rel_diff": _finite_or_none(max_rel),
        "mean_rel_diff": _finite_or_none(mean_rel),
        "cosine_similarity": _cosine_similarity(o, r),
        "floor": floor,
        "rel_diff_counts_over": _counts_over(d, REL_DIFF_THRESHOLDS, extra=num_special_mismatch),
        "metric_overflow": overflow,
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
        "max_abs_diff": max_abs_out,
        "mean_abs_diff": _finite_or_none(mean_abs),
        "max_rel_diff": None,
        "mean_rel_diff": None,
        "num_mismatches": int(np.count_nonzero(diff)) + num_special,
        "abs_diff_counts_over": _counts_over(
            diff.astype(np.float64), ABS_DIFF_THRESHOLDS, extra=num_special
        ),
    }


def _compare_bool(o_raw: np.ndarray, r_raw: np.ndarray) -> dict:
    r = np.asarray(r_raw).reshape(-1).astype(bool)
    o = np.asarray(o_raw).reshape(-1)
    if o.dtype != np.bool_:
        if _kind_of(o.dtype) == "float":
            o = o.astype(np.float64)
        o = o != 0  # NaN counts as True
    mismatches = int(np.count_nonzero(o != r))
    n = int(r.size)
    return {
        "nan_mismatch": False,
        "inf_mismatch": False,
        "num_nonfinite_mismatches": 0,
        "max_abs_diff": 1 if mismatches else 0,
        "mean_abs_diff": (mismatches / n) if n else 0.0,
        "max_rel_diff": None,
        "mean_rel_diff": None,
        "num_mismatches": mismatches,
    }


# --------------------------------------------------------------------------
# public API


def compare_outputs(
    actual: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    output_names: list[str],
) -> dict:
    """Compare one executor's outputs of a layer with the reference outputs.

    Args:
        actual: output name -> array produced by the executor under test.
            Any numeric numpy dtype; bfloat16 arrays are ``ml_dtypes.bfloat16``.
        reference: output name -> reference array (ONNX Runtime), same
            conventions. Must hold every name of ``output_names``.
        output_names: the layer's output names in model order; the metrics list
            the outputs in this order.

    Returns:
        A JSON-safe dict (no NaN/inf floats; numbers are Python ints/floats):

        * ``"outputs"``: one dict per name with ``name``, ``kind``
          (``"float"|"int"|"bool"``, from the reference dtype), ``dtype``,
          ``shape``, ``ref_dtype``, ``ref_shape``, ``num_elements`` (reference
          element count), the flags ``missing_output``, ``shape_mismatch``,
          ``dtype_mismatch``, ``nan_mismatch``, ``inf_mismatch``, and when values
          were compared: ``max_abs_diff``, ``mean_abs_diff`` (units of the
          output), ``max_rel_diff``/``mean_rel_diff`` (max/mean of the
          normalized error ``d``, dimensionless, float outputs only),
          ``cosine_similarity`` (float only), ``floor`` (``F`` of the rule),
          ``rel_diff_counts_over`` (float: counts of ``d > t`` for
          ``t`` in ``rel_diff_thresholds``), ``abs_diff_counts_over`` and
          ``num_mismatches`` (int), ``num_mismatches`` (bool).
        * top level: ``max_abs_diff``, ``mean_abs_diff``, ``max_rel_diff``,
          ``mean_rel_diff`` (max over outputs), ``cosine_similarity`` (min over
          float outputs), the flags ``nan_mismatch``, ``inf_mismatch``,
          ``shape_mismatch``, ``dtype_mismatch``, ``missing_output``,
          ``output_count_mismatch``, ``metric_overflow`` (any output),
          ``num_elements`` (sum), ``num_outputs``, ``num_actual_outputs``,
          ``missing_outputs``, ``extra_outputs`` and the two threshold grids.

        A value that would be NaN/inf (float64 overflow of a difference) is
        stored as None with ``metric_overflow: True``.

    The rule (``docs/comparison.md``): ``d_i = |o_i - r_i| / max(|r_i|, F)``,
    ``F = max(ABS_FLOOR[ref dtype], 1e-3 * max_j |r_j|)``, all in float64;
    NaN in both at the same position is equal and excluded from ``d``, as are
    equal infinities; NaN or inf anywhere else sets ``nan_mismatch`` /
    ``inf_mismatch`` and counts as over every threshold. Integer differences
    are exact (``|o - r|`` as uint64). Vectorized: a few passes over the data,
    no Python loop over elements.

    Raises:
        ValueError: ``output_names`` is empty or ``reference`` lacks one of them.
        TypeError: an output has a non-numeric dtype (string, object, complex).
    """
    names = list(output_names)
    if not names:
        raise ValueError("compare_outputs: output_names is empty")
    missing_ref = [n for n in names if n not in reference]
    if missing_ref:
        raise ValueError(f"compare_outputs: reference has no output named {missing_ref!r}")

    outputs: list[dict] = []
    for name in names:
        r = np.asarray(reference[name])
        kind = _kind_of(r.dtype)
        entry: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "dtype": None,
            "shape": None,
            "ref_dtype": _dtype_name(r.dtype),
            "ref_shape": [int(s) for s in r.shape],
            "num_elements": int(r.size),
            "missing_output": False,
            "shape_mismatch": False,
            "dtype_mismatch": False,
            "nan_mismatch": False,
            "inf_mismatch": False,
        }
        if name not in actual:
            entry["missing_output"] = True
            outputs.append(entry)
            continue
        o = np.asarray(actual[name])
        _kind_of(o.dtype)  # raises on non-numeric actual outputs
        entry["dtype"] = _dtype_name(o.dtype)
        entry["shape"] = [int(s) for s in o.shape]
        entry["dtype_mismatch"] = o.dtype != r.dtype
        if tuple(o.shape) != tuple(r.shape):
            entry["shape_mismatch"] = True
            outputs.append(entry)
            continue
        if kind == "float":
            entry.update(_compare_float(o, r, r.dtype))
        elif kind == "int":
            entry.update(_compare_int(o, r))
        else:
            entry.update(_compare_bool(o, r))
        outputs.append(entry)

    name_set = set(names)
    extra = sorted(str(n) for n in actual if n not in name_set)
    float_outs = [e for e in outputs if e["kind"] == "float"]
    return {
        "outputs": outputs,
        "num_outputs": len(names),
        "num_actual_outputs": len(actual),
        "missing_outputs": [e["name"] for e in outputs if e["missing_output"]],
        "extra_outputs": extra,
        "max_abs_diff": _max_or_none(e.get("max_abs_diff") for e in outputs),
        "mean_abs_diff": _max_or_none(e.get("mean_abs_diff") for e in outputs),
        "max_rel_diff": _max_or_none(e.get("max_rel_diff") for e in float_outs),
        "mean_rel_diff": _max_or_none(e.get("mean_rel_diff") for e in float_outs),
        "cosine_similarity": _min_or_none(e.get("cosine_similarity") for e in float_outs),
        "nan_mismatch": any(e["nan_mismatch"] for e in outputs),
        "inf_mismatch": any(e["inf_mismatch"] for e in outputs),
        "shape_mismatch": any(e["shape_mismatch"] for e in outputs),
        "dtype_mismatch": any(e["dtype_mismatch"] for e in outputs),
        "missing_output": any(e["missing_output"] for e in outputs),
        "output_count_mismatch": len(actual) != len(names),
        "metric_overflow": any(e.get("metric_overflow", False) for e in outputs),
        "num_elements": sum(e["num_elements"] for e in outputs),
        "rel_diff_thresholds": list(REL_DIFF_THRESHOLDS),
        "abs_diff_thresholds": list(ABS_DIFF_THRESHOLDS),
    }


def normalize_tolerance(tolerance: Mapping[str, Any] | None) -> dict:
    """Return a validated tolerance dict with the seed defaults filled in.

    ``fp_avg_tol`` and ``fp_max_tol`` are dimensionless bounds on the mean and
    max normalized error ``d`` of float outputs, ``bf16_avg_tol`` and
    ``bf16_max_tol`` the same for outputs whose reference is bfloat16; the optional ``int_atol`` (integer, units of the
    output) overrides the per-dtype integer default (:func:`default_int_atol`).

    Raises:
        ValueError: unknown keys, or a value that is not a finite number >= 0
            (``int_atol`` must be a whole number).
    """
    if tolerance is None:
        return dict(DEFAULT_TOLERANCE)
    if not isinstance(tolerance, Mapping):
        raise ValueError(f"tolerance must be a mapping, got {type(tolerance).__name__}")
    unknown = sorted(set(tolerance) - set(_TOLERANCE_KEYS))
    if unknown:
        raise ValueError(f"unknown tolerance key(s) {unknown}; expected {list(_TOLERANCE_KEYS)}")
    out = dict(DEFAULT_TOLERANCE)
    for key, value in tolerance.items():
        if value is None and key == "int_atol":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ValueError(f"tolerance {key} must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"tolerance {key} must be a finite number >= 0, got {value!r}")
        if key == "int_atol":
            if value != int(value):
                raise ValueError(f"tolerance int_atol must be a whole number, got {value!r}")
            out[key] = int(value)
        else:
            out[key] = value
    return out


def _grid_index(thresholds, t: float) -> int:
    """Index of the largest threshold <= t (the grid starts at 0, t >= 0)."""
    return max(0, bisect.bisect_right(list(thresholds), t) - 1)


def _output_over(out: Mapping, metrics: Mapping, tol: Mapping) -> tuple[int, int, bool] | None:
    """(count over tolerance, compared elements, exact) for one output, or None
    when the output has no element-wise data (missing / shape mismatch)."""
    if out.get("missing_output") or out.get("shape_mismatch"):
        return None
    n = int(out.get("num_elements") or 0)
    kind = out.get("kind")
    if kind == "float":
        grid = metrics.get("rel_diff_thresholds") or REL_DIFF_THRESHOLDS
        counts = out.get("rel_diff_counts_over")
        t = float(tol[float_tolerance_keys(out)[1]])
    elif kind == "int":
        grid = metrics.get("abs_diff_thresholds") or ABS_DIFF_THRESHOLDS
        counts = out.get("abs_diff_counts_over")
        t = _int_atol_for(out, tol)
    else:
        return int(out.get("num_mismatches") or 0), n, True
    if not counts:
        return None
    i = _grid_index(grid, t)
    return int(counts[i]), n, float(grid[i]) == float(t)


def float_tolerance_keys(out: Mapping) -> tuple[str, str]:
    """The (avg, max) tolerance keys that apply to one float output's metrics:
    ``bf16_avg_tol``/``bf16_max_tol`` when its reference dtype is bfloat16, else
    ``fp_avg_tol``/``fp_max_tol`` (docs/comparison.md)."""
    if out.get("ref_dtype") == "bfloat16":
        return "bf16_avg_tol", "bf16_max_tol"
    return "fp_avg_tol", "fp_max_tol"


def _int_atol_for(out: Mapping, tol: Mapping) -> int:
    if tol.get("int_atol") is not None:
        return int(tol["int_atol"])
    return default_int_atol(out.get("ref_dtype") or "int64")


def count_over_tolerance(metrics: Mapping, tolerance: Mapping | None) -> tuple[int, float]:
    """Number and share of elements over the tolerance, from stored metrics only.

    Float outputs count elements with ``d > fp_max_tol``, integer outputs
    elements with ``|diff| > int_atol`` (default per dtype), bool outputs the
    mismatches. The counts come from the per-output histograms stored by
    :func:`compare_outputs` (``rel_diff_counts_over`` on the grid
    ``REL_DIFF_THRESHOLDS``, ``abs_diff_counts_over`` on
    ``ABS_DIFF_THRESHOLDS``). The count is exact when the tolerance is a grid
    point; otherwise the nearest grid point *below* the tolerance is used, so
    the count is conservative (never smaller than the true count).

    Returns:
        ``(count, share)``: ``count`` summed over outputs with element-wise data;
        ``share = count / num_elements`` of those outputs, in [0, 1] (0.0 when
        there are none).

    Raises:
        ValueError: the tolerance is invalid (:func:`normalize_tolerance`) or
            ``metrics`` is not a metrics dict.
    """
    count, n, _ = _count_over(metrics, normalize_tolerance(tolerance))
    return count, (count / n if n else 0.0)


def _count_over(metrics: Mapping, tol: Mapping) -> tuple[int, int, bool]:
    if not isinstance(metrics, Mapping) or not isinstance(metrics.get("outputs"), list):
        raise ValueError("metrics must be a dict returned by compare_outputs (with an 'outputs' list)")
    count = n = 0
    exact = True
    for out in metrics["outputs"]:
        r = _output_over(out, metrics, tol)
        if r is None:
            continue
        count += r[0]
        n += r[1]
        exact = exact and r[2]
    return count, n, exact


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1e}"


def _shape_str(shape) -> str:
    return "x".join(str(s) for s in shape) if shape else "scalar"


def _output_problem(out: Mapping, metrics: Mapping, tol: Mapping) -> str | None:
    """One-line reason why an output fails, or None when it is within tolerance."""
    if out.get("missing_output"):
        return "output missing from the executor's results"
    if out.get("shape_mismatch"):
        return f"shape {_shape_str(out.get('shape'))} differs from reference {_shape_str(out.get('ref_shape'))}"
    parts: list[str] = []
    if out.get("nan_mismatch"):
        parts.append("NaN at positions where the reference has none (or the reverse)")
    if out.get("inf_mismatch"):
        parts.append("infinite values that differ from the reference")
    if out.get("dtype_mismatch"):
        parts.append(f"dtype {out.get('dtype')} differs from reference {out.get('ref_dtype')}")
    kind = out.get("kind")
    over = _output_over(out, metrics, tol)
    n = int(out.get("num_elements") or 0)

    def over_text() -> str:
        if over is None:
            return ""
        cnt, _, exact = over
        pct = 100.0 * cnt / n if n else 0.0
        prefix = "" if exact else "at most "
        return f" ({prefix}{cnt} of {n} elements over tolerance, {pct:.2f}%)"

    if kind == "float":
        max_rel, mean_rel = out.get("max_rel_diff"), out.get("mean_rel_diff")
        avg_key, max_key = float_tolerance_keys(out)
        if max_rel is None or mean_rel is None:
            if n and not (out.get("nan_mismatch") or out.get("inf_mismatch")):
                parts.append("relative difference overflowed float64")
        elif max_rel > tol[max_key]:
            parts.append(f"max rel diff {_fmt(max_rel)} > {max_key} {_fmt(tol[max_key])}{over_text()}")
        elif mean_rel > tol[avg_key]:
            parts.append(
                f"mean rel diff {_fmt(mean_rel)} > {avg_key} {_fmt(tol[avg_key])}"
                f" (max rel diff {_fmt(max_rel)})"
            )
    elif kind == "int":
        atol = _int_atol_for(out, tol)
        max_abs = out.get("max_abs_diff")
        if max_abs is None:
            if not (out.get("nan_mismatch") or out.get("inf_mismatch")):
                parts.append("absolute difference overflowed float64")
        elif max_abs > atol:
            parts.append(f"max abs diff {max_abs} > int_atol {atol}{over_text()}")
    elif kind == "bool":
        mism = int(out.get("num_mismatches") or 0)
        if mism:
            parts.append(f"{mism} of {n} bool elements differ")
    return "; ".join(parts) if parts else None


def status_details(metrics: Mapping, tolerance: Mapping | None = None) -> list[str]:
    """All reasons for a ``"difference"`` verdict, one line each (empty on success).

    Same rule and inputs as :func:`derive_status`; useful for the longer
    ``failure_report.message``.

    Raises:
        ValueError: as :func:`derive_status`.
    """
    tol = normalize_tolerance(tolerance)
    if not isinstance(metrics, Mapping) or not isinstance(metrics.get("outputs"), list):
        raise ValueError("metrics must be a dict returned by compare_outputs (with an 'outputs' list)")
    lines: list[str] = []
    outs = metrics["outputs"]
    n_expected = metrics.get("num_outputs", len(outs))
    n_actual = metrics.get("num_actual_outputs", n_expected)
    if metrics.get("output_count_mismatch") or n_actual != n_expected:
        extra = metrics.get("extra_outputs") or []
        extra_txt = f" (unexpected: {', '.join(extra)})" if extra else ""
        lines.append(f"executor produced {n_actual} outputs, reference has {n_expected}{extra_txt}")
    for out in outs:
        problem = _output_problem(out, metrics, tol)
        if problem is not None:
            lines.append(f"output '{out.get('name')}': {problem}" if len(outs) > 1 else problem)
    return lines


def derive_status(metrics: Mapping, tolerance: Mapping | None = None) -> tuple[str, str]:
    """Verdict for one (layer, executor) run from its stored metrics.

    Uses only ``metrics`` (from :func:`compare_outputs`, possibly read back from
    JSON) and ``tolerance`` (``None`` -> :data:`DEFAULT_TOLERANCE`), so editing a
    tolerance re-derives verdicts without recompiling or rerunning anything.

    Rule (``docs/comparison.md``): ``"success"`` iff the output count matches,
    no output is missing or has a different shape or dtype, NaN/inf agree, and
    for every float output ``max_rel_diff <= fp_max_tol`` and
    ``mean_rel_diff <= fp_avg_tol`` (``bf16_max_tol``/``bf16_avg_tol`` for a
    bfloat16 reference); for every integer output
    ``max_abs_diff <= int_atol`` (default 1 for 8/16-bit, 0 for 32/64-bit);
    every bool output matches exactly. Otherwise ``"difference"``.

    Returns:
        ``(status, summary)``: status ``"success"`` or ``"difference"``; summary
        is one line of at most 512 characters, e.g.
        ``"max rel diff 3.2e-02 > fp_max_tol 1.0e-02 (1234 of 50176 elements
        over tolerance, 2.46%)"`` or ``"all 50176 elements within tolerance
        (max rel diff 1.2e-07)"``.

    Raises:
        ValueError: ``metrics`` is not a metrics dict, or the tolerance is
            invalid (:func:`normalize_tolerance`).
    """
    lines = status_details(metrics, tolerance)
    if lines:
        summary = lines[0]
        if len(lines) > 1:
            summary += f" (+{len(lines) - 1} more problem{'s' if len(lines) > 2 else ''})"
        return "difference", _cut(summary)
    outs = metrics["outputs"]
    n = sum(int(o.get("num_elements") or 0) for o in outs)
    details = []
    if any(o.get("kind") == "float" for o in outs):
        details.append(f"max rel diff {_fmt(metrics.get('max_rel_diff'))}")
    non_float = [o.get("max_abs_diff") for o in outs if o.get("kind") != "float"]
    if non_float:
        details.append(f"max abs diff {_max_or_none(non_float)}")
    return "success", _cut(f"all {n} elements within tolerance ({', '.join(details)})")


def _cut(text: str) -> str:
    return text if len(text) <= _SUMMARY_MAX_CHARS else text[: _SUMMARY_MAX_CHARS - 3] + "..."


def dequantized_outputs(model) -> dict[str, dict]:
    """Graph outputs of ``model`` (an ``onnx.ModelProto``) that a DequantizeLinear
    node writes with a constant per-tensor scale and zero point (a quantized
    layer's float outputs, ``--quantize``): ``{name: {"scale": float,
    "zero_point": int, "dtype": "int8"|"uint8"|...}}``.

    Such an output holds only the values ``(q - zero_point) * scale`` of the
    integer levels ``q``; :func:`to_quantized_levels` maps it back to ``q``.
    """
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    consts = {}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    producers = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for o in model.graph.output:
        n = producers.get(o.name)
        if n is None or n.op_type != "DequantizeLinear" or len(n.input) < 3:
            continue
        s_t = inits.get(n.input[1]) or consts.get(n.input[1])
        z_t = inits.get(n.input[2]) or consts.get(n.input[2])
        if s_t is None or z_t is None:
            continue
        scale, zp = numpy_helper.to_array(s_t), numpy_helper.to_array(z_t)
        if scale.size != 1 or zp.size != 1 or not np.issubdtype(zp.dtype, np.integer):
            continue
        out[o.name] = {"scale": float(scale.reshape(())), "zero_point": int(zp.reshape(())), "dtype": zp.dtype.name}
    return out


def dequantized_outputs_of_file(model_path: str) -> dict[str, dict]:
    """:func:`dequantized_outputs` of the ONNX model file ``model_path`` ({} when
    it cannot be read: such a model fails elsewhere, with its own stage)."""
    import onnx

    try:
        return dequantized_outputs(onnx.load(model_path, load_external_data=False))
    except Exception:
        return {}


def arrays_as_levels(arrays: Mapping[str, np.ndarray], levels: Mapping[str, dict]) -> dict[str, np.ndarray]:
    """``arrays`` (name -> array) with the outputs named in ``levels`` (see
    :func:`dequantized_outputs`) mapped to their integer levels; others as they are."""
    return {n: (to_quantized_levels(a, **levels[n]) if n in levels else a) for n, a in arrays.items()}


def to_quantized_levels(values: np.ndarray, scale: float, zero_point: int, dtype: str) -> np.ndarray:
    """The integer levels ``q = clip(rint(x / scale) + zero_point)`` of dequantized
    values ``x`` (ONNX QuantizeLinear: round half to even, saturate to ``dtype``),
    computed in float64. Exact for values that are ``(q - zero_point) * scale``."""
    info = np.iinfo(np.dtype(dtype))
    x = np.asarray(values, dtype=np.float64)
    q = np.rint(x / float(scale)) + int(zero_point)
    q = np.where(np.isfinite(q), q, 0)
    return np.clip(q, info.min, info.max).astype(np.dtype(dtype))


def compare_on_model(model, actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                     output_names: list[str]) -> dict:
    """:func:`compare_outputs` for the outputs of the ONNX model ``model`` (a layer):
    outputs a DequantizeLinear writes are compared as their integer levels
    (:func:`dequantized_outputs`; ``metrics["quantized_levels"]`` records them).

    Returns:
        The metrics dict (see :func:`compare_outputs`).

    Raises:
        ValueError, TypeError: as :func:`compare_outputs`.
    """
    levels = dequantized_outputs(model)
    if levels:
        actual, reference = arrays_as_levels(actual, levels), arrays_as_levels(reference, levels)
    metrics = compare_outputs(actual, reference, output_names)
    if levels:
        metrics["quantized_levels"] = levels
    return metrics
