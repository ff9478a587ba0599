"""The one writer of a report JSON and its compiler JSON.

Discovery (rule ``aggregate_report``), ``edit`` (the user's choices changed) and
``run`` (the full-model section) all finish through :func:`publish_report`: the report
is rendered once (:func:`~torq_gen_config.report.build.render_report`), its compiler
JSON derived from it, and both written together, all or none, so the two files never
disagree and no command writes a report its own way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from ..core.fileio import atomic_write_files, atomic_write_text, json_bytes, json_chunks, read_json
from ..core.layout import REPORT_PREFIX, work_dir
from .build import render_report, unassigned_reason

__all__ = ["compiler_json_error", "publish_report", "read_report_summary"]


def publish_report(report_path: str | os.PathLike, compiler_path: str | os.PathLike, report: dict, *,
                   full_model: Mapping | None = None, rederive: bool = True,
                   extra_files: Mapping[str | os.PathLike, bytes] | None = None, force: bool = False) -> dict:
    """Render ``report`` (in place) and write it with its compiler JSON. The report is
    written a line at a time, each op on one line (:func:`~torq_gen_config.core.fileio.json_chunks`:
    the C encoder, one op's text in memory at a time; docs/scale.md, "The report").

    Args:
        report_path: the report JSON to write (``<output dir>/torq_gen_config_<model>.json``).
        compiler_path: its compiler JSON (``..._compiler.json``).
        report: the report dict (rendered in place).
        full_model: a full-model section to put in (``run``); None keeps the report's.
        rederive: recompute the summary and the text from ``ops`` (``edit``); discovery
            has just built them (False).
        extra_files: other files written in the same all-or-none step (``edit``: the
            user-choices sidecar), path -> bytes.
        force: write every file even when its bytes are already on disk (the
            Snakemake job that owns them as outputs must update them all).

    Otherwise files whose bytes are already on disk are left untouched (their mtime
    too), so an unchanged compiler JSON reruns no full-model job.

    A compiler JSON that would assign no op although the model has layers
    (:func:`~torq_gen_config.report.build.unassigned_reason`) is written with its ``error``
    (why), and the report's summary and text say the same (``compiler_json_error``): a
    compiler must not read it as "nothing to place", and the commands exit non-zero on
    it (:func:`compiler_json_error`); the report stays, to see why each layer failed.

    Returns:
        The compiler JSON (dict) written next to the report.

    Raises:
        OSError: a file cannot be written (then none was replaced).
    """
    compiler = render_report(report, full_model=full_model, rederive=rederive)
    reason = unassigned_reason(report, compiler)
    summary = (report.get("discovery_report") or {}).get("summary")
    if isinstance(summary, dict):
        summary.pop("compiler_json_error", None)
    if reason:
        compiler["error"] = reason
        if isinstance(summary, dict):
            summary["compiler_json_error"] = reason
        line = f"ERROR: {reason}"
        if line not in (report.get("final_report_text") or ""):
            report["final_report_text"] = (report.get("final_report_text") or "").rstrip("\n") + f"\n\n{line}\n"
    files = {Path(report_path): json_chunks(report, one_line="ops"), Path(compiler_path): json_bytes(compiler)}
    files.update({Path(p): data for p, data in (extra_files or {}).items()})
    atomic_write_files(files, keep_unchanged=not force)
    _write_summary(Path(report_path), report)
    return compiler


#: the report's final text and summary, in its model's work directory (schema report_summary)
SUMMARY_FILE = "report_summary.json"


def _summary_path(report_path: Path) -> Path | None:
    """``work/<model>/report_summary.json`` beside the report of ``<model>`` (None for a
    report elsewhere, e.g. a copy: then the report itself is read)."""
    name = report_path.name
    if not (name.startswith(REPORT_PREFIX) and name.endswith(".json")):
        return None
    work = report_path.parent / work_dir(name[len(REPORT_PREFIX):-len(".json")])
    return work / SUMMARY_FILE if work.is_dir() else None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _write_summary(report_path: Path, report: dict) -> None:
    """In the model's work directory, the report's final text and summary with the
    report's size: what `discover` prints after every run, without parsing the whole
    report (about 50 KB per layer: 0.5 s at 1,000 layers and 7 s at 5,000, the largest
    cost of a no-op that grew with the model; docs/scale.md). Written after the report
    (and an output of the report job after it, so Snakemake's touch of the outputs keeps
    that order); not used when the report is newer or of another size."""
    path = _summary_path(report_path)
    if path is None:
        return
    rec = {"report_bytes": _size(report_path), "final_report_text": report.get("final_report_text") or "",
           "summary": (report.get("discovery_report") or {}).get("summary") or {}}
    atomic_write_text(path, json_bytes(rec).decode())


def read_report_summary(report_path: str | os.PathLike) -> tuple[str, dict]:
    """The final report text and ``discovery_report.summary`` of the report at
    ``report_path``: from the summary file :func:`publish_report` wrote with it when
    that still matches the report (the report's size, and not newer than the summary),
    else from the report itself.

    Raises:
        ReportError: the report is missing or not valid JSON (read_json's one line).
    """
    path = Path(report_path)
    summary = _summary_path(path)
    try:
        if summary and summary.stat().st_mtime_ns >= path.stat().st_mtime_ns:
            rec = read_json(summary, "report summary")
            if rec.get("report_bytes") is not None and rec["report_bytes"] == _size(path):
                return rec["final_report_text"], rec["summary"]
    except Exception:  # noqa: BLE001 - a cache: missing or damaged, the report itself is read
        pass
    report = read_json(path, "report JSON")
    return report["final_report_text"], report["discovery_report"]["summary"]


def compiler_json_error(summary: Mapping) -> str | None:
    """Why the compiler JSON assigns no op although the model has layers (the
    ``compiler_json_error`` :func:`publish_report` put in the summary), or None. The
    commands print it as their error and exit with :data:`~torq_gen_config.core.errors.EXIT_NOTHING_ASSIGNED`."""
    return (summary or {}).get("compiler_json_error")
