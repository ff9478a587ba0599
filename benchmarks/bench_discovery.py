#!/usr/bin/env python
"""Benchmark: discovery with compile batches, with one-layer compiles, and a sequential loop.

Measures in one run, on the same model and executors (the default config's three):
  (a) the workflow (``snakemake --cores J``) with compile batches (``--batch``, default
      32, the config's default), from an empty output directory;
  (b) the workflow with ``compile_batch=1`` (one compiler process per layer and executor);
  (c) a sequential loop in one process that calls the same library functions for the
      same layers, one-layer compiles (the way the original tool works);
  then a no-op rerun of (a), CPU seconds (user + sys, child processes included) per
  layer, and the DAG build time (``snakemake -n`` on a fresh directory). Prints a/b
  and a/c (targets: a/b <= 0.35, CPU per layer <= 0.3 s, no-op <= 1.5 s).
  ``--compare`` also checks that (a) and (b) give the same verdicts (status, stage,
  message with the output directory replaced, metrics) for every (layer, executor).

Usage: python benchmarks/bench_discovery.py [--model PATH] [--jobs 2] [--keep DIR]
       [--dedup-layers] [--no-loop] [--compare]
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


def compare_verdicts(a: Path, b: Path) -> list[str]:
    """(layer, executor) pairs whose verdicts differ between output directories a and b:
    status, failure stage/during/message (each directory's path replaced by <out>),
    metrics and the second-opinion metrics."""
    def load(root: Path) -> dict:
        out = {}
        for f in root.glob("work/*/layers/*/*/result.json"):
            r = json.loads(f.read_text())
            fr = r.get("failure_report") or {}
            msg = (fr.get("message") or "").replace(str(root.resolve()), "<out>").replace(str(root), "<out>")
            out[(r["layer_slug"], r["executor"])] = (r["status"], fr.get("stage"), fr.get("during"), msg,
                                                     json.dumps(r.get("metrics"), sort_keys=True),
                                                     json.dumps(r.get("reference_check"), sort_keys=True))
        return out

    va, vb = load(a), load(b)
    return sorted(f"{k[0]} on {k[1]}" for k in set(va) | set(vb) if va.get(k) != vb.get(k))


def main() -> None:
    from torq_gen_config.config import DEFAULT_CONFIG_PATH, load_config_file, resolve_model_path, validate_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="onnx:backend/test/data/light/light_squeezenet.onnx")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="compile_batch of (a) (default 32, as the config)")
    ap.add_argument("--keep", help="keep the output directories here instead of a temporary directory")
    ap.add_argument("--dedup-layers", action="store_true", help="discovery with dedup_layers (a large model)")
    ap.add_argument("--no-loop", action="store_true", help="skip (c), the sequential loop")
    ap.add_argument("--no-single", action="store_true", help="skip (b), the one-layer compiles")
    ap.add_argument("--compare", action="store_true", help="check that (a) and (b) give the same verdicts")
    args = ap.parse_args()
    model = str(resolve_model_path(args.model))
    config = validate_config({**load_config_file(DEFAULT_CONFIG_PATH), "model": model,
                              "dedup_layers": args.dedup_layers})
    root = Path(args.keep or tempfile.mkdtemp(prefix="tgc-bench-"))
    a_out, b_out, loop_out = root / "batched", root / "single", root / "loop"
    for d in (a_out, b_out, loop_out):
        shutil.rmtree(d, ignore_errors=True)
    extra = ["dedup_layers=true"] if args.dedup_layers else []

    def cfg(out: Path, *more: str) -> list[str]:
        return ["--config", f"model={model}", f"output_dir={out}", *extra, *more]

    batched = f"compile_batch={args.batch}"
    dag_wall, _, _ = snakemake("-n", "--cores", str(args.jobs), *cfg(a_out, batched))
    a_wall, a_cpu, _ = snakemake("--cores", str(args.jobs), *cfg(a_out, batched))
    noop_wall, _, p = snakemake("--cores", str(args.jobs), *cfg(a_out, batched))
    noop = "Nothing to be done" in (p.stdout + p.stderr)
    man = json.loads(next(a_out.glob("work/*/layers/manifest.json")).read_text())
    n_layers = len(man["layers"])
    b_wall = b_cpu = c_wall = c_cpu = None
    if not args.no_single:
        b_wall, b_cpu, _ = snakemake("--cores", str(args.jobs), *cfg(b_out, "compile_batch=1"))
    if not args.no_loop:
        c_wall, c_cpu, _ = sequential_loop(model, loop_out, config)

    print(f"model: {Path(model).name}  layers: {n_layers}  executors: {[e['name'] for e in config['executors']]}  "
          f"jobs: {args.jobs}  cores: {os.cpu_count()}  compile_batch of (a): {args.batch}"
          + ("  dedup_layers" if args.dedup_layers else ""))
    print(f"DAG build before the split (snakemake -n):   {dag_wall:7.2f} s")
    print(f"(a) workflow, compile batches:            {a_wall:7.2f} s wall, {a_cpu:7.1f} s CPU ({a_cpu / n_layers:.2f} s CPU per layer)")
    if b_wall is not None:
        print(f"(b) workflow, compile_batch=1:            {b_wall:7.2f} s wall, {b_cpu:7.1f} s CPU ({b_cpu / n_layers:.2f} s CPU per layer)")
        print(f"a/b = {a_wall / b_wall:.2f}   (target <= 0.35)")
    if c_wall is not None:
        print(f"(c) sequential loop, one-layer compiles:  {c_wall:7.2f} s wall, {c_cpu:7.1f} s CPU ({c_cpu / n_layers:.2f} s CPU per layer)")
        print(f"a/c = {a_wall / c_wall:.2f}")
    print(f"CPU per layer (a): {a_cpu / n_layers:.2f} s (target <= 0.3 s)")
    print(f"no-op rerun of (a): {noop_wall:.2f} s (target <= 1.5 s){'' if noop else '  WARNING: jobs ran'}")
    if args.compare and b_wall is not None:
        diff = compare_verdicts(a_out, b_out)
        print(f"verdicts (a) vs (b): {'identical' if not diff else f'{len(diff)} differ: {diff[:10]}'}")
    print(f"outputs kept in {root}" if args.keep else "")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
