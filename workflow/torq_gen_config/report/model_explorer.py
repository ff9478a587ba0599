"""Model Explorer overlays of a report: node-data files for Google's Model Explorer
(PyPI ``ai-edge-model-explorer``) opened on the user's ONNX model.

Each file is one overlay ("node data") in the format of
``model_explorer.node_data_builder.ModelNodeData``: ``{graph id: {"results": {node id:
{"value": ..., "bgColor": ...}}, "thresholds" | "gradient": ...}}``, written here as plain
JSON (no import of ``model_explorer``). Files (``<dir>/``):

- ``recommended.json``: per layer, the recommended executor (coloured per executor);
- ``verdict_<executor>.json``: per layer, that executor's display status (``success``,
  ``success*``, ``difference``, ``error``, ``unverified``, ``skipped``, ``not tested``;
  the HTML report's colours);
- ``max_rel_diff_<executor>.json``: the largest relative difference (``thresholds``: one
  colour per decade);
- ``runtime_<executor>.json``: the runtime median in ms (``gradient``: fast green to slow
  red), only when timing was collected (``--collect-timing``).

Keys are the node ids that Model Explorer's ONNX adapter (PyPI ``model-explorer-onnx``)
gives the nodes of the model's main graph: the node's name, or for an unnamed node or a
repeated name the name its ``NameFixPass`` (from ``onnx_ir``) makes (``node``, ``node_1``,
...; ``dup_1`` for a second ``dup``), counted over the whole model including If/Loop
bodies (:func:`adapter_node_ids`). The graph id is the main graph's name. Layers the
product folded away (``folded_nodes``: constant subexpressions) are marked ``folded`` in
the recommended and verdict overlays and have no metric; ``Constant`` nodes and nodes
inside If/Loop/Scan bodies have no data (the If/Loop node itself is the layer).
docs/model_explorer.md.
"""

from __future__ import annotations

import collections
import math
import os
import re
import shlex
from pathlib import Path
from typing import Mapping


from ..config import resolve_model_path
from ..core.errors import ConfigError, OutputDirError, ReportError
from ..core.fileio import atomic_write_files, json_bytes
from ..core.lazy import onnx
from ..model.prepare import load_model
from ..core.statuses import HTML_COLORS
from .cells import cell_status, executor_colors, executor_names
from .files import load_report
from .recommend import runtime_median_ms
from .staleness import staleness

__all__ = ["adapter_node_ids", "layer_nodes", "overlays", "write_model_explorer", "FOLDED", "NO_RECOMMENDATION"]

#: The value of a folded layer (a constant subexpression the product computed ahead).
FOLDED = "folded"
#: The recommended-executor value of a layer with no recommendation.
NO_RECOMMENDATION = "none"
FOLDED_COLOR = "#b0bec5"
NO_RECOMMENDATION_COLOR = "#eceff1"
#: max_rel_diff thresholds: one colour per decade up to 1, then everything above.
REL_DIFF_THRESHOLDS = ((1e-6, "#1b5e20"), (1e-5, "#2e7d32"), (1e-4, "#66bb6a"), (1e-3, "#c0ca33"),
                       (1e-2, "#fdd835"), (1e-1, "#fb8c00"), (1.0, "#e53935"), (1e300, "#b71c1c"))
RUNTIME_GRADIENT = ((0.0, "#43a047"), (0.5, "#fdd835"), (1.0, "#e53935"))
#: File-name patterns written here: stale files of these names are removed from the directory.
_PATTERNS = (re.compile(r"recommended\.json"), re.compile(r"(verdict|max_rel_diff|runtime)_[A-Za-z0-9._-]+\.json"))
_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def adapter_node_ids(graph) -> list[str]:
    """The node ids Model Explorer's ONNX adapter gives the nodes of ``graph`` (a
    ``GraphProto``, the model's main graph), in graph order.

    The adapter (``model_explorer_onnx.main.ONNXAdapter.convert``) first runs ``onnx_ir``'s
    ``NameFixPass``: graphs are visited depth first (a node, then the graphs of its
    attributes), node names are unique per graph, an unnamed node gets ``node`` and a
    repeated name ``<name>``; taken names get ``_1``, ``_2``, ... from one counter per
    preferred name shared by all graphs of the model. The node id is the fixed name.
    """
    return _fix_names(graph, collections.Counter())


def _fix_names(graph, counter: collections.Counter) -> list[str]:
    used: set[str] = set()
    ids = []
    for node in graph.node:
        name = node.name
        if not name or name in used:
            preferred = name or "node"
            name = preferred
            while name in used:
                counter[preferred] += 1
                name = f"{preferred}_{counter[preferred]}"
        used.add(name)
        ids.append(name)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _fix_names(a.g, counter)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _fix_names(g, counter)
    return ids


def layer_nodes(report: Mapping, graph) -> tuple[dict[str, str], dict[str, str]]:
    """The node id of each layer of ``report`` and of each folded node, in ``graph`` (the
    main graph of the model the report was made from).

    A layer's ``_node_index`` counts the graph's non-``Constant`` nodes (also in subgraph
    mode: it refers to the user's model); its node must have the layer's op type and
    layer ID ``<OpType>_<first output>``.

    Returns:
        ``({layer ID: node id}, {folded node's first output: node id})``.

    Raises:
        ReportError: a layer has no such node (the model is not the report's).
    """
    ids = adapter_node_ids(graph)
    positions = [i for i, n in enumerate(graph.node) if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))]
    by_layer_id = {}
    for k, i in enumerate(positions):
        node = graph.node[i]
        first = next((t for t in node.output if t), f"node{k}")
        by_layer_id.setdefault(f"{node.op_type}_{first}", k)

    def node_at(k, what: str, op_type) -> int:
        if not isinstance(k, int) or not 0 <= k < len(positions) or graph.node[positions[k]].op_type != op_type:
            raise ReportError(f"{what} is not node {k} of the model's graph {graph.name!r} (it has "
                              f"{len(positions)} non-Constant nodes): is this the model the report was made from? "
                              "Give it with --model, or rerun discover")
        return positions[k]

    layers = {}
    for layer_id, op in (report.get("ops") or {}).items():
        k = op.get("_node_index")
        if not isinstance(k, int):
            k = by_layer_id.get(layer_id)
        i = node_at(k, f"layer {layer_id}", op.get("op_type") or layer_id.split("_", 1)[0])
        node = graph.node[i]
        first = next((t for t in node.output if t), f"node{k}")
        if f"{node.op_type}_{first}" != layer_id:
            raise ReportError(f"layer {layer_id} is not node {k} of the model ({node.op_type}_{first}): is this the "
                              "model the report was made from? Give it with --model, or rerun discover")
        layers[layer_id] = ids[i]
    folded = {}
    for f in report.get("folded_nodes") or []:
        outs = [t for t in f.get("outputs") or [] if t]
        i = node_at(f.get("node_index"), f"folded node {f.get('op_type')} {outs}", f.get("op_type"))
        folded[outs[0] if outs else str(f.get("node_index"))] = ids[i]
    return layers, folded


def _file_part(name: str) -> str:
    return _BAD.sub("_", name).strip("._") or "executor"


def _graph_data(graph_id: str, results: dict, **colours) -> dict:
    return {graph_id: {"results": results, **colours}}


def _finite(x) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def overlays(report: Mapping, graph) -> dict[str, dict]:
    """The overlays of ``report`` on ``graph`` (the main graph of its model): file name ->
    ``ModelNodeData`` JSON (module docstring). Runtime overlays only for executors with at
    least one runtime median (timing collected); runs that ended in ``error`` or were
    ``skipped`` have none, as in the report's timing summary.

    Raises:
        ReportError: the report does not fit the graph (:func:`layer_nodes`).
    """
    layers, folded = layer_nodes(report, graph)
    ops = report.get("ops") or {}
    names = executor_names(report)
    gid = graph.name
    colour = executor_colors(names)
    folded_results = {nid: {"value": FOLDED, "bgColor": FOLDED_COLOR} for nid in folded.values()}

    rec = {}
    for layer_id, nid in layers.items():
        r = ops[layer_id].get("recommended_executor")
        rec[nid] = ({"value": r, "bgColor": colour.get(r, NO_RECOMMENDATION_COLOR)} if isinstance(r, str)
                    else {"value": NO_RECOMMENDATION, "bgColor": NO_RECOMMENDATION_COLOR})
    files = {"recommended.json": _graph_data(gid, {**rec, **folded_results})}
    for name in names:
        part = _file_part(name)
        verdicts, rel, runtime = {}, {}, {}
        for layer_id, nid in layers.items():
            entry = (ops[layer_id].get("executors") or {}).get(name)
            status = cell_status(entry)
            verdicts[nid] = {"value": status, "bgColor": HTML_COLORS[status]}
            if not entry:
                continue
            value = _finite((entry.get("metrics") or {}).get("max_rel_diff"))
            if value is not None:
                rel[nid] = {"value": value}
            ms = runtime_median_ms(entry) if entry.get("status") not in ("error", "skipped") else None
            if ms is not None:
                runtime[nid] = {"value": ms}
        files[f"verdict_{part}.json"] = _graph_data(gid, {**verdicts, **folded_results})
        files[f"max_rel_diff_{part}.json"] = _graph_data(
            gid, rel, thresholds=[{"value": v, "bgColor": c} for v, c in REL_DIFF_THRESHOLDS])
        if runtime:
            files[f"runtime_{part}.json"] = _graph_data(
                gid, runtime, gradient=[{"stop": s, "bgColor": c} for s, c in RUNTIME_GRADIENT])
    return files


def write_model_explorer(report_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                         model_path: str | os.PathLike | None = None) -> tuple[list[Path], list[str], str]:
    """Write the overlays of a report into ``out_dir`` (created; files of these names from
    an earlier call that this one does not write, e.g. runtime overlays of a run with
    timing, are removed; nothing else in it is touched).

    Args:
        report_path: the report JSON.
        out_dir: the directory for the node-data files.
        model_path: the model the report was made from, as ``--model`` takes it (also
            ``onnx:<path in the onnx package>``; default: the model file the report names,
            ``provenance.model.source``).

    Returns:
        (the files written in a useful order: recommended, then per executor verdict,
        max_rel_diff, runtime; the report's staleness warnings; the model's path).

    Raises:
        ReportError: the report is missing or malformed, or does not fit the model.
        ConfigError: no model given and the report names none that exists.
        ModelError: the model file is missing or not ONNX.
        OutputDirError: ``out_dir`` cannot be created (e.g. it is a file) or written.
    """
    report_path = Path(report_path)
    report = load_report(report_path)
    if model_path is None:
        source = ((report.get("provenance") or {}).get("model") or {}).get("source")
        if not isinstance(source, str) or not Path(source).is_file():
            how = f"give --model, e.g. `report {shlex.quote(str(report_path))} --model M --model-explorer DIR`"
            raise ConfigError(f"--model-explorer needs the model the report was made from: {how} (the report "
                              f"names {source!r}, which is not there)" if source else
                              f"--model-explorer needs the model the report was made from: {how}")
        model_path = source
    model_path = resolve_model_path(str(model_path))
    warnings = staleness(report_path, report, model_path)
    graph = load_model(model_path, graph_only=True).graph
    files = overlays(report, graph)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        reason = "it is a file" if out.is_file() else (e.strerror or str(e))
        raise OutputDirError(f"cannot create the Model Explorer output directory {out}: {reason}") from None
    try:
        atomic_write_files({out / name: json_bytes(data) for name, data in files.items()})
        for old in out.iterdir():
            if old.name not in files and old.is_file() and any(p.fullmatch(old.name) for p in _PATTERNS):
                old.unlink()
    except OSError as e:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        raise OutputDirError(f"cannot write the Model Explorer output directory {out}: "
                             f"{e.strerror or e}{where}") from None
    return [out / name for name in files], warnings, str(model_path)
