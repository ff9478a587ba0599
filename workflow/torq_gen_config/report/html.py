"""The HTML report: one self-contained page (plotly.js inlined, no network access) of a
discovery report JSON, for a person to look at rather than read.

Sections: summary; the model graph (:mod:`torq_gen_config.report.graph`: layers as nodes,
tensors as edges, from the run's layers manifest); the layers x executors status matrix (hover for the verdict, click
for the whole message and metrics); verdicts per op type; compile and run time per
executor and, with ``--collect-timing``, the recommended executor's speed-up per layer;
error stages; what the verdicts cannot vouch for (reference disputes, inconclusive
checks, layers judged against onnx's reference implementation because ONNX Runtime failed,
unverified layers, not testable layers, generated inputs); the full-model
comparison (``full_model``, after ``torq-gen-config run``); precision mode, fixed dims,
tool versions and options. Everything is read from the report (and the compiler JSON
when given); nothing is re-judged. Figures: :mod:`torq_gen_config.report.plots`.
"""

from __future__ import annotations

import json
import os
from html import escape
from pathlib import Path
from typing import Mapping

from ..core.errors import ReportError
from ..core.fileio import atomic_write_text, read_json
from ..core.lazy import pio, plotly_offline
from ..core.statuses import DIFFERENCE, HTML_COLORS, HTML_TEXT_COLORS
from ..fullrun.common import ELSEWHERE_NOTE, NOT_AS_ASSIGNED, TWO_BACKENDS_NOTE
from .build import build_compiler_json, discovery_report_of
from .cells import executor_names
from .files import compiler_path_for_report, is_compiler_json, load_report
from .graph import find_manifest, full_model_stale, graph_data, graph_html, graph_scripts
from .plots import (
    error_stage_plot,
    matrix_details,
    op_type_verdicts,
    speedup_plot,
    speedups,
    status_matrix,
    timing_boxes,
)
from .staleness import staleness

#: ``id`` of the matrix figure's element (the click handler and the browser test use it).
MATRIX_ID = "status-matrix"
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1400px;padding:0 16px;
color:#212121}
h1{font-size:1.5em;margin:16px 0 4px} h2{font-size:1.2em;margin:28px 0 8px;border-bottom:1px solid #cfd8dc}
table{border-collapse:collapse;margin:6px 0;font-size:13px} td,th{border:1px solid #cfd8dc;padding:3px 8px;
text-align:left;vertical-align:top} th{background:#eceff1} td.num{text-align:right}
.warn{background:#fff3e0;border-left:4px solid #ef6c00;padding:6px 10px;margin:8px 0}
.note{color:#546e7a;font-size:13px} .swatch{display:inline-block;width:12px;height:12px;margin-right:4px;
vertical-align:middle;border:1px solid #90a4ae}
#cell-detail{position:fixed;right:16px;bottom:16px;width:min(640px,45vw);background:#fafafa;border:1px solid #b0bec5;
padding:8px 12px;max-height:40vh;overflow:auto;font-size:13px;box-shadow:0 2px 8px rgba(0,0,0,.2);display:none} #cell-detail pre{white-space:pre-wrap;margin:4px 0}
.status-pill{padding:1px 6px;border-radius:3px;color:#fff}
"""
_CLICK_JS = """
(function(){
  var details = JSON.parse(document.getElementById('cell-details').textContent);
  var el = document.getElementById('%(matrix)s');
  var box = document.getElementById('cell-detail');
  function esc(s){return String(s).replace(/[&<>"]/g,function(c){return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c];});}
  function show(d){
    var h = '<b>' + esc(d.layer) + '</b> (' + esc(d.op_type || '?') + ') on <b>' + esc(d.executor) + '</b>: ' +
            esc(d.status) + (d.recommended ? ' &#9733; recommended' : '');
    if (d.stage || d.summary) h += '<br>' + (d.stage ? '[' + esc(d.stage) + '] ' : '') + esc(d.summary || '');
    h += '<br>metrics: ' + esc(JSON.stringify(d.metrics)) + '<br>timing (ms): ' + esc(JSON.stringify(d.timing_ms));
    h += '<br>reference: ' + esc(JSON.stringify(d.reference));
    ['inconclusive_reasons','reference_dispute','reference_fallback','duplicate_of','not_testable_reason','skipped_reason'].forEach(function(k){
      if (d[k] && (!Array.isArray(d[k]) || d[k].length)) h += '<br>' + k.replace(/_/g, ' ') + ': ' + esc(d[k]);
    });
    if (d.message) h += '<pre>' + esc(d.message) + '</pre>';
    box.innerHTML = '<a href="#" style="float:right" onclick="this.parentNode.style.display=&quot;none&quot;;return false">close</a>' + h;
    box.style.display = 'block';
  }
  if (el && el.on) el.on('plotly_click', function(ev){
    var p = ev.points && ev.points[0]; if (!p || p.customdata === undefined) return;
    var d = details[p.customdata]; if (d) show(d);
  });
})();
"""


def _table(headers: list[str], rows: list[list], *, cls: str = "") -> str:
    """An HTML table; cells are escaped unless given as ``("html", markup)``."""
    def cell(v):
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "html":
            return f"<td>{v[1]}</td>"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f'<td class="num">{escape(_fmt(v))}</td>'
        return f"<td>{escape('' if v is None else str(v))}</td>"

    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def _pill(status: str, like: str | None = None) -> tuple[str, str]:
    """A status shown as a coloured pill, in the colours of ``like`` (default: its own)."""
    color = HTML_COLORS.get(like or status, "#78909c")
    fg = HTML_TEXT_COLORS.get(like or status, "#fff")
    return ("html", f'<span class="status-pill" style="background:{color};color:{fg}">{escape(status)}</span>')


def _figure(fig, div_id: str) -> str:
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def _summary(report: Mapping, warnings: list[str]) -> str:
    dr = report.get("discovery_report") or {}
    s = dr.get("summary") or {}
    names = executor_names(report)
    generated = (report.get("provenance") or {}).get("generated_at") or "(time not recorded)"
    parts = [f"<h1>torq-gen-config: {escape(str(report.get('model_name')))}</h1>",
             f'<p class="note">report generated {escape(str(generated))}; '
             f"{s.get('total_layers', len(report.get('ops') or {}))} layers; executors in priority order: "
             f"{escape(', '.join(names))}; recommendation rule: {escape(str(s.get('recommendation_rule')))}</p>"]
    parts += [f'<div class="warn">{escape(w)}</div>' for w in warnings]
    for u in report.get("unavailable_executors") or []:  # once per executor, not once per layer
        parts.append(f'<div class="warn">Executor {escape(str(u.get("name")))} ({escape(str(u.get("backend")))}): '
                     f'unavailable on this machine, not tested: {escape(str(u.get("reason")))}</div>')
    counts = s.get("status_counts") or {}
    parts.append("<h2>Summary</h2>")
    rows = [[_pill(k), v] for k, v in counts.items()]
    trust = [("inconclusive successes (success*)", s.get("inconclusive_checks")),
             ("layers whose reference repeats along an axis (blind to a permutation along it)",
              s.get("blind_spot_layers")),
             ("reference disputes (layers)", s.get("reference_disputes")),
             ("reference failures (layers, verdicts unverified)", s.get("reference_failures")),
             ("judged against onnx's reference implementation (ONNX Runtime failed; layers)",
              s.get("reference_fallbacks")),
             ("not testable layers", s.get("not_testable_layers")),
             ("layers with generated inputs", s.get("generated_input_layers")),
             ("critical failures (every executor failed)", len(dr.get("critical_failures") or []))]
    rec = [[k, v] for k, v in (s.get("executor_counts") or {}).items()] + [["(none)", s.get("no_recommendation")]]
    if s.get("user_recommendations"):
        rec.append(["set by a person (edit)", s["user_recommendations"]])
    if s.get("unverified_recommendations"):
        rec.append(["resting on an unverified run", s["unverified_recommendations"]])
    parts.append('<div style="display:flex;gap:32px;flex-wrap:wrap">'
                 + "<div>" + _table(["verdicts (layer x executor)", "count"], rows) + "</div>"
                 + "<div>" + _table(["recommended executor", "layers"], rec) + "</div>"
                 + "<div>" + _table(["what the verdicts cannot vouch for", "count"],
                                    [[k, v or 0] for k, v in trust]) + "</div></div>")
    parts += [f'<p class="note">{escape(n)}</p>' for n in s.get("notes") or []]
    crit = dr.get("critical_failures") or []
    if crit:
        parts.append("<h3>Critical failures</h3>" + _table(
            ["layer", "node", "MLIR location", "errors"],
            [[c.get("layer_id"), c.get("node_index"), c.get("mlir_location"),
              "; ".join(f"{n}: {d.get('stage') or d.get('status')}: {d.get('summary')}"
                        for n, d in (c.get("error_details") or {}).items())] for c in crit]))
    return "\n".join(parts)


def _trust(report: Mapping) -> str:
    dr = report.get("discovery_report") or {}
    out = ["<h2>Reference disputes and inconclusive checks</h2>",
           '<p class="note">A <b>reference dispute</b>: ONNX Runtime and onnx\'s reference implementation disagree '
           "on the layer, so its verdicts rest on the reference chosen. An <b>inconclusive</b> success (success*): "
           "the comparison could not have failed (docs/comparison.md). <b>Judged against onnx</b>: ONNX Runtime "
           "failed on the layer, its verdicts rest on onnx's reference implementation alone (no second opinion). "
           "<b>unverified</b>: no reference ran; "
           "never counted as a success.</p>"]
    disputes = dr.get("reference_disputes") or []
    out.append(f"<h3>Reference disputes ({len(disputes)})</h3>")
    out.append(_table(["layer", "summary", "executors agreeing with"],
                      [[d.get("layer_id"), d.get("summary"),
                        "; ".join(f"{k}: {', '.join(v)}" for k, v in (d.get("agree_with") or {}).items())]
                       for d in disputes]) if disputes else '<p class="note">none</p>')
    inc = dr.get("inconclusive_checks") or []
    out.append(f"<h3>Inconclusive checks ({len(inc)})</h3>")
    out.append(_table(["layer", "executor", "reason"], [[i.get("layer_id"), i.get("executor"), i.get("reason")]
                                                        for i in inc]) if inc else '<p class="note">none</p>')
    for key, title, cols in (("reference_failures", "Reference failures (verdicts unverified)",
                              ["layer_id", "engine", "engine_version", "message"]),
                             ("reference_fallbacks", "Judged against onnx's reference implementation (ONNX Runtime "
                              "failed; no second opinion)", ["layer_id", "used", "fallback"]),
                             ("not_testable", "Not testable layers", ["layer_id", "node_index", "reason"]),
                             ("generated_inputs", "Layers with generated inputs", ["layer_id", "reason"])):
        items = dr.get(key) or []
        if items:
            out.append(f"<h3>{title} ({len(items)})</h3>")
            out.append(_table(cols, [[i.get(c) for c in cols] for i in items]))
    return "\n".join(out)


def _module_rows(fm: Mapping) -> list[list]:
    """Rows on the one-module run (``full_model.module``; placement read back)."""
    m = fm.get("module") or {}
    counts = ((fm.get("placement") or m.get("placement") or {}).get("counts")) or {}
    return [["one module", f"{m.get('status')}: {m.get('summary')}"],
            ["one module: compile (ms) / run (ms)", f"{m.get('compile_ms')} / {m.get('run_ms')}"],
            ["one module: devices", ", ".join(f"{d.get('executor')} ({d.get('device')})" for d in m.get("devices") or [])
             + ("; transfers: n/a" if m.get("transfers") is None else f"; {m['transfers']} transfer(s)")],
            ["placement (read back)", ", ".join(f"{k} {v}" for k, v in counts.items()) + " layer(s)"]]


def _full_model(report: Mapping) -> str:
    fm = report.get("full_model")
    out = ["<h2>Full-model comparison</h2>"]
    if not fm:
        return out[0] + ('<p class="note">not run: <code>torq-gen-config run --model ... --output-dir ...</code> '
                         "runs the whole model with the recommended assignment and records it here.</p>")
    m = fm.get("metrics") or {}
    t = fm.get("timing") or {}
    a = fm.get("assignment") or {}
    status = fm.get("status") or "?"
    # the rule `view` uses (fullrun.stale_layers): imported only here, a report without a
    # full-model result imports no backend
    from ..fullrun.report_section import stale_layers

    stale = full_model_stale(report)
    if stale:
        out.append(f'<div class="warn" id="full-model-stale"><b>OUT OF DATE</b>: {escape(stale)}. The result below '
                   "is of the assignment the run used, not the current one.</div>")
    moved = stale_layers(fm, report.get("ops") or {})
    # a run that did not keep the assignment is a caution, in a difference's colours
    pill = _pill(status, DIFFERENCE if status == NOT_AS_ASSIGNED else None)[1]
    rows = [["status", ("html", pill + (" (out of date)" if stale else ""))],
            ["summary", fm.get("summary")], ["mode", fm.get("mode")],
            ["assignment", f"{a.get('source_file') or a.get('source')}: "
                           + ", ".join(f"{k} {v}" for k, v in (a.get("layer_counts") or {}).items()) + " layers"
                           + (" (the run's; changed since)" if stale else "")],
            ["partitions", f"{fm.get('num_partitions')} ("
                           + ", ".join(f"{k} {v}" for k, v in (fm.get("partition_counts") or {}).items()) + ")"],
            ["max rel diff", m.get("max_rel_diff")], ["mean rel diff", m.get("mean_rel_diff")],
            ["max abs diff", m.get("max_abs_diff")], ["cosine similarity (min over outputs)", m.get("cosine_similarity")],
            ["elements over tolerance", f"{fm.get('num_over_tolerance')} of {m.get('num_elements')}"],
            ["compile time total (ms)", t.get("compile_ms_total")], ["run time total (ms)", t.get("run_ms_total")],
            ["reference", (fm.get("reference") or {}).get("fallback")
             or f"{(fm.get('reference') or {}).get('engine')} {(fm.get('reference') or {}).get('status')}"],
            ["recorded", fm.get("generated_at")]]
    if moved:
        rows.insert(4, ["layers moved since the run (run -> now)",
                        ", ".join(f"{lid} ({was} -> {now})" for lid, (was, now) in list(moved.items())[:50])])
    if fm.get("mode_reason"):
        rows.insert(3, ["mode reason", fm["mode_reason"]])
    if fm.get("verdict"):
        rows.insert(1, ["verdict", fm["verdict"]])
    if (fm.get("failure") or {}).get("summary"):
        rows.append(["failure", fm["failure"]["summary"]])
    if fm.get("module"):
        rows += _module_rows(fm)
    red = fm.get("reduced")
    if red:  # run --reduce
        rows.append(["reduced (run --reduce)",
                     f"{red.get('status')}: {red.get('num_nodes')} of {red.get('from_nodes')} nodes in {red.get('dir')} ("
                     + ", ".join(f"{n.get('layer_id')} on {n.get('executor')}" for n in (red.get("nodes") or [])[:20])
                     + f"); {red.get('note')}; reproduce: {red.get('reproducer') or red.get('reproducer_note')}"])
    fb = a.get("layers_without_recommendation") or []
    if fb:
        rows.append(["layers without a recommendation", ", ".join(f"{x.get('layer_id')} -> {x.get('executor')}"
                                                                   for x in fb[:50])])
    out.append(_table(["", ""], rows))
    out += [f'<div class="warn">{escape(str(w))}</div>' for w in fm.get("warnings") or []]
    pl = fm.get("placement") or {}
    flagged = [(lid, r) for lid, r in (pl.get("layers") or {}).items() if r.get("status") == "elsewhere"]
    if flagged:
        out.append(f'<div class="warn" id="full-model-elsewhere"><b>RAN ELSEWHERE</b> than assigned ({ELSEWHERE_NOTE}):</div>')
        out.append(_table(["layer", "assigned", "ran on"], [[lid, r.get("assigned"), ", ".join(r.get("ran_on") or [])]
                                                          for lid, r in flagged[:200]]))
    for exe, variants in (pl.get("two_backends") or {}).items():
        out.append(f'<div class="warn"><b>TWO BACKENDS</b>: executable {escape(str(exe))} built for '
                   f"{escape(', '.join(variants))} ({TWO_BACKENDS_NOTE})</div>")
    parts = fm.get("partitions") or []
    if parts:
        out.append(_table(["#", "executor", "nodes", "layers", "own check"],
                          [[p.get("index"), p.get("executor"), f"{p.get('first_node')}-{p.get('last_node')}",
                            len(p.get("layer_ids") or []),
                            ((p.get("partition_check") or {}).get("status") or "-")
                            + (f": {(p.get('partition_check') or {}).get('summary')}"
                               if (p.get("partition_check") or {}).get("summary") else "")]
                           for p in parts[:200]]))
    return "\n".join(out)


def _provenance(report: Mapping, compiler: Mapping | None) -> str:
    prov = report.get("provenance") or {}
    model = prov.get("model") or {}
    flags = (report.get("precision") or {}).get("flags") or {}
    active = [k for k in ("auto_convert_bf16", "auto_convert_int32", "quantize") if flags.get(k)]
    mode = ", ".join(active) if active else "fp32 as given (no bf16/int32 conversion, no quantization)"
    if flags.get("quantize"):
        mode += f" (format {flags.get('quant_format')}, per_channel {flags.get('per_channel')}, " \
                f"full_integer {flags.get('full_integer')})"
    opset = model.get("opset") or {}
    ref = prov.get("reference") or {}
    rows = [["precision mode", mode],
            ["opset", f"{opset.get('original')} -> {opset.get('prepared')}" if opset else None],
            ["fixed dims", "; ".join(f"{d.get('input')} dim {d.get('axis')} ({d.get('was')}) -> {d.get('to', 1)}"
                                     for d in model.get("fixed_dims") or []) or "none"],
            ["reference", f"{ref.get('engine')} (second opinion {ref.get('second_opinion')}), ORT "
                          f"{', '.join(map(str, ref.get('ort_versions') or []))}, onnx {ref.get('onnx_version')}"],
            ["default tolerance", json.dumps(report.get("default_tolerance"))],
            ["MLIR file", report.get("mlir_file")]]
    for w in model.get("warnings") or []:
        rows.append(["model warning", w])
    if compiler is not None:
        n = len(compiler.get("op_assignments") or {})
        same = build_compiler_json(report).get("op_assignments") == compiler.get("op_assignments")
        rows.append(["compiler JSON", f"{n} op assignments; "
                     + ("matches the report" if same else "DIFFERS from the report's recommendations "
                        "(edited by hand or older; rerun edit or discover to regenerate it)")])
    out = ["<h2>Precision, shapes and tools</h2>", _table(["", ""], rows)]
    versions = prov.get("versions") or {}
    tools = prov.get("executor_tools") or {}
    trows = [[k, v] for k, v in versions.items()]
    for name, t in tools.items():
        for k in ("iree_compiler_version", "iree_runtime_version", "onnxruntime_version", "torq_compile_version",
                  "torq_run_module_version", "version"):
            if t.get(k):
                trows.append([f"{name}: {k}", t[k]])
    out.append(_table(["tool", "version"], trows))
    execs = prov.get("executors") or []
    if execs:
        out.append(_table(["executor", "backend", "options"],
                          [[e.get("name"), e.get("backend"), json.dumps(e.get("options"), sort_keys=True)]
                           for e in execs if isinstance(e, Mapping)]))
    opts = prov.get("options") or {}
    if opts:
        out.append("<details><summary>all options of the run</summary>"
                   + _table(["option", "value"], [[k, json.dumps(v)] for k, v in opts.items()]) + "</details>")
    return "\n".join(out)


def render_html(report: Mapping, *, compiler: Mapping | None = None, warnings: list[str] | None = None,
                manifest: Mapping | None = None, manifest_error: str | None = None) -> str:
    """The whole page for ``report`` (a discovery report JSON, as read).

    Args:
        report: the report JSON (checked by the caller: :func:`report.build.check_report`).
        compiler: the compiler JSON next to it, when present (its assignments are
            compared with the report's recommendations).
        warnings: lines shown at the top (e.g. :func:`report.staleness.staleness`).
        manifest: the run's layers manifest (the tensors between the layers and the node
            names, for the model graph: :mod:`report.graph`); None: "graph unavailable".
        manifest_error: why the manifest there could not be read (the graph says so).

    Returns:
        The HTML text (a few MB: plotly.js, about 4.5 MB, is inlined once).
    """
    warnings = list(warnings or [])
    report = {**report, "discovery_report": discovery_report_of(report)}  # the counts its layers give
    stale = full_model_stale(report)
    if stale:  # as `view` says it (fullrun.stale_reason); the section and the graph say it too
        warnings.append(f"The full-model comparison is OUT OF DATE: {stale}")
    body = [_summary(report, warnings)]
    matrix = status_matrix(report)
    graph = graph_data(report, manifest, manifest_error=manifest_error)
    body.append(graph_html(graph))
    body.append("<h2>Verdicts per layer and executor</h2>")
    if matrix is None:
        body.append('<p class="note">the report has no layers or no executors</p>')
    else:
        body.append(_figure(matrix, MATRIX_ID))
        body.append('<div id="cell-detail"></div>')
    sections = [("Verdicts per op type", op_type_verdicts(report), "op-types", "no layers"),
                ("Compile and run time", timing_boxes(report), "timing", "no timings in the report"),
                ("Speed-up of the recommended executor", speedup_plot(report), "speedup",
                 "no runtime measurements in this report: discover --collect-timing measures them"),
                ("Error stages", error_stage_plot(report), "error-stages", "no error verdicts")]
    for title, fig, div_id, empty in sections:
        body.append(f"<h2>{title}</h2>")
        body.append(_figure(fig, div_id) if fig is not None else f'<p class="note" id="{div_id}-none">{empty}</p>')
        if div_id == "speedup" and fig is not None:
            rows = speedups(report)
            best = sorted(rows, key=lambda r: -r["speedup"])[:10]
            body.append('<p class="note">largest speed-ups (runtime medians, ms):</p>' + _table(
                ["layer", "recommended", "ms", "versus", "ms", "speed-up (x)"],
                [[r["layer"], r["recommended"], r["recommended_ms"], r["versus"], r["versus_ms"], r["speedup"]]
                 for r in best]))
    body.append(_trust(report))
    body.append(_full_model(report))
    body.append(_provenance(report, compiler))
    details = json.dumps(matrix_details(report) if matrix is not None else {}, default=str).replace("</", "<\\/")
    title = escape(f"torq-gen-config report: {report.get('model_name')}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>{_CSS}</style>"
            f"<script type=\"text/javascript\">{plotly_offline.get_plotlyjs()}</script></head><body>\n"
            + "\n".join(body)
            + f'\n<script type="application/json" id="cell-details">{details}</script>'
            + f"<script>{_CLICK_JS % {'matrix': MATRIX_ID}}</script>{graph_scripts(graph)}\n</body></html>\n")


def write_html(path: str | os.PathLike, report: Mapping, *, compiler: Mapping | None = None,
               warnings: list[str] | None = None, manifest: Mapping | None = None,
               manifest_error: str | None = None) -> None:
    """Write :func:`render_html` to ``path`` atomically (a reader never sees half a page).

    Raises:
        OSError: the directory cannot be written.
    """
    atomic_write_text(path, render_html(report, compiler=compiler, warnings=warnings, manifest=manifest,
                                        manifest_error=manifest_error))


def write_report_html(report_path: str | os.PathLike, html_path: str | os.PathLike | None = None, *,
                      model_path: str | os.PathLike | None = None) -> Path:
    """Read a report JSON (and the compiler JSON next to it, when there) and write its
    HTML report.

    Args:
        report_path: ``torq_gen_config_<name>.json``.
        html_path: where to write; default the report's path with ``.html``.
        model_path: the model the user named, for the staleness check (default: the
            model file the report names).

    Returns:
        The path written.

    Raises:
        ReportError: the report is missing, not JSON, not a report (e.g. a compiler JSON),
            or fails the report schema. (An unreadable compiler JSON is a warning on the page.)
        OSError: the HTML file cannot be written.
    """
    report_path = Path(report_path)
    report = load_report(report_path)
    warnings = staleness(report_path, report, model_path)
    compiler = None
    cpath = compiler_path_for_report(report_path)
    if cpath.is_file():
        # the page is about the report: a broken compiler JSON is a warning on it, not a failure
        try:
            compiler = read_json(cpath, "compiler JSON")
            if not is_compiler_json(compiler):
                warnings.append(f"{cpath.name} is not a compiler JSON (no op_assignments object); "
                                "rerun discover or edit to regenerate it")
                compiler = None
        except ReportError as e:
            warnings.append(f"{e}; rerun discover or edit to regenerate it")
    manifest, manifest_error = None, None
    mpath = find_manifest(report_path, report)
    if mpath is not None:  # the model graph's tensors; a broken one leaves the graph out, the page stays
        try:
            manifest = read_json(mpath, "layers manifest")
        except ReportError as e:
            manifest_error = str(e)
            warnings.append(f"{e}: the model graph is left out")
    out = Path(html_path) if html_path is not None else report_path.with_suffix(".html")
    write_html(out, report, compiler=compiler, warnings=warnings, manifest=manifest, manifest_error=manifest_error)
    return out
