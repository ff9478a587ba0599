"""Constant folding: the values of every node that does not depend on run-time data.

Nodes whose inputs are all constant (``Constant``, ``ConstantOfShape`` of a constant
shape, ``Identity`` of an initializer, arithmetic on such values) are evaluated with
onnx's reference evaluator; ``Shape``/``Size`` of a tensor whose shape is fully static
take their value from that shape (notes/reference_tool.md section 4). The layer split
makes these values initializers of the layers that read them, the shape completion
(:mod:`torq_gen_config.model.shapes`) feeds them back into shape inference.
"""

from __future__ import annotations

from typing import Any

from .graph import node_attr
from ..limits import NOTE_CHARS

#: Ops whose output is not a function of their inputs: never folded.
NONDETERMINISTIC_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"}


def fold_constants(model: "onnx.ModelProto", keep_op_types: frozenset[str] = frozenset()  # noqa: F821
                   ) -> tuple[dict[str, Any], set[int], list[str]]:
    """Evaluate every node of ``model`` whose result does not depend on run-time data.

    Args:
        model: shape-inferred model (static shapes let ``Shape``/``Size`` fold).
        keep_op_types: op types never folded (the full-model run keeps the
            DequantizeLinear of int8 weights, so the compiler sees int8 weights).

    Returns:
        ``(values, folded, warnings)``: ``values`` maps tensor name -> numpy array
        for initializers and folded node outputs; ``folded`` holds the indices of
        folded nodes in ``model.graph.node``.
    """
    import numpy as np
    from onnx import numpy_helper

    values: dict[str, Any] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    shapes = static_shapes(model)
    folded: set[int] = set()
    warnings: list[str] = []
    opsets = {o.domain: o.version for o in model.opset_import}
    for j, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC_OPS or node.op_type in keep_op_types:
            continue
        if any(a.type in (5, 10) for a in node.attribute):  # GRAPH / GRAPHS: subgraphs may read outer values
            continue
        ins = [t for t in node.input if t]
        if node.op_type in ("Shape", "Size") and ins and ins[0] in shapes:
            shp = shapes[ins[0]]
            if node.op_type == "Size":
                values[node.output[0]] = np.array(int(np.prod(shp)), dtype=np.int64)
            else:
                start = node_attr(node, "start", 0)
                end = node_attr(node, "end", None)
                values[node.output[0]] = np.array(shp[start:end], dtype=np.int64)
            folded.add(j)
            continue
        if not all(t in values for t in ins):
            continue
        try:
            outs = evaluate_node(node, values, opsets)
        except Exception as e:  # a node the reference evaluator cannot run stays a layer
            warnings.append(f"could not fold {node.op_type} node {node.name or j}: {str(e).splitlines()[0][:NOTE_CHARS]}")
            continue
        for name, val in zip(node.output, outs):
            if name:
                values[name] = np.asarray(val)
        folded.add(j)
    return values, folded, warnings


def static_shapes(model) -> dict[str, list[int]]:
    """Tensor name -> fully static shape (zero-size dims included), for the graph
    inputs, value_info, outputs and initializers whose shape is complete."""
    shapes = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = [d.dim_value for d in tt.shape.dim]
    for t in model.graph.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def evaluate_node(node, values: dict, opsets: dict) -> list:
    """Run one node on constant inputs with onnx's reference evaluator.

    Args:
        node: an ``onnx.NodeProto`` of the default domain.
        values: tensor name -> numpy array; must hold every non-empty input of ``node``.
        opsets: domain -> opset version of the model.

    Returns:
        The node's outputs (numpy arrays), in output order.

    Raises:
        Exception: whatever the reference evaluator raises (unsupported op, bad values).
    """
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    ins = [t for t in node.input if t]
    graph = helper.make_graph([node], "fold", [], [helper.make_tensor_value_info(o, 0, None) for o in node.output if o])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    feeds = {t: values[t] for t in ins}
    graph.input.extend([helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(values[t].dtype), values[t].shape) for t in ins])
    return ReferenceEvaluator(m).run(None, feeds)
