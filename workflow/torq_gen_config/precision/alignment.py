"""Layers of the float model mapped to compute ops of the quantized full model.

:func:`compute_nodes` lists the compute nodes (Q/DQ and Constant dropped, QLinear*
renamed back to the base op) and :func:`align_layers` aligns them with the layers by a
longest common subsequence over op types (docs/original_tool.md, 'Quantization') where
:func:`torq_gen_config.precision.layer_mapping.match_by_names` found no match by tensor
name; activations that ORT fuses away (Relu after Conv) are left unaligned.
"""

from __future__ import annotations

from ..core.lazy import np
from .qdq_graph import _QDQ_OPS, QUANTIZED_OP_BASE


# Suffixes ORT appends to tensor names it quantizes (used to match names in align_layers).
_ORT_SUFFIXES = ("_quantized", "_QuantizeLinear_Output", "_DequantizeLinear_Output", "_QuantizeLinear_Input",
                 "_DequantizeLinear_Input")


def compute_nodes(model) -> list[dict]:
    """The compute nodes of a quantized model, in graph order.

    QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear and Constant nodes are
    dropped; quantized op types are renamed to their base type with
    :data:`QUANTIZED_OP_BASE` (as the original tool).

    Returns:
        ``[{"index": position in model.graph.node, "op_type": base type,
        "quantized_op_type": the node's own type, "outputs": [names]}]``.
    """
    out = []
    for j, n in enumerate(model.graph.node):
        if n.op_type in _QDQ_OPS or n.op_type == "Constant":
            continue
        out.append({"index": j, "op_type": QUANTIZED_OP_BASE.get(n.op_type, n.op_type),
                    "quantized_op_type": n.op_type, "outputs": [t for t in n.output]})
    return out


def base_tensor_name(name: str) -> str:
    """``name`` without the suffix onnxruntime.quantization appends (``_quantized``, ...)."""
    for s in _ORT_SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def align_layers(layers: list[dict], computes: list[dict]) -> list[int | None]:
    """Align layers with compute ops by a longest common subsequence of op types.

    Order-preserving (the original tool's alignment, docs/original_tool.md, 'Quantization'):
    among the alignments with the most op-type matches, one with the most pairs whose
    names agree is chosen (the layer's first output is among the compute node's
    outputs, also after removing the suffixes ORT appends such as ``_quantized``).
    Implemented as a weighted LCS: a match weighs ``K`` (K = min(m, n) + 1) plus 1
    for agreeing names, so names only break ties. O(m*n) time and memory with numpy
    (one vectorised pass per layer: the row is a running maximum).

    Args:
        layers: items with ``"op_type"`` and ``"outputs"`` (output names).
        computes: from :func:`compute_nodes`.

    Returns:
        Per layer, the position in ``computes`` it is aligned with, or None (no
        counterpart, e.g. a Relu fused into the preceding Conv).
    """
    m, n = len(layers), len(computes)
    if m == 0 or n == 0:
        return [None] * m
    K = min(m, n) + 1
    codes: dict[str, int] = {}
    lt = np.array([codes.setdefault(x["op_type"], len(codes)) for x in layers], dtype=np.int64)
    ct = np.array([codes.setdefault(x["op_type"], len(codes)) for x in computes], dtype=np.int64)
    cnames: dict[str, list[int]] = {}
    for j, c in enumerate(computes):
        for t in c.get("outputs") or []:
            if t:
                for key in {t, base_tensor_name(t)}:
                    cnames.setdefault(key, []).append(j)
    dp = np.zeros((m + 1, n + 1), dtype=np.int64)
    for i in range(1, m + 1):
        w = np.where(ct == lt[i - 1], K, 0)
        outs = layers[i - 1].get("outputs") or []
        first = outs[0] if outs else None
        if first:
            for j in set(cnames.get(first, [])):
                if w[j]:
                    w[j] += 1
        prev = dp[i - 1]
        cand = np.maximum(prev[1:], np.where(w > 0, prev[:-1] + w, 0))
        dp[i, 1:] = np.maximum.accumulate(cand)
        dp[i, 0] = 0
    # backtrack
    res: list[int | None] = [None] * m
    i, j = m, n
    while i > 0 and j > 0:
        v = dp[i, j]
        if v == dp[i - 1, j]:
            i -= 1
        elif v == dp[i, j - 1]:
            j -= 1
        else:  # a match ends here
            res[i - 1] = j - 1
            i -= 1
            j -= 1
    return res
