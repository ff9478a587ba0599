"""Whether a report still describes the model and the work files next to it.

A report is written last, by ``aggregate_report``. While a later run is going (it holds
the run lock: :mod:`torq_gen_config.core.run_lock`), and when it failed or was stopped before
that, the old report stays while the work files (the prepared model, the MLIR the
compiler JSON points into, verdicts) are already newer: the jobs that feed the report set
``work/<name>/.report-outdated`` (:mod:`torq_gen_config.core.layout`) and the report's writer
removes it. The report also records the SHA-256 of the model file (and of its external
data), so a model changed since discovery is noticed too.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Mapping
from ..core.layout import (
    LAYER_INPUTS_FILE,
    LAYERS_DIR,
    LOCATIONS_FILE,
    MANIFEST_FILE,
    MODEL_INPUTS_FILE,
    OUTDATED_MARKER,
    PREPARE_INFO_FILE,
    QUANT_DIR,
    QUANTIZE_INFO_FILE,
    REPORT_PREFIX,
    lock_file,
    work_dir,
)
from ..core.run_lock import running_holder
from ..model.prepare import model_fingerprint


def model_digest(path: str | os.PathLike) -> str | None:
    """SHA-256 (hex) of a model file and, in name order, the external-data files it names;
    None when the file cannot be read."""
    p = Path(path)
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)

        for loc, _, _ in model_fingerprint(p)["external_data"]:
            with open(p.parent / loc, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def staleness(report_path: str | os.PathLike, report: Mapping, model_path: str | os.PathLike | None = None
              ) -> list[str]:
    """Why ``report`` may not describe the current files, one line each (empty: it does).

    Args:
        report_path: the report JSON's path (its work directory is next to it).
        report: the report.
        model_path: the model the user names (``--model``); default: the model file the
            report names, when it is still there. Its content is compared with the digest
            the report recorded.
    """

    lines = []
    name = report.get("model_name") or Path(report_path).stem.removeprefix(REPORT_PREFIX)
    marker = Path(report_path).parent / work_dir(str(name)) / OUTDATED_MARKER
    if marker.is_file():
        since, _, reason = marker.read_text(errors="replace").strip().partition("\n")
        running = running_holder(Path(report_path).parent / lock_file(str(name)))
        if running:
            lines.append(f"a run of {name} is in progress ({running}): this report is from before it and is "
                         "replaced when that run finishes")
        elif reason.strip():  # set by a run that finished (commands/run.py): its own words
            lines.append(f"the report is out of date: {reason.strip()} (at {since.strip() or '?'}); rerun discover "
                         "to update the report")
        else:
            lines.append(f"the report is out of date: a later run of {name} started at {since or '?'} changed its "
                         "work files and did not finish (it failed or was stopped); rerun discover to update the "
                         "report")
    model_info = (report.get("provenance") or {}).get("model") or {}
    recorded = model_info.get("sha256")
    if model_path is None and isinstance(model_info.get("source"), str):
        model_path = model_info["source"]
    if model_path is not None and recorded:
        now = model_digest(model_path)
        if now is not None and now != recorded:
            lines.append(f"the model {model_path} changed since this report was written (SHA-256 {now[:12]}..., the "
                         f"report has {recorded[:12]}...); rerun discover")
    return lines


def layer_files_digest(work: str | os.PathLike) -> str:
    """SHA-256 (hex) of the work files a report's verdicts rest on and a ``run`` may make
    again: the preparation record, the model's input values, the MLIR locations, the
    layer manifest (with quantize, the quantized one and its record) and every layer's
    ``inputs.json`` (digests of the values it receives). Equal before and after a run:
    the report still describes them. Missing files count as empty."""
    w = Path(work)
    h = hashlib.sha256()
    files = [w / PREPARE_INFO_FILE, w / MODEL_INPUTS_FILE, w / LOCATIONS_FILE, w / LAYERS_DIR / MANIFEST_FILE,
             w / QUANT_DIR / MANIFEST_FILE, w / QUANT_DIR / QUANTIZE_INFO_FILE,
             *sorted((w / LAYERS_DIR).glob(f"*/{LAYER_INPUTS_FILE}"))]
    for f in files:
        h.update(str(f.relative_to(w)).encode() + b"\0")
        try:
            h.update(hashlib.sha256(f.read_bytes()).digest())
        except OSError:
            h.update(b"-")
    return h.hexdigest()
