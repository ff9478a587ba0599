"""``torq-gen-config conformance``: ONNX's node tests (from the installed onnx wheel) through
discovery, each against its own expected outputs, into an op type x executor support matrix
(``conformance.json``, ``.md``, ``.html``) and per-test verdicts (``conformance_verdicts.json``).
Resumable and incremental: a test whose record is current is not run again."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .. import workflow_files
from ..core.errors import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``conformance`` subcommand."""
    p = sub.add_parser(
        "conformance",
        help="run ONNX's node tests through discovery and write an op type x executor support matrix",
        description="Run ONNX's node tests (onnx.backend.test.case.node, without *_expanded and sequence/optional "
                    "I/O) through discovery on the configured executors; each executor's outputs are checked "
                    "against the test's expected outputs (its rtol/atol): passed, differing, failed (by stage) or "
                    "not judged (no outputs through no fault of the executor's: a refused test, a node folded to "
                    "a constant, ...); the product's verdicts are recorded too. "
                    "Writes conformance.json/.md/.html and conformance_verdicts.json into --output-dir.",
    )
    p.add_argument("--output-dir", default="conformance", help="directory of the matrix and of tests/<test>/ "
                                                               "(default: conformance)")
    p.add_argument("--config-file", help="YAML file with workflow settings (executors, tolerance, ...) on top of "
                                         "config/config.yaml, passed to every test's discovery")
    p.add_argument("--skip-executors", metavar="A,B", help="comma-separated executor names not to test")
    p.add_argument("--ops", metavar="OP,OP", help="only the tests of these op types (case-insensitive), e.g. Relu,Conv")
    p.add_argument("--match", metavar="RE", help="only the tests whose name matches the regular expression RE")
    p.add_argument("--sample", type=int, metavar="N", help="a random sample of N of the selected tests (--seed)")
    p.add_argument("--seed", type=int, default=1, help="seed of --sample (default 1)")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help="tests run at once (default: number of CPU cores); each discovery runs one job")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per test (default 600); its discovery's limit per tool call is half of it. A rerun "
                        "with a larger --timeout runs the tests that timed out again")
    p.add_argument("--expected-failures", action="append", default=[], metavar="[EXECUTOR=]FILE",
                   help="compare an executor (default: the first one tested) with a backend's expected-failure list: "
                        "IREE's iree-test-suites onnx_ops config_*.json (expected_compile_failures, "
                        "expected_run_failures), a JSON list or one test name a line; marks unexpected passes and "
                        "failures (repeatable)")
    p.add_argument("--rerun", action="store_true", help="run every selected test again, also those with a current "
                                                         "record")
    p.add_argument("-q", "--quiet", action="store_true", help="progress lines only, no line per test, no live display")
    p.set_defaults(func=run, kept_on_interrupt="finished tests are kept")
    return p


def _csv(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the conformance tests; print the summary. Returns the exit status (0)."""
    from ..conformance import cases, matrix, render, runner
    from ..config import DEFAULT_CONFIG_PATH, load_config_file, validate_config

    if args.jobs is not None and args.jobs < 1:
        raise ConfigError("--jobs must be at least 1")
    if args.timeout <= 0:
        raise ConfigError("--timeout must be positive")
    if args.sample is not None and args.sample < 1:
        raise ConfigError("--sample must be at least 1")
    absent = workflow_files.missing()
    if absent:
        raise ConfigError(absent)
    config = load_config_file(DEFAULT_CONFIG_PATH)
    config_file = None
    if args.config_file:
        config_file = str(workflow_files.resolve_preset(args.config_file))
        config.update(load_config_file(config_file))
    if args.skip_executors:
        config["skip_executors"] = _csv(args.skip_executors)
    config = validate_config(config)
    settings = runner.Settings(out=Path(args.output_dir).expanduser().resolve(), config=config,
                               config_file=config_file, timeout_s=args.timeout, jobs=args.jobs or os.cpu_count() or 1,
                               quiet=args.quiet, rerun=args.rerun)
    tested = [e["name"] for e in settings.executors]
    for spec in args.expected_failures:
        name, sep, path = spec.partition("=")
        if not sep or not name or Path(spec).exists():
            name, path = tested[0], spec
        if name not in tested:
            raise ConfigError(f"--expected-failures {spec}: {name!r} is not a tested executor ({', '.join(tested)})")
        settings.expected.append((name, path, matrix.load_expected_failures(path)))
    if args.ops is not None and not _csv(args.ops):
        raise ConfigError("--ops names no op type (give e.g. --ops Relu,Conv, or leave it out for every test)")
    try:
        selection = cases.collect(ops=_csv(args.ops) or None, match=args.match, sample=args.sample, seed=args.seed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not selection.cases:
        raise ConfigError("no node test is selected (--ops, --match)")
    doc = runner.run(settings, selection)
    out = settings.out
    print("\n".join(render.summary_lines(doc)))
    for comp in doc["expected_failures"]:
        print(f"{comp['executor']} against {comp['file']}: {len(comp['unexpected_passes'])} unexpected passes, "
              f"{len(comp['unexpected_failures'])} unexpected failures, {comp['expected_failures']} fail as listed")
    print(f"\nMatrix:   {out / runner.MATRIX_FILE} (.md, .html)\nVerdicts: {out / runner.VERDICTS_FILE}")
    return 0
