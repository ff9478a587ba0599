"""Runtime measurement helpers shared by the backends' :meth:`Backend.benchmark`:
argument checks and the summary statistics of the timed samples (docs/timing.md)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_timing_args", "runtime_stats"]


def check_timing_args(runs: Any, warmup: Any) -> tuple[int, int]:
    """Validate the ``runs``/``warmup`` of :meth:`Backend.benchmark`.

    Raises:
        ValueError: ``runs`` is not an int >= 1 or ``warmup`` not an int >= 0.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"benchmark: runs must be an integer >= 1, got {runs!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"benchmark: warmup must be an integer >= 0, got {warmup!r}")
    return runs, warmup


def runtime_stats(samples_ms: list[float], *, warmup: int, method: str) -> dict:
    """The result dict of :meth:`Backend.benchmark` for the timed samples (ms).

    Returns:
        ``{"runs", "warmup", "median_ms", "min_ms", "mean_ms", "max_ms",
        "samples_ms", "method"}``; every float rounded to 4 decimals. The median
        of an even count is the mean of the two middle samples.

    Raises:
        ValueError: no samples.
    """
    if not samples_ms:
        raise ValueError("runtime_stats: no samples")
    values = [float(x) for x in samples_ms]
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0
    return {
        "runs": n,
        "warmup": int(warmup),
        "median_ms": round(median, 4),
        "min_ms": round(ordered[0], 4),
        "mean_ms": round(sum(values) / n, 4),
        "max_ms": round(ordered[-1], 4),
        "samples_ms": [round(x, 4) for x in values],
        "method": method,
    }
