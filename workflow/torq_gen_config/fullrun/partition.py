"""Partitions: maximal runs of consecutive nodes on one executor, each a stand-alone
ONNX model with a pid that changes only when the partition or how it compiles does."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Iterable, Mapping

from ..backends import capabilities
from ..model.extract import extract_model


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
    return extract_model(model, members, constants=values, types=types, consumers=consumers,
                         graph_outputs=graph_outputs, outputs="read_outside", value_info_policy="produced",
                         props={"torq_gen_config.prepared_nodes": f"{members[0]}-{members[-1]}"},
                         infer_shapes=True)


def compile_definition(executor: Mapping) -> dict:
    """The part of an executor definition that affects compilation: without the
    options the backend lists as run-only (``run_only_options``: iree's
    ``run_flags`` and ``device``) and without empty ones (an empty ``compile_flags``
    is no flag), so a runtime option change recompiles nothing."""
    ex = copy.deepcopy(dict(executor))
    drop = capabilities(ex.get("backend")).run_only_options
    if "options" in ex:
        ex["options"] = {k: v for k, v in (ex["options"] or {}).items() if k not in drop and v not in (None, [], "")}
    return ex


def partition_id(model_bytes: bytes, compile_def: Mapping, debug_ir: str | None) -> str:
    """``<executor>-<12 hex>``: hash of the partition model and how it is compiled."""
    h = hashlib.sha256(model_bytes)
    h.update(json.dumps({"executor": compile_def, "debug_ir": debug_ir}, sort_keys=True).encode("utf-8"))
    return f"{compile_def['name']}-{h.hexdigest()[:12]}"
