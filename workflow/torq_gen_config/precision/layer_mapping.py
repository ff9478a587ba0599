"""Map the layers of the FP32 model onto the nodes of the quantized full model.

With ``--quantize`` the compiler sees the quantized model, so the compiler JSON must
name lines of the quantized MLIR, and ``run`` must partition the quantized model.
The quantized model has QuantizeLinear/DequantizeLinear wrappers, quantized op
types (QLinearConv, ...) and fewer compute ops (activations such as Relu fused into
the preceding Conv). Following the original tool (docs/original_tool.md, 'Quantization'):

1. the compute nodes of the quantized model (Q/DQ dropped, op types renamed back
   to their base type: :func:`torq_gen_config.precision.alignment.compute_nodes`)
   are matched to the FP32 layers by tensor names first (:func:`match_by_names`):
   onnxruntime.quantization keeps a compute op's output name (QOperator appends
   ``_quantized``), and an op with a fused activation writes the activation's
   output; the ops left over are aligned with the layers left over by a longest
   common subsequence of op types
   (:func:`torq_gen_config.precision.alignment.align_layers`). Names come first
   because the quantized model's node order is not the original's (parallel
   branches are interleaved differently), so an alignment by order alone swaps ops
   of the same type. A layer without a partner was fused away and gets no MLIR
   location;
2. every other node of the quantized model (the Q/DQ wrappers, nodes the
   alignment left over) is given to a layer by the graph: a DequantizeLinear to
   the layer that consumes its output, a QuantizeLinear to the layer that
   produces its input, anything else to its producer's layer, then its
   consumer's; what is still left takes the layer of the nearest earlier node.

The result is a manifest in the split's format (``layers`` with
``prepared_node_indices`` and ``primary_prepared_index`` indexing the quantized
model's nodes), so the location lookup and the partitioning of ``run`` work on the
quantized model unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from ..core.lazy import onnx
from .alignment import align_layers, base_tensor_name, compute_nodes

#: Wrapper op types that join the layer on their data side.
_DEQUANTIZE = {"DequantizeLinear"}
_QUANTIZE = {"QuantizeLinear", "DynamicQuantizeLinear"}


def map_layers_to_quantized(manifest: dict, quantized_model: "onnx.ModelProto") -> dict:  # noqa: F821
    """Manifest of ``manifest``'s layers over the nodes of ``quantized_model``.

    Args:
        manifest: the split's manifest of the FP32 prepared model (``layers`` with
            ``layer_id``, ``op_type``, ``outputs`` [{name, ...}]).
        quantized_model: the quantized full model (``work/quant/quantized.onnx``).

    Returns:
        A copy of ``manifest`` whose layers have ``prepared_node_indices`` (every
        node of the quantized model belongs to exactly one layer, in graph order),
        ``primary_prepared_index`` (the aligned compute node, or None when fused
        away), ``quantized_op_type`` (e.g. ``QLinearConv``, or None) and
        ``quantized_note`` (why a layer has no node of its own); plus
        ``quantized_mapping``: ``{"compute_nodes", "aligned", "fused_layers",
        "unaligned_compute_nodes"}`` counts.

    Raises:
        ValueError: the quantized model has no nodes.
    """
    nodes = list(quantized_model.graph.node)
    if not nodes:
        raise ValueError("the quantized model has no nodes")
    layers = manifest["layers"]
    computes = compute_nodes(quantized_model)
    aligned: list[int | None] = match_by_names(layers, computes)
    rest_l = [k for k, a in enumerate(aligned) if a is None]
    taken = {a for a in aligned if a is not None}
    rest_c = [p for p in range(len(computes)) if p not in taken]
    if rest_l and rest_c:
        query = [{"op_type": layers[k]["op_type"], "outputs": [o["name"] for o in layers[k].get("outputs") or []]}
                 for k in rest_l]
        for k, a in zip(rest_l, align_layers(query, [computes[p] for p in rest_c])):
            if a is not None:
                aligned[k] = rest_c[a]

    owner: dict[int, int] = {}  # quantized node index -> layer position
    for k, pos in enumerate(aligned):
        if pos is not None:
            owner[computes[pos]["index"]] = k
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for j, n in enumerate(nodes):
        for t in n.output:
            if t:
                producer[t] = j
        for t in n.input:
            if t:
                consumers.setdefault(t, []).append(j)

    def from_producer(j: int) -> int | None:
        for t in nodes[j].input:
            p = producer.get(t)
            if p is not None and p in owner:
                return owner[p]
        return None

    def from_consumer(j: int) -> int | None:
        for t in nodes[j].output:
            for c in consumers.get(t, []):
                if c in owner:
                    return owner[c]
        return None

    changed = True
    while changed:
        changed = False
        for j, n in enumerate(nodes):
            if j in owner:
                continue
            if n.op_type in _DEQUANTIZE:
                k = from_consumer(j)
                k = from_producer(j) if k is None else k
            elif n.op_type in _QUANTIZE:
                k = from_producer(j)
                k = from_consumer(j) if k is None else k
            else:
                k = from_producer(j)
                k = from_consumer(j) if k is None else k
            if k is not None:
                owner[j] = k
                changed = True
    last = None
    for j in range(len(nodes)):  # isolated leftovers: the nearest earlier node's layer
        if j in owner:
            last = owner[j]
        elif last is not None:
            owner[j] = last
    first = next((owner[j] for j in range(len(nodes)) if j in owner), 0)
    for j in range(len(nodes)):
        owner.setdefault(j, first)

    out = copy.deepcopy(manifest)
    members: dict[int, list[int]] = {}
    for j in range(len(nodes)):
        members.setdefault(owner[j], []).append(j)
    fused = 0
    for k, layer in enumerate(out["layers"]):
        pos = aligned[k]
        layer["prepared_node_indices"] = members.get(k, [])
        if pos is None:
            fused += 1
            layer["primary_prepared_index"] = None
            layer["quantized_op_type"] = None
            layer["quantized_note"] = (f"no {layer['op_type']} node of its own in the quantized model (fused into a "
                                       "neighbouring op, e.g. an activation into its Conv): tested on its own, "
                                       "left out of the compiler JSON")
        else:
            c = computes[pos]
            layer["primary_prepared_index"] = c["index"]
            layer["quantized_op_type"] = c["quantized_op_type"]
            layer["quantized_note"] = None
    n_aligned = sum(1 for a in aligned if a is not None)
    out["quantized_mapping"] = {"compute_nodes": len(computes), "aligned": n_aligned, "fused_layers": fused,
                                "unaligned_compute_nodes": len(computes) - n_aligned, "quantized_nodes": len(nodes)}
    return out


#: Activations onnxruntime.quantization folds into the op before them (its output
#: then carries the activation's output name).
FUSABLE_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh"})


def match_by_names(layers: list[dict], computes: list[dict]) -> list[int | None]:
    """Per layer, the position in ``computes`` of the compute node that produces the
    layer's output under the same name (after
    :func:`~torq_gen_config.precision.alignment.base_tensor_name`) with the same
    base op type; or, for a compute node whose output is the output of a fused
    activation layer (Relu, Clip, ...; :data:`FUSABLE_ACTIVATIONS`), the layer before
    that activation, if its op type is the node's. None where no name matches.

    Args:
        layers: manifest layers (``op_type``, ``inputs``/``outputs`` as [{name, ...}]).
        computes: :func:`~torq_gen_config.precision.alignment.compute_nodes`.
    """
    by_output: dict[str, int] = {}
    for k, l in enumerate(layers):
        for o in l.get("outputs") or []:
            by_output.setdefault(o["name"], k)
    result: list[int | None] = [None] * len(layers)

    def producer_layer(k: int) -> int | None:
        ins = [i["name"] for i in layers[k].get("inputs") or [] if i["name"] in by_output]
        return by_output[ins[0]] if len(ins) == 1 else None

    for pos, c in enumerate(computes):
        for t in c.get("outputs") or []:
            k = by_output.get(base_tensor_name(t)) if t else None
            if k is None:
                continue
            cand = k
            if layers[k]["op_type"] != c["op_type"]:
                cand = None
                j, steps = k, 0  # walk back through fused activations
                while layers[j]["op_type"] in FUSABLE_ACTIVATIONS and steps < 3:
                    j = producer_layer(j)
                    steps += 1
                    if j is None:
                        break
                    if layers[j]["op_type"] == c["op_type"]:
                        cand = j
                        break
            if cand is not None and result[cand] is None:
                result[cand] = pos
            break
    return result


def quantized_tensor_names(quantized_model: "onnx.ModelProto") -> list[str]:  # noqa: F821
    """Names (as in the FP32 model) of the activations the quantized model holds
    quantized: the inputs of its QuantizeLinear nodes, and the int8/uint8 outputs of
    its compute nodes (QOperator), without onnxruntime's suffixes. A layer's float
    I/O get Q/DQ pairs in its own test only where they are in this list, i.e. where
    the whole model has them too (the ``quantize_layer`` step of rule ``prepare_unit``)."""
    types = {v.name: v.type.tensor_type.elem_type for v in list(quantized_model.graph.value_info)
             + list(quantized_model.graph.output) + list(quantized_model.graph.input)}
    ints = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
    names = set()
    for n in quantized_model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input:
            names.add(base_tensor_name(n.input[0]))
            names.add(base_tensor_name(n.output[0]))
        elif n.op_type != "DequantizeLinear":
            names.update(base_tensor_name(t) for t in n.output if t and types.get(t) in ints)
    return sorted(names)


def mapping_summary(mapped: dict) -> str:
    """One console line about a layer mapping made by :func:`map_layers_to_quantized`."""
    m: dict[str, Any] = mapped.get("quantized_mapping") or {}
    return (f"quantized model: {m.get('quantized_nodes')} nodes, {m.get('compute_nodes')} compute ops; "
            f"{m.get('aligned')} layers mapped to them, {m.get('fused_layers')} fused away (not in the compiler JSON)"
            + (f", {m['unaligned_compute_nodes']} compute ops without a layer" if m.get("unaligned_compute_nodes") else ""))
