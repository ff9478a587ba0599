"""Module mode of the full-model run (issue 22, phase 2): whether the assignment runs as
ONE IREE module with per-op devices (:mod:`.program`) or as a chain of partitions,
and the plan of a module run (``plan.json`` with ``mode: "module"``).

``run_mode`` (config key, ``run --run-mode``): ``auto`` runs one module when every
executor the layers are assigned to is an IREE executor whose device is here (llvm-cpu and
vmvx always; cuda, rocm, vulkan when the runtime finds the device) and no If/Loop/Scan has body ops assigned elsewhere than the op itself (their
bodies run where the parent runs), else partitions, with the reason; ``module``
forces one module (:class:`~torq_gen_config.core.errors.ConfigError` naming why when it
cannot); ``partitions`` is the chain. The reason of the choice goes into the plan
(``mode_reason``), the result and the report's ``full_model`` section.

A module plan has one "partition" (pid ``module-<fingerprint>``) whose side file
``placement.json`` holds what the compile needs: the ``line:col`` assignment, the
executors' definitions (as compiled), ``full.mlir``'s path, the map from keys to
layers. The fingerprint hashes ``full.mlir``'s digest, the assignment, the executors'
definitions, the IREE compiler's version (and ``$IREE_COMPILE``) and the debug-IR
directory: an unchanged assignment keeps its compiled module, a changed one
recompiles. The plan's ``partitions`` stay the chain of the same assignment (compiled and
run only when the module fails or differs, :mod:`.run`); the module is ``module``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from ... import backends
from ...backends import effective_executor
from ...core.errors import ConfigError
from ...core.fileio import file_digest, write_bytes_if_changed
from ...core.layout import MODULE_PARTITION_PREFIX, MODULE_SIDE_FILE
from ...core.lazy import ir, metadata
from ...mlir.placement import location_key, parse_module
from ..common import MODULE_MODE, PARTITIONS_MODE, PLAN_SCHEMA
from ..partition import compile_definition

RUN_MODES = ("auto", MODULE_MODE, PARTITIONS_MODE)
#: IREE targets whose device is local (one module can hold devices of these)
LOCAL_TARGETS = ("llvm-cpu", "vmvx")
#: ops with bodies (regions): their body ops run where the op runs
REGION_OPS = ("If", "Loop", "Scan")


def _target(executor: Mapping) -> str | None:
    opts = executor.get("options") or {}
    return opts.get("target") or opts.get("target_backend") or opts.get("backend")


def executor_obstacle(executor: Mapping, *, probe_timeout_s: float = 60.0) -> str | None:
    """Why ``executor`` cannot be a device of one module here, or None.

    Not an IREE executor (ONNX Runtime, TORQ), or an IREE target that is not local
    (cuda, rocm, vulkan...) whose device this machine lacks (``unavailable``, as the
    backend's probe says). A GPU device that is here can join local ones: the placement
    step declares a ``stream.topology`` (:func:`~torq_gen_config.mlir.placement.topology`).
    """
    name, kind = executor.get("name"), executor.get("backend")
    if kind != "iree":
        return f"executor {name!r} is of the {kind} backend: one module needs IREE executors only"
    target = _target(executor)
    if target in LOCAL_TARGETS:
        return None
    why = None
    try:
        why = backends.make_backend(dict(executor)).unavailable_reason(timeout_s=probe_timeout_s)
    except Exception as e:  # a backend that cannot be made is unavailable too
        why = f"{type(e).__name__}: {e}"
    if why:
        return f"executor {name!r} ({target}) is unavailable: {why}"
    return None


def region_conflicts(region_keys: Mapping[str, Iterable[str]], assignment: Mapping[str, str | None]) -> list[str]:
    """If/Loop/Scan ops whose body ops are assigned elsewhere than the op itself.

    Args:
        region_keys: ``{parent line:col: [line:col of the ops in its bodies]}``
            (:func:`region_keys_of`).
        assignment: ``{line:col: executor}``.

    Returns:
        One phrase per conflict, e.g. ``"12:5 (on llvm-cpu) has body ops on vmvx (14:7)"``.
    """
    out = []
    for parent, children in region_keys.items():
        mine = assignment.get(parent)
        other = {k: assignment[k] for k in children if assignment.get(k) and assignment.get(k) != mine}
        if other:
            k, ex = next(iter(other.items()))
            out.append(f"{parent} (on {mine}) has body ops on {ex} ({k}" + (f" and {len(other) - 1} more)"
                                                                          if len(other) > 1 else ")"))
    return out


def region_keys_of(mlir_path: str | os.PathLike) -> dict[str, list[str]]:
    """``{line:col of an op with regions: [line:col of every op inside them]}`` of
    ``full.mlir`` (parsed with IREE's MLIR bindings; only called when the model has
    If/Loop/Scan nodes).

    Raises:
        ValueError: the file does not parse.
    """
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    module = parse_module(Path(mlir_path).read_text(encoding="utf-8"), str(mlir_path), ctx)
    key = location_key

    def inner(op, acc: list[str]) -> None:
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    k = key(child.operation)
                    if k and k not in acc:
                        acc.append(k)
                    inner(child.operation, acc)

    out: dict[str, list[str]] = {}
    func = next((o.operation for o in module.body.operations if o.operation.name == "func.func"), None)
    for op in (o.operation for o in func.regions[0].blocks[0].operations) if func is not None else ():
        if len(op.regions) and key(op):
            acc: list[str] = []
            inner(op, acc)
            if acc:
                out[key(op)] = acc
    return out


def decide_run_mode(requested: str, used: Iterable[str], executors: list[Mapping], *,
                    region_conflicts_found: Iterable[str] = (), probe_timeout_s: float = 60.0) -> tuple[str, str]:
    """The mode a run takes, and why.

    Args:
        requested: ``auto``, ``module`` or ``partitions`` (config ``run_mode``).
        used: the executor names the layers are assigned to (after fallbacks).
        executors: the configured executors.
        region_conflicts_found: :func:`region_conflicts` of the assignment.

    Returns:
        ``(mode, reason)``: ``"module"`` or ``"partitions"`` and one sentence.

    Raises:
        ConfigError: ``requested`` is ``module`` and one module is impossible (the
            message says why), or an unknown ``requested``.
    """
    if requested not in RUN_MODES:
        raise ConfigError(f"run_mode {requested!r} is not one of {', '.join(RUN_MODES)}")
    if requested == PARTITIONS_MODE:
        return PARTITIONS_MODE, "run mode partitions was asked for"
    by_name = {e["name"]: e for e in executors}
    names = [n for n in by_name if n in set(used)]
    obstacles = [why for why in (executor_obstacle(by_name[n], probe_timeout_s=probe_timeout_s) for n in names) if why]
    conflicts = list(region_conflicts_found)
    if conflicts:
        obstacles.append(f"an op with bodies has body ops assigned elsewhere than itself (their bodies run where "
                         f"the op runs): {conflicts[0]}" + (f" and {len(conflicts) - 1} more" if len(conflicts) > 1
                                                            else ""))
    if not names:
        obstacles.append("the assignment names no executor")
    if obstacles:
        if requested == MODULE_MODE:
            raise ConfigError(f"--run-mode module is impossible: {obstacles[0]}")
        return PARTITIONS_MODE, f"auto: partitions, since {obstacles[0]}"
    gpus = [n for n in names if _target(by_name[n]) not in LOCAL_TARGETS]
    why = f"every assigned executor is an IREE executor whose device is here ({', '.join(names)})"
    if gpus and len(names) > len(gpus):
        why += (f"; {', '.join(gpus)} shares the module with CPU devices through a stream.topology that "
                "declares transparent access between them (IREE's requirement; a wrong result would show "
                "in the comparison)")
    return MODULE_MODE, (f"auto: one module, since {why}" if requested == "auto" else f"run mode module: {why}")


def placement_assignment(layers: list[Mapping], by_layer: Mapping[str, str], locations: Mapping | None,
                         compiler_locations: Mapping[str, str | None] | None = None) -> tuple[dict, dict]:
    """The ``line:col`` assignment of the placement step, and which layer each key is.

    Every node of a layer (manifest ``prepared_node_indices``) with a verified location
    gets the layer's executor; a compiler JSON's own keys (``compiler_locations``) come
    on top (it is what the original pass reads: a compiler JSON alone works).

    Returns:
        ``({line:col: executor}, {line:col: layer_id})``.
    """
    nodes = (locations or {}).get("nodes") or []
    assignment: dict[str, str] = {}
    key_layer: dict[str, str] = {}
    for layer in layers:
        ex = by_layer.get(layer["layer_id"])
        for j in layer.get("prepared_node_indices") or []:
            rec = nodes[j] if j < len(nodes) else None
            if rec and rec.get("line") is not None and rec.get("verified", True):
                k = f"{rec['line']}:{rec['col']}"
                key_layer[k] = layer["layer_id"]
                if ex:
                    assignment[k] = ex
    for k, ex in (compiler_locations or {}).items():
        if ex:
            assignment[str(k)] = ex
    return assignment, key_layer


def iree_version() -> str:
    """The IREE compiler package's version and ``$IREE_COMPILE`` (another compiler is
    another fingerprint)."""
    version = "unknown"
    for dist in ("iree-base-compiler", "iree-compiler"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    return f"{version} {os.environ.get('IREE_COMPILE') or ''}".strip()


def compile_view(executors: Iterable[Mapping]) -> list[dict]:
    """The executors' definitions as the module's compile reads them
    (:func:`~.partition.compile_definition`: no run-only options, no empty ones)."""
    return [compile_definition(e) for e in executors]


def module_fingerprint(mlir_digest: str, assignment: Mapping, executors: list[Mapping], version: str,
                       debug_ir: str | None = None) -> str:
    """sha256 (hex) of what the module's compile depends on: the executors' definitions
    without their run-only options (:func:`compile_view`: a changed ``--runtime-option``
    runs the module again, it does not recompile it)."""
    data = json.dumps({"mlir": mlir_digest, "assignment": dict(assignment), "executors": compile_view(executors),
                       "iree": version, "debug_ir": debug_ir}, sort_keys=True, default=str)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def module_plan(partitions_plan: Mapping, *, reason: str, assignment: Mapping[str, str], key_layer: Mapping[str, str],
                executors: list[Mapping], full_mlir: str, partitions_dir: str | os.PathLike,
                debug_ir: str | None = None, version: str | None = None,
                node_keys: Iterable[str | None] = (), run_mode: str = "auto") -> tuple[dict, dict[str, bytes]]:
    """The plan of a module run and its side file.

    Args:
        partitions_plan: the partitions plan of the same assignment (its ``partitions`` stay:
            the chain run when the module fails or differs; its layers, executors and graph
            inputs/outputs are the module's).
        reason: why the mode (:func:`decide_run_mode`).
        assignment / key_layer: :func:`placement_assignment`.
        executors: the definitions of the executors the module uses (as compiled: with the
            run's compiler and runtime options), in priority order.
        full_mlir: ``work/full.mlir`` (its keys; without the weights unless a whole-model
            backend is configured: the compile imports the prepared model again with them).
        node_keys: ``line:col`` of each prepared node in ``full_mlir`` (None: none), to check
            that the import with weights has the same keys.
        run_mode: the mode asked for (``auto`` or ``module``): under ``auto`` a module that
            ran layers elsewhere than assigned falls back to the partitions.

    Returns:
        ``(plan, {path: bytes})``: the plan (``mode: "module"``, ``module``: the partition
        ``module-<fingerprint[:12]>`` whose ``model`` is its ``placement.json`` (what the
        compile reads: a changed run-only option leaves it as it is) and ``run_executors``
        (the definitions the run uses); ``partitions``: the chain) and the side file to write.
    """
    prepared = partitions_plan.get("prepared_model")
    weights = [prepared] + [str(f) for f in sorted(Path(prepared).parent.glob("*.irpa"))] if prepared else []
    digest = "+".join(file_digest(f) for f in [full_mlir, *weights] if os.path.isfile(f))
    fp = module_fingerprint(digest, assignment, executors, version or iree_version(), debug_ir)
    pid = f"{MODULE_PARTITION_PREFIX}{fp[:12]}"
    side_path = Path(partitions_dir) / pid / MODULE_SIDE_FILE
    side = {"full_mlir": os.path.abspath(full_mlir), "prepared_model": os.path.abspath(prepared) if prepared else None,
            "node_keys": list(node_keys or []), "assignment": dict(sorted(assignment.items())),
            "key_layer": dict(sorted(key_layer.items())), "executors": compile_view(executors), "fingerprint": fp,
            "debug_ir": os.path.join(debug_ir, pid) if debug_ir else None}
    first = partitions_plan["partitions"]
    layer_ids = [lid for p in first for lid in p["layer_ids"]]
    compile_def = {"name": MODULE_MODE, "backend": MODULE_MODE, "options": {"fingerprint": fp}}
    part = {"index": 0, "pid": pid, "executor": MODULE_MODE, "backend": MODULE_MODE, "needs_mlir": True,
            "first_node": first[0]["first_node"] if first else 0, "last_node": first[-1]["last_node"] if first else 0,
            "num_nodes": sum(p["num_nodes"] for p in first), "layer_ids": layer_ids,
            "inputs": list(partitions_plan["graph_inputs"]), "outputs": list(partitions_plan["graph_outputs"]),
            "num_initializers": 0, "model": str(side_path), "executor_def": compile_def, "compile_def": compile_def,
            "compile_batch": None, "run_executors": list(executors)}
    plan = {**partitions_plan, "schema": PLAN_SCHEMA, "mode": MODULE_MODE, "mode_reason": reason, "run_mode": run_mode,
            "module": part, "full_mlir": full_mlir}
    data = (json.dumps(side, indent=2, sort_keys=True) + "\n").encode("utf-8")
    return plan, {str(side_path): data}


def used_executors(by_layer: Mapping[str, str], extra: Iterable[Any] = ()) -> list[str]:
    """The executor names the run uses, first use order."""
    out: list[str] = []
    for ex in [*by_layer.values(), *[e for e in extra if e]]:
        if ex not in out:
            out.append(ex)
    return out


def module_or_partitions(plan: dict, *, run_mode: str, model, manifest: Mapping, locations: Mapping | None,
                         assignment: Mapping, executors: list[Mapping], full_mlir: str | None,
                         compiler_options: Iterable[str], runtime_options: Iterable[str],
                         parts_dir: str | os.PathLike, write: bool = True) -> dict:
    """The run's plan in the mode ``run_mode`` gives: ``plan`` (a partitions plan of
    :func:`~.plan.make_plan`) with ``mode_reason``, or the module plan built on it
    (:func:`module_plan`, its side file written when its bytes change).

    Raises:
        ConfigError: ``run_mode`` is ``module`` and one module is impossible, or no ``full_mlir``.
    """
    by_layer = plan.get("layer_executors") or {}
    compiler_locations = assignment.get("locations") if assignment.get("source") == "compiler_json" else None
    keys, key_layer = placement_assignment(manifest["layers"], by_layer, locations, compiler_locations)
    conflicts: list[str] = []
    if run_mode != PARTITIONS_MODE and full_mlir and any(n.op_type in REGION_OPS for n in model.graph.node):
        regions = region_keys_of(full_mlir)
        conflicts = region_conflicts(regions, keys)
        for parent, children in regions.items():  # body ops belong to their op's layer
            for k in children if parent in key_layer else ():
                key_layer.setdefault(k, key_layer[parent])
    used = used_executors(by_layer, (compiler_locations or {}).values())
    params = (plan.get("options") or {}).get("parameters") or {}
    if run_mode == "auto" and params.get("mode") == "external":
        return {**plan, "mode_reason": "auto: partitions, since the weights are IREE parameters (parameters: external; "
                                       "one module has them inline: --run-mode module to run it anyway)"}
    mode, reason = decide_run_mode(run_mode, used, executors, region_conflicts_found=conflicts)
    if mode == PARTITIONS_MODE:
        return {**plan, "mode_reason": reason}
    if not full_mlir:
        raise ConfigError("one module needs work/full.mlir (the imported model)")
    by_name = {e["name"]: e for e in executors}
    defs = [effective_executor(by_name[n], compiler_options, runtime_options) for n in by_name if n in set(used)]
    debug_ir = (assignment.get("options") or {}).get("debug_ir")
    mplan, files = module_plan(plan, reason=reason, assignment=keys, key_layer=key_layer, executors=defs,
                               full_mlir=full_mlir, partitions_dir=parts_dir,
                               debug_ir=debug_ir, run_mode=run_mode,
                               node_keys=[f"{n['line']}:{n['col']}" if n.get("line") is not None else None
                                          for n in (locations or {}).get("nodes") or []])
    if write:
        for path, data in files.items():
            write_bytes_if_changed(path, data)
    return mplan
