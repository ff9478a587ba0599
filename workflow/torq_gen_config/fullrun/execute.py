"""Run a full-model plan: the partitions in order (tensors handed on as numpy
arrays), or a whole-model module once; compare the model's outputs with the ONNX
Runtime reference and check each partition on the inputs it got (``result.json``)."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from ..backends import capabilities, make_backend
from ..backends.base import CompiledArtifact, StageError, failure_summary
from ..compare import (ENGINE_TOLERANCE_MARGIN, FULL_MODEL_MIN_COSINE, count_over_tolerance,
                       dequantized_outputs_of_file, engine_widened_tolerances, judge, quantized_data_outputs_of_file,
                       widening_note)
from ..core.layout import MODEL_FILE, PARTITION_RUN_DIR
from ..core.isolation import run_isolated
from ..core.lazy import onnx
from ..core.limits import DEFAULT_TIMEOUT_S, MESSAGE_CHARS as MESSAGE_LIMIT, NOTE_CHARS, SUMMARY_CHARS as SUMMARY_LIMIT, call_limit
from ..core.tools import bounded_message, first_error_line
from ..core.external_data import load_model
from ..core.fileio import save_npz
from ..model.folding import fold_constants
from ..reference import judged_reference, load_reference
from ..reference.reference_run import run_reference_file
from .batches import batch_module_of
from .common import PARTITIONS_MODE, RESULT_SCHEMA, _layer_span, _round
from .compile import compile_partition


def run_partitions(plan: Mapping, *, reference_npz: str, compiled: Mapping[str, Mapping], tolerance: Mapping,
                   timeout_s: float, partitions_dir: str | os.PathLike, log_path: str | None = None,
                   check_partitions: bool = True, run_dir: str | os.PathLike | None = None,
                   outputs_npz: str | None = None) -> dict:
    """Run the plan's partitions in order and compare the outputs with the reference.

    Args:
        plan: from :func:`make_plan`.
        reference_npz: inputs and ONNX Runtime outputs of the whole prepared model.
        compiled: pid -> ``compiled.json`` content.
        tolerance: for the verdict (the caller may re-derive it from the metrics).
        timeout_s: per tool call.
        partitions_dir: ``work/full/partitions``: each partition's files are found in
            ``<partitions_dir>/<pid>`` (model, module; paths stored in ``compiled.json``
            are only used for their file names, so the directory may be reached
            through another working directory than at compile time), its run files go
            to ``<partitions_dir>/<pid>/run``.
        check_partitions: also run each partition with ONNX Runtime (optimizations
            off) on the inputs it got and compare (``partition_check``), which
            tells which partition introduced a difference.
        run_dir: where the partitions' run files go (``<run_dir>/<pid>``; default
            ``<partitions_dir>/<pid>/run``): runs that share compiled partitions at
            the same time (``run --reduce``) each need their own.
        outputs_npz: where to keep the model's outputs of this run (``full/outputs.npz``,
            ``save_npz``; ``result["outputs_file"]`` names it), or None.

    Returns:
        The result (JSON-safe): ``status`` (``success``/``difference``/``error``/
        ``unverified``), ``summary``, ``metrics``, ``num_over_tolerance``,
        ``failure`` (for errors: ``stage``, ``during``, ``summary``, ``message``,
        ``partition``, ``pid``, ``executor``, ``layer_ids``), ``partitions`` (per
        partition: ``index``, ``pid``, ``executor``, ``first_node``, ``last_node``,
        ``layer_ids``, ``compile_ms``, ``run_ms``, ``status``, ``partition_check``),
        ``timing`` (``compile_ms_total``, ``run_ms_total``, ``wall_ms``),
        ``reference``, ``fallbacks``, ``source``, ``options``, ``mode``. A whole-model
        plan (``mode``: its backend's kind, e.g. ``"torq"``) is run by
        :func:`run_whole_model` (same result shape).
    """
    if (plan.get("mode") or PARTITIONS_MODE) != PARTITIONS_MODE:
        return run_whole_model(plan, reference_npz=reference_npz, compiled=compiled, tolerance=tolerance,
                               timeout_s=timeout_s, partitions_dir=partitions_dir, log_path=log_path,
                               outputs_npz=outputs_npz)
    t0 = time.perf_counter()
    inputs, ref_outputs, meta = load_reference(reference_npz)
    result = _new_result(plan, tolerance, meta)
    rows = result["partitions"]
    for p in plan["partitions"]:
        c = compiled.get(p["pid"]) or {}
        rows.append({"index": p["index"], "pid": p["pid"], "executor": p["executor"], "backend": p["backend"],
                     "first_node": p["first_node"], "last_node": p["last_node"], "num_nodes": p["num_nodes"],
                     "layer_ids": p["layer_ids"], "compile_ms": c.get("compile_ms"), "run_ms": None,
                     "status": "compiled" if c.get("status") == "ok" else "not run", "partition_check": None,
                     **({"compile_batch": c["compile_batch"]} if c.get("compile_batch") else {})})

    def finish(status: str, summary: str, failure: dict | None = None) -> dict:
        result["status"] = status
        result["summary"] = summary[:SUMMARY_LIMIT]
        result["failure"] = failure
        comp = [r["compile_ms"] for r in rows if r["compile_ms"] is not None]
        runs = [r["run_ms"] for r in rows if r["run_ms"] is not None]
        result["timing"] = {"compile_ms_total": _round(sum(comp)) if comp else None,
                            "run_ms_total": _round(sum(runs)) if runs else None,
                            "wall_ms": _round((time.perf_counter() - t0) * 1000.0)}
        return result

    def part_failure(p: Mapping, stage: str, message: str, during: str | None = None) -> dict:
        where = f"partition {p['index']} ({p['executor']}, nodes {p['first_node']}-{p['last_node']}, " \
                f"layers {_layer_span(p['layer_ids'])})"
        return {"stage": stage, "during": during, "partition": p["index"], "pid": p["pid"], "executor": p["executor"],
                "layer_ids": p["layer_ids"],
                "summary": f"{where}: {failure_summary(stage, message)}"[:SUMMARY_LIMIT],
                "message": bounded_message(message, MESSAGE_LIMIT)}

    # a failed compile is known before anything runs
    for p, row in zip(plan["partitions"], rows):
        c = compiled.get(p["pid"])
        if c is None:
            f = part_failure(p, "compile", "no compile result for this partition")
            return finish("error", f["summary"], f)
        if c.get("status") != "ok":
            fr = c.get("failure") or {}
            f = part_failure(p, fr.get("stage") or "compile", fr.get("message") or "compile failed", fr.get("during"))
            row["status"] = "error"
            return finish("error", f["summary"], f)

    store: dict[str, Any] = dict(inputs)
    missing_inputs = [n for n in plan["graph_inputs"] if n not in store]
    if missing_inputs:
        return finish("error", f"the reference has no input(s) {missing_inputs}",
                      {"stage": "run", "during": None, "partition": None, "pid": None, "executor": None,
                       "layer_ids": [], "summary": f"the reference has no input(s) {missing_inputs}",
                       "message": f"reference inputs: {sorted(inputs)}"})
    if plan.get("constant_outputs"):
        store.update(_constant_outputs(plan))
    last_use = _last_uses(plan)
    keep = set(plan["graph_outputs"])
    levels: dict[str, dict] = {}  # model outputs a DequantizeLinear writes: compared as int levels
    for k, (p, row) in enumerate(zip(plan["partitions"], rows)):
        c = compiled[p["pid"]]
        pdir = Path(partitions_dir) / p["pid"]
        feed = {n: store[n] for n in p["inputs"]}
        work = Path(run_dir) / p["pid"] if run_dir is not None else pdir / PARTITION_RUN_DIR
        try:
            backend = make_backend(p["executor_def"])
            artifact = _artifact(c, pdir, Path(partitions_dir).parent)
            try:
                outs, run_ms = backend.run(artifact, inputs=feed, input_names=p["inputs"], output_names=p["outputs"],
                                           work_dir=str(work), timeout_s=timeout_s, log_path=log_path)
            except StageError as e:
                if e.stage not in ("run", "crash") or not batch_module_of(c, Path(partitions_dir).parent):
                    raise
                # the runtime's message names the batch's function and module layout: the
                # partition compiled alone gives the one-partition result
                outs, run_ms = _run_alone(p, row, backend, feed, pdir, e, timeout_s, log_path)
        except StageError as e:
            row["status"] = "error"
            f = part_failure(p, e.stage, e.message, e.during)
            return finish("error", f["summary"], f)
        except Exception as e:  # a backend bug: an error result, not a crashed workflow
            row["status"] = "error"
            f = part_failure(p, "run", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            return finish("error", f["summary"], f)
        row["run_ms"] = _round(run_ms)
        row["status"] = "ran"
        if check_partitions:
            row["partition_check"] = _check_partition(p, str(pdir / MODEL_FILE), feed, outs, tolerance,
                                                      timeout_s=timeout_s)
        if keep & set(p["outputs"]):
            part_levels = dequantized_outputs_of_file(str(pdir / MODEL_FILE))
            levels.update({n: q for n, q in part_levels.items() if n in keep})
        store.update(outs)
        for name in [n for n in store if last_use.get(n, -1) <= k and n not in keep]:
            del store[name]  # no later partition reads it: free the memory

    actual = {n: store[n] for n in plan["graph_outputs"] if n in store}
    return _compare_and_finish(result, finish, actual, ref_outputs, meta, tolerance, levels=levels,
                               model_path=plan.get("prepared_model"), outputs_npz=outputs_npz)


def _new_result(plan: Mapping, tolerance: Mapping, meta: Mapping) -> dict:
    """The result skeleton (``result.json``) of a run of ``plan``."""
    return {
        "schema": RESULT_SCHEMA, "mode": plan.get("mode") or PARTITIONS_MODE, "status": None, "summary": None,
        "tolerance_used": dict(tolerance),
        "metrics": None, "num_over_tolerance": None, "share_over_tolerance": None, "failure": None,
        "source": plan.get("source"), "source_file": plan.get("source_file"), "options": plan.get("options"),
        "num_partitions": len(plan["partitions"]), "partitions": [],
        "timing": {"compile_ms_total": None, "run_ms_total": None, "wall_ms": None},
        "reference": {**{k: meta.get(k) for k in ("status", "message", "engine", "ort_version",
                                                    "graph_optimization_level", "run_ms")},
                      # the other engine, where it ran to stand in (judged_reference)
                      "second": {k: (meta.get("second") or {}).get(k) for k in ("engine", "status", "message")},
                      # ONNX Runtime as deployed against the reference: the tolerance widens to it
                      "optimized": meta.get("optimized")},
        "fallbacks": plan.get("fallbacks") or [], "warnings": plan.get("warnings") or [],
        "layer_executors": plan.get("layer_executors"), "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _compare_and_finish(result: dict, finish, actual: Mapping, ref_outputs: Mapping, meta: Mapping,
                        tolerance: Mapping, levels: Mapping[str, dict] | None = None,
                        model_path: str | None = None, outputs_npz: str | None = None) -> dict:
    """Compare the model's outputs with the reference and finish the result;
    ``outputs_npz``: where the outputs (``actual``) are kept first, whatever the verdict
    (``result["outputs_file"]``: its file name), so that the user can read what the
    assignment computes;
    ``levels``: outputs a DequantizeLinear writes, compared as their integer levels
    (``--quantize``; docs/comparison.md); ``model_path``: the model run (its outputs
    that carry quantized data may differ by one step, other integers are exact).
    Float outputs must also reach FULL_MODEL_MIN_COSINE. Where ONNX Runtime failed on the
    model and onnx's reference implementation ran, the outputs are compared with the latter
    (:func:`~torq_gen_config.reference.judged_reference`; ``result["reference"]`` gets
    ``used`` and ``fallback``, and the summary ends with the fallback line).

    Each float output's tolerance is widened to what ONNX Runtime with all graph
    optimizations needs against the same reference (``meta["optimized"]``, issue 42:
    :func:`~torq_gen_config.compare.engine_widened_tolerances`, max(configured,
    ENGINE_TOLERANCE_MARGIN x its error)); ``result["tolerance_widened"]`` records it and
    the summary says so. Only when the judged reference is the configured engine's: the
    spec standing in was not what ONNX Runtime was measured against. A ``difference`` of a
    chain names the partition that carries it (:func:`difference_carrier`,
    ``result["difference_partition"]``)."""
    if outputs_npz and actual:
        save_npz(outputs_npz, dict(actual), {"what": "the model's outputs of this full-model run"})
        result["outputs_file"] = os.path.basename(outputs_npz)
    used, ref_outputs, fallback = judged_reference(meta, ref_outputs)
    result.setdefault("reference", {}).update({"used": used, "fallback": fallback})
    if used is None:
        return finish("unverified", f"the model ran, but the reference failed: "
                                    f"{first_error_line(meta.get('message') or '')}")
    opt = (meta.get("optimized") or {}).get("metrics") if used == meta.get("engine") else None
    try:
        widened = engine_widened_tolerances(tolerance, opt)
        status, summary, metrics = judge(actual, ref_outputs, meta["output_names"], tolerance, levels=levels,
                                         quantized_outputs=quantized_data_outputs_of_file(model_path),
                                         min_cosine=FULL_MODEL_MIN_COSINE, output_tolerances=widened)
        count, share = count_over_tolerance(metrics, tolerance, widened)
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
        return finish("error", f"compare failed: {msg}", {"stage": "compare", "during": None, "partition": None,
                                                          "pid": None, "executor": None, "layer_ids": [],
                                                          "summary": f"compare failed: {msg}"[:SUMMARY_LIMIT],
                                                          "message": bounded_message(msg + "\n" + traceback.format_exc())})
    result["metrics"] = metrics
    result["num_over_tolerance"] = count
    result["share_over_tolerance"] = share
    result["tolerance_widened"] = widened_record(tolerance, widened, opt)
    summary, carrier = full_summary(status, summary, result.get("partitions") or [], result["tolerance_widened"])
    result["difference_partition"] = carrier
    return finish(status, f"{summary} ({fallback})" if fallback else summary)


def widened_record(tolerance: Mapping, widened: Mapping[str, Mapping], engine_metrics: Mapping | None) -> dict | None:
    """``result["tolerance_widened"]``: ``margin``, ``rule``, ``outputs`` (output name ->
    the tolerance it was judged with) and ``note`` (one line: from what to what, and what
    ONNX Runtime with all optimizations is off); None when no output's tolerance grew."""
    if not widened:
        return None
    return {"margin": ENGINE_TOLERANCE_MARGIN,
            "rule": f"per float output: tolerance = max(configured, {ENGINE_TOLERANCE_MARGIN:g} x ONNX Runtime "
                    "(all graph optimizations) against the reference), for the max and the mean",
            "outputs": {n: dict(t) for n, t in widened.items()},
            "note": widening_note(tolerance, widened, engine_metrics)}


def full_summary(status: str, summary: str, rows: list, widened: Mapping | None) -> tuple[str, dict | None]:
    """The full-model summary with what it was judged with: ``summary``, for a
    ``difference`` the partition that carries it (:func:`difference_carrier` of
    ``rows``), and the widening note (``widened["note"]``, when a tolerance was widened).
    Returns ``(summary, carrier or None)``; one place for the run's result and the
    report's re-derived section."""
    carrier = difference_carrier(rows) if status == "difference" else None
    parts = [summary] + ([carrier["line"]] if carrier else []) + \
            ([widened["note"]] if widened and widened.get("note") else [])
    return "; ".join(parts), carrier


def difference_carrier(rows: list) -> dict | None:
    """Which partition of a chain carries a full-model ``difference`` (issue 42), from the
    partition rows' ``partition_check`` (each partition against ONNX Runtime on the inputs
    it got, at the configured tolerance).

    The first partition (run order) whose check is a ``difference`` carries it: it is off
    on inputs it was given, whatever came before (``how: "own check differs"``). When no
    check differs, no single partition is wrong on its own: the error accumulates across
    partitions, and the one with the largest own ``max_rel_diff`` (dimensionless, the ``d``
    of docs/comparison.md) is named (``how: "accumulated"``). Where the deviation from the
    whole-model reference first crosses the tolerance is not known here: the reference
    holds only the model's outputs, not the partitions' (``run --reduce`` finds it).

    Returns:
        ``{"partition", "pid", "executor", "layer_ids", "how", "max_rel_diff", "line"}``
        (``line``: one sentence for the summary), or None: no partition was checked (one
        module, a whole-model compile, a run that failed first).
    """
    checked = [r for r in rows if (r.get("partition_check") or {}).get("status")]
    if not checked:
        return None
    row = next((r for r in checked if r["partition_check"]["status"] == "difference"), None)
    how = "own check differs"
    if row is None:
        sized = [r for r in checked if r["partition_check"].get("max_rel_diff") is not None]
        if not sized:
            return None
        row, how = max(sized, key=lambda r: r["partition_check"]["max_rel_diff"]), "accumulated"
    check = row["partition_check"]
    where = (f"partition {row.get('index')} ({row.get('executor')}, nodes {row.get('first_node')}-"
             f"{row.get('last_node')}, layers {_layer_span(row.get('layer_ids') or [])})")
    if how == "own check differs":
        line = (f"carried by {where}, which differs from ONNX Runtime on its own inputs: "
                f"{str(check.get('summary') or '')[:NOTE_CHARS]}")
    else:
        line = (f"no partition differs from ONNX Runtime on its own inputs, so the error accumulates across the "
                f"{len(checked)} partition(s); the largest own deviation is {where} (max rel diff "
                f"{check['max_rel_diff']:.1e})")
    return {"partition": row.get("index"), "pid": row.get("pid"), "executor": row.get("executor"),
            "layer_ids": list(row.get("layer_ids") or []), "how": how, "max_rel_diff": check.get("max_rel_diff"),
            "line": line[:SUMMARY_LIMIT]}


def run_whole_model(plan: Mapping, *, reference_npz: str, compiled: Mapping[str, Mapping], tolerance: Mapping,
                    timeout_s: float, partitions_dir: str | os.PathLike, log_path: str | None = None,
                    outputs_npz: str | None = None) -> dict:
    """Run the compiled module of a whole-model plan once (its backend's
    :meth:`~torq_gen_config.backends.whole_model.WholeModel.run`: torq runs
    ``torq-run-module`` on the reference inputs) and compare it with the reference.
    A failed compile (e.g. ``torq-compile`` not found) or run is an ``error`` result
    whose failure names the stage and the message.

    Returns:
        The result in :func:`run_partitions`' shape (``mode``: the backend kind, one
        partition, ``partition_check`` None: the partition is the model), plus the
        backend's ``result_fields`` (torq: ``torq``: ``executor_map``,
        ``num_map_entries``, ``executors``, ``compile_argv``).
    """
    hooks = capabilities(plan["mode"]).whole_model()
    t0 = time.perf_counter()
    inputs, ref_outputs, meta = load_reference(reference_npz)
    result = _new_result(plan, tolerance, meta)
    p = plan["partitions"][0]
    c = compiled.get(p["pid"]) or {}
    result.update(hooks.result_fields(plan, c) if hooks is not None else {})
    row = {"index": 0, "pid": p["pid"], "executor": p["executor"], "backend": p["backend"],
           "first_node": p["first_node"], "last_node": p["last_node"], "num_nodes": p["num_nodes"],
           "layer_ids": p["layer_ids"], "compile_ms": c.get("compile_ms"), "run_ms": None,
           "status": "compiled" if c.get("status") == "ok" else "not run", "partition_check": None}
    result["partitions"].append(row)

    def finish(status: str, summary: str, failure: dict | None = None) -> dict:
        result["status"] = status
        result["summary"] = summary[:SUMMARY_LIMIT]
        result["failure"] = failure
        result["timing"] = {"compile_ms_total": row["compile_ms"], "run_ms_total": row["run_ms"],
                            "wall_ms": _round((time.perf_counter() - t0) * 1000.0)}
        return result

    def failure(stage: str, message: str, during: str | None = None) -> dict:
        where = hooks.failure_where(p) if hooks is not None else f"whole model on {plan['mode']}"
        return {"stage": stage, "during": during, "partition": 0, "pid": p["pid"], "executor": p["executor"],
                "layer_ids": p["layer_ids"],
                "summary": f"{where}: {failure_summary(stage, message)}"[:SUMMARY_LIMIT],
                "message": bounded_message(message, MESSAGE_LIMIT)}

    if not c:
        f = failure("compile", "no compile result for the whole-model partition")
        return finish("error", f["summary"], f)
    if c.get("status") != "ok":
        fr = c.get("failure") or {}
        row["status"] = "error"
        f = failure(fr.get("stage") or "compile", fr.get("message") or "compile failed", fr.get("during"))
        return finish("error", f["summary"], f)
    missing = [n for n in p["inputs"] if n not in inputs]
    if missing:
        f = failure("run", f"the reference has no input(s) {missing}; reference inputs: {sorted(inputs)}")
        return finish("error", f["summary"], f)
    pdir = Path(partitions_dir) / p["pid"]
    try:
        if hooks is None:
            raise RuntimeError(f"backend {plan['mode']!r} has no whole-model run (is it installed?)")
        outs, run_ms = hooks.run(p, c, inputs=inputs, partition_dir=str(pdir), timeout_s=timeout_s,
                                 log_path=log_path)
    except StageError as e:
        row["status"] = "error"
        f = failure(e.stage, e.message, e.during)
        return finish("error", f["summary"], f)
    except Exception as e:  # a missing module, a backend bug: an error result, not a crashed workflow
        row["status"] = "error"
        f = failure("run", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        return finish("error", f["summary"], f)
    row["run_ms"] = _round(run_ms)
    row["status"] = "ran"
    return _compare_and_finish(result, finish, outs, ref_outputs, meta, tolerance,
                               model_path=plan.get("prepared_model"), outputs_npz=outputs_npz)


def _last_uses(plan: Mapping) -> dict[str, int]:
    """Tensor name -> index of the last partition that reads it."""
    last: dict[str, int] = {}
    for k, p in enumerate(plan["partitions"]):
        for n in p["inputs"]:
            last[n] = k
    return last


def _artifact(compiled: Mapping, pdir: Path, full_dir: Path):
    """The CompiledArtifact of ``compiled.json``, with its files found in ``pdir`` (a
    partition compiled in a batch: its batch's module under ``full_dir``)."""
    art = compiled.get("artifact") or {}
    info = dict(art.get("info") or {})
    if info.get("onnx_path"):
        info["onnx_path"] = str(pdir / MODEL_FILE)
    path = str(pdir / Path(art["path"]).name) if art.get("path") else None
    path = batch_module_of(compiled, full_dir) or path
    return CompiledArtifact(path=path, compile_ms=compiled.get("compile_ms"), info=info)


def _run_alone(p: Mapping, row: dict, backend, feed: Mapping, pdir: Path, error: StageError, timeout_s: float,
               log_path: str | None):
    """A partition whose run from its batch's module failed (``error``, stage run or
    crash): compiled alone into its own directory (as with ``compile_batch: 1``) and run
    again; ``row`` records the alone compile (``compile_ms``, ``compile_batch``).

    Raises:
        StageError: the alone compile or its run failed (the one-partition failure).
    """
    cb = dict(row.get("compile_batch") or {})
    row["compile_batch"] = {"id": cb.get("id"), "executor": cb.get("executor"),
                            "compiled_alone": f"its run from the batch's module failed ({error.stage}); compiled "
                                              "alone for the one-partition result"}
    c = compile_partition(pid=p["pid"], model_path=str(pdir / MODEL_FILE), executor=p["compile_def"],
                          work_dir=str(pdir), timeout_s=timeout_s, log_path=log_path)
    row["compile_ms"] = c.get("compile_ms")
    if c["status"] != "ok":
        f = c.get("failure") or {}
        raise StageError(f.get("stage") or "compile", f.get("message") or "compile failed", during=f.get("during"))
    return backend.run(_artifact(c, pdir, pdir.parent.parent), inputs=feed, input_names=p["inputs"],
                       output_names=p["outputs"], work_dir=str(pdir / PARTITION_RUN_DIR), timeout_s=timeout_s, log_path=log_path)


def _check_partition(p: Mapping, model_path: str, feed: Mapping, outs: Mapping, tolerance: Mapping,
                     timeout_s: float | None = None) -> dict:
    """This partition's outputs against ONNX Runtime (optimizations off; a bf16
    partition widened to fp32, see :func:`~torq_gen_config.reference.reference_run.run_reference`)
    on the same inputs, run in a supervised worker (:mod:`torq_gen_config.core.isolation`);
    where ONNX Runtime fails, against onnx's reference implementation, and the summary
    says so; ``unverified`` when both fail."""
    try:
        part_model = onnx.load(model_path, load_external_data=False)
    except Exception as e:
        return {"status": "unverified", "summary": f"cannot read the partition: {str(e).strip()[:NOTE_CHARS]}",
                "max_rel_diff": None, "max_abs_diff": None}
    errors: list[str] = []
    for engine, what in (("onnxruntime", "ONNX Runtime"), ("onnx", "onnx's reference implementation")):
        try:  # onnx's reference implementation stands in where ONNX Runtime fails (as for a layer)
            outs_ref, _ = run_isolated(run_reference_file, (model_path, {n: feed[n] for n in p["inputs"]},
                                                            list(p["outputs"]), engine, timeout_s),
                                       limit_s=call_limit(timeout_s or DEFAULT_TIMEOUT_S), what=f"{what} on the partition")
            break
        except Exception as e:
            errors.append(first_error_line(str(e).strip())[:NOTE_CHARS])
    else:
        return {"status": "unverified", "summary": f"ONNX Runtime failed on the partition: {errors[0]}; onnx's "
                                                   f"reference implementation too: {errors[1]}",
                "max_rel_diff": None, "max_abs_diff": None}
    fallback = f"reference: onnx (ONNX Runtime failed: {errors[0]})" if errors else None
    ref = dict(zip(p["outputs"], outs_ref))
    try:
        status, summary, m = judge(outs, ref, list(p["outputs"]), tolerance, model=part_model,
                                   min_cosine=FULL_MODEL_MIN_COSINE)
    except Exception as e:
        return {"status": "error", "summary": f"compare failed: {type(e).__name__}: {e}"[:SUMMARY_LIMIT],
                "max_rel_diff": None, "max_abs_diff": None}
    if fallback:
        summary = f"{summary} ({fallback})"
    return {"status": status, "summary": summary[:SUMMARY_LIMIT], "max_rel_diff": m.get("max_rel_diff"),
            "max_abs_diff": m.get("max_abs_diff"), "mean_rel_diff": m.get("mean_rel_diff"),
            "cosine_similarity": m.get("cosine_similarity"), "inconclusive": m.get("inconclusive")}


def _constant_outputs(plan: Mapping) -> dict:
    """Model outputs that are constants (rare): evaluated again from the prepared model."""
    model = load_model(plan["prepared_model"], weights=False)
    values, _, _ = fold_constants(model)
    return {t: values[t] for t in plan["constant_outputs"]}
