"""Tolerances of the verdict: validation, defaults and counts over a tolerance.

A tolerance is a dict of ``fp_avg_tol``/``fp_max_tol`` (float outputs),
``bf16_avg_tol``/``bf16_max_tol`` (bfloat16 references), all dimensionless bounds
on the normalized error ``d``, and the optional ``int_atol`` (integer steps).
Everything here reads only stored metrics (:func:`~.metrics.compare_outputs`), so
a tolerance edit re-derives counts without the arrays.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Mapping

from ..core.lazy import np
from .elementwise import ABS_DIFF_THRESHOLDS, REL_DIFF_THRESHOLDS

DEFAULT_TOLERANCE: dict[str, float] = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01,
                                       "bf16_avg_tol": 0.01, "bf16_max_tol": 0.05}
"""The original tool's defaults (``default_tolerance`` of the report) for
float outputs, and the bounds used instead for outputs whose reference is
bfloat16 (``--auto-convert-bf16``): bf16 keeps 8 significant bits, so one unit in
the last place is 2**-8 to 2**-7 (0.4 % to 0.8 %) of a value, and an executor
that accumulates in another order or rounds once more differs by one or two such
units (docs/comparison.md, "bf16 outputs")."""

_TOLERANCE_KEYS = ("fp_avg_tol", "fp_max_tol", "bf16_avg_tol", "bf16_max_tol", "int_atol")

ENGINE_TOLERANCE_MARGIN = 2.0
"""Factor on what ONNX Runtime with all graph optimizations (the engine as deployed) is
off the full-model reference (ONNX Runtime, optimizations off): the full-model verdict
accepts up to this many times that engine's own max and mean normalized error
(:func:`engine_widened_tolerances`; docs/comparison.md, "Tolerance widened to what ONNX
Runtime needs"). The engine's figure is one sample of a rounding-noise maximum; another
engine of the same precision (other kernels, other summation order) lands near it, not on
it: issue 42's 640x640 detector, ONNX Runtime optimized 2.1e-2 and IREE 1.8e-2 off the
reference. 2 leaves room for that spread and no more: an error of twice the deployed
engine's is still a difference."""


def engine_widened_tolerances(tolerance: Mapping[str, Any] | None, engine_metrics: Mapping | None,
                              margin: float = ENGINE_TOLERANCE_MARGIN) -> dict[str, dict]:
    """Per float output, the tolerance widened to what a trusted engine needs (issue 42).

    Rule, per float output ``o`` with keys ``(avg, max)`` (:func:`float_tolerance_keys`)::

        max_tol(o) = max(configured max, margin * engine's max_rel_diff(o))
        avg_tol(o) = max(configured avg, margin * engine's mean_rel_diff(o))

    ``engine_metrics`` are :func:`~.metrics.compare_outputs` metrics of the engine's outputs
    against the same reference (ONNX Runtime with all graph optimizations, computed with the
    full model's reference: ``reference.npz``'s ``optimized``). Both figures are
    dimensionless normalized errors ``d`` (docs/comparison.md). Integer, bool and string
    outputs and outputs the engine could not be measured on (missing, other shape,
    non-finite mismatch: no ``max_rel_diff``) are never widened; nor is the cosine bound.

    Returns:
        ``{output name: tolerance dict}`` (the normalized tolerance with that output's two
        keys widened) for the outputs where a value grew; empty when none did, so an engine
        that agrees with the reference to ``configured / margin`` changes nothing.

    Raises:
        ValueError: the tolerance is invalid (:func:`normalize_tolerance`) or ``margin`` is
            not a finite number >= 1.
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 1:
        raise ValueError(f"margin must be a finite number >= 1, got {margin!r}")
    tol = normalize_tolerance(tolerance)
    if not isinstance(engine_metrics, Mapping) or not isinstance(engine_metrics.get("outputs"), list):
        return {}
    widened: dict[str, dict] = {}
    for out in engine_metrics["outputs"]:
        if out.get("kind") != "float" or out.get("missing_output") or out.get("shape_mismatch"):
            continue
        max_rel, mean_rel = out.get("max_rel_diff"), out.get("mean_rel_diff")
        if max_rel is None or mean_rel is None or out.get("num_nonfinite_mismatches"):
            continue
        avg_key, max_key = float_tolerance_keys(out)
        new = {avg_key: max(tol[avg_key], margin * float(mean_rel)), max_key: max(tol[max_key], margin * float(max_rel))}
        if new[avg_key] > tol[avg_key] or new[max_key] > tol[max_key]:
            widened[str(out.get("name"))] = {**tol, **new}
    return widened


def widening_note(tolerance: Mapping[str, Any] | None, widened: Mapping[str, Mapping], engine_metrics: Mapping | None,
                  margin: float = ENGINE_TOLERANCE_MARGIN, engine: str = "ONNX Runtime (all optimizations)") -> str | None:
    """One line saying which outputs' tolerances :func:`engine_widened_tolerances` widened,
    from what to what and why, e.g. ``"tolerance widened to 2 x what ONNX Runtime (all
    optimizations) is off the reference: output 'y' fp_max_tol 1.0e-02 -> 4.2e-02 (it is
    2.1e-02 off)"``; None when nothing was widened."""
    if not widened:
        return None
    tol = normalize_tolerance(tolerance)
    outs = {str(o.get("name")): o for o in (engine_metrics or {}).get("outputs") or []}
    parts = []
    for name, t in widened.items():
        o = outs.get(name) or {}
        avg_key, max_key = float_tolerance_keys(o)
        keys = [(k, f) for k, f in ((max_key, "max_rel_diff"), (avg_key, "mean_rel_diff")) if t[k] > tol[k]]
        parts.append(f"output '{name}' " + ", ".join(f"{k} {tol[k]:.1e} -> {t[k]:.1e} (it is {o.get(f):.1e} off)"
                                                      for k, f in keys))
    return f"tolerance widened to {margin:g} x what {engine} is off the reference: " + "; ".join(parts)


def default_int_atol(quantized: bool = False) -> int:
    """Default absolute tolerance (in units of the output, i.e. integer steps) of
    an integer output, whatever its integer dtype.

    Args:
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


def normalize_tolerance(tolerance: Mapping[str, Any] | None) -> dict:
    """Return a validated tolerance dict with the defaults filled in.

    ``fp_avg_tol`` and ``fp_max_tol`` are dimensionless bounds on the mean and
    max normalized error ``d`` of float outputs, ``bf16_avg_tol`` and
    ``bf16_max_tol`` the same for outputs whose reference is bfloat16; the optional ``int_atol`` (integer, units of the
    output) overrides the integer default (:func:`default_int_atol`).

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
    return default_int_atol(quantized=bool(out.get("quantized", False)))


def count_over_tolerance(metrics: Mapping, tolerance: Mapping | None,
                         output_tolerances: Mapping[str, Mapping] | None = None) -> tuple[int, float]:
    """Number and share of elements over the tolerance, from stored metrics only.

    Float outputs count elements with ``d > fp_max_tol``, integer outputs
    elements with ``|diff| > int_atol`` (default per dtype), bool outputs the
    mismatches. The counts come from the per-output histograms stored by
    :func:`compare_outputs` (``rel_diff_counts_over`` on the grid
    ``REL_DIFF_THRESHOLDS``, ``abs_diff_counts_over`` on
    ``ABS_DIFF_THRESHOLDS``). The count is exact when the tolerance is a grid
    point; otherwise the nearest grid point *below* the tolerance is used, so
    the count is conservative (never smaller than the true count).
    ``output_tolerances`` (output name -> tolerance, e.g. from
    :func:`engine_widened_tolerances`) replace ``tolerance`` for those outputs.

    Returns:
        ``(count, share)``: ``count`` summed over outputs with element-wise data;
        ``share = count / num_elements`` of those outputs, in [0, 1] (0.0 when
        there are none).

    Raises:
        ValueError: the tolerance is invalid (:func:`normalize_tolerance`) or
            ``metrics`` is not a metrics dict.
    """
    count, n, _ = _count_over(metrics, normalize_tolerance(tolerance), output_tolerances)
    return count, (count / n if n else 0.0)


def _count_over(metrics: Mapping, tol: Mapping,
                output_tolerances: Mapping[str, Mapping] | None = None) -> tuple[int, int, bool]:
    if not isinstance(metrics, Mapping) or not isinstance(metrics.get("outputs"), list):
        raise ValueError("metrics must be a dict returned by compare_outputs (with an 'outputs' list)")
    count = n = 0
    exact = True
    for out in metrics["outputs"]:
        r = _output_over(out, metrics, output_tolerance(out, tol, output_tolerances))
        if r is None:
            continue
        count += r[0]
        n += r[1]
        exact = exact and r[2]
    return count, n, exact


def output_tolerance(out: Mapping, tol: Mapping, output_tolerances: Mapping[str, Mapping] | None) -> Mapping:
    """The tolerance of one output of ``metrics["outputs"]``: its entry of
    ``output_tolerances`` (normalized) when there is one, else ``tol``."""
    if output_tolerances and out.get("name") in output_tolerances:
        return normalize_tolerance(output_tolerances[out["name"]])
    return tol
