"""Subgraph mode: discovery on a range of the user's model as a model of its own.

``--subgraph-from OP --subgraph-to OP`` (config ``subgraph_from``/``subgraph_to``)
name two nodes of the user's model, each by layer ID (``<OpType>_<first output
name>``) or by a bare output name. The subgraph holds the user nodes whose graph
position lies between them (inclusive, ``Constant`` nodes in the range included),
plus every constant-producing node outside the range that they need (weights made
by ``ConstantOfShape`` nodes at the start of the graph, for example); its graph
inputs are the run-time tensors the range reads from outside, its outputs the
tensors it produces that are read after it or are outputs of the model.

Layer IDs and ``_node_index`` keep referring to the user's model: the subgraph is
cut out of the prepared model after the opset upgrade and shape inference
(:func:`torq_gen_config.model.prepare.prepare_model`), and the preparation info
keeps the user's node table entries (with their indices) of the nodes it holds.

Files: ``torq_gen_config_<model>_subgraph_<f>_<t>.json`` (and ``_compiler.json``),
intermediate files under ``<output_dir>/work/<model>_subgraph_<f>_<t>/``
(:mod:`torq_gen_config.core.layout`), where ``<f>`` and
``<t>`` are the ``_node_index`` of the two nodes in the user's model.

:func:`subgraph_of_config` resolves the names (cheap: the model is loaded without
external data and only its node table is built); the command line and the
workflow (``rules/common.smk``) both call it, so both give the same one-line
errors, with near matches, for unknown names and reversed ranges.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..config import model_name, resolve_model_path
from ..core.errors import ConfigError, ModelError
from ..core.layout import work_dir
from ..core.lazy import difflib, np, onnx, protobuf_message
from .extract import extract_model
from .folding import static_shapes as _static_shapes
from .graph import node_attr, node_inputs, tensor_consumers, user_node_table, value_types
from ..core.limits import NOTE_CHARS

#: Config keys (and, as ``--subgraph-from``/``--subgraph-to``, command-line options).
CONFIG_KEYS = ("subgraph_from", "subgraph_to")
CLI_LABELS = ("--subgraph-from", "--subgraph-to")
#: Op types whose output does not depend on the inputs' values only: never constant.
#: Op types not shown as examples of layer IDs (they usually produce constants).
_NOT_LAYER_EXAMPLES = {"Constant", "ConstantOfShape", "Identity", "Shape", "Size"}
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"}


def subgraph_suffix(from_index: int, to_index: int) -> str:
    """``_subgraph_<f>_<t>``: appended to the model name in the report and compiler JSON names."""
    return f"_subgraph_{from_index}_{to_index}"


def layer_id_of(node: dict) -> str | None:
    """The layer ID of a user node record (:func:`~torq_gen_config.model.graph.user_node_table`),
    as the layer split names it; None for ``Constant`` nodes."""
    if node["node_index"] is None:
        return None
    first_out = next((t for t in node["outputs"] if t), f"node{node['node_index']}")
    return f"{node['op_type']}_{first_out}"


def resolve_node(user_nodes: list[dict], name: str, label: str = "--subgraph-from") -> dict:
    """The user node (non-``Constant``) named ``name``: its layer ID first, else one of
    its output names.

    Raises:
        ConfigError: no such node; the one-line message lists near matches.
    """
    name = name.strip()
    by_id: dict[str, dict] = {}
    by_output: dict[str, dict] = {}
    for n in user_nodes:
        lid = layer_id_of(n)
        if lid is None:
            continue
        by_id.setdefault(lid, n)
        for t in n["outputs"]:
            if t:
                by_output.setdefault(t, n)
    if name in by_id:
        return by_id[name]
    if name in by_output:
        return by_output[name]
    candidates = list(by_id) + [t for t in by_output if t not in by_id]
    near = difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)
    if not near:  # case-insensitive / substring fallbacks help with long names
        low = name.lower()
        near = [c for c in candidates if c.lower() == low or (low and low in c.lower())][:5]
    if near:
        hint = f"near matches: {', '.join(near)}"
    else:
        examples = [lid for lid, n in by_id.items() if n["op_type"] not in _NOT_LAYER_EXAMPLES][:3] or list(by_id)[:3]
        hint = f"no near match (layer IDs are <OpType>_<first output name>, e.g. {', '.join(examples)})"
    raise ConfigError(f"{label} {name!r}: no layer of the model has this layer ID or output name; {hint}")


def resolve_range(user_nodes: list[dict], from_name: str, to_name: str,
                  labels: tuple[str, str] = CLI_LABELS) -> dict:
    """Resolve both ends of a subgraph.

    Returns:
        JSON-safe ``{"from": end, "to": end, "suffix"}`` with ``end`` =
        ``{"name" (as given), "layer_id", "node_index", "graph_index", "op_type"}``.

    Raises:
        ConfigError: an unknown name (with near matches) or a reversed range.
    """
    a = resolve_node(user_nodes, from_name, labels[0])
    b = resolve_node(user_nodes, to_name, labels[1])
    if a["graph_index"] > b["graph_index"]:
        raise ConfigError(f"reversed subgraph range: {labels[0]} {layer_id_of(a)} (node {a['node_index']}) comes "
                          f"after {labels[1]} {layer_id_of(b)} (node {b['node_index']}); swap the two")

    def end(n: dict, given: str) -> dict:
        return {"name": given.strip(), "layer_id": layer_id_of(n), "node_index": n["node_index"],
                "graph_index": n["graph_index"], "op_type": n["op_type"]}

    return {"from": end(a, from_name), "to": end(b, to_name),
            "suffix": subgraph_suffix(a["node_index"], b["node_index"])}


def subgraph_of_config(config: dict, model_path: str | os.PathLike | None = None,
                       labels: tuple[str, str] = CLI_LABELS) -> dict | None:
    """The resolved subgraph of a (validated) workflow config, or None without one.

    Args:
        config: holds ``subgraph_from`` and ``subgraph_to`` (empty or missing: no subgraph).
        model_path: the model file (default: ``config["model"]`` resolved).
        labels: how the two settings are named in error messages.

    Raises:
        ConfigError: only one of the two is set, a name is unknown, or the range is reversed.
        ModelError: the model cannot be read.
    """
    f = (config.get(CONFIG_KEYS[0]) or "").strip()
    t = (config.get(CONFIG_KEYS[1]) or "").strip()
    if not f and not t:
        return None
    if not (f and t):
        raise ConfigError(f"{labels[0]} and {labels[1]} must be given together (subgraph mode needs both ends)")
    if model_path is None:
        model_path = resolve_model_path(config["model"])
    return resolve_range(_user_nodes_of(model_path), f, t, labels)


def report_name(config: dict, model_path: str | os.PathLike | None = None,
                labels: tuple[str, str] = CLI_LABELS) -> tuple[str, dict | None]:
    """The name a run's files are keyed by (report, compiler JSON, work directory): the
    model file's stem (:func:`torq_gen_config.config.model_name`), plus the subgraph's
    suffix in subgraph mode; and the subgraph (:func:`subgraph_of_config`, None without).
    The one rule for the CLI, the Snakefile and the workflow runner.

    Raises:
        ConfigError, ModelError: as :func:`subgraph_of_config`.
    """
    path = model_path if model_path is not None else resolve_model_path(config["model"])
    sub = subgraph_of_config(config, path, labels)
    return model_name(path) + (sub["suffix"] if sub else ""), sub


def _user_nodes_of(path: str | os.PathLike) -> list[dict]:
    """The user node table of a model file (loaded without external data or checks)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (protobuf_message.DecodeError, RuntimeError, ValueError, UnicodeDecodeError, OSError) as e:
        raise ModelError(f"{path}: cannot read the model to resolve the subgraph: {str(e).splitlines()[0][:NOTE_CHARS]}") from None
    return user_node_table(model)


def constant_nodes(model) -> tuple[set[int], set[str]]:
    """Nodes of ``model`` whose outputs do not depend on run-time data.

    A node is constant when it is a deterministic default-domain op without
    subgraphs and every input is an initializer or an output of a constant node
    (``Constant`` has no inputs), or it is a ``Shape``/``Size`` of a tensor whose
    shape is fully static (after shape inference).

    Returns:
        ``(indices, static_shape_nodes)``: the constant node indices, and the output
        names of the ``Shape``/``Size`` nodes among them whose input is run-time data
        (their value comes from the static shape, not from the input).
    """
    shapes = _static_shapes(model)
    const_tensors = {t.name for t in model.graph.initializer}
    const: set[int] = set()
    from_shape: set[str] = set()
    for j, n in enumerate(model.graph.node):
        if n.domain not in ("", "ai.onnx") or n.op_type in _NONDETERMINISTIC:
            continue
        if any(a.type in (5, 10) for a in n.attribute):
            continue
        ins = [t for t in n.input if t]
        if all(t in const_tensors for t in ins):
            const.add(j)
        elif n.op_type in ("Shape", "Size") and ins and ins[0] in shapes:
            const.add(j)
            from_shape.update(t for t in n.output if t)
        else:
            continue
        const_tensors.update(t for t in n.output if t)
    return const, from_shape


def extract_subgraph(model, origin: list[int], first: int, last: int) -> tuple[Any, list[int], dict]:
    """Cut the user's node range ``first..last`` (graph indices in the user's model)
    out of the prepared ``model``.

    Args:
        model: the prepared model (opset upgraded, shapes inferred).
        origin: per node of ``model``, the graph index of the user node it comes from.
        first, last: graph indices of the range's ends (inclusive).

    Returns:
        ``(submodel, sub_origin, info)``: the subgraph model (same opsets, IR
        version, graph name, value_info of its tensors), the ``origin`` of its nodes,
        and ``{"inputs", "outputs", "outside_constant_nodes" (graph indices in the
        user's model of the constant-producing nodes taken from outside the range),
        "num_nodes"}``.

    Raises:
        ModelError: the range produces nothing that is used after it.
    """
    nodes = list(model.graph.node)
    in_range = [j for j, o in enumerate(origin) if first <= o <= last]
    range_set = set(in_range)
    producer: dict[str, int] = {}
    for j, n in enumerate(nodes):
        for t in n.output:
            if t:
                producer[t] = j
    inits = {t.name: t for t in model.graph.initializer}
    const, from_shape = constant_nodes(model)
    shapes = _static_shapes(model)

    keep = set(range_set)               # node indices of the subgraph
    need_inits: list[str] = []          # initializers it reads
    shape_values: dict[str, Any] = {}   # Shape/Size of a static run-time tensor -> its value
    inputs: list[str] = []              # run-time tensors read from outside the range

    def need(t: str) -> list[str]:
        """Tensor ``t`` is read by a node of the subgraph; returns further tensors needed."""
        if t in inits:
            if t not in need_inits:
                need_inits.append(t)
            return []
        p = producer.get(t)
        if p is not None and p in keep:
            return []
        if p is None or p not in const:  # run-time data from outside (or a graph input)
            if t not in inputs:
                inputs.append(t)
            return []
        if t in from_shape:  # Shape/Size of run-time data: only its static shape is needed
            n = nodes[p]
            shp = shapes[n.input[0]]
            if n.op_type == "Size":
                shape_values[t] = np.array(int(np.prod(shp)), dtype=np.int64)
            else:
                shape_values[t] = np.array(shp[node_attr(n, "start", 0):node_attr(n, "end", None)], dtype=np.int64)
            return []
        keep.add(p)  # a constant-producing node outside the range, and what it needs
        return node_inputs(nodes[p])

    for j in in_range:
        stack = list(reversed(node_inputs(nodes[j])))
        while stack:
            stack.extend(reversed(need(stack.pop())))

    consumers = tensor_consumers(model)
    graph_outputs = {o.name for o in model.graph.output}
    outputs: list[str] = []
    for j in in_range:
        for t in nodes[j].output:
            if not t or t in outputs:
                continue
            used_after = any(k not in range_set for k in consumers.get(t, ()))
            if t in graph_outputs or (used_after and j not in const):
                outputs.append(t)
    if not outputs:
        raise ModelError(f"the subgraph (user nodes {first}..{last}) computes no tensor that is used after it "
                         "or is a model output")

    order = sorted(keep)
    constants: dict[str, Any] = {t: inits[t] for t in need_inits}
    constants.update(shape_values)
    sub, _ = extract_model(model, order, constants=constants, inputs=inputs, initializers=list(constants),
                           outputs=outputs, types=value_types(model), value_info_policy="copy", keep_metadata=True,
                           functions=True)
    sub_origin = [origin[j] for j in order]
    outside = sorted({origin[j] for j in order if j not in range_set})
    info = {"inputs": inputs, "outputs": outputs, "outside_constant_nodes": outside, "num_nodes": len(order)}
    return sub, sub_origin, info


@dataclass(frozen=True)
class RunNames:
    """The names a run's files are keyed by: ``name`` (the model's stem, plus the subgraph
    suffix), its work directory relative to the output directory, and the subgraph (or None)."""

    name: str
    work: str
    subgraph: dict | None


def run_names(config: dict, model_path: str | os.PathLike | None = None,
              labels: tuple[str, str] = CLI_LABELS) -> RunNames:
    """The :class:`RunNames` of a config (the one rule for the Snakefile, the CLI and the
    workflow runner: :func:`report_name`).

    Raises:
        ConfigError, ModelError: as :func:`report_name`.
    """
    name, sub = report_name(config, model_path, labels=labels)
    return RunNames(name, work_dir(name), sub)
