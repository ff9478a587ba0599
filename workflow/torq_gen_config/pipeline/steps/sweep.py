"""Job of rules/sweep.smk: the summary of a model sweep (``sweep.json``, ``sweep.html``;
:mod:`torq_gen_config.report.sweep`)."""

from __future__ import annotations

import os

from ...core.fileio import atomic_write_text, write_json
from ...core.logs import append_record
from ...core.schemas import validator
from ...report.sweep import build_sweep, render_sweep_html
from . import step


@step
def sweep_summary(input, output, params, log) -> None:
    """Rule ``sweep_summary``: ``output.summary`` (checked against its schema) and
    ``output.html`` from every model's report (``params.rows``, sheet order); a line in
    the job log."""
    summary = build_sweep(params.rows, sheet=params.sheet, output_dir=os.path.dirname(output.summary) or ".")
    validator("sweep.schema.yaml").validate(summary)  # a wrong summary is a bug: the job fails
    write_json(output.summary, summary)
    atomic_write_text(output.html, render_sweep_html(summary))
    n, failed = summary["totals"]["models"], summary["totals"]["failed"]
    line = (f"sweep: {output.summary} ({n} models, {summary['totals']['layers']} layers"
            + (f", {failed} could not run" if failed else "") + f"); page: {output.html}")
    append_record(log[0] if log else None, line)
    print(line)
