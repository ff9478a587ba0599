"""Assembly of the report JSON and the compiler JSON from per-layer results.

Layouts: docs/original_tool.md, 'Report JSON' and 'Compiler JSON'. The report
written here is a superset of the original tool's version 1.1
format (extra fields: per-executor ``metrics``, ``timing.compile_ms/run_ms``,
``reference_status``, ``backend``; per-op ``recommendation_source``,
``op_type``, ``layer_slug``; top-level ``executors``, ``mlir_file``,
``provenance``), so the C++ ``ExecutorAssignmentPass`` and readers of the original format keep
working.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Mapping

from .. import REPORT_FORMAT_VERSION
from ..compare import normalize_tolerance
from ..config import SCHEMA_PATH
from ..core.errors import ReportError
from ..core.lazy import jsonschema, yaml
from ..core.limits import NOTE_CHARS, SUMMARY_CHARS as _SUMMARY_MAX_CHARS
from .cells import executor_names
from ..core.statuses import STATUSES
from .recommend import (
    REASON_NOT_TESTABLE,
    REASON_NOT_TESTED,
    REASON_USER,
    duration_ms,
    recommend_with_reason,
    rederive_statuses,
    reference_used,
    runtime_median_ms,
)
from .summary import summarize, trust_lists
from .text import render_final_report_text

__all__ = ["build_op", "build_report", "build_compiler_json", "finish_report"]

_LOCATION_RE = re.compile(r"^(\d+):(\d+)$")


def _default_failure_report(status: str, result: Mapping) -> dict:
    """Failure report for a non-success result that came without one."""
    if status == "unverified":
        ref_msg = (result.get("reference") or {}).get("message")
        summary = "reference (ONNX Runtime) failed on this layer; outputs not compared"
        return {
            "type": "error",
            "stage": "reference",
            "summary": (summary + (f": {ref_msg}" if ref_msg else ""))[:_SUMMARY_MAX_CHARS],
            "message": ref_msg,
        }
    if status == "skipped":
        by = (result.get("skipped_because") or {}).get("executor")
        return {"type": "skipped", "stage": None,
                "summary": f"not tested: {by} already succeeded on this layer (skip mode)" if by
                else "not tested (skip mode)", "message": None}
    if status == "difference":
        return {"type": "accuracy_failure", "stage": "compare",
                "summary": "difference reported without metrics", "message": None}
    return {"type": "error", "stage": None, "summary": "no failure report recorded", "message": None}


def _executor_entry(layer_id: str, name: str, result: Mapping, default_tolerance: dict, *,
                    copy_results: bool = True) -> dict:
    """Report entry of one (layer, executor) result dict (layout: module docstring);
    ``copy_results=False``: shares the result's dicts (:func:`build_op`)."""
    dup = copy.deepcopy if copy_results else (lambda value: value)
    if not isinstance(result, Mapping):
        raise ReportError(f"layer {layer_id}, executor {name}: result must be a JSON object")
    status = result.get("status")
    if status not in STATUSES:
        raise ReportError(
            f"layer {layer_id}, executor {name}: invalid status {status!r}; expected one of {list(STATUSES)}"
        )
    metrics = result.get("metrics")
    tolerance_used = result.get("tolerance_used") or default_tolerance
    entry: dict[str, Any] = {
        "status": status,
        "backend": result.get("backend"),
        "tolerance_used": dict(tolerance_used),
        "metrics": dup(metrics) if metrics else None,
    }
    if metrics:
        entry["max_diff"] = {
            "max_rel_diff": metrics.get("max_rel_diff"),
            "max_abs_diff": metrics.get("max_abs_diff"),
        }
    if status == "success":
        entry["failure_report"] = None
    else:
        report = result.get("failure_report")
        entry["failure_report"] = dup(report) if report else _default_failure_report(status, result)
    entry["timing"] = _timing_entry(result.get("timing") or {})
    reference = result.get("reference") or {}
    entry["reference_status"] = reference.get("status")
    entry["reference_engine"] = reference.get("engine")
    # the engine the verdict rests on: the spec where ONNX Runtime failed on the layer
    entry["reference_used"] = reference_used(reference)
    if reference.get("fallback"):
        entry["reference_fallback"] = reference["fallback"]
    if result.get("reference_check"):
        entry["reference_check"] = dup(result["reference_check"])
    if result.get("outputs_file"):  # the executor's outputs, kept where the verdict is not a success
        entry["outputs_file"] = result["outputs_file"]
    return entry


def _layer_reference(layer_results: Mapping) -> dict | None:
    """The op's ``reference``: what its references were computed from and how they
    went (shared by its executors: one reference file per layer), from the first
    result that records it. ``used``: the engine the verdicts rest on
    (:func:`~torq_gen_config.report.recommend.reference_used`); ``fallback``: why it is
    not the configured one, or None."""
    for result in layer_results.values():
        ref = (result or {}).get("reference") if isinstance(result, Mapping) else None
        if ref and ref.get("status") is not None:
            out = {k: copy.deepcopy(ref.get(k)) for k in ("engine", "engine_version", "ort_version", "status",
                                                          "message", "layer_inputs", "second", "engines_agreement",
                                                          "arbiter")}
            out["used"] = reference_used(ref)
            out["fallback"] = ref.get("fallback")
            out["dispute"] = None
            return out
    return None


def _timing_entry(timing: Mapping) -> dict:
    """Report ``timing`` of one (layer, executor) from the result's ``timing``.

    Always ``compile_ms`` and ``run_ms`` (the single verification run, for IREE
    a whole ``iree-run-module`` process). With compile batches, ``compile_batch``
    as in the result (``compile_ms`` is then the layer's share of its batch). When the runtime was measured
    (``collect_timing``): ``runtime_ms`` (the median, 3 decimals, the original
    tool's field), ``runs``, ``warmup``, ``median_ms``, ``min_ms``, ``mean_ms``,
    ``max_ms``, ``samples_ms`` and ``method``. When the measurement failed:
    ``runtime_error`` (its one-line summary).
    """
    out: dict[str, Any] = {"compile_ms": duration_ms(timing.get("compile_ms")),
                           "run_ms": duration_ms(timing.get("run_ms"))}
    runtime = timing.get("runtime")
    median = runtime_median_ms({"timing": timing})
    if isinstance(runtime, Mapping) and median is not None:
        out["runtime_ms"] = round(median, 3)
        out["runs"] = runtime.get("runs")
        out["warmup"] = runtime.get("warmup")
        for key in ("median_ms", "min_ms", "mean_ms", "max_ms"):
            out[key] = duration_ms(runtime.get(key))
        out["samples_ms"] = list(runtime.get("samples_ms") or [])
        out["method"] = runtime.get("method")
    err = timing.get("runtime_error")
    if err:
        out["runtime_error"] = err.get("summary") if isinstance(err, Mapping) else str(err)
    if isinstance(timing.get("compile_batch"), Mapping):  # compile_ms is then a share of a batch's time
        out["compile_batch"] = dict(timing["compile_batch"])
    return out


def _previous_override(layer_id: str, prev_op: Mapping | None) -> dict | None:
    if not prev_op or prev_op.get("tolerance_override") is None:
        return None
    try:
        return normalize_tolerance(prev_op["tolerance_override"])
    except ValueError as e:
        raise ReportError(f"previous report, layer {layer_id}: invalid tolerance_override: {e}") from None


def build_report(
    *,
    model_name: str,
    layers: list[dict],
    results: Mapping[str, Mapping[str, Mapping]],
    executors: list[dict],
    default_tolerance: Mapping,
    mlir_file: str | None,
    provenance: Mapping,
    previous_report: Mapping | None = None,
    recommend_by_timing: bool = False,
) -> dict:
    """Build the report JSON (format version 1.1, a superset of the original tool's).

    Args:
        model_name: the model's name (file stem), shown in both JSONs.
        layers: layer dicts in model order, each with ``layer_id``, ``slug``,
            ``op_type``, ``node_index`` (int), ``mlir_location`` ("L:C" or None),
            ``mac_count`` (int or None) and ``skipped_reason`` (None, or why the
            layer was not tested: it then gets no executors and no
            recommendation).
        results: ``results[layer_id][executor]`` = result dict written by the
            layer-test job (``status``, ``tolerance_used``, ``metrics``,
            ``failure_report``, ``timing``, ``reference``). Missing entries mean
            "not tested"; results of executors that are not configured are
            ignored.
        executors: configured executors ``{"name", "backend", "options"}`` in
            priority order.
        default_tolerance: ``{fp_avg_tol, fp_max_tol[, int_atol]}``.
        mlir_file: path of the full-model MLIR the locations refer to, or None.
        provenance: tool versions, flags etc.; stored as given.
        previous_report: an earlier report of the same model. Person-made
            choices in it are kept per ``layer_id``: a ``tolerance_override``
            (statuses are re-derived with it) and a recommendation with
            ``"recommendation_source": "user"`` if that executor is still
            configured (otherwise it is dropped, the discovery rule applies and
            the op records ``user_recommendation_dropped``).
        recommend_by_timing: recommend by measured runtime (fastest success,
            else fastest difference); layers without runtime data fall back to
            priority order (see
            :func:`~torq_gen_config.report.recommend.recommend_with_reason`).

    Every executor verdict with metrics is re-derived from the metrics with the
    layer's effective tolerance (override, else ``default_tolerance``), so the
    report is consistent with its ``default_tolerance`` whatever tolerance the
    layer-test job used. The recommendation follows
    :func:`~torq_gen_config.report.recommend.recommend_with_reason`; each op records why as ``recommendation_reason``
    (``"priority"``, ``"fastest success (0.123 ms median)"``, ``"priority (no
    timing data)"``, ``"user"``, ...), and the summary counts the layers chosen
    by timing and those that fell back, with a note. ``mlir_location`` falls back to the op type when the layer has
    no MLIR location (as the original tool does), which keeps it out of the compiler JSON.

    Returns:
        The report dict (JSON-safe if the inputs are).

    Raises:
        ReportError: no or duplicate executors, duplicate layer ids, an invalid
            status, or an invalid tolerance (default or previous override).
    """
    names, default_tol = check_report_settings(executors, default_tolerance)
    prev_ops = (previous_report or {}).get("ops") or {}
    ops: dict[str, dict] = {}
    for layer in layers:
        layer_id = layer["layer_id"]
        if layer_id in ops:
            raise ReportError(f"build_report: duplicate layer id {layer_id!r}")
        ops[layer_id] = build_op(layer, results.get(layer_id) or {}, names, default_tol, prev_ops.get(layer_id),
                                 recommend_by_timing=recommend_by_timing)
    return finish_report(model_name=model_name, ops=ops, names=names, default_tolerance=default_tol,
                         mlir_file=mlir_file, provenance=provenance, recommend_by_timing=recommend_by_timing)


def check_report_settings(executors: list[dict], default_tolerance: Mapping) -> tuple[list[str], dict]:
    """The executor names (priority order) and the normalized default tolerance of a
    report to build.

    Raises:
        ReportError: no or duplicate executor names, or an invalid tolerance.
    """
    names = [e.get("name") for e in executors]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ReportError("build_report: executors must be a non-empty list of dicts with a 'name'")
    if len(set(names)) != len(names):
        raise ReportError(f"build_report: duplicate executor names in {names}")
    try:
        return names, normalize_tolerance(default_tolerance)
    except ValueError as e:
        raise ReportError(f"invalid default tolerance: {e}") from None


def build_op(layer: Mapping, layer_results: Mapping[str, Mapping], names: list[str], default_tol: dict,
             prev_op: Mapping | None, *, recommend_by_timing: bool = False, copy_results: bool = True) -> dict:
    """The report's op of one layer (layout and rules: :func:`build_report`) from its
    results per executor (``layer_results[executor]``, the ``result.json`` dicts).

    ``copy_results=False`` lets the op share (and the re-derivation update) the result
    dicts' ``metrics``, ``failure_report`` and ``reference_check`` instead of deep-copying
    them: for a caller that owns the results and drops them after (the report of a
    5,000-layer model holds ~15,000 of them; docs/scale.md).

    Raises:
        ReportError: an invalid status or tolerance override.
    """
    layer_id = layer["layer_id"]
    op: dict[str, Any] = {"executors": {}}
    skipped = layer.get("skipped_reason") or layer.get("not_testable")
    if not skipped:
        for name in names:
            if name in layer_results:
                op["executors"][name] = _executor_entry(layer_id, name, layer_results[name], default_tol,
                                                        copy_results=copy_results)
        reference = _layer_reference(layer_results)
        if reference is not None:
            op["reference"] = reference
    override = _previous_override(layer_id, prev_op)
    if override is not None:
        op["tolerance_override"] = override
    try:
        rederive_statuses(op, default_tol)
    except ValueError as e:
        raise ReportError(f"layer {layer_id}: {e}") from None

    recommended, reason = recommend_with_reason(op["executors"], names, by_timing=recommend_by_timing)
    if skipped:
        reason = REASON_NOT_TESTABLE if layer.get("not_testable") else REASON_NOT_TESTED
    source = "discovery"
    if prev_op and prev_op.get("recommendation_source") == "user":
        user_choice = prev_op.get("recommended_executor")
        if user_choice is None or (isinstance(user_choice, str) and user_choice in names):
            recommended, source, reason = user_choice, "user", REASON_USER
        else:
            op["user_recommendation_dropped"] = user_choice
    op["recommended_executor"] = recommended
    op["recommendation_source"] = source
    op["recommendation_reason"] = reason
    location = layer.get("mlir_location")
    op["mlir_location"] = location if location else layer.get("op_type")
    op["_node_index"] = layer.get("node_index")
    op["op_type"] = layer.get("op_type")
    op["layer_slug"] = layer.get("slug")
    if layer.get("mac_count") is not None:
        op["mac_count"] = int(layer["mac_count"])
    if layer.get("skipped_reason"):
        op["skipped_reason"] = layer["skipped_reason"]
    if layer.get("not_testable"):
        op["not_testable_reason"] = layer["not_testable"]
    return op


def finish_report(*, model_name: str, ops: dict[str, dict], names: list[str], default_tolerance: dict,
                  mlir_file: str | None, provenance: Mapping, recommend_by_timing: bool = False) -> dict:
    """The report (layout: :func:`build_report`) around its ``ops`` (from :func:`build_op`,
    in model order): the summary, the critical failures, the trust lists and the final text."""
    summary, critical = summarize(ops, names, recommend_by_timing=recommend_by_timing)
    report: dict[str, Any] = {
        "version": REPORT_FORMAT_VERSION,
        "model_name": model_name,
        "default_tolerance": default_tolerance,
        "executors": names,
        "mlir_file": mlir_file,
        "ops": ops,
        "discovery_report": {"summary": summary, "critical_failures": critical, **trust_lists(ops)},
        "has_critical_failures": bool(critical),
        "final_report_text": "",
        "provenance": dict(provenance),
    }
    report["final_report_text"] = render_final_report_text(report)
    return report


def check_report(report: Any, source: str = "the report JSON") -> None:
    """Check a report read from disk against ``workflow/schemas/report.schema.yaml`` (the
    fields ``view``, ``edit`` and ``run`` read), so a hand-edited or truncated report is
    a one-line error, not a traceback deep in the rendering.

    Raises:
        ReportError: the first problem, with its JSON path (e.g. ``executors: 'a' is not of type 'array'``).
    """
    with open(SCHEMA_PATH.with_name("report.schema.yaml"), encoding="utf-8") as f:
        schema = yaml.safe_load(f)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(report), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ReportError(f"{source} is not a valid torq-gen-config report: at {where}: {e.message[:NOTE_CHARS]}")


def build_compiler_json(report: Mapping) -> dict:
    """Compiler JSON for the C++ ``ExecutorAssignmentPass`` (docs/original_tool.md, 'Compiler JSON').

    Returns:
        ``{"op_assignments": {"L:C": {"executor": name}}, "model_name": ...}``
        with one entry per op whose ``mlir_location`` matches ``^\\d+:\\d+$`` and
        whose ``recommended_executor`` is set, sorted by (line, column) as
        numbers (so "42:12" comes before "100:12").

    Raises:
        ReportError: ``report`` is not a report (no ``ops`` object).
    """
    ops = report.get("ops") if isinstance(report, Mapping) else None
    if not isinstance(ops, Mapping):
        raise ReportError("not a report JSON: it has no 'ops' object")
    assignments = []
    for op in ops.values():
        location = op.get("mlir_location")
        executor = op.get("recommended_executor")
        if not isinstance(location, str) or not isinstance(executor, str) or not executor:
            continue
        m = _LOCATION_RE.match(location)
        if m:
            assignments.append(((int(m.group(1)), int(m.group(2))), location, executor))
    assignments.sort(key=lambda a: a[0])
    return {
        "op_assignments": {loc: {"executor": ex} for _, loc, ex in assignments},
        "model_name": report.get("model_name"),
    }


def unassigned_reason(report: Mapping, compiler: Mapping) -> str | None:
    """Why ``compiler`` (the compiler JSON of ``report``) assigns no op although the model
    has layers, as one line for the user; None when it assigns one, or the report has no
    layer. Such a compiler JSON carries it as its ``error`` and the commands exit non-zero
    (:func:`~.publish.publish_report`): a compiler would read it as "nothing to place"
    while discovery failed to place anything.
    """
    ops = report.get("ops") or {}
    if not ops or (compiler.get("op_assignments") or {}):
        return None
    n = len(ops)
    located = [op for op in ops.values() if isinstance(op.get("mlir_location"), str)
               and _LOCATION_RE.match(op["mlir_location"])]
    recommended = [op for op in ops.values() if op.get("recommended_executor")]
    mlir = ((report.get("provenance") or {}).get("mlir") or {})
    if not located:
        cause = "no layer has an MLIR location (the compiler JSON's keys)"
        if mlir.get("status") == "error":
            message = (str(mlir.get("message") or "").strip().splitlines() or ["no message"])[0][:NOTE_CHARS]
            cause += f": the full-model MLIR import failed ({message})"
    elif not recommended:
        skipped = sum(1 for op in ops.values() if op.get("skipped_reason"))
        cause = ("no executor passed any layer" + (f" ({skipped} layer(s) skipped)" if skipped else "")
                 + "; each verdict is in work/<model>/layers/<slug>/<executor>/result.json")
    else:
        cause = (f"the {len(recommended)} layer(s) with a recommended executor have no MLIR location, and the "
                 f"{len(located)} with one have no recommended executor")
    return f"the compiler JSON assigns no op to an executor although the model has {n} layer(s): {cause}"


def discovery_report_of(report: Mapping) -> dict:
    """A report's ``discovery_report`` computed from its ``ops`` (:func:`summarize`,
    :func:`trust_lists`): the one source of the summaries shown to a person (the render
    step, ``view``, the HTML page), so that a report whose stored summary is incomplete or
    out of date (the original tool's older reports: no ``executor_counts``)
    shows what its layers say. Kept from the stored summary, as the layers cannot tell:
    the recommendation rule and ``distinct_layers_tested`` (what discovery tested)."""
    ops = report.get("ops") or {}
    before = (report.get("discovery_report") or {}).get("summary") or {}
    rule = before.get("recommendation_rule")
    summary, critical = summarize(ops, executor_names(report),
                                  recommend_by_timing=None if rule not in ("timing", "priority") else rule == "timing")
    if "distinct_layers_tested" in before:
        summary["distinct_layers_tested"] = before["distinct_layers_tested"]
    return {"summary": summary, "critical_failures": critical, **trust_lists(ops)}


def render_report(report: dict, *, full_model: Mapping | None = None, rederive: bool = True) -> dict:
    """The one render step of a stored report, in place; returns its compiler JSON
    (:func:`build_compiler_json`).

    ``rederive`` (``edit``: the user's choices changed): ``discovery_report``,
    ``has_critical_failures`` and ``final_report_text`` are computed again from ``ops``.
    ``full_model`` (``run``: the section of a whole-model run) replaces the report's.
    A report with a full-model result keeps its comparison at the end of
    ``final_report_text`` ("--- Full Model Comparison ---"); when a layer the run
    placed is now recommended on another executor, the section gets ``stale`` (the
    reason, :func:`~torq_gen_config.fullrun.report_section.stale_reason`) and the text says OUT OF DATE.
    """
    if rederive:
        report["discovery_report"] = discovery_report_of(report)
        report["has_critical_failures"] = bool(report["discovery_report"]["critical_failures"])
        report["final_report_text"] = render_final_report_text(report)
    if full_model is not None:
        report["full_model"] = full_model
    if report.get("full_model"):
        # imported only here: editing a report without a full-model result imports no
        # backend (tests/unit/report/test_edit.py)
        from ..fullrun.report_section import stale_reason, with_full_model_text

        section = report["full_model"]
        section.pop("stale", None)
        reason = stale_reason(section, report.get("ops") or {})
        if reason:  # an edit moved a layer the run placed: the comparison is not of this assignment
            section["stale"] = reason
        report["final_report_text"] = with_full_model_text(report.get("final_report_text") or "", section)
    return build_compiler_json(report)

