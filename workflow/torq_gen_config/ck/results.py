"""Selecting configurations to run and assembling ``profiler_results.json``.

The results file is the seed's format (``timestamp``, ``stats`` with total / success /
failed / skipped, one ``results`` entry per configuration run) with more per entry: the
status (success, failed, timeout, crash, skipped), the signal, the parsed best instance,
every instance, avg_time_ms, tflops, gb_per_s, the notes and the per-config log.
Identical configurations (same op and arguments) are run once; each of their entries in the
configurations file gets the result.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from ..core.errors import TorqGenConfigError
from ..core.fileio import read_json
from . import profiler_args as pa

RESULTS_FORMAT_VERSION = "1.0"


def load_configs(path) -> list:
    """The entries of a configurations file (a JSON list).

    Raises:
        ReportError / TorqGenConfigError: not readable, not JSON, not a list, or a TraceLens
            trace given by mistake (one line).
    """
    data = read_json(path, "CK profiler configurations file")
    if not isinstance(data, list):
        raise TorqGenConfigError(f"CK profiler configurations file {path}: expected a JSON list of configurations, "
                                 f"got a {type(data).__name__}")
    if data and all(isinstance(e, dict) and "op_name" in e and "profiler_args" not in e for e in data):
        raise TorqGenConfigError(f"{path} is a TraceLens trace, not CK configurations; convert it first "
                                 f"(ck-profile convert, or ck_trace= in the Snakemake form)")
    return data


def select(entries: list, max_ops: int | None = None) -> list[dict]:
    """Normalize the entries and pick those to run, in priority-rank order (entries without a
    rank last, then file order), at most ``max_ops``.

    Returns:
        One dict per selected entry: ``index`` (in the file), ``config`` (normalized) or
        ``error`` (why the entry cannot be run), ``config_id``, ``description``, ``priority_rank``.
    """
    picked = []
    for i, raw in enumerate(entries):
        try:
            cfg = pa.normalize_config(raw, where=f"configuration {i}")
        except pa.ConfigFormatError as e:
            meta = raw.get("metadata") if isinstance(raw, dict) and isinstance(raw.get("metadata"), dict) else {}
            picked.append({"index": i, "config": None, "error": str(e), "config_id": None,
                           "operation": raw.get("operation_type") if isinstance(raw, dict) else None,
                           "description": meta.get("description"), "priority_rank": _rank(meta)})
            continue
        meta = cfg["metadata"]
        notes = [n for n in (meta.get("notes") or []) if isinstance(n, str)] + cfg["notes"]
        picked.append({"index": i, "config": cfg, "error": None, "config_id": pa.config_id(cfg),
                       "operation": cfg["operation_type"], "description": meta.get("description"),
                       "priority_rank": _rank(meta), "pytorch_op": meta.get("pytorch_op"), "notes": notes})
    picked.sort(key=lambda e: (e["priority_rank"] is None, e["priority_rank"] or 0, e["index"]))
    return picked[:max_ops] if max_ops else picked


def _rank(meta: dict):
    r = meta.get("priority_rank")
    return r if isinstance(r, int) and not isinstance(r, bool) else None


def assemble(selected: list[dict], runs: dict[str, dict], *, configs_file: str, backend: str,
             profiler: str | None, total_in_file: int) -> dict:
    """The results document for the selected entries (as :func:`select` returns them; the
    ``config`` field is not needed) from the per-configuration records ``runs`` (by config_id)."""
    results = []
    for e in selected:
        if e["config_id"] is None:
            results.append({"operation": e["operation"], "description": e["description"],
                            "priority_rank": e["priority_rank"], "success": False, "status": "skipped",
                            "returncode": None, "elapsed_time": 0.0, "command": None, "error": e["error"],
                            "stdout": "", "config_index": e["index"], "config_id": None})
            continue
        run = dict(runs[e["config_id"]])
        run.update(description=e["description"] or run.get("description"), priority_rank=e["priority_rank"],
                   config_index=e["index"], pytorch_op=e.get("pytorch_op"),
                   notes=list(e.get("notes") or []) + [n for n in run.get("notes") or [] if n not in (e.get("notes") or [])])
        results.append(run)
    status = Counter(r["status"] for r in results)
    stats = {"total": len(results), "success": status["success"],
             "failed": status["failed"] + status["timeout"] + status["crash"], "skipped": status["skipped"],
             "timeout": status["timeout"], "crash": status["crash"]}
    return {"format_version": RESULTS_FORMAT_VERSION, "timestamp": datetime.now().isoformat(timespec="seconds"),
            "configs_file": configs_file, "configs_in_file": total_in_file, "backend": backend, "profiler": profiler,
            "stats": stats, "results": results}


def run_block(record: dict, quiet: bool = False) -> str:
    """The console text for one finished configuration (the seed's block; one line when quiet)."""
    mark = "✓ SUCCESS" if record["success"] else f"✗ {record['status'].upper()}"

    def num(v) -> str:  # CK may print a figure that is not a finite number (kept as None)
        return f"{v:.4g}" if isinstance(v, (int, float)) else "?"

    figure = (f"{num(record['avg_time_ms'])} ms, {num(record['tflops'])} TFlops, {num(record['gb_per_s'])} GB/s"
              if record["success"] else record["error"])
    if quiet:
        return f"{mark} {record['config_id']} {record['description']}: {figure}"
    bar = "=" * 70
    lines = [bar, f"{record['description']}", f"Priority Rank: {record.get('priority_rank')}",
             f"Config ID:     {record['config_id']} ({record['backend']})", bar,
             f"Command: {record['command']}", "",
             f"{mark} (completed in {record['elapsed_time']:.2f}s): {figure}"]
    if record["success"] and record.get("best"):
        b = record["best"]
        lines.append(f"Best instance: {b['name']}" + (f", SplitK {b['split_k']}" if b.get("split_k") else ""))
    for n in record.get("notes") or []:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def summary_text(doc: dict, saved_to: str | None) -> str:
    """The seed's execution summary."""
    s = doc["stats"]
    bar = "=" * 70
    rate = 100.0 * s["success"] / s["total"] if s["total"] else 0.0
    failed_detail = f" ({s['timeout']} timed out, {s['crash']} crashed)" if s["timeout"] or s["crash"] else ""
    lines = ["", bar, "Execution Summary", bar, f"Total configurations: {s['total']}"
             + (f" (of {doc['configs_in_file']} in the file)" if doc["configs_in_file"] != s["total"] else ""),
             f"  ✓ Successful:  {s['success']}", f"  ✗ Failed:      {s['failed']}{failed_detail}",
             f"  ⚠ Skipped:     {s['skipped']}", "", f"Success rate: {rate:.1f}%", bar]
    if saved_to:
        lines += ["", f"Results saved to: {saved_to}"]
    return "\n".join(lines)
