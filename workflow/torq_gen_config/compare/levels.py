"""Quantized data in ONNX models: dequantized outputs as integer levels, outputs that
carry quantized data, declared output shapes, and :func:`compare_on_model`.

The only part of the comparison that reads ``onnx.ModelProto`` objects (onnx is
imported lazily, in the helpers that load a file). An integer output that carries
quantized data may be one quantization step off (docs/comparison.md).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from ..core.lazy import np, numpy_helper, onnx
from .metrics import compare_outputs

def dequantized_outputs(model) -> dict[str, dict]:
    """Graph outputs of ``model`` (an ``onnx.ModelProto``) that a DequantizeLinear
    node writes with a constant per-tensor scale and zero point (a quantized
    layer's float outputs, ``--quantize``): ``{name: {"scale": float,
    "zero_point": int, "dtype": "int8"|"uint8"|...}}``.

    Such an output holds only the values ``(q - zero_point) * scale`` of the
    integer levels ``q``; :func:`to_quantized_levels` maps it back to ``q``.
    """
    inits = {t.name: t for t in model.graph.initializer}
    consts = {}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    producers = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for o in model.graph.output:
        n = producers.get(o.name)
        if n is None or n.op_type != "DequantizeLinear" or len(n.input) < 3:
            continue
        s_t = inits.get(n.input[1]) or consts.get(n.input[1])
        z_t = inits.get(n.input[2]) or consts.get(n.input[2])
        if s_t is None or z_t is None:
            continue
        scale, zp = numpy_helper.to_array(s_t), numpy_helper.to_array(z_t)
        if scale.size != 1 or zp.size != 1 or not np.issubdtype(zp.dtype, np.integer):
            continue
        out[o.name] = {"scale": float(scale.reshape(())), "zero_point": int(zp.reshape(())), "dtype": zp.dtype.name}
    return out


def dequantized_outputs_of_file(model_path: str) -> dict[str, dict]:
    """:func:`dequantized_outputs` of the ONNX model file ``model_path`` ({} when
    it cannot be read: such a model fails elsewhere, with its own stage)."""
    try:
        return dequantized_outputs(onnx.load(model_path, load_external_data=False))
    except Exception:
        return {}


def arrays_as_levels(arrays: Mapping[str, np.ndarray], levels: Mapping[str, dict]) -> dict[str, np.ndarray]:
    """``arrays`` (name -> array) with the outputs named in ``levels`` (see
    :func:`dequantized_outputs`) mapped to their integer levels; others as they are."""
    return {n: (to_quantized_levels(a, **levels[n]) if n in levels else a) for n, a in arrays.items()}


def to_quantized_levels(values: np.ndarray, scale: float, zero_point: int, dtype: str) -> np.ndarray:
    """The integer levels ``q = clip(rint(x / scale) + zero_point)`` of dequantized
    values ``x`` (ONNX QuantizeLinear: round half to even, saturate to ``dtype``),
    computed in float64. Exact for values that are ``(q - zero_point) * scale``."""
    info = np.iinfo(np.dtype(dtype))
    x = np.asarray(values, dtype=np.float64)
    q = np.rint(x / float(scale)) + int(zero_point)
    q = np.where(np.isfinite(q), q, 0)
    return np.clip(q, info.min, info.max).astype(np.dtype(dtype))


_DEFAULT_DOMAINS = ("", "ai.onnx")
_QUANTIZING_DOMAINS = ("", "ai.onnx", "com.microsoft")

_QUANTIZING_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "QGemm"})
"""Ops whose first output is quantized data (besides every ``QLinear*`` op: QLinearConv,
QLinearMatMul of the default domain; QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool,
QLinearSoftmax, QLinearReduceMean, QLinearWhere, QLinearConvTranspose, ... of
com.microsoft). DynamicQuantizeLinear's other outputs are its scale and zero point."""

_ALL = None
_MOVING_OPS: dict[str, tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = {
    # op type: (data inputs, outputs that hold quantized data when one data input does);
    # None = all of them
    "Identity": ((0,), (0,)),
    "Reshape": ((0,), (0,)),
    "Flatten": ((0,), (0,)),
    "Squeeze": ((0,), (0,)),
    "Unsqueeze": ((0,), (0,)),
    "Transpose": ((0,), (0,)),
    "Slice": ((0,), (0,)),
    "Split": ((0,), _ALL),
    "Concat": (_ALL, (0,)),
    "Gather": ((0,), (0,)),
    "GatherElements": ((0,), (0,)),
    "GatherND": ((0,), (0,)),
    "Expand": ((0,), (0,)),
    "Tile": ((0,), (0,)),
    "Pad": ((0,), (0,)),
    "DepthToSpace": ((0,), (0,)),
    "SpaceToDepth": ((0,), (0,)),
    "MaxPool": ((0,), (0,)),  # output 1 (Indices) is not data
    "GlobalMaxPool": ((0,), (0,)),
    "ReduceMax": ((0,), (0,)),
    "ReduceMin": ((0,), (0,)),
    "Max": (_ALL, (0,)),
    "Min": (_ALL, (0,)),
    "Where": ((1, 2), (0,)),
    "TopK": ((0,), (0,)),  # output 1 (Indices) is not data
    "Relu": ((0,), (0,)),
    "Clip": ((0,), (0,)),
}
"""Ops that only move, select or saturate their data input's values (no
arithmetic that rounds), so their output carries quantized data when their input
does (traced through the graph by :func:`quantized_data_outputs`)."""


def _quantized_tensors(model) -> set[str]:
    """Names of the tensors of ``model``'s main graph that carry quantized data."""
    q: set[str] = set()
    nodes = list(model.graph.node)
    for _ in range(len(nodes) + 1):  # one pass for a topologically sorted graph, a fixpoint otherwise
        before = len(q)
        for n in nodes:
            if n.domain in _QUANTIZING_DOMAINS and (n.op_type in _QUANTIZING_OPS or n.op_type.startswith("QLinear")):
                if n.output and n.output[0]:
                    q.add(n.output[0])
                continue
            rule = _MOVING_OPS.get(n.op_type) if n.domain in _DEFAULT_DOMAINS else None
            if rule is None:
                continue
            ins, outs = rule
            data = [n.input[i] for i in (range(len(n.input)) if ins is None else ins) if i < len(n.input)]
            if any(t and t in q for t in data):
                q.update(n.output[i] for i in (range(len(n.output)) if outs is None else outs)
                         if i < len(n.output) and n.output[i])
        if len(q) == before:
            break
    return q


def quantized_data_outputs(model) -> set[str]:
    """Graph outputs of ``model`` (an ``onnx.ModelProto``) that carry quantized data.

    Those are the outputs written by QuantizeLinear, DynamicQuantizeLinear (its
    first output), any ``QLinear*`` op (QLinearConv, QLinearMatMul; com.microsoft
    QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat,
    QLinearAveragePool, QLinearGlobalAveragePool, QLinearSoftmax, ...) or QGemm,
    in the default or the com.microsoft domain, and the outputs of ops that only
    move, select or saturate values (Identity, Reshape, Flatten, Squeeze,
    Unsqueeze, Transpose, Slice, Split, Concat, Gather*, Expand, Tile, Pad,
    DepthToSpace, SpaceToDepth, MaxPool, GlobalMaxPool, ReduceMax/Min, Max, Min,
    Where, TopK values, Relu, Clip) whose data input is itself quantized data,
    traced back through the graph (not into subgraphs). Graph inputs are not
    quantized data: the reference and the executor get the same values, so an
    op that only moves them must reproduce them exactly.

    Such an integer output may differ by one quantization step from the
    reference (``QuantizeLinear`` rounds ``x / scale`` half to even, so a
    different accumulation order can land on the neighbouring level); pass the
    set as ``quantized_outputs`` of :func:`compare_outputs`. The float outputs
    of DequantizeLinear are handled by :func:`dequantized_outputs` instead.

    Returns:
        The names (a subset of ``model.graph.output``'s names); empty for a model
        without quantization ops.

    Raises:
        AttributeError: ``model`` is not an ``onnx.ModelProto`` (no ``graph``).
    """
    q = _quantized_tensors(model)
    return {o.name for o in model.graph.output if o.name in q}


def quantized_data_outputs_of_file(model_path: str | None) -> set[str]:
    """:func:`quantized_data_outputs` of the ONNX model file ``model_path`` (read
    without external data); an empty set when ``model_path`` is None or the file
    cannot be read (its outputs are then compared exactly)."""
    if not model_path:
        return set()

    try:
        return quantized_data_outputs(onnx.load(model_path, load_external_data=False))
    except Exception:
        return set()


def declared_output_shapes(model) -> dict:
    """Graph output name -> its declared shape in ``model`` (ints, None for a symbolic
    or unknown dim), or None when the rank is unknown."""
    shapes = {}
    for o in model.graph.output:
        t = o.type.tensor_type
        shapes[o.name] = ([d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
                          if t.HasField("shape") else None)
    return shapes


def compare_on_model(model, actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                     output_names: list[str], *, min_cosine: float | None = None) -> dict:
    """:func:`compare_outputs` for the outputs of the ONNX model ``model`` (a layer or
    a partition): outputs a DequantizeLinear writes are compared as their integer
    levels (:func:`dequantized_outputs`; ``metrics["quantized_levels"]`` records
    them); those and the outputs that carry quantized data
    (:func:`quantized_data_outputs`) may be one step off; the model's declared output
    shapes are named in shape-mismatch messages.

    Returns:
        The metrics dict (see :func:`compare_outputs`).

    Raises:
        ValueError, TypeError: as :func:`compare_outputs`.
    """
    return _compare_as_levels(actual, reference, output_names, levels=dequantized_outputs(model),
                              quantized_outputs=quantized_data_outputs(model),
                              declared_shapes=declared_output_shapes(model), min_cosine=min_cosine)


def _compare_as_levels(actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                       output_names: list[str], *, levels: Mapping[str, dict] | None,
                       quantized_outputs: Iterable[str] = (), declared_shapes: Mapping | None = None,
                       min_cosine: float | None = None) -> dict:
    """:func:`compare_outputs` with the outputs named in ``levels`` (see
    :func:`dequantized_outputs`) mapped to their integer levels on both sides and
    recorded as ``metrics["quantized_levels"]``; those and ``quantized_outputs`` may
    be one step off."""
    if levels:
        actual, reference = arrays_as_levels(actual, levels), arrays_as_levels(reference, levels)
    quantized = set(levels or ()) | set(quantized_outputs)
    metrics = compare_outputs(actual, reference, output_names, quantized_outputs=quantized,
                              declared_shapes=declared_shapes, min_cosine=min_cosine)
    if levels:
        metrics["quantized_levels"] = dict(levels)
    return metrics
