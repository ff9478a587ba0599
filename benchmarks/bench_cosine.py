#!/usr/bin/env python
"""Measurement behind FULL_MODEL_MIN_COSINE (docs/comparison.md, "Cosine similarity").

For onnx's light models with random (He-initialized) weights and an input uniform in
[-1, 1], prints ``1 - cosine`` of the model outputs (the final Softmax and the logits
before it) for runs that should pass and for wrong outputs:

  - fp32: ONNX Runtime with all graph optimizations against none;
  - bf16: every activation rounded to bf16 (Cast pairs after each node) against fp32
    arithmetic on the same bf16 weights and input, rounded to bf16 at the end;
  - int8: the QDQ-quantized model (torq_gen_config.precision.quantize) with all
    optimizations against none, and against the fp32 model;
  - wrong: negated, permuted, the output for another input.

ONNX Runtime only (CPU, one thread): about 15 s for the three default models.
Usage: python benchmarks/bench_cosine.py [MODEL_NAME ...]   (default: light_squeezenet
light_resnet50 light_inception_v1)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, shape_inference

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from torq_gen_config.compare import compare_outputs  # noqa: E402
from torq_gen_config.model.prepare import prepare_model  # noqa: E402
from torq_gen_config.precision.bf16_rounding import round_to_bf16  # noqa: E402
from torq_gen_config.precision.calibration import calibration_samples  # noqa: E402
from torq_gen_config.precision.folding import fold_to_initializers  # noqa: E402
from torq_gen_config.precision.quantize import quantize_model  # noqa: E402
from torq_gen_config.precision.ranges import tensor_ranges  # noqa: E402

OFF, ALL = ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def random_weights(model, rng):
    """Conv/Gemm weights He-normal, biases and BatchNormalization parameters near their neutral values."""
    uses = {}
    for n in model.graph.node:
        for i, t in enumerate(n.input):
            uses.setdefault(t, (n.op_type, i))
    out = []
    for init in model.graph.initializer:
        a = numpy_helper.to_array(init)
        op, idx = uses.get(init.name, ("?", 0))
        b = None
        if a.dtype == np.float32 and op in ("Conv", "Gemm", "MatMul") and idx == 1 and a.ndim >= 2:
            fan_in = int(np.prod(a.shape[1:])) if op == "Conv" else a.shape[1 if op == "Gemm" else 0]
            b = rng.standard_normal(a.shape) * np.sqrt(2.0 / fan_in)
        elif a.dtype == np.float32 and op in ("Conv", "Gemm") and idx == 2:
            b = 0.05 * rng.standard_normal(a.shape)
        elif a.dtype == np.float32 and op == "BatchNormalization" and idx >= 1:
            noise = 0.1 * rng.standard_normal(a.shape)
            b = {1: 1 + noise, 2: noise, 3: noise, 4: 1 + np.abs(noise)}[idx]
        out.append(init if b is None else numpy_helper.from_array(b.astype(np.float32), init.name))
    del model.graph.initializer[:]
    model.graph.initializer.extend(out)


def run(model, level, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = level
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def bf16_activations(model):
    """``model`` with every float node output rounded to bf16 (Cast to bf16 and back)."""
    m = shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in list(m.graph.value_info) + list(m.graph.output)}
    nodes = []
    for n in m.graph.node:
        n2 = onnx.NodeProto()
        n2.CopyFrom(n)
        casts = []
        for j, o in enumerate(n.output):
            if types.get(o) == TensorProto.FLOAT:
                n2.output[j] = o + "__pre"
                casts += [helper.make_node("Cast", [o + "__pre"], [o + "__bf"], to=TensorProto.BFLOAT16),
                          helper.make_node("Cast", [o + "__bf"], [o], to=TensorProto.FLOAT)]
        nodes += [n2] + casts
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def cosines(actual, reference, names):
    m = compare_outputs(actual, reference, names)
    return {o["name"]: o["cosine_similarity"] for o in m["outputs"]}


def row(model_name, what, cos):
    cells = ", ".join(f"{n}: " + ("undefined" if c is None else f"1-cos {1 - c:.1e}") for n, c in cos.items())
    print(f"{model_name:20s} {what:34s} {cells}")


def measure(name: str) -> None:
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"
    model, _ = prepare_model(str(path))
    model = fold_to_initializers(model)
    rng = np.random.default_rng(0)
    random_weights(model, rng)
    outs = [o.name for o in model.graph.output]
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    if softmax:  # the logits too
        model.graph.output.append(helper.make_tensor_value_info(softmax[-1].input[0], TensorProto.FLOAT, None))
        outs.append(softmax[-1].input[0])
    inp = model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    x = rng.uniform(-1, 1, shape).astype(np.float32)

    ref = run(model, OFF, {inp.name: x})
    row(name, "fp32 ORT all optimizations vs none", cosines(run(model, ALL, {inp.name: x}), ref, outs))

    mb = onnx.ModelProto()
    mb.CopyFrom(model)
    for i, init in enumerate(mb.graph.initializer):
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            mb.graph.initializer[i].CopyFrom(numpy_helper.from_array(round_to_bf16(a).astype(np.float32), init.name))
    xb = round_to_bf16(x).astype(np.float32)
    ref_b = {k: round_to_bf16(v).astype(np.float32) for k, v in run(mb, OFF, {inp.name: xb}).items()}
    row(name, "bf16 activations vs bf16 reference", cosines(run(bf16_activations(mb), OFF, {inp.name: xb}), ref_b, outs))

    samples = calibration_samples(model, n=8, seed=0)
    q, _ = quantize_model(model, ranges=tensor_ranges(model, samples), samples=samples, quant_format="qdq")
    qouts = [o.name for o in q.graph.output]
    qref = run(q, OFF, {inp.name: x})
    row(name, "int8 QDQ ORT all optimizations vs none", cosines(run(q, ALL, {inp.name: x}), qref, qouts))
    common = [n for n in outs if n in qref]
    row(name, "int8 QDQ model vs fp32 model", cosines({n: qref[n] for n in common}, ref, common))

    row(name, "wrong: negated", cosines({n: -ref[n] for n in outs}, ref, outs))
    row(name, "wrong: permuted", cosines({n: rng.permutation(ref[n].reshape(-1)).reshape(ref[n].shape)
                                          for n in outs}, ref, outs))
    other = run(model, OFF, {inp.name: rng.uniform(-1, 1, shape).astype(np.float32)})
    row(name, "wrong: output for another input", cosines(other, ref, outs))


if __name__ == "__main__":
    print(f"onnxruntime {ort.__version__}")
    for model_name in sys.argv[1:] or ["light_squeezenet", "light_resnet50", "light_inception_v1"]:
        measure(model_name)
