#!/usr/bin/env python
"""Benchmark: discovery through the Snakemake workflow vs a plain sequential loop.

Measures in one run, on the same model and executors:
  (a) wall time of the workflow (``snakemake --cores J``) from an empty output directory;
  (b) wall time of a sequential loop in one process that calls the same library
      functions for the same layers (the way the original tool works);
  (c) wall time of a no-op rerun of the workflow (nothing changed);
  (d) CPU seconds (user + sys, including child processes) per layer for (a) and (b),
      and the DAG build time (``snakemake -n`` on a fresh directory, before the split).
and prints a/b, the figure the issue sets a target for (<= 0.7 with 2 jobs).

Usage: python benchmarks/bench_discovery.py [--model PATH] [--jobs 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def snakemake(*args: str) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run snakemake from the repo root; returns (wall s, child CPU s, process)."""
    exe = str(Path(sys.executable).parent / "snakemake")
    c0, t0 = cpu_children(), time.perf_counter()
    p = subprocess.run([exe, *args], cwd=REPO, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, cpu_children() - c0
    if p.returncode != 0:
        sys.exit(f"snakemake failed:\n{p.stderr[-3000:]}")
    return wall, cpu, p


def sequential_loop(model: str, work: Path, config: dict) -> tuple[float, float, int]:
    """The baseline: every step of the workflow, one after the other, in this process."""
    from torq_gen_config import jobs
    from torq_gen_config.config import model_name

    c0, k0, t0 = cpu_self(), cpu_children(), time.perf_counter()
    w = work / "work"
    layers_dir = w / "layers"
    model_inputs = str(w / "model_inputs.npz")
    jobs.prepare_model_job(model=model, prepared=str(w / "prepared.onnx"), info_path=str(w / "prepare.json"),
                           target_opset=config["target_opset"], model_inputs=model_inputs,
                           input_settings=config["inputs"], timeout_s=config["timeout_s"])
    jobs.import_full_model_job(prepared=str(w / "prepared.onnx"), mlir=str(w / "full.mlir"), locations=str(w / "locations.json"))
    jobs.split_layers_job(prepared=str(w / "prepared.onnx"), info_path=str(w / "prepare.json"),
                          manifest=str(layers_dir / "manifest.json"), model_inputs=model_inputs,
                          layer_inputs=config["layer_inputs"], timeout_s=config["timeout_s"])
    man = json.loads((layers_dir / "manifest.json").read_text())
    from torq_gen_config.backends import NEEDS_MLIR

    for layer in man["layers"]:
        d = layers_dir / layer["slug"]
        jobs.reference_job(layer_onnx=str(d / "model.onnx"), reference=str(d / "reference.npz"),
                           input_settings=config["inputs"], engine=config["reference"], timeout_s=config["timeout_s"],
                           inputs_path=str(d / "inputs.npz") if config["layer_inputs"] == "propagate" else None)
        jobs.import_layer_job(layer_onnx=str(d / "model.onnx"), mlir=str(d / "model.mlir"), status=str(d / "import.json"))
        for ex in config["executors"]:
            needs = NEEDS_MLIR[ex["backend"]]
            jobs.test_layer_job(layer=layer, executor=ex, layer_onnx=str(d / "model.onnx"), reference=str(d / "reference.npz"),
                                mlir=str(d / "model.mlir") if needs else None,
                                import_status=str(d / "import.json") if needs else None,
                                result=str(d / ex["name"] / "result.json"), tolerance=config["tolerance"],
                                timeout_s=config["timeout_s"])
    name = model_name(model)
    jobs.aggregate_job(model_name=name, manifest=str(layers_dir / "manifest.json"), prepare_info=str(w / "prepare.json"),
                       locations=str(w / "locations.json"), results_root=str(layers_dir), executors=config["executors"],
                       tolerance=config["tolerance"], options={}, report=str(work / f"torq_gen_config_{name}.json"),
                       compiler=str(work / f"torq_gen_config_{name}_compiler.json"), output_dir=str(work))
    wall = time.perf_counter() - t0
    cpu = (cpu_self() - c0) + (cpu_children() - k0)
    return wall, cpu, len(man["layers"])


def main() -> None:
    from torq_gen_config.config import DEFAULT_CONFIG_PATH, load_config_file, resolve_model_path, validate_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="onnx:backend/test/data/light/light_squeezenet.onnx")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="keep the output directories here instead of a temporary directory")
    args = ap.parse_args()
    model = str(resolve_model_path(args.model))
    config = validate_config({**load_config_file(DEFAULT_CONFIG_PATH), "model": model})
    root = Path(args.keep or tempfile.mkdtemp(prefix="tgc-bench-"))
    wf_out, loop_out = root / "workflow", root / "loop"
    for d in (wf_out, loop_out):
        shutil.rmtree(d, ignore_errors=True)
    cfg = ["--config", f"model={model}", f"output_dir={wf_out}"]

    dag_wall, _, _ = snakemake("-n", "--cores", str(args.jobs), *cfg)
    a_wall, a_cpu, _ = snakemake("--cores", str(args.jobs), *cfg)
    c_wall, _, p = snakemake("--cores", str(args.jobs), *cfg)
    noop = "Nothing to be done" in (p.stdout + p.stderr)
    b_wall, b_cpu, n_layers = sequential_loop(model, loop_out, config)

    print(f"model: {Path(model).name}  layers: {n_layers}  executors: {[e['name'] for e in config['executors']]}  jobs: {args.jobs}  cores: {os.cpu_count()}")
    print(f"DAG build before the split (snakemake -n):   {dag_wall:7.2f} s")
    print(f"(a) workflow, {args.jobs} jobs:                      {a_wall:7.2f} s wall, {a_cpu:7.1f} s CPU ({a_cpu / n_layers:.2f} s CPU per layer)")
    print(f"(b) sequential loop, same functions:      {b_wall:7.2f} s wall, {b_cpu:7.1f} s CPU ({b_cpu / n_layers:.2f} s CPU per layer)")
    print(f"a/b = {a_wall / b_wall:.2f}   (target <= 0.70)")
    print(f"(c) no-op rerun: {c_wall:.2f} s (target <= 3 s){'' if noop else '  WARNING: jobs ran'}")
    print(f"(d) CPU per layer: workflow {a_cpu / n_layers:.2f} s, loop {b_cpu / n_layers:.2f} s; workflow overhead "
          f"{(a_cpu - b_cpu) / n_layers * 1000:+.0f} ms CPU per layer")
    print(f"outputs kept in {root}" if args.keep else "")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
