"""The figures of the HTML report (:mod:`torq_gen_config.report.html`), built with
plotly from a report JSON: the layers x executors status matrix, verdicts per op type,
compile and run times, the recommended executor's speed-up, error stages.

Each function returns a ``plotly.graph_objects.Figure``, or None when the report holds
nothing to plot (the page then says why in words). Times are milliseconds, as in the
report; timings of runs that ended in ``error`` are left out (as in the report's
``timing_summary``: they are not comparable).
"""

from __future__ import annotations

from html import escape
from typing import Mapping

from ..core.lazy import go, plotly_subplots
from ..core.statuses import DISPLAY_STATUSES, HTML_COLORS
from .cells import cell_detail, cell_hover, cell_status, executor_names
from .recommend import duration_ms, is_reference_fallback, runtime_median_ms

#: Height of one layer row of the status matrix (px), and the page's font.
ROW_PX = 16
#: Smallest height of the status matrix (px): room for its colour bar's seven labels.
MATRIX_MIN_PX = 320
FONT = dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12)


def _layout(fig, *, title: str, height: int, **kw) -> None:
    fig.update_layout(title=dict(text=title, x=0.01), height=height, font=FONT, template="plotly_white",
                      margin=dict(l=10, r=10, t=60, b=40), **kw)


def status_matrix(report: Mapping):
    """Heatmap of the display status (:data:`~torq_gen_config.core.statuses.DISPLAY_STATUSES`) of every (layer,
    executor): one row per layer in report order, one column per executor in priority
    order; a star marks the recommended executor. Hover shows the verdict line; the
    cell's ``customdata`` is ``"<row>|<column>"``, the key of its click detail in
    :func:`matrix_details`. None for a report without layers or executors."""
    ops = report.get("ops") or {}
    names = executor_names(report)
    if not ops or not names:
        return None
    code = {s: i for i, s in enumerate(DISPLAY_STATUSES)}
    layers = list(ops)
    z, text, custom = [], [], []
    for row, lid in enumerate(layers):
        op = ops[lid]
        zr, tr, cr = [], [], []
        for col, name in enumerate(names):
            d = cell_detail(lid, op, name)
            zr.append(code[d["status"]])
            tr.append(cell_hover(d))
            cr.append(f"{row}|{col}")
        z.append(zr)
        text.append(tr)
        custom.append(cr)
    n = len(DISPLAY_STATUSES)
    # a step colour scale: code i covers [i/n, (i+1)/n] of the (0, n-1) range
    scale = []
    for i, s in enumerate(DISPLAY_STATUSES):
        scale += [[i / n, HTML_COLORS[s]], [(i + 1) / n, HTML_COLORS[s]]]
    heat = go.Heatmap(
        z=z, x=names, y=layers, text=text, customdata=custom, hovertemplate="%{text}<extra></extra>",
        zmin=-0.5, zmax=n - 0.5, colorscale=scale, xgap=2, ygap=1,
        colorbar=dict(title="status", tickvals=list(range(n)), ticktext=list(DISPLAY_STATUSES), lenmode="pixels",
                      len=MATRIX_MIN_PX - 100, y=1, yanchor="top"),
        name="verdicts",
    )
    rec_x = [ops[lid].get("recommended_executor") for lid in layers]
    star = go.Scatter(
        x=[x for x in rec_x if x in names], y=[lid for lid, x in zip(layers, rec_x) if x in names],
        mode="markers", marker=dict(symbol="star", size=9, color="white", line=dict(color="black", width=1)),
        name="recommended", hoverinfo="skip", showlegend=True,
    )
    fig = go.Figure([heat, star])
    _layout(fig, title=f"Verdicts: {len(layers)} layers x {len(names)} executors (star: recommended; \u26a0: "
                       "reference dispute or onnx reference; hover or click a cell)", height=max(MATRIX_MIN_PX, 140 + ROW_PX * len(layers)),
            legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"))
    # fixed ranges: the star markers would otherwise pad the axes beyond the cells
    fig.update_yaxes(range=[len(layers) - 0.5, -0.5], type="category", automargin=True, tickfont=dict(size=10),
                     tickvals=layers, ticktext=[_row_label(lid, ops[lid]) for lid in layers])
    fig.update_xaxes(side="top", type="category", range=[-0.5, len(names) - 0.5])
    return fig


def _row_label(layer_id: str, op: Mapping) -> str:
    """A matrix row label: the layer ID (escaped: plotly reads tick text as HTML), marked
    when its references disagree, or when it was judged against onnx's reference
    implementation because ONNX Runtime failed on it (no second opinion)."""
    if (op.get("reference") or {}).get("dispute"):
        return f"{escape(layer_id)} \u26a0 dispute"
    if is_reference_fallback(op.get("reference")):
        return f"{escape(layer_id)} \u26a0 onnx reference"
    return escape(layer_id)


def matrix_details(report: Mapping) -> dict:
    """Click details of the status matrix, keyed ``"<row>|<column>"`` as its ``customdata``
    (:func:`cells.cell_detail` of each cell)."""
    ops = report.get("ops") or {}
    names = executor_names(report)
    return {f"{r}|{c}": cell_detail(lid, ops[lid], name)
            for r, lid in enumerate(ops) for c, name in enumerate(names)}


def op_type_counts(report: Mapping) -> dict[str, dict[str, dict[str, int]]]:
    """``{executor: {op_type: {display status: count}}}`` over the report's layers."""
    ops = report.get("ops") or {}
    out: dict[str, dict[str, dict[str, int]]] = {name: {} for name in executor_names(report)}
    for op in ops.values():
        t = op.get("op_type") or "?"
        for name in out:
            s = cell_status((op.get("executors") or {}).get(name))
            per = out[name].setdefault(t, {})
            per[s] = per.get(s, 0) + 1
    return out


def op_type_verdicts(report: Mapping):
    """Stacked horizontal bars, one panel per executor: per op type, the number of
    layers with each display status. None without layers."""
    counts = op_type_counts(report)
    names = list(counts)
    types = sorted({t for per in counts.values() for t in per})
    if not names or not types:
        return None
    fig = plotly_subplots.make_subplots(rows=1, cols=len(names), shared_yaxes=True, subplot_titles=names,
                                        horizontal_spacing=0.03)
    present = {s for per in counts.values() for c in per.values() for s in c}
    for col, name in enumerate(names, start=1):
        for s in DISPLAY_STATUSES:
            if s not in present:
                continue
            fig.add_trace(go.Bar(
                y=types, x=[counts[name].get(t, {}).get(s, 0) for t in types], orientation="h", name=s,
                marker_color=HTML_COLORS[s], legendgroup=s, showlegend=col == 1,
                hovertemplate=f"{name}: %{{y}} %{{x}} layer(s) {s}<extra></extra>",
                marker_line=dict(color="#607d8b", width=0.5 if s == "not tested" else 0),
            ), row=1, col=col)
    _layout(fig, title="Verdicts per op type and executor (layers)", height=150 + 22 * len(types), barmode="stack",
            legend=dict(orientation="h", y=-0.02, yanchor="top"))
    fig.update_yaxes(autorange="reversed", type="category", automargin=True)
    return fig


def _timed(report: Mapping, name: str, key: str) -> tuple[list[str], list[float]]:
    """Layer IDs and ``timing[key]`` (ms) of one executor's runs that did not end in error;
    ``key`` ``"runtime_median"`` reads the measured runtime median."""
    lids, vals = [], []
    for lid, op in (report.get("ops") or {}).items():
        entry = (op.get("executors") or {}).get(name)
        if not entry or entry.get("status") in ("error", "skipped"):
            continue
        v = runtime_median_ms(entry) if key == "runtime_median" else duration_ms((entry.get("timing") or {}).get(key))
        if v is not None:
            lids.append(lid)
            vals.append(v)
    return lids, vals


def timing_boxes(report: Mapping):
    """Box plots per executor (every layer a point, log scale, ms): compile time, the
    verification run's time, and, when measured (``--collect-timing``), the runtime
    median. None when no run has a time."""
    names = executor_names(report)
    panels = [("compile_ms", "compile time (ms)"), ("run_ms", "verification run (ms, one run)"),
              ("runtime_median", "runtime median (ms, --collect-timing)")]
    data = {key: {name: _timed(report, name, key) for name in names} for key, _ in panels}
    panels = [(k, t) for k, t in panels if any(v for _, v in data[k].values())]
    if not panels:
        return None
    fig = plotly_subplots.make_subplots(rows=1, cols=len(panels), subplot_titles=[t for _, t in panels],
                                        horizontal_spacing=0.06)
    palette = ["#1565c0", "#6a1b9a", "#00838f", "#ef6c00", "#4e342e", "#ad1457", "#558b2f", "#37474f"]
    for col, (key, _) in enumerate(panels, start=1):
        for i, name in enumerate(names):
            lids, vals = data[key][name]
            if not vals:
                continue
            fig.add_trace(go.Box(
                y=vals, name=name, text=lids, boxpoints="all", jitter=0.4, pointpos=0, marker=dict(size=4),
                line=dict(width=1), marker_color=palette[i % len(palette)], legendgroup=name, showlegend=False,
                hovertemplate="%{text}: %{y:.3f} ms<extra>" + name + "</extra>",
            ), row=1, col=col)
        fig.update_yaxes(type="log", dtick=1, row=1, col=col)
    _layout(fig, title="Compile and run time per executor (runs that ended in error left out)", height=420)
    return fig


def speedups(report: Mapping) -> list[dict]:
    """Per layer whose recommended executor has a measured runtime median: the ratio of
    every other executor's median to it (> 1: the recommended one is faster).

    Returns:
        ``[{"layer", "recommended", "versus", "speedup", "recommended_ms", "versus_ms"}]``
        in report order; other executors whose run ended in error or have no median are
        left out.
    """
    out = []
    names = executor_names(report)
    for lid, op in (report.get("ops") or {}).items():
        rec = op.get("recommended_executor")
        execs = op.get("executors") or {}
        if rec not in execs:
            continue
        r = runtime_median_ms(execs[rec])
        if not r:
            continue
        for name in names:
            e = execs.get(name)
            if name == rec or not e or e.get("status") in ("error", "skipped"):
                continue
            v = runtime_median_ms(e)
            if v is not None:
                out.append({"layer": lid, "recommended": rec, "versus": name, "speedup": v / r,
                            "recommended_ms": r, "versus_ms": v})
    return out


def speedup_plot(report: Mapping):
    """Per layer (report order), the recommended executor's speed-up over each other
    executor (runtime median ratio, log scale; a line at 1). None without runtime
    measurements."""
    rows = speedups(report)
    if not rows:
        return None
    layers = list(report.get("ops") or {})
    fig = go.Figure()
    for name in executor_names(report):
        mine = [r for r in rows if r["versus"] == name]
        if not mine:
            continue
        fig.add_trace(go.Scatter(
            x=[r["layer"] for r in mine], y=[r["speedup"] for r in mine], mode="markers", name=f"over {name}",
            customdata=[[r["recommended"], r["recommended_ms"], r["versus_ms"]] for r in mine],
            hovertemplate="%{x}: %{customdata[0]} %{customdata[1]:.3f} ms vs " + name
                          + " %{customdata[2]:.3f} ms: %{y:.2f}x<extra></extra>",
        ))
    fig.add_hline(y=1, line=dict(color="#455a64", dash="dash", width=1))
    _layout(fig, title="Speed-up of the recommended executor over the others (runtime median ratio; > 1: faster)",
            height=420, legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"))
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=layers, tickangle=-60,
                     tickfont=dict(size=9), automargin=True)
    fig.update_yaxes(type="log", dtick=1, title="speed-up (x)")
    return fig


def error_stages(report: Mapping) -> dict[str, dict[str, int]]:
    """``{executor: {stage: count}}`` of the ``error`` verdicts (stage ``?`` when none recorded)."""
    out: dict[str, dict[str, int]] = {name: {} for name in executor_names(report)}
    for op in (report.get("ops") or {}).values():
        for name, entry in (op.get("executors") or {}).items():
            if entry.get("status") == "error" and name in out:
                stage = (entry.get("failure_report") or {}).get("stage") or "?"
                out[name][stage] = out[name].get(stage, 0) + 1
    return out


def error_stage_plot(report: Mapping):
    """Stacked bars: per executor, its ``error`` verdicts by failure stage. None when
    there is no error."""
    counts = error_stages(report)
    stages = sorted({s for per in counts.values() for s in per})
    if not stages:
        return None
    names = list(counts)
    colors = {"import": "#6d4c41", "compile": "#c62828", "session": "#ad1457", "run": "#ef6c00", "compare": "#f9a825",
              "timeout": "#5e35b1", "crash": "#212121", "quantize": "#00838f", "reference": "#8e24aa"}
    fig = go.Figure([go.Bar(x=names, y=[counts[n].get(s, 0) for n in names], name=s,
                            marker_color=colors.get(s, "#78909c"),
                            hovertemplate="%{x}: %{y} error(s) at stage " + s + "<extra></extra>") for s in stages])
    _layout(fig, title="Error verdicts per executor, by failure stage", height=360, barmode="stack", showlegend=True)
    fig.update_yaxes(title="layers")
    return fig
