"""Map the layers of the FP32 model onto the nodes of the quantized full model.

With ``--quantize`` the compiler sees the quantized model, so the compiler JSON must
name lines of the quantized MLIR, and ``run`` must partition the quantized model.
The quantized model has QuantizeLinear/DequantizeLinear wrappers, quantized op
types (QLinearConv, ...) and fewer compute ops (activations such as Relu fused into
the preceding Conv). Following seed 001 ("Quantized Models") and seed 002 section 5:

1. the compute nodes of the quantized model (Q/DQ dropped, op types renamed back
   to their base type: :func:`torq_gen_config.precision.quantization.compute_nodes`)
   are aligned with the FP32 layers' op types by a longest common subsequence
   (:func:`torq_gen_config.precision.quantization.align_layers`); a layer without
   a partner was fused away and gets no MLIR location;
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
    from .quantization import align_layers, compute_nodes

    nodes = list(quantized_model.graph.node)
    if not nodes:
        raise ValueError("the quantized model has no nodes")
    layers = manifest["layers"]
    computes = compute_nodes(quantized_model)
    query = [{"op_type": l["op_type"], "outputs": [o["name"] for o in l.get("outputs") or []]} for l in layers]
    aligned = align_layers(query, computes) if layers and computes else [None] * len(layers)

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


def mapping_summary(mapped: dict) -> str:
    """One console line about a layer mapping made by :func:`map_layers_to_quantized`."""
    m: dict[str, Any] = mapped.get("quantized_mapping") or {}
    return (f"quantized model: {m.get('quantized_nodes')} nodes, {m.get('compute_nodes')} compute ops; "
            f"{m.get('aligned')} layers mapped to them, {m.get('fused_layers')} fused away (not in the compiler JSON)"
            + (f", {m['unaligned_compute_nodes']} compute ops without a layer" if m.get("unaligned_compute_nodes") else ""))
