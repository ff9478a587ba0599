"""The summary of a report's verdicts: status counts, recommendations per executor,
timing statistics, critical failures, and what the verdicts cannot vouch for (the trust
lists). Read by the report builder, the text renderer, view and edit."""

from __future__ import annotations

from typing import Mapping

from ..core.statuses import STATUSES
from .recommend import (
    REASON_NO_TIMING,
    duration_ms,
    is_critical_failure,
    is_inconclusive,
    is_reference_fallback,
    is_timing_reason,
    reference_used,
    runtime_median_ms,
)


def _timing_stats(values: list[float]) -> dict:
    return {
        "avg_ms": round(sum(values) / len(values), 3),
        "min_ms": round(min(values), 3),
        "max_ms": round(max(values), 3),
        "samples": len(values),
    }


def summarize(report_ops: Mapping[str, Mapping], executor_names: list[str],
              recommend_by_timing: bool | None = None) -> tuple[dict, list]:
    """Discovery summary and critical failures of a report's ``ops``.

    Returns:
        ``(summary, critical_failures)``. ``summary`` has ``total_layers``;
        ``status_counts`` (``success``, ``difference``, ``error``,
        ``unverified``: counts of (layer, executor) pairs); ``executor_counts``
        (per configured executor, the number of layers it is recommended for,
        user choices included); ``no_recommendation`` (layers without one);
        ``skipped_layers``; ``unverified_recommendations`` (layers whose
        recommendation rests on an unverified run); ``user_recommendations``;
        ``timing_summary`` (per executor with timings of runs that did not
        end in ``error``: ``run_ms`` and ``compile_ms`` stats ``{avg_ms,
        min_ms, max_ms, samples}`` in milliseconds; with measured runtimes
        also ``runtime_ms``, the same stats over the layers' runtime medians,
        and ``runtime_samples_ms`` over every timed sample);
        ``recommendations_by_timing`` and ``timing_fallback_layers`` (layers
        whose ``recommendation_reason`` is a timing choice, and those where
        ``recommend_by_timing`` fell back to priority for lack of timing
        data); ``recommendation_rule`` (``"timing"`` or ``"priority"``: given
        by ``recommend_by_timing``, else inferred from the reasons) and
        ``notes`` (sentences for people, e.g. the fallback). ``critical_failures`` lists, in report order, the layers
        where every tested executor has status ``error``:
        ``{layer_id, node_index, mlir_location, error_details: {executor:
        {status, stage, summary}}}``. Source: docs/original_tool.md,
        'Report JSON'.
    """
    status_counts = {s: 0 for s in STATUSES}
    executor_counts = {name: 0 for name in executor_names}
    no_rec = skipped = unverified_rec = user_rec = 0
    run_times: dict[str, list[float]] = {name: [] for name in executor_names}
    compile_times: dict[str, list[float]] = {name: [] for name in executor_names}
    runtime_medians: dict[str, list[float]] = {name: [] for name in executor_names}
    runtime_samples: dict[str, list[float]] = {name: [] for name in executor_names}
    by_timing = fallback = 0
    critical: list[dict] = []
    for layer_id, op in report_ops.items():
        execs = op.get("executors") or {}
        for name, entry in execs.items():
            status = entry.get("status")
            if status in status_counts:
                status_counts[status] += 1
            timing = entry.get("timing") or {}
            # timings of failed runs are not comparable; copied verdicts (--dedup-layers)
            # were not measured again
            if name in run_times and status != "error" and not op.get("duplicate_of"):
                if duration_ms(timing.get("run_ms")) is not None:
                    run_times[name].append(float(timing["run_ms"]))
                if duration_ms(timing.get("compile_ms")) is not None:
                    compile_times[name].append(float(timing["compile_ms"]))
                median = runtime_median_ms(entry)
                if median is not None:
                    runtime_medians[name].append(median)
                    runtime_samples[name].extend(v for v in (duration_ms(x) for x in timing.get("samples_ms") or [])
                                                 if v is not None)
        reason = op.get("recommendation_reason")
        if op.get("recommendation_source") != "user":
            if is_timing_reason(reason):
                by_timing += 1
            elif reason == REASON_NO_TIMING:
                fallback += 1
        rec = op.get("recommended_executor")
        if rec is None:
            no_rec += 1
        elif rec in executor_counts:
            executor_counts[rec] += 1
        if rec is not None and (execs.get(rec) or {}).get("status") == "unverified":
            unverified_rec += 1
        if op.get("recommendation_source") == "user":
            user_rec += 1
        if op.get("skipped_reason"):
            skipped += 1
        if execs and is_critical_failure(execs):
            details = {}
            for name, entry in execs.items():
                fr = entry.get("failure_report") or {}
                details[name] = {"status": entry.get("status"), "stage": fr.get("stage"),
                                 "summary": fr.get("summary")}
            critical.append({
                "layer_id": layer_id,
                "node_index": op.get("_node_index"),
                "mlir_location": op.get("mlir_location"),
                "error_details": details,
            })
    timing_summary = {}
    for name in executor_names:
        stats = {}
        if run_times[name]:
            stats["run_ms"] = _timing_stats(run_times[name])
        if compile_times[name]:
            stats["compile_ms"] = _timing_stats(compile_times[name])
        if runtime_medians[name]:
            stats["runtime_ms"] = _timing_stats(runtime_medians[name])
        if runtime_samples[name]:
            stats["runtime_samples_ms"] = _timing_stats(runtime_samples[name])
        if stats:
            timing_summary[name] = stats
    trust = trust_lists(report_ops)
    summary = {
        "total_layers": len(report_ops),
        "not_testable_layers": len(trust["not_testable"]),
        "reference_failures": len(trust["reference_failures"]),
        "reference_fallbacks": len(trust["reference_fallbacks"]),
        "reference_disputes": len(trust["reference_disputes"]),
        "inconclusive_checks": len(trust["inconclusive_checks"]),
        "blind_spot_layers": len(trust["blind_spots"]),
        "generated_input_layers": len(trust["generated_inputs"]),
        "status_counts": status_counts,
        "executor_counts": executor_counts,
        "no_recommendation": no_rec,
        "skipped_layers": skipped,
        "unverified_recommendations": unverified_rec,
        "user_recommendations": user_rec,
        "timing_summary": timing_summary,
    }
    if recommend_by_timing is None:
        recommend_by_timing = bool(by_timing or fallback)
    summary["recommendation_rule"] = "timing" if recommend_by_timing else "priority"
    summary["recommendations_by_timing"] = by_timing
    summary["timing_fallback_layers"] = fallback
    notes = []
    if fallback:
        notes.append(f"recommend_by_timing: {fallback} layer(s) had no runtime timing data and were recommended "
                     "by priority order instead (collect it with --collect-timing / collect_timing: true)")
    summary["notes"] = notes
    return summary, critical


def success_note(summary: Mapping) -> str:
    """What to add after the ``success`` count of ``summary["status_counts"]``: how many
    of those successes are ``success*`` (their comparison could not have failed,
    :func:`trust_lists`), e.g. ``" (6 of them success*: could not have failed)"``; empty
    when none are."""
    n = summary.get("inconclusive_checks") or 0
    return f" ({n} of them success*: could not have failed)" if n else ""


def status_counts_line(summary: Mapping) -> str:
    """``summary["status_counts"]`` as one line, success* counted within success:
    ``"success 198 (6 of them success*: could not have failed), difference 0, ..."``."""
    counts = summary.get("status_counts") or {}
    return ", ".join(f"{status} {n}" + (success_note(summary) if status == "success" else "")
                     for status, n in counts.items())


def trust_lists(report_ops: Mapping[str, Mapping]) -> dict:
    """What the verdicts of a report cannot vouch for, per layer, in report order.

    Returns:
        ``{"not_testable": [{layer_id, node_index, reason}]`` (layers with an unknown
        input/output type: no verdicts), ``"reference_failures": [{layer_id, engine,
        engine_version, message}]`` (no reference ran: the layer's verdicts are
        ``unverified``), ``"reference_fallbacks": [{layer_id, engine, used, message,
        fallback}]`` (ONNX Runtime, the configured reference, failed and the layer was
        judged against onnx's reference implementation, without a second opinion:
        :func:`~torq_gen_config.report.recommend.reference_used`), ``"reference_disputes": [{layer_id, summary,
        agree_with: {engine: [executors]}}]`` (ONNX Runtime and the ONNX reference
        implementation disagree), ``"inconclusive_checks": [{layer_id, executor,
        reason}]`` (a success whose comparison could not have failed,
        docs/comparison.md), ``"generated_inputs": [{layer_id, reason}]`` (layers
        whose inputs could not come from the whole-model run), ``"blind_spots":
        [{layer_id, reason}]`` (layers whose reference repeats along an axis: a
        permutation along it would pass, :func:`torq_gen_config.compare.elementwise.uniform_axes`)}``.
    """
    out: dict[str, list] = {"not_testable": [], "reference_failures": [], "reference_fallbacks": [],
                            "reference_disputes": [], "inconclusive_checks": [], "generated_inputs": [],
                            "blind_spots": []}
    for layer_id, op in report_ops.items():
        if op.get("not_testable_reason"):
            out["not_testable"].append({"layer_id": layer_id, "node_index": op.get("_node_index"),
                                        "reason": op["not_testable_reason"]})
        ref = op.get("reference") or {}
        if is_reference_fallback(ref):
            out["reference_fallbacks"].append({"layer_id": layer_id, "engine": ref.get("engine"),
                                               "used": reference_used(ref), "message": ref.get("message"),
                                               "fallback": ref.get("fallback")})
        elif ref.get("status") not in (None, "ok"):
            out["reference_failures"].append({"layer_id": layer_id, "engine": ref.get("engine"),
                                              "engine_version": ref.get("engine_version"),
                                              "message": ref.get("message")})
        if ref.get("dispute"):
            agree: dict[str, list] = {}
            for name, entry in (op.get("executors") or {}).items():
                for engine in (entry.get("reference_check") or {}).get("agrees_with") or []:
                    agree.setdefault(engine, []).append(name)
            out["reference_disputes"].append({"layer_id": layer_id, "summary": ref["dispute"]["summary"],
                                              "agree_with": agree})
        how = ref.get("layer_inputs") or ""
        if how.startswith("generated"):
            out["generated_inputs"].append({"layer_id": layer_id, "reason": how})
        blind = None
        for name, entry in (op.get("executors") or {}).items():
            if entry.get("status") == "success" and is_inconclusive(entry):
                reasons = (entry.get("metrics") or {}).get("inconclusive_reasons") or ["the comparison could not fail"]
                out["inconclusive_checks"].append({"layer_id": layer_id, "executor": name, "reason": reasons[0]})
            blind = blind or ((entry.get("metrics") or {}).get("blind_spots") or [None])[0]
        if blind:  # a property of the layer's reference: the same for every executor compared with it
            out["blind_spots"].append({"layer_id": layer_id, "reason": blind})
    return out
