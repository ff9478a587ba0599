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

from ..fileio import atomic_write_files, json_bytes
from .build import render_report

__all__ = ["publish_report"]


def publish_report(report_path: str | os.PathLike, compiler_path: str | os.PathLike, report: dict, *,
                   full_model: Mapping | None = None, rederive: bool = True,
                   extra_files: Mapping[str | os.PathLike, bytes] | None = None, force: bool = False) -> dict:
    """Render ``report`` (in place) and write it with its compiler JSON.

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

    Returns:
        The compiler JSON (dict) written next to the report.

    Raises:
        OSError: a file cannot be written (then none was replaced).
    """
    compiler = render_report(report, full_model=full_model, rederive=rederive)
    files = {Path(report_path): json_bytes(report), Path(compiler_path): json_bytes(compiler)}
    files.update({Path(p): data for p, data in (extra_files or {}).items()})
    changed = files if force else {p: data for p, data in files.items() if not _holds(p, data)}
    if changed:
        atomic_write_files(changed)
    return compiler


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except FileNotFoundError:
        return False
