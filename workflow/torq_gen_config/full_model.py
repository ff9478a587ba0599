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

TORQ (mode ``"torq"``, :func:`assignment_mode`): when every executor the assignment
names is of the ``torq`` backend, the model is not cut. TORQ's compiler has a per-op
assignment pass (``--torq-executor-map``, keyed by ``line:col`` in ``work/full.mlir``),
so the plan has a single "partition" (pid ``torq-<12 hex>``, a hash of the executor
map, of ``full.mlir`` and of the compile options) whose ``compile_def`` carries
``whole_model_torq``: :func:`compile_partition` compiles ``full.mlir`` once with
``torq-compile ... --torq-executor-map=partitions/<pid>/executor_map.json`` and
:func:`run_partitions` runs the module once with ``torq-run-module`` on the reference
inputs. Layers without a choice are absent from the map (the compiler places them).
Torq and non-torq executors in one assignment are an error.
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
from .limits import MESSAGE_CHARS as MESSAGE_LIMIT, SUMMARY_CHARS as SUMMARY_LIMIT
from .model.graph import copy_proto, node_inputs, tensor_consumers, value_info, value_types  # noqa: F401 (node_inputs, tensor_consumers re-exported)

ASSIGNMENT_SCHEMA = "torq-gen-config/full-model-assignment/1"
PLAN_SCHEMA = "torq-gen-config/full-model-plan/1"
COMPILED_SCHEMA = "torq-gen-config/full-model-compiled/1"
RESULT_SCHEMA = "torq-gen-config/full-model-result/1"

#: Rules ``torq-gen-config run`` lets Snakemake execute (never discovery or the report;
#: the model preparation and split only when they are missing or out of date).
RUN_RULES = ("prepare_model", "import_full_model", "split_layers", "plan_full_model", "compile_partition",
             "full_reference", "run_full_model")
#: Marker of the full-model part of ``final_report_text``.
TEXT_MARKER = "--- Full Model Comparison ---"
#: Backend kinds that cannot be the executor of one partition of a chain (torq
#: compiles the whole model at once, see :func:`assignment_mode`).
UNAVAILABLE_BACKENDS = {"torq": "the torq backend is not available as the executor of one partition of a chain: "
                                 "a torq assignment is compiled as one whole model (torq-gen-config run does that "
                                 "when every assigned executor is a torq one)"}
#: The backend whose assignments run as one whole-model compile.
TORQ_BACKEND = "torq"
#: Name (and pid prefix) of the single whole-model "partition" of a torq plan.
TORQ_PARTITION = "torq"
#: The executor map of a torq plan, in ``partitions/<pid>/``.
TORQ_MAP_FILE = "executor_map.json"
PARTITION_MODEL = "model.onnx"
PARTITION_MLIR = "model.mlir"
COMPILED_FILE = "compiled.json"
_NULL_NAMES = ("", "null", "none")


# ----------------------------------------------------------------------------
# what to run: the selection from the report or compiler JSON (assignment.json)


#: Kept as nodes in partitions (never constant-folded): with ``--quantize`` the
#: executor must see int8 weights and their DequantizeLinear, as in the whole model.
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


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
        {"executor": name or None, "statuses": {executor: status}, ["untested": why]}},
        "locations": None}`` (``untested``: the not-testable or skip reason).

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
        untested = op.get("not_testable_reason") or op.get("skipped_reason")
        if untested:
            layers[str(layer_id)]["untested"] = str(untested)
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


def _named_executors(selection: Mapping) -> dict[str, list[str]]:
    """Executor name -> the layer IDs (or ``line:col`` keys) the selection assigns to it."""
    named: dict[str, list[str]] = {}
    for key, entry in (selection.get("layers") or {}).items():
        if entry.get("executor"):
            named.setdefault(entry["executor"], []).append(key)
    for key, name in (selection.get("locations") or {}).items():
        if name:
            named.setdefault(name, []).append(key)
    return named


def check_selection(selection: Mapping, executors: list[dict]) -> str:
    """Check that every executor named by the selection is configured, and tell how
    the model runs (:func:`assignment_mode`).

    Returns:
        ``"torq"`` (one whole-model torq-compile) or ``"partitions"`` (a chain).

    Raises:
        ConfigError: an unknown executor name (the message lists the configured
            ones), or torq and non-torq executors in one assignment.
    """
    by_name = {e["name"]: e for e in executors}
    named = _named_executors(selection)
    unknown = sorted(n for n in named if n not in by_name)
    if unknown:
        n = unknown[0]
        raise ConfigError(
            f"{selection.get('source_file') or 'the assignment'} assigns executor {n!r} "
            f"(e.g. to {named[n][0]}), which is not configured (configured: {', '.join(by_name)}); "
            "pass the --config-file used for discovery"
        )
    return assignment_mode(selection, executors)


def assignment_mode(selection: Mapping, executors: list[dict]) -> str:
    """How an assignment runs: ``"torq"`` when every executor it names is of the
    ``torq`` backend (with no executor named: when the first configured executor
    is), else ``"partitions"``.

    Raises:
        ConfigError: the assignment names torq and non-torq executors (one run cannot
            do both: torq compiles the whole model at once, the others run as a chain).
    """
    by_name = {e["name"]: e for e in executors}
    named = {n: keys for n, keys in _named_executors(selection).items() if n in by_name}
    if not named:
        return "torq" if executors and executors[0].get("backend") == TORQ_BACKEND else "partitions"
    torq = [n for n in by_name if n in named and by_name[n].get("backend") == TORQ_BACKEND]
    other = [n for n in by_name if n in named and by_name[n].get("backend") != TORQ_BACKEND]
    if torq and other:
        def desc(names):
            return ", ".join(f"{n} ({by_name[n].get('backend')}: {len(named[n])} layer(s), e.g. {named[n][0]})"
                             for n in names)
        raise ConfigError(
            f"{selection.get('source_file') or 'the assignment'} mixes executors of the torq backend "
            f"[{desc(torq)}] with other executors [{desc(other)}]: torq assignments are compiled as one whole "
            "model by torq-compile (--torq-executor-map) and the others run as a chain of partitions, and one run "
            "cannot do both; assign every layer to torq executors only, or to non-torq executors only "
            "(torq-gen-config edit, or the report JSON)"
        )
    return "torq" if torq else "partitions"


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
                why = ("every tested executor failed on it (" + ", ".join(tested) + ")") if tested else (
                    f"it was not tested ({entry['untested']})" if entry.get("untested") else "it was not tested")
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


    types = types if types is not None else value_types(model)
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
                inputs.append(value_info(t, types))
    gout = set(graph_outputs)
    outs = [t for t in produced if t in gout or any(c not in member_set for c in consumers.get(t, ()))]
    if not outs:
        read_inside = {t for n in nodes for t in node_inputs(n)}
        outs = [t for t in produced if t not in read_inside] or produced[-1:]
    outputs = [value_info(t, types) for t in outs]
    internal = [value_info(t, types) for t in produced if t not in set(outs) and t in types]
    graph = helper.make_graph([copy_proto(n) for n in nodes], "main", inputs, outputs, initializer=inits,
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


def _np(value):
    import numpy as np

    return np.asarray(value)


def effective_executor(executor: Mapping, compiler_options: Iterable[str] = (),
                       runtime_options: Iterable[str] = ()) -> dict:
    """The executor definition a run uses: the config's ``compiler_options`` /
    ``runtime_options`` (``--compiler-option`` / ``--runtime-option``) appended to the
    ``compile_flags`` / ``run_flags`` of iree executors, as in discovery."""
    from .backends import executor_with_tool_options

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
              runtime_options: Iterable[str] = (), write: bool = True, prune: bool = True,
              full_mlir: str | None = None) -> dict:
    """Partition the prepared model and write one ONNX model per partition.

    When every executor of the assignment is a torq one (:func:`assignment_mode`),
    the plan is :func:`make_torq_plan`'s instead: one whole-model "partition"
    compiled from ``full_mlir`` with an executor map.

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
        full_mlir: ``work/full.mlir`` (only used, and then needed, for a torq plan).

    Returns:
        The plan (JSON-safe): ``partitions`` (in run order: ``index``, ``pid``,
        ``executor`` (name), ``backend``, ``needs_mlir``, ``first_node``,
        ``last_node``, ``num_nodes``, ``layer_ids``, ``inputs``, ``outputs``,
        ``num_initializers``, ``model``, ``executor_def`` (as run),
        ``compile_def`` (as compiled)), ``graph_inputs``, ``graph_outputs``,
        ``constant_outputs``, ``layer_executors``, ``fallbacks``, ``warnings``,
        ``source``, ``source_file``, ``options``.

    Raises:
        ConfigError: the assignment names an unknown executor, or mixes torq and
            non-torq executors.
        ValueError: a prepared node that is neither folded nor part of a layer
            (the manifest does not belong to this model).
    """
    from .backends import NEEDS_MLIR
    from .fileio import write_bytes_if_changed
    from .model.split import fold_constants

    if check_selection(assignment, executors) == "torq":
        return make_torq_plan(model, manifest, locations, assignment, executors, partitions_dir,
                              compiler_options=compiler_options, runtime_options=runtime_options, write=write,
                              prune=prune, full_mlir=full_mlir)
    layers = manifest["layers"]
    by_name = {e["name"]: e for e in executors}
    # a layer without a choice never falls back to a torq executor (a chain cannot run one)
    chain_executors = [e for e in executors if e.get("backend") != TORQ_BACKEND]
    by_layer, fallbacks, warnings = resolve_assignment(assignment, layers, locations, chain_executors)
    values, folded, fold_warnings = fold_constants(model, keep_op_types=QDQ_OPS)
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
    if write and prune:
        _prune(parts_dir, {p["pid"] for p in partitions})
    produced = {t for p in partitions for t in p["outputs"]}
    graph_inputs = [i.name for i in model.graph.input if i.name not in values]
    constant_outputs = [t for t in graph_outputs if t not in produced and t in values]
    missing = [t for t in graph_outputs if t not in produced and t not in values and t not in graph_inputs]
    if missing:
        raise ValueError(f"no partition produces model output(s) {missing}")
    return {
        "schema": PLAN_SCHEMA,
        "mode": "partitions",
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


def _prune(parts_dir: Path, keep: set[str]) -> None:
    if parts_dir.is_dir():
        for d in parts_dir.iterdir():
            if d.is_dir() and d.name not in keep:
                shutil.rmtree(d, ignore_errors=True)


def _file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def torq_options(executors: list[dict], compiler_options: Iterable[str] = (),
                 runtime_options: Iterable[str] = ()) -> tuple[dict, dict[str, str]]:
    """The options of the one whole-model compile and run of these torq executors.

    Returns:
        ``(options, torq_names)``: ``options`` = ``torq_hw``, ``torq_hw_type``,
        ``compile_flags``, ``run_flags`` (with ``--compiler-option`` /
        ``--runtime-option`` appended); ``torq_names`` maps each executor's name to
        its TORQ executor (its ``executor`` option: ``nss``, ``css`` or ``host``), the
        name the executor map must use.

    Raises:
        ConfigError: invalid options, or executors that differ in one of the four
            options (the model is compiled once, with one set).
    """
    from .backends.torq import _parse_options

    opts: dict | None = None
    first = None
    names: dict[str, str] = {}
    for e in executors:
        o = _parse_options(e["name"], effective_executor(e, compiler_options, runtime_options).get("options"))
        names[e["name"]] = o["executor"]
        o = {k: o[k] for k in ("torq_hw", "torq_hw_type", "compile_flags", "run_flags")}
        if opts is None:
            opts, first = o, e["name"]
        elif o != opts:
            k = next(k for k in o if o[k] != opts[k])
            raise ConfigError(
                f"the torq executors {first!r} and {e['name']!r} differ in option {k!r} ({opts[k]!r} vs {o[k]!r}): "
                "the whole model is compiled and run once, with one torq_hw, torq_hw_type, compile_flags and "
                "run_flags, so they must be equal"
            )
    return opts or {}, names


def make_torq_plan(model, manifest: Mapping, locations: Mapping | None, assignment: Mapping, executors: list[dict],
                   partitions_dir: str | os.PathLike, *, compiler_options: Iterable[str] = (),
                   runtime_options: Iterable[str] = (), write: bool = True, prune: bool = True,
                   full_mlir: str | None = None) -> dict:
    """The plan of a torq assignment: the whole model in one "partition".

    The executor map (``partitions/<pid>/executor_map.json``, the compiler JSON's
    form: ``{"op_assignments": {"L:C": {"executor": "nss"}}, "model_name"}``) has one
    entry per layer with a choice (report ``recommended_executor``, or the compiler
    JSON's entry for the layer's ``line:col``), keyed by the layer's ``line:col`` in
    ``full_mlir`` and naming its TORQ executor (the ``executor`` option). A layer
    without a choice (or without a verified ``line:col``) is not in the map: the
    compiler places it; ``fallbacks`` lists it with ``executor: None``.

    The pid is ``torq-<12 hex>``: a hash of the map, of ``full_mlir``'s content and
    of the compile options (and ``debug_ir``), so a changed assignment recompiles and
    an unchanged one reruns nothing. The partition's ``compile_def`` carries
    ``whole_model_torq`` (the MLIR path and hashes, the import status), which
    :func:`compile_partition` recognises.

    Returns:
        A plan like :func:`make_plan`'s with ``mode: "torq"``, one partition
        (``model`` = the executor map, ``whole_model_torq: True``), plus
        ``executor_map``, ``num_map_entries``, ``torq_executors``.

    Raises:
        ConfigError: unknown executors, torq executors with different options.
    """
    from .fileio import write_bytes_if_changed
    from .mlir.importer import layer_location

    layers = manifest["layers"]
    by_name = {e["name"]: e for e in executors}
    locs = locations or {}
    chosen, by_loc = assignment.get("layers"), assignment.get("locations")
    left = "not in the executor map: torq-compile places it"
    entries: dict[str, str] = {}
    by_layer: dict[str, str] = {}
    fallbacks: list[dict] = []
    warnings: list[str] = []
    layer_locs: set[str] = set()
    for layer in layers:
        lid = layer["layer_id"]
        loc = layer_location(layer, locs)
        if loc:
            layer_locs.add(loc)
        ex = None
        if chosen is not None:
            entry = chosen.get(lid)
            if entry is None:
                why = "not in the report (the model changed since discovery?)"
            else:
                ex = entry.get("executor")
                st = entry.get("statuses") or {}
                why = "no recommendation (" + (", ".join(f"{k}: {v}" for k, v in st.items()) or "not tested") + ")"
        else:
            ex = (by_loc or {}).get(loc) if loc else None
            if loc is None:
                why = "the layer has no verified line:col in full.mlir, so the compiler JSON cannot name it"
            elif loc in (by_loc or {}):
                why = f"the compiler JSON has no executor for {loc}"
            else:
                why = f"not in the compiler JSON ({loc})"
        if ex and ex not in by_name:
            raise ConfigError(f"the assignment names executor {ex!r}, which is not configured "
                              f"(configured: {', '.join(by_name)})")
        if ex and loc is None:
            why = f"assigned to {ex}, but the layer has no verified line:col in full.mlir, so the map cannot name it"
            ex = None
        if ex:
            entries[loc] = ex
            by_layer[lid] = ex
        else:
            fallbacks.append({"layer_id": lid, "executor": None, "reason": f"{why}; {left}"})
    if chosen is not None:
        known = {l["layer_id"] for l in layers}
        stale = [lid for lid in chosen if lid not in known]
        if stale:
            warnings.append(f"{len(stale)} layer(s) of the report are not in the model (e.g. {stale[0]}); ignored")
    else:
        stray = [k for k, v in (by_loc or {}).items() if v and k not in layer_locs]
        if stray:
            warnings.append(f"{len(stray)} entr(y/ies) of the compiler JSON match no layer's line:col "
                            f"(e.g. {stray[0]}); not in the executor map")
    if locs.get("status") not in (None, "ok"):
        warnings.append(f"the full-model MLIR import failed ({locs.get('message') or 'no message'}): "
                        "torq-compile has nothing to compile")
    used = [n for n in by_name if n in set(entries.values())] or \
           [n for n, e in by_name.items() if e.get("backend") == TORQ_BACKEND]
    opts, torq_names = torq_options([by_name[n] for n in used], compiler_options, runtime_options)
    ordered = sorted(entries, key=lambda k: tuple(int(x) for x in k.split(":")))
    doc = {"op_assignments": {k: {"executor": torq_names[entries[k]]} for k in ordered},
           "model_name": assignment.get("model_name")}
    data = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
    mlir_sha = _file_sha256(full_mlir) if full_mlir and os.path.isfile(full_mlir) else None
    debug_ir = (assignment.get("options") or {}).get("debug_ir")
    comp_opts = {k: opts[k] for k in ("torq_hw", "torq_hw_type", "compile_flags")}
    h = hashlib.sha256(data)
    h.update(json.dumps({"options": comp_opts, "mlir_sha256": mlir_sha, "debug_ir": debug_ir},
                        sort_keys=True).encode("utf-8"))
    pid = f"{TORQ_PARTITION}-{h.hexdigest()[:12]}"
    if debug_ir:
        comp_opts["compile_flags"] = comp_opts["compile_flags"] + \
            [f"--dump-compilation-phases-to={os.path.join(debug_ir, pid)}"]
    whole = {"mlir": full_mlir, "mlir_sha256": mlir_sha,
             "executor_map_sha256": hashlib.sha256(data).hexdigest(),
             "import_status": locs.get("status"), "import_message": locs.get("message")}
    comp_def = {"name": TORQ_PARTITION, "backend": TORQ_BACKEND, "executors": used, "options": comp_opts,
                "whole_model_torq": whole}
    run_def = {**copy.deepcopy(comp_def), "options": {**comp_opts, "run_flags": opts["run_flags"]}}
    parts_dir = Path(partitions_dir)
    map_path = parts_dir / pid / TORQ_MAP_FILE
    if write:
        write_bytes_if_changed(map_path, data)
    if write and prune:
        _prune(parts_dir, {pid})
    inits = {t.name for t in model.graph.initializer}
    graph_inputs = [i.name for i in model.graph.input if i.name not in inits]
    graph_outputs = [o.name for o in model.graph.output]
    nodes = sorted(j for l in layers for j in l["prepared_node_indices"])
    part = {
        "index": 0, "pid": pid, "executor": TORQ_PARTITION, "backend": TORQ_BACKEND, "needs_mlir": True,
        "whole_model_torq": True,
        "first_node": nodes[0] if nodes else None, "last_node": nodes[-1] if nodes else None,
        "num_nodes": len(nodes), "layer_ids": [l["layer_id"] for l in layers],
        "inputs": graph_inputs, "outputs": graph_outputs, "num_initializers": len(inits),
        "model": str(map_path), "executor_def": run_def, "compile_def": comp_def,
    }
    return {
        "schema": PLAN_SCHEMA,
        "mode": "torq",
        "source": assignment.get("source"), "source_file": assignment.get("source_file"),
        "options": {"compiler_options": list(compiler_options), "runtime_options": list(runtime_options),
                    "debug_ir": debug_ir},
        "num_partitions": 1,
        "partitions": [part],
        "graph_inputs": graph_inputs, "graph_outputs": graph_outputs, "constant_outputs": [],
        "layer_executors": by_layer,
        "fallbacks": fallbacks,
        "warnings": warnings,
        "executor_map": str(map_path),
        "num_map_entries": len(ordered),
        "torq_executors": used,
        "full_mlir": full_mlir,
    }


# ----------------------------------------------------------------------------
# compile


def compile_partition(*, pid: str, model_path: str, executor: Mapping, work_dir: str, timeout_s: float,
                      log_path: str | None) -> dict:
    """Compile one partition for its executor; never raises for a failing partition.

    For backends that compile MLIR the partition is imported first
    (:func:`torq_gen_config.mlir.importer.import_model`, into ``<work_dir>/model.mlir``).
    The whole-model partition of a torq plan (``executor["whole_model_torq"]``,
    :func:`make_torq_plan`) is compiled from ``full.mlir`` with ``model_path`` (its
    executor map) as ``--torq-executor-map``; a missing ``torq-compile`` is a
    ``compile`` error whose message names every place searched.

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
    if executor.get("whole_model_torq"):
        return _compile_whole_model_torq(res, fail, executor=executor, executor_map=model_path, work_dir=work_dir,
                                         timeout_s=timeout_s, log_path=log_path)
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
        res["tool"] = backend.describe(probe_timeout_s=min(float(timeout_s), 60.0))
    except Exception:
        res["tool"] = None
    return res


def mlir_function(mlir_path: str | os.PathLike) -> tuple[str | None, dict | None]:
    """The name and signature of the first ``func.func`` of an imported model (the
    graph name becomes the function name; a quoted name is returned unquoted).

    Returns:
        ``(name, signature)`` (signature as
        :func:`~torq_gen_config.backends.iree.parse_mlir_signature`), ``(None, None)``
        when there is no function header.
    """
    import re

    from .backends.iree import parse_mlir_signature

    pat = re.compile(r'func\.func @("(?:[^"\\]|\\.)*"|[A-Za-z0-9_$.-]+)\(')
    with open(mlir_path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            m = pat.search(line)
            if m:
                token = m.group(1)
                return token.strip('"'), parse_mlir_signature(mlir_path, function=token)
    return None, None


def _compile_whole_model_torq(res: dict, fail, *, executor: Mapping, executor_map: str, work_dir: str,
                              timeout_s: float, log_path: str | None) -> dict:
    """:func:`compile_partition` for the whole-model partition of a torq plan:
    ``torq-compile <full.mlir> -o <work>/module.vmfb --torq-hw=... [--torq-target-host-triple=native]
    <compile_flags> --torq-executor-map=<work>/executor_map.json``, run inside ``work_dir``."""
    from .backends.base import StageError, raise_for_tool_failure
    from .backends.torq import MODULE_FILE, TorqBackend, full_model_compile_argv
    from .tools import ToolNotFoundError, run_tool

    whole = executor["whole_model_torq"]
    mlir = whole.get("mlir")
    if whole.get("import_status") not in (None, "ok") or not mlir or not os.path.isfile(mlir) \
            or os.path.getsize(mlir) == 0:
        detail = f": {whole['import_message']}" if whole.get("import_message") else ""
        return fail("import", f"the full-model MLIR {mlir} is missing or empty: the import of the prepared model "
                              f"failed{detail}")
    work = Path(work_dir).absolute()
    out = work / MODULE_FILE
    out.unlink(missing_ok=True)
    opts = dict(executor.get("options") or {})
    try:
        argv = full_model_compile_argv(mlir, out, executor_map, opts)
    except ToolNotFoundError as e:
        _append_log(log_path, f"torq backend: {e}")
        return fail("compile", str(e))
    except ConfigError as e:
        return fail("compile", str(e))
    try:
        tr = run_tool(argv, timeout_s=timeout_s, cwd=str(work), log_path=log_path)
        raise_for_tool_failure(tr, tool="torq-compile", during="compile", timeout_s=timeout_s)
        if not out.is_file():
            raise StageError("compile", f"torq-compile exited with status 0 but wrote no module ({out})")
    except StageError as e:
        out.unlink(missing_ok=True)
        return fail(e.stage, e.message, e.during)
    except Exception as e:  # e.g. the tool is not executable
        out.unlink(missing_ok=True)
        return fail("compile", f"{type(e).__name__}: {e}")
    try:
        function, signature = mlir_function(mlir)
    except OSError:
        function, signature = None, None
    res["status"] = "ok"
    res["compile_ms"] = _round(tr.wall_ms)
    res["artifact"] = {"path": str(out), "info": {
        "argv": argv, "mlir_path": os.path.abspath(mlir), "executor_map": os.path.abspath(executor_map),
        "executors": executor.get("executors"), "function": function, "signature": signature,
        "torq_hw": opts.get("torq_hw"), "torq_hw_type": opts.get("torq_hw_type"), "vmfb_bytes": out.stat().st_size}}
    try:
        tool = TorqBackend(TORQ_PARTITION, _torq_backend_options(opts)).describe(
            probe_timeout_s=min(float(timeout_s), 60.0))
        res["tool"] = {k: v for k, v in tool.items() if k not in ("executor", "forcing_flags")}
    except Exception:
        res["tool"] = None
    return res


def _torq_backend_options(opts: Mapping) -> dict:
    """Options for a TorqBackend that runs (or describes) a whole-model module; the
    ``executor`` option only selects forcing flags, which a whole-model compile has not."""
    return {**{k: v for k, v in opts.items() if k in ("torq_hw", "torq_hw_type", "compile_flags", "run_flags")},
            "executor": "nss"}


def _append_log(log_path: str | None, text: str) -> None:
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(text.rstrip("\n") + "\n")


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
        ``reference``, ``fallbacks``, ``source``, ``options``, ``mode``. A torq plan
        (``mode: "torq"``) is run by :func:`run_whole_model_torq` (same result shape).
    """
    from .backends import make_backend
    from .backends.base import StageError
    from .compare import dequantized_outputs_of_file
    from .reference import load_reference
    from .tools import bounded_message, first_error_line

    if plan.get("mode") == "torq":
        return run_whole_model_torq(plan, reference_npz=reference_npz, compiled=compiled, tolerance=tolerance,
                                    timeout_s=timeout_s, partitions_dir=partitions_dir, log_path=log_path)
    t0 = time.perf_counter()
    inputs, ref_outputs, meta = load_reference(reference_npz)
    result = _new_result(plan, tolerance, meta)
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
    levels: dict[str, dict] = {}  # model outputs a DequantizeLinear writes: compared as int levels
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
            row["partition_check"] = _check_partition(p, str(pdir / PARTITION_MODEL), feed, outs, tolerance,
                                                      timeout_s=timeout_s)
        if keep & set(p["outputs"]):
            part_levels = dequantized_outputs_of_file(str(pdir / PARTITION_MODEL))
            levels.update({n: q for n, q in part_levels.items() if n in keep})
        store.update(outs)
        for name in [n for n in store if last_use.get(n, -1) <= k and n not in keep]:
            del store[name]  # no later partition reads it: free the memory

    actual = {n: store[n] for n in plan["graph_outputs"] if n in store}
    return _compare_and_finish(result, finish, actual, ref_outputs, meta, tolerance, levels=levels,
                               model_path=plan.get("prepared_model"))


def _new_result(plan: Mapping, tolerance: Mapping, meta: Mapping) -> dict:
    """The result skeleton (``result.json``) of a run of ``plan``."""
    return {
        "schema": RESULT_SCHEMA, "mode": plan.get("mode") or "partitions", "status": None, "summary": None,
        "tolerance_used": dict(tolerance),
        "metrics": None, "num_over_tolerance": None, "share_over_tolerance": None, "failure": None,
        "source": plan.get("source"), "source_file": plan.get("source_file"), "options": plan.get("options"),
        "num_partitions": len(plan["partitions"]), "partitions": [],
        "timing": {"compile_ms_total": None, "run_ms_total": None, "wall_ms": None},
        "reference": {k: meta.get(k) for k in ("status", "message", "engine", "ort_version",
                                                 "graph_optimization_level", "run_ms")},
        "fallbacks": plan.get("fallbacks") or [], "warnings": plan.get("warnings") or [],
        "layer_executors": plan.get("layer_executors"), "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _compare_and_finish(result: dict, finish, actual: Mapping, ref_outputs: Mapping, meta: Mapping,
                        tolerance: Mapping, levels: Mapping[str, dict] | None = None,
                        model_path: str | None = None) -> dict:
    """Compare the model's outputs with the reference and finish the result;
    ``levels``: outputs a DequantizeLinear writes, compared as their integer levels
    (``--quantize``; docs/comparison.md); ``model_path``: the model run (its outputs
    that carry quantized data may differ by one step, other integers are exact).
    Float outputs must also reach FULL_MODEL_MIN_COSINE."""
    from .compare import (FULL_MODEL_MIN_COSINE, arrays_as_levels, compare_outputs, count_over_tolerance,
                          derive_status, quantized_data_outputs_of_file)
    from .tools import bounded_message, first_error_line

    if meta.get("status") != "ok":
        return finish("unverified", f"the model ran, but the reference (ONNX Runtime) failed: "
                                    f"{first_error_line(meta.get('message') or '')}")
    try:
        if levels:
            actual, ref_outputs = arrays_as_levels(actual, levels), arrays_as_levels(ref_outputs, levels)
        quantized = set(levels or ()) | quantized_data_outputs_of_file(model_path)
        metrics = compare_outputs(actual, ref_outputs, meta["output_names"], min_cosine=FULL_MODEL_MIN_COSINE,
                                  quantized_outputs=quantized)
        if levels:
            metrics["quantized_levels"] = dict(levels)
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


def run_whole_model_torq(plan: Mapping, *, reference_npz: str, compiled: Mapping[str, Mapping], tolerance: Mapping,
                         timeout_s: float, partitions_dir: str | os.PathLike, log_path: str | None = None) -> dict:
    """Run the whole-model module of a torq plan once and compare it with the reference.

    ``torq-run-module --module=<pid>/module.vmfb --function=<the model's function>
    --output=@<pid>/run/outputs/output_<i>.bin ... --torq_hw_type=... <run_flags>
    --input=<spec>=@<pid>/run/inputs/input_<i>.bin ...`` on the reference inputs (the
    model's graph inputs in order), outputs read with the shapes and dtypes of
    ``full.mlir``'s signature. A failed compile (e.g. ``torq-compile`` not found) or
    run is an ``error`` result whose failure names the stage and the message.

    Returns:
        The result in :func:`run_partitions`' shape (``mode: "torq"``, one partition,
        ``partition_check`` None: the partition is the model), plus ``torq``:
        ``executor_map``, ``num_map_entries``, ``executors``, ``compile_argv``.
    """
    from .backends.base import CompiledArtifact, StageError
    from .backends.torq import MODULE_FILE, TorqBackend
    from .reference import load_reference
    from .tools import bounded_message, first_error_line

    t0 = time.perf_counter()
    inputs, ref_outputs, meta = load_reference(reference_npz)
    result = _new_result(plan, tolerance, meta)
    p = plan["partitions"][0]
    c = compiled.get(p["pid"]) or {}
    info = (c.get("artifact") or {}).get("info") or {}
    result["torq"] = {"executor_map": plan.get("executor_map"), "num_map_entries": plan.get("num_map_entries"),
                      "executors": plan.get("torq_executors"), "compile_argv": info.get("argv")}
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
        where = f"whole model on torq (one torq-compile with --torq-executor-map, {len(p['layer_ids'])} layers)"
        return {"stage": stage, "during": during, "partition": 0, "pid": p["pid"], "executor": p["executor"],
                "layer_ids": p["layer_ids"],
                "summary": f"{where}: {stage} failed: {first_error_line(message)}"[:SUMMARY_LIMIT],
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
        backend = TorqBackend(TORQ_PARTITION, _torq_backend_options((p.get("executor_def") or {}).get("options") or {}))
        artifact = CompiledArtifact(path=str(pdir / MODULE_FILE), compile_ms=c.get("compile_ms"),
                                    info={"function": info.get("function"), "signature": info.get("signature")})
        outs, run_ms = backend.run(artifact, inputs={n: inputs[n] for n in p["inputs"]}, input_names=p["inputs"],
                                   output_names=p["outputs"], work_dir=str(pdir / "run"), timeout_s=timeout_s,
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
                               model_path=plan.get("prepared_model"))


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


def _check_partition(p: Mapping, model_path: str, feed: Mapping, outs: Mapping, tolerance: Mapping,
                     timeout_s: float | None = None) -> dict:
    """This partition's outputs against ONNX Runtime (optimizations off; a bf16
    partition widened to fp32, see :func:`~torq_gen_config.reference_run.run_reference`)
    on the same inputs, run in a supervised worker (:mod:`torq_gen_config.isolation`)."""
    try:
        import onnx

        from .compare import FULL_MODEL_MIN_COSINE, compare_on_model, derive_status
        from .isolation import run_isolated
        from .limits import call_limit
        from .reference import DEFAULT_TIMEOUT_S
        from .reference_run import run_reference_file

        part_model = onnx.load(model_path, load_external_data=False)
        outs_ref, _ = run_isolated(run_reference_file, (model_path, {n: feed[n] for n in p["inputs"]},
                                                        list(p["outputs"]), "onnxruntime", timeout_s),
                                   limit_s=call_limit(timeout_s or DEFAULT_TIMEOUT_S),
                                   what="ONNX Runtime on the partition")
        ref = dict(zip(p["outputs"], outs_ref))
    except Exception as e:
        return {"status": "unverified", "summary": f"ONNX Runtime failed on the partition: {str(e).strip()[:300]}",
                "max_rel_diff": None, "max_abs_diff": None}
    try:
        m = compare_on_model(part_model, outs, ref, list(p["outputs"]), min_cosine=FULL_MODEL_MIN_COSINE)
        status, summary = derive_status(m, tolerance)
    except Exception as e:
        return {"status": "error", "summary": f"compare failed: {type(e).__name__}: {e}"[:SUMMARY_LIMIT],
                "max_rel_diff": None, "max_abs_diff": None}
    return {"status": status, "summary": summary[:SUMMARY_LIMIT], "max_rel_diff": m.get("max_rel_diff"),
            "max_abs_diff": m.get("max_abs_diff"), "mean_rel_diff": m.get("mean_rel_diff"),
            "cosine_similarity": m.get("cosine_similarity"), "inconclusive": m.get("inconclusive")}


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
        "mode": result.get("mode") or "partitions",
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
        **({"torq": result.get("torq")} if result.get("mode") == "torq" else {}),
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
    if section.get("mode") == "torq":
        tq = section.get("torq") or {}
        lines.append(f"Mode: whole model, one torq-compile with --torq-executor-map "
                     f"({tq.get('num_map_entries')} line:col entries: {tq.get('executor_map')})")
        lines.append(f"Compile time: {_fmt_ms(t.get('compile_ms_total'))}; run time: {_fmt_ms(t.get('run_ms_total'))}")
    else:
        lines.append(f"Partitions: {section.get('num_partitions')} "
                     f"({', '.join(f'{k}: {v}' for k, v in parts.items())})")
        lines.append(f"Compile time: {_fmt_ms(t.get('compile_ms_total'))} total; run time: "
                     f"{_fmt_ms(t.get('run_ms_total'))} total (sum over partitions)")
    ref = section.get("reference") or {}
    if ref.get("status") not in (None, "ok"):
        lines.append(f"Reference failed: {ref.get('message') or ref.get('status')} (the outputs were not compared)")
    if m:
        outs = m.get("outputs") or []
        has_float = any(o.get("kind") == "float" for o in outs)
        if has_float:
            lines.append(f"Max relative difference: {_fmt(m.get('max_rel_diff'))} (float outputs)")
        lines.append(f"Max absolute difference: {_fmt(m.get('max_abs_diff'))}")
        if has_float:
            lines.append(f"Mean relative difference: {_fmt(m.get('mean_rel_diff'))}")
        if m.get("cosine_similarity") is not None:
            lines.append(f"Cosine similarity: {m['cosine_similarity']:.6f} (min over float outputs; required "
                         f">= {m.get('min_cosine')})")
        lines.append(f"Number of differences (over tolerance): {section.get('num_over_tolerance')} "
                     f"of {m.get('num_elements')} elements")
    f = section.get("failure")
    if f and f.get("summary") != section.get("summary"):
        lines.append(f"Failure: {f.get('summary')}")
    fb = a.get("layers_without_recommendation") or []
    if fb:
        lines.append(f"Layers without a recommendation: {len(fb)}")
        for item in fb[:20]:
            lines.append(f"  - {item['layer_id']} -> {item['executor'] or 'compiler'} ({item['reason']})")
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
