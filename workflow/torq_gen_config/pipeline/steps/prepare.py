"""Jobs of rules/prepare.smk: prepare the user's model (opset, dtypes, shapes, its input
values) and import the full-model MLIR with its node -> line:col map."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ...core.fileio import atomic_write_bytes, atomic_write_text, write_bytes_if_changed, write_json
from ...core.isolation import WorkerCrash, WorkerTimeout, run_isolated
from ...core.job_support import in_worker, logs_failure, records_failure
from ...core.lazy import onnx
from ...core.logs import append_record
from ...core.limits import DEFAULT_TIMEOUT_S, model_job_limit
from ...core.errors import ConfigError
from ...core.external_data import self_contained_bytes
from ...core.weight_store import STORE_FILE, externalize
from ...mlir import importer
from ...model import prepare as model_prepare
from ...model.graph import copy_proto
from ...model.prepare import load_model
from ...model.symbolic_dims import (DEFAULT_SOURCE, MIN_SPATIAL, SHAPES_SOURCE, check_run_with_guessed_dims, guessed_dims,
                                   input_shapes_option)
from ...precision.narrowing import BF16_OPSET, convert_int64_to_int32, convert_to_bf16
from ...reference.model_inputs import cast_to_model_inputs, input_data_shapes, model_input_values, save_model_inputs
from ...reference.model_run import run_model_by_node, run_summary
from . import step

@records_failure
def prepare_model_job(**kwargs) -> None:
    """Rule ``prepare_model``: :func:`_prepare_model_job` in a supervised worker
    (its whole-model reference run can hang or crash; :func:`in_worker`)."""

    in_worker(_prepare_model_job, "the model preparation", model_job_limit(kwargs.get("timeout_s") or DEFAULT_TIMEOUT_S),
              without_run="model_run_failed", **kwargs)


@logs_failure
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
    values written to ``model_inputs`` (:mod:`torq_gen_config.reference.model_inputs`).

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
    precision = precision or {}
    t0 = time.perf_counter()
    shapes = dict(input_shapes or {})
    sources = {name: "--input-shapes" for name in shapes}
    if input_data:
        for name, shp in input_data_shapes(input_data, load_model(model, graph_only=True)).items():
            if name in shapes and list(shapes[name]) != shp:

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

        res = run_model_by_node(whole, feeds, timeout_s=timeout_s, keep=want)
        run_state["values"] = res.pop("values")
        types = res.pop("types")
        return {"types": types, "info": {"ran": True, "inputs": source, **run_summary(res),
                                         "unknown_to_static_inference": unknown[:200]}}


    conversions = [(key, fn) for key, fn, on in (("bf16", convert_to_bf16, precision.get("auto_convert_bf16")),
                                                  ("int32", convert_int64_to_int32, precision.get("auto_convert_int32")))
                   if on]
    if conversions:  # bf16 and the int32 narrowing need opset 22 (precision.narrowing)
        target_opset = max(target_opset, BF16_OPSET)
    store = Path(prepared).parent / STORE_FILE
    m, info = model_prepare.prepare_model(model, target_opset=target_opset, subgraph=subgraph,
                                          conversions=conversions, input_shapes=shapes, shape_sources=sources,
                                          observe=observe, store=store)
    # sizes chosen here that the model does not take: stop before anything is written
    run_warning = check_run_with_guessed_dims(info["fixed_dims"], info.get("fixed_shapes") or {}, info.get("model_run"))
    # what was chosen for the input dims first: the run's failures printed below may follow from it
    for line in fixed_dims_lines(info["fixed_dims"], info.get("fixed_shapes")):
        print(line, file=sys.stderr)
    if run_warning:
        print(f"warning: {run_warning}", file=sys.stderr)
    if precision.get("auto_convert_bf16") and precision.get("save_bf16_model"):
        Path(precision["save_bf16_model"]).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(precision["save_bf16_model"], self_contained_bytes(m))
        info["precision"]["bf16"]["saved_to"] = str(precision["save_bf16_model"])
        print(f"bf16 model saved to {precision['save_bf16_model']}", file=sys.stderr)
    info["weights"] = externalize(m, store)
    write_bytes_if_changed(prepared, m.SerializeToString(deterministic=True))
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
    for key, rep in (info.get("precision") or {}).items():
        print(precision_summary(key, rep), file=sys.stderr)
    info["onnx_version"] = onnx.__version__
    if run_warning:
        info["warnings"].insert(0, run_warning)
    write_json(info_path, info)
    append_record(log, f"prepared {model}: opset {info['opset']}, {len(info['fixed_dims'])} dims fixed, "
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
        if w != run_warning:
            print(f"warning: {w}", file=sys.stderr)


def _only_inputs(model, names: list[str]):
    """A copy of ``model`` whose graph inputs are only ``names`` (to generate their values)."""
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


def fixed_dims_lines(fixed: list[dict], shapes: dict | None = None) -> list[str]:
    """Console lines for the dynamic input dims that were given values (records of
    :func:`~torq_gen_config.model.symbolic_dims.fix_symbolic_dims`; ``shapes``: input
    name -> its full shape after fixing). The warnings come first: one per input with
    dims whose size nothing gave (:func:`guessed_dims`), naming the ``--input-shapes``
    that gives them; then a note per dim set from a given size, a same-named dim, the
    model's metadata or the batch's default 1."""
    shapes = shapes or {}
    guessed = guessed_dims(fixed)
    lines = []
    for name in dict.fromkeys(d["input"] for d in guessed):
        dims = [d for d in guessed if d["input"] == name]
        why = "; ".join(dict.fromkeys(
            "1 by default" if d["source"] == DEFAULT_SOURCE
            else f"{d['source']}, though the model's shapes fit no size tried (up to 32 times it)" if d.get("unfit")
            else d["source"] if d["source"] == SHAPES_SOURCE
            else f"the smallest multiple of {d['source']}, at least {MIN_SPATIAL}, that the model's shapes fit"
            for d in dims))
        option = input_shapes_option({name: shapes[name]}) if name in shapes else "--input-shapes NAME:DIMS"
        lines.append(f"warning: input {name} dim(s) {', '.join(str(d['axis']) for d in dims)} "
                     f"({', '.join(d['was'] for d in dims)}) are dynamic and nothing gives their size: set to "
                     f"{', '.join(str(d['to']) for d in dims)} ({why}); give the sizes the model is used at: "
                     f"{option} with those dims changed")
    for d in fixed:
        if d in guessed:
            continue
        if d.get("source") not in (None, DEFAULT_SOURCE):
            lines.append(f"note: input {d['input']} dim {d['axis']} ({d['was']}) set to {d.get('to', 1)} ({d['source']})")
        else:
            lines.append(f"note: input {d['input']} dim 0 ({d['was']}, the batch) fixed to {d.get('to', 1)}")
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
def import_full_model_job(*, prepared: str, mlir: str, locations: str, weights: bool = True,
                          timeout_s: float | None = None, log: str | None = None) -> None:
    """Rule ``import_full_model``: full-model MLIR and the node -> line:col map; the
    importer runs in a supervised worker (a hang or a crash is recorded as a failed
    import: the layers then get no ``mlir_location``). ``weights``: the MLIR keeps the
    weights (an executor compiles it), else they are elided
    (:func:`~torq_gen_config.mlir.importer.import_full_model`)."""
    limit = model_job_limit(timeout_s or DEFAULT_TIMEOUT_S, calls=1)
    try:
        res = run_isolated(importer.import_full_model, (prepared, mlir, weights), limit_s=limit,
                           what="the full-model MLIR import")
    except (WorkerTimeout, WorkerCrash) as e:
        atomic_write_text(mlir, "")
        res = {"mlir_file": mlir, "status": "error", "message": str(e), "import_ms": None, "nodes": [],
               "n_unverified": None}
    res["mlir_file"] = os.path.basename(mlir)
    write_json(locations, res)
    append_record(log, f"imported full model: {res['status']}, {len(res['nodes'])} nodes, "
                       f"{res['n_unverified']} unverified; {res.get('message') or ''}")
    if res["status"] != "ok":
        print(f"warning: full-model MLIR import failed, layers get no mlir_location: {res['message'][:300]}", file=sys.stderr)


@step(feeds_report=True)
def prepare_model(input, output, params, log) -> None:
    """Rule ``prepare_model``: the prepared model, its info and the model's input values
    (:func:`prepare_model_job`). Params: ``outdated`` (the report's out-of-date
    marker), ``target_opset``, ``precision``, ``inputs``, ``input_shapes``; untracked
    ``subgraph`` ((from, to) layer IDs or None) and ``timeout_s``."""
    prepare_model_job(model=input.model, prepared=output.model, info_path=output.info,
                      target_opset=params.target_opset, subgraph=params.subgraph, precision=params.precision,
                      model_inputs=output.model_inputs, input_settings=params.inputs,
                      input_data=input.data[0] if input.data else None, input_shapes=params.input_shapes,
                      timeout_s=params.timeout_s, log=log[0])


@step(feeds_report=True)
def import_full_model(input, output, params, log) -> None:
    """Rule ``import_full_model``: full.mlir and locations.json (:func:`import_full_model_job`).
    Params: ``weights`` (an executor compiles full.mlir: keep its weights), ``precision``,
    ``outdated``; untracked ``timeout_s``."""
    import_full_model_job(prepared=input.model, mlir=output.mlir, locations=output.locations,
                          weights=params.weights, timeout_s=params.timeout_s, log=log[0])
