"""``torq-gen-config edit``: person-made changes to a report JSON.

Changes the recommended executor or the tolerance of matched layers (or resets
them), re-derives verdicts from the stored metrics (nothing is recompiled),
regenerates the summary, the report text and the compiler JSON, and records the
choices in ``<report dir>/work/<model>/user_choices.json`` so that a later ``discover``
keeps them.
"""

from __future__ import annotations

import argparse
import sys
from ..core.errors import EXIT_NOTHING_ASSIGNED, ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``edit`` subcommand."""
    p = sub.add_parser(
        "edit",
        help="change the recommended executor or the tolerance of layers in a report",
        description="Edit a report JSON: set the executor of layers (or null: no assignment), set a per-layer "
                    "tolerance (verdicts are re-derived from the stored metrics at once, nothing is "
                    "recompiled), or reset person-made choices. The compiler JSON next to the report is "
                    "regenerated, and the choices are kept in <report dir>/work/<model>/user_choices.json so that "
                    "the next 'discover' keeps them.",
        epilog="--layer matching, first that applies: ALL (every layer); a pattern with * or ? (fnmatch, "
               "case-insensitive); an exact ID (case-insensitive); a substring (case-insensitive).\n\n"
               "examples:\n"
               "  torq-gen-config edit --model m.onnx --output-dir out --list conv\n"
               "  torq-gen-config edit out/torq_gen_config_m.json --layer Conv_conv1_1 --executor ort\n"
               "  torq-gen-config edit out/torq_gen_config_m.json --layer 'Relu_*' --executor null\n"
               "  torq-gen-config edit out/torq_gen_config_m.json --layer Conv_conv1_1 --tolerance-max 0.05\n"
               "  torq-gen-config edit out/torq_gen_config_m.json --layer ALL --reset",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", nargs="?", metavar="REPORT_JSON", help="the report JSON (omit when using --model)")
    p.add_argument("--model", help="ONNX model whose report to edit (with --output-dir)")
    p.add_argument("--output-dir", default=".", help="directory holding the report (default: current directory)")
    p.add_argument("--list", nargs="?", const="", default=None, metavar="FILTER", dest="list_filter",
                   help="list layer IDs with op type and recommendation (optionally those containing FILTER, "
                        "case-insensitive) and exit")
    p.add_argument("--layer", metavar="PATTERN", help="layers to edit: ID, substring, fnmatch pattern or ALL")
    p.add_argument("--executor", metavar="NAME|null",
                   help="recommended executor for the layers (one of the report's executors), "
                        "or null for no assignment")
    p.add_argument("--tolerance-avg", type=float, metavar="X",
                   help="per-layer fp_avg_tol, also its bf16_avg_tol: the override applies to every float output "
                        "(finite, > 0)")
    p.add_argument("--tolerance-max", type=float, metavar="Y", help="per-layer fp_max_tol, also its bf16_max_tol (finite, > 0)")
    p.add_argument("--reset", action="store_true",
                   help="drop person-made choices of the layers (recommendation and tolerance back to discovery's)")
    p.set_defaults(func=run)
    return p


def _rec(executor, source) -> str:
    text = "null" if executor is None else str(executor)
    return f"{text} (user)" if source == "user" else text


def _tol(t) -> str:
    if not t:
        return "default"
    return f"avg={t.get('fp_avg_tol'):g}, max={t.get('fp_max_tol'):g}"


def describe_change(change) -> list[str]:
    """Lines telling what an edit did to one layer."""
    lines = [f"  {change.layer_id}:"]
    if (change.old_recommendation, change.old_source) != (change.new_recommendation, change.new_source):
        lines.append(f"    recommendation: {_rec(change.old_recommendation, change.old_source)} -> "
                     f"{_rec(change.new_recommendation, change.new_source)}")
    else:
        lines.append(f"    recommendation: {_rec(change.new_recommendation, change.new_source)} (unchanged)")
    if change.old_tolerance_override != change.new_tolerance_override:
        lines.append(f"    tolerance: {_tol(change.old_tolerance_override)} -> {_tol(change.new_tolerance_override)}")
    for name, (before, after) in change.status_changes.items():
        lines.append(f"    {name}: {before} -> {after}")
    for note in change.notes:
        lines.append(f"    note: {note}")
    return lines


def run(args: argparse.Namespace) -> int:
    """List layers, or apply the edit and print what changed."""
    from ..report.edit import UNSET, edit_report_file
    from ..report.files import load_report, resolve_report_path
    from ..report.layer_select import list_layers
    from ..report.staleness import staleness
    from ..report.summary import status_counts_line
    from ..report.publish import compiler_json_error

    path = resolve_report_path(args.report, args.model, args.output_dir)
    report = load_report(path)
    for line in staleness(path, report, args.model):
        print(f"warning: {line}", file=sys.stderr)
    if args.list_filter is not None:
        rows, total = list_layers(report, args.list_filter)
        width = max([len(r["layer_id"]) for r in rows] + [5])
        for r in rows:
            extra = f"  tolerance {_tol(r['tolerance_override'])}" if r["tolerance_override"] else ""
            print(f"{r['layer_id']:<{width}}  {str(r['op_type'] or '-'):<14}  "
                  f"{_rec(r['recommended_executor'], r['recommendation_source'])}{extra}")
        print(f"Total: {len(rows)} layer(s) (filtered from {total})")
        return 0
    if not args.layer:
        raise ConfigError("give --layer PATTERN with --executor, --tolerance-avg/--tolerance-max or --reset "
                          "(or --list to see the layers)")
    result = edit_report_file(
        path, args.layer,
        executor=args.executor if args.executor is not None else UNSET,
        tolerance_avg=args.tolerance_avg, tolerance_max=args.tolerance_max, reset=args.reset,
    )
    n = len(result.changes)
    if n > 1:
        print(f"Batch edit: {n} layers: {', '.join(c.layer_id for c in result.changes)}")
    else:
        print(f"Edited layer {result.changes[0].layer_id}")
    unchanged = 0
    for change in result.changes:
        if n > 1 and not change.changed and not change.notes:
            unchanged += 1
            continue
        for line in describe_change(change):
            print(line)
    if unchanged:
        print(f"  ({unchanged} layer(s) already as requested: unchanged)")
    summary = result.report["discovery_report"]["summary"]
    crit = result.report["discovery_report"]["critical_failures"]
    print(f"Status counts: {status_counts_line(summary)}; critical failures: {len(crit)}")
    print(f"Report:        {result.report_path}")
    print(f"Compiler JSON: {result.compiler_path}")
    print(f"User choices:  {result.user_choices_path}")
    reason = compiler_json_error(summary)
    if reason:  # e.g. every layer set to an executor that has no verdict for it
        print(f"torq-gen-config: error: {reason}", file=sys.stderr)
        return EXIT_NOTHING_ASSIGNED
    return 0
