"""Jobs of rules/split.smk: split the model into layers (checkpoint, with each layer's
inputs from the whole-model run), each layer's reference outputs and MLIR import."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..fileio import atomic_write_text, read_json, write_json
from ..job_support import _log, in_worker, records_failure
from ..layout import mark_outdated
from .markers import TIMED_OUT_SUFFIX, consume_rerun_marker, record_timeout
from .quantize import quantized_input_ranges
from ..limits import DEFAULT_TIMEOUT_S, NOTE_CHARS, call_limit, model_job_limit

@records_failure
def split_layers_job(**kwargs) -> None:
    """Checkpoint ``split_layers``: :func:`_split_layers_job` in a supervised worker
    (:func:`in_worker`)."""

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

    from ..model.split import split_layers

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
        from ..reference import propagate_layer_inputs

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
                  f"ONNX reference implementation (ONNX Runtime failed: {f['errors'].get('onnxruntime', '')[:NOTE_CHARS]})",
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

    from ..reference import compute_reference, save_npz

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
    from ..isolation import WorkerCrash, WorkerTimeout, run_isolated
    from ..mlir.importer import import_layer

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


def split_layers(input, output, params, log) -> None:
    """Checkpoint ``split_layers``: the manifest, the layer models and (``layer_inputs``:
    propagate) their inputs (:func:`split_layers_job`)."""
    mark_outdated(params.outdated)
    split_layers_job(prepared=input.model, info_path=input.info, manifest=output.manifest,
                     model_inputs=input.model_inputs, layer_inputs=params.layer_inputs,
                     timeout_s=params.timeout_s.value, log=log[0])


def layer_reference(input, output, params, log) -> None:
    """Rule ``layer_reference``: the layer's inputs and reference outputs (:func:`reference_job`);
    param ``rerun``: see :func:`~torq_gen_config.steps.markers.timeout_rerun_token`."""
    mark_outdated(params.outdated)
    consume_rerun_marker(output.reference + TIMED_OUT_SUFFIX, params.rerun)
    reference_job(layer_onnx=input.model, reference=output.reference, input_settings=params.inputs,
                  inputs_path=input.get("inputs"), calibration=input.get("calibration"), engine=params.engine,
                  timeout_s=params.timeout_s.value, log=log[0])


def import_layer(input, output, params, log) -> None:
    """Rule ``import_layer``: the layer's MLIR and import status (:func:`import_layer_job`);
    param ``rerun``: see :func:`~torq_gen_config.steps.markers.timeout_rerun_token`."""
    mark_outdated(params.outdated)
    consume_rerun_marker(output.status + TIMED_OUT_SUFFIX, params.rerun)
    import_layer_job(layer_onnx=input.model, mlir=output.mlir, status=output.status,
                     timeout_s=params.timeout_s.value, log=log[0])
