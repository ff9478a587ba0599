"""The verdict of a comparison: ``success`` or ``difference``, its summary and reasons.

:func:`derive_status` and :func:`status_details` read only stored metrics and a
tolerance (a tolerance edit re-derives verdicts without rerunning anything);
:func:`judge` is the one path from arrays to a verdict (levels, metrics, status)
that the layer tests, the partition checks and the full-model run share.
"""

from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple

from ..core.lazy import np
from ..core.limits import SUMMARY_CHARS as _SUMMARY_MAX_CHARS
from ..core.statuses import INCONCLUSIVE, SUCCESS
from .elementwise import _max_or_none
from .levels import _compare_as_levels, declared_output_shapes, dequantized_outputs, quantized_data_outputs
from .tolerance import _int_atol_for, _output_over, float_tolerance_keys, normalize_tolerance, output_tolerance

def shown_status(result: Mapping) -> str | None:
    """A verdict's status as people see it: ``success*`` for a ``success`` whose comparison
    could not have failed (``metrics["inconclusive"]``, docs/comparison.md), else
    ``result["status"]`` (None when it has none). The one place of that rule: the job
    line, the report text and the HTML cells show it."""
    status = result.get("status")
    if status == SUCCESS and (result.get("metrics") or {}).get("inconclusive"):
        return INCONCLUSIVE
    return status


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


def status_details(metrics: Mapping, tolerance: Mapping | None = None,
                   output_tolerances: Mapping[str, Mapping] | None = None) -> list[str]:
    """All reasons for a ``"difference"`` verdict, one line each (empty on success).

    Same rule and inputs as :func:`derive_status`; useful for the longer
    ``failure_report.message``. ``output_tolerances`` (output name -> tolerance)
    replace ``tolerance`` for those outputs (the full model's widened tolerances,
    :func:`~.tolerance.engine_widened_tolerances`).

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
        problem = _output_problem(out, metrics, output_tolerance(out, tol, output_tolerances))
        if problem is not None:
            lines.append(f"output '{out.get('name')}': {problem}" if len(outs) > 1 else problem)
    return lines


def derive_status(metrics: Mapping, tolerance: Mapping | None = None,
                  output_tolerances: Mapping[str, Mapping] | None = None) -> tuple[str, str]:
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
    and the reason. ``output_tolerances`` (output name -> tolerance) replace
    ``tolerance`` for those outputs (:func:`status_details`).

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
    lines = status_details(metrics, tolerance, output_tolerances)
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


class Judgement(NamedTuple):
    """What :func:`judge` returns; unpacks as ``status, summary, metrics``."""

    status: str
    """``"success"`` or ``"difference"`` (:func:`derive_status`)."""
    summary: str
    """One line of at most ``limits.SUMMARY_CHARS`` (512) characters."""
    metrics: dict
    """The JSON-safe metrics of :func:`~.metrics.compare_outputs`, with
    ``quantized_levels`` when outputs were compared as integer levels."""


def judge(actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], output_names: list[str],
          tolerance: Mapping | None = None, *, model=None, levels: Mapping[str, dict] | None = None,
          quantized_outputs: Iterable[str] = (), min_cosine: float | None = None,
          output_tolerances: Mapping[str, Mapping] | None = None) -> Judgement:
    """Compare an executor's outputs with the reference and decide the verdict.

    The one sequence every check runs (a layer test, a partition check, the
    whole-model run): outputs that a DequantizeLinear writes are brought to their
    integer levels on both sides, then :func:`~.metrics.compare_outputs`, then
    :func:`derive_status` with ``tolerance``. The metrics keep everything needed to
    re-derive the verdict for another tolerance later (:func:`derive_status` alone).

    Args:
        actual: output name -> array of the executor under test (any numeric numpy
            dtype; bfloat16 as ``ml_dtypes.bfloat16``).
        reference: output name -> reference array; holds every name of ``output_names``.
        output_names: the outputs to compare, in model order.
        tolerance: a tolerance dict (:func:`~.tolerance.normalize_tolerance`), None
            for :data:`~.tolerance.DEFAULT_TOLERANCE`.
        model: the ``onnx.ModelProto`` that produced the outputs (a layer or a
            partition), or None. When given, the integer levels come from it
            (:func:`~.levels.dequantized_outputs`), its outputs that carry quantized
            data may be one step off (:func:`~.levels.quantized_data_outputs`) and
            its declared output shapes are named in shape-mismatch summaries: the
            same metrics as :func:`~.levels.compare_on_model`.
        levels: without ``model``: output name -> ``{"scale", "zero_point",
            "dtype"}`` of the outputs to compare as integer levels (e.g. the
            dequantized outputs of the partitions that wrote them), or None.
        quantized_outputs: further names of integer outputs that carry quantized
            data (their default ``int_atol`` is one step), e.g.
            :func:`~.levels.quantized_data_outputs_of_file` of the model run.
        min_cosine: smallest accepted cosine similarity of every float output whose
            reference is not all zero (:data:`~.metrics.FULL_MODEL_MIN_COSINE` for
            the full-model and partition checks), or None (the layer tests).
        output_tolerances: output name -> tolerance replacing ``tolerance`` for
            that output (the full model's widened ones,
            :func:`~.tolerance.engine_widened_tolerances`), or None.

    Returns:
        ``Judgement(status, summary, metrics)``: status ``"success"`` or
        ``"difference"``, a one-line summary, the metrics dict.

    Raises:
        ValueError: both ``model`` and ``levels`` are given; ``output_names`` is empty
            or ``reference`` lacks one of them; ``min_cosine`` is not in [-1, 1]; the
            tolerance is invalid.
        TypeError: an output has a non-numeric dtype (complex, object).
    """
    if model is not None and levels is not None:
        raise ValueError("judge: give the model or the levels, not both")
    if model is not None:
        levels = dequantized_outputs(model)
        quantized_outputs = set(quantized_outputs) | quantized_data_outputs(model)
        declared = declared_output_shapes(model)
    else:
        declared = None
    metrics = _compare_as_levels(actual, reference, output_names, levels=levels, quantized_outputs=quantized_outputs,
                                 declared_shapes=declared, min_cosine=min_cosine)
    status, summary = derive_status(metrics, tolerance, output_tolerances)
    return Judgement(status, summary, metrics)
