"""Multiply-accumulate (MAC) counts of single-layer ONNX models.

Formulas of the original tool (docs/original_tool.md, 'MAC counts'), one
multiply-add per weight use:

=================================  ===============================================
Op                                 MACs
=================================  ===============================================
Conv, ConvInteger, QLinearConv     prod(output shape) * prod(weight.shape[1:])
ConvTranspose                      prod(input shape) * prod(weight.shape[1:])
Gemm                               M * K * N (transA / transB honoured)
MatMul, MatMulInteger,             prod(output shape) * K, K = last dim of A
QLinearMatMul                      (1-D operands follow numpy matmul rules)
Einsum                             product of the sizes of all distinct labels
RNN, GRU, LSTM                     seq_len * batch * (numel(W) + numel(R))
=================================  ===============================================

Other ops have no MAC count (None).
"""

from __future__ import annotations

import math
from typing import Iterable

from ..core.lazy import onnx

__all__ = ["mac_count", "MAC_OPS"]

MAC_OPS = frozenset({
    "Conv", "ConvInteger", "QLinearConv", "ConvTranspose", "Gemm",
    "MatMul", "MatMulInteger", "QLinearMatMul", "Einsum", "RNN", "GRU", "LSTM",
})
"""Op types with a MAC formula."""

# index of the weight / second operand per op type
_WEIGHT_INPUT = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3, "ConvTranspose": 1}
_MATMUL_INPUTS = {"MatMul": (0, 1), "MatMulInteger": (0, 1), "QLinearMatMul": (0, 3)}

Shape = tuple[int, ...]


def _static_shape(type_proto: onnx.TypeProto) -> Shape | None:
    """Static shape of a tensor type, or None if unknown or any dim is dynamic."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in type_proto.tensor_type.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return None
        dims.append(int(dim.dim_value))
    return tuple(dims)


def _collect_shapes(graph: onnx.GraphProto) -> dict[str, Shape]:
    shapes: dict[str, Shape] = {}
    for init in graph.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        shape = _static_shape(vi.type)
        if shape is not None:
            shapes.setdefault(vi.name, shape)
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    shapes[node.output[0]] = tuple(int(d) for d in attr.t.dims)
    return shapes


def _prod(values: Iterable[int]) -> int:
    return math.prod(int(v) for v in values)


def _attr(node: onnx.NodeProto, name: str, default):
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _input_shape(node: onnx.NodeProto, index: int, shapes: dict[str, Shape]) -> Shape | None:
    if index >= len(node.input) or not node.input[index]:
        return None
    return shapes.get(node.input[index])


def _output_shape(node: onnx.NodeProto, shapes: dict[str, Shape]) -> Shape | None:
    return shapes.get(node.output[0]) if node.output and node.output[0] else None


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            return None
        out.append(max(x, y) if x != 0 and y != 0 else 0)
    return tuple(reversed(out))


def _matmul_macs(a: Shape, b: Shape, out: Shape | None) -> int | None:
    """prod(output) * K with numpy matmul rules for 1-D operands."""
    if not a or not b:
        return None
    k = a[-1]
    if out is None:
        a2 = a if len(a) >= 2 else (1,) + a
        b2 = b if len(b) >= 2 else b + (1,)
        batch = _broadcast(a2[:-2], b2[:-2])
        if batch is None:
            return None
        out = batch + (a2[-2], b2[-1])  # prepended 1-dims do not change the product
    return _prod(out) * k


def _einsum_macs(node: onnx.NodeProto, shapes: dict[str, Shape]) -> int | None:
    equation = _attr(node, "equation", None)
    if equation is None:
        return None
    if isinstance(equation, bytes):
        equation = equation.decode()
    lhs = equation.replace(" ", "").split("->")[0]
    terms = lhs.split(",")
    if len(terms) != len(node.input):
        return None
    sizes: dict[str, int] = {}
    ellipsis: Shape = ()
    for term, name in zip(terms, node.input):
        shape = shapes.get(name)
        if shape is None:
            return None
        if "..." in term:
            head, tail = term.split("...")
            n_ell = len(shape) - len(head) - len(tail)
            if n_ell < 0:
                return None
            labels = list(head) + [None] * n_ell + list(tail)
            ell = shape[len(head): len(head) + n_ell]
            ellipsis = _broadcast(ellipsis, ell) if ellipsis is not None else None
        else:
            labels = list(term)
            if len(labels) != len(shape):
                return None
        for label, dim in zip(labels, shape):
            if label is None:
                continue
            sizes[label] = max(sizes.get(label, 1), dim)  # a 1 broadcasts against n
    if ellipsis is None:
        return None
    return _prod(sizes.values()) * _prod(ellipsis)


def _node_macs(node: onnx.NodeProto, shapes: dict[str, Shape]) -> int | None:
    op = node.op_type
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        weight = _input_shape(node, _WEIGHT_INPUT[op], shapes)
        out = _output_shape(node, shapes)
        if weight is None or out is None or len(weight) < 2:
            return None
        return _prod(out) * _prod(weight[1:])
    if op == "ConvTranspose":
        weight = _input_shape(node, 1, shapes)
        x = _input_shape(node, 0, shapes)
        if weight is None or x is None or len(weight) < 2:
            return None
        return _prod(x) * _prod(weight[1:])
    if op == "Gemm":
        a = _input_shape(node, 0, shapes)
        b = _input_shape(node, 1, shapes)
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return None
        m, k = (a[1], a[0]) if _attr(node, "transA", 0) else a
        n = b[0] if _attr(node, "transB", 0) else b[1]
        return m * k * n
    if op in _MATMUL_INPUTS:
        ia, ib = _MATMUL_INPUTS[op]
        a = _input_shape(node, ia, shapes)
        b = _input_shape(node, ib, shapes)
        if a is None or b is None:
            return None
        return _matmul_macs(a, b, _output_shape(node, shapes))
    if op == "Einsum":
        return _einsum_macs(node, shapes)
    if op in ("RNN", "GRU", "LSTM"):
        x = _input_shape(node, 0, shapes)
        w = _input_shape(node, 1, shapes)
        r = _input_shape(node, 2, shapes)
        if x is None or w is None or r is None or len(x) != 3:
            return None
        seq, batch = (x[1], x[0]) if _attr(node, "layout", 0) else (x[0], x[1])
        return seq * batch * (_prod(w) + _prod(r))
    return None


def _shapes_needed(node: onnx.NodeProto) -> list[str]:
    return [n for n in list(node.input) + list(node.output) if n]


def mac_count(layer: onnx.ModelProto) -> int | None:
    """MAC count of a single-layer ONNX model (docs/original_tool.md, 'MAC counts').

    Args:
        layer: a layer model as produced by the layer split: one compute node
            (plus, for quantized layers, Q/DQ or Constant nodes) whose inputs,
            outputs and initializers carry static shapes. Missing intermediate
            shapes are filled in by ONNX shape inference.

    Returns:
        The number of multiply-accumulate operations (int, >= 0) summed over
        the nodes of :data:`MAC_OPS` in the layer, or None when the layer has no
        such node or a needed shape is unknown or dynamic.
    """
    nodes = [n for n in layer.graph.node if n.op_type in MAC_OPS]
    if not nodes:
        return None
    shapes = _collect_shapes(layer.graph)
    if any(name not in shapes for node in nodes for name in _shapes_needed(node)):
        try:
            inferred = onnx.shape_inference.infer_shapes(layer)
            shapes = {**_collect_shapes(inferred.graph), **shapes}
        except Exception:  # inference is best effort; missing shapes give None below
            pass
    total = 0
    for node in nodes:
        macs = _node_macs(node, shapes)
        if macs is None:
            return None
        total += macs
    return total
