"""Numerical comparison of a backend's layer outputs with the reference outputs.

This module is a numerics library (numpy and ml_dtypes; ONNX only, imported
lazily, in the helpers that read a model: :func:`dequantized_outputs`,
:func:`quantized_data_outputs`; no command line). Its main entry points:

* :func:`compare_outputs` compares the outputs of one (layer, executor) run with
  the reference (ONNX Runtime) outputs and returns a JSON-safe *metrics* dict.
  The metrics hold everything needed to decide the verdict for **any**
  tolerance later, without the arrays.
* :func:`derive_status` turns a metrics dict and a tolerance into the verdict
  ``"success"`` or ``"difference"`` plus a one-line summary.
* :func:`count_over_tolerance` re-derives how many elements exceed a tolerance
  from the stored per-output histograms.
* :func:`inconclusive_reason` says, from the metrics, why a comparison cannot
  fail (a reference below the dtype's absolute floor, all zero, no elements).

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
    ``<= int_atol``: by default 0 (exact) for every integer dtype, 1 (one
    quantization step) only for outputs that carry quantized data
    (``quantized_outputs`` of :func:`compare_outputs`, see
    :func:`quantized_data_outputs`).
Bool outputs
    exact match.

Structural problems (a missing output, a different output count, shape or
dtype, NaN or inf where the other side has another value) always give
``"difference"``. With ``min_cosine`` (the full-model and partition checks:
:data:`FULL_MODEL_MIN_COSINE`) every float output whose reference is not all
zero must also have a cosine similarity of at least ``min_cosine``. A
comparison whose reference is too small to tell a wrong output from a right
one (below the dtype's absolute floor, all zero, no elements) is flagged
``inconclusive`` (:func:`inconclusive_reason`); its verdict stays ``success``
or ``difference``, but a success summary says so.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np

from .limits import SUMMARY_CHARS as _SUMMARY_MAX_CHARS

__all__ = [
    "DEFAULT_TOLERANCE",
    "FULL_MODEL_MIN_COSINE",
    "ABS_FLOOR",
    "RELATIVE_FLOOR_FRACTION",
    "REL_DIFF_THRESHOLDS",
    "ABS_DIFF_THRESHOLDS",
    "compare_outputs",
    "derive_status",
    "status_details",
    "count_over_tolerance",
    "default_int_atol",
    "inconclusive_reason",
    "normalize_tolerance",
    "float_tolerance_keys",
    "dequantized_outputs",
    "to_quantized_levels",
    "arrays_as_levels",
    "dequantized_outputs_of_file",
    "quantized_data_outputs",
    "quantized_data_outputs_of_file",
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

FULL_MODEL_MIN_COSINE = 0.99
"""Smallest cosine similarity between an executor's float output and the
reference that the full-model comparison of ``run`` and its per-partition checks
accept (``min_cosine`` of :func:`compare_outputs`; the per-layer tests set none).
0.99 is an angle of 8.1 degrees, an error vector of about 14 % of the
reference's norm (``|o - r| / |r| ~ sqrt(2 (1 - cos))``). Measured on whole
models (``benchmarks/bench_cosine.py``), ``1 - cos`` is at most 8e-13 for fp32
runs, 7e-5 for bf16 activations, 1.7e-4 for an int8 executor against its
reference and 3.1e-3 for the int8 quantization error itself, while a sign flip
gives 2, a permuted output 0.6 or more, and an all-zero output has no cosine.
Details: docs/comparison.md, "Cosine similarity"."""

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
_NONFINITE_EXAMPLES = 3


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


def default_int_atol(dtype: Any = None, quantized: bool = False) -> int:
    """Default absolute tolerance (in units of the output, i.e. integer steps) of
    an integer output.

    Args:
        dtype: the output's integer dtype (numpy / ml_dtypes dtype or its name, as
            stored in metrics). The default no longer depends on it; it is kept
            so that callers passing it keep working.
        quantized: the output carries quantized data (the levels of a
            DequantizeLinear output, or an output written by QuantizeLinear,
            QLinear* or an op that only moves such values; see
            :func:`quantized_data_outputs`).

    Returns:
        1 (one quantization step: rounding ``x / scale`` half to even can land on
        the neighbouring level when the executor accumulates in another order)
        for quantized data, else 0: every other integer (a Cast, indices,
        shapes, counts, integer arithmetic) is exact.
    """
    return 1 if quantized else 0


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
                        ref_dtype: np.dtype) -> str | None:
    """Why a float comparison cannot tell a wrong output from a right one, or None."""
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
    return None


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
        "inconclusive_reason": _float_inconclusive(n, num_finite_ref, max_abs_ref, ref_dtype),
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


# --------------------------------------------------------------------------
# public API


def compare_outputs(
    actual: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    output_names: list[str],
    *,
    min_cosine: float | None = None,
    quantized_outputs: Iterable[str] = (),
    declared_shapes: Mapping[str, Sequence[int | None] | None] | None = None,
) -> dict:
    """Compare one executor's outputs of a layer (or model) with the reference outputs.

    Args:
        actual: output name -> array produced by the executor under test.
            Any numeric numpy dtype; bfloat16 arrays are ``ml_dtypes.bfloat16``.
        reference: output name -> reference array (ONNX Runtime), same
            conventions. Must hold every name of ``output_names``.
        output_names: the layer's output names in model order; the metrics list
            the outputs in this order.
        min_cosine: smallest accepted cosine similarity (dimensionless, in
            [-1, 1]) of every float output whose reference is not all zero, or
            None (not required: the per-layer tests). Stored in the metrics
            (``min_cosine``), so :func:`derive_status` applies it again when it
            re-derives a verdict. The full-model and partition checks pass
            :data:`FULL_MODEL_MIN_COSINE`.
        quantized_outputs: names of the integer outputs that carry quantized
            data (the levels of DequantizeLinear outputs, :func:`arrays_as_levels`,
            and :func:`quantized_data_outputs` of the model): their default
            ``int_atol`` is one step; every other integer output is compared
            exactly. Names that are not in ``output_names`` are ignored.
        declared_shapes: output name -> the shape the model declares for it
            (a list of ints, None for an unknown dimension; None for an unknown
            rank), or None. Stored per output as ``declared_shape`` and named in
            a shape-mismatch summary.

    Returns:
        A JSON-safe dict (no NaN/inf floats; numbers are Python ints/floats):

        * ``"outputs"``: one dict per name with ``name``, ``kind``
          (``"float"|"int"|"bool"|"string"``, from the reference dtype), ``dtype``,
          ``shape``, ``ref_dtype``, ``ref_shape``, ``declared_shape`` (when
          given), ``num_elements`` (reference element count), ``quantized``
          (bool), the flags ``missing_output``, ``shape_mismatch``,
          ``dtype_mismatch``, ``nan_mismatch``, ``inf_mismatch``,
          ``inconclusive_reason`` (str or None), and when values were
          compared: ``max_abs_diff``, ``mean_abs_diff`` (units of the output),
          ``max_rel_diff``/``mean_rel_diff`` (max/mean of the normalized error
          ``d``, dimensionless, float outputs only), ``cosine_similarity``
          (float only), ``ref_max_abs`` (float: largest finite ``|r|``),
          ``floor`` (``F`` of the rule), ``rel_diff_counts_over`` (float:
          counts of ``d > t`` for ``t`` in ``rel_diff_thresholds``),
          ``abs_diff_counts_over`` and ``num_mismatches`` (int),
          ``num_mismatches`` (bool), ``num_nonfinite_mismatches`` and
          ``nonfinite_examples`` (up to 3 ``{"index": flat index (C order),
          "output": str, "reference": str}``, values as ``"nan"``, ``"inf"``,
          ``"-inf"`` or the number). For an output with non-finite mismatches
          ``max_abs_diff``, ``mean_abs_diff``, ``max_rel_diff``,
          ``mean_rel_diff`` and ``cosine_similarity`` are None (not
          computable); the histograms still count those elements.
        * top level: ``max_abs_diff``, ``mean_abs_diff``, ``max_rel_diff``,
          ``mean_rel_diff`` (max over outputs), ``cosine_similarity`` (min over
          float outputs); each None when an output is not computable
          (non-finite mismatches); the flags ``nan_mismatch``,
          ``inf_mismatch``, ``shape_mismatch``, ``dtype_mismatch``,
          ``missing_output``, ``output_count_mismatch``, ``metric_overflow``
          (any output), ``inconclusive`` (any output) with
          ``inconclusive_reasons`` (list of str, each naming its output when
          there are several), ``num_nonfinite_mismatches`` and
          ``num_elements`` (sums), ``num_outputs``, ``num_actual_outputs``,
          ``missing_outputs``, ``extra_outputs``, ``min_cosine`` and the two
          threshold grids.

        A value that would be NaN/inf (float64 overflow of a difference) is
        stored as None with ``metric_overflow: True``.

    The rule (``docs/comparison.md``): ``d_i = |o_i - r_i| / max(|r_i|, F)``,
    ``F = max(ABS_FLOOR[ref dtype], 1e-3 * max_j |r_j|)``, all in float64;
    NaN in both at the same position is equal and excluded from ``d``, as are
    equal infinities; NaN or inf anywhere else sets ``nan_mismatch`` /
    ``inf_mismatch`` and counts as over every threshold. Integer differences
    are exact (``|o - r|`` as uint64). A float output is inconclusive when its
    reference's largest finite magnitude is below ``ABS_FLOOR`` of its dtype
    (an all-zero reference included), an int/bool output when its reference is
    all zero / all False, any output with no elements. Vectorized: a few passes
    over the data, no Python loop over elements.

    Raises:
        ValueError: ``output_names`` is empty, ``reference`` lacks one of them,
            ``min_cosine`` is not a number in [-1, 1], or a declared shape is
            not a list of ints / None.
        TypeError: an output has a non-numeric dtype (string, object, complex).
    """
    names = list(output_names)
    if not names:
        raise ValueError("compare_outputs: output_names is empty")
    missing_ref = [n for n in names if n not in reference]
    if missing_ref:
        raise ValueError(f"compare_outputs: reference has no output named {missing_ref!r}")
    if min_cosine is not None:
        if isinstance(min_cosine, bool) or not isinstance(min_cosine, (int, float, np.integer, np.floating)) \
                or not -1.0 <= float(min_cosine) <= 1.0:
            raise ValueError(f"compare_outputs: min_cosine must be None or a number in [-1, 1], got {min_cosine!r}")
        min_cosine = float(min_cosine)
    quantized = set(quantized_outputs)

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
            "quantized": name in quantized,
            "missing_output": False,
            "shape_mismatch": False,
            "dtype_mismatch": False,
            "nan_mismatch": False,
            "inf_mismatch": False,
            "num_nonfinite_mismatches": 0,
            "inconclusive_reason": None,
        }
        if declared_shapes is not None and name in declared_shapes:
            entry["declared_shape"] = _declared_shape(name, declared_shapes[name])
        if name not in actual:
            entry["missing_output"] = True
            outputs.append(entry)
            continue
        o = np.asarray(actual[name])
        _kind_of(o.dtype)  # raises on non-numeric actual outputs
        entry["dtype"] = _dtype_name(o.dtype)
        entry["shape"] = [int(s) for s in o.shape]
        entry["dtype_mismatch"] = o.dtype != r.dtype and not (kind == "string" and _kind_of(o.dtype) == "string")
        if tuple(o.shape) != tuple(r.shape):
            entry["shape_mismatch"] = True
            outputs.append(entry)
            continue
        if kind == "float":
            entry.update(_compare_float(o, r, r.dtype))
        elif kind == "int":
            entry.update(_compare_int(o, r))
        elif kind == "string":
            entry.update(_compare_string(o, r))
        else:
            entry.update(_compare_bool(o, r))
        if entry["num_elements"] == 0:
            entry["inconclusive_reason"] = "no elements to compare"
        elif (min_cosine is not None and kind == "float" and entry.get("inconclusive_reason")
              and (entry.get("ref_max_abs") or 0) > 0):
            # the values cannot fail, but the cosine requirement still catches a sign,
            # a zero or a scrambled output: say what was checked
            entry["inconclusive_reason"] += f"; only the cosine similarity (>= {min_cosine:g}) was checked"
        outputs.append(entry)

    name_set = set(names)
    extra = sorted(str(n) for n in actual if n not in name_set)
    float_outs = [e for e in outputs if e["kind"] == "float"]
    not_computable = any(e["num_nonfinite_mismatches"] for e in outputs)
    float_not_computable = any(e["num_nonfinite_mismatches"] for e in float_outs)
    reasons = [e["inconclusive_reason"] if len(outputs) == 1 else f"output '{e['name']}': {e['inconclusive_reason']}"
               for e in outputs if e["inconclusive_reason"]]

    def agg(fn, entries, key, none):
        return None if none else fn(e.get(key) for e in entries)

    return {
        "outputs": outputs,
        "num_outputs": len(names),
        "num_actual_outputs": len(actual),
        "missing_outputs": [e["name"] for e in outputs if e["missing_output"]],
        "extra_outputs": extra,
        "max_abs_diff": agg(_max_or_none, outputs, "max_abs_diff", not_computable),
        "mean_abs_diff": agg(_max_or_none, outputs, "mean_abs_diff", not_computable),
        "max_rel_diff": agg(_max_or_none, float_outs, "max_rel_diff", float_not_computable),
        "mean_rel_diff": agg(_max_or_none, float_outs, "mean_rel_diff", float_not_computable),
        "cosine_similarity": agg(_min_or_none, float_outs, "cosine_similarity", float_not_computable),
        "min_cosine": min_cosine,
        "nan_mismatch": any(e["nan_mismatch"] for e in outputs),
        "inf_mismatch": any(e["inf_mismatch"] for e in outputs),
        "num_nonfinite_mismatches": sum(e["num_nonfinite_mismatches"] for e in outputs),
        "shape_mismatch": any(e["shape_mismatch"] for e in outputs),
        "dtype_mismatch": any(e["dtype_mismatch"] for e in outputs),
        "missing_output": any(e["missing_output"] for e in outputs),
        "output_count_mismatch": len(actual) != len(names),
        "metric_overflow": any(e.get("metric_overflow", False) for e in outputs),
        "inconclusive": bool(reasons),
        "inconclusive_reasons": reasons,
        "num_elements": sum(e["num_elements"] for e in outputs),
        "rel_diff_thresholds": list(REL_DIFF_THRESHOLDS),
        "abs_diff_thresholds": list(ABS_DIFF_THRESHOLDS),
    }


def _declared_shape(name: str, shape) -> list | None:
    """A declared shape as stored: list of int / None, or None (unknown rank)."""
    if shape is None:
        return None
    try:
        dims = list(shape)
    except TypeError:
        raise ValueError(f"compare_outputs: declared shape of {name!r} must be a list of ints / None, got {shape!r}")
    out: list[int | None] = []
    for d in dims:
        if d is None:
            out.append(None)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool):
            out.append(int(d))
        else:
            raise ValueError(f"compare_outputs: declared shape of {name!r} must be a list of ints / None, got {shape!r}")
    return out


def inconclusive_reason(metrics: Mapping) -> str | None:
    """Why a comparison cannot tell a wrong output from a right one, or None.

    Reads only ``metrics`` (from :func:`compare_outputs`, possibly read back from
    JSON): the per-output ``inconclusive_reason`` joined with "; " (each naming
    its output when there are several), e.g. ``"reference magnitude 3.1e-09
    below the absolute floor 1.0e-05 of float32"``. Reasons: a float reference
    whose largest finite ``|r|`` is below ``ABS_FLOOR`` of its dtype (an all-zero
    one included) or that has no finite element, an int reference that is all
    zero, a bool one that is all False, an output with no elements. Metrics
    stored before the flag existed give None.

    Raises:
        ValueError: ``metrics`` is not a metrics dict.
    """
    if not isinstance(metrics, Mapping) or not isinstance(metrics.get("outputs"), list):
        raise ValueError("metrics must be a dict returned by compare_outputs (with an 'outputs' list)")
    reasons = metrics.get("inconclusive_reasons")
    if reasons is None:
        outs = metrics["outputs"]
        reasons = [o["inconclusive_reason"] if len(outs) == 1 else f"output '{o.get('name')}': {o['inconclusive_reason']}"
                   for o in outs if o.get("inconclusive_reason")]
    return "; ".join(reasons) if reasons else None


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
    # metrics stored before the flag existed have no "quantized": exact
    return default_int_atol(out.get("ref_dtype"), quantized=bool(out.get("quantized", False)))


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
    return "x".join("?" if s is None else str(s) for s in shape) if shape else "scalar"


def _nonfinite_text(out: Mapping) -> str | None:
    """"2 of 10 elements non-finite where the reference is not, or the reverse
    (e.g. inf vs 1.569 at index 3)", or None (metrics stored before the count
    and examples existed: the caller falls back to the flags)."""
    k = int(out.get("num_nonfinite_mismatches") or 0)
    examples = out.get("nonfinite_examples")
    if not k or examples is None:
        return None
    text = f"{k} of {int(out.get('num_elements') or 0)} elements non-finite where the reference is not, or the reverse"
    if examples:
        e = examples[0]
        text += f" (e.g. {e.get('output')} vs {e.get('reference')} at index {e.get('index')})"
    return text


def _output_problem(out: Mapping, metrics: Mapping, tol: Mapping) -> str | None:
    """One-line reason why an output fails, or None when it is within tolerance."""
    if out.get("missing_output"):
        return "output missing from the executor's results"
    if out.get("shape_mismatch"):
        text = f"shape {_shape_str(out.get('shape'))} differs from reference {_shape_str(out.get('ref_shape'))}"
        if out.get("declared_shape") is not None:
            text += f" (the model declares {_shape_str(out['declared_shape'])})"
        return text
    parts: list[str] = []
    nonfinite = _nonfinite_text(out)
    if nonfinite is not None:
        parts.append(nonfinite)
    else:
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
        nonfinite_count = int(out.get("num_nonfinite_mismatches") or 0)
        if max_rel is None or mean_rel is None:
            if n and not (out.get("nan_mismatch") or out.get("inf_mismatch")):
                parts.append("relative difference overflowed float64")
            elif nonfinite is not None and over is not None and over[0] > nonfinite_count:
                # the finite elements' max is not computable, but the histogram still counts them
                prefix = "" if over[2] else "at most "
                parts.append(f"{prefix}{over[0] - nonfinite_count} finite elements with rel diff > {max_key} "
                             f"{_fmt(tol[max_key])}")
        elif max_rel > tol[max_key]:
            parts.append(f"max rel diff {_fmt(max_rel)} > {max_key} {_fmt(tol[max_key])}{over_text()}")
        elif mean_rel > tol[avg_key]:
            parts.append(
                f"mean rel diff {_fmt(mean_rel)} > {avg_key} {_fmt(tol[avg_key])}"
                f" (max rel diff {_fmt(max_rel)})"
            )
        cosine_problem = _cosine_problem(out, metrics)
        if cosine_problem is not None:
            parts.append(cosine_problem)
    elif kind == "int":
        atol = _int_atol_for(out, tol)
        max_abs = out.get("max_abs_diff")
        if max_abs is None:
            if not (out.get("nan_mismatch") or out.get("inf_mismatch")):
                parts.append("absolute difference overflowed float64")
        elif max_abs > atol:
            parts.append(f"max abs diff {max_abs} > int_atol {atol}{over_text()}")
    elif kind in ("bool", "string"):
        mism = int(out.get("num_mismatches") or 0)
        if mism:
            parts.append(f"{mism} of {n} {kind} elements differ")
    return "; ".join(parts) if parts else None


def _cosine_problem(out: Mapping, metrics: Mapping) -> str | None:
    """The cosine requirement (``metrics["min_cosine"]``) for one float output with
    values compared and no non-finite mismatch (those are reported already)."""
    min_cos = metrics.get("min_cosine")
    if min_cos is None or not out.get("num_elements") or out.get("num_nonfinite_mismatches"):
        return None
    if out.get("ref_max_abs") == 0.0:
        return None  # an all-zero reference: cosine undefined, not required (d and the flag judge it)
    cos = out.get("cosine_similarity")
    if cos is None:
        if out.get("ref_max_abs") is None or out.get("metric_overflow"):
            return None
        return f"output is all zero where the reference is not (cosine similarity undefined, min_cosine {min_cos:g})"
    if cos < min_cos:
        return f"cosine similarity {cos:.6g} < min_cosine {min_cos:g}"
    return None


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
    bfloat16 reference) and, when the metrics hold a ``min_cosine``,
    ``cosine_similarity >= min_cosine`` unless the reference is all zero (an
    all-zero output against a non-zero reference is a difference); for every
    integer output ``max_abs_diff <= int_atol`` (default 0, 1 for an output
    flagged ``quantized``); every bool output matches exactly. Otherwise
    ``"difference"``. An inconclusive comparison (:func:`inconclusive_reason`)
    keeps its status, but a success summary ends with ``"; inconclusive: "``
    and the reason.

    Returns:
        ``(status, summary)``: status ``"success"`` or ``"difference"``; summary
        is one line of at most 512 characters, e.g.
        ``"max rel diff 3.2e-02 > fp_max_tol 1.0e-02 (1234 of 50176 elements
        over tolerance, 2.46%)"``, ``"all 50176 elements within tolerance
        (max rel diff 1.2e-07)"`` or ``"all 10 elements within tolerance (max
        rel diff 1.0e-04); inconclusive: reference magnitude 3.1e-09 below the
        absolute floor 1.0e-05 of float32"``.

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
    if metrics.get("min_cosine") is not None and metrics.get("cosine_similarity") is not None:
        details.append(f"min cosine {metrics['cosine_similarity']:.6f}")
    summary = f"all {n} elements within tolerance ({', '.join(details)})"
    reason = inconclusive_reason(metrics)
    if reason:
        summary += f"; inconclusive: {reason}"
    return "success", _cut(summary)


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


_DEFAULT_DOMAINS = ("", "ai.onnx")
_QUANTIZING_DOMAINS = ("", "ai.onnx", "com.microsoft")

_QUANTIZING_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "QGemm"})
"""Ops whose first output is quantized data (besides every ``QLinear*`` op: QLinearConv,
QLinearMatMul of the default domain; QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool,
QLinearSoftmax, QLinearReduceMean, QLinearWhere, QLinearConvTranspose, ... of
com.microsoft). DynamicQuantizeLinear's other outputs are its scale and zero point."""

_ALL = None
_MOVING_OPS: dict[str, tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = {
    # op type: (data inputs, outputs that hold quantized data when one data input does);
    # None = all of them
    "Identity": ((0,), (0,)),
    "Reshape": ((0,), (0,)),
    "Flatten": ((0,), (0,)),
    "Squeeze": ((0,), (0,)),
    "Unsqueeze": ((0,), (0,)),
    "Transpose": ((0,), (0,)),
    "Slice": ((0,), (0,)),
    "Split": ((0,), _ALL),
    "Concat": (_ALL, (0,)),
    "Gather": ((0,), (0,)),
    "GatherElements": ((0,), (0,)),
    "GatherND": ((0,), (0,)),
    "Expand": ((0,), (0,)),
    "Tile": ((0,), (0,)),
    "Pad": ((0,), (0,)),
    "DepthToSpace": ((0,), (0,)),
    "SpaceToDepth": ((0,), (0,)),
    "MaxPool": ((0,), (0,)),  # output 1 (Indices) is not data
    "GlobalMaxPool": ((0,), (0,)),
    "ReduceMax": ((0,), (0,)),
    "ReduceMin": ((0,), (0,)),
    "Max": (_ALL, (0,)),
    "Min": (_ALL, (0,)),
    "Where": ((1, 2), (0,)),
    "TopK": ((0,), (0,)),  # output 1 (Indices) is not data
    "Relu": ((0,), (0,)),
    "Clip": ((0,), (0,)),
}
"""Ops that only move, select or saturate their data input's values (no
arithmetic that rounds), so their output carries quantized data when their input
does (traced through the graph by :func:`quantized_data_outputs`)."""


def _quantized_tensors(model) -> set[str]:
    """Names of the tensors of ``model``'s main graph that carry quantized data."""
    q: set[str] = set()
    nodes = list(model.graph.node)
    for _ in range(len(nodes) + 1):  # one pass for a topologically sorted graph, a fixpoint otherwise
        before = len(q)
        for n in nodes:
            if n.domain in _QUANTIZING_DOMAINS and (n.op_type in _QUANTIZING_OPS or n.op_type.startswith("QLinear")):
                if n.output and n.output[0]:
                    q.add(n.output[0])
                continue
            rule = _MOVING_OPS.get(n.op_type) if n.domain in _DEFAULT_DOMAINS else None
            if rule is None:
                continue
            ins, outs = rule
            data = [n.input[i] for i in (range(len(n.input)) if ins is None else ins) if i < len(n.input)]
            if any(t and t in q for t in data):
                q.update(n.output[i] for i in (range(len(n.output)) if outs is None else outs)
                         if i < len(n.output) and n.output[i])
        if len(q) == before:
            break
    return q


def quantized_data_outputs(model) -> set[str]:
    """Graph outputs of ``model`` (an ``onnx.ModelProto``) that carry quantized data.

    Those are the outputs written by QuantizeLinear, DynamicQuantizeLinear (its
    first output), any ``QLinear*`` op (QLinearConv, QLinearMatMul; com.microsoft
    QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat,
    QLinearAveragePool, QLinearGlobalAveragePool, QLinearSoftmax, ...) or QGemm,
    in the default or the com.microsoft domain, and the outputs of ops that only
    move, select or saturate values (Identity, Reshape, Flatten, Squeeze,
    Unsqueeze, Transpose, Slice, Split, Concat, Gather*, Expand, Tile, Pad,
    DepthToSpace, SpaceToDepth, MaxPool, GlobalMaxPool, ReduceMax/Min, Max, Min,
    Where, TopK values, Relu, Clip) whose data input is itself quantized data,
    traced back through the graph (not into subgraphs). Graph inputs are not
    quantized data: the reference and the executor get the same values, so an
    op that only moves them must reproduce them exactly.

    Such an integer output may differ by one quantization step from the
    reference (``QuantizeLinear`` rounds ``x / scale`` half to even, so a
    different accumulation order can land on the neighbouring level); pass the
    set as ``quantized_outputs`` of :func:`compare_outputs`. The float outputs
    of DequantizeLinear are handled by :func:`dequantized_outputs` instead.

    Returns:
        The names (a subset of ``model.graph.output``'s names); empty for a model
        without quantization ops.

    Raises:
        AttributeError: ``model`` is not an ``onnx.ModelProto`` (no ``graph``).
    """
    q = _quantized_tensors(model)
    return {o.name for o in model.graph.output if o.name in q}


def quantized_data_outputs_of_file(model_path: str | None) -> set[str]:
    """:func:`quantized_data_outputs` of the ONNX model file ``model_path`` (read
    without external data); an empty set when ``model_path`` is None or the file
    cannot be read (its outputs are then compared exactly)."""
    if not model_path:
        return set()
    import onnx

    try:
        return quantized_data_outputs(onnx.load(model_path, load_external_data=False))
    except Exception:
        return set()


def declared_output_shapes(model) -> dict:
    """Graph output name -> its declared shape in ``model`` (ints, None for a symbolic
    or unknown dim), or None when the rank is unknown."""
    shapes = {}
    for o in model.graph.output:
        t = o.type.tensor_type
        shapes[o.name] = ([d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
                          if t.HasField("shape") else None)
    return shapes


def compare_on_model(model, actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                     output_names: list[str], *, min_cosine: float | None = None) -> dict:
    """:func:`compare_outputs` for the outputs of the ONNX model ``model`` (a layer or
    a partition): outputs a DequantizeLinear writes are compared as their integer
    levels (:func:`dequantized_outputs`; ``metrics["quantized_levels"]`` records
    them); those and the outputs that carry quantized data
    (:func:`quantized_data_outputs`) may be one step off; the model's declared output
    shapes are named in shape-mismatch messages.

    Returns:
        The metrics dict (see :func:`compare_outputs`).

    Raises:
        ValueError, TypeError: as :func:`compare_outputs`.
    """
    levels = dequantized_outputs(model)
    if levels:
        actual, reference = arrays_as_levels(actual, levels), arrays_as_levels(reference, levels)
    quantized = set(levels) | quantized_data_outputs(model)
    metrics = compare_outputs(actual, reference, output_names, quantized_outputs=quantized,
                              declared_shapes=declared_output_shapes(model), min_cosine=min_cosine)
    if levels:
        metrics["quantized_levels"] = levels
    return metrics
