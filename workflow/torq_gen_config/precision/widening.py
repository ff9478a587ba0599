"""Widening a model's floating-point tensors, exactly: every BFLOAT16 tensor to FLOAT (the
inverse of the bf16 narrowing, so ONNX Runtime, with no bf16 Conv on CPU, can compute bf16
references), or every FLOAT tensor to DOUBLE (the spec evaluated in float64, which settles a
dispute of the two reference engines).
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
    ONNX Runtime CPU, which has no bf16 Conv (docs/toolchain.md, 'bf16 and int8'). References:
    run it on bf16-rounded inputs upcast to fp32, round the outputs with
    :func:`round_to_bf16`.

    Args:
        model: a model (typically from :func:`convert_to_bf16`); not modified.

    Returns:
        The widened model.

    Raises:
        ModelError: the widened model fails ``onnx.checker.check_model``.
    """
    return _widened(model, {onnx.TensorProto.BFLOAT16: (onnx.TensorProto.FLOAT, np.float32)}, "fp32")


def widen_fp32_to_fp64(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every FLOAT tensor of ``model`` as DOUBLE (exact upcast), at the same places as
    :func:`widen_bf16_to_fp32` (a ``Cast`` to FLOAT casts to DOUBLE), so onnx's reference
    implementation evaluates the operator specification's formulas in float64 (the
    arbiter of a reference dispute, :func:`torq_gen_config.reference.reference_run.run_spec_float64`).
    16-bit float tensors stay as they are: a rounding to them is part of what the model
    computes. Stored (external) tensors must be loaded first. Ops whose type constraints
    leave out double (e.g. DequantizeLinear's scale) fail in the evaluator; the caller
    records that.

    Raises:
        ModelError: the widened model fails ``onnx.checker.check_model``.
    """
    return _widened(model, {onnx.TensorProto.FLOAT: (onnx.TensorProto.DOUBLE, np.float64)}, "fp64")


def _widened(model: onnx.ModelProto, to: dict, what: str) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _widen_graph(m.graph, to)
    for f in m.functions:
        for n in f.node:
            _widen_node(n, to)
    try:
        onnx.checker.check_model(m)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"widened {what} model fails the ONNX checker: {_one_line(e)}") from None
    return m


def _widen_type(tp: onnx.TypeProto, to: dict) -> None:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        if tp.tensor_type.elem_type in to:
            tp.tensor_type.elem_type = to[tp.tensor_type.elem_type][0]
    elif kind == "sparse_tensor_type":
        if tp.sparse_tensor_type.elem_type in to:
            tp.sparse_tensor_type.elem_type = to[tp.sparse_tensor_type.elem_type][0]
    elif kind == "sequence_type":
        _widen_type(tp.sequence_type.elem_type, to)
    elif kind == "optional_type":
        _widen_type(tp.optional_type.elem_type, to)
    elif kind == "map_type":
        _widen_type(tp.map_type.value_type, to)


def _widen_tensor(t: onnx.TensorProto, to: dict) -> onnx.TensorProto:
    if t.data_type not in to:
        return t
    return _from_array(_to_array(t).astype(to[t.data_type][1]), t.name)


def _widen_node(n: onnx.NodeProto, to: dict) -> None:
    for a in n.attribute:
        if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in to:
            a.t.CopyFrom(_widen_tensor(a.t, to))
        elif a.type == onnx.AttributeProto.TENSORS:
            for t in a.tensors:
                if t.data_type in to:
                    t.CopyFrom(_widen_tensor(t, to))
        elif a.type == onnx.AttributeProto.INT and a.name in DTYPE_ATTRS + ("stash_type",) and a.i in to:
            a.i = to[a.i][0]
        elif a.type == onnx.AttributeProto.GRAPH:
            _widen_graph(a.g, to)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                _widen_graph(g, to)
        elif a.type == onnx.AttributeProto.TYPE_PROTO:
            _widen_type(a.tp, to)


def _widen_graph(g: onnx.GraphProto, to: dict) -> None:
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        _widen_type(vi.type, to)
    for i, t in enumerate(g.initializer):
        if t.data_type in to:
            g.initializer[i].CopyFrom(_widen_tensor(t, to))
    for n in g.node:
        _widen_node(n, to)
