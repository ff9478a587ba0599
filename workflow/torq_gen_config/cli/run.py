"""``torq-gen-config run``: run the whole model with the discovered assignment.

Reads the report JSON of the output directory (and regenerates the compiler JSON
from it), or, without a report, the compiler JSON as it is; computes each layer's
executor; then runs the full-model part of the Snakemake workflow
(``rules/full_model.smk``): the prepared model as a chain of partitions, each
compiled for its executor and run in order, compared with the ONNX Runtime
reference of the whole model. When every assigned executor is of the torq
backend, the whole model (``work/full.mlir``) is compiled once by torq-compile
with ``--torq-executor-map`` and run once (docs/torq_backend.md); torq and
non-torq executors in one assignment are bad input. ``--run-mode`` (config ``run_mode``):
``auto`` compiles an assignment of IREE executors whose devices are here as ONE IREE module with
per-op devices, ``module`` forces it (impossible: exit 2), ``partitions`` the chain
(:mod:`torq_gen_config.fullrun.module_mode`). The result goes into the report (``full_model``
section and the "--- Full Model Comparison ---" part of ``final_report_text``).
In subgraph mode (``--subgraph-from``/``--subgraph-to``) the same happens for the
subgraph, with its own report and work directory; :func:`run_assigned` is also the
full-subgraph test at the end of a subgraph ``discover``.

Exit status: 0 when the outputs match the reference, 1 for a difference, an error
(a partition failed to import, compile or run) or an unverified run, 2 for bad
input (no JSON, unknown executor, torq mixed with other executors, invalid model
or config).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Mapping

from ..backends import capabilities, executor_with_tool_options, run_wide_overrides, unavailable_executors
from ..core import run_lock
from ..core.errors import ConfigError, ReportError
from ..core.fileio import atomic_write_text, read_json, write_bytes_if_changed, write_json
from ..core.layout import (
    ASSIGNMENT_FILE,
    CASE_INPUTS_FILE,
    CASE_MODEL_FILE,
    FULL_DIR,
    FULL_MLIR_FILE,
    LOCATIONS_FILE,
    OUTDATED_MARKER,
    PLAN_FILE,
    PREPARED_MODEL_FILE,
    REFERENCE_FILE,
    RESULT_FILE,
    clear_outdated,
    compiler_file,
    full_run_file,
    lock_file,
    mark_outdated,
    reduced_dir,
    report_file,
    work_dir,
)
from ..core.lazy import onnx, yaml
from ..core.limits import DEFAULT_TIMEOUT_S
from ..fullrun.common import NOT_AS_ASSIGNED, PARTITIONS_MODE, RUN_RULES
from ..fullrun.plan import missing_debug_ir, missing_side_file
from ..fullrun.report_section import full_model_section, reduced_lines, render_full_model_text
from ..fullrun.selection import (
    assignment_bytes,
    check_selection,
    make_assignment,
    named_executors,
    selection_from_compiler_json,
    selection_from_report,
)
from ..model.prepare import load_model
from ..reference.model_inputs import load_input_data
from ..report.staleness import layer_files_digest
from .options import (
    add_execution_options,
    add_keep_work_option,
    add_model_options,
    add_reduce_options,
    build_config,
    output_layout,
    repair_rules,
    resolve_execution_options,
    subgraph_flags,
)


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``run`` subcommand."""
    p = sub.add_parser(
        "run",
        help="run the whole model with the discovered assignment and compare it with ONNX Runtime",
        description="Run the whole model with each layer on its assigned executor (from the report JSON, else the "
                    "compiler JSON, in --output-dir) as a chain of partitions, and compare the outputs with the "
                    "ONNX Runtime reference of the full model. With --subgraph-from/--subgraph-to: the subgraph "
                    "of a subgraph discovery, with its own report (docs/subgraph.md). Exit status 0: match; "
                    "1: difference or error; 2: bad input.",
    )
    add_model_options(p)
    add_execution_options(p, what="parallel compile jobs")
    p.add_argument("--run-mode", choices=["auto", "module", "partitions"],
                   help="module: the whole assignment as ONE IREE module with one device per executor (where each "
                        "op ran is read back from the compiled program); partitions: a chain of same-executor "
                        "partitions; auto (the config's run_mode, default): module when every assigned executor "
                        "is an IREE executor whose device is here (llvm-cpu, vmvx; cuda where a GPU is) and no "
                        "If/Loop body is assigned elsewhere, else "
                        "partitions (docs/full_model_run.md, 'Module mode')")
    p.add_argument("--debug-ir", metavar="DIR",
                   help="dump IREE's IR after each compilation phase of every partition to DIR/<partition id>; "
                        "in module mode the placed IR, the stream-level IR, the dispatch sources and the placement "
                        "record to DIR/<module pid> (README.txt there says how to read them)")
    p.add_argument("--compile-batch", type=int, metavar="N",
                   help="partitions compiled by one compiler process per iree executor (default: the config's "
                        "compile_batch; 1 = one compile per partition); the results are the same "
                        "(docs/full_model_run.md, 'Compile batches')")
    p.add_argument("--compiler-option", action="append", default=[], metavar="OPT",
                   help="extra flag for the compiler of iree executors (repeatable; write --compiler-option=--flag "
                        "for values that start with '-'); changing it recompiles")
    p.add_argument("--runtime-option", action="append", default=[], metavar="OPT",
                   help="extra flag for the runtime of iree executors (repeatable; --runtime-option=--flag)")
    add_keep_work_option(p)
    add_reduce_options(p)
    p.add_argument("-q", "--quiet", action="store_true", help="show progress lines only, not each job")
    p.add_argument("-v", "--verbose", action="store_true", help="print full failure messages and Snakemake's debug output")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the full model (in subgraph mode, the subgraph); print its comparison.
    Returns the exit status (0/1; bad input raises a TorqGenConfigError, which the
    command turns into status 2)."""
    from ..fullrun.reduce import parse_budget

    resolve_execution_options(args)
    config = build_config(args)
    layout = output_layout(config)
    out = Path(args.output_dir).expanduser().resolve()
    report_path = out / report_file(layout["name"])
    if report_path.is_file():
        from ..report.build import check_report
        from ..report.staleness import staleness

        recorded = read_json(report_path, "report JSON")
        check_report(recorded, str(report_path))
        stale = staleness(report_path, recorded, args.model)
        if stale:
            raise ReportError(f"{report_path.name}: {stale[0]}")
        config = with_discovery_inputs(config, recorded, args, layout, report_name=report_path.name,
                                       work=out / layout["work"])
    debug_ir = str(Path(args.debug_ir).expanduser().resolve()) if args.debug_ir else None
    budget = parse_budget(args.reduce_budget)  # a bad bound is an error before the run
    if args.reduce_budget and not args.reduce:
        raise ConfigError("--reduce-budget needs --reduce")
    status, section = run_assigned(config=config, out=out, layout=layout, cores=args.cores, quiet=args.quiet,
                                   verbose=args.verbose, debug_ir=debug_ir, model_arg=args.model,
                                   output_dir_arg=args.output_dir, profile=args.profile)
    if args.reduce:
        reduce_assigned(config=config, out=out, layout=layout, section=section, cores=args.cores or 1,
                        budget=budget)
    return status


#: Settings that define the prepared model, its input values and the layers' files: ``run``
#: uses discovery's (the compiler JSON's line:col and the layers' verdicts refer to them).
DISCOVERY_INPUT_KEYS = ("input_shapes", "target_opset", "inputs", "input_data", "layer_inputs",
                        "auto_convert_bf16", "auto_convert_int32", "save_bf16_model", "quantize", "per_channel",
                        "full_integer", "quant_format", "calibration_data", "calibration_samples")
#: Of those, the ones that change the model ``run`` runs: another value on run's command
#: line is refused (rerun discover with it first)
MODEL_DEFINING_FLAGS = {"target_opset": "--target-opset", "auto_convert_bf16": "--auto-convert-bf16",
                        "auto_convert_int32": "--auto-convert-int32", "save_bf16_model": "--save-bf16-model",
                        "quantize": "--quantize", "per_channel": "--per-channel", "full_integer": "--full-integer",
                        "quant_format": "--quant-format", "calibration_data": "--calibration-data",
                        "calibration_samples": "--calibration-samples"}


def with_discovery_inputs(config: dict, report: dict, args: argparse.Namespace, layout: dict, *,
                          report_name: str = "the report", work: Path | None = None) -> dict:
    """``config`` with discovery's settings (``DISCOVERY_INPUT_KEYS`` recorded in the report's
    provenance): the prepared model ``run`` partitions, its input values and the layers'
    files are the ones discovery made, so ``run`` re-makes none of them. ``--input-data``
    other than discovery's feeds only the full-model reference (config ``run_input_data``);
    other ``--input-shapes`` or model-defining flags
    (:data:`MODEL_DEFINING_FLAGS`: opset, precision conversion, quantization) than
    discovery's are refused. A setting the report does not record (an older report) is
    left as ``config`` has it.

    Raises:
        ConfigError: ``--input-shapes`` or a model-defining flag differs from discovery's,
            or discovery's input data file is gone, or another ``--input-data`` in
            subgraph mode (the subgraph's inputs come from a whole-model run).
        ModelError: another ``--input-data`` that the prepared model's inputs (in
            ``work``) do not take (a name or shape that does not fit).
    """
    recorded = (report.get("provenance") or {}).get("options") or {}
    if not all(k in recorded for k in ("input_shapes", "input_data")):
        return config
    config = dict(config)
    given_shapes = list(getattr(args, "input_shapes", None) or [])
    if given_shapes:
        from ..config import parse_input_shapes

        fixed = ((report.get("provenance") or {}).get("model") or {}).get("fixed_dims") or []
        set_by_discovery = {(d["input"], d["axis"]): d.get("to", 1) for d in fixed}
        for name, shape in parse_input_shapes(given_shapes).items():
            for axis, dim in enumerate(shape):
                if set_by_discovery.get((name, axis), dim) != dim:
                    used = ", ".join(f"{d['input']} dim {d['axis']} ({d['was']}) -> {d.get('to', 1)}" for d in fixed)
                    raise ConfigError(f"--input-shapes {' '.join(given_shapes)} differs from the shapes discovery "
                                      f"tested ({used}; {report_name}); rerun discover with the new ones first")
    for key, flag in MODEL_DEFINING_FLAGS.items():
        given = getattr(args, key, None)
        if given in (None, False) or key not in recorded:  # not on run's command line: discovery's applies
            continue
        if key in ("save_bf16_model", "calibration_data"):
            given = str(Path(given).expanduser().resolve())
        if given != recorded[key]:
            asked = flag if given is True else f"{flag} {given}"
            had = recorded[key] if recorded[key] not in (None, False, "") else "not given"
            raise ConfigError(f"{asked} differs from discovery's ({flag}: {had}; {report_name}): run follows the "
                              "discovery it runs; rerun discover with it first")
    for key in DISCOVERY_INPUT_KEYS:
        if key in recorded and key != "input_data":
            config[key] = recorded[key]
    if getattr(args, "reference", None) is None and recorded.get("reference"):
        config["reference"] = recorded["reference"]
    discovery_data = recorded.get("input_data") or ""
    given_data = config.get("input_data") if getattr(args, "input_data", None) else None
    if discovery_data and not Path(discovery_data).is_file():
        raise ConfigError(f"discovery's --input-data {discovery_data} ({report_name}) no longer exists; rerun discover")
    config["input_data"] = discovery_data
    if given_data and given_data != discovery_data:
        if layout.get("subgraph"):
            raise ConfigError("in subgraph mode the subgraph's inputs come from a whole-model run on discovery's "
                              "model inputs; pass --input-data to discover instead")
        prepared = Path(work or "") / PREPARED_MODEL_FILE
        if work is not None and prepared.is_file():  # the model's inputs take it: else one line now
            load_input_data(given_data, load_model(prepared, graph_only=True))
        config["run_input_data"] = given_data
    return config


def run_assigned(*, config: dict, out: Path, layout: dict, cores: int | None, quiet: bool = False,
                 verbose: bool = False, debug_ir: str | None = None, echo: bool = True, what: str = "full-model run",
                 model_arg: str | None = None, output_dir_arg: str | None = None,
                 profile: str | None = None) -> tuple[int, dict | None]:
    """Run the model of ``layout`` (the full model, or the subgraph) with the
    assignment of its report (else compiler JSON) in ``out``, and record the
    comparison in the report (``full_model`` section and text).

    Used by ``run`` and, in subgraph mode, at the end of ``discover`` (the
    full-subgraph test; ``echo=False``: discover prints the report text itself).

    Returns:
        ``(status, section)``: 0 when the outputs match the reference, else 1;
        ``section`` is the comparison (None when the workflow failed). With ``profile``
        (a cluster's), the jobs run as that profile says (``cores``: jobs at a time).

    Raises:
        ReportError, ConfigError: no report or compiler JSON, an unknown executor, ...
    """
    from ..compare import normalize_tolerance
    from ..config import check_precision_matches
    from ..pipeline.workflow_api import WorkflowFailed, run_workflow, run_workflow_with_snakemake_args
    from ..report.publish import publish_report

    name = layout["name"]
    report_path = out / report_file(name)
    compiler_path = out / compiler_file(name)
    full_dir = f"{layout['work']}/{FULL_DIR}"
    assignment_file, result_file = full_run_file(name, ASSIGNMENT_FILE), full_run_file(name, RESULT_FILE)

    report = None
    if report_path.is_file():
        report = read_json(report_path, "report JSON")
        check_precision_matches(report, config, report_name=report_path.name)
        selection = selection_from_report(report, source_file=report_path.name)
        # the compiler JSON of the report as it stands (unchanged bytes stay untouched)
        publish_report(report_path, compiler_path, report, rederive=False)
        tolerance = report.get("default_tolerance") or config["tolerance"]
    elif compiler_path.is_file():
        selection = selection_from_compiler_json(read_json(compiler_path, "compiler JSON"),
                                                 source_file=compiler_path.name)
        tolerance = config["tolerance"]
    else:
        raise ReportError(f"no report JSON ({report_path.name}) or compiler JSON ({compiler_path.name}) in {out}; "
                          f"run `torq-gen-config discover --model {model_arg or config['model']} --output-dir "
                          f"{output_dir_arg or out}{subgraph_flags(layout)}` first")
    for archive in repair_rules(out / layout["work"]):  # the models of the run refer to them
        raise ReportError(f"{archive} in {out / layout['work']} is missing (removed?); run `torq-gen-config discover "
                          f"--model {model_arg or config['model']} --output-dir {output_dir_arg or out}"
                          f"{subgraph_flags(layout)}` again to make it")
    try:
        tolerance = normalize_tolerance(tolerance)
        zero = sorted(k for k, v in tolerance.items() if k != "int_atol" and not v > 0)
        if zero:  # the same rule as --tolerance-* (config schema: > 0)
            raise ValueError(f"{', '.join(zero)} must be > 0")
    except ValueError as e:
        raise ReportError(f"{report_path.name}: invalid default_tolerance: {e}") from None
    mode = check_selection(selection, config["executors"])  # else PARTITIONS_MODE: a whole-model mode (torq)
    check_runnable(selection, config, out / layout["work"])
    if config.get("run_mode") == "module":  # impossible: one line, exit 2, before anything runs
        from ..fullrun.module_mode import decide_run_mode

        decide_run_mode("module", list(named_executors(selection)) or [config["executors"][0]["name"]],
                        config["executors"])
    write_bytes_if_changed(out / assignment_file, assignment_bytes(make_assignment(selection, debug_ir=debug_ir)))

    gone = missing_side_file(out / full_dir / PLAN_FILE) or missing_debug_ir(out / full_dir / PLAN_FILE, debug_ir)
    if gone:  # e.g. a partition directory removed by hand: the plan step writes them again
        print(f"{gone} is missing: planning the run again")
        for stale in (out / full_dir / PLAN_FILE, out / result_file):  # Snakemake remakes a lost plan only for a result
            stale.unlink(missing_ok=True)
    # the job's own verdict line uses the tolerance the report section is judged with
    config = {**config, "tolerance": {**config["tolerance"], **tolerance}}
    marker = out / layout["work"] / OUTDATED_MARKER
    layers_before = None if marker.is_file() or report is None else layer_files_digest(out / layout["work"])
    try:
        if profile:
            run_workflow_with_snakemake_args(config=config, workdir=out, cores=cores, quiet=quiet, profile=profile,
                                             extra_args=[result_file, "--allowed-rules", *RUN_RULES])
        else:
            run_workflow(config=config, workdir=out, cores=cores or os.cpu_count() or 1, targets=[result_file],
                         allowed_rules=list(RUN_RULES), quiet=quiet, verbose=verbose)
    except WorkflowFailed as e:
        print(f"torq-gen-config: error: the {what} failed: {e}", file=sys.stderr)
        return 1, None
    if layers_before is not None and marker.is_file():  # a job re-made model or layer files
        settle_outdated_marker(marker, layers_before, out / layout["work"])
    result = read_json(out / result_file, "full-model result")
    section = full_model_section(result, tolerance=tolerance, result_file=result_file)
    work_sec = finish_work(config, out, layout)  # --keep-work minimal: the finished run's intermediates removed
    if report is not None:
        report = read_json(report_path, "report JSON")  # re-read: keep edits made meanwhile
        report["work_dir"] = work_sec
        publish_report(report_path, compiler_path, report, full_model=section, rederive=False)
    if echo:
        print(render_full_model_text(section))
        whole = mode != PARTITIONS_MODE  # one whole-model compile by the backend that owns the mode
        print(f"{'Plan:' if whole else 'Partitions:':<15}{out / full_dir / PLAN_FILE}")
        hooks = capabilities(mode).whole_model() if whole else None
        for label, rel in (hooks.side_files(section) if hooks is not None else []):
            print(f"{label + ':':<15}{out / rel}")
        print(f"Result:        {out / result_file}")
        if section.get("outputs_file"):
            print(f"Outputs:       {out / section['outputs_file']} (the model's outputs of this run)")
        if report is not None:
            print(f"Report:        {report_path} (full_model section)")
        else:
            print(f"Compiler JSON: {compiler_path} (no report JSON: the result is only in {result_file})")
        if debug_ir:
            pid = (section.get("module") or {}).get("pid")
            print(f"Debug IR:      {debug_ir}/" + (f"{pid} (README.txt)" if pid and section.get("mode") == "module"
                                                    else "<partition id>"))
        from ..core.keep_work import size_line

        print(size_line(work_sec, out / layout["work"], config.get("keep_work", "minimal")))
    return run_exit_status(section), section


def settle_outdated_marker(marker: Path, layers_before: str, work: Path) -> None:
    """After a ``run`` that finished, the out-of-date marker its jobs set (they re-made the
    prepared model, the MLIR or the split) says the truth: removed when the files the
    report rests on are what they were (:func:`~torq_gen_config.report.staleness.layer_files_digest`),
    else given the reason (the report then describes other layer files: rerun discover)."""
    if layer_files_digest(work) == layers_before:
        clear_outdated(marker)
    else:
        mark_outdated(marker, reason="a run that finished re-made the prepared model or the layers' files, and "
                                     "they differ from those the report's verdicts were computed on")


def run_exit_status(section: Mapping) -> int:
    """``run``'s exit status for its ``full_model`` section: 0 when the model's outputs match
    the reference as assigned, else 1. A one-module run that failed or differed is a
    finding even when its partitions pass; one that did not keep the assignment is 1 under
    ``--run-mode module`` (its status says so) and 0 under ``auto`` when the partitions
    that replaced it (they keep the assignment by construction) pass."""
    module_status = (section.get("module") or {}).get("status")
    module_ok = module_status in (None, "success", "unverified") or (
        module_status == NOT_AS_ASSIGNED and section.get("mode") == PARTITIONS_MODE)
    return 0 if section.get("status") == "success" and module_ok else 1


def check_runnable(selection: dict, config: dict, work: Path) -> None:
    """Bad input of ``run`` found before any job: an executor the assignment names that
    cannot run on this machine (a GPU executor without its GPU: discovery gave it no
    layer jobs either), a compiler JSON key that names no op of ``full.mlir``, with
    ``--run-mode module`` a compiler JSON that puts an If/Loop body op elsewhere than its op.

    Raises:
        ReportError: one line naming the executor and its reason, or the key.
    """
    from ..mlir.placement import keys_matching_no_op

    named = named_executors(selection)
    defs = [executor_with_tool_options(e, config.get("compiler_options") or [], config.get("runtime_options") or [],
                                       run_wide_overrides(config))
            for e in config["executors"] if e["name"] in named]
    for name, why in unavailable_executors(defs, timeout_s=config.get("timeout_s") or 60).items():
        raise ReportError(f"{selection.get('source_file') or 'the assignment'} assigns executor {name!r} "
                          f"(e.g. to {named[name][0]}), which cannot run on this machine: {why}; assign those "
                          "layers to another executor (torq-gen-config edit --layer ... --executor ...)")
    keys = list((selection.get("locations") or {}))
    mlir = work / FULL_MLIR_FILE
    if keys and mlir.is_file() and config.get("run_mode") == "module":
        from ..fullrun.module_mode import REGION_OPS, region_conflicts, region_keys_of

        text = mlir.read_text(encoding="utf-8", errors="replace")
        if any(f'"onnx.{op}"' in text for op in REGION_OPS):
            conflicts = region_conflicts(region_keys_of(mlir), selection["locations"])
            if conflicts:
                raise ReportError(f"--run-mode module is impossible: an op with bodies has body ops assigned "
                                  f"elsewhere than itself (their bodies run where the op runs): {conflicts[0]}")
    if keys and mlir.is_file() and not config.get("quantize"):  # quantize: keys of the quantized model's MLIR
        bad = keys_matching_no_op(keys, mlir)
        if bad:
            raise ReportError(f"{selection.get('source_file') or 'the compiler JSON'}: op_assignments key {bad[0]!r} "
                              f"names no op of {mlir}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                              + "; keys are the line:col of ops in that file (run discover again if the model "
                                "changed)")


def finish_work(config: dict, out: Path, layout: dict) -> dict:
    """The report's ``work_dir`` section at the end of a run, after the clean-up of
    ``--keep-work minimal`` (:func:`torq_gen_config.pipeline.steps.report.finish_work_dir`), under
    the run lock (another run working there now: nothing is removed)."""
    from ..pipeline.steps.report import finish_work_dir

    lock = out / lock_file(layout["name"])
    try:
        run_lock.acquire(lock, what=f"{out} for {layout['name']}")
        held = True
    except run_lock.RunLocked:
        held = False
    try:
        return finish_work_dir(str(out / layout["work"]), config.get("keep_work", "minimal") if held else "all",
                               config["model"], output_dir=str(out))
    finally:
        if held:
            run_lock.release(lock)


def reduce_assigned(*, config: dict, out: Path, layout: dict, section: dict | None, cores: int, budget) -> dict | None:
    """``run --reduce``: reduce a failing run to the smallest subgraph that fails the same
    way (:mod:`torq_gen_config.fullrun.reduce`), write the reproducer folder beside the
    report (``reduced/``: model, inputs, reference outputs, the compiler JSON of the
    reduced model, ``README.txt``, ``reduce.json``) and add the result to the report's
    ``full_model.reduced``; print what was kept and the command that reproduces it.

    Returns:
        The ``reduced`` section, or None when there is nothing to reduce (the run
        matched, was unverified, or produced no result: said on stderr).

    Raises:
        ConfigError: the run was one whole-model compile (a torq assignment): there is
            no chain of partitions to reduce.
    """
    if section is None:
        print("torq-gen-config: --reduce: the run produced no result; nothing to reduce", file=sys.stderr)
        return None
    if section.get("status") in ("success", "unverified"):
        if section["status"] == "unverified":
            why = "the run is unverified (no reference to fail against)"
        elif (section.get("metrics") or {}).get("inconclusive"):
            why = "the outputs match the reference, but the comparison could not have failed (success*)"
        else:
            why = "the outputs match the reference"
        print(f"--reduce: nothing to reduce: {why}", file=sys.stderr)
        return None

    lock = out / lock_file(layout["name"])
    try:  # one reduction per output directory at a time (they share reduced/ and the report)
        run_lock.acquire(lock, what=f"{out} for {layout['name']} (run --reduce)")
    except run_lock.RunLocked as e:
        raise ConfigError(str(e)) from None
    try:
        return _reduce_locked(config=config, out=out, layout=layout, section=section, cores=cores, budget=budget)
    finally:
        run_lock.release(lock)


def _reduce_locked(*, config: dict, out: Path, layout: dict, section: dict, cores: int, budget) -> dict:
    from ..fullrun.reduce import REDUCE_WORK, Reducer, executor_definitions, outcome_of
    from ..fullrun.reproducer import raw_commands, save_reduced, write_reduced
    from ..report.publish import publish_report

    full = out / layout["work"] / FULL_DIR
    plan = read_json(full / PLAN_FILE, "full-model plan")
    if plan.get("mode") == "module":  # its partitions: the same assignment as a chain
        plan = {**plan, "mode": "partitions"}
    if (plan.get("mode") or "partitions") != "partitions":
        raise ConfigError(f"--reduce reduces a chain of partitions; this run is one whole-model compile "
                          f"({plan.get('mode')}): reduce it with --subgraph-from/--subgraph-to by hand")
    prepared = plan["prepared_model"]
    manifest_path = plan.get("manifest")
    if not manifest_path:
        raise ConfigError(f"{full / PLAN_FILE} names no layer manifest (an older version wrote it): run the same "
                          "`torq-gen-config run` again, then --reduce")
    name = layout["name"]
    target = outcome_of(section)
    print(f"--reduce: searching for the smallest subgraph that fails like this: {target.summary}", file=sys.stderr)
    try:
        reducer = Reducer(model_path=str(out / prepared), manifest=read_json(out / manifest_path, "layer manifest"),
                          layer_executors=plan["layer_executors"], executors=executor_definitions(plan),
                          reference_npz=str(full / REFERENCE_FILE), tolerance=section["tolerance_used"],
                          work_dir=full / REDUCE_WORK, jobs=cores, timeout_s=float(config.get("timeout_s") or DEFAULT_TIMEOUT_S),
                          budget=budget, progress=lambda line: print(f"--reduce: {line}", file=sys.stderr))
    except ValueError as e:  # the plan does not describe the model's nodes
        raise ReportError(f"--reduce: {e}") from None
    reducer.record_values()
    found = reducer.search(target)
    red_dir = out / reduced_dir(layout["subgraph"]["suffix"] if layout["subgraph"] else "")
    shutil.rmtree(red_dir, ignore_errors=True)
    reduced = write_reduced(reducer, found, target=target, out_dir=red_dir)
    reduced["dir"] = os.path.relpath(red_dir, out)
    try:
        write_reproducer_assignment(config, reducer, found, red_dir, cores)
        reduced["reproducer"] = reproducer_command(red_dir, config, section["tolerance_used"])
    except Exception as e:  # the reduction stands; only the one-line command is missing
        reduced["reproducer_note"] = f"no reproducer command: {type(e).__name__}: {str(e)[:300]}"
    reduced["raw_commands"] = raw_commands(reducer, found, red_dir)
    save_reduced(red_dir, reduced)
    report_path = out / report_file(name)
    work_sec = finish_work(config, out, layout)  # the reduction's compiled candidates (--keep-work minimal)
    if report_path.is_file():
        report = read_json(report_path, "report JSON")
        report["work_dir"] = work_sec
        publish_report(report_path, out / compiler_file(name), report, full_model={**section, "reduced": reduced},
                       rederive=False)
    print("\n".join(reduced_lines(reduced)))
    if reduced.get("reproducer_note"):
        print(f"  ({reduced['reproducer_note']})")
    print(f"Reduced:       {red_dir} (README.txt)")
    return reduced


def write_reproducer_assignment(config: dict, reducer, found: dict, red_dir: Path, cores: int) -> None:
    """The compiler JSON of the reduced model ``red_dir/model.onnx`` (with its
    ``inputs.npz``, :func:`~torq_gen_config.fullrun.reproducer.write_reduced`): the workflow prepares and
    imports ``red_dir/model.onnx`` as ``run`` will (rules prepare_model and
    import_full_model, into ``red_dir/work/model``) and each node's executor is keyed by
    the ``line:col`` of its op there.

    Raises:
        WorkflowFailed: the preparation or import failed; ValueError: see
            :func:`~torq_gen_config.fullrun.reproducer.reproducer_compiler_json`.
    """
    from ..fullrun.reproducer import reproducer_compiler_json
    from ..pipeline.workflow_api import run_workflow

    cfg = {k: v for k, v in config.items() if k not in ("subgraph_from", "subgraph_to", "run_input_data")}
    cfg.update({"model": str(red_dir / CASE_MODEL_FILE), "input_data": str(red_dir / CASE_INPUTS_FILE),
                "auto_convert_bf16": False, "auto_convert_int32": False, "quantize": False})
    work = work_dir("model")
    run_workflow(config=cfg, workdir=red_dir, cores=cores, targets=[f"{work}/{LOCATIONS_FILE}"],
                 allowed_rules=["prepare_model", "import_full_model"], quiet=True, display="lines")
    prepared = onnx.load(str(red_dir / work / PREPARED_MODEL_FILE), load_external_data=False)
    doc = reproducer_compiler_json(reducer, found, read_json(red_dir / work / LOCATIONS_FILE, "MLIR locations"),
                                   prepared)
    write_json(red_dir / compiler_file("model"), doc)


#: Settings of the run that the reproducer keeps in ``reduced/config.yaml`` (how each
#: executor compiles and runs, how the outputs are judged).
REPRODUCER_KEYS = ("executors", "tolerance", "reference", "timeout_s", "compiler_options", "runtime_options",
                   "parameters", "parameters_auto_mb")
#: Environment variables that choose the executors' tools (backends/iree_tools.py,
#: backends/torq/toolchain.py): the reproducer sets those that are set.
TOOL_ENV_VARS = ("IREE_COMPILE", "IREE_RUN_MODULE", "IREE_BENCHMARK_MODULE", "TORQ_COMPILE", "TORQ_RUN_MODULE",
                 "TORQ_TOOL_PATH", "IREE_BUILD_DIR")


def reproducer_command(red_dir: Path, config: dict, tolerance: dict) -> str:
    """The one-line ``torq-gen-config run`` command on the reduced model (paths relative
    to the current directory when below it), with the run's executors, tool options,
    reference and ``tolerance`` written to ``red_dir/config.yaml`` for it, led by the
    tool override variables set now (``IREE_COMPILE=... torq-gen-config run ...``)."""
    settings = {k: config[k] for k in REPRODUCER_KEYS if config.get(k) is not None}
    settings["tolerance"] = {**(config.get("tolerance") or {}), **tolerance}
    atomic_write_text(red_dir / "config.yaml", "# the settings of the run that was reduced (run --reduce)\n"
                      + yaml.safe_dump(settings, sort_keys=False))

    def rel(p: Path) -> str:
        r = os.path.relpath(p)
        return str(p) if r.startswith("..") else r

    # the tools' override variables that are set now (another iree-compile is another run)
    env = [f"{v}={os.environ[v]}" for v in TOOL_ENV_VARS if os.environ.get(v)]
    return shlex.join([*env, "torq-gen-config", "run", "--model", rel(red_dir / CASE_MODEL_FILE), "--input-data",
                       rel(red_dir / CASE_INPUTS_FILE), "--output-dir", rel(red_dir), "--config-file",
                       rel(red_dir / "config.yaml")])
