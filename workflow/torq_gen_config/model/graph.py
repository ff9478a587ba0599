"""Small ONNX graph helpers shared by the layer split, the subgraph cut and the
full-model partitioning (``model/split.py``, ``model/subgraph.py``, ``fullrun/``) and
their one model builder (``model/extract.py``)."""

from __future__ import annotations

from typing import Any, Mapping

from ..core.lazy import helper, onnx


def value_types(model) -> dict:
    """Tensor name -> ``onnx.TypeProto`` of the graph inputs, value_info and outputs
    of ``model`` (tensor types with a known element type only)."""
    types = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type
    return types


def value_info(name: str, types: Mapping):
    """An ``onnx.ValueInfoProto`` named ``name`` with its type from ``types``
    (:func:`value_types`), untyped when unknown."""
    vi = onnx.ValueInfoProto()
    vi.name = name
    if name in types:
        vi.type.CopyFrom(types[name])
    return vi


def expose_outputs(model, names) -> None:
    """Add the tensors ``names`` to ``model``'s graph outputs (in place), each with its
    type from the graph (:func:`value_types`), untyped when unknown; an output already
    there stays as it is. For running a model with its intermediate values as results."""
    types = value_types(model)
    have = {o.name for o in model.graph.output}
    for name in names:
        if name not in have:
            model.graph.output.append(value_info(name, types))
            have.add(name)


def copy_proto(message):
    """A deep copy of a protobuf message (NodeProto, TensorProto, ValueInfoProto, ...)."""
    c = type(message)()
    c.CopyFrom(message)
    return c


def node_attr(node, name: str, default: Any) -> Any:
    """The value of attribute ``name`` of ``node``, or ``default`` when absent."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


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
    free: list[str] = []
    for a in node.attribute:
        graphs = ([a.g] if a.type == onnx.AttributeProto.GRAPH
                  else list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                for t in node_inputs(n):
                    if t not in defined:
                        free.append(t)
                defined.update(o for o in n.output if o)
    return free


def user_node_table(model: "onnx.ModelProto") -> list[dict]:  # noqa: F821
    """One record per node of the user's model, in graph order.

    ``node_index`` is the position among the non-``Constant`` nodes (the original tool's
    ``_node_index``), ``None`` for ``Constant`` nodes.
    """
    table = []
    k = 0
    for i, n in enumerate(model.graph.node):
        is_const = n.op_type == "Constant" and n.domain in ("", "ai.onnx")
        table.append({
            "graph_index": i,
            "node_index": None if is_const else k,
            "op_type": n.op_type,
            "domain": n.domain,
            "name": n.name,
            "inputs": list(n.input),
            "outputs": list(n.output),
        })
        if not is_const:
            k += 1
    return table


def tensor_consumers(model) -> dict[str, set]:
    """Tensor name -> indices of the nodes of ``model.graph`` that read it."""
    consumers: dict[str, set] = {}
    for j, n in enumerate(model.graph.node):
        for t in node_inputs(n):
            consumers.setdefault(t, set()).add(j)
    return consumers
