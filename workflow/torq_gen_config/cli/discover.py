"""``torq-gen-config discover``: run executor discovery on a model.

Runs the Snakemake workflow (through its Python API) with the output directory as
working directory, shows Snakemake's progress, and prints the final report text.
Exit status 0 when discovery completed, also when some layers failed on some
executors: those failures are verdicts, recorded in the report.

Subgraph mode (``--subgraph-from``/``--subgraph-to``, docs/subgraph.md): discovery of
the range's layers under its own names (``_subgraph_<f>_<t>``, ``work/<model>_subgraph_<f>_<t>``),
then the full-subgraph test (the code of ``torq-gen-config run``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..backends import run_wide_options
from ..commands.outputs import output_layout, repair_rules
from ..commands.run import reduce_assigned, run_assigned
from ..core.errors import EXIT_NOTHING_ASSIGNED, ConfigError, ReportError, TorqGenConfigError
from ..core.layout import OUTDATED_MARKER, compiler_file, report_file
from ..core.limits import DEFAULT_TIMEOUT_S
from .options import (
    add_execution_options,
    add_keep_work_option,
    add_model_options,
    add_reduce_options,
    build_config,
    resolve_execution_options,
)


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``discover`` subcommand."""
    p = sub.add_parser(
        "discover",
        help="test every layer on every executor and write the report and compiler JSON",
        description="Split the model into layers, test each layer on each configured executor "
                    "(compile, run, compare with an ONNX Runtime reference) and recommend one executor per layer.",
    )
    add_model_options(p)
    add_execution_options(p)
    add_reduce_options(p, what="the full-subgraph test (subgraph mode only)")
    p.add_argument("--tolerance-avg", type=float, help="fp_avg_tol: mean normalized error allowed (default 0.01)")
    p.add_argument("--tolerance-max", type=float, help="fp_max_tol: max normalized error allowed (default 0.01)")
    p.add_argument("--timeout", type=float, help=f"seconds allowed per tool call of one (layer, executor) job (default {DEFAULT_TIMEOUT_S:.0f})")
    p.add_argument("--skip-mode", action="store_true",
                   help="per layer, stop after the first executor (priority order) that succeeds; the others are "
                        "recorded as skipped. A later --skip-mode run does not retest layers with a success")
    p.add_argument("--recompute-cache", action="store_true",
                   help="recompute everything for this model (prepared model, layers, references, every verdict), "
                        "also under --skip-mode; the Snakemake form is `snakemake --forceall`")
    p.add_argument("--layer-inputs", choices=["propagate", "random"],
                   help="propagate (default): each layer gets the values it receives in a whole-model reference run "
                        "on the model inputs; random: op-aware generated values per layer (docs/inputs.md)")
    p.add_argument("--dedup-layers", action="store_true",
                   help="test one layer per signature (op type, attributes, shapes, dtypes); the others copy its "
                        "verdicts and are marked duplicate_of")
    p.add_argument("--compile-batch", type=int, metavar="N",
                   help="layers compiled by one compiler process per iree/torq executor (default 32; 1 = one "
                        "compile per layer); verdicts are the same (docs/compile_batches.md)")
    add_keep_work_option(p)
    p.add_argument("--skip-executors", metavar="A,B", help="comma-separated executor names not to test")
    p.add_argument("--skip-ops", metavar="OP,OP", help="comma-separated op types not to test (case-insensitive), "
                                                      "e.g. MaxPool,Add; those layers get no recommendation")
    p.add_argument("--compiler-option", action="append", default=[], metavar="OPT",
                   help="extra flag for the compiler of iree executors (repeatable); changing it recompiles")
    p.add_argument("--runtime-option", action="append", default=[], metavar="OPT",
                   help="extra flag for the runtime of iree executors (repeatable)")
    p.add_argument("--collect-timing", action="store_true",
                   help="measure each layer's runtime on each executor after its verification run, inside the "
                        "runtime (no process start-up): warm-up runs, then --timing-runs timed runs; median and "
                        "min go to the report")
    p.add_argument("--timing-runs", type=int, metavar="N", help="timed runs per (layer, executor) with "
                                                                "--collect-timing (default 5)")
    p.add_argument("--timing-warmup", type=int, metavar="N", help="untimed warm-up runs before them (default 1)")
    p.add_argument("--recommend-by-timing", action="store_true",
                   help="recommend the fastest success (else the fastest difference) by runtime median; layers "
                        "without timing data fall back to priority order, and the report says so")
    p.add_argument("--log-file", metavar="PATH", help="append every job's full diagnostics (command lines, compiler "
                                                      "stderr) to this file; the console keeps one line per job")
    for option in run_wide_options():  # a backend's run-wide settings (torq: --torq-hw, --torq-hw-type)
        p.add_argument(option.flag, dest=option.key, metavar=option.metavar, help=option.help)
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, metavar="-- SNAKEMAKE_ARGS",
                   help="extra Snakemake arguments after --, passed through (e.g. -- --printshellcmds)")
    p.add_argument("-n", "--dry-run", action="store_true", help="only show which jobs would run")
    p.add_argument("-q", "--quiet", action="store_true", help="show progress lines only, not each job")
    p.add_argument("-v", "--verbose", action="store_true", help="print full failure messages and Snakemake's debug output")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run discovery; print the final report text. Returns the exit status.

    In subgraph mode, discovery of the subgraph's layers is followed by the
    full-subgraph test (the subgraph as a whole with its recommended assignment, as
    ``torq-gen-config run`` does), recorded in the subgraph's report. The status is
    then 1 when that test could not run (the discovery report is kept).
    """
    from ..fullrun.reduce.search import parse_budget
    from ..pipeline.workflow_api import run_workflow
    from ..report.publish import compiler_json_error, read_report_summary

    resolve_execution_options(args)
    config = build_config(args)
    layout = output_layout(config)

    budget = parse_budget(getattr(args, "reduce_budget", None))
    if (args.reduce or args.reduce_budget) and not layout["subgraph"]:
        raise ConfigError("--reduce reduces a failing full-subgraph test (with --subgraph-from/--subgraph-to); "
                          "for the whole model: torq-gen-config run --reduce")
    if args.reduce_budget and not args.reduce:
        raise ConfigError("--reduce-budget needs --reduce")
    out = Path(args.output_dir).expanduser().resolve()
    name = layout["name"]
    # subgraph mode: the layers first; the full-subgraph test follows as a second step
    targets = [report_file(name), compiler_file(name)] if layout["subgraph"] else None
    extra = list(getattr(args, "snakemake_args", None) or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    # A run that did not finish its report (failed, stopped, a damaged work file removed)
    # left the marker: the report must be made again, and Snakemake would not (an existing
    # report over a missing intermediate is "up to date" to it), so the report job is forced;
    # its missing inputs are then made again too.
    forcerun = ["aggregate_report"] if (out / layout["work"] / OUTDATED_MARKER).is_file() else []
    # likewise a removed weight archive under the models that refer to it: its job runs again
    forcerun += sorted(set(repair_rules(out / layout["work"]).values()))

    def discovery(forcerun: list[str]) -> None:
        if extra or args.profile:  # Snakemake's command-line layer reads the profile (plugin settings too)
            from ..pipeline.workflow_api import run_workflow_with_snakemake_args

            run_workflow_with_snakemake_args(config=config, workdir=out, cores=args.cores,
                                             extra_args=(targets or []) + extra + (["--forcerun", *forcerun] if forcerun
                                                                                   else []) + (["-n"] if args.dry_run
                                                                                               else []),
                                             quiet=args.quiet, forceall=args.recompute_cache, profile=args.profile)
        else:
            run_workflow(config=config, workdir=out, cores=args.cores, targets=targets, dryrun=args.dry_run,
                         quiet=args.quiet, verbose=args.verbose, forceall=args.recompute_cache,
                         forcerun=forcerun or None)

    discovery(forcerun)
    report = out / report_file(name)
    if args.dry_run:
        return 0
    try:
        text, summary = read_report_summary(report)
    except ReportError as e:  # damaged outside the workflow: it is made from the work files
        if not report.is_file():
            raise
        print(f"torq-gen-config: {e}; removed it and making it again from the work files", file=sys.stderr)
        report.unlink(missing_ok=True)
        discovery(["aggregate_report"])
        text, summary = read_report_summary(report)
    status = 0
    if layout["subgraph"]:
        try:
            # on this machine (also with a cluster --profile: one job)
            _, section = run_assigned(config=config, out=out, layout=layout, cores=args.cores or os.cpu_count() or 1,
                                      quiet=args.quiet, verbose=args.verbose, echo=False, what="full-subgraph test")
        except TorqGenConfigError as e:
            print(f"torq-gen-config: error: the full-subgraph test could not run: {e}", file=sys.stderr)
            section = None
        if args.reduce:
            reduce_assigned(config=config, out=out, layout=layout, section=section, cores=args.cores or 1,
                            budget=budget)
        # its verdict (also a difference or error) is in the report; no verdict at all is a failure
        status = 0 if section is not None else 1
        text, summary = read_report_summary(report)  # the report now has the subgraph's section
    print(text)
    if config["dedup_layers"] and summary.get("distinct_layers_tested", summary["total_layers"]) < summary["total_layers"]:
        print(f"\n{summary['distinct_layers_tested']} distinct layers tested for {summary['total_layers']} layers (--dedup-layers)")
    print(f"\nReport:        {out / report_file(name)}")
    print(f"Compiler JSON: {out / compiler_file(name)}")
    if layout["subgraph"]:
        print(f"Work files:    {out / layout['work']}")
    from ..core.keep_work import measure, size_line

    print(size_line(measure(out / layout["work"], config["model"]), out / layout["work"], config["keep_work"]))
    reason = compiler_json_error(summary)
    if reason:  # written, with its error: the report says why each layer failed
        print(f"torq-gen-config: error: {reason}", file=sys.stderr)
        return EXIT_NOTHING_ASSIGNED
    return status
