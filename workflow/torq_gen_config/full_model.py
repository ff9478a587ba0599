"""Full-model run: the whole prepared model with each op on its assigned executor.

IREE and ONNX Runtime have no per-op assignment pass, so the model runs as a chain
of *partitions* (notes/toolchain.md section 6: per-layer modules chained through
host numpy is the safe path):

1. Constant-producing nodes are folded (:func:`torq_gen_config.model.split.fold_constants`,
   the same folding as the layer split), so every remaining node of the prepared
   model belongs to a layer (manifest ``prepared_node_indices``).
2. Every layer gets an executor (:func:`resolve_assignment`): the report's
   ``recommended_executor``, or the compiler JSON's entry for the layer's
   ``line:col``; a layer without one runs on the highest-priority executor whose
   status for that layer is not ``error`` (else the first executor), and the plan
   lists it with the reason.
3. A partition is a maximal run of consecutive nodes (graph order, which ONNX
   requires to be topological) with the same executor (:func:`partition_runs`). A
   run of consecutive nodes of a topological order is convex, so running the
   partitions in order only ever needs tensors that earlier partitions (or the
   graph inputs) produced.
4. Each partition becomes a stand-alone ONNX model (:func:`build_partition_model`):
   run-time inputs are graph inputs, folded values and initializers are
   initializers, and every tensor it produces that a node outside it (or the
   model's output) needs is a graph output. Its *pid* is a short hash of the model
   bytes and the executor definition as compiled (extra compiler options and the
   debug-IR directory included), so an unchanged partition keeps its compiled
   module and a change to one layer's executor recompiles only the partitions that
   contain or border it.
5. :func:`compile_partition` compiles one partition for its executor;
   :func:`run_partitions` runs them in order, handing tensors from partition to
   partition as numpy arrays, compares the model's outputs with the ONNX Runtime
   reference of the whole prepared model (same metrics as the layer comparisons)
   and checks each partition against ONNX Runtime on the inputs it actually got
   (to tell which partition introduced a difference).

Files (under ``<output_dir>/work/full``): ``assignment.json`` (what the run was
asked to do), ``plan.json`` (partitions), ``partitions/<pid>/model.onnx``,
``model.mlir``, ``compiled.json`` and the module, ``reference.npz``,
``result.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import time
import traceback
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import ConfigError, ReportError

ASSIGNMENT_SCHEMA = "torq-gen-config/full-model-assignment/1"
PLAN_SCHEMA = "torq-gen-config/full-model-plan/1"
COMPILED_SCHEMA = "torq-gen-config/full-model-compiled/1"
RESULT_SCHEMA = "torq-gen-config/full-model-result/1"

#: Rules ``torq-gen-config run`` lets Snakemake execute (never discovery or the report;
#: the model preparation and split only when they are missing or out of date).
RUN_RULES = ("prepare_model", "import_full_model", "split_layers", "plan_full_model", "compile_partition",
             "full_reference", "run_full_model")
#: Paths relative to the output directory.
ASSIGNMENT_FILE = "work/full/assignment.json"
RESULT_FILE = "work/full/result.json"
PLAN_FILE = "work/full/plan.json"
#: Marker of the full-model part of ``final_report_text``.
TEXT_MARKER = "--- Full Model Comparison ---"
#: Backend kinds that cannot run yet (a later issue adds the torq backend).
UNAVAILABLE_BACKENDS = {"torq": "the torq backend is not available yet in torq-gen-config run "
                                 "(it comes with a later version); assign these layers to another executor"}
PARTITION_MODEL = "model.onnx"
PARTITION_MLIR = "model.mlir"
COMPILED_FILE = "compiled.json"
SUMMARY_LIMIT = 512
MESSAGE_LIMIT = 4000
_NULL_NAMES = ("", "null", "none")


# ----------------------------------------------------------------------------
# what to run: the selection from the report or compiler JSON (assignment.json)


def _executor_name(value: Any) -> str | None:
    """An executor name from a JSON value; None for null, "" and the string "null"."""
    if isinstance(value, Mapping):
        value = value.get("executor")
    if not isinstance(value, str) or value.strip().lower() in _NULL_NAMES:
        return None
    return value.strip()


def selection_from_report(report: Mapping, *, source_file: str | None = None) -> dict:
    """The per-layer choice stored in a report JSON.

    Returns:
        ``{"source": "report", "source_file", "model_name", "layers": {layer_id:
        {"executor": name or None, "statuses": {executor: status}}}, "locations": None}``.

    Raises:
        ReportError: ``report`` is not a report JSON (no ``ops`` object).
    """
    ops = report.get("ops") if isinstance(report, Mapping) else None
    if not isinstance(ops, Mapping):
        raise ReportError(f"{source_file or 'report'} is not a report JSON: it has no 'ops' object")
    layers = {}
    for layer_id, op in ops.items():
        if not isinstance(op, Mapping):
            raise ReportError(f"{source_file or 'report'}: op {layer_id!r} is not an object")
        statuses = {name: (e or {}).get("status") for name, e in (op.get("executors") or {}).items()}
        layers[str(layer_id)] = {"executor": _executor_name(op.get("recommended_executor")), "statuses": statuses}
    return {"source": "report", "source_file": source_file, "model_name": report.get("model_name"),
            "layers": layers, "locations": None}


def selection_from_compiler_json(compiler: Mapping, *, source_file: str | None = None) -> dict:
    """The ``line:col`` -> executor map of a compiler JSON.

    Returns:
        ``{"source": "compiler_json", "source_file", "model_name", "layers": None,
        "locations": {"L:C": name or None}}``.

    Raises:
        ReportError: no ``op_assignments`` object.
    """
    oa = compiler.get("op_assignments") if isinstance(compiler, Mapping) else None
    if not isinstance(oa, Mapping):
        raise ReportError(f"{source_file or 'compiler JSON'} is not a compiler JSON: it has no 'op_assignments' object")
    return {"source": "compiler_json", "source_file": source_file, "model_name": compiler.get("model_name"),
            "layers": None, "locations": {str(k): _executor_name(v) for k, v in oa.items()}}


def check_selection(selection: Mapping, executors: list[dict]) -> None:
    """Check that every executor named by the selection is configured and can run.

    Raises:
        ConfigError: an unknown executor name (the message lists the configured
            ones), or one whose backend cannot run full models yet (torq).
    """
    by_name = {e["name"]: e for e in executors}
    named: dict[str, list[str]] = {}
    for key, entry in (selection.get("layers") or {}).items():
        if entry.get("executor"):
            named.setdefault(entry["executor"], []).append(key)
    for key, name in (selection.get("locations") or {}).items():
        if name:
            named.setdefault(name, []).append(key)
    unknown = sorted(n for n in named if n not in by_name)
    if unknown:
        n = unknown[0]
        raise ConfigError(
            f"{selection.get('source_file') or 'the assignment'} assigns executor {n!r} "
            f"(e.g. to {named[n][0]}), which is not configured (configured: {', '.join(by_name)}); "
            "pass the --config-file used for discovery"
        )
    for n in named:
        kind = by_name[n].get("backend")
        if kind in UNAVAILABLE_BACKENDS:
            raise ConfigError(f"executor {n!r} (backend {kind!r}) is assigned to {len(named[n])} layer(s), "
                              f"e.g. {named[n][0]}: {UNAVAILABLE_BACKENDS[kind]}")


def make_assignment(selection: Mapping, *, debug_ir: str | None = None) -> dict:
    """The content of ``work/full/assignment.json``: the selection plus the run
    options that have no config key (``debug_ir``: directory for IREE's
    per-partition compilation-phase dumps)."""
    return {
        "schema": ASSIGNMENT_SCHEMA,
        **{k: selection.get(k) for k in ("source", "source_file", "model_name", "layers", "locations")},
        "options": {"debug_ir": debug_ir},
    }


def assignment_bytes(doc: Mapping) -> bytes:
    """Stable serialisation (the file is rewritten only when these bytes change)."""
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")


def selection_digest(selection: Mapping | None) -> str | None:
    """A short digest of what a selection assigns (None for no selection)."""
    if selection is None:
        return None
    data = json.dumps({k: selection.get(k) for k in ("source", "layers", "locations")}, sort_keys=True)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:16]


# ----------------------------------------------------------------------------
# per-layer executor


def resolve_assignment(assignment: Mapping, layers: list[dict], locations: Mapping | None,
                       executors: list[dict]) -> tuple[dict[str, str], list[dict], list[str]]:
    """The executor of every layer of the manifest.

    Args:
        assignment: the content of ``assignment.json`` (:func:`make_assignment`).
        layers: the manifest's layers (``layer_id``, ``primary_prepared_index``, ...).
        locations: ``locations.json`` (maps layers to ``line:col``; needed for a
            compiler-JSON assignment).
        executors: configured executors in priority order.

    Returns:
        ``(by_layer, fallbacks, warnings)``: layer ID -> executor name for every
        layer; ``fallbacks`` lists the layers that had no choice, each
        ``{"layer_id", "executor", "reason"}``; ``warnings`` are one-liners (e.g.
        report layers that are not in the model any more).

    Raises:
        ConfigError: no executors, or the assignment names an executor that is
            not configured.
    """
    from .mlir.importer import layer_location

    names = [e["name"] for e in executors]
    if not names:
        raise ConfigError("no executors configured")
    first = names[0]
    by_layer: dict[str, str] = {}
    fallbacks: list[dict] = []
    warnings: list[str] = []
    chosen = assignment.get("layers")
    by_loc = assignment.get("locations")
    for layer in layers:
        lid = layer["layer_id"]
        if chosen is not None:
            entry = chosen.get(lid)
            if entry is None:
                by_layer[lid] = first
                fallbacks.append({"layer_id": lid, "executor": first,
                                  "reason": "not in the report (the model changed since discovery?); "
                                            "no status known, so the first executor"})
                continue
            ex = entry.get("executor")
            if ex:
                by_layer[lid] = ex
                continue
            statuses = entry.get("statuses") or {}
            ok = [n for n in names if statuses.get(n) not in (None, "error")]
            if ok:
                by_layer[lid] = ok[0]
                fallbacks.append({"layer_id": lid, "executor": ok[0],
                                  "reason": f"no recommendation; {ok[0]} is the highest-priority executor whose "
                                            f"status is not error ({statuses[ok[0]]})"})
            else:
                tested = sorted(n for n in statuses if statuses[n] == "error")
                why = ("every tested executor failed on it (" + ", ".join(tested) + ")") if tested else "it was not tested"
                by_layer[lid] = first
                fallbacks.append({"layer_id": lid, "executor": first,
                                  "reason": f"no recommendation and {why}; using the first executor"})
        else:
            loc = layer_location(layer, locations or {})
            ex = (by_loc or {}).get(loc) if loc else None
            if ex:
                by_layer[lid] = ex
                continue
            by_layer[lid] = first
            if loc is None:
                reason = "the layer has no MLIR line:col, so the compiler JSON cannot name it; using the first executor"
            elif loc in (by_loc or {}):
                reason = f"the compiler JSON has no executor for {loc}; using the first executor"
            else:
                reason = f"not in the compiler JSON ({loc}); no status known, so the first executor"
            fallbacks.append({"layer_id": lid, "executor": first, "reason": reason})
    if chosen is not None:
        known = {l["layer_id"] for l in layers}
        stale = [lid for lid in chosen if lid not in known]
        if stale:
            warnings.append(f"{len(stale)} layer(s) of the report are not in the model (e.g. {stale[0]}); ignored")
    unknown = sorted({ex for ex in by_layer.values() if ex not in names})
    if unknown:
        raise ConfigError(f"the assignment names executor {unknown[0]!r}, which is not configured "
                          f"(configured: {', '.join(names)})")
    return by_layer, fallbacks, warnings


# ----------------------------------------------------------------------------
# partitions


def partition_runs(node_executors: list[tuple[int, str]]) -> list[tuple[str, list[int]]]:
    """Maximal runs of consecutive nodes with the same executor.

    Args:
        node_executors: ``(node index, executor)`` in execution (topological) order.

    Returns:
        ``[(executor, [node indices])]`` in the same order.
    """
    runs: list[tuple[str, list[int]]] = []
    for j, ex in node_executors:
        if runs and runs[-1][0] == ex:
            runs[-1][1].append(j)
        else:
            runs.append((ex, [j]))
    return runs


def node_inputs(node) -> list[str]:
    """The tensors a node reads, including outer-scope names read by its subgraphs
    (If/Loop/Scan bodies), in order, without duplicates or empty names."""
    out: list[str] = []
    seen: set[str] = set()

    def add(name: str) -> None:
        if name and name not in seen:
            seen.add(name)
            out.append(name)

    for t in node.input:
        add(t)
    for name in _subgraph_free_names(node):
        add(name)
    return out


def _subgraph_free_names(node) -> list[str]:
    from onnx import AttributeProto

    free: list[str] = []
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                for t in node_inputs(n):
                    if t not in defined:
                        free.append(t)
                defined.update(o for o in n.output if o)
    return free


def build_partition_model(model, members: list[int], values: Mapping[str, Any], *, types: Mapping | None = None,
                          consumers: Mapping[str, set] | None = None, graph_outputs: Iterable[str] | None = None):
    """The stand-alone ONNX model of one partition of ``model``.

    Args:
        model: the prepared (shape-inferred) model.
        members: indices of the partition's nodes in ``model.graph.node``, in order.
        values: constant values by tensor name (initializers and folded outputs,
            from :func:`~torq_gen_config.model.split.fold_constants`); the ones the
            partition reads become its initializers.
        types: tensor name -> TypeProto (default: from the model's value infos).
        consumers: tensor name -> indices of the nodes that read it (default: computed).
        graph_outputs: the model's output names (default: from the model).

    Returns:
        ``(partition_model, io)`` with ``io = {"inputs": [names], "outputs": [names],
        "initializers": [names]}``. Graph inputs are the run-time tensors the nodes
        read that no member produces; graph outputs are the tensors the members
        produce that a non-member node reads or that are model outputs (if there are
        none, the tensors nobody reads, so the model stays valid). The graph is named
        ``main`` (the function name after the MLIR import); value infos of internal
        tensors are copied from ``model``.
    """
    import onnx
    from onnx import helper, numpy_helper

    from .model.split import _value_types

    types = types if types is not None else _value_types(model)
    consumers = consumers if consumers is not None else tensor_consumers(model)
    graph_outputs = list(graph_outputs if graph_outputs is not None else (o.name for o in model.graph.output))
    member_set = set(members)
    nodes = [model.graph.node[j] for j in members]
    produced: list[str] = [t for n in nodes for t in n.output if t]
    produced_set = set(produced)
    inputs, inits = [], []
    seen: set[str] = set()
    for n in nodes:
        for t in node_inputs(n):
            if t in produced_set or t in seen:
                continue
            seen.add(t)
            if t in values:
                inits.append(numpy_helper.from_array(_np(values[t]), name=t))
            else:
                inputs.append(_value_info(t, types))
    gout = set(graph_outputs)
    outs = [t for t in produced if t in gout or any(c not in member_set for c in consumers.get(t, ()))]
    if not outs:
        read_inside = {t for n in nodes for t in node_inputs(n)}
        outs = [t for t in produced if t not in read_inside] or produced[-1:]
    outputs = [_value_info(t, types) for t in outs]
    internal = [_value_info(t, types) for t in produced if t not in set(outs) and t in types]
    graph = helper.make_graph([_copy(n) for n in nodes], "main", inputs, outputs, initializer=inits,
                              value_info=internal)
    part = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="torq-gen-config")
    part.ir_version = model.ir_version
    helper.set_model_props(part, {"torq_gen_config.prepared_nodes": f"{members[0]}-{members[-1]}"})
    try:
        part = onnx.shape_inference.infer_shapes(part, data_prop=True)
    except Exception:  # keep the copied types; the importer reports what it lacks
        pass
    io = {"inputs": [vi.name for vi in inputs], "outputs": list(outs), "initializers": [t.name for t in inits]}
    return part, io


def tensor_consumers(model) -> dict[str, set]:
    """Tensor name -> indices of the nodes of ``model.graph`` that read it."""
    consumers: dict[str, set] = {}
    for j, n in enumerate(model.graph.node):
        for t in node_inputs(n):
            consumers.setdefault(t, set()).add(j)
    return consumers


def _np(value):
    import numpy as np

    return np.asarray(value)


def _copy(node):
    import onnx

    n = onnx.NodeProto()
    n.CopyFrom(node)
    return n


def _value_info(name: str, types: Mapping):
    import onnx

    vi = onnx.ValueInfoProto()
    vi.name = name
    if name in types:
        vi.type.CopyFrom(types[name])
    return vi


def effective_executor(executor: Mapping, compiler_options: Iterable[str] = (),
                       runtime_options: Iterable[str] = ()) -> dict:
    """The executor definition a run uses: the config's ``compiler_options`` /
    ``runtime_options`` (``--compiler-option`` / ``--runtime-option``) appended to the
    ``compile_flags`` / ``run_flags`` of iree executors, as in discovery."""
    from .jobs import executor_with_tool_options

    ex = copy.deepcopy(dict(executor))
    ex["options"] = dict(ex.get("options") or {})
    return copy.deepcopy(executor_with_tool_options(ex, list(compiler_options), list(runtime_options)))


def compile_definition(executor: Mapping) -> dict:
    """The part of an executor definition that affects compilation (iree ``run_flags``
    only matter at run time, so a runtime option change recompiles nothing)."""
    ex = copy.deepcopy(dict(executor))
    if ex.get("backend") == "iree" and "run_flags" in (ex.get("options") or {}):
        ex["options"] = {k: v for k, v in ex["options"].items() if k != "run_flags"}
    return ex


def partition_id(model_bytes: bytes, compile_def: Mapping, debug_ir: str | None) -> str:
    """``<executor>-<12 hex>``: hash of the partition model and how it is compiled."""
    h = hashlib.sha256(model_bytes)
    h.update(json.dumps({"executor": compile_def, "debug_ir": debug_ir}, sort_keys=True).encode("utf-8"))
    return f"{compile_def['name']}-{h.hexdigest()[:12]}"


def make_plan(model, manifest: Mapping, locations: Mapping | None, assignment: Mapping, executors: list[dict],
              partitions_dir: str | os.PathLike, *, compiler_options: Iterable[str] = (),
              runtime_options: Iterable[str] = (), write: bool = True, prune: bool = True) -> dict:
    """Partition the prepared model and write one ONNX model per partition.

    Args:
        model: the prepared model (``work/prepared.onnx``).
        manifest: the layer manifest (``work/layers/manifest.json``).
        locations: ``work/locations.json`` (for compiler-JSON assignments).
        assignment: the content of ``assignment.json``.
        executors: configured executors, priority order.
        compiler_options, runtime_options: extra flags for iree executors (config
            ``compiler_options`` / ``runtime_options``).
        partitions_dir: ``work/full/partitions``; receives ``<pid>/model.onnx``
            (rewritten only when its bytes change; directories of partitions not
            in this plan are removed when ``prune``).
        write: write the partition models (False: plan only, for tests).

    Returns:
        The plan (JSON-safe): ``partitions`` (in run order: ``index``, ``pid``,
        ``executor`` (name), ``backend``, ``needs_mlir``, ``first_node``,
        ``last_node``, ``num_nodes``, ``layer_ids``, ``inputs``, ``outputs``,
        ``num_initializers``, ``model``, ``executor_def`` (as run),
        ``compile_def`` (as compiled)), ``graph_inputs``, ``graph_outputs``,
        ``constant_outputs``, ``layer_executors``, ``fallbacks``, ``warnings``,
        ``source``, ``source_file``, ``options``.

    Raises:
        ConfigError: the assignment names an unknown executor.
        ValueError: a prepared node that is neither folded nor part of a layer
            (the manifest does not belong to this model).
    """
    from .backends import NEEDS_MLIR
    from .fileio import write_bytes_if_changed
    from .model.split import _value_types, fold_constants

    layers = manifest["layers"]
    by_name = {e["name"]: e for e in executors}
    by_layer, fallbacks, warnings = resolve_assignment(assignment, layers, locations, executors)
    values, folded, fold_warnings = fold_constants(model)
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
    types = _value_types(model)
    consumers = tensor_consumers(model)
    graph_outputs = [o.name for o in model.graph.output]
    debug_ir = (assignment.get("options") or {}).get("debug_ir")
    options = {"compiler_options": list(compiler_options), "runtime_options": list(runtime_options),
               "debug_ir": debug_ir}
    parts_dir = Path(partitions_dir)
    partitions = []
    for index, (ex_name, members) in enumerate(partition_runs(seq)):
        part_model, io = build_partition_model(model, members, values, types=types, consumers=consumers,
                                               graph_outputs=graph_outputs)
        data = part_model.SerializeToString(deterministic=True)
        run_def = effective_executor(by_name[ex_name], compiler_options, runtime_options)
        comp_def = compile_definition(run_def)
        pid = partition_id(data, comp_def, debug_ir)
        if debug_ir and run_def.get("backend") == "iree":
            flag = f"--dump-compilation-phases-to={os.path.join(debug_ir, pid)}"
            for d in (run_def, comp_def):
                d["options"]["compile_flags"] = list(d["options"].get("compile_flags") or []) + [flag]
        if write:
            write_bytes_if_changed(parts_dir / pid / PARTITION_MODEL, data)
        layer_ids: list[str] = []
        for j in members:
            if node_layer[j] not in layer_ids:
                layer_ids.append(node_layer[j])
        partitions.append({
            "index": index, "pid": pid, "executor": ex_name, "backend": run_def.get("backend"),
            "needs_mlir": bool(NEEDS_MLIR.get(run_def.get("backend"), True)),
            "first_node": members[0], "last_node": members[-1], "num_nodes": len(members),
            "layer_ids": layer_ids, "inputs": io["inputs"], "outputs": io["outputs"],
            "num_initializers": len(io["initializers"]),
            "model": str(parts_dir / pid / PARTITION_MODEL),
            "executor_def": run_def, "compile_def": comp_def,
        })
    if write and prune and parts_dir.is_dir():
        keep = {p["pid"] for p in partitions}
        for d in parts_dir.iterdir():
            if d.is_dir() and d.name not in keep:
                shutil.rmtree(d, ignore_errors=True)
    produced = {t for p in partitions for t in p["outputs"]}
    graph_inputs = [i.name for i in model.graph.input if i.name not in values]
    constant_outputs = [t for t in graph_outputs if t not in produced and t in values]
    missing = [t for t in graph_outputs if t not in produced and t not in values and t not in graph_inputs]
    if missing:
        raise ValueError(f"no partition produces model output(s) {missing}")
    return {
        "schema": PLAN_SCHEMA,
        "source": assignment.get("source"), "source_file": assignment.get("source_file"),
        "options": options,
        "num_partitions": len(partitions),
        "partitions": partitions,
        "graph_inputs": graph_inputs, "graph_outputs": graph_outputs, "constant_outputs": constant_outputs,
        "layer_executors": by_layer,
        "fallbacks": fallbacks,
        "warnings": warnings + fold_warnings,
        "folded_nodes": len(folded),
    }


# ----------------------------------------------------------------------------
# compile


def compile_partition(*, pid: str, model_path: str, executor: Mapping, work_dir: str, timeout_s: float,
                      log_path: str | None) -> dict:
    """Compile one partition for its executor; never raises for a failing partition.

    For backends that compile MLIR the partition is imported first
    (:func:`torq_gen_config.mlir.importer.import_model`, into ``<work_dir>/model.mlir``).

    Returns:
        The ``compiled.json`` content: ``status`` ``"ok"`` with ``compile_ms``,
        ``import_ms`` and ``artifact`` (``path``, ``info``: what
        :meth:`~torq_gen_config.backends.base.Backend.run` needs), or ``"error"``
        with ``failure`` (``stage``: import/compile/timeout/crash, ``during``,
        ``summary``, ``message``).
    """
    from .backends import make_backend
    from .backends.base import StageError
    from .tools import bounded_message, first_error_line

    res: dict[str, Any] = {
        "schema": COMPILED_SCHEMA, "pid": pid, "executor": executor.get("name"), "backend": executor.get("backend"),
        "status": None, "compile_ms": None, "import_ms": None, "artifact": None, "failure": None,
        "compiled_at": time.time(),
    }

    def fail(stage: str, message: str, during: str | None = None) -> dict:
        res["status"] = "error"
        res["failure"] = {"stage": stage, "during": during,
                          "summary": f"{stage} failed: {first_error_line(message)}"[:SUMMARY_LIMIT],
                          "message": bounded_message(message, MESSAGE_LIMIT)}
        return res

    Path(work_dir).mkdir(parents=True, exist_ok=True)
    kind = executor.get("backend")
    if kind in UNAVAILABLE_BACKENDS:
        return fail("compile", f"executor {executor.get('name')!r}: {UNAVAILABLE_BACKENDS[kind]}")
    try:
        backend = make_backend(executor)
    except Exception as e:
        return fail("compile", f"backend {kind!r} is not available: {e}")
    mlir_path = None
    if backend.needs_mlir:
        import onnx

        from .mlir.importer import import_model

        mlir_path = str(Path(work_dir) / PARTITION_MLIR)
        try:
            imp = import_model(onnx.load(model_path), mlir_path)
            res["import_ms"] = imp["import_ms"]
        except Exception as e:  # importer errors come as many exception types
            return fail("import", f"{type(e).__name__}: {str(e).strip()}")
    try:
        artifact = backend.compile(onnx_path=model_path, mlir_path=mlir_path, work_dir=work_dir,
                                   timeout_s=timeout_s, log_path=log_path)
    except StageError as e:
        return fail(e.stage, e.message, e.during)
    except Exception as e:  # a backend bug must not stop the workflow
        return fail("compile", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    res["status"] = "ok"
    res["compile_ms"] = _round(artifact.compile_ms)
    res["artifact"] = {"path": artifact.path, "info": artifact.info}
    try:
        res["tool"] = backend.describe()
    except Exception:
        res["tool"] = None
    return res


# ----------------------------------------------------------------------------
# run


def run_partitions(plan: Mapping, *, reference_npz: str, compiled: Mapping[str, Mapping], tolerance: Mapping,
                   timeout_s: float, partitions_dir: str | os.PathLike, log_path: str | None = None,
                   check_partitions: bool = True) -> dict:
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

    Returns:
        The result (JSON-safe): ``status`` (``success``/``difference``/``error``/
        ``unverified``), ``summary``, ``metrics``, ``num_over_tolerance``,
        ``failure`` (for errors: ``stage``, ``during``, ``summary``, ``message``,
        ``partition``, ``pid``, ``executor``, ``layer_ids``), ``partitions`` (per
        partition: ``index``, ``pid``, ``executor``, ``first_node``, ``last_node``,
        ``layer_ids``, ``compile_ms``, ``run_ms``, ``status``, ``partition_check``),
        ``timing`` (``compile_ms_total``, ``run_ms_total``, ``wall_ms``),
        ``reference``, ``fallbacks``, ``source``, ``options``.
    """
    from .backends import make_backend
    from .backends.base import StageError
    from .compare import compare_outputs, count_over_tolerance, derive_status
    from .reference import load_reference
    from .tools import bounded_message, first_error_line

    t0 = time.perf_counter()
    inputs, ref_outputs, meta = load_reference(reference_npz)
    result: dict[str, Any] = {
        "schema": RESULT_SCHEMA, "status": None, "summary": None, "tolerance_used": dict(tolerance),
        "metrics": None, "num_over_tolerance": None, "share_over_tolerance": None, "failure": None,
        "source": plan.get("source"), "source_file": plan.get("source_file"), "options": plan.get("options"),
        "num_partitions": len(plan["partitions"]), "partitions": [],
        "timing": {"compile_ms_total": None, "run_ms_total": None, "wall_ms": None},
        "reference": {k: meta.get(k) for k in ("status", "message", "engine", "ort_version",
                                                 "graph_optimization_level", "run_ms")},
        "fallbacks": plan.get("fallbacks") or [], "warnings": plan.get("warnings") or [],
        "layer_executors": plan.get("layer_executors"), "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    rows = result["partitions"]
    for p in plan["partitions"]:
        c = compiled.get(p["pid"]) or {}
        rows.append({"index": p["index"], "pid": p["pid"], "executor": p["executor"], "backend": p["backend"],
                     "first_node": p["first_node"], "last_node": p["last_node"], "num_nodes": p["num_nodes"],
                     "layer_ids": p["layer_ids"], "compile_ms": c.get("compile_ms"), "run_ms": None,
                     "status": "compiled" if c.get("status") == "ok" else "not run", "partition_check": None})

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
                "summary": f"{where}: {stage} failed: {first_error_line(message)}"[:SUMMARY_LIMIT],
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
    for k, (p, row) in enumerate(zip(plan["partitions"], rows)):
        c = compiled[p["pid"]]
        pdir = Path(partitions_dir) / p["pid"]
        feed = {n: store[n] for n in p["inputs"]}
        try:
            backend = make_backend(p["executor_def"])
            artifact = _artifact(c, pdir)
            outs, run_ms = backend.run(artifact, inputs=feed, input_names=p["inputs"], output_names=p["outputs"],
                                       work_dir=str(pdir / "run"), timeout_s=timeout_s, log_path=log_path)
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
            row["partition_check"] = _check_partition(p, str(pdir / PARTITION_MODEL), feed, outs, tolerance)
        store.update(outs)
        for name in [n for n in store if last_use.get(n, -1) <= k and n not in keep]:
            del store[name]  # no later partition reads it: free the memory

    actual = {n: store[n] for n in plan["graph_outputs"] if n in store}
    if meta.get("status") != "ok":
        return finish("unverified", f"the model ran, but the reference (ONNX Runtime) failed: "
                                    f"{first_error_line(meta.get('message') or '')}")
    try:
        metrics = compare_outputs(actual, ref_outputs, meta["output_names"])
        status, summary = derive_status(metrics, tolerance)
        count, share = count_over_tolerance(metrics, tolerance)
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
        return finish("error", f"compare failed: {msg}", {"stage": "compare", "during": None, "partition": None,
                                                          "pid": None, "executor": None, "layer_ids": [],
                                                          "summary": f"compare failed: {msg}"[:SUMMARY_LIMIT],
                                                          "message": bounded_message(msg + "\n" + traceback.format_exc())})
    result["metrics"] = metrics
    result["num_over_tolerance"] = count
    result["share_over_tolerance"] = share
    return finish(status, summary)


def _last_uses(plan: Mapping) -> dict[str, int]:
    """Tensor name -> index of the last partition that reads it."""
    last: dict[str, int] = {}
    for k, p in enumerate(plan["partitions"]):
        for n in p["inputs"]:
            last[n] = k
    return last


def _artifact(compiled: Mapping, pdir: Path):
    """The CompiledArtifact of ``compiled.json``, with its files found in ``pdir``."""
    from .backends.base import CompiledArtifact

    art = compiled.get("artifact") or {}
    info = dict(art.get("info") or {})
    if info.get("onnx_path"):
        info["onnx_path"] = str(pdir / PARTITION_MODEL)
    path = str(pdir / Path(art["path"]).name) if art.get("path") else None
    return CompiledArtifact(path=path, compile_ms=compiled.get("compile_ms"), info=info)


def _check_partition(p: Mapping, model_path: str, feed: Mapping, outs: Mapping, tolerance: Mapping) -> dict:
    """This partition's outputs against ONNX Runtime (optimizations off) on the same inputs."""
    try:
        import onnxruntime as ort

        from .compare import compare_outputs, derive_status

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        ref = dict(zip(p["outputs"], sess.run(list(p["outputs"]), {n: feed[n] for n in p["inputs"]})))
    except Exception as e:
        return {"status": "unverified", "summary": f"ONNX Runtime failed on the partition: {str(e).strip()[:300]}",
                "max_rel_diff": None, "max_abs_diff": None}
    try:
        m = compare_outputs(outs, ref, list(p["outputs"]))
        status, summary = derive_status(m, tolerance)
    except Exception as e:
        return {"status": "error", "summary": f"compare failed: {type(e).__name__}: {e}"[:SUMMARY_LIMIT],
                "max_rel_diff": None, "max_abs_diff": None}
    return {"status": status, "summary": summary[:SUMMARY_LIMIT], "max_rel_diff": m.get("max_rel_diff"),
            "max_abs_diff": m.get("max_abs_diff"), "mean_rel_diff": m.get("mean_rel_diff")}


def _constant_outputs(plan: Mapping) -> dict:
    """Model outputs that are constants (rare): evaluated again from the prepared model."""
    import onnx

    from .model.split import fold_constants

    model = onnx.load(plan["prepared_model"])
    values, _, _ = fold_constants(model)
    return {t: values[t] for t in plan["constant_outputs"]}


def _layer_span(layer_ids: list[str]) -> str:
    if not layer_ids:
        return "-"
    if len(layer_ids) == 1:
        return layer_ids[0]
    return f"{layer_ids[0]} .. {layer_ids[-1]} ({len(layer_ids)})"


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


# ----------------------------------------------------------------------------
# report


def full_model_section(result: Mapping, *, tolerance: Mapping, result_file: str | None = None) -> dict:
    """The report's ``full_model`` section, with the verdict re-derived from the
    metrics with ``tolerance`` (the report's ``default_tolerance``)."""
    from .compare import count_over_tolerance, derive_status, normalize_tolerance

    tol = normalize_tolerance(tolerance)
    status, summary = result.get("status"), result.get("summary")
    count, share = result.get("num_over_tolerance"), result.get("share_over_tolerance")
    if result.get("metrics") and status in ("success", "difference"):
        status, summary = derive_status(result["metrics"], tol)
        count, share = count_over_tolerance(result["metrics"], tol)
    execs: dict[str, int] = {}
    for ex in (result.get("layer_executors") or {}).values():
        execs[ex] = execs.get(ex, 0) + 1
    parts: dict[str, int] = {}
    for p in result.get("partitions") or []:
        parts[p["executor"]] = parts.get(p["executor"], 0) + 1
    return {
        "status": status,
        "summary": summary,
        "tolerance_used": tol,
        "metrics": result.get("metrics"),
        "num_over_tolerance": count,
        "share_over_tolerance": share,
        "failure": result.get("failure"),
        "assignment": {"source": result.get("source"), "source_file": result.get("source_file"),
                       "layer_counts": execs,
                       "layers_without_recommendation": list(result.get("fallbacks") or [])},
        "num_partitions": result.get("num_partitions"),
        "partition_counts": parts,
        "partitions": result.get("partitions"),
        "timing": result.get("timing"),
        "reference": result.get("reference"),
        "options": result.get("options"),
        "warnings": result.get("warnings") or [],
        "result_file": result_file,
        "generated_at": result.get("generated_at"),
    }


def render_full_model_text(section: Mapping) -> str:
    """The ``--- Full Model Comparison ---`` part of ``final_report_text``."""
    m = section.get("metrics") or {}
    t = section.get("timing") or {}
    a = section.get("assignment") or {}
    lines = [TEXT_MARKER, f"Status: {section.get('status')}"]
    if section.get("summary"):
        lines.append(f"  {section['summary']}")
    lines.append(f"Assignment: {a.get('source_file') or a.get('source')} "
                 f"({', '.join(f'{k}: {v}' for k, v in (a.get('layer_counts') or {}).items())} layers)")
    parts = section.get("partition_counts") or {}
    lines.append(f"Partitions: {section.get('num_partitions')} ({', '.join(f'{k}: {v}' for k, v in parts.items())})")
    lines.append(f"Compile time: {_fmt_ms(t.get('compile_ms_total'))} total; run time: {_fmt_ms(t.get('run_ms_total'))} "
                 "total (sum over partitions)")
    if m:
        lines.append(f"Max relative difference: {_fmt(m.get('max_rel_diff'))}")
        lines.append(f"Max absolute difference: {_fmt(m.get('max_abs_diff'))}")
        lines.append(f"Mean relative difference: {_fmt(m.get('mean_rel_diff'))}")
        if m.get("cosine_similarity") is not None:
            lines.append(f"Cosine similarity: {m['cosine_similarity']:.6f}")
        lines.append(f"Number of differences (over tolerance): {section.get('num_over_tolerance')} "
                     f"of {m.get('num_elements')} elements")
    f = section.get("failure")
    if f and f.get("summary") != section.get("summary"):
        lines.append(f"Failure: {f.get('summary')}")
    fb = a.get("layers_without_recommendation") or []
    if fb:
        lines.append(f"Layers without a recommendation: {len(fb)}")
        for item in fb[:20]:
            lines.append(f"  - {item['layer_id']} -> {item['executor']} ({item['reason']})")
        if len(fb) > 20:
            lines.append(f"  ... and {len(fb) - 20} more (see full_model.assignment in the report JSON)")
    checks = [p for p in section.get("partitions") or [] if (p.get("partition_check") or {}).get("status")
              not in (None, "success")]
    if checks:
        lines.append("Partitions that differ from ONNX Runtime on their own inputs:")
        for p in checks[:20]:
            c = p["partition_check"]
            lines.append(f"  - #{p['index']} {p['executor']} nodes {p['first_node']}-{p['last_node']} "
                         f"({_layer_span(p['layer_ids'])}): {c.get('status')}: {c.get('summary')}")
    return "\n".join(lines) + "\n"


def with_full_model_text(text: str, section: Mapping) -> str:
    """``final_report_text`` with its full-model part replaced by (or appended as) the current one."""
    text = text or ""
    pos = text.find(TEXT_MARKER)
    if pos >= 0:
        text = text[:pos]
    text = text.rstrip("\n") + "\n\n" if text.strip() else ""
    return text + render_full_model_text(section)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3e}"


def _fmt_ms(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x / 1000.0:.2f} s" if x >= 1000 else f"{x:.1f} ms"
