"""Graph surgery on a quantized model after ``quantize_static``: Q/DQ pairs around
unquantized float I/O, int8 graph I/O (``full_integer``), constant-like nodes next to
their consumer, unused initializers, value_info ORT leaves out, and the scale/zero
point at the graph I/O.
"""

from __future__ import annotations

from typing import Any

from ..core.lazy import helper, np, numpy_helper, onnx
from ..model.graph import node_inputs
from .calibration import _input_specs
from .folding import _infer
from .ort_quantization import _one_line, _ort_quantization
from .ranges import _ort_session


#: Quantized op type -> base op type (for :func:`compute_nodes`).
QUANTIZED_OP_BASE = {
    "QLinearConv": "Conv", "QLinearMatMul": "MatMul", "QGemm": "Gemm", "QLinearAdd": "Add", "QLinearMul": "Mul",
    "QLinearConcat": "Concat", "QLinearGlobalAveragePool": "GlobalAveragePool",
    "QLinearAveragePool": "AveragePool", "QLinearSoftmax": "Softmax", "QLinearSigmoid": "Sigmoid",
    "QLinearLeakyRelu": "LeakyRelu", "QLinearReduceMean": "ReduceMean", "QLinearWhere": "Where",
    "ConvInteger": "Conv", "MatMulInteger": "MatMul",
}

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


def place_constant_nodes_before_use(model) -> "onnx.ModelProto":  # noqa: F821
    """The same model with every node that reads only initializers (the
    DequantizeLinear of an int8 weight, a Constant) moved right before its first
    consumer; other nodes keep their order, so the order stays topological.

    onnxruntime.quantization puts the weights' DequantizeLinear nodes at the top of
    the graph; next to their Conv they stay in the Conv's partition when ``run``
    cuts the model into runs of consecutive nodes per executor.
    """
    nodes = list(model.graph.node)
    produced = {t for n in nodes for t in n.output if t}
    graph_inputs = {i.name for i in model.graph.input}
    const_like = [all((not t) or (t not in produced and t not in graph_inputs) for t in n.input) for n in nodes]
    pending = {}  # output tensor -> index of a constant-like node not placed yet
    for j, n in enumerate(nodes):
        if const_like[j]:
            for t in n.output:
                pending[t] = j
    order: list[int] = []
    placed: set[int] = set()

    def place(j: int) -> None:
        if j in placed:
            return
        for t in nodes[j].input:
            k = pending.get(t)
            if k is not None and k != j:
                place(k)
        placed.add(j)
        order.append(j)

    for j in range(len(nodes)):
        if not const_like[j]:
            place(j)
    for j in range(len(nodes)):
        place(j)  # constant-like nodes nobody reads, and chains of them
    if order == list(range(len(nodes))):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes[j] for j in order)
    return out


def _initializer_value(model, name: str):
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] == name:
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
    return None


def _elem_types(model) -> dict[str, int]:
    types = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in model.graph.initializer:
        types[t.name] = t.data_type
    return types


def _is_float_type(elem_type) -> bool:
    T = onnx.TensorProto
    return elem_type in (T.FLOAT, T.FLOAT16, T.DOUBLE, T.BFLOAT16)


def _io_to_wrap(q) -> list[str]:
    """Float32 graph inputs with a non-Q consumer and float32 outputs not produced by
    DQ (QuantizeLinear takes float32 at the opsets used here; float16/double/bf16
    tensors stay as they are, as in the whole quantized model)."""
    types = _elem_types(q)
    inits = {t.name for t in q.graph.initializer}
    producers = {t: n for n in q.graph.node for t in n.output}
    names = []
    for vi in q.graph.input:
        if vi.name in inits or types.get(vi.name) != onnx.TensorProto.FLOAT:
            continue
        consumers = [n for n in q.graph.node if vi.name in n.input]
        if any(n.op_type != "QuantizeLinear" for n in consumers):
            names.append(vi.name)
    for vi in q.graph.output:
        p = producers.get(vi.name)
        if types.get(vi.name) == onnx.TensorProto.FLOAT and (p is None or p.op_type != "DequantizeLinear"):
            names.append(vi.name)
    return names


def _scale_zp(lo: float, hi: float) -> tuple["np.ndarray", "np.ndarray"]:  # noqa: F821
    """int8 scale/zero point of ``[lo, hi]`` exactly as ORT computes activation params
    (``quant_utils.compute_scale_zp``, asymmetric, 0 included in the range)."""
    quant_utils = _ort_quantization().quant_utils  # imported inside the root-logger guard
    qmin, qmax = quant_utils.get_qmin_qmax_for_qType(onnx.TensorProto.INT8)
    zp, scale = quant_utils.compute_scale_zp(np.array(lo, dtype=np.float32), np.array(hi, dtype=np.float32), qmin, qmax)
    return np.asarray(scale, dtype=np.float32).reshape(()), np.asarray(zp, dtype=np.int8).reshape(())


def _wrap_io(q, ranges: dict, warnings: list[str], only=None):
    """Insert Q->DQ pairs on unquantized float graph I/O (see :func:`quantize_model` step 4)."""
    names = [t for t in _io_to_wrap(q) if only is None or t in only]
    if not names:
        return q, []
    out = onnx.ModelProto()
    out.CopyFrom(q)
    g = out.graph
    inputs = {vi.name for vi in g.input}
    used = {t for n in g.node for t in list(n.input) + list(n.output)} | {t.name for t in g.initializer} | inputs
    wrapped = []
    new_nodes_front = []
    for t in names:
        if t not in ranges:
            warnings.append(f"no range for {t!r}: left unquantized")
            continue
        scale, zp = _scale_zp(*ranges[t])
        base = _unique(f"{t}_wrap", used)
        s_name, z_name = _unique(f"{base}_scale", used), _unique(f"{base}_zero_point", used)
        g.initializer.extend([numpy_helper.from_array(scale, s_name), numpy_helper.from_array(zp, z_name)])
        q_out, dq_out = _unique(f"{base}_q", used), _unique(f"{base}_dq", used)
        if t in inputs:
            for n in g.node:
                if n.op_type != "QuantizeLinear":
                    for i, x in enumerate(n.input):
                        if x == t:
                            n.input[i] = dq_out
            new_nodes_front += [helper.make_node("QuantizeLinear", [t, s_name, z_name], [q_out], name=f"{base}_QuantizeLinear"),
                                helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out], name=f"{base}_DequantizeLinear")]
            kind = "input"
        else:
            f_name = _unique(f"{t}_float", used)
            for n in g.node:
                for i, x in enumerate(n.output):
                    if x == t:
                        n.output[i] = f_name
                for i, x in enumerate(n.input):
                    if x == t:
                        n.input[i] = f_name
            for vi in g.value_info:
                if vi.name == t:
                    vi.name = f_name
            g.node.extend([helper.make_node("QuantizeLinear", [f_name, s_name, z_name], [q_out], name=f"{base}_QuantizeLinear"),
                           helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [t], name=f"{base}_DequantizeLinear")])
            kind = "output"
        wrapped.append({"tensor": t, "kind": kind, "scale": float(scale), "zero_point": int(zp)})
    if new_nodes_front:
        nodes = new_nodes_front + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
    return _infer(out), wrapped


def _unique(name: str, used: set) -> str:
    cand, k = name, 1
    while cand in used:
        cand = f"{name}_{k}"
        k += 1
    used.add(cand)
    return cand


def _qparams(model, node) -> tuple[Any, Any, int] | None:
    """(scale, zero_point, quantized elem_type) of a Q/DQ node, from initializers."""
    scale = _initializer_value(model, node.input[1]) if len(node.input) > 1 else None
    zp = _initializer_value(model, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scale is None:
        return None
    if zp is None:
        zp = np.zeros_like(scale, dtype=np.uint8)
    return scale, zp, helper.np_dtype_to_tensor_dtype(zp.dtype)


def _jsonable(a):
    a = np.asarray(a)
    return a.item() if a.ndim == 0 or a.size == 1 else a.tolist()


def _strip_io_qdq(q, warnings: list[str]):
    """Make graph I/O int8 by removing input Q and output DQ nodes (see :func:`quantize_model` step 5)."""
    out = onnx.ModelProto()
    out.CopyFrom(q)
    g = out.graph
    inits = {t.name for t in g.initializer}
    input_names = {vi.name for vi in g.input}
    output_names = {vi.name for vi in g.output}
    remove: set[int] = set()
    for vi in g.input:
        if vi.name in inits:
            continue
        consumers = [(j, n) for j, n in enumerate(g.node) if vi.name in n.input]
        if not consumers:
            continue
        if any(n.op_type != "QuantizeLinear" for _, n in consumers):
            warnings.append(f"full_integer: input {vi.name!r} also feeds non-QuantizeLinear nodes; it stays float")
            continue
        params = [_qparams(out, n) for _, n in consumers]
        if any(p is None for p in params) or any(
                not (np.array_equal(p[0], params[0][0]) and np.array_equal(p[1], params[0][1]) and p[2] == params[0][2])
                for p in params):
            warnings.append(f"full_integer: input {vi.name!r} is quantized with different parameters; it stays float")
            continue
        for j, n in consumers:
            old = n.output[0]
            remove.add(j)
            for m in g.node:
                for i, x in enumerate(m.input):
                    if x == old:
                        m.input[i] = vi.name
            if old in output_names:  # a pass-through Q output: keep the name by renaming the graph output
                for o in g.output:
                    if o.name == old:
                        o.name = vi.name
        vi.type.tensor_type.elem_type = params[0][2]
    producers = {t: (j, n) for j, n in enumerate(g.node) for t in n.output}
    for vi in g.output:
        pj = producers.get(vi.name)
        if pj is None or pj[1].op_type != "DequantizeLinear":
            continue
        j, dq = pj
        src = dq.input[0]
        params = _qparams(out, dq)
        if params is None or src in input_names or src in inits or src in output_names:
            warnings.append(f"full_integer: output {vi.name!r} keeps its DequantizeLinear (its int8 source is not a node output)")
            continue
        remove.add(j)
        for m in g.node:
            for i, x in enumerate(m.output):
                if x == src:
                    m.output[i] = vi.name
            for i, x in enumerate(m.input):
                if x == src:
                    m.input[i] = vi.name
        vi.type.tensor_type.elem_type = params[2]
    nodes = [n for j, n in enumerate(g.node) if j not in remove]
    del g.node[:]
    g.node.extend(nodes)
    # value_info of renamed/removed tensors would conflict with graph I/O types
    io = {vi.name for vi in list(g.input) + list(g.output)}
    vis = [v for v in g.value_info if v.name not in io]
    del g.value_info[:]
    g.value_info.extend(vis)
    return out


def _drop_unused_initializers(q):
    """Remove initializers that no node (or subgraph) reads and that are no graph output."""
    used = {t for n in q.graph.node for t in node_inputs(n)} | {o.name for o in q.graph.output}
    keep = [t for t in q.graph.initializer if t.name in used]
    if len(keep) != len(q.graph.initializer):
        del q.graph.initializer[:]
        q.graph.initializer.extend(keep)
    return q


def _dtype_name(elem_type) -> str | None:
    if not elem_type:
        return None
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:
        return None


def _io_quantization(q) -> dict:
    """Scale/zero point at the graph I/O: inputs read by a QuantizeLinear and outputs
    written by a DequantizeLinear (before ``full_integer`` removes these nodes)."""
    inits = {t.name for t in q.graph.initializer}
    producers = {t: n for n in q.graph.node for t in n.output}
    res = {}

    def rec(name, node):
        p = _qparams(q, node)
        if p is not None:
            res[name] = {"scale": _jsonable(p[0]), "zero_point": _jsonable(p[1]),
                         "dtype": helper.tensor_dtype_to_np_dtype(p[2]).name, "io_dtype": None}

    for vi in q.graph.input:
        if vi.name in inits:
            continue
        node = next((n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input and n.input[0] == vi.name), None)
        if node is not None:
            rec(vi.name, node)
    for vi in q.graph.output:
        node = producers.get(vi.name)
        if node is not None and node.op_type == "DequantizeLinear":
            rec(vi.name, node)
    return res


def _complete_value_info(q, warnings: list[str]):
    """Shape inference, then an ORT run for tensors still without value_info."""
    q = _infer(q)
    known = set(_elem_types(q))
    missing = [t for n in q.graph.node for t in n.output if t and t not in known]
    if not missing:
        return q
    try:
        sess = _ort_session(q, missing)
        feeds = {}
        for i in sess.get_inputs():
            spec = next(s for s in _input_specs(q) if s[0] == i.name)
            feeds[i.name] = np.zeros([1 if d is None else d for d in spec[2]], dtype=spec[1])
        outs = sess.run(missing, feeds)
    except Exception as e:
        warnings.append(f"value_info of {len(missing)} tensor(s) unknown (ONNX Runtime run failed: {_one_line(e)})")
        return q
    for t, a in zip(missing, outs):
        a = np.asarray(a)
        q.graph.value_info.append(helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    return q


def _count_quantized(q) -> int:
    producers = {t: n for n in q.graph.node for t in n.output}
    count = 0
    for n in q.graph.node:
        if n.op_type in _QDQ_OPS or n.op_type == "Constant":
            continue
        if n.op_type in QUANTIZED_OP_BASE or n.op_type.startswith("QLinear"):
            count += 1
        elif any(t in producers and producers[t].op_type == "DequantizeLinear" for t in n.input):
            count += 1
    return count
