"""The exact inverse of the bf16 narrowing: every BFLOAT16 tensor of a model back to
FLOAT, so ONNX Runtime (no bf16 Conv on CPU) can compute bf16 references.
"""

from __future__ import annotations


from ..core.errors import ModelError
from ..core.lazy import np, onnx
from .onnx_graph import DTYPE_ATTRS, _from_array, _one_line, _to_array


def widen_bf16_to_fp32(model: onnx.ModelProto) -> onnx.ModelProto:
    """Exact inverse of the bf16 narrowing, for computing references with ONNX Runtime.

    Every BFLOAT16 tensor becomes FLOAT (exact upcast): graph inputs, outputs,
    value_info, initializers, tensor attributes (Constant values, ConstantOfShape
    value), ``Cast``/``dtype``-like attributes and ``LayerNormalization.stash_type``,
    in the main graph and in subgraphs. The model (opset 22 ops on float) runs in
    ONNX Runtime CPU, which has no bf16 Conv (notes/toolchain.md s5). References:
    run it on bf16-rounded inputs upcast to fp32, round the outputs with
    :func:`round_to_bf16`.

    Args:
        model: a model (typically from :func:`convert_to_bf16`); not modified.

    Returns:
        The widened model.

    Raises:
        ModelError: the widened model fails ``onnx.checker.check_model``.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _widen_graph(m.graph)
    for f in m.functions:
        for n in f.node:
            _widen_node(n)
    try:
        onnx.checker.check_model(m)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"widened fp32 model fails the ONNX checker: {_one_line(e)}") from None
    return m


def _widen_type(tp: onnx.TypeProto) -> None:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        if tp.tensor_type.elem_type == onnx.TensorProto.BFLOAT16:
            tp.tensor_type.elem_type = onnx.TensorProto.FLOAT
    elif kind == "sparse_tensor_type":
        if tp.sparse_tensor_type.elem_type == onnx.TensorProto.BFLOAT16:
            tp.sparse_tensor_type.elem_type = onnx.TensorProto.FLOAT
    elif kind == "sequence_type":
        _widen_type(tp.sequence_type.elem_type)
    elif kind == "optional_type":
        _widen_type(tp.optional_type.elem_type)
    elif kind == "map_type":
        _widen_type(tp.map_type.value_type)


def _widen_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    if t.data_type != onnx.TensorProto.BFLOAT16:
        return t
    return _from_array(_to_array(t).astype(np.float32), t.name)


def _widen_node(n: onnx.NodeProto) -> None:
    for a in n.attribute:
        if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == onnx.TensorProto.BFLOAT16:
            a.t.CopyFrom(_widen_tensor(a.t))
        elif a.type == onnx.AttributeProto.TENSORS:
            for t in a.tensors:
                if t.data_type == onnx.TensorProto.BFLOAT16:
                    t.CopyFrom(_widen_tensor(t))
        elif (a.type == onnx.AttributeProto.INT and a.name in DTYPE_ATTRS + ("stash_type",)
              and a.i == onnx.TensorProto.BFLOAT16):
            a.i = onnx.TensorProto.FLOAT
        elif a.type == onnx.AttributeProto.GRAPH:
            _widen_graph(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                _widen_graph(g)
        elif a.type == onnx.AttributeProto.TYPE_PROTO:
            _widen_type(a.tp)


def _widen_graph(g: onnx.GraphProto) -> None:
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        _widen_type(vi.type)
    for i, t in enumerate(g.initializer):
        if t.data_type == onnx.TensorProto.BFLOAT16:
            g.initializer[i].CopyFrom(_widen_tensor(t))
    for n in g.node:
        _widen_node(n)
