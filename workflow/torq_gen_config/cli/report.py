"""``torq-gen-config report``: write the HTML report of a discovery.

One self-contained page (works offline; plotly.js is inlined) next to the report JSON:
``<output dir>/torq_gen_config_<model>.html`` (:mod:`torq_gen_config.report.html`).
Read-only on the report. A missing or malformed report JSON is a one-line error, exit
status 2.
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``report`` subcommand."""
    p = sub.add_parser(
        "report",
        help="write the HTML report (status matrix, plots, disputes, full-model result) of a discovery",
        description="Write one self-contained HTML page (works offline) of a report JSON: summary, the layers x "
                    "executors status matrix (hover or click for the message and metrics), verdicts per op type, "
                    "compile and run times, the recommended executor's speed-up (with --collect-timing), error "
                    "stages, reference disputes and inconclusive checks, the full-model comparison, precision "
                    "mode, fixed dims and tool versions. Give the report JSON, or --model and --output-dir.",
        epilog="examples:\n"
               "  torq-gen-config report --model m.onnx --output-dir out\n"
               "  torq-gen-config report out/torq_gen_config_m.json -o m.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", nargs="?", metavar="REPORT_JSON", help="the report JSON (omit when using --model)")
    p.add_argument("--model", help="ONNX model whose report to show (with --output-dir)")
    p.add_argument("--output-dir", default=".", help="directory holding the report (default: current directory)")
    p.add_argument("-o", "--output", metavar="FILE.html",
                   help="where to write the page (default: the report JSON's path with .html)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Write the page and print its path (staleness warnings are on the page). Returns 0 (bad input
    raises a TorqGenConfigError: exit status 2)."""

    from ..report.files import resolve_report_path
    from ..report.html import write_report_html

    path = resolve_report_path(args.report, args.model, args.output_dir)
    out = write_report_html(path, args.output, model_path=args.model)
    print(f"HTML report: {out}")
    return 0
