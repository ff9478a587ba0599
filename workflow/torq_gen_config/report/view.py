"""Rendering of report and compiler JSONs for ``torq-gen-config view`` (with rich).

Three views (the original tool's: docs/original_tool.md, 'view'):

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

This module holds the loading, the summary and the dispatch; the layer view is
:mod:`.view_layer`, the compiler view :mod:`.view_compiler`, the shared formats
:mod:`.view_format`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping


from ..core.errors import ReportError
from ..core.fileio import read_json
from ..core.keep_work import recorded_line
from ..core.lazy import rich_box, rich_console, rich_table, rich_text
from ..fullrun.report_section import render_full_model_text, stale_reason
from .files import compiler_path_for_model, is_compiler_json, model_name_of, report_path_for_model
from .build import check_report, discovery_report_of
from .cells import executor_names
from ..core.statuses import STATUSES, TERMINAL_STYLES
from .recommend import is_inconclusive
from .summary import success_note
from .text import LAYER_COLUMN_MAX, trust_lines
from .view_compiler import render_compiler
from .view_format import (_cut, _fmt_ms, _fmt_tol, _line, _print_table, _recommended_text, _status_text,
                          precision_text)
from .view_layer import render_layer

__all__ = ["resolve_view_path", "load_view_json", "render", "render_summary"]

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
        check_report(data, str(path))
        return data, "report"
    raise ReportError(f"{path} is neither a torq-gen-config report JSON ('ops') nor a compiler JSON ('op_assignments')")


# --------------------------------------------------------------------------- summary


def render_summary(report: Mapping, console: rich_console.Console, source: str | os.PathLike | None = None) -> None:
    """The report summary: counts, timing, critical failures, per-layer table, tolerance.
    Counts come from the layers (:func:`~.build.discovery_report_of`), not the stored
    summary; without a ``model_name`` the name comes from ``source``'s file name."""
    ops: Mapping[str, Mapping] = report.get("ops") or {}
    names = executor_names(report)
    report = {**report, "discovery_report": discovery_report_of(report)}
    summary = report["discovery_report"]["summary"]
    critical = report["discovery_report"]["critical_failures"]

    _line(console, "=" * 72)
    _line(console, f"MODEL: {model_line(report, source)}", style="bold")
    _line(console, "=" * 72)
    _line(console, f"Layers: {summary.get('total_layers', len(ops))}    "
                   f"Executors (priority order): {', '.join(names) if names else '-'}")
    for u in report.get("unavailable_executors") or []:  # once per executor, not once per layer
        _line(console, f"Unavailable here, not tested: {u.get('name')} ({u.get('backend')}): {u.get('reason')}",
              style="yellow")
    precision = precision_text(report)
    if precision or report.get("precision"):  # reports written before precision modes say nothing
        _line(console, f"Precision: {precision or 'fp32 as given (no bf16/int32 conversion, no quantization)'}")
    for ln in tool_lines(report):
        _line(console, ln)
    if isinstance(report.get("work_dir"), Mapping):  # reports written before it was recorded have none
        _line(console, recorded_line(report["work_dir"]))
    if summary.get("skipped_layers"):
        _line(console, f"Layers skipped (not tested): {summary['skipped_layers']}")
    _line(console)

    _line(console, "STATUS COUNTS (layer x executor):", style="bold")
    counts = summary.get("status_counts") or {}
    for status in list(STATUSES) + [s for s in counts if s not in STATUSES]:
        row = rich_text.Text("  ")
        row.append(f"{status}:", style=TERMINAL_STYLES.get(status, ""))
        row.append(f" {counts.get(status, 0)}" + (success_note(summary) if status == "success" else ""))
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
        table = rich_table.Table(box=rich_box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("Executor")
        for col in ("compile avg", "min", "max", "n", "run avg", "min", "max", "n"):
            table.add_column(col, justify="right")
        for name in names + [n for n in timing if n not in names]:
            stats = timing.get(name)
            if not stats:
                continue
            cells = [rich_text.Text(name)]
            for key in ("compile_ms", "run_ms"):
                s = stats.get(key) or {}
                cells += [rich_text.Text(_fmt_ms(s.get("avg_ms"))), rich_text.Text(_fmt_ms(s.get("min_ms"))),
                          rich_text.Text(_fmt_ms(s.get("max_ms"))), rich_text.Text(str(s.get("samples", "-")))]
            table.add_row(*cells)
        _print_table(console, table)
        batched = sorted({name for op in (report.get("ops") or {}).values()
                          for name, e in (op.get("executors") or {}).items()
                          if ((e or {}).get("timing") or {}).get("compile_batch", {}).get("members")})
        if batched:  # say what those compile times are: an even split, not a measurement
            _line(console, f"  compile times of {', '.join(batched)}: each layer's share of its batch's compile "
                           "(batch ms / layers compiled together), not measured per layer")
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
    table = rich_table.Table(box=rich_box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("Layer", no_wrap=True, max_width=LAYER_COLUMN_MAX)
    for name in names:
        table.add_column(name, no_wrap=True, min_width=10)
    table.add_column("Recommended", no_wrap=True)
    if with_override:
        table.add_column("Tolerance override", no_wrap=True)
    for lid, op in ops.items():
        execs = op.get("executors") or {}
        row = [rich_text.Text(_cut(str(lid)))]
        row += [_status_text((execs.get(n) or {}).get("status"), inconclusive=is_inconclusive(execs.get(n) or {}))
                for n in names]
        row.append(_recommended_text(op))
        if with_override:
            override = op.get("tolerance_override")
            row.append(rich_text.Text(f"avg={override.get('fp_avg_tol'):g} max={override.get('fp_max_tol'):g}"
                                      if override else ""))
        table.add_row(*row)
    _print_table(console, table)
    _line(console)
    _line(console, f"DEFAULT TOLERANCE: {_fmt_tol(report.get('default_tolerance'))}")
    if report.get("full_model"):  # the last `torq-gen-config run`
        _line(console)
        # OUT OF DATE by the one rule (fullrun.stale_reason; the HTML report uses it too)
        fm = {**report["full_model"], "stale": stale_reason(report["full_model"], report.get("ops") or {})}
        for ln in render_full_model_text(fm).rstrip("\n").splitlines():
            _line(console, ln)


def tool_lines(report: Mapping) -> list[str]:
    """``Tools:`` lines of a report's provenance: the model's opset (given -> prepared), the
    symbolic dims given values (or none), and per executor the compiler and runtime
    versions recorded (``provenance.executor_tools``). Empty without provenance."""
    prov = report.get("provenance") or {}
    if not prov:
        return []
    model = prov.get("model") or {}
    lines = []
    opset = model.get("opset") or {}
    if opset:
        lines.append(f"Opset: {opset.get('original')} -> {opset.get('prepared')}")
    if "fixed_dims" in model:
        fixed = model.get("fixed_dims") or []
        lines.append("Fixed dims: " + (", ".join(f"{d.get('input')} dim {d.get('axis')} ({d.get('was')}) -> "
                                                 f"{d.get('to', 1)}" for d in fixed[:10])
                                       + (f", ... {len(fixed) - 10} more" if len(fixed) > 10 else "")
                                       if fixed else "none (no symbolic input dims)"))
    tools = prov.get("executor_tools") or {}
    for name, t in tools.items():
        if not isinstance(t, Mapping):
            continue
        keys = [k for k in t if k.endswith("_version") and t.get(k)]
        if keys:
            lines.append(f"Tools of {name}: " + "; ".join(f"{k.removesuffix('_version').replace('_', '-')} "
                                                         f"{_cut(str(t[k]), 90)}" for k in keys))
    return lines


# --------------------------------------------------------------------------- dispatch


def model_line(data: Mapping, source: str | os.PathLike | None) -> str:
    """The model's name for a ``MODEL:`` line: ``model_name``, else the name in ``source``'s
    file name, said so (:func:`~.files.model_name_of`); ``(unknown)`` without either."""
    if source is None:
        return str(data.get("model_name") or "(unknown)")
    name, from_file = model_name_of(data, source)
    return f"{name} (name from the file name)" if from_file else name


def render(data: Mapping, kind: str, console: rich_console.Console, layer: str | None = None,
           source: str | os.PathLike | None = None) -> None:
    """Render a loaded JSON (:func:`load_view_json`, read from ``source``): compiler view,
    layer details or summary.

    Raises:
        ReportError: a layer was asked for on a compiler JSON, or it does not exist.
    """
    if kind == "compiler":
        if layer:
            raise ReportError("layer details need the report JSON; this is a compiler JSON "
                              "(it holds only line:col -> executor)")
        render_compiler(data, console, model=model_line(data, source))
    elif layer:
        render_layer(data, layer, console)
    else:
        render_summary(data, console, source)
