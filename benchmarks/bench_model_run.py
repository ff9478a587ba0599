"""Peak memory and time of the whole-model reference run: node by node (the product)
against every tensor exposed as an output at once (Polygraphy's ``--onnx-outputs mark
all``, the baseline), measured in the same run, each in its own process.

    python benchmarks/bench_model_run.py [--model light_densenet121] [--repeat 1]

Prints, per mode, the child process's peak RSS (MB) and wall time (s), and the ratio
node-by-node / mark-all. The model is one of the onnx wheel's ``light_*`` models
(upgraded to opset 17, its inputs seeded random values, as the workflow does).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, resource
import numpy as np, onnx
from onnx import version_converter
path, mode = sys.argv[1], sys.argv[2]
model = onnx.load(path)
model = onnx.shape_inference.infer_shapes(version_converter.convert_version(model, 17))
inits = {t.name for t in model.graph.initializer}
inputs = [i for i in model.graph.input if i.name not in inits]
del model.graph.input[:]
model.graph.input.extend(inputs)
from torq_gen_config.reference import make_inputs
feeds = make_inputs(model)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if mode == "node":
    from torq_gen_config.reference.model_run import run_model_by_node
    res = run_model_by_node(model, feeds)
    extra = {"nodes_run": res["nodes_run"], "peak_live_bytes": res["peak_live_bytes"]}
else:
    import onnxruntime as ort
    have = {o.name for o in model.graph.output}
    names = [o for n in model.graph.node for o in n.output if o and o not in have]
    for name in names:
        model.graph.output.add().name = name
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    extra = {"outputs": len(outs), "output_bytes": int(sum(o.nbytes for o in outs))}
print(json.dumps({"seconds": time.perf_counter() - t0, "rss_before_mb": base / 1024, **extra}))
"""


def run_child(model_path: str, mode: str) -> dict:
    """Run one mode in a fresh Python; returns its JSON line plus the child's peak RSS (MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, model_path, mode], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # ru_maxrss of the children is the largest child so far: run the small mode first
    out["peak_rss_mb"] = max(peak, before) / 1024
    out["wall_s"] = wall
    return out


def main() -> int:
    import onnx

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="light_densenet121", help="a light_* model of the onnx wheel")
    args = ap.parse_args()
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{args.model}.onnx"
    node = run_child(str(path), "node")      # first: RUSAGE_CHILDREN keeps the maximum
    mark = run_child(str(path), "mark_all")
    print(f"model: {args.model}")
    print(f"node by node : peak RSS {node['peak_rss_mb']:.0f} MB (python + model {node['rss_before_mb']:.0f} MB), "
          f"{node['seconds']:.2f} s, {node['nodes_run']} nodes, at most {node['peak_live_bytes'] / 1e6:.1f} MB "
          f"of tensors alive")
    print(f"mark all     : peak RSS {mark['peak_rss_mb']:.0f} MB (python + model {mark['rss_before_mb']:.0f} MB), "
          f"{mark['seconds']:.2f} s, {mark['outputs']} outputs, {mark['output_bytes'] / 1e6:.0f} MB of tensors")
    print(f"ratio node-by-node / mark-all: peak RSS {node['peak_rss_mb'] / mark['peak_rss_mb']:.2f}, "
          f"time {node['seconds'] / mark['seconds']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
