"""Numerical comparison of a backend's layer outputs with the reference outputs.

This package is a numerics library (numpy and ml_dtypes; ONNX only, imported
lazily, in :mod:`.levels`, the helpers that read a model; no command line). Its
modules, in the order of their imports (each imports only those above it):

* :mod:`.elementwise`: per-kind element comparisons (float, int, bool, string).
* :mod:`.metrics`: :func:`compare_outputs`, the JSON-safe metrics dict.
* :mod:`.tolerance`: :func:`normalize_tolerance`, integer defaults, counts over a tolerance.
* :mod:`.levels`: quantized data in ONNX models (integer levels, quantized outputs),
  :func:`compare_on_model`.
* :mod:`.verdict`: :func:`derive_status`, :func:`status_details`,
  :func:`inconclusive_reason` and :func:`judge` (arrays -> levels -> metrics -> verdict).

Its main entry points (all importable from ``torq_gen_config.compare``):

* :func:`compare_outputs` compares the outputs of one (layer, executor) run with
  the reference (ONNX Runtime) outputs and returns a JSON-safe *metrics* dict.
  The metrics hold everything needed to decide the verdict for **any**
  tolerance later, without the arrays.
* :func:`derive_status` turns a metrics dict and a tolerance into the verdict
  ``"success"`` or ``"difference"`` plus a one-line summary.
* :func:`count_over_tolerance` re-derives how many elements exceed a tolerance
  from the stored per-output histograms.
* :func:`judge` runs the whole sequence on arrays: integer levels where a
  DequantizeLinear writes an output, :func:`compare_outputs`, :func:`derive_status`.
* :func:`inconclusive_reason` says, from the metrics, why a comparison cannot
  fail (a reference below the dtype's absolute floor, all zero, no elements).

The metric is documented for users in ``docs/comparison.md``. In short (the
rule replaces the original tool's strict symmetric relative check, see
docs/original_tool.md, 'Statuses and tolerances'):

Float outputs (float16, bfloat16, float32, float64; computed in float64)
    ``d_i = |o_i - r_i| / max(|r_i|, F)`` with the floor
    ``F = max(ABS_FLOOR[reference dtype], 1e-3 * max_j |r_j|)``.
    Verdict success iff ``max_i d_i <= fp_max_tol`` and
    ``mean_i d_i <= fp_avg_tol`` (the original tool's defaults:
    both 0.01).
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

from .elementwise import ABS_DIFF_THRESHOLDS, ABS_FLOOR, REL_DIFF_THRESHOLDS, RELATIVE_FLOOR_FRACTION
from .levels import (arrays_as_levels, compare_on_model, declared_output_shapes, dequantized_outputs,
                     dequantized_outputs_of_file, quantized_data_outputs, quantized_data_outputs_of_file,
                     to_quantized_levels)
from .metrics import FULL_MODEL_MIN_COSINE, compare_outputs
from .tolerance import (DEFAULT_TOLERANCE, ENGINE_TOLERANCE_MARGIN, count_over_tolerance, default_int_atol,
                        engine_widened_tolerances, float_tolerance_keys, normalize_tolerance, widening_note)
from .verdict import Judgement, derive_status, inconclusive_reason, judge, shown_status, status_details

__all__ = [
    "DEFAULT_TOLERANCE",
    "ENGINE_TOLERANCE_MARGIN",
    "engine_widened_tolerances",
    "widening_note",
    "FULL_MODEL_MIN_COSINE",
    "ABS_FLOOR",
    "RELATIVE_FLOOR_FRACTION",
    "REL_DIFF_THRESHOLDS",
    "ABS_DIFF_THRESHOLDS",
    "compare_outputs",
    "derive_status",
    "status_details",
    "judge",
    "Judgement",
    "count_over_tolerance",
    "default_int_atol",
    "inconclusive_reason",
    "shown_status",
    "normalize_tolerance",
    "float_tolerance_keys",
    "dequantized_outputs",
    "to_quantized_levels",
    "arrays_as_levels",
    "dequantized_outputs_of_file",
    "quantized_data_outputs",
    "quantized_data_outputs_of_file",
    "declared_output_shapes",
    "compare_on_model",
]
