"""The ``view --layer`` text: one layer with every executor's verdict, metrics, failure and
timing."""

from __future__ import annotations

from typing import Any, Mapping


from ..compare import REL_DIFF_THRESHOLDS, count_over_tolerance
from ..core.lazy import rich_console, rich_text
from ..reference.reference_run import engine_label
from .layer_select import find_layer
from .cells import executor_names
from .recommend import is_inconclusive, is_reference_fallback, reference_used
from .view_format import (
    _LOCATION_RE, _MESSAGE_LINE_CHARS, _MESSAGE_LINES, _cut, _fmt_ms, _fmt_num, _fmt_tol, _line,
    _recommended_text, _status_text,
)


def _over_tolerance_text(metrics: Mapping, tolerance: Mapping | None) -> str | None:
    try:
        count, share = count_over_tolerance(metrics, tolerance)
    except (ValueError, TypeError, KeyError):
        return None
    n = sum(int(o.get("num_elements") or 0) for o in metrics.get("outputs") or []
            if not (o.get("missing_output") or o.get("shape_mismatch")))
    text = f"{count:,} of {n:,} ({100.0 * share:.2f}%)"
    has_float = any(o.get("kind") == "float" for o in metrics.get("outputs") or [])
    if has_float and tolerance and float(tolerance.get("fp_max_tol", 0.01)) not in REL_DIFF_THRESHOLDS:
        text += " (at most; counted at the nearest stored threshold below fp_max_tol)"
    return text


def _message_lines(message: Any) -> list[str]:
    if not message:
        return []
    lines = [ln.rstrip() for ln in str(message).splitlines() if ln.strip()]
    out = [_cut(ln, _MESSAGE_LINE_CHARS) for ln in lines[:_MESSAGE_LINES]]
    if len(lines) > _MESSAGE_LINES:
        out.append(f"... ({len(lines) - _MESSAGE_LINES} more line(s); see the report JSON or work/logs/)")
    return out


def _nonfinite_equal_text(metrics: Mapping) -> str | None:
    """What the differences above leave out: NaN/inf elements that output and reference
    have at the same positions (equal: not a difference; the diffs are over the finite
    elements only), or None when there are none."""
    outs = [o for o in metrics.get("outputs") or [] if o.get("num_nonfinite_equal")]
    if not outs:
        return None
    n = sum(o["num_nonfinite_equal"] for o in outs)
    total = sum(o.get("num_elements") or 0 for o in outs)
    return (f"{n} of {total} element(s) NaN/inf in both output and reference (equal); the diffs above are over "
            "the finite ones")


def render_layer(report: Mapping, layer: str, console: rich_console.Console) -> None:
    """Details of one layer (exact ID, else case-insensitive).

    Raises:
        ReportError: no such layer; the message lists close IDs.
    """
    ops: Mapping[str, Mapping] = report.get("ops") or {}
    lid = find_layer(list(ops), layer)
    op = ops[lid]
    names = executor_names(report)

    _line(console, "=" * 72)
    _line(console, f"LAYER: {lid}", style="bold")
    _line(console, "=" * 72)
    _line(console, f"Node index:     {op.get('_node_index')}")
    _line(console, f"Op type:        {op.get('op_type') or '-'}")
    loc = op.get("mlir_location")
    loc_text = str(loc) if loc is not None else "-"
    if isinstance(loc, str) and not _LOCATION_RE.match(loc):
        loc_text += " (no MLIR line:col; not in the compiler JSON)"
    elif report.get("mlir_file"):
        loc_text += f" (in {report['mlir_file']})"
    _line(console, f"MLIR location:  {loc_text}")
    if op.get("quantized_op_type"):
        _line(console, f"Quantized op:   {op['quantized_op_type']} (in the quantized full model)")
    if op.get("note"):
        _line(console, f"Note:           {op['note']}")
    if op.get("mac_count") is not None:
        _line(console, f"MACs:           {_fmt_num(int(op['mac_count']))}")
    rec = rich_text.Text("Recommended:    ")
    rec.append_text(_recommended_text(op))
    if op.get("recommendation_source") == "user":
        rec.append("  (set by a person with 'edit')")
    else:
        rec.append("  (chosen by discovery)")
    console.print(rec)
    if op.get("user_recommendation_dropped") is not None:
        _line(console, f"Note: the earlier person-made choice {op['user_recommendation_dropped']!r} "
                       "is no longer a configured executor and was dropped")
    if op.get("tolerance_override"):
        _line(console, f"Tolerance:      override {_fmt_tol(op['tolerance_override'])} (set by a person)")
    else:
        _line(console, f"Tolerance:      default {_fmt_tol(report.get('default_tolerance'))}")
    if op.get("skipped_reason"):
        _line(console, f"Skipped:        {op['skipped_reason']}")
    if op.get("duplicate_of"):
        _line(console, f"Duplicate of:   {op['duplicate_of']} (same signature, --dedup-layers): the verdicts below "
                       "are that layer's, on its inputs; this layer was not tested on its own inputs")
    if op.get("not_testable_reason"):
        _line(console, f"Not testable:   {op['not_testable_reason'].removeprefix('not testable: ')}")
    ref = op.get("reference") or {}
    if ref:
        label = f"{engine_label(ref.get('engine') or 'onnxruntime')} {ref.get('engine_version') or ''}".strip()
        _line(console, f"Reference:      {label}: {ref.get('status')}"
                       + (f" - {_cut(str(ref.get('message') or ''), _MESSAGE_LINE_CHARS)}" if ref.get("message") else ""))
        second = ref.get("second") or {}
        if is_reference_fallback(ref):
            # the second engine gave the reference itself: there is no second opinion
            label = f"{engine_label(reference_used(ref))} {second.get('engine_version') or ''}".strip()
            _line(console, f"Judged against: {label}, no second opinion - "
                           f"{_cut(str(ref.get('fallback') or ''), 160)}", style="yellow")
        elif second.get("engine"):
            _line(console, f"Second opinion: {engine_label(second['engine'])} {second.get('engine_version') or ''}: "
                           f"{second.get('status')}" + (f" - {_cut(str(second.get('message') or ''), 160)}"
                                                         if second.get("message") else "")
                           + (" (agrees with the reference within a tenth of the tolerance: its outputs were not "
                              "kept, the executors are compared with the reference only)"
                              if second.get("outputs_kept") is False else ""))
        if ref.get("dispute"):
            _line(console, f"DISPUTED:       {ref['dispute']['summary']}", style="bold yellow")
        if ref.get("layer_inputs"):
            _line(console, f"Inputs:         {ref['layer_inputs']}")

    execs = op.get("executors") or {}
    order = [n for n in names if n in execs] + [n for n in execs if n not in names]
    if not order:
        _line(console)
        _line(console, "No executor was tested on this layer.")
    for name in order:
        entry = execs[name] or {}
        _line(console)
        head = rich_text.Text(f"[{name}] ")
        head.append_text(_status_text(entry.get("status"), is_inconclusive(entry)))
        timing = entry.get("timing") or {}
        if timing.get("compile_ms") is not None or timing.get("run_ms") is not None:
            batch = timing.get("compile_batch") or {}
            share = (f" (1/{batch['members']} of a batch compiled in {_fmt_ms(batch.get('batch_ms'))} ms, "
                     "not measured per layer)" if batch.get("members") else "")
            head.append(f"   compile {_fmt_ms(timing.get('compile_ms'))} ms{share}, "
                        f"run {_fmt_ms(timing.get('run_ms'))} ms")
        console.print(head)
        metrics = entry.get("metrics")
        if metrics:
            _line(console, f"    max abs diff:      {_fmt_num(metrics.get('max_abs_diff'))}")
            _line(console, f"    max rel diff:      {_fmt_num(metrics.get('max_rel_diff'))}")
            _line(console, f"    mean abs diff:     {_fmt_num(metrics.get('mean_abs_diff'))}")
            _line(console, f"    mean rel diff:     {_fmt_num(metrics.get('mean_rel_diff'))}")
            _line(console, f"    cosine similarity: {_fmt_num(metrics.get('cosine_similarity'), '.6f')}")
            over = _over_tolerance_text(metrics, entry.get("tolerance_used"))
            if over is not None:
                _line(console, f"    over tolerance:    {over}")
            nonfinite = _nonfinite_equal_text(metrics)
            if nonfinite:
                _line(console, f"    non-finite:        {nonfinite}")
            for spot in metrics.get("blind_spots") or []:
                _line(console, f"    blind spot:        {_cut(str(spot), _MESSAGE_LINE_CHARS)}", style="yellow")
        elif entry.get("max_diff"):
            md = entry["max_diff"]
            _line(console, f"    max abs diff:      {_fmt_num(md.get('max_abs_diff'))}")
            _line(console, f"    max rel diff:      {_fmt_num(md.get('max_rel_diff'))}")
        if entry.get("status") == "success" and is_inconclusive(entry):
            reasons = (entry.get("metrics") or {}).get("inconclusive_reasons") or ["the comparison could not fail"]
            _line(console, f"    INCONCLUSIVE:      {_cut(str(reasons[0]), _MESSAGE_LINE_CHARS)}", style="yellow")
        check = entry.get("reference_check") or {}
        if check.get("summary"):
            _line(console, f"    references:        {check['summary']}")
        elif entry.get("reference_fallback") and entry.get("metrics"):
            _line(console, "    references:        compared with the ONNX reference implementation only (ONNX "
                           "Runtime failed; no second opinion)")
        fr = entry.get("failure_report")
        if fr:
            _line(console, f"    failure:           {fr.get('type') or '-'} at stage {fr.get('stage') or '-'}")
            if fr.get("summary"):
                _line(console, f"    summary:           {_cut(str(fr['summary']).splitlines()[0] if str(fr['summary']).strip() else '', _MESSAGE_LINE_CHARS)}")
            lines = _message_lines(fr.get("message"))
            if lines and not (len(lines) == 1 and lines[0] == fr.get("summary")):
                _line(console, "    message:")
                for ln in lines:
                    _line(console, f"      {ln}")
        if entry.get("outputs_file"):
            _line(console, f"    outputs kept:      {entry['outputs_file']}")
        _line(console, f"    tolerance used:    {_fmt_tol(entry.get('tolerance_used'))}")
        levels = (entry.get("metrics") or {}).get("quantized_levels")
        if levels:
            _line(console, f"    compared as:       int8 levels of {', '.join(sorted(levels))} (one quantization step "
                           "is within int_atol 1; docs/comparison.md)")

