#!/usr/bin/env python
"""Benchmark: ``run --reduce`` at three model sizes.

For each size, a stack of ``N`` (Conv 3x3 -> Relu) blocks with random weights (``2N``
nodes) is discovered on llvm-cpu (every layer passes alone), then run with the
``two_convs`` compiler stand-in (tests/fixtures/standin_compilers.py: a function with two
Convs fails to compile), so the run fails and ``--reduce`` must find two Convs. Measured
in the same run, per size:
  - the failing full-model run (the baseline: one compile of the whole model) and the
    reduction's wall time, and their ratio;
  - candidates run, compiles, and whether the result is 1-minimal with two Convs;
  - a second ``run --reduce`` (every candidate reused): its wall time.

Usage: python benchmarks/bench_reduce.py [--blocks 8 32 128] [--jobs 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from standin_compilers import make_standin_compiler  # noqa: E402


def conv_stack(blocks: int, seed: int = 0) -> onnx.ModelProto:
    """x [1,4,8,8] -> (Conv 3x3 pad 1 -> Relu) x blocks."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for b in range(blocks):
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32), f"w{b}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{b}"], [f"c{b}"], name=f"conv{b}", pads=[1, 1, 1, 1]))
        prev = f"r{b}" if b < blocks - 1 else "y"
        nodes.append(helper.make_node("Relu", [f"c{b}"], [prev], name=f"relu{b}"))
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def cli(*args: str, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    exe = str(Path(sys.executable).parent / "torq-gen-config")
    t0 = time.perf_counter()
    p = subprocess.run([exe, *args], capture_output=True, text=True, env={**os.environ, **(env or {})})
    return time.perf_counter() - t0, p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="keep the work in this directory")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_reduce_"))
    root.mkdir(parents=True, exist_ok=True)
    env = {"IREE_COMPILE": make_standin_compiler(root, "two_convs")}
    rows = []
    for n in args.blocks:
        d = root / f"stack{n}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        model = d / "stack.onnx"
        onnx.save(conv_stack(n), model)
        out = d / "out"
        common = ["--model", str(model), "--output-dir", str(out), "-j", str(args.jobs), "-q"]
        wall, p = cli("discover", *common, "--skip-executors", "vmvx,ort")
        if p.returncode != 0:
            sys.exit(f"discover failed ({n} blocks):\n{p.stderr[-3000:]}")
        run_s, p = cli("run", *common, env=env)
        if p.returncode != 1:
            sys.exit(f"the run with the stand-in did not fail ({n} blocks):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        red_s, p = cli("run", *common, "--reduce", env=env)
        red = json.loads((out / "reduced" / "reduce.json").read_text())
        again_s, _ = cli("run", *common, "--reduce", env=env)
        ok = red["minimal"] and [x["op_type"] for x in red["nodes"]] == ["Conv", "Conv"]
        rows.append((2 * n, run_s, red_s, red["candidates_run"], red["compiles"], again_s, ok))
    print(f"{'nodes':>6} {'run s':>7} {'reduce s':>9} {'ratio':>6} {'candidates':>10} {'compiles':>8} "
          f"{'rerun s':>8}  result")
    for nodes, run_s, red_s, cands, comps, again_s, ok in rows:
        print(f"{nodes:>6} {run_s:>7.1f} {red_s:>9.1f} {red_s / run_s:>6.1f} {cands:>10} {comps:>8} {again_s:>8.1f}  "
              f"{'2 Convs, 1-minimal' if ok else 'WRONG'}")
    print(f"(work in {root})")


if __name__ == "__main__":
    main()
