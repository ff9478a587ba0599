"""Entry points of the workflow's jobs: one function per rule in ``rules/*.smk``.

Each function takes plain paths and values (what the rule's ``input``, ``output``,
``params`` and ``log`` hold) and calls the library. The rules run them in-process
(``run:`` blocks with the local executor's threads, see ``profiles/default``), so a
job costs milliseconds of start-up instead of a Python process with numpy, ONNX
Runtime and IREE imported (notes/snakemake.md: ~55-75 ms per ``script:`` job plus
~0.25 s of imports here). Tools that can crash or hang run as subprocesses with
timeouts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .backends import executor_with_tool_options  # noqa: F401 (re-exported: the rules call jobs.executor_with_tool_options)
from .fileio import read_json, write_json

#: One-line reasons of the bad-input errors (TorqGenConfigError) raised by jobs of
#: this process (jobs are threads of the Snakemake process); workflow_api puts the
#: first into the run's error message instead of Snakemake's generic one.
JOB_FAILURES: list[str] = []


def records_failure(fn):
    """Decorator for job entry points: a TorqGenConfigError (a missing or corrupt
    model, an int64 value out of int32 range, failed quantization, ...) is noted in
    :data:`JOB_FAILURES` and raised again (the job fails as before)."""
    import functools

    from .errors import TorqGenConfigError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TorqGenConfigError as e:
            JOB_FAILURES.append(f"{fn.__name__.removesuffix('_job')}: {e}")
            raise

    return wrapper


def in_worker(impl, what: str, limit: float, *, without_run: str | None = None, **kwargs):
    """Run the job body ``impl(**kwargs)`` in a supervised worker process
    (:mod:`torq_gen_config.isolation`) with the time limit ``limit`` (seconds): a hang
    or a crash of ONNX Runtime, onnx's reference evaluator or the IREE importer stops
    only the worker. For model-level jobs: the run then stops with one line, unless
    ``without_run`` names a keyword of ``impl`` that skips its whole-model reference run
    (what hangs or crashes there): then the job is done again with that keyword set to
    the reason, and says so.

    Raises:
        ModelError: the worker had to be stopped or died (naming ``what``), also when
            done again without the whole-model run.
        Exception: whatever the job body raised.
    """
    from .errors import ModelError
    from .isolation import WorkerCrash, WorkerTimeout, run_isolated

    try:
        return run_isolated(impl, kwargs=kwargs, limit_s=limit, what=what)
    except WorkerTimeout:
        reason = (f"{what} did not finish within {limit:g} s and was stopped (raise --timeout if the model "
                  "is big; a hang in ONNX Runtime or onnx's reference evaluator also ends this way)")
    except WorkerCrash as e:
        reason = f"{what} crashed: {e}"
    if without_run is None or kwargs.get(without_run):
        raise ModelError(reason)
    print(f"warning: {reason}; done again without the whole-model reference run", file=sys.stderr)
    return in_worker(impl, what, limit, without_run=without_run, **{**kwargs, without_run: reason})


def _log(log_path: str | None, text: str) -> None:
    if not log_path:
        return
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")


@records_failure
def prepare_model_job(**kwargs) -> None:
    """Rule ``prepare_model``: :func:`_prepare_model_job` in a supervised worker
    (its whole-model reference run can hang or crash; :func:`in_worker`)."""
    from .limits import model_job_limit
    from .reference import DEFAULT_TIMEOUT_S

    in_worker(_prepare_model_job, "the model preparation", model_job_limit(kwargs.get("timeout_s") or DEFAULT_TIMEOUT_S),
              without_run="model_run_failed", **kwargs)


def _prepare_model_job(*, model: str, prepared: str, info_path: str, target_opset: int,
                      subgraph: tuple[str, str] | None = None, precision: dict | None = None,
                      model_inputs: str | None = None, input_settings: dict | None = None,
                      input_data: str | None = None, input_shapes: dict | None = None,
                      timeout_s: float | None = None, log: str | None = None,
                      model_run_failed: str | None = None) -> None:
    """Rule ``prepare_model``: load, check and prepare the user's model (in subgraph
    mode, ``subgraph`` = (from, to) names: the prepared model is that subgraph), with
    every tensor's shape and dtype completed (static inference, folding fed back, then
    a whole-model reference run for what is still unknown), and the model's input
    values written to ``model_inputs`` (:mod:`torq_gen_config.model_inputs`).

    ``precision``: ``auto_convert_bf16``, ``auto_convert_int32``, ``save_bf16_model``
    (a path, or empty) of the config (docs/precision.md). ``input_settings``: seed and
    ranges of generated values; ``input_data``: the user's model inputs (.npz);
    ``input_shapes``: name -> shape for symbolic dims (``--input-shapes``); the
    ``input_data`` arrays' shapes fill in the others. ``timeout_s``: budget of the
    whole-model run (seconds). ``model_run_failed``: why that run is skipped (it
    crashed or hung the worker in a first attempt; shapes then come from static
    inference alone, recorded in ``info["model_run"]["error"]``).

    Raises:
        ModelError: the model is missing, corrupt or unsupported, or the opset upgrade
            changed its signature (the job fails with that one-line message and
            writes nothing).
        ConfigError: an unknown subgraph name or a reversed range; bad input shapes.
    """
    import onnx

    from .fileio import write_bytes_if_changed
    from .model.prepare import load_model, prepare_model
    from .model_inputs import cast_to_model_inputs, input_data_shapes, model_input_values, save_model_inputs

    precision = precision or {}
    t0 = time.perf_counter()
    shapes = dict(input_shapes or {})
    sources = {name: "--input-shapes" for name in shapes}
    if input_data:
        for name, shp in input_data_shapes(input_data, load_model(model)).items():
            if name in shapes and list(shapes[name]) != shp:
                from .errors import ConfigError

                raise ConfigError(f"--input-shapes {name}:{'x'.join(map(str, shapes[name]))} and the --input-data "
                                  f"array of shape {'x'.join(map(str, shp))} disagree")
            if name not in shapes:
                shapes[name], sources[name] = shp, "--input-data"
    run_state: dict = {}

    notes: list[str] = []

    def observe(whole, *, want, unknown):
        feeds, source = model_input_values(whole, input_settings, input_data, notes)
        run_state.update(feeds=feeds, source=source)
        if model_run_failed:
            return {"types": {}, "info": {"ran": False, "inputs": source, "error": model_run_failed,
                                          "unknown_to_static_inference": unknown[:200]}}
        from .model_run import run_model_by_node, run_summary

        res = run_model_by_node(whole, feeds, timeout_s=timeout_s, keep=want)
        run_state["values"] = res.pop("values")
        types = res.pop("types")
        return {"types": types, "info": {"ran": True, "inputs": source, **run_summary(res),
                                         "unknown_to_static_inference": unknown[:200]}}

    from .precision.dtype_conversion import BF16_OPSET, convert_int64_to_int32, convert_to_bf16

    conversions = [(key, fn) for key, fn, on in (("bf16", convert_to_bf16, precision.get("auto_convert_bf16")),
                                                  ("int32", convert_int64_to_int32, precision.get("auto_convert_int32")))
                   if on]
    if conversions:  # bf16 and the int32 narrowing need opset 22 (precision.dtype_conversion)
        target_opset = max(target_opset, BF16_OPSET)
    m, info = prepare_model(model, target_opset=target_opset, subgraph=subgraph, conversions=conversions,
                            input_shapes=shapes, shape_sources=sources, observe=observe)
    data = m.SerializeToString(deterministic=True)
    write_bytes_if_changed(prepared, data)
    if model_inputs:
        feeds, source = run_state["feeds"], run_state["source"]
        if info.get("subgraph"):
            values = run_state.get("values") or {}
            missing = [t for t in info["subgraph"]["inputs"] if t not in values]
            feeds = {t: values[t] for t in info["subgraph"]["inputs"] if t in values}
            source = f"the subgraph inputs' values in a whole-model run on {source}"
            if missing:
                gen, _ = model_input_values(_only_inputs(m, missing), input_settings, None)
                feeds.update(gen)
                source += f"; generated for {', '.join(missing)} (the run gave no value)"
        save_model_inputs(model_inputs, cast_to_model_inputs(feeds, m), {"source": source})
        info["model_inputs"] = {"source": source, "notes": notes}
        for line in notes:
            print(f"note: {line}", file=sys.stderr)
    if precision.get("auto_convert_bf16") and precision.get("save_bf16_model"):
        from .fileio import atomic_write_bytes

        Path(precision["save_bf16_model"]).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(precision["save_bf16_model"], data)
        info["precision"]["bf16"]["saved_to"] = str(precision["save_bf16_model"])
        print(f"bf16 model saved to {precision['save_bf16_model']}", file=sys.stderr)
    for key, rep in (info.get("precision") or {}).items():
        print(precision_summary(key, rep), file=sys.stderr)
    info["onnx_version"] = onnx.__version__
    write_json(info_path, info)
    _log(log, f"prepared {model}: opset {info['opset']}, {len(info['fixed_dims'])} dims fixed, "
              f"{len(m.graph.node)} nodes, {time.perf_counter() - t0:.2f} s; shapes: "
              f"{ {k: len(v) for k, v in info['shapes'].items()} }; model run: {info.get('model_run')}; "
              f"warnings: {info['warnings']}")
    if info.get("subgraph"):
        sg = info["subgraph"]
        print(f"subgraph {sg['from']['layer_id']} (node {sg['from']['node_index']}) .. {sg['to']['layer_id']} "
              f"(node {sg['to']['node_index']}): {sg['num_nodes']} nodes, inputs {sg['inputs']}, "
              f"outputs {sg['outputs']}", file=sys.stderr)
    for line in shape_summary(info):
        print(line, file=sys.stderr)
    for w in info["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    for line in fixed_dims_lines(info["fixed_dims"]):
        print(line, file=sys.stderr)


def _only_inputs(model, names: list[str]):
    """A copy of ``model`` whose graph inputs are only ``names`` (to generate their values)."""
    from .model.graph import copy_proto

    m = copy_proto(model)
    keep = [copy_proto(vi) for vi in m.graph.input if vi.name in names]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    return m


def shape_summary(info: dict) -> list[str]:
    """Console lines about where the shapes came from (empty when static inference knew all)."""
    sh = info.get("shapes") or {}
    lines = []
    if sh.get("inferred_after_folding"):
        lines.append(f"shapes: {len(sh['inferred_after_folding'])} tensor shape(s) inferred after feeding folded "
                     "constants back into shape inference")
    if sh.get("observed"):
        lines.append(f"shapes: {len(sh['observed'])} tensor shape(s) taken from the whole-model reference run "
                     f"(static inference could not infer them): {', '.join(sh['observed'][:5])}"
                     f"{' ...' if len(sh['observed']) > 5 else ''}")
    run = info.get("model_run") or {}
    for f in run.get("failed_nodes") or []:
        lines.append(f"warning: the whole-model run could not evaluate {f['op_type']} node {f['name'] or f['graph_index']}"
                     f" ({'; '.join(f'{e}: {m}' for e, m in f['errors'].items())[:300]}); what depends on it has no value")
    if sh.get("unknown"):
        lines.append(f"warning: {len(sh['unknown'])} tensor(s) still have no known shape or dtype "
                     f"({', '.join(sh['unknown'][:5])}{' ...' if len(sh['unknown']) > 5 else ''}); the layers that "
                     "read or write them are not testable")
    return lines


def fixed_dims_lines(fixed: list[dict]) -> list[str]:
    """Console/report lines for the symbolic dims that were given values."""
    lines = []
    for d in fixed:
        to = d.get("to", 1)
        if d.get("source") not in (None, "default 1"):
            lines.append(f"note: input {d['input']} dim {d['axis']} ({d['was']}) set to {to} ({d['source']})")
        elif d["axis"] == 0:
            lines.append(f"note: input {d['input']} dim 0 ({d['was']}, the batch) fixed to {to}")
        else:
            lines.append(f"warning: input {d['input']} dim {d['axis']} ({d['was']}) is symbolic and was fixed to {to}; "
                         "layers may see degenerate shapes: give --input-shapes NAME:DIMS or export the model with "
                         "static shapes")
    return lines


def precision_summary(kind: str, report: dict) -> str:
    """One console line about a dtype conversion (``kind`` "bf16" or "int32")."""
    casts = report.get("casts_inserted", 0)
    if kind == "bf16":
        consts = report.get("constants") or []
        worst = max((c.get("max_abs_error") or 0.0 for c in consts), default=0.0)
        return (f"bf16 conversion: {len(consts)} constants narrowed (largest rounding error {worst:.3g}), "
                f"{casts} Casts inserted, {len(report.get('kept_wide') or [])} tensors kept fp32 by their op schema")
    clamped = report.get("clamped") or []
    return (f"int32 conversion: {len(clamped)} constants with INT64_MIN/MAX sentinels clamped, {casts} Casts inserted, "
            f"{len(report.get('kept_wide') or [])} tensors kept int64 by their op schema")


@records_failure
def import_full_model_job(*, prepared: str, mlir: str, locations: str, timeout_s: float | None = None,
                          log: str | None = None) -> None:
    """Rule ``import_full_model``: full-model MLIR and the node -> line:col map; the
    importer runs in a supervised worker (a hang or a crash is recorded as a failed
    import: the layers then get no ``mlir_location``)."""
    from .fileio import atomic_write_text
    from .isolation import WorkerCrash, WorkerTimeout, run_isolated
    from .limits import model_job_limit
    from .mlir.importer import import_full_model
    from .reference import DEFAULT_TIMEOUT_S

    limit = model_job_limit(timeout_s or DEFAULT_TIMEOUT_S, calls=1)
    try:
        res = run_isolated(import_full_model, (prepared, mlir), limit_s=limit, what="the full-model MLIR import")
    except (WorkerTimeout, WorkerCrash) as e:
        atomic_write_text(mlir, "")
        res = {"mlir_file": mlir, "status": "error", "message": str(e), "import_ms": None, "nodes": [],
               "n_unverified": None}
    res["mlir_file"] = os.path.basename(mlir)
    write_json(locations, res)
    _log(log, f"imported full model: {res['status']}, {len(res['nodes'])} nodes, "
              f"{res['n_unverified']} unverified; {res.get('message') or ''}")
    if res["status"] != "ok":
        print(f"warning: full-model MLIR import failed, layers get no mlir_location: {res['message'][:300]}", file=sys.stderr)


@records_failure
def split_layers_job(**kwargs) -> None:
    """Checkpoint ``split_layers``: :func:`_split_layers_job` in a supervised worker
    (:func:`in_worker`)."""
    from .limits import model_job_limit
    from .reference import DEFAULT_TIMEOUT_S

    in_worker(_split_layers_job, "the layer split and its whole-model run",
              model_job_limit(kwargs.get("timeout_s") or DEFAULT_TIMEOUT_S), without_run="model_run_failed",
              **kwargs)


def _split_layers_job(*, prepared: str, info_path: str, manifest: str, model_inputs: str | None = None,
                     layer_inputs: str = "propagate", timeout_s: float | None = None, log: str | None = None,
                     model_run_failed: str | None = None) -> None:
    """Checkpoint ``split_layers``: one ONNX model per layer plus the manifest, and with
    ``layer_inputs`` ``propagate`` (the default) the whole-model reference run on the
    model's input values (``model_inputs``) that writes each layer's ``inputs.npz``
    (:func:`~torq_gen_config.reference.propagate_layer_inputs`; its summary goes to
    ``manifest["layer_inputs"]``). One checkpoint for both: the layer files and their
    inputs are known together, and a rerun rewrites only the files that changed.
    ``model_run_failed``: why the whole-model run is skipped (it crashed or hung the
    worker in a first attempt); every layer then gets generated inputs and says why.

    Raises:
        ModelError: the model input values do not fit the model.
    """
    import onnx

    from .model.split import split_layers

    t0 = time.perf_counter()
    model = onnx.load(prepared)
    info = read_json(info_path, "preparation info")
    man = split_layers(model, info, Path(manifest).parent)
    _log(log, f"split into {len(man['layers'])} layers ({len(man['folded_nodes'])} constant nodes folded) "
              f"in {time.perf_counter() - t0:.2f} s")
    print(f"split: {len(man['layers'])} layers, {len(man['folded_nodes'])} constant nodes folded"
          + (f", {sum(1 for x in man['layers'] if x.get('not_testable'))} not testable (unknown tensor types)"
             if any(x.get("not_testable") for x in man["layers"]) else ""), file=sys.stderr)
    if layer_inputs == "propagate" and model_inputs:
        from .reference import propagate_layer_inputs

        res = propagate_layer_inputs(prepared, man, Path(manifest).parent, model_inputs, timeout_s=timeout_s,
                                     failed=model_run_failed)
        man["layer_inputs"] = res
        run = res["run"]
        _log(log, f"whole-model run on {res['model_inputs']}: {run['nodes_run']} nodes in {run['seconds']} s "
                  f"(engines {run['engines']}, peak {run['peak_live_bytes']} bytes live); {res['rewritten']} of "
                  f"{res['layers']} layer input files changed; {len(res['fallback'])} layer(s) fall back to "
                  f"generated inputs: {res['fallback']}")
        if run.get("error"):
            print(f"layer inputs: generated for all {len(res['fallback'])} layer(s) (the whole-model reference run "
                  f"failed: {run['error'][:300]})", file=sys.stderr)
        else:
            print(f"layer inputs: whole-model reference run on {res['model_inputs']} ({run['nodes_run']} nodes, "
                  f"{run['seconds']:.1f} s)" + (f"; {len(res['fallback'])} layer(s) get generated inputs (the run "
                                                "could not produce theirs)" if res["fallback"] else ""),
                  file=sys.stderr)
        for f in run["fallback_nodes"]:
            print(f"note: the whole-model run evaluated {f['op_type']} node {f['name'] or f['graph_index']} with the "
                  f"ONNX reference implementation (ONNX Runtime failed: {f['errors'].get('onnxruntime', '')[:200]})",
                  file=sys.stderr)
    write_json(manifest, man)


@records_failure
def reference_job(*, layer_onnx: str, reference: str, input_settings: dict, inputs_path: str | None = None,
                  calibration: str | None = None, engine: str = "onnxruntime", timeout_s: float | None = None,
                  log: str | None = None) -> None:
    """Rule ``layer_reference``: layer inputs (from ``inputs_path`` with ``layer_inputs:
    propagate``, else generated; with ``--quantize`` drawn in the calibrated ranges of
    ``calibration``, see :func:`quantized_input_ranges`) and the outputs of both
    reference engines, ``engine`` first (:func:`~torq_gen_config.reference.compute_reference`),
    each bounded by ``timeout_s`` seconds."""
    import traceback

    from .reference import compute_reference, save_npz

    try:
        input_ranges = None
        if calibration:
            input_ranges = quantized_input_ranges(layer_onnx, read_json(calibration, "calibration ranges")["ranges"])
        meta = compute_reference(layer_onnx, reference, input_settings, inputs_path=inputs_path,
                                 input_ranges=input_ranges, engine=engine, timeout_s=timeout_s)
    except Exception as e:  # one layer's failure never stops the others: its tests say why
        message = f"the reference job failed on this layer: {type(e).__name__}: {str(e)[:1000]}"
        meta = {"status": "error", "message": message, "engine": engine, "input_names": [], "output_names": [],
                "inputs_missing": True, "layer_inputs": None, "second": {}, "engines_agreement": None}
        save_npz(reference, {}, meta)
        _log(log, f"{message}\n{traceback.format_exc()}")
    second = meta.get("second") or {}
    record_timeout(reference, "timeout" in (meta.get("status"), second.get("status")), timeout_s)
    _log(log, f"reference {meta['engine']} {meta['status']} ({meta.get('run_ms')} ms) {meta.get('message') or ''}; "
              f"second {second.get('engine')} {second.get('status')} ({second.get('run_ms')} ms) "
              f"{second.get('message') or ''}; inputs: {meta.get('layer_inputs')}")


@records_failure
def import_layer_job(*, layer_onnx: str, mlir: str, status: str, timeout_s: float | None = None,
                     log: str | None = None) -> None:
    """Rule ``import_layer``: the layer's MLIR, imported in a supervised worker. An
    importer failure, hang or crash is recorded in ``status`` (``"stage"``: import,
    timeout or crash), not raised: the layer's tests report it and the others go on."""
    from .fileio import atomic_write_text
    from .isolation import WorkerCrash, WorkerTimeout, run_isolated
    from .limits import call_limit
    from .mlir.importer import import_layer
    from .reference import DEFAULT_TIMEOUT_S

    try:
        res = run_isolated(import_layer, (layer_onnx, mlir), limit_s=call_limit(timeout_s or DEFAULT_TIMEOUT_S),
                           what="the MLIR import of the layer")
        res.setdefault("stage", "import" if res["status"] != "ok" else None)
    except (WorkerTimeout, WorkerCrash) as e:
        atomic_write_text(mlir, "")
        res = {"status": "error", "stage": "timeout" if isinstance(e, WorkerTimeout) else "crash",
               "message": str(e), "import_ms": None}
    write_json(status, res)
    record_timeout(status, res.get("stage") == "timeout", timeout_s)
    _log(log, f"import {res['status']} ({res['import_ms']} ms) {res.get('message') or ''}")


@records_failure
def test_layer_job(*, layer: dict, executor: dict, layer_onnx: str, reference: str, mlir: str | None,
                   import_status: str | None, result: str, tolerance: dict, timeout_s: float,
                   log: str | None = None, log_file: str | None = None, verbose: bool = False,
                   earlier_results: list[str] = (), timing: dict | None = None) -> None:
    """Rule ``test_layer``: compile, run and compare one layer on one executor.

    The console gets one line per job; ``log_file`` (optional) receives the job's
    full log (tool command lines and output), appended under a file lock;
    ``verbose`` also prints the full failure message. ``earlier_results`` (skip
    mode) are the result files of the higher-priority executors of the same layer:
    if one of them is a success, this executor is recorded as ``skipped`` without
    compiling anything. ``timing`` (``{"runs", "warmup"}`` or None; the workflow's
    ``collect_timing``) also measures the runtime after a run that produced outputs
    (see :func:`~torq_gen_config.layer_test.run_layer_test`).
    """
    import traceback

    from .layer_test import error_result, one_line_summary

    try:
        _test_layer_job(layer=layer, executor=executor, layer_onnx=layer_onnx, reference=reference, mlir=mlir,
                        import_status=import_status, result=result, tolerance=tolerance, timeout_s=timeout_s,
                        log=log, log_file=log_file, verbose=verbose, earlier_results=earlier_results, timing=timing)
    except Exception as e:  # a bug on one layer must not stop the others (nor the report)
        message = f"torq-gen-config failed on this layer: {type(e).__name__}: {e}\n{traceback.format_exc()}"
        res = error_result(layer=layer, executor=executor, stage="internal", message=message, result_path=result,
                           tolerance=tolerance)
        _log(log, message)
        sys.stdout.write(one_line_summary(res) + "\n")


def _test_layer_job(*, layer: dict, executor: dict, layer_onnx: str, reference: str, mlir: str | None,
                    import_status: str | None, result: str, tolerance: dict, timeout_s: float, log: str | None,
                    log_file: str | None, verbose: bool, earlier_results: list[str], timing: dict | None) -> None:
    from .layer_test import one_line_summary, run_layer_test, skipped_result

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
    failed = quantize_failure(layer_onnx)
    if failed:
        from .layer_test import error_result

        res = error_result(layer=layer, executor=executor, stage="quantize", message=failed, result_path=result,
                           tolerance=tolerance)
        sys.stdout.write(one_line_summary(res) + "\n")
        return
    res = run_layer_test(layer=layer, executor=executor, layer_onnx=layer_onnx, reference_npz=reference,
                         layer_mlir=mlir, import_status=import_status, work_dir=str(Path(result).parent),
                         result_path=result, log_path=log, tolerance=tolerance, timeout_s=timeout_s,
                         timing=timing)
    record_timeout(result, (res.get("failure_report") or {}).get("stage") == "timeout", timeout_s)
    # one write per line: jobs are threads, and print() writes text and newline separately
    text = one_line_summary(res) + "\n"
    if verbose and res.get("failure_report"):
        text += res["failure_report"]["message"].rstrip() + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    if log_file and log:
        append_to_shared_log(log_file, f"{res['layer_id']} on {res['executor']}", Path(log).read_text())


#: File next to a result.json that was written as "skipped" (skip mode).
SKIPPED_MARKER = ".skipped"
_RERUN_MARKER = ".rerun"


def was_skipped(result_dir: str) -> bool:
    """True when the result in ``result_dir`` is a skip-mode "skipped" placeholder."""
    return os.path.exists(os.path.join(result_dir, SKIPPED_MARKER))


def mark_for_rerun(result_dir: str) -> str:
    """Return a marker file newer than the result in ``result_dir`` (touching it when
    needed), used as an extra input so that Snakemake reruns that job: a verdict
    skipped in skip mode is produced by the next run without skip mode."""
    return _newer_marker(os.path.join(result_dir, "result.json"), os.path.join(result_dir, _RERUN_MARKER))


#: Suffix of the file beside a job's output when that output records a timeout: it
#: holds the limit (s) in force, so that a run with a larger ``--timeout`` redoes the
#: job instead of keeping a verdict a longer limit might change.
TIMED_OUT_SUFFIX = ".timed-out"


def record_timeout(output: str, timed_out: bool, timeout_s: float | None) -> None:
    """Write (``timed_out``) or remove the timeout record of ``output`` (see
    :data:`TIMED_OUT_SUFFIX`); ``timeout_s`` in seconds (None: the default limit)."""
    from .reference import DEFAULT_TIMEOUT_S

    record = Path(output + TIMED_OUT_SUFFIX)
    if timed_out:
        record.write_text(f"{float(timeout_s or DEFAULT_TIMEOUT_S):g}\n")
    else:
        record.unlink(missing_ok=True)


def rerun_after_timeout(output: str, timeout_s: float | None) -> str | None:
    """A marker input that reruns the job of ``output`` when that output records a
    timeout under a smaller limit than ``timeout_s`` (seconds) now; None otherwise.
    A stat per output when nothing timed out."""
    from .reference import DEFAULT_TIMEOUT_S

    record = output + TIMED_OUT_SUFFIX
    try:
        limit = float(Path(record).read_text().strip())
    except (OSError, ValueError):
        return None
    if limit >= float(timeout_s or DEFAULT_TIMEOUT_S):
        return None
    return _newer_marker(output, output + _RERUN_MARKER)


def _newer_marker(output: str, marker: str) -> str:
    """``marker``, touched when needed so that it is newer than ``output``."""
    result = output
    try:
        if os.stat(marker).st_mtime_ns > os.stat(result).st_mtime_ns:
            return marker
    except FileNotFoundError:
        pass
    Path(marker).touch()
    if os.path.exists(result) and os.stat(marker).st_mtime_ns <= os.stat(result).st_mtime_ns:
        st = os.stat(result)
        os.utime(marker, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    return marker


def append_to_shared_log(log_file: str, title: str, text: str) -> None:
    """Append one job's log to a file shared by all jobs (``--log-file``), under a lock."""
    from filelock import FileLock

    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with FileLock(log_file + ".lock"):
        with open(log_file, "a", encoding="utf-8") as f:
            f.write(f"\n##### {title} #####\n{text}")


@records_failure
def aggregate_job(*, model_name: str, manifest: str, prepare_info: str, locations: str, results_root: str,
                  executors: list[dict], tolerance: dict, options: dict, report: str, compiler: str,
                  output_dir: str, skip_ops: list[str] = (), dedup_layers: bool = False,
                  user_choices: str | None = None, recommend_by_timing: bool = False,
                  quantized_manifest: str | None = None, quantize_info: str | None = None,
                  log: str | None = None) -> dict:
    """Rule ``aggregate_report``: recommendation per layer, report JSON and compiler JSON.

    Statuses are re-derived from the stored metrics with the current ``tolerance``,
    so a tolerance change needs no recompile. With ``dedup_layers``, a layer whose
    signature was seen before copies the verdicts of that first layer and is marked
    ``duplicate_of`` in the report. ``recommend_by_timing`` recommends the fastest
    success (else the fastest difference) by measured runtime median, falling back
    to priority order where no runtime was measured (see
    :func:`~torq_gen_config.report.recommend.recommend_with_reason`).

    With ``--quantize``, ``quantized_manifest`` (the layers mapped onto the quantized
    model, whose MLIR ``locations`` describes) gives each layer its ``line:col``; a
    layer fused away in the quantized model has none (so it is left out of the
    compiler JSON) and a note says why; ``quantize_info`` (the whole model's
    quantization) goes into the report's ``precision`` section with the flags and
    the bf16/int32 conversion reports of the preparation.
    """
    from . import __version__
    from .mlir.importer import layer_location
    from .report.build import build_compiler_json, build_report

    man = read_json(manifest, "layer manifest")
    info = read_json(prepare_info, "preparation info")
    locs = read_json(locations, "MLIR locations")
    names = [e["name"] for e in executors]
    skip = {op.lower() for op in skip_ops}
    qlayers = {}
    if quantized_manifest:
        qlayers = {l["layer_id"]: l for l in read_json(quantized_manifest, "quantized layer map")["layers"]}
    layers, results = [], {}
    first_of: dict[str, str] = {}  # signature -> layer ID tested for it (dedup)
    duplicate_of: dict[str, str] = {}
    for layer in man["layers"]:
        skipped = layer["op_type"].lower() in skip
        layers.append({
            "layer_id": layer["layer_id"], "slug": layer["slug"], "op_type": layer["op_type"],
            "node_index": layer["node_index"],
            "mlir_location": layer_location(qlayers.get(layer["layer_id"], layer) if quantized_manifest else layer, locs),
            "mac_count": layer.get("mac_count"),
            "skipped_reason": f"op type {layer['op_type']} skipped (skip_ops)" if skipped else None,
            "not_testable": None if skipped else layer.get("not_testable"),
        })
        if skipped or layer.get("not_testable"):
            results[layer["layer_id"]] = {}
            continue
        if dedup_layers and layer["signature"] in first_of:
            src = first_of[layer["signature"]]
            duplicate_of[layer["layer_id"]] = src
            results[layer["layer_id"]] = {n: {**r, "duplicate_of": src} for n, r in results[src].items()}
            continue
        first_of[layer["signature"]] = layer["layer_id"]
        per = {}
        for name in names:
            p = Path(results_root) / layer["slug"] / name / "result.json"
            if p.exists():
                per[name] = json.loads(p.read_text())
        results[layer["layer_id"]] = per
    mlir_file = os.path.relpath(Path(locations).parent / locs["mlir_file"], output_dir) if locs.get("status") == "ok" else None
    provenance = build_provenance(info=info, locations=locs, executors=executors, options=options,
                                  tool_version=__version__, results=results)
    if man.get("layer_inputs"):  # the whole-model run that gave the layers their inputs
        provenance["layer_inputs_run"] = man["layer_inputs"]
    previous = read_json(user_choices, "user choices") if user_choices and Path(user_choices).exists() else None
    rep = build_report(model_name=model_name, layers=layers, results=results, executors=executors,
                       default_tolerance=tolerance, mlir_file=mlir_file, provenance=provenance,
                       previous_report=previous, recommend_by_timing=recommend_by_timing)
    for lid, src in duplicate_of.items():
        rep["ops"][lid]["duplicate_of"] = src
    rep["precision"] = precision_section(options, info, quantize_info, Path(results_root))
    rep["folded_nodes"] = man.get("folded_nodes") or []  # constant nodes: values of the layers, not layers
    for layer in man["layers"]:
        q = qlayers.get(layer["layer_id"])
        if q is not None:
            op = rep["ops"][layer["layer_id"]]
            op["quantized_op_type"] = q.get("quantized_op_type")
            if q.get("quantized_note"):
                op["note"] = q["quantized_note"]
    if info.get("subgraph"):  # subgraph mode: the range, in the user's model, and where its files are
        rep["subgraph"] = {**info["subgraph"],
                           "work_dir": os.path.relpath(Path(prepare_info).parent, output_dir).replace(os.sep, "/")}
    rep["discovery_report"]["summary"]["distinct_layers_tested"] = (
        len(first_of) if dedup_layers else sum(1 for per in results.values() if per))
    if duplicate_of or rep["folded_nodes"]:  # the text shows copied verdicts and folded nodes
        from .report.text import render_final_report_text

        rep["final_report_text"] = render_final_report_text(rep)
    write_json(report, rep)
    write_json(compiler, build_compiler_json(rep))
    _log(log, f"report written: {report}")
    return rep


def precision_section(options: dict, prepare_info: dict, quantize_info: str | None, layers_dir: Path) -> dict:
    """The report's ``precision`` section: the flags discovery used (``run`` checks
    them, docs/precision.md), the bf16/int32 conversion reports (per narrowed
    constant: values, max_abs_error, mean_abs_error, rmse, max_rel_error; clamped
    INT64_MIN/MAX sentinels), and with ``--quantize`` the whole model's quantization
    info and the layers that needed Q/DQ pairs on their I/O."""
    from .config import PRECISION_KEYS

    section: dict = {"flags": {k: options.get(k) for k in PRECISION_KEYS}}
    conv = prepare_info.get("precision") or {}
    if "bf16" in conv:
        section["bf16_conversion"] = conv["bf16"]
    if "int32" in conv:
        section["int32_conversion"] = conv["int32"]
    if quantize_info:
        section["quantization"] = read_json(quantize_info, "quantization info")
        wrapped, failed = [], {}
        for p in sorted(layers_dir.glob("*/quantize.json")):
            q = read_json(str(p), "layer quantization info")
            if q.get("wrapped_io"):
                wrapped.append(p.parent.name)
            if q.get("status") == "error":
                failed[p.parent.name] = q.get("message")
        section["layers_with_wrapped_io"] = wrapped
        section["layers_not_quantized"] = failed
    return section


def build_provenance(*, info: dict, locations: dict, executors: list[dict], options: dict, tool_version: str,
                     results: dict) -> dict:
    """Versions, options and inputs that produced a report (JSON-safe)."""
    import platform

    versions = {"torq-gen-config": tool_version, "python": platform.python_version()}
    for mod in ("onnx", "onnxruntime", "numpy", "snakemake"):
        versions[mod] = _module_version(mod)
    versions["iree-base-compiler"] = _dist_version("iree-base-compiler")
    versions["iree-base-runtime"] = _dist_version("iree-base-runtime")
    ref_versions = sorted({(r.get("reference") or {}).get("ort_version") for per in results.values()
                           for r in per.values() if (r.get("reference") or {}).get("ort_version")})
    tools = {}
    for per in results.values():
        for name, r in per.items():
            if name not in tools and r.get("tool"):
                tools[name] = r["tool"]
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions,
        "reference": {"engine": options.get("reference") or "onnxruntime",
                      "second_opinion": "onnx" if (options.get("reference") or "onnxruntime") == "onnxruntime"
                      else "onnxruntime",
                      "execution_provider": "CPUExecutionProvider",
                      "graph_optimization_level": "disabled", "ort_versions": ref_versions,
                      "onnx_version": versions.get("onnx")},
        "executors": executors,
        "executor_tools": tools,
        "options": options,
        "model": {"source": info.get("source"), "sha256": _model_digest(info.get("source")),
                  "opset": info.get("opset"), "fixed_dims": info.get("fixed_dims"),
                  "warnings": info.get("warnings"), "shapes": info.get("shapes"),
                  "model_inputs": info.get("model_inputs"), "model_run": info.get("model_run")},
        "mlir": {"status": locations.get("status"), "message": locations.get("message"),
                 "unverified_nodes": locations.get("n_unverified")},
    }


def _model_digest(path: str | None) -> str | None:
    from .report.staleness import model_digest

    return model_digest(path) if path else None


def _module_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


_dist_version = _module_version


# ----------------------------------------------------------------------------
# --quantize (rules/quantize.smk; docs/precision.md)


@records_failure
def calibrate_job(*, timeout_s: float | None = None, **kwargs) -> None:
    """:func:`_calibrate_job` in a supervised worker (ONNX Runtime runs the model; :func:`in_worker`)."""
    from .limits import model_job_limit
    from .reference import DEFAULT_TIMEOUT_S

    in_worker(_calibrate_job, "the calibration", model_job_limit(timeout_s or DEFAULT_TIMEOUT_S), **kwargs)


def _calibrate_job(*, prepared: str, ranges: str, samples: int, seed: int, float_range: list[float],
                  data: str | None = None, log: str | None = None) -> None:
    """Rule ``calibrate_model``: the calibration samples (``data`` .npz, else ``samples``
    seeded random ones in ``float_range``) run through the FP32 prepared model in
    ONNX Runtime; the min/max of every float tensor go to ``ranges`` (JSON). Each
    layer is quantized with these ranges on its I/O, so it gets the scales it has in
    the whole model.

    Raises:
        QuantizationError: bad calibration data, or ONNX Runtime cannot run the model.
    """
    import onnx

    from .precision.quantization import calibration_samples, tensor_ranges

    t0 = time.perf_counter()
    model = onnx.load(prepared)
    data_samples = calibration_samples(model, n=samples, seed=seed, float_range=tuple(float_range), data_path=data)
    rng = tensor_ranges(model, data_samples)
    write_json(ranges, {"source": data or "random", "samples": len(data_samples), "seed": None if data else seed,
                        "float_range": None if data else list(float_range), "ranges": rng})
    _log(log, f"calibrated {len(rng)} tensors on {len(data_samples)} samples ({data or 'random'}) "
              f"in {time.perf_counter() - t0:.2f} s")
    print(f"calibration: {len(data_samples)} samples ({data or 'seeded random'}), {len(rng)} tensors", file=sys.stderr)


def _quantize_settings(settings: dict) -> dict:
    return {"quant_format": settings["quant_format"], "per_channel": bool(settings["per_channel"]),
            "full_integer": bool(settings["full_integer"])}


@records_failure
def quantize_full_model_job(*, timeout_s: float | None = None, **kwargs) -> None:
    """:func:`_quantize_full_model_job` in a supervised worker (ONNX Runtime runs the model; :func:`in_worker`)."""
    from .limits import model_job_limit
    from .reference import DEFAULT_TIMEOUT_S

    in_worker(_quantize_full_model_job, "the quantization of the full model", model_job_limit(timeout_s or DEFAULT_TIMEOUT_S), **kwargs)


def _quantize_full_model_job(*, prepared: str, ranges: str, quantized: str, info: str, settings: dict,
                            samples: int, seed: int, float_range: list[float], data: str | None = None,
                            log: str | None = None) -> None:
    """Rule ``quantize_full_model``: the whole FP32 prepared model quantized once
    (``settings``: quant_format, per_channel, full_integer), calibrated on the same
    samples as :func:`calibrate_job` with the ranges of ``ranges`` (so the layers,
    quantized one by one with those ranges, have the same scales).

    Raises:
        QuantizationError: quantization failed (the run stops with the reason; the
            original tool silently fell back to the float model).
    """
    import onnx

    from .fileio import write_bytes_if_changed
    from .precision.quantization import calibration_samples, quantize_model

    t0 = time.perf_counter()
    model = onnx.load(prepared)
    rng = read_json(ranges, "calibration ranges")["ranges"]
    data_samples = calibration_samples(model, n=samples, seed=seed, float_range=tuple(float_range), data_path=data)
    qmodel, qinfo = quantize_model(model, ranges=rng, samples=data_samples, **_quantize_settings(settings))
    write_bytes_if_changed(quantized, qmodel.SerializeToString(deterministic=True))
    from .precision.layer_mapping import quantized_tensor_names

    qinfo["quantized_tensors"] = quantized_tensor_names(qmodel)
    qinfo["quantize_s"] = round(time.perf_counter() - t0, 3)
    write_json(info, qinfo)
    _log(log, f"quantized the full model: {qinfo}")
    print(f"quantized the full model ({qinfo.get('format_used')}, {qinfo.get('quantized_nodes')} quantized nodes) in "
          f"{qinfo['quantize_s']:.1f} s", file=sys.stderr)
    for w in qinfo.get("warnings") or []:
        print(f"warning: {w}", file=sys.stderr)


@records_failure
def quantize_layer_job(*, timeout_s: float | None = None, **kwargs) -> None:
    """:func:`_quantize_layer_job` in a supervised worker; a hang or a crash of the
    quantizer is recorded like a failed quantization (the layer's tests report it at
    stage ``quantize``, the other layers go on)."""
    from .fileio import write_bytes_if_changed
    from .isolation import WorkerCrash, WorkerTimeout, run_isolated
    from .limits import call_limit
    from .reference import DEFAULT_TIMEOUT_S

    try:
        run_isolated(_quantize_layer_job, kwargs=kwargs, limit_s=call_limit(timeout_s or DEFAULT_TIMEOUT_S),
                     what="the quantization of the layer")
    except (WorkerTimeout, WorkerCrash) as e:
        write_bytes_if_changed(kwargs["quantized"], Path(kwargs["layer_onnx"]).read_bytes())
        write_json(kwargs["info"], {"status": "error", "message": str(e), "quant_format": None})
        _log(kwargs.get("log"), f"quantization of {kwargs['layer_onnx']} stopped: {e}")


def _quantize_layer_job(*, layer_onnx: str, ranges: str, quantized: str, info: str, settings: dict,
                       full_model_info: str | None = None, log: str | None = None) -> None:
    """Rule ``quantize_layer``: one FP32 layer model quantized on its own with the
    whole model's calibration ranges on its inputs and outputs, in the format the
    whole model got (``full_model_info``'s ``format_used``: with ``hybrid`` the
    choice is made once, for the model); float32 I/O that ONNX Runtime leaves float
    when the op is alone (a lone Relu, MaxPool, ...) get QuantizeLinear /
    DequantizeLinear pairs where the whole model holds that tensor quantized
    (``quantized_tensors`` of ``full_model_info``), and stay float where it does not.

    A layer that cannot be quantized does not stop the others: ``info`` gets
    ``status: error`` and the reason, ``quantized`` holds the FP32 layer, and the
    layer's tests record an ``error`` verdict at stage ``quantize``
    (:func:`quantize_failure`).
    """
    import onnx

    from .fileio import write_bytes_if_changed
    from .precision.quantization import QuantizationError, quantize_model

    t0 = time.perf_counter()
    model = onnx.load(layer_onnx)
    rng = read_json(ranges, "calibration ranges")["ranges"]
    qsettings = _quantize_settings(settings)
    wrap_only = None
    if full_model_info:
        full = read_json(full_model_info, "quantization info")
        qsettings["quant_format"] = full.get("format_used") or qsettings["quant_format"]
        if full.get("quantized_tensors") is not None:
            wrap_only = set(full["quantized_tensors"])
    try:
        qmodel, qinfo = quantize_model(model, ranges=rng, samples=None, wrap_unquantized_io=True,
                                       wrap_only=wrap_only, **qsettings)
    except QuantizationError as e:
        write_bytes_if_changed(quantized, model.SerializeToString(deterministic=True))
        write_json(info, {"status": "error", "message": str(e), "quant_format": qsettings["quant_format"]})
        _log(log, f"quantization of {layer_onnx} failed: {e}")
        print(f"warning: layer {Path(layer_onnx).parent.name} could not be quantized: {e}", file=sys.stderr)
        return
    qinfo["status"] = "ok"
    write_bytes_if_changed(quantized, qmodel.SerializeToString(deterministic=True))
    qinfo["quantize_s"] = round(time.perf_counter() - t0, 3)
    write_json(info, qinfo)
    _log(log, f"quantized layer {layer_onnx}: {qinfo}")


def quantize_failure(layer_onnx: str) -> str | None:
    """The reason a layer could not be quantized (``quantize.json`` next to its
    quantized model says ``status: error``), or None."""
    p = Path(layer_onnx).parent / "quantize.json"
    if Path(layer_onnx).name != "quantized.onnx" or not p.exists():
        return None
    q = read_json(str(p), "layer quantization info")
    return q.get("message") or "quantization failed" if q.get("status") == "error" else None


@records_failure
def map_quantized_layers_job(*, manifest: str, quantized: str, mapped: str, log: str | None = None) -> None:
    """Rule ``map_quantized_layers``: the layers mapped onto the quantized model's
    nodes (:func:`torq_gen_config.precision.layer_mapping.map_layers_to_quantized`)."""
    import onnx

    from .precision.layer_mapping import map_layers_to_quantized, mapping_summary

    man = read_json(manifest, "layer manifest")
    out = map_layers_to_quantized(man, onnx.load(quantized))
    write_json(mapped, out)
    text = mapping_summary(out)
    _log(log, text)
    print(text, file=sys.stderr)


def quantized_input_ranges(layer_onnx: str, ranges: dict) -> dict[str, list[float]]:
    """Per input of a quantized layer model, the range its test inputs are drawn from:
    a float input its calibrated [min, max] (so values are not saturated, unlike the
    original tool's (-40, 40) inputs against a [-1, 1) calibration), an int8/uint8
    input (``--full-integer``) all values of its type."""
    import onnx

    out = {}
    for vi in onnx.load(layer_onnx, load_external_data=False).graph.input:
        et = vi.type.tensor_type.elem_type
        if et == onnx.TensorProto.INT8:
            out[vi.name] = [-128, 128]
        elif et == onnx.TensorProto.UINT8:
            out[vi.name] = [0, 256]
        elif vi.name in ranges:
            lo, hi = (float(x) for x in ranges[vi.name])
            if hi <= lo:
                hi = lo + 1e-3
            out[vi.name] = [lo, hi]
    return out
