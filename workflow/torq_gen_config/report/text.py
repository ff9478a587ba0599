"""Plain-text summary stored as ``final_report_text`` in the report JSON.

Section order follows the original tool's final report
(docs/original_tool.md, 'Final report text'): title, model and layer count; status
summary; recommended executor distribution (with the recommendation rule and
its notes, e.g. a by-timing fallback); runtime per executor when timing was
collected; critical failures; per-layer table. Executor columns come from the
report's configured executors, never from a fixed list. No colour codes.
"""

from __future__ import annotations

from typing import Mapping

from ..compare import shown_status
from ..core.statuses import STATUSES
from ..model.symbolic_dims import guessed_dims
from ..reference.reference_run import engine_label
from .recommend import is_reference_fallback
from .summary import success_note, summarize, trust_lists

__all__ = ["render_final_report_text", "trust_lines", "LAYER_COLUMN_MAX"]

LAYER_COLUMN_MAX = 60
"""Layer ids longer than this are cut (ending in "...") in the table."""



def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_final_report_text(report: Mapping) -> str:
    """Render the final discovery report of a report dict as plain text.

    Uses ``report["model_name"]``, ``report["executors"]`` (column order),
    ``report["ops"]`` and ``report["discovery_report"]`` (recomputed with
    :func:`~torq_gen_config.report.summary.summarize` when absent, e.g. after an
    edit). Missing statuses / recommendations show as ``-``; a recommendation
    chosen by a person is marked ``(user)``, one that rests on an unverified
    run ``(unverified)``, one on a layer judged against onnx's reference
    implementation because ONNX Runtime failed ``(judged against onnx)``.

    Returns:
        The text, lines separated by ``\\n``, ending with a newline.
    """
    ops: Mapping[str, Mapping] = report.get("ops") or {}
    executors = list(report.get("executors") or [])
    if not executors:  # older reports: columns from the executors present
        for op in ops.values():
            for name in op.get("executors") or {}:
                if name not in executors:
                    executors.append(name)
    discovery = report.get("discovery_report")
    if not discovery or "summary" not in discovery:
        summary, critical = summarize(ops, executors)
    else:
        summary = discovery["summary"]
        critical = discovery.get("critical_failures") or []

    lines = [
        "=" * 72,
        "FINAL EXECUTOR DISCOVERY REPORT",
        "=" * 72,
        f"Model: {report.get('model_name')}",
        f"Total layers tested: {_tested_layers(summary, ops)}" + _copied_note(ops),
    ]
    folded = report.get("folded_nodes") or []
    if folded:
        kinds: dict[str, int] = {}
        for f in folded:
            kinds[f.get("op_type")] = kinds.get(f.get("op_type"), 0) + 1
        lines.append(f"Constant nodes folded into the layers that read them (not layers): {len(folded)} "
                     f"({', '.join(f'{k}: {v}' for k, v in sorted(kinds.items()))})")
    for u in report.get("unavailable_executors") or []:  # once per executor, not once per layer
        lines.append(f"Executor {u.get('name')} ({u.get('backend')}): unavailable on this machine, not tested: "
                     f"{u.get('reason')}")
    untested = summary.get("total_layers", len(ops)) - _tested_layers(summary, ops)
    if untested:
        lines.append(f"Layers in the model: {summary.get('total_layers', len(ops))} ({untested} not tested: "
                     f"{summary.get('not_testable_layers', 0)} not testable, {summary.get('skipped_layers', 0)} skipped)")
    lines.append("")

    lines.append("Status Summary (one verdict per (layer, executor) pair):")
    counts = summary.get("status_counts") or {}
    for status in STATUSES:
        lines.append(f"  {status}: {counts.get(status, 0)}" + (success_note(summary) if status == "success" else ""))
    lines.append("")

    rule = summary.get("recommendation_rule")
    if rule == "timing":
        lines.append("Recommendation rule: by timing (fastest success, else fastest difference; "
                     f"{summary.get('recommendations_by_timing', 0)} layer(s) chosen by runtime)")
    lines.append("Recommended Executor Distribution:")
    exec_counts = summary.get("executor_counts") or {}
    for name in executors:
        lines.append(f"  {name}: {exec_counts.get(name, 0)}")
    lines.append(f"  (none): {summary.get('no_recommendation', 0)}")
    if summary.get("unverified_recommendations"):
        lines.append(
            f"  note: {summary['unverified_recommendations']} recommendation(s) rest on unverified runs "
            "(the reference failed, outputs were not compared)"
        )
    if summary.get("user_recommendations"):
        lines.append(f"  note: {summary['user_recommendations']} recommendation(s) set by a person")
    for note in summary.get("notes") or []:
        lines.append(f"  note: {note}")
    lines.append("")

    timing = summary.get("timing_summary") or {}
    runtime_rows = [(n, (timing.get(n) or {}).get("runtime_ms")) for n in executors]
    runtime_rows = [(n, st) for n, st in runtime_rows if st]
    if runtime_rows:
        lines.append("Runtime per layer (median of the timed runs, ms; collect_timing):")
        for name, st in runtime_rows:
            lines.append(f"  {name}: avg {st['avg_ms']:.3f}, min {st['min_ms']:.3f}, max {st['max_ms']:.3f} "
                         f"({st['samples']} layer(s))")
        lines.append("")

    lines.extend(trust_lines(report))
    if critical:
        lines.append(f"CRITICAL: {len(critical)} layer(s) with ALL executors ERRORS (no executor ran the layer)")
        chosen = guessed_dims(((report.get("provenance") or {}).get("model") or {}).get("fixed_dims") or [])
        for item in critical:
            lines.append(f"  - {item.get('layer_id')} (node: {item.get('node_index')})"
                         + _no_reference_note((ops.get(item.get("layer_id")) or {}).get("reference"), bool(chosen)))
    elif not ops:
        lines.append("No layers: every node of the model computes a constant (folded above); nothing was tested")
    elif summary.get("not_testable_layers"):
        lines.append("No critical failures - every tested layer has an executor that ran it "
                     f"({summary['not_testable_layers']} layer(s) not testable, above)")
    else:
        lines.append("No critical failures - all layers have at least one working executor")
    no_success = [lid for lid, op in ops.items()
                  if op.get("executors") and not any(e.get("status") == "success" for e in op["executors"].values())
                  and any(e.get("status") == "difference" for e in op["executors"].values())]
    if no_success:
        lines.append(f"WARNING: {len(no_success)} layer(s) run on every executor but none within tolerance "
                     f"(best verdict: difference): {', '.join(no_success[:10])}{' ...' if len(no_success) > 10 else ''}")
    lines.append("")

    lines.extend(_layer_table(ops, executors))
    return "\n".join(lines) + "\n"


def _tested_layers(summary: Mapping, ops: Mapping) -> int:
    """Layers with verdicts: all but the skipped (skip_ops) and the not testable ones."""
    return (summary.get("total_layers", len(ops)) - int(summary.get("skipped_layers") or 0)
            - int(summary.get("not_testable_layers") or 0))


def _copied_note(ops: Mapping) -> str:
    """`` (N of them copy the verdicts of an identical layer: --dedup-layers)`` when some do."""
    copies = sum(1 for op in ops.values() if op.get("duplicate_of"))
    return f" ({copies} of them copy the verdicts of an identical layer: --dedup-layers)" if copies else ""


#: Items listed per trust section before "... N more".
TRUST_ITEMS = 10


def trust_lines(report: Mapping) -> list[str]:
    """What the verdicts rest on and where they cannot vouch for themselves, as plain
    lines (the final report text and ``view`` show the same): the reference engines
    and versions, how the compiled modules got the weights (inline or as parameters),
    where the layer inputs came from, the input dims that were given
    values, layers not testable, reference failures, reference disputes and
    inconclusive checks (:func:`torq_gen_config.report.summary.trust_lists`). Ends with
    an empty line; empty for reports without provenance or such lists."""
    prov = report.get("provenance") or {}
    lines: list[str] = []
    ref = prov.get("reference") or {}
    versions = prov.get("versions") or {}
    if ref:
        engine = ref.get("engine") or "onnxruntime"
        ort_v = ", ".join(ref.get("ort_versions") or []) or versions.get("onnxruntime") or "?"
        onnx_v = ref.get("onnx_version") or versions.get("onnx") or "?"
        ort = f"ONNX Runtime {ort_v} (CPU, graph optimizations off)"
        spec = f"the ONNX reference implementation (onnx {onnx_v})"
        first, second = (ort, spec) if engine == "onnxruntime" else (spec, ort)
        # the fallback rule: the spec stands in for ONNX Runtime, never the other way round
        rule = ("; a layer ONNX Runtime fails on is judged against the latter" if engine == "onnxruntime"
                else "; a layer the spec fails on is unverified")
        lines.append(f"Reference: {first}; second opinion: {second}{rule}")
    weights = prov.get("parameters") or {}
    if weights.get("mode"):  # docs/parameters.md
        how = ("IREE parameters, loaded from the weight store when a module is loaded" if weights["mode"] == "external"
               else "constants of each compiled module")
        lines.append(f"Weights: {weights['mode']} ({weights.get('reason')}): {how}")
    options = prov.get("options") or {}
    model = prov.get("model") or {}
    source = (model.get("model_inputs") or {}).get("source")
    if options.get("layer_inputs") == "propagate":
        lines.append(f"Layer inputs: from the whole-model reference run; model inputs: {source or 'generated'}")
    elif options.get("layer_inputs") == "random":
        lines.append("Layer inputs: generated per layer (op-aware, seeded; --layer-inputs random)")
    run = (prov.get("layer_inputs_run") or {}).get("run") or model.get("model_run") or {}
    fallback_nodes, failed_nodes = run.get("fallback_nodes") or [], run.get("failed_nodes") or []
    if fallback_nodes or failed_nodes:
        def names(nodes):
            return ", ".join(f"{n['op_type']} {n.get('name') or n.get('graph_index')}" for n in nodes[:5]) + (
                " ..." if len(nodes) > 5 else "")
        parts = []
        if fallback_nodes:
            parts.append(f"{len(fallback_nodes)} node(s) evaluated by the ONNX reference implementation where ONNX "
                         f"Runtime failed ({names(fallback_nodes)})")
        if failed_nodes:
            parts.append(f"{len(failed_nodes)} node(s) neither engine could evaluate ({names(failed_nodes)})")
        lines.append(f"Whole-model reference run: {'; '.join(parts)}")
    opset = model.get("opset") or {}
    if opset.get("upgrade_undone"):
        lines.append(f"Opset: the model stays at opset {opset.get('original')}: an upgrade would change its signature "
                     f"({_cut(str(opset['upgrade_undone']), 200)})")
    fixed = model.get("fixed_dims") or []
    if fixed:
        parts = [f"{d['input']} dim {d['axis']} ({d['was']}) -> {d.get('to', 1)} ({d.get('source') or 'default 1'})"
                 for d in fixed[:TRUST_ITEMS]]
        more = f", ... {len(fixed) - TRUST_ITEMS} more" if len(fixed) > TRUST_ITEMS else ""
        lines.append(f"Symbolic input dims set: {', '.join(parts)}{more}")
    trust = report.get("discovery_report") or {}
    if "not_testable" not in trust:
        trust = trust_lists(report.get("ops") or {})

    def section(title: str, items: list, fmt) -> None:
        if not items:
            return
        lines.append(title)
        for item in items[:TRUST_ITEMS]:
            lines.append(f"  - {fmt(item)}")
        if len(items) > TRUST_ITEMS:
            lines.append(f"  ... {len(items) - TRUST_ITEMS} more (see discovery_report in the report JSON)")

    section(f"NOT TESTABLE: {len(trust.get('not_testable') or [])} layer(s) have no verdicts (a tensor's type or "
            "shape is unknown):", trust.get("not_testable") or [],
            lambda x: f"{x['layer_id']}: {_cut(str(x['reason']), 300)}")
    section(f"REFERENCE FAILED on {len(trust.get('reference_failures') or [])} layer(s) (an executor that ran there "
            "is unverified, not at fault; compile errors stay errors):", trust.get("reference_failures") or [],
            lambda x: f"{x['layer_id']}: {_cut(str(x.get('message') or ''), 300)}")
    section(f"REFERENCE FALLBACK: {len(trust.get('reference_fallbacks') or [])} layer(s) judged against onnx's "
            "reference implementation, with no second opinion (ONNX Runtime failed on them):",
            trust.get("reference_fallbacks") or [], _fallback_item)
    section(f"REFERENCE DISPUTES: {len(trust.get('reference_disputes') or [])} layer(s) where ONNX Runtime and the "
            "ONNX reference implementation disagree:", trust.get("reference_disputes") or [],
            lambda x: f"{x['layer_id']}: {_cut(str(x['summary']), 400)}" + "".join(
                f"; agree with {engine_label(e)}: {', '.join(v)}" for e, v in (x.get("agree_with") or {}).items()))
    section(f"INCONCLUSIVE: {len(trust.get('inconclusive_checks') or [])} success verdict(s) could not have failed "
            "(marked success* below):", trust.get("inconclusive_checks") or [],
            lambda x: f"{x['layer_id']} on {x['executor']}: {_cut(str(x['reason']), 200)}")
    hint = layer_inputs_hint(report, len(trust.get("inconclusive_checks") or []))
    if hint:
        lines.append(f"  {hint}")
    section(f"BLIND SPOTS: {len(trust.get('blind_spots') or [])} layer(s) whose reference repeats along an axis "
            "(their verdicts cannot see a permutation or a wrong index along it):", trust.get("blind_spots") or [],
            lambda x: f"{x['layer_id']}: {_cut(str(x['reason']), 200)}")
    dups = [(lid, op["duplicate_of"]) for lid, op in (report.get("ops") or {}).items() if op.get("duplicate_of")]
    section(f"DEDUPLICATED: {len(dups)} layer(s) copy the verdicts of a layer with the same signature "
            "(--dedup-layers; not tested on their own inputs):", dups, lambda x: f"{x[0]}: copied from {x[1]}")
    section(f"GENERATED INPUTS: {len(trust.get('generated_inputs') or [])} layer(s) could not get their inputs from "
            "the whole-model run:", trust.get("generated_inputs") or [],
            lambda x: f"{x['layer_id']}: {_cut(str(x['reason']), 200)}")
    if lines:
        lines.append("")
    return lines


#: share of a report's verdicts that are success* from which the listing suggests
#: --layer-inputs random (activations that vanish or saturate: random or untrained weights)
INCONCLUSIVE_HINT_SHARE = 0.10


def layer_inputs_hint(report: Mapping, inconclusive: int) -> str | None:
    """The suggestion to test each layer on generated inputs, when at least
    :data:`INCONCLUSIVE_HINT_SHARE` of the verdicts (and 3 or more) are ``success*`` with
    the whole model's values as layer inputs (``--layer-inputs propagate``): there, values
    that vanish or saturate through the model (random or untrained weights) give
    comparisons that could not have failed; None otherwise."""
    options = (report.get("provenance") or {}).get("options") or {}
    if options.get("layer_inputs", "propagate") != "propagate" or inconclusive < 3:
        return None
    total = sum(len(op.get("executors") or {}) for op in (report.get("ops") or {}).values())
    if not total or inconclusive < INCONCLUSIVE_HINT_SHARE * total:
        return None
    return (f"{inconclusive} of {total} verdicts could not have failed on the whole model's values (activations "
            "that vanish or saturate, as with random or untrained weights): `discover --layer-inputs random` "
            "tests each layer on generated inputs instead")


def _fallback_item(item: Mapping) -> str:
    """"<layer>: judged against onnx's reference implementation (ONNX Runtime failed: ...)"."""
    line = str(item.get("fallback") or "")
    why = line.split(" (", 1)[1][:-1] if " (" in line and line.endswith(")") else "ONNX Runtime failed"
    return f"{item['layer_id']}: judged against onnx's reference implementation ({_cut(why, 300)})"


def _status_cell(entry: Mapping) -> str:
    status = shown_status(entry)
    return str(status) if status else "-"


def _recommended_cell(op: Mapping) -> str:
    rec = op.get("recommended_executor")
    if rec is None:
        return "(not testable)" if op.get("not_testable_reason") else "-"
    if op.get("recommendation_source") == "user":
        return f"{rec} (user)"
    if ((op.get("executors") or {}).get(rec) or {}).get("status") == "unverified":
        return f"{rec} (unverified)"
    if op.get("duplicate_of"):
        return f"{rec} (copied from {_cut(str(op['duplicate_of']), 30)})"
    if (op.get("reference") or {}).get("dispute"):
        return f"{rec} (references disagree)"
    if is_reference_fallback(op.get("reference")):
        return f"{rec} (judged against onnx)"
    return str(rec)


def _layer_table(ops: Mapping[str, Mapping], executors: list[str]) -> list[str]:
    layer_w = max([len("Layer")] + [min(len(str(k)), LAYER_COLUMN_MAX) for k in ops])
    col_w = {name: max(12, len(name) + 2) for name in executors}
    header = "Layer".ljust(layer_w) + "  " + "".join(n.ljust(col_w[n]) for n in executors) + "Recommended"
    out = ["Per-Layer Status:", header, "-" * len(header)]
    for layer_id, op in ops.items():
        execs = op.get("executors") or {}
        cells = "".join(_status_cell(execs.get(n) or {}).ljust(col_w[n]) for n in executors)
        out.append(_cut(str(layer_id), LAYER_COLUMN_MAX).ljust(layer_w) + "  " + cells + _recommended_cell(op))
    return out


def _no_reference_note(reference: Mapping | None, sizes_chosen: bool) -> str:
    """For a critical layer whose reference failed too (no engine computed it): the layer
    itself may not take these inputs, which the executors' errors then only repeat; with
    input sizes the tool chose (``guessed_dims``), those sizes are the first suspect."""
    if not reference or reference.get("used") is not None or reference.get("status") in (None, "ok"):
        return ""
    return ("; the reference failed on it too, so the layer may not take these inputs"
            + (" (input sizes the tool chose: give the model's with --input-shapes)" if sizes_chosen else ""))
