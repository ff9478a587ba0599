"""Steps of rules/full_model.smk (``torq-gen-config run``, or ``snakemake full_model``):
the whole model as a chain of partitions with the report's assignment, compiled and
run in order, compared with the whole model's reference. docs/full_model_run.md
describes the files. The rule entry points first, then the job bodies (plain paths and
values, also called by tests and benchmarks)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ...backends import capabilities
from ...backends.parameters import describe, resolve_from
from ...core.errors import ReportError
from ...core.fileio import read_json, write_bytes_if_changed, write_json
from ...core.layout import BATCH_FILE, MODULE_FILE, RUN_OUTPUTS_FILE, PartitionFolder
from ...core.lazy import onnx
from ...core.limits import DEFAULT_TIMEOUT_S, model_job_limit
from ...core.weight_store import FOLDED_RUN_FILE, STORE_FILE
from ...discovery.batch_compile import ALONE
from ...fullrun import batches as fullrun_batches, compile as fullrun_compile
from ...fullrun.selection import (
    assignment_bytes,
    make_assignment,
    selection_digest,
    selection_from_compiler_json,
    selection_from_report,
)
from ...fullrun.batches import batch_dir, batch_members
from ...fullrun.plan import make_plan, prune_plan_dirs
from ...fullrun.execute import run_partitions
from ...fullrun.common import MODULE_MODE, PARTITIONS_MODE
from ...core.job_support import in_worker, records_failure
from ...core.logs import append_record, append_to_shared_log
from ...core.external_data import load_model
from ...fullrun.module.mode import module_or_partitions
from ...fullrun.module.run import compile_module_partition, run_module_plan
from ...reference import compute_reference
from ...reference.model_inputs import load_input_data, load_model_inputs
from .quantize import quantized_input_ranges
from . import step


@step
def full_assignment(input, output, params, log) -> None:
    """Rule ``full_assignment``: assignment.json from the compiler JSON (input) and the
    report next to it (param ``report``, a path; param ``digest``: what it assigns)."""
    assignment_job(report=params.report, compiler=input.compiler, assignment=output.assignment, log=log[0])


@step
def plan_full_model(input, output, params, log) -> None:
    """Checkpoint ``plan_full_model``: plan.json and the partitions' side files.
    Params: ``executors``, ``compiler_options``, ``runtime_options``, ``compile_batch``,
    ``parameters`` (the config's setting, resolved with input ``info``, prepare.json);
    untracked ``timeout_s``."""
    plan_job(assignment=input.assignment, prepared=input.model, manifest=input.manifest,
             locations=input.locations, executors=params.executors, plan=output.plan,
             compiler_options=params.compiler_options, runtime_options=params.runtime_options,
             full_mlir=input.mlir, compile_batch=params.compile_batch, timeout_s=params.timeout_s, log=log[0],
             parameters=params.parameters, prepare_info=input.info, run_mode=params.run_mode)


@step
def compile_partition_batch(input, output, params, log, wildcards) -> None:
    """Rule ``compile_partition_batch``: the partitions of one compile batch (wildcards
    ``executor``, ``batch``) imported and compiled as one module. Params: ``executor``
    (the members' compile definition), ``members`` (``[{"slug": pid, "layer_id"}]``);
    untracked ``timeout_s``, ``log_file``. Input ``models``: the members' ONNX models."""
    compile_partition_batch_job(executor=params.executor, members=params.members,
                                partitions_dir=str(Path(input.models[0]).parent.parent),
                                out_dir=os.path.dirname(output.module), timeout_s=params.timeout_s,
                                log=log[0], log_file=params.log_file)


@step
def compile_partition(input, output, params, log, wildcards) -> None:
    """Rule ``compile_partition``: one partition (wildcard ``pid``) compiled for its
    executor (param ``executor``), or taken from its compile batch (param ``batch``: its
    id; the batch's files are inputs ``batch_module``, ``batch_info`` unless the batch is
    kept from an earlier run); untracked ``timeout_s``, ``log_file``, ``verbose``."""
    batch = None
    if params.batch:  # an input when this plan compiles the batch, else kept from an earlier run
        d = batch_dir(Path(output.compiled).parent.parent.parent, params.executor["name"], params.batch)
        batch = {"module": str(d / MODULE_FILE), "info": str(d / BATCH_FILE)}
    compile_partition_job(pid=wildcards.pid, model=input.model, executor=params.executor,
                          compiled=output.compiled, timeout_s=params.timeout_s, log=log[0],
                          log_file=params.log_file, verbose=params.verbose, batch=batch)


@step
def full_reference(input, output, params, log) -> None:
    """Rule ``full_reference``: the whole model's reference outputs on the model's input
    values (or on ``run --input-data``). Params: ``inputs``, ``engine``, ``quantized``,
    ``optimized_check``; untracked ``timeout_s``."""
    full_reference_job(prepared=input.model, reference=output.reference,
                       input_settings=params.inputs, model_inputs=input.model_inputs,
                       run_data=input.run_data[0] if input.run_data else None,
                       quantized=params.quantized, engine=params.engine, optimized_check=params.optimized_check,
                       timeout_s=params.timeout_s, log=log[0])


@step
def run_full_model(input, output, params, log) -> None:
    """Rule ``run_full_model``: result.json of the whole-model run; untracked
    ``tolerance``, ``timeout_s``, ``log_file``, ``verbose``."""
    run_full_model_job(plan=input.plan, reference=input.reference, result=output.result,
                       tolerance=params.tolerance, timeout_s=params.timeout_s,
                       log=log[0], log_file=params.log_file, verbose=params.verbose)


# ---- job bodies

def read_selection(report: str | None, compiler: str | None) -> dict | None:
    """The selection of the report JSON if it exists, else of the compiler JSON, else None."""
    if report and os.path.isfile(report):
        return selection_from_report(read_json(report, "report JSON"), source_file=os.path.basename(report))
    if compiler and os.path.isfile(compiler):
        return selection_from_compiler_json(read_json(compiler, "compiler JSON"), source_file=os.path.basename(compiler))
    return None


def selection_digest_of(report: str | None, compiler: str | None = None) -> str | None:
    """Digest of what the report (else compiler JSON) assigns; None if unreadable.

    Used as a rule param, so that an edit of the recommendations reruns the
    assignment rule while a rewrite of the report that keeps them (``run`` adds
    its ``full_model`` section) does not.
    """
    try:
        return selection_digest(read_selection(report, compiler))
    except Exception:
        return None


def partition_batch_members(plan: dict, batch_id: str) -> list[dict]:
    """The members of one compile batch of ``plan`` (:func:`torq_gen_config.fullrun.batches.batch_members`)."""
    return batch_members(plan, batch_id)


@records_failure
def assignment_job(*, report: str | None, compiler: str | None, assignment: str, log: str | None = None) -> None:
    """Rule ``full_assignment`` (Snakemake form): ``assignment.json`` from the report
    (else the compiler JSON), without extra run options."""
    sel = read_selection(report, compiler)
    if sel is None:
        raise ReportError(f"no report JSON ({report}) or compiler JSON ({compiler}): run discovery first")
    write_bytes_if_changed(assignment, assignment_bytes(make_assignment(sel)))
    append_record(log, f"assignment from {sel['source_file']}")


@records_failure
def plan_job(*, timeout_s: float | None = None, **kwargs) -> dict:
    """Checkpoint ``plan_full_model``: :func:`_plan_job` in a supervised worker (it folds
    the model's constants with onnx's reference evaluator; :func:`~torq_gen_config.core.job_support.in_worker`)."""
    return in_worker(_plan_job, "the full-model partition plan", model_job_limit(timeout_s or DEFAULT_TIMEOUT_S, calls=1),
                     **kwargs)


def _plan_job(*, assignment: str, prepared: str, manifest: str, locations: str, executors: list[dict], plan: str,
             compiler_options: list[str] = (), runtime_options: list[str] = (), full_mlir: str | None = None,
             compile_batch: int = 1, log: str | None = None, parameters: dict | None = None,
             prepare_info: str | None = None, run_mode: str = "auto") -> dict:
    """Checkpoint ``plan_full_model``: partitions, ``plan.json`` and one
    ``partitions/<pid>/model.onnx`` per partition (side files, rewritten only when
    their bytes change, so unchanged partitions are not compiled again). For a torq
    assignment: one whole-model partition whose side file is its executor map
    (``partitions/torq-<hash>/executor_map.json``), compiled from ``full_mlir``.
    ``compile_batch`` > 1: the plan's compile batches (``compile_batches``).
    ``parameters`` (``{"setting", "auto_mb"}``) is resolved with ``prepare_info``
    (:func:`~torq_gen_config.backends.parameters.resolve_from`; the store beside it).
    ``run_mode`` (``auto``/``module``/``partitions``): a partitions plan may become a
    module plan (:func:`~torq_gen_config.fullrun.module.mode.module_or_partitions`); ``mode_reason`` says why."""
    t0 = time.perf_counter()
    doc = read_json(assignment, "full-model assignment")
    man = read_json(manifest, "layer manifest")
    locs = read_json(locations, "MLIR locations") if locations and os.path.isfile(locations) else None
    model = load_model(prepared, weights=False)  # partitions refer to the weight store
    parts_dir = Path(plan).parent / "partitions"

    folded_store = Path(prepared).parent / FOLDED_RUN_FILE  # beside the model's own external data
    resolved = None
    if parameters and prepare_info:
        resolved = resolve_from(parameters, read_json(prepare_info, "preparation info"), executors)
        resolved["archives"] = [os.path.abspath(Path(prepare_info).parent / STORE_FILE), os.path.abspath(folded_store)]
        append_record(log, f"weights: {describe(resolved)}")
    result = make_plan(model, man, locs, doc, executors, parts_dir, compiler_options=compiler_options,
                       runtime_options=runtime_options, full_mlir=full_mlir, compile_batch=compile_batch,
                       parameters=resolved, folded_store=folded_store, prune=False)
    result["prepared_model"] = prepared
    keep = {p["pid"] for p in result["partitions"]}
    if result.get("mode") == PARTITIONS_MODE:
        result = module_or_partitions(result, run_mode=run_mode, model=model, manifest=man, locations=locs,
                                       assignment=doc, executors=executors, full_mlir=full_mlir,
                                       compiler_options=compiler_options, runtime_options=runtime_options,
                                       parts_dir=parts_dir)
        keep |= {result["module"]["pid"]} if result.get("module") else set()
    else:
        result["mode_reason"] = f"every assigned executor is of the {result['mode']} backend (one whole-model compile)"
    prune_plan_dirs(parts_dir, keep, result.get("compile_batches") or [])
    result["manifest"] = manifest  # the layers over the model's nodes (run --reduce reads them)
    write_json(plan, result)
    counts: dict[str, int] = {}
    for p in result["partitions"]:
        counts[p["executor"]] = counts.get(p["executor"], 0) + 1
    if result.get("mode") == MODULE_MODE:
        msg = f"full model: one module ({result['module']['pid']}); {result['mode_reason']}"
    elif result.get("mode") != PARTITIONS_MODE:
        msg = f"full model: {capabilities(result['mode']).whole_model().summary(result)}"
    else:
        msg = (f"full model: {result['num_partitions']} partition(s) "
               f"({', '.join(f'{k}: {v}' for k, v in counts.items())}), "
               f"{len(result['fallbacks'])} layer(s) without a recommendation")
        if result.get("compile_batches"):
            b = result["compile_batches"]
            msg += (f"; {sum(len(x['members']) for x in b)} compiled in {len(b)} batch(es) "
                    f"({', '.join(sorted({x['executor'] for x in b}))})")
    append_record(log, f"{msg}; {time.perf_counter() - t0:.2f} s; warnings: {result['warnings']}")
    print(msg, file=sys.stderr)
    for w in result["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    return result


@records_failure
def compile_partition_batch_job(*, executor: dict, members: list[dict], partitions_dir: str, out_dir: str,
                                timeout_s: float, log: str | None = None, log_file: str | None = None) -> dict:
    """Rule ``compile_partition_batch``: :func:`torq_gen_config.fullrun.batches.compile_partition_batch`
    (``module.vmfb``, ``batch.mlir``, ``batch.json`` in ``out_dir``); a failing member
    is left to its own ``compile_partition`` job, never raised."""
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("")
    t0 = time.perf_counter()
    rec = fullrun_batches.compile_partition_batch(executor=executor, members=members, partitions_dir=partitions_dir,
                                          out_dir=out_dir, timeout_s=timeout_s, log_path=log)
    alone = sum(m["status"] == ALONE for m in rec["members"])
    text = (f"[{executor['name']}] partition batch {Path(out_dir).name}: {rec['compiled']} of {len(members)} "
            f"partitions compiled together ({rec['batch_ms'] / 1000:.1f} s, {len(rec['compiles'])} compiler run(s))"
            + (f", {alone} to compile alone" if alone else "") + f" in {time.perf_counter() - t0:.1f} s\n")
    _emit(text, log_file, f"full-model partition batch {Path(out_dir).name}", log)
    return rec


@records_failure
def compile_partition_job(*, pid: str, model: str, executor: dict, compiled: str, timeout_s: float,
                          log: str | None = None, log_file: str | None = None, verbose: bool = False,
                          batch: dict | None = None) -> dict:
    """Rule ``compile_partition``: import (if needed) and compile one partition; with
    ``batch`` (``{"module", "info"}``: its compile batch's files) the partition's
    function in the batch's module, or, when the batch left it out, compiled alone
    (:func:`torq_gen_config.fullrun.batches.compiled_from_batch`).

    A failure is recorded in ``compiled.json`` (``status: error``), not raised.
    """
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("")
    work_dir = str(Path(compiled).parent)
    if executor.get("backend") == MODULE_MODE:  # the module of a module plan (model: its placement.json)
        res = compile_module_partition(pid=pid, side_file=model, work_dir=work_dir, timeout_s=timeout_s, log_path=log)
    elif batch:
        res = fullrun_batches.compiled_from_batch(pid=pid, model_path=model, executor=executor, work_dir=work_dir,
                                          batch_info=batch["info"], batch_module=batch["module"], timeout_s=timeout_s,
                                          log_path=log)
    else:
        res = fullrun_compile.compile_partition(pid=pid, model_path=model, executor=executor, work_dir=work_dir,
                                        timeout_s=timeout_s, log_path=log)
    write_json(compiled, res)
    cb = res.get("compile_batch") or {}
    if res["status"] == "ok" and cb.get("compile_ms_is"):
        text = (f"compiled partition {pid}: ok, in batch {cb['id']} ({res['compile_ms']:.0f} ms: 1/{cb['members']} "
                f"of {cb['batch_ms']:.0f} ms)\n")
    elif res["status"] == "ok":
        text = f"compiled partition {pid}: ok, {res['compile_ms']:.0f} ms\n"
    else:
        text = f"compiled partition {pid}: ERROR {res['failure']['summary']}\n"
        if verbose:
            text += res["failure"]["message"].rstrip() + "\n"
    _emit(text, log_file, f"full-model partition {pid}", log)
    return res


@records_failure
def full_reference_job(*, prepared: str, reference: str, input_settings: dict, model_inputs: str | None = None,
                       run_data: str | None = None, quantized: bool = False, engine: str = "onnxruntime",
                       optimized_check: bool = True, timeout_s: float | None = None, log: str | None = None) -> None:
    """Rule ``full_reference``: the model's input values (``model_inputs``: the user's
    ``--input-data``, else the generated ones every whole-model step uses; in subgraph
    mode the subgraph's inputs from a whole-model run) and the reference outputs of the
    whole prepared model (:func:`~torq_gen_config.reference.compute_reference`: ``engine``;
    onnx's reference implementation only when ONNX Runtime fails, to stand in for it). With ``--quantize`` the model is the
    quantized one; its int8 inputs (``--full-integer``) do not match the float values
    and are generated over all int8 values."""
    feeds, source = None, None
    if run_data:  # `run --input-data`: must fit the prepared model discovery tested
        model = onnx.load(prepared, load_external_data=False)
        feeds, source = load_input_data(run_data, model), f"run --input-data {run_data}"
    elif model_inputs:
        try:
            feeds, meta = load_model_inputs(model_inputs, onnx.load(prepared, load_external_data=False))
            source = f"model inputs: {meta.get('source')}"
        except Exception:  # e.g. the quantized model's int8 inputs: generated below
            feeds = None
    meta = compute_reference(prepared, reference, input_settings, inputs=feeds, inputs_source=source,
                             input_ranges=quantized_input_ranges(prepared, {}) if quantized else None,
                             engine=engine, timeout_s=timeout_s, second_opinion="on_failure", subject="the model",
                             optimized_check=optimized_check)
    opt = meta.get("optimized") or {}
    append_record(log, f"full-model reference {meta['status']} ({meta.get('run_ms')} ms) {meta.get('message') or ''}; "
                       f"inputs: {meta.get('layer_inputs')}; ONNX Runtime (all optimizations): {opt.get('status')}"
                       + (f", max rel diff {opt['metrics'].get('max_rel_diff')}" if opt.get("metrics") else ""))


@records_failure
def run_full_model_job(*, plan: str, reference: str, result: str, tolerance: dict, timeout_s: float,
                       log: str | None = None, log_file: str | None = None, verbose: bool = False) -> dict:
    """Rule ``run_full_model``: run the partitions in order (a torq plan: the whole-model
    module once), compare, ``result.json``."""
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("")
    p = read_json(plan, "full-model plan")
    parts_dir = Path(plan).parent / "partitions"
    outputs = Path(result).parent / RUN_OUTPUTS_FILE
    outputs.unlink(missing_ok=True)  # an earlier run's outputs are not this run's
    compiled = {}
    # module mode: the module only (the chain is compiled when the module fails or differs)
    for part in [p["module"]] if p.get("mode") == MODULE_MODE else p["partitions"]:
        f = PartitionFolder(parts_dir / part["pid"]).compiled
        if f.is_file():
            compiled[part["pid"]] = read_json(f, "compile result")
            # --keep-work minimal removed the module, or its --debug-ir folder is gone: compiled again
            if _module_gone(compiled[part["pid"]], f.parent) or _debug_ir_gone(compiled[part["pid"]]):
                compiled[part["pid"]] = compile_partition_job(
                    pid=part["pid"], model=str(f.parent / os.path.basename(part["model"])),
                    executor=part["compile_def"], compiled=str(f), timeout_s=timeout_s,
                    log=str(Path(log).parent / "compile_partition" / f"{part['pid']}.log") if log else None,
                    log_file=log_file, verbose=verbose)
    if p.get("mode") == MODULE_MODE:
        res = _run_module_plan(p, reference=reference, compiled=compiled, tolerance=tolerance, timeout_s=timeout_s,
                               parts_dir=parts_dir, outputs=str(outputs), log=log, log_file=log_file, verbose=verbose)
    else:
        res = run_partitions(p, reference_npz=reference, compiled=compiled, tolerance=tolerance, timeout_s=timeout_s,
                             partitions_dir=parts_dir, log_path=log, outputs_npz=str(outputs))
        res.setdefault("mode_reason", p.get("mode_reason"))
    write_json(result, res)
    t = res["timing"]
    append_record(log, f"full model {res['status']}: {res['summary']}; run {t['run_ms_total']} ms")
    run_ms = "n/a" if t["run_ms_total"] is None else f"{t['run_ms_total']:.0f} ms"
    mode = res.get("mode") or PARTITIONS_MODE
    what = f"whole model on {mode}" if mode != PARTITIONS_MODE else f"{res['num_partitions']} partitions"
    if mode == MODULE_MODE:
        what = "one module"
    elif res.get("module"):
        what += f"; one module: {res['module'].get('status')}"
    text = f"full model: {res['status']} ({what}, run {run_ms}): {res['summary']}\n"
    if verbose and res.get("failure"):
        text += res["failure"]["message"].rstrip() + "\n"
    _emit(text, log_file, "full-model run", log)
    return res


def _run_module_plan(p: dict, *, reference: str, compiled: dict, tolerance: dict, timeout_s: float, parts_dir: Path,
                     outputs: str, log: str | None, log_file: str | None, verbose: bool) -> dict:
    """A module plan run (:func:`torq_gen_config.fullrun.module.run.run_module_plan`); the
    fallback partitions are compiled here, one at a time, when the module fails or
    differs (a partition compiled by an earlier run is reused)."""
    def compile_one(part: dict) -> dict:
        f = PartitionFolder(parts_dir / part["pid"]).compiled
        if f.is_file():
            c = read_json(f, "compile result")
            if c.get("status") == "ok" and not c.get("compile_batch") and not _module_gone(c, f.parent):
                return c
        return compile_partition_job(pid=part["pid"], model=str(f.parent / os.path.basename(part["model"])),
                                     executor=part["compile_def"], compiled=str(f), timeout_s=timeout_s,
                                     log=str(Path(log).parent / "compile_partition" / f"{part['pid']}.log") if log
                                     else None, log_file=log_file, verbose=verbose)

    module = p["module"]
    return run_module_plan(p, reference_npz=reference, compiled=compiled.get(module["pid"]) or {},
                           tolerance=tolerance, timeout_s=timeout_s, partitions_dir=str(parts_dir),
                           compile_partition=compile_one, log_path=log, outputs_npz=outputs)


def _debug_ir_gone(compiled: dict) -> bool:
    """Whether the debug-IR folder a compile wrote (``compiled.json``'s ``debug_ir``) is gone."""
    d = compiled.get("debug_ir")
    return bool(d) and not os.path.isfile(os.path.join(d, "README.txt"))


def _module_gone(compiled: dict, pdir: Path) -> bool:
    """Whether a partition compiled alone (its ``compiled.json`` names its own module in
    ``pdir``) no longer has that module (``--keep-work minimal`` removes it after a run)."""
    path = (compiled.get("artifact") or {}).get("path") if compiled.get("status") == "ok" else None
    return bool(path) and Path(path).parent.name == pdir.name and not (pdir / Path(path).name).is_file()


def _emit(text: str, log_file: str | None, title: str, log: str | None) -> None:
    """One console write per job (jobs are threads), and the job's log appended to
    the shared ``--log-file`` when one is set."""
    sys.stdout.write(text)
    sys.stdout.flush()
    if log_file and log and os.path.isfile(log):
        append_to_shared_log(log_file, title, Path(log).read_text())
