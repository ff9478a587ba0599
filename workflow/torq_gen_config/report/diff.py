"""Two runs compared verdict by verdict (``torq-gen-config compare OLD NEW``): what a new
compiler build, configuration or tool version changed, per (model, layer, executor).

A side is a report JSON (one model) or a directory: every report JSON
(``torq_gen_config_<name>.json``, not a compiler JSON) in it and in its immediate
subfolders (a sweep's ``<dir>/<model>/``), keyed by the report's model name. Models are
matched by name, layers by layer ID, executors by name; each stored verdict (``success``,
``difference``, ``error``, ``unverified``, ``skipped``) of the old side is set against the
new side's:

- ``regression``: was ``success``, now not (or the entry is gone while the layer stays);
- ``fix``: was not ``success``, now ``success``;
- ``changed``: another non-success status (``error`` -> ``difference``, ...);
- ``added``: an entry only in the new side (a new executor, a new layer).

Layers and executors only on one side are listed too, and a model whose file changed
(``provenance.model.sha256``) is said to have changed: its layers are still matched by ID,
so the verdicts of a re-exported model can be compared. The tool versions
(``provenance.versions``, ``provenance.executor_tools``) and the options
(``provenance.options``) that differ are part of the result. A CI gate for a compiler
upgrade: the command exits 1 when there is a regression.

docs/compare.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..core.errors import ReportError
from ..core.layout import REPORT_PREFIX
from ..core.statuses import SUCCESS
from .files import is_compiler_json, load_report, model_name_of
from .model_explorer import layer_nodes

#: the kinds of change, worst first (the order of the listing and of a layer's colour)
KINDS = ("regression", "changed", "fix", "added")
#: Model Explorer colours of a layer by its worst change (the HTML report's hues)
KIND_COLORS = {"regression": "#c62828", "changed": "#f9a825", "fix": "#2e7d32", "added": "#1e88e5"}
#: options that say where, not how (never a difference between two runs)
_PLACE_OPTIONS = ("model", "output_dir")


def load_side(path: str | os.PathLike) -> dict[str, tuple[Path, dict]]:
    """The reports of one side: ``{model name: (report path, report)}``.

    Raises:
        ReportError: the path does not exist, a file that is not a report JSON (a
            compiler JSON, malformed JSON), a directory without report JSONs, or two
            reports of the same model name in one directory.
    """
    p = Path(path).expanduser()
    if p.is_file():
        report = load_report(p)
        return {model_name_of(report, p)[0]: (p, report)}
    if not p.is_dir():
        raise ReportError(f"{p}: no such report JSON or directory")
    found: dict[str, tuple[Path, dict]] = {}
    candidates = sorted([*p.glob(f"{REPORT_PREFIX}*.json"), *p.glob(f"*/{REPORT_PREFIX}*.json")])
    for f in candidates:
        if f.stem.endswith("_compiler"):
            continue
        report = load_report(f)
        if is_compiler_json(report):
            continue
        name = model_name_of(report, f)[0]
        if name in found:
            raise ReportError(f"{p}: two reports of model {name!r} ({found[name][0]} and {f}); compare them one by one")
        found[name] = (f, report)
    if not found:
        raise ReportError(f"{p}: no report JSON ({REPORT_PREFIX}<model>.json) in it or its subfolders")
    return found


def _statuses(report: Mapping) -> dict[str, dict[str, str | None]]:
    """``{layer ID: {executor: stored status}}``; a layer's ``op_type`` under ``""``."""
    out: dict[str, dict[str, str | None]] = {}
    for lid, op in (report.get("ops") or {}).items():
        row: dict[str, str | None] = {"": op.get("op_type")}
        for ex, entry in (op.get("executors") or {}).items():
            row[ex] = (entry or {}).get("status")
        out[lid] = row
    return out


def _kind(old: str | None, new: str | None) -> str | None:
    if old == new:
        return None
    if old is None:
        return "added"
    if old == SUCCESS:
        return "regression"
    if new == SUCCESS:
        return "fix"
    return "changed"


def diff_reports(old: Mapping, new: Mapping) -> dict:
    """The verdicts of one model that changed between two reports.

    Returns:
        ``{"model_changed": bool | None (None: a side has no digest), "sha256": [old, new],
        "changes": [{"layer", "op_type", "executor", "old", "new", "kind", "summary"}]
        (layer order of the new report, then the old one's removed layers), "counts":
        {kind: n}, "layers_added": [layer], "layers_removed": [layer], "executors_added":
        [name], "executors_removed": [name], "recommendations": [{"layer", "old", "new"}]}``.
        An entry gone while its layer stays (an executor no longer run there) is a
        ``regression`` when it was a success, else left out; a removed layer's verdicts
        are not changes (the layer is listed).
    """
    a, b = _statuses(old), _statuses(new)
    ex_a = [e.get("name") if isinstance(e, Mapping) else e for e in (old.get("executors") or _executors_of(a))]
    ex_b = [e.get("name") if isinstance(e, Mapping) else e for e in (new.get("executors") or _executors_of(b))]
    changes: list[dict] = []
    for lid, row in b.items():
        was = a.get(lid)
        if was is None:
            continue
        for ex in [*row, *[e for e in was if e not in row]]:
            if ex == "":
                continue
            kind = _kind(was.get(ex), row.get(ex))
            if kind is None or (row.get(ex) is None and kind != "regression"):
                continue
            entry = ((new.get("ops") or {}).get(lid, {}).get("executors") or {}).get(ex) or {}
            changes.append({"layer": lid, "op_type": row.get("") or was.get(""), "executor": ex,
                            "old": was.get(ex), "new": row.get(ex), "kind": kind,
                            "summary": (entry.get("failure_report") or {}).get("summary")
                            if isinstance(entry.get("failure_report"), Mapping) else None})
    recs = []
    for lid, op in (new.get("ops") or {}).items():
        before = ((old.get("ops") or {}).get(lid) or {})
        if lid in a and before.get("recommended_executor") != op.get("recommended_executor"):
            recs.append({"layer": lid, "old": before.get("recommended_executor"), "new": op.get("recommended_executor")})
    sha = [((r.get("provenance") or {}).get("model") or {}).get("sha256") for r in (old, new)]
    counts = {k: sum(1 for c in changes if c["kind"] == k) for k in KINDS}
    return {"model_changed": (sha[0] != sha[1]) if all(sha) else None, "sha256": sha, "changes": changes,
            "counts": counts, "layers_added": [lid for lid in b if lid not in a],
            "layers_removed": [lid for lid in a if lid not in b],
            "executors_added": [e for e in ex_b if e not in ex_a], "executors_removed": [e for e in ex_a if e not in ex_b],
            "recommendations": recs}


def _executors_of(statuses: Mapping[str, Mapping]) -> list[str]:
    out: list[str] = []
    for row in statuses.values():
        out += [e for e in row if e and e not in out]
    return out


def _differing(a: Mapping | None, b: Mapping | None, skip: tuple[str, ...] = ()) -> dict[str, list]:
    """``{key: [old, new]}`` of the keys whose values differ (a key on one side only too)."""
    a, b = dict(a or {}), dict(b or {})
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if k not in skip and a.get(k) != b.get(k)}


def compare_sides(old: Mapping[str, tuple[Path, dict]], new: Mapping[str, tuple[Path, dict]]) -> dict:
    """Both sides compared (:func:`load_side`'s results).

    Returns:
        ``{"models": {name: {"status": "compared" | "added" | "removed", "old_report",
        "new_report", **diff_reports(...) when compared, "versions": {key: [old, new]},
        "executor_tools": {...}, "options": {...}}}, "counts": {kind: n} (all models),
        "regressions": n, "models_added": [name], "models_removed": [name]}`` (models in
        the new side's order, then the removed ones).
    """
    models: dict[str, dict] = {}
    for name in [*new, *[n for n in old if n not in new]]:
        o, n = old.get(name), new.get(name)
        rec: dict[str, Any] = {"old_report": str(o[0]) if o else None, "new_report": str(n[0]) if n else None}
        if o and n:
            po, pn = (o[1].get("provenance") or {}), (n[1].get("provenance") or {})
            rec.update(status="compared", **diff_reports(o[1], n[1]),
                       versions=_differing(po.get("versions"), pn.get("versions")),
                       executor_tools=_differing(po.get("executor_tools"), pn.get("executor_tools")),
                       options=_differing(po.get("options"), pn.get("options"), skip=_PLACE_OPTIONS))
        else:
            rec["status"] = "added" if n else "removed"
        models[name] = rec
    counts = {k: sum((m.get("counts") or {}).get(k, 0) for m in models.values()) for k in KINDS}
    return {"models": models, "counts": counts, "regressions": counts["regression"],
            "models_added": [k for k, m in models.items() if m["status"] == "added"],
            "models_removed": [k for k, m in models.items() if m["status"] == "removed"]}


def render_text(result: Mapping, *, limit: int = 50) -> str:
    """The comparison as plain lines: per model its changes grouped by kind (``limit``
    lines per group), layers and executors added or removed, changed recommendations,
    differing versions and options; a closing line with the totals."""
    lines: list[str] = []
    for name, m in (result.get("models") or {}).items():
        if m["status"] != "compared":
            lines.append(f"== {name}: model {m['status']} ({m.get('new_report') or m.get('old_report')})")
            continue
        what = ("the model file changed" if m.get("model_changed") else
                "same model file" if m.get("model_changed") is False else "model file digest not recorded")
        c = m["counts"]
        lines.append(f"== {name}: {what}; " + ", ".join(f"{k} {c[k]}" for k in KINDS))
        for kind in KINDS:
            rows = [x for x in m["changes"] if x["kind"] == kind]
            if not rows:
                continue
            lines.append(f"  {kind.upper()} ({len(rows)}):")
            for x in rows[:limit]:
                tail = f": {x['summary']}" if x.get("summary") and x["kind"] in ("regression", "changed") else ""
                lines.append(f"    {x['layer']} ({x['op_type']}) on {x['executor']}: {x['old'] or '-'} -> "
                             f"{x['new'] or '-'}{tail}")
            if len(rows) > limit:
                lines.append(f"    ... and {len(rows) - limit} more (--json has them all)")
        for key, label in (("layers_added", "layers added"), ("layers_removed", "layers removed"),
                           ("executors_added", "executors added"), ("executors_removed", "executors removed")):
            if m.get(key):
                more = f" ... and {len(m[key]) - limit} more" if len(m[key]) > limit else ""
                lines.append(f"  {label} ({len(m[key])}): {', '.join(m[key][:limit])}{more}")
        if m.get("recommendations"):
            recs = m["recommendations"]
            lines.append(f"  recommendation changed on {len(recs)} layer(s): " + ", ".join(
                f"{r['layer']} {r['old'] or 'none'} -> {r['new'] or 'none'}" for r in recs[:10]) + (" ..." if len(recs) > 10 else ""))
        for key, label in (("versions", "version"), ("executor_tools", "executor"), ("options", "option")):
            for k, (a, b) in (m.get(key) or {}).items():
                if isinstance(a, Mapping) and isinstance(b, Mapping):  # only what differs inside
                    for sub, (x, y) in _differing(a, b).items():
                        lines.append(f"  {label} {k} {sub}: {_short(x)} -> {_short(y)}")
                else:
                    lines.append(f"  {label} {k}: {_short(a)} -> {_short(b)}")
    c = result.get("counts") or {}
    lines.append("Total: " + ", ".join(f"{k} {c.get(k, 0)}" for k in KINDS)
                 + (f"; models added: {', '.join(result['models_added'])}" if result.get("models_added") else "")
                 + (f"; models removed: {', '.join(result['models_removed'])}" if result.get("models_removed") else ""))
    return "\n".join(lines) + "\n"


def _short(value: Any, chars: int = 120) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= chars else text[:chars - 4] + " ..."


def change_overlay(model: Mapping, report: Mapping, graph) -> dict:
    """A Model Explorer node-data overlay of one compared model's changes (the format of
    :mod:`.model_explorer`): per changed layer its node, the value ``"<kind>: <executor>
    <old> -> <new>; ..."`` and the colour of its worst change (:data:`KIND_COLORS`).

    Args:
        model: one entry of :func:`compare_sides`' ``models`` (``status: compared``).
        report: the new side's report; ``graph``: its model's main graph.

    Raises:
        ReportError: the report does not fit the graph.
    """
    layers, _ = layer_nodes(report, graph)
    by_layer: dict[str, list[dict]] = {}
    for x in model.get("changes") or []:
        by_layer.setdefault(x["layer"], []).append(x)
    results = {}
    for lid, rows in by_layer.items():
        if lid not in layers:
            continue
        worst = min(rows, key=lambda x: KINDS.index(x["kind"]))["kind"]
        results[layers[lid]] = {"value": "; ".join(f"{x['kind']}: {x['executor']} {x['old'] or '-'} -> "
                                                   f"{x['new'] or '-'}" for x in rows),
                                "bgColor": KIND_COLORS[worst]}
    for lid in model.get("layers_added") or []:
        if lid in layers and layers[lid] not in results:
            results[layers[lid]] = {"value": "added layer", "bgColor": KIND_COLORS["added"]}
    return {graph.name: {"results": results}}
