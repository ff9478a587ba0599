"""Jobs of rules/split.smk: split the model into layers (checkpoint, with each layer's
inputs from the whole-model run), then per unit of layers (:mod:`.units`) each
layer's quantized model (``--quantize``), reference outputs and MLIR import."""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from ...core.errors import DamagedWorkFile
from ...core.fileio import atomic_write_text, read_json, write_json
from ...core.isolation import WorkerCrash, WorkerTimeout, run_isolated
from ...core.job_support import in_worker, records_failure
from ...core.layout import (IMPORT_FILE, LAYER_INPUTS_FILE, LAYER_REFERENCE_FILE, MLIR_FILE, MODEL_FILE, QUANTIZE_INFO_FILE,
                            QUANTIZED_MODEL_FILE, VALUES_DIR)
from ...core.logs import append_record, fold_log
from ...core.progress import job_verdict
from ...core.statuses import NOT_TESTED
from ...mlir.importer import import_layer
from ...model import split as model_split
from ...reference import compute_reference, propagate_layer_inputs
from ..markers import TIMED_OUT_SUFFIX, consume_marker, record_timeout, timed_out_under_smaller
from .quantize import quantize_layer_job, quantized_input_ranges
from ..units import drop_key, file_identity, is_current, make_key, record_key, unit_key_file
from ...core.limits import DEFAULT_TIMEOUT_S, NOTE_CHARS, call_limit, model_job_limit
from ...core.external_data import load_model
from ...core.value_store import ValueStore, write_record
from ...core.weight_store import FOLDED_FILE
from . import step

@records_failure
def split_layers_job(**kwargs) -> None:
    """Checkpoint ``split_layers``: :func:`_split_layers_job` in a supervised worker
    (:func:`in_worker`)."""

    not_testable = in_worker(_split_layers_job, "the layer split and its whole-model run",
                             model_job_limit(kwargs.get("timeout_s") or DEFAULT_TIMEOUT_S),
                             without_run="model_run_failed", **kwargs)
    if not_testable:  # the closing line's counts include them (core.progress)
        n, total = not_testable
        job_verdict(NOT_TESTED, f"not tested: {n} of {total} layers are not testable (unknown tensor types; the "
                                "report's NOT TESTABLE section says why each)", count=n)


def _split_layers_job(*, prepared: str, info_path: str, manifest: str, model_inputs: str | None = None,
                     layer_inputs: str = "propagate", timeout_s: float | None = None, log: str | None = None,
                     model_run_failed: str | None = None) -> tuple[int, int] | None:
    """Checkpoint ``split_layers``: one ONNX model per layer plus the manifest, and with
    ``layer_inputs`` ``propagate`` (the default) the whole-model reference run on the
    model's input values (``model_inputs``) that stores each layer's input values once
    (``values/``) and writes its ``inputs.json``
    (:func:`~torq_gen_config.reference.propagate_layer_inputs`; its summary goes to
    ``manifest["layer_inputs"]``). One checkpoint for both: the layer files and their
    inputs are known together, and a rerun rewrites only the files that changed.
    ``model_run_failed``: why the whole-model run is skipped (it crashed or hung the
    worker in a first attempt); every layer then gets generated inputs and says why.

    Returns:
        ``(not testable layers, layers)`` when a layer is not testable, else None.

    Raises:
        ModelError: the model input values do not fit the model.
    """
    t0 = time.perf_counter()
    model = load_model(prepared, weights=False)  # the weights stay in the store: layers refer to them
    info = read_json(info_path, "preparation info")
    man = model_split.split_layers(model, info, Path(manifest).parent, folded_store=Path(prepared).parent / FOLDED_FILE)
    append_record(log, f"split into {len(man['layers'])} layers ({len(man['folded_nodes'])} constant nodes folded) "
                       f"in {time.perf_counter() - t0:.2f} s")
    print(f"split: {len(man['layers'])} layers, {len(man['folded_nodes'])} constant nodes folded"
          + (f", {sum(1 for x in man['layers'] if x.get('not_testable'))} not testable (unknown tensor types)"
             if any(x.get("not_testable") for x in man["layers"]) else ""), file=sys.stderr)
    if layer_inputs == "propagate" and model_inputs:
        res = propagate_layer_inputs(prepared, man, Path(manifest).parent, model_inputs,
                                     values_dir=Path(prepared).parent / VALUES_DIR, timeout_s=timeout_s,
                                     failed=model_run_failed)
        man["layer_inputs"] = res
        run = res["run"]
        append_record(log, f"whole-model run on {res['model_inputs']}: {run['nodes_run']} nodes in "
                           f"{run['seconds']} s (engines {run['engines']}, peak {run['peak_live_bytes']} bytes live); "
                           f"{res['rewritten']} of {res['layers']} layer input files changed; "
                           f"{len(res['fallback'])} layer(s) fall back to generated inputs: {res['fallback']}")
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
    not_testable = sum(1 for x in man["layers"] if x.get("not_testable"))
    return (not_testable, len(man["layers"])) if not_testable else None


@records_failure
def reference_job(*, layer_onnx: str, reference: str, values_dir: str, input_settings: dict,
                  inputs_path: str | None = None, calibration: str | None = None, engine: str = "onnxruntime",
                  timeout_s: float | None = None, tolerance: dict | None = None, log: str | None = None) -> None:
    """Step ``layer_reference`` of rule ``prepare_unit``: layer inputs (from ``inputs_path`` with ``layer_inputs:
    propagate``, else generated; with ``--quantize`` drawn in the calibrated ranges of
    ``calibration``, see :func:`quantized_input_ranges`) and the outputs of both
    reference engines, ``engine`` first (:func:`~torq_gen_config.reference.compute_reference`),
    each bounded by ``timeout_s`` seconds: ``reference`` (``reference.json``) records them
    as values of the store in ``values_dir``, the second engine's outputs only where the
    engines disagree at ``tolerance``."""
    try:
        input_ranges = None
        if calibration:
            input_ranges = quantized_input_ranges(layer_onnx, read_json(calibration, "calibration ranges")["ranges"])
        meta = compute_reference(layer_onnx, reference, input_settings, inputs_path=inputs_path,
                                 input_ranges=input_ranges, engine=engine, timeout_s=timeout_s,
                                 values_dir=values_dir, tolerance=tolerance)
    except DamagedWorkFile:
        raise  # a work file outside this layer's reach (a value of the whole-model run): not its reference's fault
    except Exception as e:  # one layer's failure never stops the others: its tests say why
        message = f"the reference job failed on this layer: {type(e).__name__}: {str(e)[:1000]}"
        meta = {"status": "error", "message": message, "engine": engine, "input_names": [], "output_names": [],
                "inputs_missing": True, "layer_inputs": None, "second": {}, "engines_agreement": None}
        write_record(reference, {**meta, "inputs": {}, "outputs": {}, "second_outputs": {}}, ValueStore(values_dir))
        append_record(log, f"{message}\n{traceback.format_exc()}")
    second = meta.get("second") or {}
    record_timeout(reference, "timeout" in (meta.get("status"), second.get("status")), timeout_s)
    append_record(log, f"reference {meta['engine']} {meta['status']} ({meta.get('run_ms')} ms) "
                       f"{meta.get('message') or ''}; "
                       f"second {second.get('engine')} {second.get('status')} ({second.get('run_ms')} ms) "
                       f"{second.get('message') or ''}; inputs: {meta.get('layer_inputs')}")


@records_failure
def import_layer_job(*, layer_onnx: str, mlir: str, status: str, timeout_s: float | None = None,
                     log: str | None = None, parameters: bool = False) -> None:
    """Step ``import_layer`` of rule ``prepare_unit``: the layer's MLIR, imported in a supervised worker. An
    importer failure, hang or crash is recorded in ``status`` (``"stage"``: import,
    timeout or crash), not raised: the layer's tests report it and the others go on.
    ``parameters``: the stored weights as IREE parameters (``parameters: external``)."""
    try:
        res = run_isolated(import_layer, (layer_onnx, mlir, parameters), limit_s=call_limit(timeout_s or DEFAULT_TIMEOUT_S),
                           what="the MLIR import of the layer")
        res.setdefault("stage", "import" if res["status"] != "ok" else None)
    except (WorkerTimeout, WorkerCrash) as e:
        atomic_write_text(mlir, "")
        res = {"status": "error", "stage": "timeout" if isinstance(e, WorkerTimeout) else "crash",
               "message": str(e), "import_ms": None}
    res["parameters"] = "external" if parameters else "inline"
    write_json(status, res)
    record_timeout(status, res.get("stage") == "timeout", timeout_s)
    append_record(log, f"import {res['status']} ({res['import_ms']} ms, weights {res['parameters']}) "
                       f"{res.get('message') or ''}")


#: the per-layer files of a prepared layer (their identities are in the unit's record)
PREPARED_LAYER_FILES = (QUANTIZED_MODEL_FILE, LAYER_REFERENCE_FILE, MLIR_FILE, IMPORT_FILE)


def prepare_unit_job(*, unit: str, members: list[dict], layers_dir: str, logs_dir: str, prepared: str,
                     input_settings: dict, layer_inputs: str, engine: str, precision: dict, import_mlir: bool,
                     quantize: dict | None = None, ranges: str | None = None, full_quant_info: str | None = None,
                     timeout_s: float | None = None, force: bool = False, parameters: str = "inline",
                     tolerance: dict | None = None) -> dict:
    """Rule ``prepare_unit``: for each member layer of the unit, in order, what its
    tests need, each step redone only when its key (:mod:`.units`) no longer matches
    or it timed out under a smaller limit than ``timeout_s`` (s):

    - with ``quantize`` (the quantization settings; ``ranges``: calibration.json,
      ``full_quant_info``: the whole model's quantize.json): ``quantized.onnx`` and
      ``quantize.json`` (:func:`~.quantize.quantize_layer_job`);
    - ``reference.json``: its inputs and both references' outputs as values of the
      store ``values/`` beside ``layers_dir`` (:func:`reference_job`; ``input_settings``,
      ``layer_inputs``, ``engine``; the second engine's outputs where the engines
      disagree at ``tolerance``, untracked);
    - with ``import_mlir``: ``model.mlir`` and ``import.json`` (:func:`import_layer_job`;
      ``parameters``: the resolved mode, ``external`` imports the stored weights as IREE
      parameters, and a change of mode imports again).

    ``force`` (``--recompute-cache``): every step of every member is redone.

    Files per layer under ``layers_dir/<slug>/``, logs under
    ``logs_dir/{quantize_layer,layer_reference,import_layer}/<slug>.log`` (a reference or
    import that went well is folded into the unit's log ``logs_dir/prepare_unit/<unit>.log``:
    :func:`_fold_if_ok`). A member
    that fails unexpectedly does not stop the others; the job then raises after all
    of them, naming the layers, and the next run redoes only those.

    Returns:
        The ``prepared`` record written last: ``{"unit", "members": [{"slug",
        "redone": [step, ...], "files": {name: [size, mtime_ns] or None}}]}``.

    Raises:
        DamagedWorkFile: a work file a member reads was damaged or gone (removed, with the
            layer manifest when the whole-model run must make it again; the others are done).
        RuntimeError: a member failed (a bug; the message names the layers and errors).
    """
    record, failed, damaged = [], [], []
    values_dir = os.path.join(os.path.dirname(os.path.abspath(layers_dir)), VALUES_DIR)
    unit_log = os.path.join(logs_dir, "prepare_unit", f"{unit}.log")
    keys = unit_key_file(prepared, "prepared")  # the members' keys, one file for the unit
    for m in members:
        slug = m["slug"]
        d = os.path.join(layers_dir, slug)
        redone: list[str] = []
        try:
            model = os.path.join(d, MODEL_FILE)
            if quantize is not None:
                quantized, qinfo = os.path.join(d, QUANTIZED_MODEL_FILE), os.path.join(d, QUANTIZE_INFO_FILE)
                key = make_key({"quantize": quantize}, [model, ranges, full_quant_info])
                if force or not is_current(qinfo, key, quantized, keys=keys):
                    drop_key(qinfo, keys)
                    log = _fresh_log(logs_dir, "quantize_layer", slug)
                    quantize_layer_job(layer_onnx=model, ranges=ranges, quantized=quantized, info=qinfo,
                                       settings=quantize, full_model_info=full_quant_info, timeout_s=timeout_s,
                                       log=log)
                    record_key(qinfo, key, keys)
                    redone.append("quantize")
                model = quantized
            reference = os.path.join(d, LAYER_REFERENCE_FILE)
            inputs = os.path.join(d, LAYER_INPUTS_FILE) if layer_inputs == "propagate" else None
            key = make_key({"inputs": input_settings, "layer_inputs": layer_inputs, "engine": engine,
                            "precision": precision}, [model, inputs, ranges if quantize is not None else None])
            if force or timed_out_under_smaller(reference, timeout_s) or not is_current(reference, key, keys=keys):
                drop_key(reference, keys)
                consume_marker(reference + TIMED_OUT_SUFFIX)
                reference_job(layer_onnx=model, reference=reference, values_dir=values_dir,
                              input_settings=input_settings, inputs_path=inputs,
                              calibration=ranges if quantize is not None else None, engine=engine,
                              timeout_s=timeout_s, tolerance=tolerance,
                              log=(log := _fresh_log(logs_dir, "layer_reference", slug)))
                record_key(reference, key, keys)
                redone.append("reference")
                _fold_if_ok(log, reference, unit_log, f"{slug}: reference")
            if import_mlir:
                mlir, status = os.path.join(d, MLIR_FILE), os.path.join(d, IMPORT_FILE)
                external = parameters == "external"  # in the key only then: inline keeps the old keys
                key = make_key({"precision": precision, **({"parameters": parameters} if external else {})}, [model])
                if force or timed_out_under_smaller(status, timeout_s) or not is_current(status, key, mlir, keys=keys):
                    drop_key(status, keys)
                    consume_marker(status + TIMED_OUT_SUFFIX)
                    import_layer_job(layer_onnx=model, mlir=mlir, status=status, timeout_s=timeout_s,
                                     log=(log := _fresh_log(logs_dir, "import_layer", slug)), parameters=external)
                    record_key(status, key, keys)
                    redone.append("import")
                    _fold_if_ok(log, status, unit_log, f"{slug}: MLIR import")
        except DamagedWorkFile as e:  # removed (or the split undone): the next run makes it again
            damaged.append(e)
        except Exception as e:  # noqa: BLE001 - one layer's bug must not stop the unit's others
            failed.append(f"{m['layer_id']}: {type(e).__name__}: {str(e)[:300]}")
            append_record(unit_log, traceback.format_exc())
        # the files' identities: a redone member changes this record's content (Snakemake
        # compares the checksums of small inputs, so a rewrite with the same text would
        # not rerun the unit's tests)
        record.append({"slug": slug, "redone": redone,
                       "files": {f: file_identity(os.path.join(d, f)) for f in PREPARED_LAYER_FILES}})
    if damaged:
        raise damaged[0]
    if failed:
        raise RuntimeError(f"preparing {len(failed)} layer(s) of unit {unit} failed (the others are done; "
                           f"the next run redoes these): " + "; ".join(failed))
    res = {"unit": unit, "members": record}
    write_json(prepared, res)
    n = sum(1 for r in record if r["redone"])
    print(f"unit {unit}: {len(record)} layers, {n} prepared anew ({len(record) - n} up to date)", file=sys.stderr)
    return res


def _fold_if_ok(log: str, record: str, unit_log: str, title: str) -> None:
    """A step's per-layer log folded into the unit's log (:func:`~torq_gen_config.core.logs.fold_log`)
    when its record (``reference.json``, ``import.json``) says ``status: ok`` and no second
    engine failed; a failing step's log stays where it is, beside the others of its kind."""
    try:
        rec = read_json(record, "layer record")
    except Exception:  # noqa: BLE001 - unreadable: the log stays, the next step says why
        return
    if rec.get("status") == "ok" and (rec.get("second") or {}).get("status") in (None, "ok"):
        fold_log(log, unit_log, title)


def _fresh_log(logs_dir: str, step: str, slug: str) -> str:
    """The per-layer log of ``step`` (``logs_dir/<step>/<slug>.log``), emptied: each
    redo writes it anew, as a job per layer did."""
    path = Path(logs_dir, step, f"{slug}.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return str(path)


@step(feeds_report=True)
def split_layers(input, output, params, log) -> None:
    """Checkpoint ``split_layers``: the manifest, the layer models and (``layer_inputs``:
    propagate) their inputs (:func:`split_layers_job`)."""
    split_layers_job(prepared=input.model, info_path=input.info, manifest=output.manifest,
                     model_inputs=input.model_inputs, layer_inputs=params.layer_inputs,
                     timeout_s=params.timeout_s, log=log[0])


@step(feeds_report=True)
def prepare_unit(input, output, params, log) -> None:
    """Rule ``prepare_unit``: the unit's layers prepared (:func:`prepare_unit_job`).
    Inputs: ``manifest``, with quantize ``ranges`` and ``full``. Params: ``unit``,
    ``members``, ``files`` (the members' split files' identities), ``inputs``, ``layer_inputs``,
    ``engine``, ``precision``, ``quantize``, ``import_mlir``, ``parameters`` (the resolved
    mode: inline or external), ``rerun`` (the members'
    timeout records: :func:`~.markers.timeout_rerun_token`), ``outdated``; untracked
    ``timeout_s``, ``layers_dir``, ``logs_dir``, ``force``, ``tolerance``."""
    prepare_unit_job(unit=params.unit, members=params.members, layers_dir=params.layers_dir,
                     logs_dir=params.logs_dir, prepared=output.prepared, input_settings=params.inputs,
                     layer_inputs=params.layer_inputs, engine=params.engine, precision=params.precision,
                     import_mlir=params.import_mlir, quantize=params.quantize, ranges=input.get("ranges"),
                     full_quant_info=input.get("full"), timeout_s=params.timeout_s, force=params.force,
                     parameters=params.parameters, tolerance=params.tolerance)
