"""ONNX graph and tensor helpers shared by the dtype passes (:mod:`.narrowing`,
:mod:`.widening`): subgraph scopes and names, tensor <-> array with bfloat16 as
``ml_dtypes.bfloat16``, the attributes that hold an element type.
"""

from __future__ import annotations

from ..core.lazy import ml_dtypes, np, numpy_helper, onnx
from ..core.limits import DETAIL_CHARS


#: Attributes holding an output element type (TensorProto enum) that the engine rewrites.
DTYPE_ATTRS = ("to", "dtype", "output_datatype", "output_dtype")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:DETAIL_CHARS]


def _to_array(t: onnx.TensorProto) -> np.ndarray:
    """numpy_helper.to_array, with BFLOAT16 always as ml_dtypes.bfloat16 (onnx 1.23
    returns bfloat16; older versions returned the raw uint16 bits)."""
    a = numpy_helper.to_array(t)
    if t.data_type == onnx.TensorProto.BFLOAT16 and a.dtype != ml_dtypes.bfloat16:
        a = a.astype(np.uint16).view(ml_dtypes.bfloat16)
    return a


def _from_array(a: np.ndarray, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(a, order="C"), name)


def _default_opset(model: onnx.ModelProto) -> int | None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return None


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _graph_defined(g: onnx.GraphProto) -> set[str]:
    names = {vi.name for vi in g.input} | {t.name for t in g.initializer}
    names |= {t.values.name for t in g.sparse_initializer}
    for n in g.node:
        names.update(o for o in n.output if o)
    return names


def _outer_refs(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph (and its nested subgraphs) reads from enclosing scopes."""
    defined = _graph_defined(g)
    refs: set[str] = set()
    for n in g.node:
        refs.update(i for i in n.input if i and i not in defined)
        for sg in _subgraphs(n):
            refs.update(r for r in _outer_refs(sg) if r not in defined)
    refs.update(o.name for o in g.output if o.name not in defined)
    return refs


def _rename_refs(g: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename outer-scope references inside a subgraph (names are unique across scopes)."""
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in mapping:
                n.input[k] = mapping[i]
        for sg in _subgraphs(n):
            _rename_refs(sg, mapping)
    for o in g.output:
        if o.name in mapping:
            o.name = mapping[o.name]


def _all_names(g: onnx.GraphProto, acc: set[str]) -> set[str]:
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        acc.add(vi.name)
    acc.update(t.name for t in g.initializer)
    for n in g.node:
        acc.add(n.name)
        acc.update(n.input)
        acc.update(n.output)
        for sg in _subgraphs(n):
            _all_names(sg, acc)
    return acc
