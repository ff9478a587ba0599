"""``torq-gen-config report``: write the HTML report of a discovery.

One self-contained page (works offline; plotly.js is inlined) next to the report JSON:
``<output dir>/torq_gen_config_<model>.html`` (:mod:`torq_gen_config.report.html`).
Read-only on the report. A missing or malformed report JSON is a one-line error, exit
status 2. ``--model-explorer DIR`` also writes the report as node-data overlays for Google's
Model Explorer opened on the model (:mod:`torq_gen_config.report.model_explorer`).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..core.errors import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``report`` subcommand."""
    p = sub.add_parser(
        "report",
        help="write the HTML report (status matrix, plots, disputes, full-model result) of a discovery",
        description="Write one self-contained HTML page (works offline) of a report JSON: summary, the layers x "
                    "executors status matrix (hover or click for the message and metrics), verdicts per op type, "
                    "compile and run times, the recommended executor's speed-up (with --collect-timing), error "
                    "stages, reference disputes and inconclusive checks, the full-model comparison, precision "
                    "mode, fixed dims and tool versions. Give the report JSON, or --model and --output-dir. "
                    "With --model-explorer, --model may also go with the report JSON: the model file for the "
                    "overlays (a model moved or renamed since discover); the report is the JSON given.",
        epilog="examples:\n"
               "  torq-gen-config report --model m.onnx --output-dir out\n"
               "  torq-gen-config report out/torq_gen_config_m.json -o m.html\n"
               "  torq-gen-config report --model m.onnx --output-dir out --model-explorer out/me\n"
               "  torq-gen-config report out/torq_gen_config_m.json --model moved/m2.onnx --model-explorer out/me\n"
               "  model-explorer m.onnx --extensions=model_explorer_onnx \\\n"
               "      --node_data_paths=out/me/recommended.json,out/me/verdict_llvm-cpu.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", nargs="?", metavar="REPORT_JSON", help="the report JSON (omit when using --model and --output-dir; with --model-explorer, "
                        "--model may go with it as the model file for the overlays)")
    p.add_argument("--model", help="ONNX model whose report to show (with --output-dir: the report is "
                                    "torq_gen_config_<model name>.json there); with REPORT_JSON and --model-explorer: "
                                    "the model file for the overlays, e.g. moved or renamed since discover")
    p.add_argument("--output-dir", default=".", help="directory holding the report (default: current directory)")
    p.add_argument("-o", "--output", metavar="FILE.html",
                   help="where to write the page (default: the report JSON's path with .html)")
    p.add_argument("--model-explorer", metavar="DIR",
                   help="also write node-data files for Model Explorer (pip install ai-edge-model-explorer "
                        "model-explorer-onnx) into DIR: recommended executor, verdict, max relative difference and "
                        "runtime per executor, keyed by the node ids of Model Explorer's ONNX adapter; needs the "
                        "model (--model, else the model file the report names; with a report JSON path, "
                        "give both: REPORT_JSON --model M --model-explorer DIR)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Write the page and print its path (staleness warnings are on the page); with
    ``--model-explorer``, first the overlays (so a model that does not fit the report
    fails before anything is written), then the command that shows them. Returns 0 (bad
    input raises a TorqGenConfigError: exit status 2)."""

    from ..report.html import write_report_html

    path = _report_path(args)
    overlays = _write_model_explorer(path, args) if args.model_explorer else None
    out = write_report_html(path, args.output, model_path=args.model)
    print(f"HTML report: {out}")
    if overlays is not None:
        files, warnings, model = overlays
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"Model Explorer node data: {len(files)} files in {args.model_explorer}; view with:")
        print(f"  model-explorer {shlex.quote(model)} --extensions=model_explorer_onnx "
              f"--node_data_paths={shlex.quote(','.join(map(str, files)))}")
    return 0


def _report_path(args: argparse.Namespace):
    """The report JSON: REPORT_JSON, or found from --model and --output-dir. Both only with
    --model-explorer: then --model is the model file for the overlays (moved or renamed)."""
    from ..report.files import resolve_report_path

    if args.report and args.model:
        if not args.model_explorer:
            raise ConfigError("give either a report JSON path or --model/--output-dir, not both (--model goes with "
                              "a report JSON path only with --model-explorer, as the model file for the overlays)")
        return resolve_report_path(args.report, None, None)
    return resolve_report_path(args.report, args.model, args.output_dir)


def _write_model_explorer(path, args: argparse.Namespace):
    """Write the Model Explorer overlays: (files, staleness warnings, model path)."""
    from ..report.model_explorer import write_model_explorer

    return write_model_explorer(path, args.model_explorer, model_path=args.model)
