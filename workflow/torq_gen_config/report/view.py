"""Rendering of report and compiler JSONs for ``torq-gen-config view`` (with rich).

Three views (``notes/reference_tool.md`` section 7, seed 001 section 3):

* :func:`render_summary`: model, status counts, recommendation counts, timing
  summary, critical failures, a per-layer table (one column per configured
  executor, in priority order, plus the recommendation) and the default
  tolerance;
* :func:`render_layer`: one layer with every executor's verdict, metrics,
  failure and timing;
* :func:`render_compiler`: a compiler JSON (``op_assignments``), assignments
  sorted by MLIR line then column as numbers.

All output goes to a :class:`rich.console.Console`. Colours appear only when
the console writes to a terminal; written to a file or a pipe the text is
plain. Text from the JSON (layer IDs, error messages) is never interpreted as
rich markup.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..compare import REL_DIFF_THRESHOLDS, count_over_tolerance
from ..errors import ReportError
from ..fileio import read_json
from .edit import (
    compiler_path_for_model,
    find_layer,
    is_compiler_json,
    report_path_for_model,
)
from .recommend import STATUSES, is_inconclusive
from .text import LAYER_COLUMN_MAX, trust_lines

__all__ = [
    "STATUS_STYLES",
    "make_console",
    "resolve_view_path",
    "load_view_json",
    "render",
    "render_summary",
    "render_layer",
    "render_compiler",
    "sorted_assignments",
]

STATUS_STYLES = {
    "success": "green",
    "difference": "yellow",
    "error": "bold red",
    "unverified": "magenta",
    "skipped": "dim",
}
"""Colour of each status on a terminal."""

_MESSAGE_LINES = 8
_MESSAGE_LINE_CHARS = 200
_LOCATION_RE = re.compile(r"^(\d+):(\d+)$")
_PLAIN_WIDTH = 200


def make_console(file=None, *, force_terminal: bool | None = None) -> Console:
    """A console for the view: colours on a terminal, plain text elsewhere.

    When the output is not a terminal (a file, a pipe, a test's buffer) the
    width is fixed wide (``COLUMNS`` when set, else 200) so tables are not
    wrapped at 80 columns.
    """
    console = Console(file=file, force_terminal=force_terminal, highlight=False)
    if not console.is_terminal:
        width = _PLAIN_WIDTH
        try:
            width = int(os.environ.get("COLUMNS", "")) or width
        except ValueError:
            pass
        console = Console(file=file, force_terminal=force_terminal, highlight=False, width=width,
                          no_color=True)
    return console


# --------------------------------------------------------------------------- loading


def resolve_view_path(report: str | None, model: str | None, output_dir: str | None) -> tuple[Path, str | None]:
    """Path of the JSON to view and an optional note for the user.

    With ``--model``: the report JSON ``<output_dir>/torq_gen_config_<stem>.json``;
    when it is absent, the compiler JSON next to it (with a note).

    Raises:
        ReportError: with ``--model``, neither file exists (both paths named).
        ReportError: neither a path nor ``--model`` was given, or both.
    """
    if report and model:
        raise ReportError("give either a JSON path or --model/--output-dir, not both")
    if report:
        return Path(report).expanduser(), None
    if not model:
        raise ReportError("give a report JSON path, or --model (with --output-dir) to find it")
    out = output_dir or "."
    rpath = report_path_for_model(model, out)
    if rpath.exists():
        return rpath, None
    cpath = compiler_path_for_model(model, out)
    if cpath.exists():
        return cpath, f"note: report JSON {rpath} not found; showing the compiler JSON {cpath}"
    raise ReportError(f"no report JSON {rpath} and no compiler JSON {cpath}; run 'torq-gen-config discover' first")


def load_view_json(path: str | os.PathLike) -> tuple[dict, str]:
    """Read a JSON to view; returns ``(data, kind)`` with kind ``"report"`` or ``"compiler"``.

    Raises:
        ReportError: missing file, invalid JSON, or neither a report nor a compiler JSON.
    """
    data = read_json(path, "JSON file")
    if is_compiler_json(data):
        if not isinstance(data.get("op_assignments"), Mapping):
            raise ReportError(f"{path}: 'op_assignments' must be an object")
        return data, "compiler"
    if isinstance(data, dict) and isinstance(data.get("ops"), Mapping):
        from .build import check_report

        check_report(data, str(path))
        return data, "report"
    raise ReportError(f"{path} is neither a torq-gen-config report JSON ('ops') nor a compiler JSON ('op_assignments')")


# --------------------------------------------------------------------------- helpers


def _cut(text: str, width: int = LAYER_COLUMN_MAX) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _status_text(status: Any, inconclusive: bool = False) -> Text:
    if not status:
        return Text("-")
    if status == "success" and inconclusive:
        return Text("success*", style="yellow")
    return Text(str(status), style=STATUS_STYLES.get(str(status), ""))


def _executor_names(report: Mapping) -> list[str]:
    names = report.get("executors")
    if isinstance(names, list) and names:
        return [str(n) for n in names]
    found: list[str] = []
    for op in (report.get("ops") or {}).values():
        for name in op.get("executors") or {}:
            if name not in found:
                found.append(name)
    return found


def _recommended_text(op: Mapping) -> Text:
    rec = op.get("recommended_executor")
    user = op.get("recommendation_source") == "user"
    if rec is None and op.get("not_testable_reason") and not user:
        return Text("(not testable)", style="magenta")
    if rec is None:
        return Text("- (user)" if user else "-", style="bold" if user else "red")
    if user:
        return Text(f"{rec} (user)", style="bold cyan")
    status = ((op.get("executors") or {}).get(rec) or {}).get("status")
    if status == "unverified":
        return Text(f"{rec} (unverified)", style="magenta")
    if op.get("duplicate_of"):
        return Text(f"{rec} (copied from {_cut(str(op['duplicate_of']), 30)})", style="dim")
    if (op.get("reference") or {}).get("dispute"):
        return Text(f"{rec} (references disagree)", style="yellow")
    return Text(str(rec))


def _fmt_num(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    try:
        return format(float(x), spec)
    except (TypeError, ValueError):
        return str(x)


def _fmt_ms(x: Any) -> str:
    return "-" if x is None else f"{float(x):.1f}"


def _fmt_tol(tol: Mapping | None) -> str:
    if not tol:
        return "-"
    parts = [f"fp_avg_tol={_fmt_num(tol.get('fp_avg_tol'), 'g')}", f"fp_max_tol={_fmt_num(tol.get('fp_max_tol'), 'g')}"]
    if tol.get("bf16_max_tol") is not None and (tol.get("bf16_max_tol"), tol.get("bf16_avg_tol")) != (
            tol.get("fp_max_tol"), tol.get("fp_avg_tol")):
        parts.append(f"bf16_avg_tol={_fmt_num(tol.get('bf16_avg_tol'), 'g')}")
        parts.append(f"bf16_max_tol={_fmt_num(tol.get('bf16_max_tol'), 'g')}")
    if tol.get("int_atol") is not None:
        parts.append(f"int_atol={tol['int_atol']}")
    return ", ".join(parts)


def _print_table(console: Console, table: Table) -> None:
    """Print a table at its natural width, even on a narrower terminal (no cell
    is cut: the terminal wraps long lines instead)."""
    needed = Measurement.get(console, console.options.update(width=10_000), table).maximum
    if needed <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = needed  # rich caps print(width=...) at the console width
    try:
        console.print(table)
    finally:
        console.width = width


def _line(console: Console, text: str = "", style: str | None = None) -> None:
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------- summary


def render_summary(report: Mapping, console: Console) -> None:
    """The report summary: counts, timing, critical failures, per-layer table, tolerance."""
    ops: Mapping[str, Mapping] = report.get("ops") or {}
    names = _executor_names(report)
    discovery = report.get("discovery_report") or {}
    summary = discovery.get("summary")
    critical = discovery.get("critical_failures")
    if summary is None:
        from .build import summarize

        summary, critical = summarize(ops, names)
    critical = critical or []

    _line(console, "=" * 72)
    _line(console, f"MODEL: {report.get('model_name')}", style="bold")
    _line(console, "=" * 72)
    _line(console, f"Layers: {summary.get('total_layers', len(ops))}    "
                   f"Executors (priority order): {', '.join(names) if names else '-'}")
    precision = precision_text(report)
    if precision:
        _line(console, f"Precision: {precision}")
    if summary.get("skipped_layers"):
        _line(console, f"Layers skipped (not tested): {summary['skipped_layers']}")
    _line(console)

    _line(console, "STATUS COUNTS (layer x executor):", style="bold")
    counts = summary.get("status_counts") or {}
    for status in list(STATUSES) + [s for s in counts if s not in STATUSES]:
        row = Text("  ")
        row.append(f"{status}:", style=STATUS_STYLES.get(status, ""))
        row.append(f" {counts.get(status, 0)}")
        console.print(row)
    _line(console)

    _line(console, "RECOMMENDED EXECUTORS:", style="bold")
    exec_counts = summary.get("executor_counts") or {}
    for name in names:
        _line(console, f"  {name}: {exec_counts.get(name, 0)}")
    _line(console, f"  (none): {summary.get('no_recommendation', 0)}")
    if summary.get("user_recommendations"):
        _line(console, f"  set by a person: {summary['user_recommendations']}")
    if summary.get("unverified_recommendations"):
        _line(console, f"  resting on unverified runs: {summary['unverified_recommendations']}")
    _line(console)

    timing = summary.get("timing_summary") or {}
    if timing:
        _line(console, "TIMING SUMMARY (ms; runs that did not end in error):", style="bold")
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("Executor")
        for col in ("compile avg", "min", "max", "n", "run avg", "min", "max", "n"):
            table.add_column(col, justify="right")
        for name in names + [n for n in timing if n not in names]:
            stats = timing.get(name)
            if not stats:
                continue
            cells = [Text(name)]
            for key in ("compile_ms", "run_ms"):
                s = stats.get(key) or {}
                cells += [Text(_fmt_ms(s.get("avg_ms"))), Text(_fmt_ms(s.get("min_ms"))),
                          Text(_fmt_ms(s.get("max_ms"))), Text(str(s.get("samples", "-")))]
            table.add_row(*cells)
        _print_table(console, table)
        _line(console)

    for ln in trust_lines(report):
        _line(console, ln, style="bold" if ln and not ln.startswith(" ") and ln.split(":")[0].isupper() else None)
    if critical:
        _line(console, f"CRITICAL FAILURES (all executors error; no executor ran the layer): {len(critical)}",
              style="bold red")
        for item in critical:
            _line(console, f"  - {item.get('layer_id')} (node: {item.get('node_index')})")
    else:
        _line(console, "CRITICAL FAILURES (all executors error): 0")
    _line(console)

    _line(console, "Per-Layer Status:", style="bold")
    with_override = any(op.get("tolerance_override") for op in ops.values())
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("Layer", no_wrap=True, max_width=LAYER_COLUMN_MAX)
    for name in names:
        table.add_column(name, no_wrap=True, min_width=10)
    table.add_column("Recommended", no_wrap=True)
    if with_override:
        table.add_column("Tolerance override", no_wrap=True)
    for lid, op in ops.items():
        execs = op.get("executors") or {}
        row = [Text(_cut(str(lid)))]
        row += [_status_text((execs.get(n) or {}).get("status"), inconclusive=is_inconclusive(execs.get(n) or {}))
                for n in names]
        row.append(_recommended_text(op))
        if with_override:
            override = op.get("tolerance_override")
            row.append(Text(f"avg={override.get('fp_avg_tol'):g} max={override.get('fp_max_tol'):g}"
                            if override else ""))
        table.add_row(*row)
    _print_table(console, table)
    _line(console)
    _line(console, f"DEFAULT TOLERANCE: {_fmt_tol(report.get('default_tolerance'))}")
    if report.get("full_model"):  # the last `torq-gen-config run`
        from ..full_model import render_full_model_text

        _line(console)
        for ln in render_full_model_text(report["full_model"]).rstrip("\n").splitlines():
            _line(console, ln)


# --------------------------------------------------------------------------- layer details


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


def precision_text(report: Mapping) -> str | None:
    """One line about the precision mode of a report (docs/precision.md), or None."""
    flags = ((report.get("precision") or {}).get("flags") or {})
    parts = []
    if flags.get("auto_convert_bf16"):
        parts.append("bf16 (converted from fp32)")
    if flags.get("auto_convert_int32"):
        parts.append("int32 (converted from int64)")
    if flags.get("quantize"):
        q = (report.get("precision") or {}).get("quantization") or {}
        fmt = q.get("format_used") or flags.get("quant_format")
        extra = [x for x, on in (("per-channel", flags.get("per_channel")), ("full-integer", flags.get("full_integer")))
                 if on]
        parts.append(f"int8 quantized ({fmt}{', ' + ', '.join(extra) if extra else ''}); "
                     "fused layers have no MLIR location")
    return "; ".join(parts) or None


def render_layer(report: Mapping, layer: str, console: Console) -> None:
    """Details of one layer (exact ID, else case-insensitive).

    Raises:
        ReportError: no such layer; the message lists close IDs.
    """
    ops: Mapping[str, Mapping] = report.get("ops") or {}
    lid = find_layer(list(ops), layer)
    op = ops[lid]
    names = _executor_names(report)

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
    rec = Text("Recommended:    ")
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
        from ..reference_run import engine_label

        label = f"{engine_label(ref.get('engine') or 'onnxruntime')} {ref.get('engine_version') or ''}".strip()
        _line(console, f"Reference:      {label}: {ref.get('status')}"
                       + (f" - {_cut(str(ref.get('message') or ''), _MESSAGE_LINE_CHARS)}" if ref.get("message") else ""))
        second = ref.get("second") or {}
        if second.get("engine"):
            _line(console, f"Second opinion: {engine_label(second['engine'])} {second.get('engine_version') or ''}: "
                           f"{second.get('status')}" + (f" - {_cut(str(second.get('message') or ''), 160)}"
                                                         if second.get("message") else ""))
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
        head = Text(f"[{name}] ")
        head.append_text(_status_text(entry.get("status")))
        timing = entry.get("timing") or {}
        if timing.get("compile_ms") is not None or timing.get("run_ms") is not None:
            head.append(f"   compile {_fmt_ms(timing.get('compile_ms'))} ms, run {_fmt_ms(timing.get('run_ms'))} ms")
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
        _line(console, f"    tolerance used:    {_fmt_tol(entry.get('tolerance_used'))}")
        levels = (entry.get("metrics") or {}).get("quantized_levels")
        if levels:
            _line(console, f"    compared as:       int8 levels of {', '.join(sorted(levels))} (one quantization step "
                           "is within int_atol 1; docs/comparison.md)")


# --------------------------------------------------------------------------- compiler JSON


def sorted_assignments(op_assignments: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(location, executor)`` pairs sorted by line, then column, as numbers;
    keys that are not ``line:col`` come last, in string order."""

    def key(item):
        m = _LOCATION_RE.match(str(item[0]))
        return (0, int(m.group(1)), int(m.group(2)), "") if m else (1, 0, 0, str(item[0]))

    pairs = []
    for loc, val in op_assignments.items():
        executor = val.get("executor") if isinstance(val, Mapping) else val
        pairs.append((str(loc), executor))
    return sorted(pairs, key=key)


def render_compiler(data: Mapping, console: Console) -> None:
    """A compiler JSON: total, distribution per executor, assignments by line:col."""
    pairs = sorted_assignments(data.get("op_assignments") or {})
    _line(console, "=" * 60)
    _line(console, f"MODEL: {data.get('model_name')} (compiler format)", style="bold")
    _line(console, "=" * 60)
    _line(console)
    _line(console, f"Total assignments: {len(pairs)}")
    _line(console)
    dist: dict[str, int] = {}
    for _, ex in pairs:
        dist[str(ex)] = dist.get(str(ex), 0) + 1
    _line(console, "Executor distribution:", style="bold")
    for name, n in sorted(dist.items(), key=lambda kv: (-kv[1], kv[0])):
        _line(console, f"  {name}: {n}")
    _line(console)
    _line(console, "Assignments:", style="bold")
    for loc, ex in pairs:
        _line(console, f"  {loc} -> {ex}")


# --------------------------------------------------------------------------- dispatch


def render(data: Mapping, kind: str, console: Console, layer: str | None = None) -> None:
    """Render a loaded JSON (:func:`load_view_json`): compiler view, layer details or summary.

    Raises:
        ReportError: a layer was asked for on a compiler JSON, or it does not exist.
    """
    if kind == "compiler":
        if layer:
            raise ReportError("layer details need the report JSON; this is a compiler JSON "
                              "(it holds only line:col -> executor)")
        render_compiler(data, console)
    elif layer:
        render_layer(data, layer, console)
    else:
        render_summary(data, console)
