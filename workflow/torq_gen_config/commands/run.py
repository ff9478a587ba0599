"""``run`` as functions: run the model (or subgraph) of an output directory with its
report's assignment and record the comparison in the report (:func:`run_assigned`), and
reduce a failing run to the smallest failing subgraph with a reproducer
(:func:`reduce_assigned`). The command line (``cli/run.py``, ``cli/discover.py``) parses
the options and calls these; the exit status rule is :func:`run_exit_status`.
"""

from __future__ import annotations

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
from ..report.staleness import layer_files_digest
from ..model.symbolic_dims import guessed_dims
from .outputs import repair_rules, subgraph_flags


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
        from ..fullrun.module.mode import decide_run_mode

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
        if report is not None:
            print(f"Report:        {report_path} (full_model section)")
        else:
            print(f"Compiler JSON: {compiler_path} (no report JSON: the result is only in {result_file})")
        if debug_ir:
            pid = (section.get("module") or {}).get("pid")
            print(f"Debug IR:      {debug_ir}/" + (f"{pid} (README.txt)" if pid and section.get("mode") == "module"
                                                    else "<partition id>"))
        note = chosen_sizes_note(report, section)
        if note:
            print(note)
        from ..core.keep_work import size_line

        print(size_line(work_sec, out / layout["work"], config.get("keep_work", "minimal")))
    return run_exit_status(section), section


def chosen_sizes_note(report: Mapping | None, section: Mapping) -> str | None:
    """A line for a run that did not pass while some input dims had sizes the tool chose
    (nothing gave them: :func:`~torq_gen_config.model.symbolic_dims.guessed_dims` of the
    report's provenance): those sizes are the first suspect, and the option that changes
    them goes to discover first. None for a success or sizes that were all given."""
    if section.get("status") == "success" or not report:
        return None
    fixed = ((report.get("provenance") or {}).get("model") or {}).get("fixed_dims") or []
    chosen = guessed_dims(fixed)
    if not chosen:
        return None
    dims = ", ".join(f"{d['input']} dim {d['axis']} = {d.get('to')}" for d in chosen)
    return (f"Note: the tool chose the sizes of dynamic input dims ({dims}); if the model is used at other sizes, "
            "give them to discover with --input-shapes (or --input-data), then run again")


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
        from ..fullrun.module.mode import REGION_OPS, region_conflicts, region_keys_of

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
    way (:mod:`torq_gen_config.fullrun.reduce.search`), write the reproducer folder beside the
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
    from ..fullrun.reduce.search import REDUCE_WORK, Reducer, executor_definitions, outcome_of
    from ..fullrun.reduce.reproducer import raw_commands, save_reduced, write_reduced
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
    ``inputs.npz``, :func:`~torq_gen_config.fullrun.reduce.reproducer.write_reduced`): the workflow prepares and
    imports ``red_dir/model.onnx`` as ``run`` will (rules prepare_model and
    import_full_model, into ``red_dir/work/model``) and each node's executor is keyed by
    the ``line:col`` of its op there.

    Raises:
        WorkflowFailed: the preparation or import failed; ValueError: see
            :func:`~torq_gen_config.fullrun.reduce.reproducer.reproducer_compiler_json`.
    """
    from ..fullrun.reduce.reproducer import reproducer_compiler_json
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
