"""The plan of a full-model run (``plan.json``): the model cut into partitions, one
ONNX model written per partition; or, for a backend that compiles whole models, that
backend's one-partition plan."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Mapping

from ..backends import capabilities, effective_executor, needs_mlir
from ..backends.parameters import with_parameters
from ..core.fileio import write_bytes_if_changed
from ..core.layout import BATCHES_DIR, MODEL_FILE, PARTITIONS_DIR
from ..core.external_data import model_bytes
from ..core.weight_store import store_folded
from ..model.folding import fold_constants
from ..model.graph import node_inputs, tensor_consumers, value_types
from .batches import existing_batches, plan_partition_batches
from .common import PARTITIONS_MODE, PLAN_SCHEMA
from .partition import build_partition_model, compile_definition, partition_id, partition_runs
from .selection import check_selection, resolve_assignment

#: Kept as nodes in partitions (never constant-folded): with ``--quantize`` the
#: executor must see int8 weights and their DequantizeLinear, as in the whole model.
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def make_plan(model, manifest: Mapping, locations: Mapping | None, assignment: Mapping, executors: list[dict],
              partitions_dir: str | os.PathLike, *, compiler_options: Iterable[str] = (),
              runtime_options: Iterable[str] = (), write: bool = True, prune: bool = True,
              full_mlir: str | None = None, compile_batch: int = 1, parameters: Mapping | None = None,
              folded_store: str | os.PathLike | None = None) -> dict:
    """Partition the prepared model and write one ONNX model per partition.

    When every executor of the assignment is of a backend that compiles whole
    models (:func:`~torq_gen_config.fullrun.selection.assignment_mode`, e.g. torq),
    the plan is that backend's instead (:func:`whole_model_plan`): one whole-model
    "partition", e.g. compiled from ``full_mlir`` with an executor map.

    Args:
        model: the prepared model (``work/prepared.onnx``).
        manifest: the layer manifest (``work/layers/manifest.json``).
        locations: ``work/locations.json`` (for compiler-JSON assignments).
        assignment: the content of ``assignment.json``.
        executors: configured executors, priority order.
        compiler_options, runtime_options: extra flags for the executors of backends
            that take them (config ``compiler_options`` / ``runtime_options``).
        partitions_dir: ``work/full/partitions``; receives ``<pid>/model.onnx``
            (rewritten only when its bytes change; directories of partitions not
            in this plan are removed when ``prune``).
        write: write the partition models (False: plan only, for tests).
        full_mlir: ``work/full.mlir`` (only used, and then needed, for a whole-model plan).
        compile_batch: partitions per compile batch (config ``compile_batch``; 1: each
            partition compiled by its own job; :func:`~.batches.plan_partition_batches`).
        parameters: the resolved weights mode (:func:`~torq_gen_config.backends.parameters.resolve`)
            with ``archives``, the absolute paths of the weight store and of ``folded_store``;
            in external mode each chain executor's definitions get them
            (:func:`~torq_gen_config.backends.parameters.with_parameters`: the partitions
            are imported with parameters, and run with the archives). None: inline.
        folded_store: the archive beside the model's stored tensors that receives the
            folded values the partitions read (:func:`~torq_gen_config.core.weight_store.store_folded`);
            None: they are copied into the partition models.

    Returns:
        The plan (JSON-safe): ``partitions`` (in run order: ``index``, ``pid``,
        ``executor`` (name), ``backend``, ``needs_mlir``, ``first_node``,
        ``last_node``, ``num_nodes``, ``layer_ids``, ``inputs``, ``outputs``,
        ``num_initializers``, ``model``, ``executor_def`` (as run),
        ``compile_def`` (as compiled), ``compile_batch`` (its batch id or None)),
        ``compile_batches`` (``[{"id", "executor", "members": [pid]}]``), ``graph_inputs``, ``graph_outputs``,
        ``constant_outputs``, ``layer_executors``, ``fallbacks``, ``warnings``,
        ``source``, ``source_file``, ``options``.

    Raises:
        ConfigError: the assignment names an unknown executor, or mixes executors
            of a whole-model backend with others.
        ValueError: a prepared node that is neither folded nor part of a layer
            (the manifest does not belong to this model).
    """
    mode = check_selection(assignment, executors)
    if mode != PARTITIONS_MODE:
        return whole_model_plan(mode, model, manifest, locations, assignment, executors, partitions_dir,
                                compiler_options=compiler_options, runtime_options=runtime_options, write=write,
                                prune=prune, full_mlir=full_mlir)
    layers = manifest["layers"]
    by_name = {e["name"]: e for e in executors}
    # a layer without a choice never falls back to an executor a chain cannot run
    chain_executors = [e for e in executors if not capabilities(e.get("backend")).chain_unavailable]
    by_layer, fallbacks, warnings = resolve_assignment(assignment, layers, locations, chain_executors)
    values, folded, fold_warnings = fold_constants(model, keep_op_types=QDQ_OPS)
    if folded_store is not None and write:
        store_folded(values, {t for j, n in enumerate(model.graph.node) if j not in folded for t in node_inputs(n)},
                     folded_store)
    node_layer: dict[int, str] = {}
    for layer in layers:
        for j in layer["prepared_node_indices"]:
            node_layer[j] = layer["layer_id"]
    seq = []
    for j, node in enumerate(model.graph.node):
        if j in folded:
            continue
        if j not in node_layer:
            raise ValueError(f"prepared node {j} ({node.op_type} {node.name!r}) is not folded and belongs to no layer "
                             "of the manifest; rerun discovery on this model")
        seq.append((j, by_layer[node_layer[j]]))
    types = value_types(model)
    consumers = tensor_consumers(model)
    graph_outputs = [o.name for o in model.graph.output]
    debug_ir = (assignment.get("options") or {}).get("debug_ir")
    options = {"compiler_options": list(compiler_options), "runtime_options": list(runtime_options),
               "debug_ir": debug_ir, "compile_batch": compile_batch,
               "parameters": {k: v for k, v in parameters.items() if k != "archives"} if parameters else None}
    parts_dir = Path(partitions_dir)
    partitions = []
    for index, (ex_name, members) in enumerate(partition_runs(seq)):
        part_model, io = build_partition_model(model, members, values, types=types, consumers=consumers,
                                               graph_outputs=graph_outputs)
        data = model_bytes(part_model, parts_dir / "pid" / MODEL_FILE)  # its weights stay in the store
        run_def = effective_executor(by_name[ex_name], compiler_options, runtime_options)
        if parameters:
            run_def = with_parameters(run_def, parameters, parameters["archives"])
        comp_def = compile_definition(run_def)
        pid = partition_id(data, comp_def, debug_ir)
        if debug_ir:
            cls = capabilities(run_def.get("backend"))
            for d in (run_def, comp_def):
                d["options"] = cls.with_debug_ir(d["options"], os.path.join(debug_ir, pid))
        if write:
            write_bytes_if_changed(parts_dir / pid / MODEL_FILE, data)
        layer_ids: list[str] = []
        for j in members:
            if node_layer[j] not in layer_ids:
                layer_ids.append(node_layer[j])
        partitions.append({
            "index": index, "pid": pid, "executor": ex_name, "backend": run_def.get("backend"),
            "needs_mlir": needs_mlir(run_def.get("backend")),
            "first_node": members[0], "last_node": members[-1], "num_nodes": len(members),
            "layer_ids": layer_ids, "inputs": io["inputs"], "outputs": io["outputs"],
            "num_initializers": len(io["initializers"]),
            "model": str(parts_dir / pid / MODEL_FILE),
            "executor_def": run_def, "compile_def": comp_def,
        })
    batches = plan_partition_batches(partitions, compile_batch, debug_ir=debug_ir,
                                     existing=existing_batches(parts_dir.parent) if compile_batch > 1 else None)
    if write and prune:
        _prune(parts_dir, {p["pid"] for p in partitions})
        _prune_batches(parts_dir.parent / BATCHES_DIR, {(b["executor"], b["id"]) for b in batches})
    produced = {t for p in partitions for t in p["outputs"]}
    graph_inputs = [i.name for i in model.graph.input if i.name not in values]
    constant_outputs = [t for t in graph_outputs if t not in produced and t in values]
    missing = [t for t in graph_outputs if t not in produced and t not in values and t not in graph_inputs]
    if missing:
        raise ValueError(f"no partition produces model output(s) {missing}")
    return {
        "schema": PLAN_SCHEMA,
        "mode": PARTITIONS_MODE,
        "source": assignment.get("source"), "source_file": assignment.get("source_file"),
        "options": options,
        "num_partitions": len(partitions),
        "partitions": partitions,
        "compile_batches": batches,
        "graph_inputs": graph_inputs, "graph_outputs": graph_outputs, "constant_outputs": constant_outputs,
        "layer_executors": by_layer,
        "fallbacks": fallbacks,
        "warnings": warnings + fold_warnings,
        "folded_nodes": len(folded),
    }


def missing_side_file(plan_path: str | os.PathLike) -> str | None:
    """The first side file a stored plan names that is gone (a partition's model, a
    module's ``placement.json``: e.g. its partition directory was removed), or None
    (also when there is no readable plan). Such a plan cannot be run: the checkpoint
    that writes the side files must run again (remove the plan and the result: Snakemake
    remakes a missing checkpoint output only for a target that needs it).

    Each is looked for in its partition's folder beside the plan (the plan's own paths are
    relative to the directory it was written from: the CLI's output directory or the
    checkout ``snakemake`` ran in).
    """
    try:
        plan = json.loads(Path(plan_path).read_text(encoding="utf-8"))
        parts = [*(plan.get("partitions") or []), *([plan["module"]] if plan.get("module") else [])]
        for p in parts:  # in its partition's folder (the plan's paths are relative to where it was written)
            if p.get("model") and not (Path(plan_path).parent / PARTITIONS_DIR / p["pid"] / Path(p["model"]).name).is_file():
                return str(p["model"])
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return None
    return None


def missing_debug_ir(plan_path: str | os.PathLike, debug_ir: str | None) -> str | None:
    """With ``--debug-ir``: the module's debug-IR folder the stored plan's module wrote
    (``placement.json``'s ``debug_ir``) when it is gone (removed by hand), else None."""
    if not debug_ir:
        return None
    try:
        plan = json.loads(Path(plan_path).read_text(encoding="utf-8"))
        module = plan.get("module") or {}
        side = json.loads((Path(plan_path).parent / PARTITIONS_DIR / module["pid"] / Path(module["model"]).name)
                          .read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    d = side.get("debug_ir")
    return d if d and not os.path.isfile(os.path.join(d, "README.txt")) else None


def prune_plan_dirs(partitions_dir: str | os.PathLike, keep: Iterable[str], batches: Iterable[Mapping]) -> None:
    """Remove the partition directories not in ``keep`` (pids) and the compile-batch
    directories not in ``batches`` (``{"executor", "id"}``) of a plan made with ``prune=False``."""
    parts = Path(partitions_dir)
    _prune(parts, set(keep))
    _prune_batches(parts.parent / BATCHES_DIR, {(b["executor"], b["id"]) for b in batches})


def _prune(parts_dir: Path, keep: set[str]) -> None:
    if parts_dir.is_dir():
        for d in parts_dir.iterdir():
            if d.is_dir() and d.name not in keep:
                shutil.rmtree(d, ignore_errors=True)


def _prune_batches(batches_dir: Path, keep: set[tuple[str, str]]) -> None:
    """Remove the batch directories (``<executor>/<id>``) of batches not in this plan."""
    if batches_dir.is_dir():
        for ex in batches_dir.iterdir():
            for d in ex.iterdir() if ex.is_dir() else ():
                if d.is_dir() and (ex.name, d.name) not in keep:
                    shutil.rmtree(d, ignore_errors=True)


def whole_model_plan(kind: str, model, manifest: Mapping, locations: Mapping | None, assignment: Mapping,
                     executors: list[dict], partitions_dir: str | os.PathLike, *, compiler_options: Iterable[str] = (),
                     runtime_options: Iterable[str] = (), write: bool = True, prune: bool = True,
                     full_mlir: str | None = None) -> dict:
    """The plan of an assignment that backend ``kind`` compiles as one whole model
    (its :meth:`~torq_gen_config.backends.whole_model.WholeModel.plan`), with its files
    written (only when their bytes change) and other partitions' directories removed
    (when ``write`` and ``prune``).

    Returns:
        A plan like :func:`make_plan`'s with ``mode: kind`` and one partition.

    Raises:
        ConfigError: as the backend's plan hook (unknown executors, conflicting options).
    """
    hooks = capabilities(kind).whole_model()
    body, files = hooks.plan(model, manifest, locations, assignment, executors, str(partitions_dir),
                             compiler_options=compiler_options, runtime_options=runtime_options, full_mlir=full_mlir)
    if write:
        for path, data in files.items():
            write_bytes_if_changed(path, data)
    if write and prune:
        _prune(Path(partitions_dir), {p["pid"] for p in body["partitions"]})
        _prune_batches(Path(partitions_dir).parent / BATCHES_DIR, set())
    return {"schema": PLAN_SCHEMA, **body}
