"""``torq-gen-config compare OLD NEW``: the verdicts that changed between two runs
(:mod:`torq_gen_config.report.diff`), e.g. before and after a compiler upgrade. Each side is
a report JSON or a directory of them (a sweep). Exit status 1 when a verdict regressed
(was ``success``, now not), 0 otherwise, 2 on bad input: a CI gate."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..core.errors import OutputDirError, TorqGenConfigError
from ..core.fileio import atomic_write_files, json_bytes, write_json
from ..model.prepare import load_model
from ..report.diff import change_overlay, compare_sides, load_side, render_text
from ..report.files import load_report


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``compare`` subcommand."""
    p = sub.add_parser(
        "compare",
        help="the verdicts that changed between two runs (regressions, fixes, ...); exit 1 on a regression",
        description="Compare two runs verdict by verdict: per (model, layer, executor) the statuses that changed, "
                    "grouped as regressions (was success, now not), changes, fixes and additions; layers and "
                    "executors added or removed; recommendations that moved; the tool versions and options "
                    "that differ. Each side is a report JSON or a directory holding report JSONs (itself or "
                    "one level of subfolders: a sweep). Models are matched by name, layers by ID. Exit status "
                    "1 when there is a regression, 0 otherwise: a gate for a compiler or tool upgrade.",
        epilog="examples:\n"
               "  torq-gen-config compare old/torq_gen_config_m.json new/torq_gen_config_m.json\n"
               "  torq-gen-config compare zoo_before zoo_after --json changes.json\n"
               "  torq-gen-config compare old_out new_out --model-explorer me/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("old", metavar="OLD", help="the earlier run: a report JSON or a directory of them")
    p.add_argument("new", metavar="NEW", help="the later run: a report JSON or a directory of them")
    p.add_argument("--json", metavar="FILE", help="also write the whole comparison as JSON")
    p.add_argument("--model-explorer", metavar="DIR",
                   help="write the changes as Model Explorer node data, DIR/<model>/changes.json (each changed "
                        "layer's node coloured by its worst change), for the new side's model file")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="lines per group of changes (default 50)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the comparison; write ``--json`` and ``--model-explorer``. Returns 1 when a
    verdict regressed, else 0 (bad input raises a TorqGenConfigError: status 2)."""
    result = compare_sides(load_side(args.old), load_side(args.new))
    result["old"], result["new"] = str(Path(args.old).expanduser()), str(Path(args.new).expanduser())
    print(render_text(result, limit=max(1, args.limit)), end="")
    if args.json:
        try:
            write_json(Path(args.json).expanduser(), result)
        except OSError as e:
            raise OutputDirError(f"cannot write --json {args.json}: {e.strerror or e}") from None
        print(f"JSON: {args.json}")
    if args.model_explorer:
        _write_overlays(result, Path(args.model_explorer).expanduser())
    return 1 if result["regressions"] else 0


def _write_overlays(result: dict, out: Path) -> None:
    """One ``changes.json`` per compared model with changes; a model whose file cannot be
    found or does not fit its report is said (warning) and left out."""
    written = []
    for name, m in result["models"].items():
        if m["status"] != "compared" or not (m["changes"] or m["layers_added"]):
            continue
        report = load_report(m["new_report"])
        source = ((report.get("provenance") or {}).get("model") or {}).get("source")
        try:
            if not isinstance(source, str) or not Path(source).is_file():
                raise TorqGenConfigError(f"the report names model file {source!r}, which is not there")
            data = change_overlay(m, report, load_model(source, graph_only=True).graph)
            path = out / name / "changes.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_files({path: json_bytes(data)})
        except TorqGenConfigError as e:
            print(f"warning: no Model Explorer overlay for {name}: {e}", file=sys.stderr)
            continue
        except OSError as e:
            raise OutputDirError(f"cannot write the Model Explorer directory {out}: {e.strerror or e}") from None
        written.append((source, path))
    for source, path in written:
        print(f"Model Explorer: model-explorer {shlex.quote(source)} --extensions=model_explorer_onnx "
              f"--node_data_paths={shlex.quote(str(path))}")
