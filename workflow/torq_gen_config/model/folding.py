"""Constant folding: the values of every node that does not depend on run-time data.

Nodes whose inputs are all constant (``Constant``, ``ConstantOfShape`` of a constant
shape, ``Identity`` of an initializer, arithmetic on such values) are evaluated with
onnx's reference evaluator; ``Shape``/``Size`` of a tensor whose shape is fully static
take their value from that shape (docs/original_tool.md, 'Layer IDs and indices'). The layer split
makes these values initializers of the layers that read them, the shape completion
(:mod:`torq_gen_config.model.shapes`) feeds them back into shape inference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from ..core.lazy import helper, np, onnx
from .graph import copy_proto, node_attr
from .spec_ops import spec_evaluator
from ..core.external_data import is_external, tensor_array
from ..core.limits import NOTE_CHARS

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
        ``(values, folded, warnings)``: ``values`` (:class:`ConstantValues`) maps
        tensor name -> numpy array for initializers and folded node outputs (a
        ``Constant`` or ``Identity`` of a stored tensor keeps referring to it);
        ``folded`` holds the indices of folded nodes in ``model.graph.node``.
    """
    values = ConstantValues(model.graph.initializer)
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
        if _alias(node, values):
            folded.add(j)
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


class ConstantValues(Mapping):
    """Tensor name -> numpy array of a model's constant tensors, without holding the
    model's weights a second time: an initializer (or a ``Constant`` value) is kept as
    its ``TensorProto`` and converted on each access (read from the weight store when
    its data is external, :mod:`.weights`; small ones are converted once and kept);
    folded values are arrays. :meth:`proto` gives the ``TensorProto`` of a name, so
    that a model cut from this one refers to the stored bytes instead of copying them.
    """

    #: in-model tensors up to this many bytes are converted once and kept (bytes)
    CACHE_BYTES = 1 << 20

    def __init__(self, tensors=()):
        self._protos: dict[str, Any] = {t.name: t for t in tensors}
        self._arrays: dict[str, Any] = {}

    def __getitem__(self, name: str):
        if name in self._arrays:
            return self._arrays[name]
        t = self._protos[name]
        value = tensor_array(t)
        if not is_external(t) and value.nbytes <= self.CACHE_BYTES:
            self._arrays[name] = value
        return value

    def __setitem__(self, name: str, value) -> None:
        self._protos.pop(name, None)
        self._arrays[name] = value

    def set_proto(self, name: str, tensor) -> None:
        """Make ``name`` the values of ``tensor`` (a copy named ``name`` is kept)."""
        t = copy_proto(tensor)
        t.name = name
        self._arrays.pop(name, None)
        self._protos[name] = t

    def proto(self, name: str):
        """The ``TensorProto`` holding ``name``'s values (named ``name``), or None for a
        folded value that is only an array."""
        return self._protos.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._protos or name in self._arrays

    def __iter__(self) -> Iterator[str]:
        yield from self._protos
        yield from (k for k in self._arrays if k not in self._protos)

    def __len__(self) -> int:
        return len(self._protos.keys() | self._arrays.keys())


def _alias(node, values: ConstantValues) -> bool:
    """Fold a ``Constant`` with a tensor ``value`` or an ``Identity`` of a tensor kept
    as a proto, by reference (no copy of the values); False when ``node`` is not one."""
    if node.op_type == "Constant" and len(node.output) == 1:
        attr = next((a for a in node.attribute if a.name == "value"), None)
        if attr is not None and attr.HasField("t"):
            values.set_proto(node.output[0], attr.t)
            return True
    if node.op_type == "Identity" and len(node.input) == 1 and values.proto(node.input[0]) is not None:
        values.set_proto(node.output[0], values.proto(node.input[0]))
        return True
    return False


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
    ins = [t for t in node.input if t]
    graph = helper.make_graph([node], "fold", [], [helper.make_tensor_value_info(o, 0, None) for o in node.output if o])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    feeds = {t: values[t] for t in ins}
    graph.input.extend([helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(values[t].dtype), values[t].shape) for t in ins])
    return spec_evaluator(m).run(None, feeds)  # the spec's LRN, not onnx 1.23's
