#!/usr/bin/env python
"""Benchmark: discovery with compile batches, with one-layer compiles, and a sequential loop.

Measures in one run, on the same model and executors (the default config's three):
  (a) the workflow (``snakemake --cores J``) with compile batches (``--batch``, default
      32, the config's default), from an empty output directory;
  (b) the workflow with ``compile_batch=1`` (one compiler process per layer and executor);
  (c) a sequential loop in one process that calls the same library functions for the
      same layers, one-layer compiles (the way the original tool works);
  then a no-op rerun of (a), CPU seconds (user + sys, child processes included) per
  layer, the compile times alone of (a) and (b) (their ratio is a floor of a/b: the
  other work is the same in both modes), and the DAG build time (``snakemake -n`` on a fresh directory). Prints a/b
  and a/c (targets: a/b <= 0.35, CPU per layer <= 0.3 s, no-op <= 1.5 s).
  It then splits (a)'s work by step from its job logs (batch compiles, runs per
  executor, references, imports: :func:`time_breakdown`), which shows what a CPU-per-layer
  target is up against. ``--compare`` also checks that (a) and (b) give the same verdicts (status, stage,
  message with the output directory replaced, metrics) for every (layer, executor).

Usage: python benchmarks/bench_discovery.py [--model PATH] [--jobs 2] [--keep DIR]
       [--dedup-layers] [--no-loop] [--compare]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
    from torq_gen_config.config import model_name
    from torq_gen_config.pipeline.steps.layer_tests import test_layer_job
    from torq_gen_config.pipeline.steps.prepare import import_full_model_job, prepare_model_job
    from torq_gen_config.pipeline.steps.report import aggregate_job
    from torq_gen_config.pipeline.steps.split import import_layer_job, reference_job, split_layers_job

    c0, k0, t0 = cpu_self(), cpu_children(), time.perf_counter()
    w = work / "work"
    layers_dir = w / "layers"
    model_inputs = str(w / "model_inputs.npz")
    prepare_model_job(model=model, prepared=str(w / "prepared.onnx"), info_path=str(w / "prepare.json"),
                      target_opset=config["target_opset"], model_inputs=model_inputs,
                      input_settings=config["inputs"], timeout_s=config["timeout_s"])
    import_full_model_job(prepared=str(w / "prepared.onnx"), mlir=str(w / "full.mlir"), locations=str(w / "locations.json"))
    split_layers_job(prepared=str(w / "prepared.onnx"), info_path=str(w / "prepare.json"),
                     manifest=str(layers_dir / "manifest.json"), model_inputs=model_inputs,
                     layer_inputs=config["layer_inputs"], timeout_s=config["timeout_s"])
    man = json.loads((layers_dir / "manifest.json").read_text())
    from torq_gen_config.backends import needs_mlir

    for layer in man["layers"]:
        d = layers_dir / layer["slug"]
        reference_job(layer_onnx=str(d / "model.onnx"), reference=str(d / "reference.npz"),
                      input_settings=config["inputs"], engine=config["reference"], timeout_s=config["timeout_s"],
                      inputs_path=str(d / "inputs.npz") if config["layer_inputs"] == "propagate" else None)
        import_layer_job(layer_onnx=str(d / "model.onnx"), mlir=str(d / "model.mlir"), status=str(d / "import.json"))
        for ex in config["executors"]:
            needs = needs_mlir(ex["backend"])
            test_layer_job(layer=layer, executor=ex, layer_onnx=str(d / "model.onnx"), reference=str(d / "reference.npz"),
                           mlir=str(d / "model.mlir") if needs else None,
                           import_status=str(d / "import.json") if needs else None,
                           result=str(d / ex["name"] / "result.json"), tolerance=config["tolerance"],
                           timeout_s=config["timeout_s"])
    name = model_name(model)
    aggregate_job(model_name=name, manifest=str(layers_dir / "manifest.json"), prepare_info=str(w / "prepare.json"),
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


_WALL = re.compile(r"--- (?:return code -?\d+|CRASHED[^;]*|TIMEOUT[^;]*); wall ([\d.]+) ms")


def time_breakdown(out: Path) -> dict[str, float]:
    """Where the time of a discovery went, from its job logs (seconds, summed over jobs):
    batch compiles, one-layer compiles, runs per executor (each tool process's logged
    wall time), ONNX Runtime and onnx-reference runs, MLIR imports. Wall times of work
    done two at a time: roughly its CPU time, not a share of the run's wall time."""
    logs = next(out.glob("work/*/logs"))
    got: dict[str, float] = {}

    def add(key: str, ms: float) -> None:
        got[key] = got.get(key, 0.0) + ms / 1000.0

    for f in logs.glob("compile_batch/*.log"):
        for m in _WALL.finditer(f.read_text(errors="replace")):
            add("batch compiles (iree-compile)", float(m.group(1)))
    for f in logs.glob("test_layer/*.log"):
        executor = f.name.rsplit(".", 2)[-2]
        text = f.read_text(errors="replace")
        for block in text.split("\n=== "):
            m = _WALL.search(block)
            if not m:
                continue
            kind = "one-layer compiles" if "iree-compile" in block.split("\n", 1)[0] else f"runs on {executor}"
            add(kind, float(m.group(1)))
        for m in re.finditer(r"--- ok; wall ([\d.]+) ms", text):  # ONNX Runtime: session, run
            add(f"runs on {executor} (session + run)", float(m.group(1)))
    for f in logs.glob("layer_reference/*.log"):
        text = f.read_text(errors="replace")
        for name, pat in (("references (onnxruntime)", r"reference onnxruntime ok \(([\d.]+) ms\)"),
                          ("second opinions (onnx reference evaluator)", r"second onnx ok \(([\d.]+) ms\)")):
            for m in re.finditer(pat, text):
                add(name, float(m.group(1)))
    for f in logs.glob("import_layer/*.log"):
        for m in re.finditer(r"import ok \(([\d.]+) ms\)", f.read_text(errors="replace")):
            add("MLIR imports (iree-import-onnx, warm worker)", float(m.group(1)))
    return got


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
    parts = time_breakdown(a_out)
    print(f"where (a)'s work went (logged tool wall times summed over jobs; {a_cpu:.1f} s CPU in all):")
    for name, secs in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:48s} {secs:6.1f} s  ({secs / n_layers:.3f} s per layer)")
    print(f"  {'the rest (Snakemake, job threads, comparisons, model-level jobs)':48s} "
          f"{max(0.0, a_cpu - sum(parts.values())):6.1f} s")
    if b_wall is not None:
        # the compiler's share, measured in this run: the other work is the same in both
        # modes, so a/b cannot go below the ratio of the compile times alone
        batch_s = parts.get("batch compiles (iree-compile)", 0.0)
        single_s = time_breakdown(b_out).get("one-layer compiles", 0.0)
        if single_s:
            print(f"compiles alone: batches {batch_s:.1f} s vs one-layer compiles {single_s:.1f} s = {batch_s / single_s:.2f}"
                  f" (a/b's floor with no other work); with (a)'s other work: a/b >= "
                  f"{a_cpu / (a_cpu - batch_s + single_s):.2f} in CPU")
        floor = batch_s + sum(v for k, v in parts.items() if k.startswith("runs on "))
        print(f"compiles and runs alone: {floor / n_layers:.2f} s CPU per layer (the floor of CPU per layer)")
    if args.compare and b_wall is not None:
        diff = compare_verdicts(a_out, b_out)
        print(f"verdicts (a) vs (b): {'identical' if not diff else f'{len(diff)} differ: {diff[:10]}'}")
    print(f"outputs kept in {root}" if args.keep else "")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
