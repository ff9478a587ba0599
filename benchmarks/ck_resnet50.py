#!/usr/bin/env python3
"""A realistic CK workload: the 53 convolutions of a ResNet-50, forward and backward, timed.

1. Builds a TraceLens event-replay IR of a ResNet-50 training step from the real model shipped
   in the onnx wheel (onnx/backend/test/data/light/light_resnet50.onnx: every Conv with its
   input and weight shapes from ONNX shape inference, strides, pads): one
   ``aten::miopen_convolution`` record per Conv and one ``aten::convolution_backward`` with
   output_mask [True, True, False] ([False, True, False] for the first Conv, whose input needs
   no gradient), ranked by FLOPs, with the batch size and dtype given.
2. Converts it (``ck-profile convert``) and runs it with ``--backend onnxruntime`` (this
   machine's CPU), printing the figures per CK op and the total.

    python benchmarks/ck_resnet50.py --write-ir tests/data/resnet50_conv_ir.json   # the test data
    python benchmarks/ck_resnet50.py --batch 2 --max-ops 30                       # figures

The IR in tests/data is the output of the first line with the defaults (batch 32, fp16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workflow"))
from torq_gen_config.ck.trace_ir import dense_strides  # noqa: E402

DTYPES = {"fp16": "c10::Half", "bf16": "c10::BFloat16", "fp32": "float"}


def _tensor(shape, dtype):
    return {"shape": list(shape), "dtype": dtype, "strides": dense_strides(shape), "init": "normal"}


def _arg(name, kind, value):
    return {"arg_name": name, "arg_type": kind, "value": value}


def resnet50_trace(batch: int = 32, dtype: str = "fp16") -> list[dict]:
    """The IR records (see the module docstring)."""
    import onnx
    from onnx import helper, shape_inference

    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_resnet50.onnx")
    model = shape_inference.infer_shapes(onnx.load(path))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    t = DTYPES[dtype]
    convs = []
    for i, node in enumerate(n for n in model.graph.node if n.op_type == "Conv"):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x = [batch, *shapes[node.input[0]][1:]]
        w = shapes[node.input[1]]
        pads = attrs.get("pads", [0, 0, 0, 0])
        assert pads[:2] == pads[2:], "PyTorch convolutions pad symmetrically"
        stride, dilation, groups = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1]), attrs.get("group", 1)
        out = [(x[2 + d] + 2 * pads[d] - ((w[2 + d] - 1) * dilation[d] + 1)) // stride[d] + 1 for d in range(2)]
        y = [batch, w[0], *out]
        flop = 2 * batch * w[0] * w[1] * out[0] * out[1] * w[2] * w[3]
        fwd = {"op_name": "aten::miopen_convolution", "replay_ir": {"list_pos_args": [
            _arg("self", "Tensor", _tensor(x, t)), _arg("weight", "Tensor", _tensor(w, t)),
            _arg("bias", "Tensor?", None), _arg("padding", "SymInt[]", pads[:2]), _arg("stride", "SymInt[]", stride),
            _arg("dilation", "SymInt[]", dilation), _arg("groups", "SymInt", groups),
            _arg("benchmark", "bool", True), _arg("deterministic", "bool", False)], "list_kwargs": []},
            "count": 1, "metadata": {"resnet50_conv": i, "onnx_node": node.output[0]}}
        bwd = {"op_name": "aten::convolution_backward", "replay_ir": {"list_pos_args": [
            _arg("grad_output", "Tensor", _tensor(y, t)), _arg("input", "Tensor", _tensor(x, t)),
            _arg("weight", "Tensor", _tensor(w, t)), _arg("bias_sizes", "SymInt[]?", None),
            _arg("stride", "SymInt[]", stride), _arg("padding", "SymInt[]", pads[:2]),
            _arg("dilation", "SymInt[]", dilation), _arg("transposed", "bool", False),
            _arg("output_padding", "SymInt[]", [0, 0]), _arg("groups", "SymInt", groups),
            _arg("output_mask", "bool[3]", [i != 0, True, False])], "list_kwargs": []},
            "count": 1, "metadata": {"resnet50_conv": i, "onnx_node": node.output[0]}}
        convs.append((flop, fwd, bwd))
    records = []
    for rank, (_, fwd, bwd) in enumerate(sorted(convs, key=lambda c: -c[0]), 1):
        for r in (fwd, bwd):
            r["metadata"]["priority_rank"] = rank
            records.append(r)
    return records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-ir", metavar="FILE", help="only write the IR to FILE")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default: 32 for --write-ir, 2 for timing)")
    ap.add_argument("--dtype", choices=DTYPES, default="fp16")
    ap.add_argument("--max-ops", type=int, default=None, help="time only the N highest-ranked configurations")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    if args.write_ir:
        with open(args.write_ir, "w") as f:
            json.dump(resnet50_trace(args.batch or 32, args.dtype), f, indent=1)
            f.write("\n")
        print(f"wrote {args.write_ir}")
        return 0
    from torq_gen_config.ck import cli

    batch = args.batch or 2
    with tempfile.TemporaryDirectory() as tmp:
        ir, configs, out = (os.path.join(tmp, n) for n in ("ir.json", "configs.json", "results.json"))
        with open(ir, "w") as f:
            json.dump(resnet50_trace(batch, args.dtype), f)
        assert cli.main(["convert", ir, configs, "--quiet"]) == 0
        argv = ["run", configs, "--backend", "onnxruntime", "--quiet", "--output", out, "--work-dir",
                os.path.join(tmp, "work"), "-j", str(args.jobs)]
        if args.max_ops:
            argv += ["--max-ops", str(args.max_ops)]
        start = time.perf_counter()
        rc = cli.main(argv)
        wall = time.perf_counter() - start
        doc = json.load(open(out))
    per_op = defaultdict(list)
    for r in doc["results"]:
        if r["success"]:
            per_op[r["operation"]].append(r)
    print(f"\nResNet-50 convolutions, batch {batch}, {args.dtype} trace timed in fp32 on ONNX Runtime CPU "
          f"({os.cpu_count()} CPUs); {doc['stats']}; wall {wall:.1f} s (rc {rc})")
    print(f"{'op':<26}{'configs':>8}{'total ms':>12}{'median TFLOPS':>15}{'max TFLOPS':>12}")
    total = 0.0
    for op in sorted(per_op):
        rs = per_op[op]
        ms = sum(r["avg_time_ms"] for r in rs)
        total += ms
        tf = [r["tflops"] for r in rs]
        print(f"{op:<26}{len(rs):>8}{ms:>12.2f}{statistics.median(tf):>15.4f}{max(tf):>12.4f}")
    print(f"{'all':<26}{sum(len(v) for v in per_op.values()):>8}{total:>12.2f}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
