"""Jobs of rules/layer_tests.smk: per unit of layers (:mod:`.units`) and executor, the
unit's compile batches, then compile, run and compare each layer; the same for one
layer when its result file is asked for."""

from __future__ import annotations

import os
import shlex
import sys
import time
import traceback
from pathlib import Path

from ...core.errors import DamagedWorkFile
from ...core.fileio import atomic_write_text, read_json, write_json
from ...core.isolation import RunStopped
from ...core.job_support import records_failure
from ...core.keep_work import restore
from ...core.layout import BATCH_FILE, LAYER_REFERENCE_FILE, MODEL_FILE, MODULE_FILE, QUANTIZED_MODEL_FILE, LayerFolder
from ...compare import shown_status
from ...core.logs import append_record, append_to_shared_log, fold_log
from ...core.progress import job_verdict
from ...discovery.batch_compile import ALONE, BATCH_SCHEMA, compile_batch
from ...discovery.layer_test import error_result, one_line_summary, run_layer_test, skipped_result
from ..markers import (
    SKIPPED_MARKER,
    TIMED_OUT_SUFFIX,
    consume_marker,
    record_timeout,
    timed_out_under_smaller,
    was_skipped,
)
from .split import import_layer_job
from ..units import (changed_outside, drop_key, file_identity, is_current, make_key, newer_than, record_key,
                    unit_key_file)
from .quantize import quantize_failure
from . import step

@records_failure
def test_layer_job(*, layer: dict, executor: dict, layer_onnx: str, reference: str, mlir: str | None,
                   import_status: str | None, result: str, tolerance: dict, timeout_s: float,
                   log: str | None = None, log_file: str | None = None, verbose: bool = False,
                   earlier_results: list[str] = (), timing: dict | None = None, batch: dict | None = None,
                   keep_outputs: bool = False) -> None:
    """Rule ``test_layer``: compile, run and compare one layer on one executor.

    The console gets one line per job; ``log_file`` (optional) receives the job's
    full log (tool command lines and output), appended under a file lock;
    ``verbose`` also prints the full failure message. ``earlier_results`` (skip
    mode) are the result files of the higher-priority executors of the same layer:
    if one of them is a success, this executor is recorded as ``skipped`` without
    compiling anything. ``timing`` (``{"runs", "warmup"}`` or None; the workflow's
    ``collect_timing``) also measures the runtime after a run that produced outputs
    (see :func:`~torq_gen_config.discovery.layer_test.run_layer_test`). ``batch``
    (``{"module", "info"}`` or None): the layer's compile batch (``compile_batch``).
    ``keep_outputs``: keep the executor's outputs of a success too (``outputs.npz``).
    """
    try:
        _test_layer_job(layer=layer, executor=executor, layer_onnx=layer_onnx, reference=reference, mlir=mlir,
                        import_status=import_status, result=result, tolerance=tolerance, timeout_s=timeout_s,
                        log=log, log_file=log_file, verbose=verbose, earlier_results=earlier_results, timing=timing,
                        batch=batch, keep_outputs=keep_outputs)
    except DamagedWorkFile:
        raise  # a damaged input (removed, made again by the next run) says nothing about the executor
    except FileNotFoundError as e:
        if e.filename in (reference, layer_onnx, mlir, import_status):  # a sibling test removed it as damaged
            raise DamagedWorkFile(f"work file {e.filename} is gone (another job found it damaged and removed it); "
                                  "run the same command again to make it anew") from None
        _internal_error(e, layer=layer, executor=executor, result=result, tolerance=tolerance, log=log)
    except Exception as e:  # a bug on one layer must not stop the others (nor the report)
        _internal_error(e, layer=layer, executor=executor, result=result, tolerance=tolerance, log=log)


def _internal_error(e: Exception, *, layer: dict, executor: dict, result: str, tolerance: dict, log: str | None) -> None:
    """Record a bug of torq-gen-config on this (layer, executor) as an ``internal`` error
    verdict with the traceback (the other layers go on)."""
    message = f"torq-gen-config failed on this layer: {type(e).__name__}: {e}\n{traceback.format_exc()}"
    res = error_result(layer=layer, executor=executor, stage="internal", message=message, result_path=result,
                       tolerance=tolerance)
    append_record(log, message)
    job_verdict(shown_status(res), one_line_summary(res))


def _test_layer_job(*, layer: dict, executor: dict, layer_onnx: str, reference: str, mlir: str | None,
                    import_status: str | None, result: str, tolerance: dict, timeout_s: float, log: str | None,
                    log_file: str | None, verbose: bool, earlier_results: list[str], timing: dict | None,
                    batch: dict | None = None, keep_outputs: bool = False) -> None:
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("")
    marker = Path(result).parent / SKIPPED_MARKER
    for path in earlier_results:
        earlier = read_json(path, "layer result")
        if earlier.get("status") == "success":
            res = skipped_result(layer=layer, executor=executor, by=earlier["executor"], result_path=result)
            marker.touch()
            job_verdict(shown_status(res), one_line_summary(res))
            return
    marker.unlink(missing_ok=True)
    if batch:
        _log_batch_compile(log, batch["info"])
    failed = quantize_failure(layer_onnx)
    if failed:
        res = error_result(layer=layer, executor=executor, stage="quantize", message=failed, result_path=result,
                           tolerance=tolerance)
        job_verdict(shown_status(res), one_line_summary(res))
        return
    res = run_layer_test(layer=layer, executor=executor, layer_onnx=layer_onnx, reference_npz=reference,
                         layer_mlir=mlir, import_status=import_status, work_dir=str(Path(result).parent),
                         result_path=result, log_path=log, tolerance=tolerance, timeout_s=timeout_s,
                         timing=timing, batch=batch, keep_outputs=keep_outputs)
    record_timeout(result, (res.get("failure_report") or {}).get("stage") == "timeout", timeout_s)
    text = one_line_summary(res)
    if verbose and res.get("failure_report"):
        text += "\n" + res["failure_report"]["message"].rstrip()
    job_verdict(shown_status(res), text)
    if log_file and log:
        append_to_shared_log(log_file, f"{res['layer_id']} on {res['executor']}", Path(log).read_text())


def _log_batch_compile(log: str | None, batch_file: str) -> None:
    """Note in the test's log how its batch's module was compiled (the command line is
    in the batch job's log; a layer's log should say how its module was made)."""
    rec = read_json(batch_file, "compile batch")
    argv = (rec.get("artifact_info") or {}).get("argv")
    append_record(log, f"compile batch {Path(batch_file).parent.name} ({rec['compiled']} of {len(rec['members'])} "
                       f"layers compiled together" + (f"): $ {shlex.join(argv)}" if argv else ")"))


@records_failure
def compile_batch_job(*, executor: dict, members: list[dict], out_dir: str, timeout_s: float,
                      log: str | None = None) -> None:
    """Step of rule ``test_unit``: one module for a batch of layers on one executor
    (:func:`torq_gen_config.discovery.batch_compile.compile_batch`). A batch that cannot be
    compiled at all (the backend is unavailable, a bug) still writes its files with
    every layer marked to compile alone, so each layer's own test reports it."""
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("")
    t0 = time.perf_counter()
    try:
        rec = compile_batch(executor=executor, members=members, out_dir=out_dir, timeout_s=timeout_s, log_path=log)
    except RunStopped:  # not a batch failure: no batch.json saying every layer compiles alone
        raise
    except Exception as e:  # the layers' own compiles report what is wrong, one verdict each
        reason = f"the batch was not compiled: {type(e).__name__}: {e}"
        append_record(log, reason + "\n" + traceback.format_exc())
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_text(os.path.join(out_dir, MODULE_FILE), "")
        rec = {"schema": BATCH_SCHEMA, "executor": executor["name"], "backend": executor["backend"],
               "members": [{"slug": m["slug"], "layer_id": m["layer_id"], "function": None, "status": ALONE,
                            "reason": reason[:500]} for m in members],
               "compiled": 0, "batch_ms": 0.0, "compiles": [], "module_bytes": 0, "artifact_info": {}}
        write_json(os.path.join(out_dir, BATCH_FILE), rec)
    # a larger --timeout compiles a batch that timed out again (rule param rerun)
    record_timeout(os.path.join(out_dir, BATCH_FILE), any(c["status"] == "timeout" for c in rec["compiles"]),
                   timeout_s)
    alone = sum(m["status"] == ALONE for m in rec["members"])
    # not "[executor] ...": that form is one (layer, executor) verdict's line
    sys.stdout.write(f"batch {Path(out_dir).name} on {executor['name']}: {rec['compiled']} of {len(members)} layers "
                     f"compiled together ({rec['batch_ms'] / 1000:.1f} s, {len(rec['compiles'])} compiler run(s))"
                     + (f", {alone} to compile alone" if alone else "") + f" in {time.perf_counter() - t0:.1f} s\n")


def test_unit_job(*, unit: str, members: list[dict], executor: dict, layers_dir: str, logs_dir: str,
                  batches_dir: str, batches: list[dict] | None, needs_mlir: bool, quantized: bool,
                  timing: dict | None, precision: dict, tolerance: dict, timeout_s: float, skip_mode: bool = False,
                  earlier: list[str] = (), log_file: str | None = None, verbose: bool = False,
                  only: list[str] | None = None, out: str | None = None, prepared: str | None = None,
                  force: bool = False, drift: dict | None = None, keep_outputs: bool = False) -> dict:
    """Rule ``test_unit``: the unit's layers on one executor.

    First each compile batch of the unit (``batches``: ``[{"id", "members": [slug]}]``,
    None when the executor compiles each layer in its own test) is compiled
    (:func:`compile_batch_job`) unless its key (the executor and the members' MLIR
    and import status, :mod:`.units`) still matches and it did not time out under a
    smaller limit. Then each member (``members``: ``[{"layer_id", "slug", "op_type",
    "node_index"}]``) is tested (:func:`test_layer_job`) unless its ``result.json``
    key (executor, ``timing``, ``precision``, batch or alone, and its model,
    reference, MLIR and import status) still matches and no rerun is due: a
    ``skipped`` verdict outside skip mode, a timeout under a smaller limit than
    ``timeout_s`` (s), in skip mode a result of an ``earlier`` executor (priority
    order) newer than its own. ``only``: test only these slugs (a layer's result
    file asked for on its own); ``out``: the unit's record, written last.
    ``prepared``: the unit's prepare record, removed when a member's prepared file
    turns out damaged or gone, so that the next run prepares the unit again.
    ``force`` (``--recompute-cache``): every batch compiled and every member tested.
    ``drift``: the job's drift param (rules/common.smk ``get_unit_drift``), kept in the
    record so that the next run, with nothing changed, gives the same value.
    A verdict file edited, damaged or deleted outside the workflow no longer matches
    its key (:func:`.units.is_current`) and is tested again.

    Files: ``layers_dir/<slug>/<executor>/result.json`` (its key in the unit's
    ``units/<unit>/<executor>.keys.json``, beside ``prepared``), logs
    ``logs_dir/test_layer/<slug>.<executor>.log`` (of a ``success`` folded into the unit's
    log ``logs_dir/test_unit/<unit>.<executor>.log`` once it is written, unless ``only``) and
    ``logs_dir/compile_batch/<executor>.<batch id>.log``, batches
    ``batches_dir/<executor>/<batch id>/``. Every member gets its verdict; a bug on
    one layer is its ``internal`` error verdict (:func:`test_layer_job`).

    Returns:
        ``{"unit", "executor", "members": [{"slug", "status", "tested" (bool),
        "result": [size, mtime_ns]}]}`` (the identities: a retested member changes the
        record's content, which is what reruns the report; Snakemake compares the
        checksums of small inputs, not only their mtimes), and ``drift`` when given.

    Raises:
        DamagedWorkFile: a member's prepared file was damaged or gone (after the others
            are tested; the first such message).
    """
    name = executor["name"]
    wanted = set(only) if only is not None else None
    batch_of: dict[str, dict] = {}
    by_slug = {m["slug"]: m for m in members}
    for b in batches or []:
        bdir = os.path.join(batches_dir, name, b["id"])
        paths = {"module": os.path.join(bdir, MODULE_FILE), "info": os.path.join(bdir, BATCH_FILE)}
        for slug in b["members"]:
            batch_of[slug] = paths
        if wanted is not None and not wanted.intersection(b["members"]):
            continue
        full = [{"slug": s, "layer_id": by_slug[s]["layer_id"], "mlir": str(LayerFolder(Path(layers_dir, s)).mlir),
                 "import_status": str(LayerFolder(Path(layers_dir, s)).imported)} for s in b["members"]]
        def batch_key(full=full) -> str:
            return make_key({"executor": executor, "members": [[m["slug"], m["layer_id"]] for m in full]},
                            [p for m in full for p in (m["mlir"], m["import_status"])])

        key = batch_key()
        if (force or timed_out_under_smaller(paths["info"], timeout_s)
                or not is_current(paths["info"], key, paths["module"])):
            drop_key(paths["info"])
            consume_marker(paths["info"] + TIMED_OUT_SUFFIX)
            try:
                if any([restore_mlir(fm["mlir"], os.path.join(layers_dir, fm["slug"], _model_name(quantized)),
                                     timeout_s) for fm in full]):  # what --keep-work minimal removed, imported again
                    key = batch_key()  # the same unless an import gave other bytes
            except DamagedWorkFile:  # the unit's preparation must run again
                if prepared:
                    Path(prepared).unlink(missing_ok=True)
                raise
            compile_batch_job(executor=executor, members=full, out_dir=bdir, timeout_s=timeout_s,
                              log=os.path.join(logs_dir, "compile_batch", f"{name}.{b['id']}.log"))
            record_key(paths["info"], key)
    record, damaged = [], []
    unit_log = os.path.join(logs_dir, "test_unit", f"{unit}.{name}.log")
    keys = unit_key_file(prepared, name)  # the members' verdict keys, one file for the unit and executor
    for m in members:
        slug = m["slug"]
        d = os.path.join(layers_dir, slug)
        folder = LayerFolder(Path(d))
        result = str(folder.executor(name).result)
        layer_log = os.path.join(logs_dir, "test_layer", f"{slug}.{name}.log")
        if wanted is not None and slug not in wanted:
            continue
        model = os.path.join(d, _model_name(quantized))
        mlir = str(folder.mlir) if needs_mlir else None
        status = str(folder.imported) if needs_mlir else None
        earlier_results = [str(folder.executor(e).result) for e in earlier] if skip_mode else []
        batch = batch_of.get(slug)
        key = make_key({"executor": executor, "timing": timing, "precision": precision, "batch": bool(batch)},
                       [model, str(folder.reference), mlir, status])
        due = ((not skip_mode and was_skipped(os.path.dirname(result)))
               or timed_out_under_smaller(result, timeout_s)
               or (skip_mode and newer_than(earlier_results, result)))
        if not (due or force) and is_current(result, key, keys=keys):
            record.append({"slug": slug, "status": _status_of(result), "tested": False, "result": file_identity(result)})
            continue
        changed = None if force else changed_outside(result, keys)
        if changed:  # said once, here (not in the "[executor] layer: verdict" form): the verdict line follows
            sys.stdout.write(f"{slug} on {name}: result.json {changed} outside the workflow since it was written: "
                             f"testing it again\n")
        drop_key(result, keys)
        os.makedirs(os.path.dirname(result), exist_ok=True)
        if not skip_mode:
            consume_marker(os.path.join(os.path.dirname(result), SKIPPED_MARKER))
        consume_marker(result + TIMED_OUT_SUFFIX)
        try:
            restore_mlir(mlir, model, timeout_s)
            test_layer_job(layer=m, executor=executor, layer_onnx=model, reference=os.path.join(d, LAYER_REFERENCE_FILE),
                           mlir=mlir, import_status=status, result=result, tolerance=tolerance, timeout_s=timeout_s,
                           log=layer_log, log_file=log_file,
                           verbose=verbose, earlier_results=earlier_results, timing=timing, batch=batch,
                           keep_outputs=keep_outputs)
        except DamagedWorkFile as e:  # removed: the unit's preparation must run again
            damaged.append(e)
            continue
        record_key(result, key, keys)
        record.append({"slug": slug, "status": _status_of(result), "tested": True, "result": file_identity(result)})
        if record[-1]["status"] == "success" and wanted is None:  # a re-target's log is its rule's log: kept
            fold_log(layer_log, unit_log, f"{slug} on {name}")
    if damaged:
        if prepared:
            Path(prepared).unlink(missing_ok=True)
        raise damaged[0]
    res = {"unit": unit, "executor": name, "members": record}
    if drift is not None:
        res["drift"] = drift
    # the unit's log says what it did; the tool output of a success is folded into it above,
    # any other verdict's stays in the layer's own log
    append_record(unit_log,
                  "\n".join(f"{r['slug']}: {r['status']} ({'tested' if r['tested'] else 'up to date, kept'})"
                            for r in record) + f"\n(tool output of the successes: above; of the other verdicts: "
                                              f"{os.path.join(logs_dir, 'test_layer')}/<slug>.{name}.log)")
    if out:
        write_json(out, res)
    return res


def _model_name(quantized: bool) -> str:
    """The file of a layer's tests (and of its MLIR import): its quantized model or its own."""
    return QUANTIZED_MODEL_FILE if quantized else MODEL_FILE


def restore_mlir(mlir: str | None, model: str, timeout_s: float) -> bool:
    """A layer's ``model.mlir`` that ``--keep-work minimal`` removed, imported again from
    ``model`` before it is read (:func:`torq_gen_config.core.keep_work.restore`: with the same
    bytes it gets its old identity back, so no key that names it changes). Returns
    whether it was made again."""
    if not mlir:
        return False

    def make(tmp: str) -> None:
        status = os.path.join(os.path.dirname(tmp), f".{os.path.basename(tmp)}.import.tmp")
        try:
            import_layer_job(layer_onnx=model, mlir=tmp, status=status, timeout_s=timeout_s)
            res = read_json(status, "import status")
        finally:
            Path(status).unlink(missing_ok=True)
        if res.get("status") != "ok":  # it was imported before: the preparation is redone, and says why
            raise DamagedWorkFile(f"{mlir} (removed by --keep-work minimal) could not be imported again: "
                                  f"{res.get('message')}; run the same command again to prepare the layer anew")

    return restore(mlir, make)


def _status_of(result: str) -> str | None:
    """The status in a layer's result.json (None when it cannot be read)."""
    try:
        return read_json(result, "layer result").get("status")
    except Exception:  # noqa: BLE001 - a record, not a verdict: the report reads the file again
        return None


def _unit_params(input, params) -> dict:
    """The keyword arguments of :func:`test_unit_job` from a unit rule's params."""
    return dict(unit=params.unit, members=params.members, executor=params.executor,
                layers_dir=params.layers_dir, logs_dir=params.logs_dir,
                batches_dir=params.batches_dir, batches=params.batches, needs_mlir=params.needs_mlir,
                quantized=params.precision.get("quantize") is not None, timing=params.timing,
                precision=params.precision, tolerance=params.tolerance, timeout_s=params.timeout_s,
                skip_mode=params.skip_mode, earlier=params.earlier, log_file=params.log_file,
                verbose=params.verbose, force=params.force, keep_outputs=params.keep_outputs)


@step(feeds_report=True)
def test_unit(input, output, params, log) -> None:
    """Rule ``test_unit``: the unit's ``<executor>.json`` (:func:`test_unit_job`).
    Params: ``unit``, ``members``, ``executor`` (effective), ``batches``, ``needs_mlir``,
    ``timing``, ``precision``, ``drift`` (members whose files changed outside the
    workflow, rules/common.smk get_unit_drift), ``rerun`` (the members' skip and timeout records and the
    batches' timeout records: their rerun tokens, markers), ``outdated``;
    untracked ``tolerance``, ``timeout_s``, ``keep_outputs``, ``skip_mode``, ``earlier``, ``log_file``,
    ``verbose``, ``force`` and the directories."""
    test_unit_job(**_unit_params(input, params), out=output.result, prepared=input.prepared, drift=params.drift)


@step(feeds_report=True)
def test_layer(input, output, params, log) -> None:
    """Rule ``test_layer``: one layer's ``result.json`` asked for on its own (a
    re-target): its unit's compile batch compiled again if it is out of date, then
    this layer tested (:func:`test_unit_job` with ``only``). The unit's record gets
    the new entry (:func:`update_unit_record`), so the next run makes the report again."""
    slug = os.path.basename(os.path.dirname(os.path.dirname(output.result)))
    res = test_unit_job(**_unit_params(input, params), only=[slug], prepared=input.prepared)
    update_unit_record(params.unit_record, res["members"])


def update_unit_record(path: str, entries: list[dict]) -> None:
    """Put ``entries`` (members of :func:`test_unit_job`'s record) into the unit's
    record at ``path``, if it exists: its content changes, so the next run makes the
    report again with the re-targeted verdict."""
    try:
        rec = read_json(path, "unit record")
    except Exception:  # noqa: BLE001 - none yet, or damaged: the unit job makes it (again)
        return
    new = {e["slug"]: e for e in entries}
    rec["members"] = [new.get(m.get("slug"), m) for m in rec.get("members", [])]
    write_json(path, rec)
