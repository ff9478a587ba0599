"""Constant folding before quantization: weights computed by constant subgraphs
become initializers (``quantize_static`` quantizes only initializers).
"""

from __future__ import annotations

from ..core.lazy import helper, np, numpy_helper, onnx
from ..model.folding import fold_constants
from ..model.graph import node_inputs


def fold_to_initializers(model) -> "onnx.ModelProto":  # noqa: F821
    """Copy of ``model`` with every constant subgraph evaluated into initializers.

    ``quantize_static`` only quantizes weights that are initializers, while e.g. the
    onnx wheel's ``light_*`` models compute their weights with ``ConstantOfShape``.
    Shapes are inferred first (so ``Shape``/``Size`` of static tensors fold too), the
    nodes that :func:`torq_gen_config.model.split.fold_constants` evaluates are
    removed, and their values that remaining nodes (or subgraphs) consume become
    initializers. A folded value that is a graph output is produced by a ``Constant``
    node. Unused initializers are dropped; value_info of removed tensors too.

    Args:
        model: an ``onnx.ModelProto`` (not modified).

    Returns:
        The folded model (``onnx.ModelProto``), shapes inferred where onnx can.
    """
    m = _infer(model)
    values, folded, _warnings = fold_constants(m)
    keep = [n for j, n in enumerate(m.graph.node) if j not in folded]
    graph_outputs = [o.name for o in m.graph.output]
    produced = {t for n in keep for t in n.output if t}
    graph_inputs = {i.name for i in m.graph.input}
    needed: list[str] = []
    for n in keep:
        for t in node_inputs(n):
            if t not in needed:
                needed.append(t)
    const_nodes = []
    for t in graph_outputs:
        if t not in produced and t not in graph_inputs and t in values:
            const_nodes.append(helper.make_node("Constant", [], [t], value=numpy_helper.from_array(np.asarray(values[t]), t)))
    orig_inits = {t.name: t for t in m.graph.initializer}
    inits = []
    for t in needed:
        if t in produced or t in graph_inputs:
            continue
        if t in orig_inits:
            inits.append(orig_inits[t])
        elif t in values:
            inits.append(numpy_helper.from_array(np.asarray(values[t]), t))
    alive = produced | {c.output[0] for c in const_nodes}
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    del g.node[:]
    g.node.extend(const_nodes + list(keep))
    del g.initializer[:]
    g.initializer.extend(inits)
    vis = [v for v in m.graph.value_info if v.name in alive]
    del g.value_info[:]
    g.value_info.extend(vis)
    return _infer(out)


def _infer(model):
    """Shape inference that never fails (returns a copy; the input on failure)."""
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        try:
            return onnx.shape_inference.infer_shapes(model)
        except Exception:
            m = onnx.ModelProto()
            m.CopyFrom(model)
            return m
