"""The model graph of the HTML report (:mod:`torq_gen_config.report.html`): the layers as
nodes, the tensors between them as edges, laid out as a DAG in the browser.

The report JSON holds the layers' verdicts but not their tensors or ONNX node names; those
come from the layers manifest of the run (``work/<model>/layers/manifest.json``: each
layer's ``inputs``, ``outputs`` and ``node_name``), found next to the report
(:func:`find_manifest`). Without it the page says "graph unavailable: ...". An edge joins
the layer that writes a tensor to each layer that reads it (tensors from the model's inputs,
initializers or folded constants join nothing).

Scopes come from the node names (``/encoder/layers.3/attn/MatMul`` is in the scopes
``encoder``, ``encoder/layers.3``, ``encoder/layers.3/attn``). A collapsed scope is one node;
the page starts at the deepest scope level whose visible node count is at most
:data:`MAX_VISIBLE` (:func:`initial_level`). The page's script (``assets/graph.js``) lays
out what is visible with dagre (``assets/dagre.min.js``, vendored, MIT) and colours each node
by its worst verdict or its recommended executor. Nothing is re-judged here: every status
and mark is the report's.
"""

from __future__ import annotations

import json
from collections import Counter
from html import escape
from pathlib import Path
from typing import Mapping

from ..core.layout import MANIFEST_FILE, work_dir
from ..core.lazy import resources
from ..core.statuses import DISPLAY_STATUSES, HTML_COLORS, SEVERITY, worst
from .cells import cell_status, executor_colors, executor_names

#: Most nodes the graph shows at first: larger graphs start with scopes collapsed.
MAX_VISIBLE = 300
#: Display statuses from best to worst (a layer's colour is its worst verdict; a collapsed
#: scope's, the worst of its members).
#: Colour of a layer without a recommendation (executors: ``cells.executor_colors``).
NO_RECOMMENDATION_COLOR = "#b0bec5"
#: The report's marks shown on a node, with the ``discovery_report`` list each comes from.
#: ``critical`` draws a thick red outline, ``dispute`` a warning badge, ``success*`` a star,
#: the others (verdicts that cannot vouch for the layer) a dashed outline.
FLAG_SOURCES = (("critical", "critical_failures"), ("dispute", "reference_disputes"),
                ("success*", "inconclusive_checks"), ("unverified", "reference_failures"),
                ("onnx reference", "reference_fallbacks"), ("not testable", "not_testable"),
                ("generated inputs", "generated_inputs"), ("blind spot", "blind_spots"))
BLIND_FLAGS = ("unverified", "onnx reference", "not testable", "generated inputs", "blind spot")


def find_manifest(report_path: str | Path, report: Mapping) -> Path | None:
    """The layers manifest of ``report`` (at ``report_path``), or None when none is there:
    the subgraph's work directory, else the report's ``work_dir``, else ``work/<model>``,
    each relative to the report's folder, with ``layers/manifest.json``."""
    base = Path(report_path).parent
    dirs = [(report.get("subgraph") or {}).get("work_dir"), (report.get("work_dir") or {}).get("path")]
    if report.get("model_name"):
        dirs.append(work_dir(str(report["model_name"])))
    for d in dirs:
        if isinstance(d, str) and d:
            path = base / d / "layers" / MANIFEST_FILE
            if path.is_file():
                return path
    return None


def scope_of(node_name: str | None) -> tuple[str, ...]:
    """The scopes of an ONNX node name, outermost first: ``/encoder/layers.3/attn/MatMul``
    -> ``("encoder", "layers.3", "attn")``; a name without ``/`` has none."""
    parts = [p for p in (node_name or "").split("/") if p]
    return tuple(parts[:-1])


def layer_flags(report: Mapping) -> dict[str, list[str]]:
    """``{layer_id: [flag, ...]}``: the report's marks of each layer (:data:`FLAG_SOURCES`),
    read from its ``discovery_report`` lists."""
    dr = report.get("discovery_report") or {}
    out: dict[str, list[str]] = {}
    for flag, key in FLAG_SOURCES:
        for item in dr.get(key) or []:
            lid = item.get("layer_id") if isinstance(item, Mapping) else None
            if lid is not None and flag not in out.setdefault(lid, []):
                out[lid].append(flag)
    return out


def full_run_placement(report: Mapping) -> dict[str, dict]:
    """``{layer_id: {executor, partition, pid, check, run_status}}`` from the report's
    ``full_model`` (``torq-gen-config run``); empty without one. After a one-module run
    (``full_model.placement``) also ``ran_on`` (executors its dispatches ran on, read
    back) and ``placement`` (``as assigned`` / ``elsewhere`` / ``no kernel``). A layer whose assignment
    changed since that run (:func:`~torq_gen_config.fullrun.report_section.stale_layers`, the rule
    ``view`` uses for "OUT OF DATE") also has ``stale: True``, ``stale_reason`` and ``now``
    (the executor recommended now): its placement is not the current assignment's."""
    fm = report.get("full_model") or {}
    if not fm:
        return {}
    # imported only here: a report without a full-model result imports no backend
    from ..fullrun.report_section import stale_layers

    status = fm.get("status")
    executors = (fm.get("assignment") or {}).get("layer_executors") or {}
    out = {lid: {"executor": ex, "run_status": status} for lid, ex in executors.items()}
    for p in fm.get("partitions") or []:
        check = p.get("partition_check") or {}
        for lid in p.get("layer_ids") or []:
            out.setdefault(lid, {"executor": p.get("executor"), "run_status": status}).update(
                partition=p.get("index"), pid=p.get("pid"), check=check.get("status"),
                check_summary=check.get("summary"))
    for lid, row in (((fm.get("placement") or {}).get("layers")) or {}).items():  # module mode: read back
        out.setdefault(lid, {"executor": row.get("assigned"), "run_status": status}).update(
            ran_on=list(row.get("ran_on") or []), placement=row.get("status"))
    for lid, (was, now) in stale_layers(fm, report.get("ops") or {}).items():
        out.setdefault(lid, {"executor": was, "run_status": status}).update(
            stale=True, now=now, stale_reason=f"assignment changed since: {was} -> {now}")
    return out


def edges_of(layers: list[Mapping]) -> list[tuple[int, int, str]]:
    """``(writer, reader, tensor)`` for every tensor one layer writes and another reads
    (indices into ``layers``, whose entries have ``outputs`` and ``inputs``: ``[{name}]``),
    without repeats."""
    writer: dict[str, int] = {}
    for i, layer in enumerate(layers):
        for t in layer.get("outputs") or []:
            writer.setdefault(t.get("name"), i)
    out, seen = [], set()
    for j, layer in enumerate(layers):
        for t in layer.get("inputs") or []:
            i = writer.get(t.get("name"))
            if i is not None and i != j and (i, j) not in seen:
                seen.add((i, j))
                out.append((i, j, t.get("name")))
    return out


def visible_count(scopes: list[tuple[str, ...]], level: int | None) -> int:
    """How many nodes show when every scope deeper than ``level`` is collapsed (None:
    none is). A layer shows as the outermost collapsed scope above it that holds more than
    one layer (a scope of one layer shows as that layer), else as itself."""
    sizes = scope_sizes(scopes)
    shown = set()
    for i, sc in enumerate(scopes):
        shown.add(_representative(i, sc, level, sizes))
    return len(shown)


def scope_sizes(scopes: list[tuple[str, ...]]) -> Counter:
    """Number of layers in each scope (key: the scope's path joined with ``/``)."""
    sizes: Counter = Counter()
    for sc in scopes:
        for d in range(1, len(sc) + 1):
            sizes["/".join(sc[:d])] += 1
    return sizes


def _representative(i: int, scope: tuple[str, ...], level: int | None, sizes: Counter):
    if level is not None:
        for d in range(level + 1, len(scope) + 1):
            path = "/".join(scope[:d])
            if sizes[path] > 1:
                return "s:" + path
    return i


def initial_level(scopes: list[tuple[str, ...]], max_visible: int = MAX_VISIBLE) -> int | None:
    """The scope level the page starts at: None (nothing collapsed) when every layer fits in
    ``max_visible`` nodes, else the deepest level whose visible count fits (0: every
    top-level scope collapsed, also when even that does not fit)."""
    if len(scopes) <= max_visible:
        return None
    depth = max((len(s) for s in scopes), default=0)
    for level in range(depth - 1, -1, -1):
        if visible_count(scopes, level) <= max_visible:
            return level
    return 0


def graph_data(report: Mapping, manifest: Mapping | None, *, max_visible: int = MAX_VISIBLE,
               manifest_error: str | None = None) -> dict:
    """What the page's script draws: ``nodes`` (one per layer of the report, in report order:
    ``id``, ``row`` (its row in the status matrix, the key of its cell details), ``op``, ``name``
    (ONNX node name), ``scope``, ``worst``, ``rec``, ``verdicts`` ({executor: display status}),
    ``flags``, ``full`` (the full-model run's placement, when there is one)), ``edges``
    (``[writer, reader, tensor]``), ``level`` (:func:`initial_level`), the colours and the
    legend; or ``{"unavailable": reason}`` when there is no manifest (``manifest_error``: why
    the one there could not be read, naming the file) or it names none of the report's
    layers. ``full_model_stale``: why the full-model result is out of date (the words of
    ``view``), or None; the layers it moved have ``stale`` in their ``full``."""
    ops = report.get("ops") or {}
    if not ops:
        return {"unavailable": "the report has no layers"}
    if manifest is None and manifest_error:
        return {"unavailable": f"the layers manifest could not be read: {manifest_error}"}
    if manifest is None:
        return {"unavailable": "no layers manifest (work/<model>/layers/manifest.json) next to the report; "
                               "the tensors between the layers are recorded there"}
    if not isinstance(manifest, Mapping):
        return {"unavailable": "the layers manifest is not a JSON object"}
    by_id = {m.get("layer_id"): m for m in manifest.get("layers") or [] if isinstance(m, Mapping)}
    if not any(lid in by_id for lid in ops):
        return {"unavailable": "the layers manifest names none of the report's layers (another run's?)"}
    names = executor_names(report)
    flags = layer_flags(report)
    full = full_run_placement(report)
    layers = [by_id.get(lid) or {} for lid in ops]
    nodes = []
    for row, lid in enumerate(ops):
        op = ops[lid]
        verdicts = {n: cell_status((op.get("executors") or {}).get(n)) for n in names}
        node_name = layers[row].get("node_name") or ""
        node = {"id": lid, "row": row, "op": op.get("op_type") or layers[row].get("op_type") or "?",
                "name": node_name, "scope": list(scope_of(node_name)), "worst": worst(verdicts.values()),
                "rec": op.get("recommended_executor"), "verdicts": verdicts, "flags": flags.get(lid, [])}
        if lid in full:
            node["full"] = full[lid]
        nodes.append(node)
    scopes = [tuple(n["scope"]) for n in nodes]
    missing = sum(1 for lid in ops if lid not in by_id)
    return {
        "nodes": nodes, "edges": [list(e) for e in edges_of(layers)], "executors": names,
        "level": initial_level(scopes, max_visible), "max_visible": max_visible,
        "depth": max((len(s) for s in scopes), default=0),
        "status_colors": {s: HTML_COLORS[s] for s in DISPLAY_STATUSES}, "status_rank": list(SEVERITY),
        "executor_colors": executor_colors(names), "none_color": NO_RECOMMENDATION_COLOR,
        "blind_flags": list(BLIND_FLAGS), "full_model": bool(report.get("full_model")),
        "full_model_stale": full_model_stale(report),
        "note": f"{missing} layers of the report are not in the layers manifest: shown without edges"
                if missing else None,
    }


def full_model_stale(report: Mapping) -> str | None:
    """Why the report's full-model result is out of date (the same words as ``view``), or None."""
    if not report.get("full_model"):
        return None
    from ..fullrun.report_section import stale_reason  # light: as in full_run_placement

    return stale_reason(report["full_model"], report.get("ops") or {})


def majority_recommendation(recs: list[str | None], names: list[str]) -> str | None:
    """The recommendation most members of a collapsed scope share (ties: priority order,
    then "none"); the page's script does the same."""
    counts = Counter(recs)
    order = list(names) + [None]
    return max(order, key=lambda r: (counts.get(r, 0), -order.index(r))) if counts else None


def asset(name: str) -> str:
    """The text of one of the graph's page assets (``assets/graph.js``, ``graph.css``,
    ``dagre.min.js``), shipped as package data."""
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def graph_html(data: Mapping) -> str:
    """The page's graph section for :func:`graph_data` ``data``: the toolbar (colour switch,
    scope level, search, zoom), the legend, the drawing and the details panel, the data, the
    styles and the scripts (dagre and assets/graph.js, inlined: no network). The matrix's
    click details (``#cell-details``) give the per-executor details of a layer. With
    ``unavailable`` in ``data``, one line that says why."""
    head = "<h2>Model graph</h2>"
    if data.get("unavailable"):
        return head + f'<p class="note" id="graph-unavailable">graph unavailable: {escape(data["unavailable"])}</p>'
    n = len(data["nodes"])
    intro = (f'<p class="note">{n} layers, {len(data["edges"])} tensor edges between them (model inputs, '
             "weights and folded constants are not drawn). Scopes from the ONNX node names collapse into one "
             "node (a stacked box, coloured by its worst member or the recommendation most members have): click "
             "it to expand; a layer's panel collapses its scopes again. "
             + (f"Starts with the scopes below depth {data['level']} collapsed, to keep the view under "
                f"{data['max_visible']} nodes. " if data["level"] is not None else "")
             + "Drag to pan, wheel to zoom, click a layer for its verdicts.</p>")
    if data.get("note"):
        intro += f'<p class="note">{escape(data["note"])}</p>'
    toolbar = ('<div class="graph-toolbar"><span>colour by: <label><input type="radio" name="graph-color" '
               'value="worst" checked> worst verdict</label> <label><input type="radio" name="graph-color" '
               'value="rec"> recommended executor</label></span>'
               '<label>scopes: <select id="graph-level"></select></label>'
               '<span><input type="search" id="graph-search" placeholder="find a layer: name, ID or op type"> '
               '<button id="graph-search-go">find</button> <span id="graph-search-result" class="note"></span></span>'
               '<span><button id="graph-fit">fit</button> <button id="graph-zoom-in">+</button> '
               '<button id="graph-zoom-out">&minus;</button></span></div>')
    drawing = ('<div id="graph-legend"></div><div class="graph-body" id="graph-box">'
               '<svg id="graph-svg" xmlns="http://www.w3.org/2000/svg"><defs><marker id="graph-arrow" '
               'viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
               '<path d="M 0 0 L 10 5 L 0 10 z" fill="#90a4ae"/></marker></defs><g id="graph-viewport"></g></svg>'
               '<div id="graph-detail" class="note">click a layer for its verdicts, metrics and errors</div></div>')
    payload = json.dumps(data, separators=(",", ":"), default=str).replace("</", "<\\/")
    return (head + intro + f"<style>{asset('graph.css')}</style>" + toolbar + drawing
            + f'<script type="application/json" id="graph-data">{payload}</script>')


def graph_scripts(data: Mapping) -> str:
    """The graph's scripts (dagre, then assets/graph.js), to put after ``#cell-details``;
    empty when the graph is unavailable."""
    if data.get("unavailable"):
        return ""
    return f"<script>{asset('dagre.min.js')}</script><script>{asset('graph.js')}</script>"
