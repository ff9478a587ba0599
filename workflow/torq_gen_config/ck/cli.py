"""``ck-profile``: convert PyTorch convolution traces to CK Profiler configurations and run them.

Subcommands ``convert`` and ``run``; the seed's two scripts (scripts/convert_pytorch_to_ck.py,
scripts/run_ck_profiler.py) are :func:`convert_main` and :func:`run_main` with the seed's
option names. ``run`` executes the Snakemake workflow of rules/ck_profiler.smk (one job per
configuration: parallel, incremental, resumable) in a work directory, then copies the results
to ``--output``. Errors meant for the user end with one line ``ck-profile: error: ...`` and
exit status 2; a run in which a configuration failed exits 1.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path

from ..core.errors import ReportError, TorqGenConfigError
from . import convert, profile, results, steps
from ..core.fileio import read_json, write_json
from ..pipeline.workflow_api import run_workflow

PROG = "ck-profile"
DEFAULT_TRACE = "build/test-data/conv_repros_ir.json"
DEFAULT_CONFIGS = "ck_profiler_configs.json"
DEFAULT_RESULTS = "profiler_results.json"


def add_convert_args(p: argparse.ArgumentParser) -> None:
    """The converter's arguments (the seed's: IN and OUT, both optional)."""
    p.add_argument("input", nargs="?", default=None, metavar="IN",
                   help=f"TraceLens event-replay IR of the convolutions (default: {DEFAULT_TRACE})")
    p.add_argument("output", nargs="?", default=None, metavar="OUT",
                   help=f"CK profiler configurations to write (default: {DEFAULT_CONFIGS})")
    p.add_argument("--input", dest="input_opt", metavar="IN", help=argparse.SUPPRESS)  # the seed's copies' spelling
    p.add_argument("--output", dest="output_opt", metavar="OUT", help=argparse.SUPPRESS)
    p.add_argument("-q", "--quiet", action="store_true", help="only the summary, not one line per record")


def do_convert(args) -> int:
    """Convert a trace; exit 0 when at least one configuration was written, 1 when none could
    be converted (nothing is written then), 2 for a malformed trace."""
    trace = args.input or args.input_opt or DEFAULT_TRACE
    out = args.output or args.output_opt or DEFAULT_CONFIGS
    print("Converting PyTorch convolutions to CK Profiler format...\n")
    conv = convert.convert_file(trace, out)
    if not args.quiet:
        print("\n".join(conv.lines))
    print(convert.summary_text(conv, out))
    if not conv.configs:
        print(f"no convolution in {trace} could be converted (see the reasons above); {out} was not written",
              file=sys.stderr)
        return 1
    print("\nConversion completed successfully!")
    return 0


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The runner's arguments (the seed's, plus backend, timeout, parallelism, work directory)."""
    p.add_argument("config_file", help="CK profiler configurations JSON (from `ck-profile convert`)")
    p.add_argument("--profiler-path", default=None, metavar="DIR",
                   help=f"directory of the ckProfiler binary, or the binary (default: {profile.DEFAULT_PROFILER_PATH}, "
                        f"then ${profile.ENV_VAR}, then PATH)")
    p.add_argument("--backend", choices=profile.BACKENDS, default="ckprofiler",
                   help="ckprofiler: the real CK program (needs ROCm); onnxruntime: time the same convolutions "
                        "on this machine's CPU as a cross-check (default: ckprofiler)")
    p.add_argument("--max-ops", type=_positive_int, default=None, metavar="N",
                   help="run at most N configurations, in priority-rank order (default: all)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing, write nothing")
    p.add_argument("--quiet", action="store_true", help="one line per configuration instead of a block")
    p.add_argument("--no-save", action="store_true", help="write no results file (and keep no work directory)")
    p.add_argument("--output", default=DEFAULT_RESULTS, metavar="FILE",
                   help=f"results JSON (default: {DEFAULT_RESULTS})")
    p.add_argument("--timeout", type=_timeout, default=steps.DEFAULTS["ck_timeout_s"], metavar="S",
                   help="wall-clock limit of one configuration's run in seconds (default: %(default)s)")
    p.add_argument("-j", "--jobs", type=_positive_int, default=os.cpu_count() or 1, metavar="N",
                   help="Snakemake cores (default: all CPUs)")
    p.add_argument("--devices", type=_positive_int, default=1, metavar="N",
                   help="measurements run at the same time (default 1: parallel runs on one device skew each "
                        "other's times)")
    p.add_argument("--work-dir", default=None, metavar="DIR",
                   help="per-configuration results, logs and Snakemake state; a rerun resumes there "
                        "(default: results/ck/<config file stem>)")
    p.add_argument("--rerun", action="store_true", help="run every configuration again, even those with results")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the configurations whose last run failed, timed out or crashed (kept otherwise)")
    p.add_argument("-v", "--verbose", action="store_true", help="show Snakemake's per-job blocks")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {v}")
    return v


def _timeout(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < v <= steps.MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be > 0 and at most {steps.MAX_TIMEOUT_S} s, not {text}")
    return v


def _dry_run(args, selected: list[dict]) -> int:
    if args.backend == "ckprofiler":
        try:
            binary = profile.locate_profiler(args.profiler_path)
        except profile.ProfilerNotFound as e:
            binary = os.path.join(args.profiler_path or profile.DEFAULT_PROFILER_PATH, profile.BINARY)
            print(f"note: {e}\n")
    else:
        binary = None
    print(f"Dry run: {len(selected)} configuration(s), nothing is executed\n")
    for i, e in enumerate(selected, 1):
        print(f"[{i}/{len(selected)}] {e['description']} (rank {e['priority_rank']})")
        if e["config_id"] is None:
            print(f"  not run: {e['error']}")
            continue
        try:
            argv, notes = profile.backend_command(e["config"], args.backend, binary, None)
        except TorqGenConfigError as err:  # a code the cross-check does not know
            print(f"  not run on {args.backend}: {err}")
            continue
        print(f"  Command: {shlex.join(argv)}")
        for n in notes:
            print(f"  note: {n}")
    return 0


def _failed_results(work: Path) -> list[str]:
    """The result files in ``work`` of runs that failed, timed out or crashed."""
    failed = []
    for path in sorted(work.glob("runs/*/result.json")):
        try:
            rec = read_json(path, "CK result")
        except ReportError:
            continue
        if isinstance(rec, dict) and rec.get("status") in ("failed", "timeout", "crash"):
            failed.append(str(path))
    return failed


def _check_writable(path: str) -> None:
    """Refuse an --output that cannot be written before any configuration runs."""
    p = Path(path)
    if p.is_dir():
        raise TorqGenConfigError(f"--output {path} is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    existing = next((d for d in (parent, *parent.parents) if d.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise TorqGenConfigError(f"--output {path}: {existing} is not a writable directory")


def do_run(args) -> int:
    """Run the configurations (see :func:`add_run_args`); exit 0 when all succeeded, 1 otherwise."""
    configs = os.path.abspath(args.config_file)
    entries = results.load_configs(configs)
    selected = results.select(entries, args.max_ops)
    if not selected:
        raise TorqGenConfigError(f"{args.config_file} holds no configurations")
    if args.dry_run:
        return _dry_run(args, selected)
    if not args.no_save:
        _check_writable(args.output)
    binary = profile.locate_profiler(args.profiler_path) if args.backend == "ckprofiler" else None
    print(f"Executing {'CK Profiler' if binary else 'the ONNX Runtime cross-check'} for {len(selected)} "
          f"configuration(s)" + (f" ({binary})" if binary else "") + "...\n", flush=True)
    tmp = tempfile.TemporaryDirectory(prefix="ck-profile-") if args.no_save else None
    try:
        work = Path(tmp.name if tmp else (args.work_dir or os.path.join("results", "ck", Path(configs).stem))).resolve()
        config = {"ck_configs": configs, "ck_output_dir": str(work), "ck_backend": args.backend,
                  "ck_profiler_path": binary, "ck_timeout_s": args.timeout, "ck_max_ops": args.max_ops,
                  "ck_quiet": args.quiet, "ck_summary": False}
        retry = _failed_results(work) if args.retry_failed else []
        if retry:
            print(f"Retrying {len(retry)} configuration(s) whose last run failed", flush=True)
        run_workflow(config=config, workdir=work, cores=args.jobs, targets=["ck_profile"], forceall=args.rerun,
                     forcerun=retry,
                     quiet=not args.verbose, quiet_progress=args.quiet,
                     lock=(steps.LOCK_FILE, f"{work} (CK profiling)", PROG), resources={"ck_device": args.devices})
        doc = read_json(work / steps.RESULTS_FILE, "CK profiler results")
        if not args.no_save:
            try:
                write_json(args.output, doc)
            except OSError as e:
                raise TorqGenConfigError(f"cannot write {args.output}: {e.strerror or e} (the results are in "
                                         f"{work / steps.RESULTS_FILE})") from None
        print(results.summary_text(doc, None if args.no_save else args.output))
        if not args.no_save:
            print(f"Per-configuration results and logs: {work}")
    finally:
        if tmp:
            tmp.cleanup()
    return 0 if doc["stats"]["success"] == doc["stats"]["total"] else 1


def build_parser() -> argparse.ArgumentParser:
    """``ck-profile`` with its subcommands."""
    parser = argparse.ArgumentParser(prog=PROG, description="PyTorch convolution traces -> CK Profiler "
                                     "configurations -> profiler runs (docs/ck_profile.md).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    c = sub.add_parser("convert", help="TraceLens IR -> CK profiler configurations",
                       description="Convert the convolutions of a TraceLens event-replay IR to ckProfiler "
                                   "configurations (data type and layout from the trace).")
    add_convert_args(c)
    c.set_defaults(func=do_convert)
    r = sub.add_parser("run", help="run ckProfiler (or the ONNX Runtime cross-check) for each configuration",
                       description="Run every configuration as one Snakemake job and write the results JSON.")
    add_run_args(r)
    r.set_defaults(func=do_run)
    return parser


def _call(func, args, prog: str = PROG) -> int:
    try:
        return int(func(args) or 0)
    except TorqGenConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"{prog}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"{prog}: stopped; finished configurations are kept, rerun the same command to resume", file=sys.stderr)
        return 128 + int(signum)


def main(argv: list[str] | None = None) -> int:
    """The ``ck-profile`` console script."""
    args = build_parser().parse_args(argv)
    return _call(args.func, args)


def convert_main(argv: list[str] | None = None) -> int:
    """``python scripts/convert_pytorch_to_ck.py [IN] [OUT]`` (the seed's converter)."""
    p = argparse.ArgumentParser(prog="convert_pytorch_to_ck.py",
                                description="Convert PyTorch convolutions (TraceLens IR) to CK Profiler configurations.")
    add_convert_args(p)
    return _call(do_convert, p.parse_args(argv), p.prog)


def run_main(argv: list[str] | None = None) -> int:
    """``python scripts/run_ck_profiler.py CONFIGS [--profiler-path DIR] ...`` (the seed's runner)."""
    p = argparse.ArgumentParser(prog="run_ck_profiler.py", description="Execute CK Profiler for each configuration.")
    add_run_args(p)
    return _call(do_run, p.parse_args(argv), p.prog)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
