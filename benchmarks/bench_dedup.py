#!/usr/bin/env python
"""Benchmark: --dedup-layers on a large model (default: onnx's light_densenet121).

Measures in one run, with the default executors and J jobs:
  - the number of layers and of distinct layer signatures (what --dedup-layers tests);
  - the DAG build time (``snakemake -n`` on an empty output directory, before the split);
  - the wall time of discovery without and with --dedup-layers (each from an empty
    output directory), and their ratio;
  - the wall time of a no-op rerun (nothing changed; target <= 5 s).

Usage: python benchmarks/bench_dedup.py [--model PATH] [--jobs 2] [--keep DIR]
Takes long on 2 cores (densenet121: several minutes per discovery).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))


def snakemake(*args: str) -> tuple[float, str]:
    exe = str(Path(sys.executable).parent / "snakemake")
    t0 = time.perf_counter()
    p = subprocess.run([exe, *args], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"snakemake failed:\n{p.stderr[-3000:]}")
    return wall, p.stdout + p.stderr


def main() -> None:
    from torq_gen_config.config import model_name, resolve_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="onnx:backend/test/data/light/light_densenet121.onnx")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="keep the output directories here")
    args = ap.parse_args()
    model = str(resolve_model_path(args.model))
    root = Path(args.keep or tempfile.mkdtemp(prefix="tgc-dedup-"))
    name = model_name(model)
    figures = {}
    for dedup in (True, False):
        out = root / ("dedup" if dedup else "all")
        shutil.rmtree(out, ignore_errors=True)
        cfg = ["--config", f"model={model}", f"output_dir={out}", f"dedup_layers={str(dedup).lower()}"]
        if dedup:
            figures["dag_s"], _ = snakemake("-n", "--cores", str(args.jobs), *cfg)
        wall, _ = snakemake("--cores", str(args.jobs), *cfg)
        noop, log = snakemake("--cores", str(args.jobs), *cfg)
        report = json.loads((out / f"torq_gen_config_{name}.json").read_text())
        summary = report["discovery_report"]["summary"]
        figures["dedup" if dedup else "all"] = {"wall_s": wall, "noop_s": noop, "noop_ran_nothing": "Nothing to be done" in log,
                                                 "layers": summary["total_layers"], "tested": summary["distinct_layers_tested"],
                                                 "status_counts": summary["status_counts"]}
    d, a = figures["dedup"], figures["all"]
    print(f"model: {Path(model).name}  layers: {a['layers']}  distinct signatures: {d['tested']}  jobs: {args.jobs}")
    print(f"DAG build before the split (snakemake -n): {figures['dag_s']:.2f} s")
    print(f"discovery without --dedup-layers: {a['wall_s']:8.1f} s ({a['tested']} layers tested) {a['status_counts']}")
    print(f"discovery with --dedup-layers:    {d['wall_s']:8.1f} s ({d['tested']} layers tested) {d['status_counts']}")
    print(f"with/without = {d['wall_s'] / a['wall_s']:.2f}")
    print(f"no-op rerun: {a['noop_s']:.2f} s without dedup, {d['noop_s']:.2f} s with (target <= 5 s)"
          f"{'' if a['noop_ran_nothing'] and d['noop_ran_nothing'] else '  WARNING: jobs ran'}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
