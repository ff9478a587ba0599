"""``torq-gen-config view``: show a report (summary or one layer) or a compiler JSON.

Read-only. Colours only on a terminal; piped or redirected output is plain text.
"""

from __future__ import annotations

import argparse
import sys
from ..core.errors import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``view`` subcommand."""
    p = sub.add_parser(
        "view",
        help="show the report: summary, one layer's details, or a compiler JSON",
        description="Show a report JSON (summary with a per-layer table, or the details of one layer) "
                    "or a compiler JSON (assignments by MLIR line:col). Give the JSON path, or --model "
                    "and --output-dir to find torq_gen_config_<model>.json there (falling back to the "
                    "compiler JSON when the report is absent).",
        epilog="examples:\n"
               "  torq-gen-config view out/torq_gen_config_m.json\n"
               "  torq-gen-config view out/torq_gen_config_m.json Conv_conv1_1\n"
               "  torq-gen-config view --model m.onnx --output-dir out Conv_conv1_1\n"
               "  torq-gen-config view out/torq_gen_config_m_compiler.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("json_path", nargs="?", metavar="JSON",
                   help="report JSON or compiler JSON (omit when using --model)")
    p.add_argument("layer", nargs="?", metavar="LAYER",
                   help="layer ID to show in detail (exact, else case-insensitive)")
    p.add_argument("--model", help="ONNX model whose report to show (with --output-dir)")
    p.add_argument("--output-dir", default=".", help="directory holding the report (default: current directory)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace, console=None) -> int:
    """Show the JSON. ``console``: a rich Console to print to (tests); default stdout."""
    from ..report.view import load_view_json, render, resolve_view_path
    from ..report.view_format import make_console

    json_path, layer = args.json_path, args.layer
    if args.model:
        if layer is not None:
            raise ConfigError("with --model give at most one positional argument, the LAYER")
        json_path, layer = None, args.json_path  # the one positional is the layer
    path, note = resolve_view_path(json_path, args.model, args.output_dir)
    data, kind = load_view_json(path)
    if console is None:
        console = make_console()
    if note:
        print(note, file=sys.stderr)
    if kind == "report":
        from ..report.staleness import staleness

        for line in staleness(path, data, args.model):
            print(f"warning: {line}", file=sys.stderr)
    render(data, kind, console, layer=layer, source=path)
    return 0
