"""Comparison of a backend's outputs with the reference outputs: the metrics dict.

:func:`compare_outputs` compares the outputs of one (layer, executor) run with the
reference (ONNX Runtime) outputs and returns a JSON-safe *metrics* dict that holds
everything needed to decide the verdict for any tolerance later, without the
arrays (:mod:`.tolerance`, :mod:`.verdict`). Pure numpy: the per-kind element
comparisons are in :mod:`.elementwise`, the parts that read an ONNX model in
:mod:`.levels`. The rule is documented in ``docs/comparison.md``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..core.lazy import np
from .elementwise import (ABS_DIFF_THRESHOLDS, REL_DIFF_THRESHOLDS, _compare_bool, _compare_float, _compare_int,
                          _compare_string, _dtype_name, _kind_of, _max_or_none, _min_or_none, blind_spot_text,
                          uniform_axes)

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
          there are several), ``blind_spots`` (list of str: outputs whose reference
          repeats along an axis, :func:`~.elementwise.uniform_axes`; per output
          ``uniform_axes`` and ``blind_spot``), ``num_nonfinite_mismatches`` and
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
        if kind in ("float", "int") and not entry["inconclusive_reason"]:
            axes = uniform_axes(r)
            if axes:  # a weaker check, not an inconclusive one: the values are still compared
                entry["uniform_axes"] = [a for a, _ in axes]
                entry["blind_spot"] = blind_spot_text(axes)
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
    blind = [e["blind_spot"] if len(outputs) == 1 else f"output '{e['name']}': {e['blind_spot']}"
             for e in outputs if e.get("blind_spot")]

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
        "blind_spots": blind,
        "num_elements": sum(e["num_elements"] for e in outputs),
        "rel_diff_thresholds": list(REL_DIFF_THRESHOLDS),
        "abs_diff_thresholds": list(ABS_DIFF_THRESHOLDS),
    }


#: the standard grids, one list each, shared by every metrics dict read back (never mutated)
_SHARED_GRIDS = {"rel_diff_thresholds": list(REL_DIFF_THRESHOLDS), "abs_diff_thresholds": list(ABS_DIFF_THRESHOLDS)}


def share_threshold_grids(metrics: Any) -> None:
    """In a metrics dict read back from a ``result.json`` (:func:`compare_outputs`'s),
    replace each threshold grid equal to the standard one by one list shared by all (in
    place; the values do not change). A report of 5,000 layers holds ~30,000 such
    grids of 93 floats, a third of its memory otherwise (docs/scale.md). Not a dict, or
    other grids: left as they are."""
    if not isinstance(metrics, dict):
        return
    for key, grid in _SHARED_GRIDS.items():
        if metrics.get(key) == grid:
            metrics[key] = grid


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

