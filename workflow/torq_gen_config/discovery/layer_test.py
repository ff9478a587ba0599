"""One (layer, executor) test: compile, run, compare, write ``result.json``.

The verdict is one of ``success`` / ``difference`` / ``error`` (docs/original_tool.md,
'Statuses and tolerances') plus ``unverified`` when the executor ran but no reference could compute
the layer (never a success; where ONNX Runtime fails and onnx's reference implementation
runs, the verdict is computed against the latter, and the result says so). Errors carry
the stage (``import``, ``compile``, ``run``, ``compare``, ``timeout``, ``crash``) and the
tool's message, bounded in length. The
metrics are stored raw, so :func:`torq_gen_config.compare.derive_status` can
re-derive the verdict for another tolerance without recompiling.
"""

from __future__ import annotations

import json
import re
import threading
import traceback
from pathlib import Path

from .. import backends
from ..backends.base import StageError
from ..compare import compare_on_model, judge, shown_status
from ..core.fileio import save_npz, write_json
from ..core.keep_work import remove_run_files
from ..core.layout import EXECUTOR_OUTPUTS_FILE
from ..core.lazy import onnx
from ..core.logs import append_record
from ..core.limits import MESSAGE_CHARS as MESSAGE_LIMIT, SUMMARY_CHARS as SUMMARY_LIMIT
from ..core.statuses import INCONCLUSIVE
from ..core.tools import bounded_message, first_error_line
from ..reference import SPEC_FLOAT64, judged_reference, load_reference
from .batch_compile import member_artifact

RESULT_SCHEMA = "torq-gen-config/layer-result/1"
#: Runtime measurements of the jobs of one process (jobs are threads) run one at a
#: time, so two benchmarks never share the cores; compiles of other jobs may still
#: run meanwhile (``-j 1`` gives the quietest machine).
_BENCHMARK_LOCK = threading.Lock()


#: the directories of a diagnostic's file location (``/long/path/model.mlir:3:10:``)
_DIAGNOSTIC_PATH = re.compile(r"/\S*/([^/\s]+:\d+:\d+:)")

def run_layer_test(*, layer: dict, executor: dict, layer_onnx: str, reference_npz: str, layer_mlir: str | None,
                   import_status: str | None, work_dir: str, result_path: str, log_path: str | None,
                   tolerance: dict, timeout_s: float, timing: dict | None = None,
                   batch: dict | None = None, keep_outputs: bool = False) -> dict:
    """Test one layer on one executor and write the result file atomically.

    Args:
        layer: the layer's manifest entry (``layer_id``, ``slug``, ``op_type``, ...).
        executor: ``{"name", "backend", "options"}`` from the config.
        layer_onnx: the layer's ONNX model.
        reference_npz: inputs and reference outputs (see :mod:`torq_gen_config.reference`).
        layer_mlir: the layer's MLIR (backends with ``needs_mlir``), else None.
        import_status: path of the layer's ``import.json`` (status of the MLIR import).
        work_dir: directory for this job's compiled module, inputs and outputs.
        result_path: where ``result.json`` goes.
        log_path: the job's log file (tool command lines and full stderr).
        tolerance: ``fp_avg_tol``, ``fp_max_tol`` (and optional ``int_atol``).
        timeout_s: wall-clock limit (s) for each tool call.
        timing: ``{"runs": N, "warmup": W}`` to measure the runtime (workflow
            option ``collect_timing``), or None. After a run that produced
            outputs (verdict ``success``, ``difference`` or ``unverified``) the
            backend's :meth:`~torq_gen_config.backends.base.Backend.benchmark`
            runs W untimed and N timed runs; its dict is stored as
            ``result["timing"]["runtime"]``. A failing measurement never changes
            the verdict: its message goes to ``result["timing"]["runtime_error"]``.
        batch: ``{"module", "info"}``: the paths of the compile batch holding this
            layer (``compile_batch`` > 1, :mod:`torq_gen_config.discovery.batch_compile`), or
            None. A member compiled in the batch runs its own function from the
            batch's module, and ``compile_ms`` is its share of the batch's compile
            time (``timing.compile_batch`` says so); a member the batch left out is
            compiled alone, as without a batch.
        keep_outputs: keep the executor's outputs of a ``success`` too.

    The executor's outputs are compared as they come, and the runtime's run files in
    ``work_dir`` are removed (:func:`~torq_gen_config.core.keep_work.remove_run_files`); the
    outputs are written to ``<work_dir>/outputs.npz`` (``result["outputs_file"]``
    names it, relative to the result) where the verdict is ``difference`` or
    ``unverified``, or with ``keep_outputs``; otherwise an older ``outputs.npz`` is removed.

    The verdict is computed against the primary reference of ``reference_npz``
    (config ``reference``). When that is ONNX Runtime and it failed on the layer (error,
    crash, timeout) but onnx's reference implementation ran, the verdict is computed
    against the spec's outputs instead (:func:`torq_gen_config.reference.judged_reference`):
    ``result["reference"]["used"]`` names the engine judged against and
    ``result["reference"]["fallback"]`` says why (``"reference: onnx (ONNX Runtime
    failed: ...)"``; None when the primary was used), an executor that fails at run time
    is then an ``error`` (the spec computed those inputs), and there is no second
    opinion. When no reference ran (``used`` None), an executor that ran is
    ``unverified``, and so is one that failed at run time on those inputs (a reference
    failure is never an executor's fault): the reference's message comes first. When
    the second engine produced outputs and the verdict rests on the primary,
    ``result["reference_check"]`` holds ``{"engine", "metrics"}`` of the executor's
    outputs against them, from which the report derives whether the executor agrees
    with each reference (:func:`torq_gen_config.report.recommend.reference_agreement`).
    Where the engines disagree and the spec evaluated in float64 settled it (``used``
    ``onnx-float64``), the verdict rests on the spec and the check is against the
    configured engine.

    ``result["timing"]`` always has ``compile_ms`` (compiler / session creation
    wall time) and ``run_ms`` (wall time of the single verification run; for
    IREE that is a whole ``iree-run-module`` process, start-up and module
    loading included, so it is not a kernel time: see ``runtime`` for that).

    Returns:
        The result dict (also written to ``result_path``). Never raises for a
        failing layer: every failure becomes an ``error`` verdict.
    """
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    verdict = _Verdict(new_result(layer, executor, tolerance), result_path=result_path, log_path=log_path,
                       work_dir=work_dir)
    inputs, ref_outputs, meta = load_reference(reference_npz)
    verdict.meta = meta
    # the outputs the verdict rests on: the primary's, the spec in float64 where the engines
    # disagree, the spec's where ONNX Runtime failed, or none
    used, judged_outputs, fallback = judged_reference(meta, ref_outputs)
    verdict.record_reference(used, fallback)
    if meta.get("inputs_missing"):  # nothing to run the executor on; not its fault
        reason = meta.get("message") or ""
        return verdict.unverified(first_error_line(reason), reason)
    try:
        backend = backends.make_backend(executor)
    except Exception as e:
        return verdict.error("compile", f"backend {executor['backend']!r} is not available: {e}")
    verdict.result["tool"] = _safe_describe(backend, min(float(timeout_s), 60.0))
    if backend.needs_mlir:
        st = json.loads(Path(import_status).read_text()) if import_status else {"status": "ok"}
        if st.get("status") != "ok":
            stage = st.get("stage") or "import"
            return verdict.error(stage, st.get("message") or "MLIR import failed",
                                 "import" if stage != "import" else None)
    try:
        artifact, outputs = _compile_and_run(verdict.result, backend, layer=layer, layer_onnx=layer_onnx,
                                             layer_mlir=layer_mlir, batch=batch, inputs=inputs, meta=meta,
                                             work_dir=work_dir, timeout_s=timeout_s, log_path=log_path)
    except StageError as e:
        if getattr(e, "compile_ms", None) is not None:  # compiled, then the run failed
            verdict.result["timing"]["compile_ms"] = _round(e.compile_ms)
        during = getattr(e, "during", None)
        at_run = e.stage == "run" or (e.stage in ("timeout", "crash") and during == "run")
        if at_run and used is None:
            # no reference ran on these inputs: not the executor's fault (where the spec
            # ran, the inputs are valid and a run failure is the executor's)
            return verdict.reference_failed(
                f"the executor failed too at run time ({e.stage}): {first_error_line(e.message)}", e.message)
        return verdict.error(e.stage, e.message, during)
    except Exception as e:  # a backend bug must not stop the other layers
        return verdict.error("run", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")

    layer_model = _load_model(layer_onnx)
    _second_opinion(verdict.result, layer_model, outputs, meta, used=used, primary_outputs=ref_outputs)
    if used is None:
        reason = meta.get("message") or ""
        verdict.unverified(f"ran, but the reference failed: {first_error_line(reason)}", reason, finish=False)
    else:
        try:
            # outputs a DequantizeLinear writes (a quantized layer) are compared as their
            # int8 levels: one quantization step is their resolution (docs/comparison.md)
            if layer_model is None:
                raise ValueError(f"cannot read the layer model {layer_onnx}")
            status, summary, metrics = judge(outputs, judged_outputs, meta["output_names"], tolerance,
                                             model=layer_model)
        except Exception as e:
            return verdict.error("compare", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        verdict.compared(status, summary, metrics)
    if timing:
        _measure_runtime(verdict.result, backend, artifact, inputs, meta, work_dir=work_dir, timing=timing,
                         timeout_s=timeout_s, log_path=log_path)
    _keep_outputs(verdict.result, outputs, work_dir, keep_outputs)
    return verdict.finish()


def new_result(layer: dict, executor: dict, tolerance: dict | None) -> dict:
    """The skeleton of a (layer, executor) verdict record (``result.json``, schema
    ``layer_result.schema.yaml``): no status yet, no metrics, no failure."""
    return {
        "schema": RESULT_SCHEMA,
        "layer_id": layer["layer_id"], "layer_slug": layer["slug"], "op_type": layer["op_type"],
        "executor": executor["name"], "backend": executor["backend"],
        "status": None, "tolerance_used": dict(tolerance) if tolerance is not None else None, "metrics": None,
        "failure_report": None, "timing": {"compile_ms": None, "run_ms": None}, "reference": None,
    }


def failure_record(kind: str, summary: str, message: str | None, *, stage: str | None = None,
                   during: str | None = None) -> dict:
    """A verdict's ``failure_report``: ``kind`` ``error`` (a stage failed), ``accuracy_failure``
    (compared, over tolerance), ``reference_error`` (no reference to judge by) or ``skipped``;
    the summary cut to SUMMARY_CHARS, the message bounded to MESSAGE_CHARS (head and tail)."""
    return {"type": kind, "stage": stage, "during": during, "summary": summary[:SUMMARY_LIMIT],
            "message": bounded_message(message, MESSAGE_LIMIT) if message is not None else None}


class _Verdict:
    """The verdict of one :func:`run_layer_test` as it is built: each outcome sets the
    status and the failure record, and :meth:`finish` writes the result file."""

    def __init__(self, result: dict, *, result_path: str, log_path: str | None, work_dir: str):
        self.result, self.result_path, self.log_path, self.work_dir = result, result_path, log_path, work_dir
        self.meta: dict = {}

    def record_reference(self, used: str | None, fallback: str | None) -> None:
        """``result["reference"]``: the layer reference's engines, statuses and the one judged against."""
        meta, second = self.meta, self.meta.get("second") or {}
        self.result["reference"] = {
            "status": meta["status"], "message": meta.get("message"), "engine": meta.get("engine"),
            "engine_version": meta.get("engine_version"), "ort_version": meta.get("ort_version"),
            "used": used, "fallback": fallback, "layer_inputs": meta.get("layer_inputs"),
            "second": {k: second.get(k) for k in ("engine", "engine_version", "status", "message", "outputs_kept")}}

    def error(self, stage: str, message: str, during: str | None = None) -> dict:
        """``error`` at ``stage``: written now (an earlier verdict's outputs removed)."""
        (Path(self.work_dir) / EXECUTOR_OUTPUTS_FILE).unlink(missing_ok=True)
        self.result["status"] = "error"
        self.result["failure_report"] = failure_record("error", f"{stage} failed: {first_error_line(message)}",
                                                       message, stage=stage, during=during)
        return self.finish()

    def unverified(self, summary: str, message: str, *, finish: bool = True) -> dict:
        """``unverified``: no reference computed the layer (the executor may have run)."""
        self.result["status"] = "unverified"
        self.result["failure_report"] = failure_record("reference_error", summary, message, stage="reference")
        return self.finish() if finish else self.result

    def reference_failed(self, executor_summary: str, executor_message: str) -> dict:
        """``unverified``: the reference failed on these inputs, and the executor failed at
        run time on them too; the reference's message comes first."""
        ref = self.meta.get("message") or "the reference failed"
        note = (" (the other reference engine ran on the same inputs, so they may be valid: see reference_check)"
                if (self.meta.get("second") or {}).get("status") == "ok" else "")
        self.result["status"] = "unverified"
        self.result["failure_report"] = failure_record(
            "reference_error", f"the reference failed on these inputs: {first_error_line(ref)}; {executor_summary}{note}",
            f"{ref}\n\n{executor_summary}{note}\n{executor_message}", stage="reference", during="run")
        return self.finish()

    def compared(self, status: str, summary: str, metrics: dict) -> None:
        """The comparison's verdict and metrics (an ``accuracy_failure`` record unless a success)."""
        self.result.update(metrics=metrics, status=status)
        if status != "success":
            self.result["failure_report"] = failure_record("accuracy_failure", summary, summary)

    def finish(self) -> dict:
        """Write the result file (the runtime's run files removed) and log the verdict."""
        return _finish(self.result, self.result_path, self.log_path)


def _compile_and_run(result: dict, backend, *, layer: dict, layer_onnx: str, layer_mlir: str | None,
                     batch: dict | None, inputs: dict, meta: dict, work_dir: str, timeout_s: float,
                     log_path: str | None) -> tuple:
    """Compile and run the layer on ``backend`` (its function from the compile batch's
    module when ``batch`` compiled it; compiled alone when that run fails or the batch left
    it out); ``result["timing"]`` gets ``compile_ms``, ``run_ms`` (and ``compile_batch``).

    Returns:
        ``(artifact, outputs)``.

    Raises:
        StageError: from the backend (``compile_ms`` set on it when the compile went through).
    """
    artifact = None
    if batch:
        artifact, result["timing"]["compile_batch"] = member_artifact(batch["info"], batch["module"], layer["slug"],
                                                                      layer_mlir)
    if artifact is not None:  # compiled in its batch: run its function
        try:
            outputs, run_ms = backend.run(artifact, inputs=inputs, input_names=meta["input_names"],
                                          output_names=meta["output_names"], work_dir=work_dir,
                                          timeout_s=timeout_s, log_path=log_path)
        except StageError as e:
            if e.stage not in ("run", "crash"):  # a timeout is not waited for twice
                e.compile_ms = artifact.compile_ms
                raise
            # the runtime's message names the batch's function and module layout: a
            # one-layer compile gives the verdict and message that compile_batch 1 gives
            result["timing"]["compile_batch"] = {
                "id": result["timing"]["compile_batch"]["id"],
                "compiled_alone": f"its run from the batch's module failed ({e.stage}); compiled alone for the "
                                  "one-layer verdict"}
            artifact = None
    if artifact is None:
        artifact, outputs, run_ms = backend.compile_and_run(
            onnx_path=layer_onnx, mlir_path=layer_mlir, inputs=inputs, input_names=meta["input_names"],
            output_names=meta["output_names"], work_dir=work_dir, timeout_s=timeout_s, log_path=log_path)
    result["timing"]["compile_ms"] = _round(artifact.compile_ms)
    result["timing"]["run_ms"] = _round(run_ms)
    return artifact, outputs


def _second_opinion(result: dict, layer_model, outputs: dict, meta: dict, *, used: str | None,
                    primary_outputs: dict) -> None:
    """``result["reference_check"]``: the executor's outputs against the other reference
    engine (against the configured one where the spec in float64 settled a dispute); none
    when the verdict rests on that engine (the fallback), which would only repeat the verdict."""
    second = meta.get("second") or {}
    check_engine, check_outputs = second.get("engine"), meta.get("second_outputs") or {}
    if used == SPEC_FLOAT64:
        check_engine, check_outputs = meta.get("engine"), primary_outputs
    if not check_outputs or layer_model is None or used == check_engine:
        return
    try:
        check = compare_on_model(layer_model, outputs, check_outputs, meta["output_names"])
    except Exception as e:  # a non-numeric output
        result["reference_check_error"] = f"{type(e).__name__}: {e}"[:SUMMARY_LIMIT]
        return
    if check is not None:
        result["reference_check"] = {"engine": check_engine, "metrics": check}


def _keep_outputs(result: dict, outputs: dict, work_dir: str, keep: bool) -> None:
    """The executor's outputs in ``<work_dir>/outputs.npz`` where the verdict is not a
    success (or ``keep``), named in ``result["outputs_file"]``; else no such file."""
    path = Path(work_dir) / EXECUTOR_OUTPUTS_FILE
    if keep or result["status"] != "success":
        try:
            save_npz(path, {f"output_{i}": a for i, a in enumerate(outputs.values())},
                     {"kind": "executor_outputs", "executor": result["executor"], "layer": result["layer_id"],
                      "output_names": list(outputs)})
            result["outputs_file"] = EXECUTOR_OUTPUTS_FILE
        except Exception as e:  # noqa: BLE001 - kept for debugging: never the verdict's business
            result["outputs_file_error"] = f"{type(e).__name__}: {e}"[:SUMMARY_LIMIT]
    else:
        path.unlink(missing_ok=True)


def _measure_runtime(result: dict, backend, artifact, inputs: dict, meta: dict, *, work_dir: str, timing: dict,
                     timeout_s: float, log_path: str | None) -> None:
    """Store ``backend.benchmark``'s dict (or its failure) in ``result["timing"]``; never raises.

    Runs once the verdict is known (``success``, ``difference``, ``unverified``);
    the verdict comes from the verification run's outputs and does not change.
    """
    runs = int(timing.get("runs", 5))
    warmup = int(timing.get("warmup", 1))
    try:
        with _BENCHMARK_LOCK:
            result["timing"]["runtime"] = backend.benchmark(
                artifact, inputs=inputs, input_names=meta["input_names"], output_names=meta["output_names"],
                work_dir=work_dir, runs=runs, warmup=warmup, timeout_s=timeout_s, log_path=log_path)
    except StageError as e:
        result["timing"]["runtime_error"] = {"stage": e.stage, "during": e.during, "summary": e.summary[:SUMMARY_LIMIT],
                                             "message": e.message[:MESSAGE_LIMIT]}
    except NotImplementedError as e:
        result["timing"]["runtime_error"] = {"stage": None, "during": None, "summary": str(e)[:SUMMARY_LIMIT],
                                             "message": str(e)}
    except Exception as e:  # a benchmark bug or a missing tool must not lose the verdict
        msg = f"{type(e).__name__}: {e}"
        result["timing"]["runtime_error"] = {"stage": None, "during": None, "summary": msg[:SUMMARY_LIMIT],
                                             "message": (msg + "\n" + traceback.format_exc())[:MESSAGE_LIMIT]}
    if log_path and "runtime_error" in result["timing"]:
        append_record(log_path, f"runtime measurement failed: {result['timing']['runtime_error']['summary']}")


def error_result(*, layer: dict, executor: dict, stage: str, message: str, result_path: str,
                 tolerance: dict) -> dict:
    """Write and return an ``error`` verdict found before compiling (stage ``quantize``:
    the layer could not be quantized, ``--quantize``) or outside the test itself (stage
    ``internal``: torq-gen-config failed on this layer; the message has the traceback)."""
    result = new_result(layer, executor, tolerance)
    result["status"] = "error"
    result["failure_report"] = failure_record("error", f"{stage} failed: {first_error_line(message)}", message,
                                              stage=stage)
    write_json(result_path, result, compact=True)
    return result


def skipped_result(*, layer: dict, executor: dict, by: str, result_path: str) -> dict:
    """Write and return the ``skipped`` result of an executor not tested because the
    higher-priority executor ``by`` already succeeded on the layer (skip mode)."""
    result = new_result(layer, executor, None)
    result.update(status="skipped", skipped_because={"executor": by, "mode": "skip_mode"})
    result["failure_report"] = failure_record(
        "skipped", f"not tested: {by} already succeeded on this layer (skip mode)", None)
    write_json(result_path, result, compact=True)
    return result


def _finish(result: dict, result_path: str, log_path: str | None) -> dict:
    remove_run_files(Path(result_path).parent)  # compared in memory; outputs.npz keeps what is kept
    write_json(result_path, result, compact=True)
    append_record(log_path, f"verdict: {result['status']}"
                            f"{' - ' + result['failure_report']['summary'] if result['failure_report'] else ''}")
    return result


def one_line_summary(result: dict) -> str:
    """A console line for a finished job, e.g. ``[llvm-cpu] Conv_r0: success (412 ms compile)``;
    ``success*`` and the reason when the comparison could not have failed
    (``metrics["inconclusive"]``, docs/comparison.md); the fallback line when the verdict
    rests on onnx's reference implementation (``result["reference"]["fallback"]``)."""
    t = result.get("timing") or {}

    status = shown_status(result)
    notes = []
    fallback = (result.get("reference") or {}).get("fallback")
    if fallback and len(fallback) > 120:  # cut inside its parenthesis, which stays closed
        fallback = fallback[:116] + "...)"
    if result.get("failure_report"):
        # a compiler's "path/to/model.mlir:3:10: error: ..." keeps the file name only: the cause fits the line
        why = _DIAGNOSTIC_PATH.sub(r"\1", result["failure_report"]["summary"])
        line = f"[{result['executor']}] {result['layer_id']}: {status} - " + why[:120]
        return line + (f" ({fallback})" if fallback else "")
    if t.get("compile_ms") is not None:
        rt = t.get("runtime") or {}
        bench = f", {rt['median_ms']:.3f} ms median of {rt['runs']}" if rt.get("median_ms") is not None else ""
        members = (t.get("compile_batch") or {}).get("members")
        share = f" (share of a batch of {members})" if members else ""
        notes.append(f"{t['compile_ms']:.0f} ms compile{share}, {t.get('run_ms') or 0:.1f} ms run{bench}")
    if status == INCONCLUSIVE:
        reasons = (result.get("metrics") or {}).get("inconclusive_reasons") or ["the comparison could not fail"]
        notes.append("inconclusive: " + reasons[0][:120])
    if fallback:
        notes.append(fallback)
    return f"[{result['executor']}] {result['layer_id']}: {status}" + (f" ({'; '.join(notes)})" if notes else "")


def _load_model(path: str):
    """The layer's ONNX model (without external data), or None when unreadable."""
    try:
        return onnx.load(path, load_external_data=False)
    except Exception:
        return None


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def _safe_describe(backend, probe_timeout_s: float) -> dict:
    try:
        return backend.describe(probe_timeout_s=probe_timeout_s)
    except Exception as e:  # provenance must not fail a test
        return {"error": str(e)}

