"""Job of rules/layer_tests.smk: compile, run and compare one layer on one executor."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..errors import DamagedWorkFile
from ..fileio import read_json
from ..job_support import _log, append_to_shared_log, records_failure
from ..layout import mark_outdated
from .markers import SKIPPED_MARKER, TIMED_OUT_SUFFIX, consume_rerun_marker, record_timeout
from .quantize import quantize_failure

@records_failure
def test_layer_job(*, layer: dict, executor: dict, layer_onnx: str, reference: str, mlir: str | None,
                   import_status: str | None, result: str, tolerance: dict, timeout_s: float,
                   log: str | None = None, log_file: str | None = None, verbose: bool = False,
                   earlier_results: list[str] = (), timing: dict | None = None, batch: dict | None = None) -> None:
    """Rule ``test_layer``: compile, run and compare one layer on one executor.

    The console gets one line per job; ``log_file`` (optional) receives the job's
    full log (tool command lines and output), appended under a file lock;
    ``verbose`` also prints the full failure message. ``earlier_results`` (skip
    mode) are the result files of the higher-priority executors of the same layer:
    if one of them is a success, this executor is recorded as ``skipped`` without
    compiling anything. ``timing`` (``{"runs", "warmup"}`` or None; the workflow's
    ``collect_timing``) also measures the runtime after a run that produced outputs
    (see :func:`~torq_gen_config.layer_test.run_layer_test`). ``batch``
    (``{"module", "info"}`` or None): the layer's compile batch (``compile_batch``).
    """
    try:
        _test_layer_job(layer=layer, executor=executor, layer_onnx=layer_onnx, reference=reference, mlir=mlir,
                        import_status=import_status, result=result, tolerance=tolerance, timeout_s=timeout_s,
                        log=log, log_file=log_file, verbose=verbose, earlier_results=earlier_results, timing=timing,
                        batch=batch)
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
    import traceback

    from ..layer_test import error_result, one_line_summary

    message = f"torq-gen-config failed on this layer: {type(e).__name__}: {e}\n{traceback.format_exc()}"
    res = error_result(layer=layer, executor=executor, stage="internal", message=message, result_path=result,
                       tolerance=tolerance)
    _log(log, message)
    sys.stdout.write(one_line_summary(res) + "\n")


def _test_layer_job(*, layer: dict, executor: dict, layer_onnx: str, reference: str, mlir: str | None,
                    import_status: str | None, result: str, tolerance: dict, timeout_s: float, log: str | None,
                    log_file: str | None, verbose: bool, earlier_results: list[str], timing: dict | None,
                    batch: dict | None = None) -> None:
    from ..layer_test import one_line_summary, run_layer_test, skipped_result

    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("")
    marker = Path(result).parent / SKIPPED_MARKER
    for path in earlier_results:
        earlier = read_json(path, "layer result")
        if earlier.get("status") == "success":
            res = skipped_result(layer=layer, executor=executor, by=earlier["executor"], result_path=result)
            marker.touch()
            sys.stdout.write(one_line_summary(res) + "\n")
            return
    marker.unlink(missing_ok=True)
    if batch:
        _log_batch_compile(log, batch["info"])
    failed = quantize_failure(layer_onnx)
    if failed:
        from ..layer_test import error_result

        res = error_result(layer=layer, executor=executor, stage="quantize", message=failed, result_path=result,
                           tolerance=tolerance)
        sys.stdout.write(one_line_summary(res) + "\n")
        return
    res = run_layer_test(layer=layer, executor=executor, layer_onnx=layer_onnx, reference_npz=reference,
                         layer_mlir=mlir, import_status=import_status, work_dir=str(Path(result).parent),
                         result_path=result, log_path=log, tolerance=tolerance, timeout_s=timeout_s,
                         timing=timing, batch=batch)
    record_timeout(result, (res.get("failure_report") or {}).get("stage") == "timeout", timeout_s)
    # one write per line: jobs are threads, and print() writes text and newline separately
    text = one_line_summary(res) + "\n"
    if verbose and res.get("failure_report"):
        text += res["failure_report"]["message"].rstrip() + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    if log_file and log:
        append_to_shared_log(log_file, f"{res['layer_id']} on {res['executor']}", Path(log).read_text())


def _log_batch_compile(log: str | None, batch_file: str) -> None:
    """Note in the test's log how its batch's module was compiled (the command line is
    in the batch job's log; a layer's log should say how its module was made)."""
    import shlex

    from ..logs import append_record

    rec = read_json(batch_file, "compile batch")
    argv = (rec.get("artifact_info") or {}).get("argv")
    append_record(log, f"compile batch {Path(batch_file).parent.name} ({rec['compiled']} of {len(rec['members'])} "
                       f"layers compiled together" + (f"): $ {shlex.join(argv)}" if argv else ")"))


def test_layer(input, output, params, log) -> None:
    """Rule ``test_layer``: one (layer, executor) result.json (:func:`test_layer_job`).
    Params: ``layer``, ``executor``, ``timing``, ``batch`` (bool: runs from its compile
    batch), ``outdated``, ``rerun`` (``{"skipped",
    "timed_out"}``: the rerun params of steps.markers); untracked ``tolerance``,
    ``timeout_s``, ``log_file`` (None: no shared log) and ``verbose``."""
    mark_outdated(params.outdated)
    consume_rerun_marker(os.path.join(os.path.dirname(output.result), SKIPPED_MARKER), params.rerun["skipped"])
    consume_rerun_marker(output.result + TIMED_OUT_SUFFIX, params.rerun["timed_out"])
    test_layer_job(layer=params.layer, executor=params.executor, layer_onnx=input.model, reference=input.reference,
                   mlir=input.get("mlir"), import_status=input.get("import_status"), result=output.result,
                   tolerance=params.tolerance.value, timeout_s=params.timeout_s.value, log=log[0],
                   log_file=params.log_file.value, verbose=params.verbose.value,
                   earlier_results=input.get("earlier") or [], timing=params.timing,
                   batch={"module": input.batch_module, "info": input.batch_info} if params.batch else None)


@records_failure
def compile_batch_job(*, executor: dict, members: list[dict], out_dir: str, timeout_s: float,
                      log: str | None = None) -> None:
    """Rule ``compile_batch``: one module for a batch of layers on one executor
    (:func:`torq_gen_config.batch_compile.compile_batch`). A batch that cannot be
    compiled at all (the backend is unavailable, a bug) still writes its files with
    every layer marked to compile alone, so each layer's own test reports it."""
    import traceback

    from ..batch_compile import ALONE, BATCH_FILE, BATCH_SCHEMA, MODULE_FILE, compile_batch
    from ..fileio import atomic_write_text, write_json
    from ..isolation import RunStopped

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
        _log(log, reason + "\n" + traceback.format_exc())
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


def compile_batch(input, output, params, log) -> None:
    """Rule ``compile_batch``: ``module.vmfb`` and ``batch.json`` of one (batch,
    executor) (:func:`compile_batch_job`). Params: ``executor`` (effective),
    ``members`` (``[{"slug", "layer_id"}]`` in batch order), ``outdated``, ``rerun``
    (:func:`~torq_gen_config.steps.markers.timeout_rerun_token` of ``batch.json``);
    untracked ``timeout_s``. Inputs ``mlir`` and ``import_status``: the members' files, in order."""
    mark_outdated(params.outdated)
    consume_rerun_marker(output.info + TIMED_OUT_SUFFIX, params.rerun)
    members = [{**m, "mlir": mlir, "import_status": status}
               for m, mlir, status in zip(params.members, input.mlir, input.import_status)]
    compile_batch_job(executor=params.executor, members=members, out_dir=os.path.dirname(output.module),
                      timeout_s=params.timeout_s.value, log=log[0])
