"""Job of rules/report_html.smk: the HTML report of a discovery (one self-contained
page next to the report JSON, :mod:`torq_gen_config.report.html`)."""

from __future__ import annotations

from ...core.job_support import records_failure
from ...core.logs import append_record
from ...report.html import write_report_html
from . import step


@records_failure
@step
def report_html(input, output, params, log) -> None:
    """Rule ``report_html``: ``output.html`` from ``input.report`` (and the compiler JSON
    next to it, when there); a line in the job log. Raises ReportError for a malformed
    report (the job fails with its one-line reason)."""
    path = write_report_html(input.report, output.html)
    append_record(log[0] if log else None, f"report_html: wrote {path} from {input.report}")
