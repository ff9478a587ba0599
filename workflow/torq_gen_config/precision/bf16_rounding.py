"""Rounding of float32 values to bfloat16 (round to nearest even, the bf16 maximum
enforced for constants) and the errors it makes.
"""

from __future__ import annotations

import math
from typing import Any

from ..core.lazy import ml_dtypes, np

#: float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), (2 - 2**-7) * 2**127: written out so that importing
#: this module does not load ml_dtypes (core/lazy.py)
_BF16_MAX = 3.3895313892515355e38


def round_to_bf16(array: np.ndarray, *, saturate: bool = False) -> np.ndarray:
    """Round float32 values to ``ml_dtypes.bfloat16``, round-to-nearest-even.

    Args:
        array: array-like of float32 (other float types are converted to float32 first).
        saturate: clamp finite values whose rounding overflows (|x| beyond the bf16
            maximum, ~3.39e38) to +-max instead of +-inf (used for constants, as the
            seed enforces only the bf16 maximum). inf and NaN are kept.

    Returns:
        An array of the same shape with dtype ``ml_dtypes.bfloat16``.

    As the original tool (round to nearest even, only the bf16 maximum enforced;
    docs/original_tool.md, 'Dtype conversion'); ``ml_dtypes``' float32 -> bfloat16
    cast rounds to nearest even.
    """
    x = np.asarray(array, dtype=np.float32)
    r = x.astype(ml_dtypes.bfloat16)
    if saturate:
        over = np.isinf(r) & np.isfinite(x)
        if over.any():
            r = np.where(over, np.copysign(_BF16_MAX, x).astype(ml_dtypes.bfloat16), r)
    return r


def _bf16_stats(x: np.ndarray, r: np.ndarray, clamped: int) -> dict:
    """Errors of the bf16 rounding ``r`` of the fp32 values ``x`` (finite values only)."""
    x64 = x.astype(np.float64).ravel()
    r64 = r.astype(np.float64).ravel()
    fin = np.isfinite(x64)
    x64, r64 = x64[fin], r64[fin]
    out: dict[str, Any] = {"values": int(x.size)}
    if x64.size == 0:
        out.update(max_abs_error=0.0, mean_abs_error=0.0, rmse=0.0, max_rel_error=0.0)
    else:
        d = np.abs(r64 - x64)
        nz = x64 != 0
        out.update(
            max_abs_error=float(d.max()),
            mean_abs_error=float(d.mean()),
            rmse=float(math.sqrt(float(np.mean(d * d)))),
            max_rel_error=float((d[nz] / np.abs(x64[nz])).max()) if nz.any() else 0.0,
        )
    out["clamped_to_max"] = int(clamped)
    return out
