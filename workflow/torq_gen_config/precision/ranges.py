"""Activation ranges: the observed ``[min, max]`` of every float tensor of the whole
model over the calibration samples (ONNX Runtime, optimizations off), used as the
per-tensor overrides when a layer is quantized alone.
"""

from __future__ import annotations

from ..core.lazy import np, onnx, ort
from ..model.graph import expose_outputs
from .folding import fold_to_initializers
from .ort_quantization import QuantizationError, _one_line


def _ort_session(model, extra_outputs: list[str]):
    """ORT CPU session (graph optimizations off) with ``extra_outputs`` added as graph outputs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    expose_outputs(m, extra_outputs)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _float_tensors(model) -> list[str]:
    """Graph inputs and node outputs of float type (from value_info), in graph order."""
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
    types = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    inits = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    names += [t for n in model.graph.node for t in n.output if t]
    return [t for t in dict.fromkeys(names) if types.get(t) in floats]


def tensor_ranges(model, samples: list[dict]) -> dict[str, list[float]]:
    """Observed ``[min, max]`` of every float tensor over the calibration samples.

    Runs ONNX Runtime (CPU, graph optimizations off, so no tensor is fused away) once
    per sample with every float tensor (graph inputs and float node outputs, types
    from shape inference) as an output. Non-finite values (NaN, inf) are ignored: a
    range spans the finite values only, and a tensor that is empty or holds no finite
    value in any sample gets no range (it is left out of the result, so quantization
    calibrates it itself or leaves it unquantized). The model is folded first
    (:func:`fold_to_initializers`), so constant subgraphs have no ranges.

    Args:
        model: float ``onnx.ModelProto``.
        samples: feed dicts (see :func:`calibration_samples`).

    Returns:
        ``{tensor name: [min, max]}`` (Python floats).

    Raises:
        QuantizationError: ORT cannot load or run the model on a sample.
    """
    m = fold_to_initializers(model)
    names = _float_tensors(m)
    try:
        sess = _ort_session(m, names)
    except Exception as e:
        raise QuantizationError(f"ONNX Runtime cannot load the model to measure tensor ranges: {_one_line(e)}") from None
    feed_names = [i.name for i in sess.get_inputs()]
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for k, s in enumerate(samples):
        try:
            outs = sess.run(names, {t: s[t] for t in feed_names})
        except KeyError as e:
            raise QuantizationError(f"calibration sample {k} has no value for model input {e.args[0]!r}") from None
        except Exception as e:
            raise QuantizationError(f"ONNX Runtime failed on calibration sample {k}: {_one_line(e)}") from None
        for t, a in zip(names, outs):
            a = np.asarray(a)
            if a.size == 0:
                continue
            fin = a[np.isfinite(a)] if not np.all(np.isfinite(a)) else a
            if fin.size == 0:
                continue
            mn, mx = float(fin.min()), float(fin.max())
            lo[t] = min(lo.get(t, mn), mn)
            hi[t] = max(hi.get(t, mx), mx)
    return {t: [lo[t], hi[t]] for t in names if t in lo}
