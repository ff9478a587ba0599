#!/usr/bin/env python
"""Benchmark: the HTML report's model graph (report/graph.py, assets/graph.js) at scale.

Builds transformer-like stacks with onnx.helper (13 layers per block, node names scoped as
the PyTorch exporter writes them: ``/encoder/layers.N/attn/q_proj/MatMul``, ...) of 60, 240
and 936 layers, writes for each a layers manifest (from the model's nodes, as the split step
records them: layer ID, node name, input and output tensors) and a report JSON, then measures
in one run:
  - the page size (bytes) and the Python build time (``write_report_html``: reading and
    checking the report, the plotly figures, the graph data; seconds, best of two);
  - in headless Chromium (playwright, network refused): the time from navigation to the graph
    drawn (``data-done-ms``: includes parsing plotly.js and drawing the other figures), the
    graph's own layout + SVG time (dagre, ``data-layout-ms``) for the nodes it starts with, the
    visible node count, and the layout time with every scope expanded;
and prints each figure also as a ratio against the smallest model.

THE VERDICTS ARE SYNTHETIC: no layer is compiled or run. Each (layer, executor) gets a
made-up result (mostly success; a difference on llvm-cpu every 17th layer, an error on vmvx
every 11th, one critical failure, a few inconclusive successes and reference disputes),
built into a report by the product's own ``build_report``. The figures are about rendering,
which depends on the number of layers and edges, not on how the verdicts came about.

Usage: python benchmarks/bench_graph.py [--sizes 60,240,936] [--keep DIR]
About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
CHROMIUM = "/usr/bin/chromium"
HIDDEN = 16
BLOCK = [  # (scope below /encoder/layers.N, op, inputs by role, weight)
    ("attn/q_proj/MatMul", "MatMul", ["h"], "wq"), ("attn/k_proj/MatMul", "MatMul", ["h"], "wk"),
    ("attn/v_proj/MatMul", "MatMul", ["h"], "wv"), ("attn/Transpose", "Transpose", ["k"], None),
    ("attn/MatMul", "MatMul", ["q", "kt"], None), ("attn/Softmax", "Softmax", ["s"], None),
    ("attn/MatMul_1", "MatMul", ["p", "v"], None), ("attn/o_proj/MatMul", "MatMul", ["a"], "wo"),
    ("Add", "Add", ["h", "o"], None), ("mlp/fc1/MatMul", "MatMul", ["r"], "w1"),
    ("mlp/act/Relu", "Relu", ["f1"], None), ("mlp/fc2/MatMul", "MatMul", ["g"], "w2"), ("Add_1", "Add", ["r", "f2"], None),
]
ROLES = ["q", "k", "v", "kt", "s", "p", "a", "o", "r", "f1", "g", "f2", "h"]  # what each node of BLOCK writes


def stack_model(n_layers: int):
    """A transformer-like chain of ``n_layers`` ONNX nodes (the last block cut short)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, h = [], [], "x"
    for i in range(n_layers):
        b, k = divmod(i, len(BLOCK))
        scope, op, ins, weight = BLOCK[k]
        if k == 0:
            names = {"h": h}
        name = f"/encoder/layers.{b}/{scope}"
        inputs = [names[r] for r in ins]
        if weight:
            w = f"layers.{b}.{weight}"
            inits.append(numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.1, w))
            inputs.append(w)
        out = f"{name}_output_0"
        attrs = {"perm": [0, 2, 1]} if op == "Transpose" else {"axis": -1} if op == "Softmax" else {}
        nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        names[ROLES[k]] = out
        h = out if k == len(BLOCK) - 1 else h
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, HIDDEN])],
                              [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, [1, 8, None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def manifest_of(model) -> dict:
    """The layers manifest the split step would write (only what the graph reads)."""
    layers = []
    for i, node in enumerate(model.graph.node):
        layers.append({"layer_id": f"{node.op_type}_{node.output[0]}", "op_type": node.op_type, "node_index": i,
                       "node_name": node.name, "inputs": [{"name": n} for n in node.input],
                       "outputs": [{"name": n} for n in node.output]})
    return {"layers": layers}


def synthetic_report(name: str, manifest: dict) -> dict:
    """A report of made-up verdicts (module docstring), built with the product's build_report."""
    from torq_gen_config.compare import compare_outputs
    from torq_gen_config.report.build import build_report

    tol = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
    ref = np.linspace(1.0, 2.0, 64)
    metrics = {rel: compare_outputs({"y": ref * (1 + rel)}, {"y": ref}, ["y"]) for rel in (1e-6, 0.03)}

    def ok(rel=1e-6):
        return {"status": "success" if rel < 0.01 else "difference", "tolerance_used": tol, "metrics": metrics[rel],
                "failure_report": None, "timing": {"compile_ms": 40.0, "run_ms": 3.0}, "reference": {"status": "ok"}}

    def err(stage):
        return {"status": "error", "tolerance_used": tol, "metrics": None, "timing": {"compile_ms": 20.0, "run_ms": None},
                "failure_report": {"type": "error", "stage": stage, "summary": f"synthetic {stage} error",
                                   "message": f"synthetic {stage} error\n(bench_graph.py: no tool ran)"},
                "reference": {"status": "ok"}}

    layers, results = [], {}
    n = len(manifest["layers"])
    for i, m in enumerate(manifest["layers"]):
        layers.append({"layer_id": m["layer_id"], "slug": f"l{i}", "op_type": m["op_type"], "node_index": i,
                       "mlir_location": f"{10 + i}:5", "mac_count": None, "skipped_reason": None})
        critical = i == n // 2
        results[m["layer_id"]] = {"llvm-cpu": err("compile") if critical else ok(0.03 if i % 17 == 5 else 1e-6),
                                  "vmvx": err("run") if critical or i % 11 == 3 else ok(),
                                  "ort": err("run") if critical else ok()}
    executors = [{"name": x, "backend": b, "options": {}}
                 for x, b in (("llvm-cpu", "iree"), ("vmvx", "iree"), ("ort", "onnxruntime"))]
    rep = build_report(model_name=name, layers=layers, results=results, executors=executors, default_tolerance=tol,
                       mlir_file=None, provenance={"tool": "benchmarks/bench_graph.py (synthetic verdicts)"})
    dr = rep["discovery_report"]
    for i, lid in enumerate(rep["ops"]):  # the report's marks on a few layers
        if i % 97 == 7:
            rep["ops"][lid].setdefault("reference", {"status": "ok"})["dispute"] = {"summary": "synthetic dispute"}
            dr["reference_disputes"].append({"layer_id": lid, "summary": "synthetic dispute", "agree_with": {}})
        if i % 89 == 11:
            dr["inconclusive_checks"].append({"layer_id": lid, "executor": "vmvx", "reason": "synthetic"})
    return rep


def browse(page: Path) -> dict:
    """Open the page in headless Chromium (network refused); the graph's figures."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 900})
            errors = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
            t0 = time.perf_counter()
            pg.goto(page.resolve().as_uri())
            pg.wait_for_selector("#graph-box[data-done-ms]", timeout=120000)
            wall = (time.perf_counter() - t0) * 1000
            attrs = pg.evaluate("() => Object.fromEntries([...document.getElementById('graph-box').attributes]"
                                ".map(a => [a.name, a.value]))")
            pg.evaluate("() => torqGraph.setLevel(null)")
            full = pg.evaluate("() => [document.getElementById('graph-box').getAttribute('data-layout-ms'), "
                               "document.querySelectorAll('.gnode').length]")
            if errors:
                raise SystemExit(f"page errors: {errors}")
        finally:
            browser.close()
    return {"done_ms": float(attrs["data-done-ms"]), "goto_wall_ms": wall, "layout_ms": float(attrs["data-layout-ms"]),
            "visible": int(attrs["data-visible"]), "all_layout_ms": float(full[0]), "all_nodes": int(full[1])}


def main() -> None:
    from torq_gen_config.report.html import write_report_html

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="60,240,936")
    ap.add_argument("--keep", help="keep the pages here")
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="tgc-graph-"))
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        name = f"stack{n}"
        out = root / name
        model = stack_model(n)
        manifest = manifest_of(model)
        (out / "work" / name / "layers").mkdir(parents=True, exist_ok=True)
        (out / "work" / name / "layers" / "manifest.json").write_text(json.dumps(manifest))
        report_path = out / f"torq_gen_config_{name}.json"
        report_path.write_text(json.dumps(synthetic_report(name, manifest)))
        build_s = float("inf")
        for _ in range(2):  # best of two: the first also pays for importing plotly
            t0 = time.perf_counter()
            page = write_report_html(report_path)
            build_s = min(build_s, time.perf_counter() - t0)
        row = {"layers": n, "edges": sum(len(x["inputs"]) for x in manifest["layers"]), "bytes": page.stat().st_size,
               "build_s": build_s, **browse(page)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]
    print(f"\n{'layers':>7} {'page bytes':>11} {'build s':>8} {'to graph ms':>12} {'graph layout ms':>16} "
          f"{'visible':>8} {'all-expanded layout ms':>23}   ratios vs {base['layers']} layers (bytes, build, to graph, layout)")
    for r in rows:
        print(f"{r['layers']:>7} {r['bytes']:>11} {r['build_s']:>8.2f} {r['done_ms']:>12.0f} {r['layout_ms']:>16.0f} "
              f"{r['visible']:>8} {r['all_layout_ms']:>23.0f}   {r['bytes'] / base['bytes']:.2f}x "
              f"{r['build_s'] / base['build_s']:.2f}x {r['done_ms'] / base['done_ms']:.2f}x "
              f"{r['layout_ms'] / max(base['layout_ms'], 1):.2f}x")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
