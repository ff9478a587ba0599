"""Partitions: maximal runs of consecutive nodes on one executor, each a stand-alone
ONNX model with a pid that changes only when the partition or how it compiles does."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Iterable, Mapping

from ..backends import capabilities, effective_executor  # noqa: F401 (effective_executor re-exported)
from ..model.graph import copy_proto, node_inputs, tensor_consumers, value_info, value_types


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


def compile_definition(executor: Mapping) -> dict:
    """The part of an executor definition that affects compilation: without the
    options the backend lists as run-only (``run_only_options``: iree's
    ``run_flags``), so a runtime option change recompiles nothing."""
    ex = copy.deepcopy(dict(executor))
    drop = capabilities(ex.get("backend")).run_only_options
    if any(k in (ex.get("options") or {}) for k in drop):
        ex["options"] = {k: v for k, v in ex["options"].items() if k not in drop}
    return ex


def partition_id(model_bytes: bytes, compile_def: Mapping, debug_ir: str | None) -> str:
    """``<executor>-<12 hex>``: hash of the partition model and how it is compiled."""
    h = hashlib.sha256(model_bytes)
    h.update(json.dumps({"executor": compile_def, "debug_ir": debug_ir}, sort_keys=True).encode("utf-8"))
    return f"{compile_def['name']}-{h.hexdigest()[:12]}"
