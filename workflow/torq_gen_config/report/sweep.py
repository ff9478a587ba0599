"""The summary of a model sweep (``<output_dir>/sweep.json`` and ``sweep.html``): per model
its layers, each executor's verdict counts, the recommended executors, the critical layers,
the report and the tool versions; a model that could not run is a row with its reason. The
page adds op type x executor: where each op type fails, and in which models
(docs/sweep.md; schema ``workflow/schemas/sweep.schema.yaml``)."""

from __future__ import annotations

import os
import time
from html import escape
from pathlib import Path
from typing import Iterable, Mapping

from ..core.statuses import HTML_COLORS, STATUSES, SUCCESS
from .files import load_report

SWEEP_SCHEMA = "torq-gen-config/sweep/1"


def model_record(name: str, report_path: str | os.PathLike, report: Mapping) -> dict:
    """One model's row of the summary, from its report."""
    ops = report.get("ops") or {}
    per_executor: dict[str, dict[str, int]] = {}
    for op in ops.values():
        for ex, entry in (op.get("executors") or {}).items():
            st = (entry or {}).get("status")
            counts = per_executor.setdefault(ex, {s: 0 for s in STATUSES})
            counts[st] = counts.get(st, 0) + 1
    rec: dict[str, int] = {}
    for op in ops.values():
        r = op.get("recommended_executor")
        key = r if isinstance(r, str) else "none"
        rec[key] = rec.get(key, 0) + 1
    disc = report.get("discovery_report") or {}
    prov = report.get("provenance") or {}
    return {"name": name, "status": "discovered", "reason": None, "report": str(report_path),
            "model": (prov.get("model") or {}).get("source"), "layers": len(ops),
            "statuses": per_executor, "recommended": rec,
            "critical_layers": len(disc.get("critical_failures") or []),
            "versions": dict(prov.get("versions") or {})}


def failed_record(name: str, model: str, reason: str) -> dict:
    """The row of a model that could not run (unreadable model, missing input data, ...)."""
    return {"name": name, "status": "failed", "reason": reason, "report": None, "model": model, "layers": None,
            "statuses": {}, "recommended": {}, "critical_layers": None, "versions": {}}


def op_type_failures(reports: Mapping[str, Mapping]) -> dict[str, dict[str, dict]]:
    """``{op type: {executor: {"tested": n, "failed": n, "models": [names where it failed]}}}``
    over every model (a verdict that is not ``success`` is a failure here)."""
    out: dict[str, dict[str, dict]] = {}
    for name, report in reports.items():
        for op in (report.get("ops") or {}).values():
            for ex, entry in (op.get("executors") or {}).items():
                cell = out.setdefault(op.get("op_type") or "?", {}).setdefault(ex, {"tested": 0, "failed": 0,
                                                                                   "models": []})
                cell["tested"] += 1
                if (entry or {}).get("status") != SUCCESS:
                    cell["failed"] += 1
                    if name not in cell["models"]:
                        cell["models"].append(name)
    return dict(sorted(out.items()))


def build_sweep(rows: Iterable[Mapping], *, sheet: str, output_dir: str) -> dict:
    """The summary: ``rows`` are ``{"name", "model", "failure", "report"}`` in sheet order
    (``report``: the report JSON's path of a model that ran; ``failure``: why it could not).

    Raises:
        ReportError: a report that should be there is missing or malformed.
    """
    models, reports = [], {}
    for row in rows:
        if row.get("failure"):
            models.append(failed_record(row["name"], row["model"], row["failure"]))
            continue
        report = load_report(row["report"])
        reports[row["name"]] = report
        models.append(model_record(row["name"], row["report"], report))
    executors: list[str] = []
    for m in models:
        executors += [e for e in m["statuses"] if e not in executors]
    return {"schema": SWEEP_SCHEMA, "sheet": str(sheet), "output_dir": str(output_dir),
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "executors": executors, "models": models,
            "totals": {"models": len(models), "failed": sum(1 for m in models if m["status"] == "failed"),
                       "layers": sum(m["layers"] or 0 for m in models)},
            "op_types": op_type_failures(reports)}


def render_sweep_html(summary: Mapping) -> str:
    """One self-contained page: models x executors (success of tested, each status's
    colour), op type x executor (failures of tested; the models they come from), failed
    models with their reason; each model's name links to its report's HTML page."""
    execs = summary.get("executors") or []
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>torq-gen-config sweep</title><style>",
           "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}",
           "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}td.n{text-align:right}",
           ".bad{background:#ffebee}.ok{background:#e8f5e9}</style></head><body>",
           f"<h1>Model sweep</h1><p>{escape(str(summary.get('sheet')))}; {summary['totals']['models']} models, "
           f"{summary['totals']['layers']} layers, {summary['totals']['failed']} failed to run; "
           f"{escape(str(summary.get('generated_at')))}</p>",
           "<h2>Models x executors</h2><table><tr><th>model</th><th>layers</th><th>critical</th>"
           + "".join(f"<th>{escape(e)}</th>" for e in execs) + "<th>recommended</th></tr>"]
    for m in summary.get("models") or []:
        if m["status"] == "failed":
            out.append(f"<tr class='bad'><td>{escape(m['name'])}</td><td colspan='{len(execs) + 3}'>could not run: "
                       f"{escape(str(m['reason']))}</td></tr>")
            continue
        html = Path(m["report"]).with_suffix(".html").name
        link = f"<a href='{escape(m['name'])}/{escape(html)}'>{escape(m['name'])}</a>"
        cells = []
        for e in execs:
            c = m["statuses"].get(e) or {}
            tested = sum(c.values())
            ok = c.get(SUCCESS, 0)
            bad = ", ".join(f"{s} {n}" for s, n in c.items() if s != SUCCESS and n)
            style = f" style='background:{HTML_COLORS[SUCCESS]}22'" if tested and ok == tested else \
                (f" style='background:{HTML_COLORS['difference']}33'" if tested else "")
            cells.append(f"<td class='n'{style} title='{escape(bad)}'>{ok}/{tested}" +
                         (f"<br><small>{escape(bad)}</small>" if bad else "") + "</td>")
        rec = ", ".join(f"{escape(k)} {v}" for k, v in m["recommended"].items())
        out.append(f"<tr><td>{link}</td><td class='n'>{m['layers']}</td><td class='n'>{m['critical_layers']}</td>"
                   + "".join(cells) + f"<td>{rec}</td></tr>")
    out.append("</table><h2>Op type x executor: failures of tested (the models they come from)</h2><table><tr>"
               "<th>op type</th>" + "".join(f"<th>{escape(e)}</th>" for e in execs) + "</tr>")
    for op, row in (summary.get("op_types") or {}).items():
        cells = []
        for e in execs:
            c = row.get(e)
            if not c:
                cells.append("<td></td>")
                continue
            cls = " class='bad'" if c["failed"] else " class='ok'"
            models = f"<br><small>{escape(', '.join(c['models']))}</small>" if c["models"] else ""
            cells.append(f"<td{cls}>{c['failed']}/{c['tested']}{models}</td>")
        out.append(f"<tr><td>{escape(op)}</td>{''.join(cells)}</tr>")
    out.append("</table></body></html>\n")
    return "\n".join(out)
