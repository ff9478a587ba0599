#!/usr/bin/env python
"""Benchmark (issues 22 and 38): the full-model run as ONE IREE module with per-op devices
(``run --run-mode module``) against the chain of same-executor partitions
(``run --run-mode partitions``), on the same assignment, measured in the same run; with
``--baseline CHECKOUT`` also the module mode of an older checkout on a copy of the same
discovery (the figures before a change).

Models (all with seeded random weights, so a wrong kernel shows in the outputs):
  - ``squeezenet``: light SqueezeNet (the shipped ``onnx:backend/test/data/light/light_squeezenet.onnx``,
    66 layers) with its all-0.02 ConstantOfShape weights replaced by He-scaled random
    initializers;
  - ``transformer``: one pre-LN transformer block built here with onnx.helper, opset 17
    (LayerNormalization, MatMul+Add Q/K/V, Reshape/Transpose to 4 heads, MatMul, Softmax,
    MatMul, output projection, residual Add, MLP MatMul+Gelu (Erf form)+MatMul, residual
    Add), seq 16, hidden 64;
  - ``branch``: issue 38's branch graph, Conv_a -> Sigmoid/Mul (SiLU) -> {Conv_b, Conv_c} ->
    Concat -> Conv_out;
  - ``detector``: the YOLOv8n-like detector of bench_work_dir.py at ``--detector-size``
    (default 128).

Assignments (the default IREE local executors llvm-cpu and vmvx):
  - ``all``: every layer on llvm-cpu (the module has one device, the chain one partition);
  - ``convs``: every Conv on vmvx (transformer: every MatMul; branch: Conv_c only), the
    rest on llvm-cpu;
  - ``random``: a seeded random 50/50 assignment over the layers;
  - ``head``: the last fifth of the layers (the detector's head) on vmvx.
Default: squeezenet and transformer all, convs, random; branch convs; detector head.
Module rows show where the layers ran, read back from the compiled program (as assigned /
elsewhere / no kernel) and the exit status: a module that ran layers elsewhere is
``success, not as assigned`` under ``--run-mode module`` (exit 1) since issue 38.

Everything goes through the CLI as a user would: ``discover`` once per model (not timed,
not counted), then per assignment ``edit --layer ALL --executor llvm-cpu`` plus
``edit --layer 'Conv_*' --executor vmvx`` (the random assignment: the product's own edit
function, ``torq_gen_config.report.edit.edit_report_file``, once per vmvx layer: the CLI
takes one pattern per call), then ``run --run-mode module`` and ``run --run-mode
partitions``. Before every run the compiled partitions, batches and module
(``work/<model>/full/partitions/*``, ``batches/*``) are deleted, so each run compiles
from scratch. Per (model, assignment, mode) it prints:
  - compile s: module mode ``full_model.module.compile_ms``; partitions mode
    ``full_model.timing.compile_ms_total`` (with the default ``compile_batch: 32`` the
    partitions of one executor are compiled as one batch module, so this is the batches'
    wall time);
  - run ms: module ``full_model.module.run_ms``, partitions ``timing.run_ms_total``: the
    wall time of the ``iree-run-module`` process(es), start-up and module loading included
    (the chain starts one per partition and hands the tensors on through the host);
  - compiles: ``iree-compile`` processes, counted by pointing ``$IREE_COMPILE`` at a
    wrapper that logs each call and execs the real compiler (a ``--version`` query is not
    counted);
  - max |diff| against the ONNX Runtime reference, the status and the mode that produced
    the result (a module that fails or differs also runs the partitions: ``mode`` is then
    ``partitions`` and the compiles include both);
  - the wall time of the whole ``run`` command (Snakemake, import, reference included);
  - the ratio module / partitions of compile s and run ms (the partitions run of the same
    assignment is the baseline).
With ``--repeat N`` each (assignment, mode) runs N times, the modes alternating (a change
of the machine's load hits both), and the table shows medians (min-max).

Usage:
  python benchmarks/bench_full_run.py                       # every model, its default assignments
  python benchmarks/bench_full_run.py --models branch,detector,transformer --baseline /work/before  # issue 38
  python benchmarks/bench_full_run.py --quick               # smoke run: transformer, all + random
  python benchmarks/bench_full_run.py --repeat 3 --json figures.json --keep /tmp/bfr
  python benchmarks/bench_full_run.py --table-from figures.json   # print the table again
  python benchmarks/bench_full_run.py --models transformer --assignments all,convs --json out.json

Caveats: vmvx is an interpreter, ~200x slower than llvm-cpu, so any vmvx layer dominates
the run ms of both modes (the ratio then mostly says "the same kernels ran"); on a small
shared machine (2 CPUs, other jobs running) the timings are noisy (tens of percent): read
the ratios, not the absolute figures, and compare runs of the same invocation only; use
``--repeat 3``. On 2 shared CPUs: ``--quick`` about 1.5 minutes; squeezenet and transformer
about 2.5-3.5 minutes per repetition plus 1.2 minutes of discovery. Module mode's compile count
includes one small ``iree-compile`` per target (the executors' target probe) and its three
steps (to the flow level, where the dispatches are pinned to their devices, to the stream
level, then from it); the partitions' count is one per executor
with ``compile_batch: 32`` (one per partition with ``--compile-batch 1`` is not measured
here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BIN = Path(sys.executable).parent
TGC = str(BIN / "torq-gen-config")
MODELS = ("squeezenet", "transformer", "branch", "detector")
ASSIGNMENTS = ("all", "convs", "random", "head")
#: the assignments a model gets when --assignments is not given
DEFAULT_ASSIGNMENTS = {"squeezenet": ("all", "convs", "random"), "transformer": ("all", "convs", "random"),
                       "branch": ("convs",), "detector": ("head",)}
#: the layers ``convs`` moves to vmvx (an edit --layer pattern)
VMVX_PATTERN = {"squeezenet": "Conv_*", "transformer": "MatMul_*", "branch": "Conv_c*", "detector": "Conv_*"}
MODES = ("module", "partitions")
SQUEEZENET = "onnx:backend/test/data/light/light_squeezenet.onnx"


# --------------------------------------------------------------------------- models


def squeezenet_random(seed: int = 0) -> onnx.ModelProto:
    """light SqueezeNet with each ConstantOfShape weight (value 0.02: every output would be
    0.001) replaced by a seeded He-scaled random initializer."""
    from torq_gen_config.config import resolve_model_path

    model = onnx.load(str(resolve_model_path(SQUEEZENET)))
    rng = np.random.default_rng(seed)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    keep = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
            fan = int(np.prod(shape[1:])) if len(shape) > 1 else 0
            a = rng.standard_normal(shape) * (np.sqrt(2.0 / fan) if fan else 0.1)
            g.initializer.append(numpy_helper.from_array(a.astype(np.float32), n.output[0]))
            if model.ir_version < 4:  # initializers are graph inputs there
                g.input.append(helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, shape))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    used = {i for n in g.node for i in n.input}
    for t in [t for t in g.initializer if t.name not in used]:
        g.initializer.remove(t)
        for i in [i for i in g.input if i.name == t.name]:
            g.input.remove(i)
    return model


def branch_graph() -> onnx.ModelProto:
    """The branch graph of issue 38: Conv_a -> Sigmoid, Mul (SiLU) -> {Conv_b, Conv_c} ->
    Concat -> Conv_out (4 -> 8 -> 16 -> 4 channels at 16x16, seeded random weights)."""
    rng = np.random.default_rng(0)

    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="Conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["a"], ["s"], name="Sigmoid"),
             helper.make_node("Mul", ["a", "s"], ["m"], name="Mul"),
             helper.make_node("Conv", ["m", "wb"], ["b"], name="Conv_b", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["m", "wc"], ["c"], name="Conv_c", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["b", "c"], ["cat"], name="Concat", axis=1),
             helper.make_node("Conv", ["cat", "wo"], ["y"], name="Conv_out")]
    graph = helper.make_graph(nodes, "branch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [w("wa", [8, 4, 3, 3]), w("wb", [8, 8, 3, 3]), w("wc", [8, 8, 3, 3]),
                               w("wo", [4, 16, 1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def detector(size: int) -> onnx.ModelProto:
    """The YOLOv8n-like detector of benchmarks/bench_work_dir.py at ``size`` x ``size``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_work_dir", Path(__file__).with_name("bench_work_dir.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.yolo(size)


def transformer_block(seq: int = 16, hidden: int = 64, heads: int = 4, mlp: int = 4, seed: int = 0) -> onnx.ModelProto:
    """x [1, seq, hidden] -> one pre-LN transformer block -> y [1, seq, hidden]."""
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    inits, nodes = [], []

    def w(name, shape, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name))
        return name

    def c(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def ln(x, tag):
        g = c(f"{tag}_gamma", 1.0 + 0.1 * rng.standard_normal(hidden))
        b = c(f"{tag}_beta", 0.1 * rng.standard_normal(hidden))
        return node("LayerNormalization", [x, g, b], tag, axis=-1, epsilon=1e-5)

    def linear(x, tag, n_in, n_out):
        mm = node("MatMul", [x, w(f"{tag}_w", (n_in, n_out))], f"{tag}_mm")
        return node("Add", [mm, w(f"{tag}_b", (n_out,), 0.1)], tag)

    split = c("heads_shape", [1, seq, heads, hd], np.int64)
    merge = c("merged_shape", [1, seq, hidden], np.int64)
    h1 = ln("x", "ln1")
    q = node("Transpose", [node("Reshape", [linear(h1, "q", hidden, hidden), split], "q_split")], "q_heads",
             perm=[0, 2, 1, 3])
    k = node("Transpose", [node("Reshape", [linear(h1, "k", hidden, hidden), split], "k_split")], "k_heads_t",
             perm=[0, 2, 3, 1])
    v = node("Transpose", [node("Reshape", [linear(h1, "v", hidden, hidden), split], "v_split")], "v_heads",
             perm=[0, 2, 1, 3])
    scores = node("Mul", [node("MatMul", [q, k], "scores_mm"), c("scale", 1.0 / np.sqrt(hd))], "scores")
    probs = node("Softmax", [scores], "probs", axis=-1)
    ctx = node("MatMul", [probs, v], "ctx_heads")
    ctx = node("Reshape", [node("Transpose", [ctx], "ctx_t", perm=[0, 2, 1, 3]), merge], "ctx")
    res1 = node("Add", ["x", linear(ctx, "o", hidden, hidden)], "res1")
    h2 = ln(res1, "ln2")
    up = linear(h2, "fc1", hidden, mlp * hidden)
    # Gelu (Erf form, Gelu is opset 20): 0.5 * x * (1 + erf(x / sqrt 2))
    erf = node("Erf", [node("Div", [up, c("sqrt2", np.sqrt(2.0))], "gelu_div")], "gelu_erf")
    gelu = node("Mul", [node("Mul", [up, node("Add", [erf, c("one", 1.0)], "gelu_add")], "gelu_mul"),
                        c("half", 0.5)], "gelu")
    node("Add", [res1, linear(gelu, "fc2", mlp * hidden, hidden)], "y")
    graph = helper.make_graph(nodes, "transformer_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


# --------------------------------------------------------------------------- helpers


def cli(*args: str, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    p = subprocess.run([TGC, *args], check=False, capture_output=True, text=True, env={**os.environ, **(env or {})})
    return time.perf_counter() - t0, p


def counting_compiler(root: Path) -> tuple[str, Path]:
    """A wrapper for ``$IREE_COMPILE`` that appends one line per call to a log file and
    execs the real ``iree-compile``."""
    real = shutil.which("iree-compile", path=str(BIN)) or shutil.which("iree-compile")
    if not real:
        sys.exit("iree-compile not found (install iree-base-compiler in the venv)")
    log = root / "iree_compile_calls.log"
    wrapper = root / "iree-compile-counting"
    wrapper.write_text(f'#!/bin/sh\necho "$$ $*" | cut -c1-300 >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(wrapper), log


def count_compiles(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if "--version" not in line.split(" ", 1)[-1])


def report_path(out: Path, name: str) -> Path:
    return out / f"torq_gen_config_{name}.json"


def set_assignment(out: Path, model: Path, name: str, kind: str, vmvx_pattern: str, seed: int) -> dict:
    """Edit the report so that it holds the assignment ``kind``; returns {layer: executor}."""
    common = ["--model", str(model), "--output-dir", str(out)]
    _, p = cli("edit", *common, "--layer", "ALL", "--executor", "llvm-cpu")
    if p.returncode:
        sys.exit(f"edit --layer ALL failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    layers = list(json.loads(report_path(out, name).read_text())["ops"])
    if kind == "convs":
        _, p = cli("edit", *common, "--layer", vmvx_pattern, "--executor", "vmvx")
        if p.returncode:
            sys.exit(f"edit --layer {vmvx_pattern} failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    elif kind in ("random", "head"):
        from torq_gen_config.report.edit import edit_report_file

        rng = np.random.default_rng(seed)
        moved = ([lid for lid in layers if rng.random() < 0.5] if kind == "random"
                 else layers[int(len(layers) * 0.8):])  # the head: the last fifth of the layers
        for lid in moved:
            edit_report_file(report_path(out, name), lid, executor="vmvx")
    ops = json.loads(report_path(out, name).read_text())["ops"]
    return {lid: op.get("recommended_executor") for lid, op in ops.items()}


def fresh(out: Path, name: str) -> None:
    """Delete every compiled partition, batch and module of the model: the next run compiles all."""
    full = out / "work" / name / "full"
    for sub in ("partitions", "batches"):
        shutil.rmtree(full / sub, ignore_errors=True)


def measure(out: Path, model: Path, name: str, mode: str, jobs: int, env: dict, log: Path,
            baseline: Path | None = None) -> dict:
    """One ``run --run-mode mode`` from scratch; with ``baseline``, that checkout's
    ``python -m torq_gen_config`` (PYTHONPATH=<baseline>/workflow) instead of this one."""
    fresh(out, name)
    before = count_compiles(log)
    args = ["run", "--model", str(model), "--output-dir", str(out), "--run-mode", mode, "-j", str(jobs), "-q"]
    if baseline is None:
        wall, p = cli(*args, env=env)
    else:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "torq_gen_config", *args], check=False, capture_output=True,
                           text=True, env={**os.environ, **env, "PYTHONPATH": str(baseline / "workflow")})
        wall = time.perf_counter() - t0
    row = {"mode_asked": mode, "variant": "baseline" if baseline else "this", "exit": p.returncode,
           "wall_s": round(wall, 2), "compiles": count_compiles(log) - before}
    try:
        fm = json.loads(report_path(out, name).read_text())["full_model"]
    except (OSError, KeyError, ValueError) as e:
        row.update(status="no report", error=f"{e}: {p.stderr[-1500:]}")
        return row
    timing = fm.get("timing") or {}
    metrics = fm.get("metrics") or {}
    mod = fm.get("module") or {}
    row.update(mode=fm.get("mode"), status=fm.get("status"), mode_reason=fm.get("mode_reason"),
               max_abs_diff=metrics.get("max_abs_diff"), cosine=metrics.get("cosine_similarity"),
               num_partitions=fm.get("num_partitions"), partition_counts=fm.get("partition_counts"))
    if mode == "module":
        row.update(compile_ms=mod.get("compile_ms"), run_ms=mod.get("run_ms"), module_status=mod.get("status"),
                   transfers=mod.get("transfers"), devices=[d.get("executor") for d in mod.get("devices") or []],
                   shared_executables=mod.get("shared_executables"),
                   compile_phases_ms=mod.get("compile_phases_ms"),
                   elsewhere=len((fm.get("placement") or {}).get("elsewhere") or []),
                   placement=dict((fm.get("placement") or mod.get("placement") or {}).get("counts") or {}))
    else:
        row.update(compile_ms=timing.get("compile_ms_total"), run_ms=timing.get("run_ms_total"))
    if fm.get("status") != "success" or p.returncode:
        row["summary"] = fm.get("summary")
        row["stderr_tail"] = p.stderr[-1500:]
    return row


def summarize(runs: list[dict]) -> dict:
    """The first repetition's row with the medians of compile_ms, run_ms and wall_s (and
    every repetition's values under ``*_all``)."""
    row = dict(runs[0])
    for key in ("compile_ms", "run_ms", "wall_s", "compiles"):
        vals = [r.get(key) for r in runs]
        if len(runs) > 1:
            row[f"{key}_all"] = vals
        nums = [v for v in vals if isinstance(v, (int, float))]
        row[key] = float(np.median(nums)) if len(nums) == len(vals) else None
    row["statuses"] = sorted({str(r.get("status")) for r in runs})
    row["repetitions"] = len(runs)
    return row


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"


def spread(r: dict, key: str, div: float, spec: str) -> str:
    """`` (min-max)`` of the repetitions, empty for one."""
    vals = [v / div for v in r.get(f"{key}_all") or [] if isinstance(v, (int, float))]
    return f" ({format(min(vals), spec)}-{format(max(vals), spec)})" if len(vals) > 1 else ""


def fmt(x, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", "--sizes", default=",".join(MODELS),
                    help="comma-separated: squeezenet,transformer,branch,detector")
    ap.add_argument("--assignments", help="comma-separated: all,convs,random,head (default: per model, "
                                          "squeezenet and transformer all,convs,random; branch convs; detector head)")
    ap.add_argument("--detector-size", type=int, default=128, help="detector input H = W (default 128; a multiple of 32)")
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                    help="also run module mode with this checkout's code (python -m torq_gen_config, PYTHONPATH="
                         "CHECKOUT/workflow) on a copy of the same discovery: the figures before a change")
    ap.add_argument("--quick", action="store_true", help="smoke run: transformer, all + random")
    ap.add_argument("--jobs", "-j", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run each (assignment, mode) N times, alternating the modes; the table shows medians")
    ap.add_argument("--seed", type=int, default=2, help="seed of the random assignment")
    ap.add_argument("--json", metavar="PATH", help="write the figures to this JSON file")
    ap.add_argument("--keep", metavar="DIR", help="work in this directory (kept; default: a temp dir, removed)")
    ap.add_argument("--table-from", metavar="PATH", help="only print the table of a --json file of an earlier run")
    args = ap.parse_args()
    if args.table_from:
        saved = json.loads(Path(args.table_from).read_text())
        print_table(saved["rows"])
        print(f"{saved['date']}, {saved['cpus']} cpus, total {saved['total_s']} s, discover {saved['discover_s']}: "
              f"{saved['command']}")
        return
    models = ["transformer"] if args.quick else [m for m in args.models.split(",") if m]
    asked = ["all", "random"] if args.quick else [a for a in (args.assignments or "").split(",") if a]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (choose from {', '.join(MODELS)})")
    for k in asked:
        if k not in ASSIGNMENTS:
            ap.error(f"unknown assignment {k!r} (choose from {', '.join(ASSIGNMENTS)})")
    if args.baseline and not (args.baseline / "workflow" / "torq_gen_config").is_dir():
        ap.error(f"--baseline {args.baseline}: no workflow/torq_gen_config there (git worktree add DIR COMMIT)")
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_full_run_"))
    root.mkdir(parents=True, exist_ok=True)
    wrapper, log = counting_compiler(root)
    env = {"IREE_COMPILE": wrapper}
    t_start = time.perf_counter()
    rows, discover_s = [], {}
    for m in models:
        d = root / m
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        name = f"{m}_random"
        model = d / f"{name}.onnx"
        built = {"squeezenet": squeezenet_random, "transformer": transformer_block, "branch": branch_graph,
                 "detector": lambda: detector(args.detector_size)}[m]()
        onnx.save(built, model)
        out = d / "out"
        print(f"[{m}] discover ...", flush=True)
        wall, p = cli("discover", "--model", str(model), "--output-dir", str(out), "-j", str(args.jobs), "-q",
                      "--skip-executors", "ort")
        if p.returncode not in (0, 1):
            sys.exit(f"discover failed ({m}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
        discover_s[m] = round(wall, 1)
        base_out = d / "out_baseline"
        if args.baseline:  # the same discovery, run by the older code in a copy
            shutil.copytree(out, base_out)
        variants = [("module", out, None), ("partitions", out, None)]
        if args.baseline:
            variants.insert(1, ("module", base_out, args.baseline))
        for kind in asked or DEFAULT_ASSIGNMENTS[m]:
            assignment = set_assignment(out, model, name, kind, VMVX_PATTERN[m], args.seed)
            if args.baseline:
                set_assignment(base_out, model, name, kind, VMVX_PATTERN[m], args.seed)
            n_vmvx = sum(1 for e in assignment.values() if e == "vmvx")
            runs: dict[tuple, list] = {(mode, str(base)): [] for mode, _, base in variants}
            for rep in range(args.repeat):  # the modes alternate: a load change hits both
                for mode, where, base in variants:
                    print(f"[{m}] {kind} ({n_vmvx}/{len(assignment)} layers on vmvx): run --run-mode {mode}"
                          f"{' (baseline)' if base else ''}"
                          f"{f' (repetition {rep + 1}/{args.repeat})' if args.repeat > 1 else ''} ...", flush=True)
                    r = measure(where, model, name, mode, args.jobs, env, log, baseline=base)
                    runs[(mode, str(base))].append(r)
                    if r.get("status") != "success":
                        print(f"    {r.get('status')}: {r.get('summary') or r.get('error')}", flush=True)
            for mode, _, base in variants:
                row = summarize(runs[(mode, str(base))])
                row.update(model=m, assignment=kind, layers=len(assignment), vmvx_layers=n_vmvx)
                rows.append(row)
    total_s = time.perf_counter() - t_start
    if args.json:  # first: a table that fails to print loses nothing
        Path(args.json).write_text(json.dumps({"rows": rows, "discover_s": discover_s, "total_s": round(total_s, 1),
                                               "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                               "command": " ".join(sys.argv)}, indent=1, default=str))
    print_table(rows)
    print(f"discover (not in the table): {', '.join(f'{m} {s} s' for m, s in discover_s.items())}; "
          f"benchmark total {total_s:.0f} s; cpus {os.cpu_count()}")
    if args.json:
        print(f"figures: {args.json}")
    if args.keep:
        print(f"(work in {root})")
    else:
        shutil.rmtree(root, ignore_errors=True)


def placement_text(r: dict) -> str:
    """``as assigned / elsewhere / no kernel`` layer counts of a module run's read-back."""
    c = r.get("placement") or {}
    return "/".join(str(c.get(k, 0)) for k in ("as assigned", "elsewhere", "no kernel")) if c else ""


def print_table(rows: list[dict]) -> None:
    table = []
    for r in rows:
        base = next((b for b in rows if b["model"] == r["model"] and b["assignment"] == r["assignment"]
                     and b["mode_asked"] == "partitions"), None)
        comp_s = r["compile_ms"] / 1000 if isinstance(r.get("compile_ms"), (int, float)) else None
        is_mod = r["mode_asked"] == "module"
        mode = r["mode_asked"] + (" (before)" if r.get("variant") == "baseline" else "")
        table.append([r["model"], f"{r['assignment']} ({r['vmvx_layers']}/{r['layers']} vmvx)", mode,
                      placement_text(r) if is_mod else "", fmt(r.get("exit"), "g"),
                      fmt(comp_s, ".2f") + spread(r, "compile_ms", 1000, ".1f"),
                      fmt(r.get("run_ms"), ".1f") + spread(r, "run_ms", 1, ".0f"), fmt(r["compiles"], "g"),
                      (f"{r.get('transfers')} transfers" if is_mod and r.get("mode") == "module"
                       else f"{r.get('num_partitions')} partitions"),
                      fmt(r.get("max_abs_diff"), ".2e"),
                      "/".join(r.get("statuses") or [str(r.get("status"))]) + ("" if r.get("mode") == r["mode_asked"] else f" (ran {r.get('mode')})"),
                      fmt(r["wall_s"], ".1f"),
                      ratio(r.get("compile_ms"), base.get("compile_ms")) if is_mod and base else "",
                      ratio(r.get("run_ms"), base.get("run_ms")) if is_mod and base else ""])
    headers = ["model", "assignment", "mode", "layers as assigned/elsewhere/no kernel", "exit", "compile s", "run ms",
               "compiles", "shape", "max |diff|", "status", "wall s", "compile ratio", "run ratio"]
    try:
        from tabulate import tabulate

        print(tabulate(table, headers=headers, stralign="left"))
    except ImportError:
        print("  ".join(headers))
        for t in table:
            print("  ".join(str(x) for x in t))
    print("medians (min-max) over the repetitions; (before): module mode of the --baseline checkout on a copy of the "
          "same discovery; ratio = module / partitions of the same assignment (partitions: compile_batch 32 from the default "
          "config; compiles = iree-compile processes; shape = the module's cross-device transfers or the "
          "chain's partitions)")


if __name__ == "__main__":
    main()
