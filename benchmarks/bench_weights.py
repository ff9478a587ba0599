#!/usr/bin/env python
"""Benchmark: disk and memory cost of big weights, per ``parameters`` mode, at three sizes.

Models (saved inline as one .onnx each, seeded random float32 weights): stacks of ``N``
(Gemm(x, W_i[d,d], b_i) -> Relu) layers, x [1,d], for each ``d`` of ``--dims`` (default
1024, 2048, 4096 with N=4: 16, 64 and 256 MB), and with ``--alexnet`` torchvision's
AlexNet structure (233 MB; its largest layer, fc0, 151 MB). Each is discovered
(``discover -j J -q``) and then run (``run -q``) once per mode, each in its own output
directory, with ``parameters: <mode>`` in a ``--config-file`` (mode ``default``: no config
file). Measured in the same run, per command:
  - wall time and exit status;
  - peak RSS of the largest single process of the command's process tree (sampled every
    50 ms with psutil), which process it was, and the peak of the tree's summed RSS;
  - after the command: bytes of ``OUT/work/<model>/`` (allocated blocks, hard links counted
    once; and apparent size) and of the whole ``OUT``;
  - ratios against the baselines measured here: work bytes / model file bytes, peak
    single-process RSS / the largest layer's weight bytes, and the same net of the
    runtime's own peak RSS (a process that only imports Python, onnx, ONNX Runtime and
    IREE's bindings).
After ``run``: the 5 largest files of the work directory. A mode the checkout does not know
(discover refuses the config naming ``parameters``) is reported as not supported and skipped.

Usage: python benchmarks/bench_weights.py [--dims 1024 2048 4096] [--layers 4] [--alexnet]
           [--jobs 2] [--modes inline external] [--keep DIR] [--json PATH]
(without --keep, the work goes to a temporary directory that is removed at the end)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
from onnx import TensorProto, helper, numpy_helper

CLI = str(Path(sys.executable).parent / "torq-gen-config")
MB = 1024 * 1024


def gemm_stack(dim: int, layers: int, seed: int = 0) -> onnx.ModelProto:
    """x [1,dim] -> (Gemm with W_i [dim,dim], b_i [dim] -> Relu) x layers, seeded weights."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((dim, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
        inits += [numpy_helper.from_array(w, f"W{i}"),
                  numpy_helper.from_array(rng.standard_normal(dim, dtype=np.float32) * 0.1, f"b{i}")]
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"b{i}"], [f"g{i}"], name=f"gemm{i}"))
        prev = f"r{i}" if i < layers - 1 else "y"
        nodes.append(helper.make_node("Relu", [f"g{i}"], [prev], name=f"relu{i}"))
    graph = helper.make_graph(nodes, "gemm_stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def alexnet(seed: int = 0) -> onnx.ModelProto:
    """torchvision's AlexNet structure (5 Conv + ReLU + 3 MaxPool, 3 Gemm: 61.1 M float32
    parameters, about 233 MB) with seeded random weights; x [1,3,224,224] -> y [1,1000]."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"

    def param(name: str, shape: tuple) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))), name))
        return name

    convs = [(64, 3, 11, 4, 2, True), (192, 64, 5, 1, 2, True), (384, 192, 3, 1, 1, False),
             (256, 384, 3, 1, 1, False), (256, 256, 3, 1, 1, True)]
    for i, (cout, cin, k, stride, pad, pool) in enumerate(convs):
        w, b = param(f"conv{i}.weight", (cout, cin, k, k)), param(f"conv{i}.bias", (cout,))
        nodes.append(helper.make_node("Conv", [prev, w, b], [f"c{i}"], name=f"conv{i}", kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[pad] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
        if pool:
            nodes.append(helper.make_node("MaxPool", [prev], [f"p{i}"], name=f"pool{i}", kernel_shape=[3, 3],
                                          strides=[2, 2]))
            prev = f"p{i}"
    nodes.append(helper.make_node("Flatten", [prev], ["flat"], name="flatten", axis=1))
    prev = "flat"
    for i, (nout, nin) in enumerate([(4096, 9216), (4096, 4096), (1000, 4096)]):
        w, b = param(f"fc{i}.weight", (nout, nin)), param(f"fc{i}.bias", (nout,))
        out = "y" if i == 2 else f"f{i}"
        nodes.append(helper.make_node("Gemm", [prev, w, b], [out], name=f"fc{i}", transB=1))
        if i < 2:
            nodes.append(helper.make_node("Relu", [out], [f"fr{i}"], name=f"fc_relu{i}"))
            out = f"fr{i}"
        prev = out
    graph = helper.make_graph(nodes, "alexnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1000])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def largest_layer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers of the node that reads the most (a layer's own weights)."""
    sizes = {t.name: int(np.prod(t.dims)) * 4 for t in model.graph.initializer}
    return max(sum(sizes.get(i, 0) for i in n.input) for n in model.graph.node)


def runtime_rss() -> int:
    """Peak RSS (bytes) of a process that only imports what the tool's jobs import (Python,
    onnx, ONNX Runtime, IREE's compiler and runtime bindings, numpy): the runtime's own."""
    code = ("import resource, numpy, onnx, onnxruntime, iree.compiler, iree.runtime, torq_gen_config.cli.main; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout) * 1024


def short_cmd(cmdline: list[str], width: int = 60) -> str:
    """A process's command line, paths cut to their last component, at most ``width`` chars.

    An argument with white space (the code of ``python -c``) is cut to its first 30 chars.
    """
    words = [" ".join(w.split())[:30] if any(c.isspace() for c in w)
             else os.path.basename(w) if "/" in w and not w.startswith("-") else w for w in cmdline]
    text = " ".join(words) or "?"
    return text if len(text) <= width else text[: width - 3] + "..."


def describe(p: psutil.Process) -> str:
    """Who ``p`` is: its shortened command line; a multiprocessing forkserver or one of its workers
    (those share the forkserver's command line) is named as such."""
    cmd = p.cmdline()
    code = cmd[cmd.index("-c") + 1] if "-c" in cmd[:-1] else ""
    if "multiprocessing.forkserver" in code:
        parent = p.parent()
        return "forkserver worker" if parent is not None and parent.cmdline() == cmd else "forkserver"
    return short_cmd(cmd)


def run_sampled(cmd: list[str], interval: float = 0.05) -> dict:
    """Run ``cmd``; sample its process tree's RSS every ``interval`` s until it exits.

    Returns wall time, exit status, stdout/stderr, the peak RSS of any single process with
    its (shortened) command line, and the peak of the tree's summed RSS.
    """
    peak = {"rss": 0, "cmd": "", "tree": 0}
    done = threading.Event()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        root = psutil.Process(proc.pid)

        def sample() -> None:
            while not done.is_set():
                try:
                    procs = [root, *root.children(recursive=True)]
                except psutil.Error:
                    procs = []
                tree = 0
                for p in procs:
                    try:
                        rss = p.memory_info().rss
                        tree += rss
                        if rss > peak["rss"]:
                            peak["rss"], peak["cmd"] = rss, describe(p)
                    except psutil.Error:
                        continue
                peak["tree"] = max(peak["tree"], tree)
                done.wait(interval)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        return {"wall_s": wall, "rc": rc, "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace"), "peak_rss": peak["rss"],
                "peak_cmd": peak["cmd"], "peak_tree_rss": peak["tree"]}


def files(path: Path):
    """Yield (relative path, lstat) of every non-directory entry under ``path``."""
    for dirpath, _, names in os.walk(path):
        for name in names:
            full = Path(dirpath, name)
            try:
                yield full.relative_to(path), full.lstat()
            except OSError:
                continue


def disk_usage(path: Path) -> tuple[int, int]:
    """(allocated bytes = sum of st_blocks*512, apparent bytes) under ``path``; hard links once."""
    seen, blocks, apparent = set(), 0, 0
    for _, st in files(path):
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            blocks += st.st_blocks * 512
            apparent += st.st_size
    return blocks, apparent


def largest_files(path: Path, n: int = 5) -> list[tuple[int, int, int, str]]:
    """The ``n`` largest files under ``path`` by apparent size: (size, allocated, links, path)."""
    rows = [(st.st_size, st.st_blocks * 512, st.st_nlink, str(rel)) for rel, st in files(path)]
    return sorted(rows, reverse=True)[:n]


def not_supported(res: dict) -> str | None:
    """The CLI's error line when it refused the config because of ``parameters``, else None."""
    if res["rc"] == 2 and "parameters" in res["stderr"]:
        return next((ln for ln in res["stderr"].splitlines() if "parameters" in ln), "").strip()
    return None


def bench_mode(mode: str, model: Path, root: Path, jobs: int, base: dict) -> tuple[list[dict], bool]:
    """Discover and run ``model`` with ``parameters: mode``; returns (rows, failed unexpectedly)."""
    mdir = root / model.stem / f"mode_{mode}"
    shutil.rmtree(mdir, ignore_errors=True)
    mdir.mkdir(parents=True)
    out = mdir / "out"
    extra = []
    if mode != "default":
        (mdir / "parameters.yaml").write_text(f"parameters: {mode}\n")
        extra = ["--config-file", str(mdir / "parameters.yaml")]
    work = out / "work" / model.stem
    rows = []
    for command, flags in (("discover", ["-j", str(jobs)]), ("run", [])):
        res = run_sampled([CLI, command, "--model", str(model), "--output-dir", str(out), *flags, "-q", *extra])
        reason = not_supported(res)
        if reason is not None:
            print(f"mode {mode}: not supported by this checkout ({reason})")
            return rows, False
        wblocks, wapp = disk_usage(work)
        oblocks, _ = disk_usage(out)
        row = {"model": model.stem, "mode": mode, "command": command, "wall_s": round(res["wall_s"], 2), "rc": res["rc"],
               "work_bytes": wblocks, "work_apparent_bytes": wapp, "out_bytes": oblocks,
               "work_over_model": round(wblocks / base["model_bytes"], 2),
               "peak_rss_bytes": res["peak_rss"], "peak_rss_process": res["peak_cmd"],
               "peak_tree_rss_bytes": res["peak_tree_rss"],
               "rss_over_layer": round(res["peak_rss"] / base["layer_bytes"], 2),
               "net_rss_over_layer": round((res["peak_rss"] - base["runtime_rss"]) / base["layer_bytes"], 2)}
        rows.append(row)
        print(f"mode {mode}, {command}: {row['wall_s']:.1f} s, exit {row['rc']}; work {wblocks / MB:.1f} MB "
              f"(apparent {wapp / MB:.1f} MB, {row['work_over_model']:.2f}x model), out {oblocks / MB:.1f} MB; "
              f"peak RSS {res['peak_rss'] / MB:.0f} MB ({row['rss_over_layer']:.2f}x largest layer; "
              f"{row['net_rss_over_layer']:.2f}x above the runtime's own) in "
              f"[{res['peak_cmd']}], tree peak {res['peak_tree_rss'] / MB:.0f} MB")
        if res["rc"] != 0:
            print(f"mode {mode}: {command} failed (exit {res['rc']}):\n{res['stdout'][-1500:]}{res['stderr'][-3000:]}")
            return rows, True
    print(f"mode {mode}: 5 largest files of {work} after run (size MB, allocated MB, links, path):")
    for size, alloc, links, rel in largest_files(work):
        print(f"  {size / MB:>9.1f} {alloc / MB:>9.1f} {links:>3}  {rel}")
    return rows, False


def print_summary(rows: list[dict]) -> None:
    """The final table: one line per (mode, command)."""
    print(f"{'model':<14} {'mode':<9} {'command':<9} {'wall s':>7} {'work MB':>9} {'work/model':>10} "
          f"{'peak RSS MB':>11} {'RSS/layer':>9} {'net/layer':>9} {'exit':>4}")
    for r in rows:
        print(f"{r['model']:<14} {r['mode']:<9} {r['command']:<9} {r['wall_s']:>7.1f} {r['work_bytes'] / MB:>9.1f} "
              f"{r['work_over_model']:>10.2f} {r['peak_rss_bytes'] / MB:>11.0f} {r['rss_over_layer']:>9.2f} "
              f"{r['net_rss_over_layer']:>9.2f} {r['rc']:>4}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", type=int, nargs="+", default=[1024, 2048, 4096],
                    help="d of each Gemm stack: x is [1,d], each W_i [d,d] (default 1024 2048 4096: 16, 64, 256 MB)")
    ap.add_argument("--layers", type=int, default=4, help="N: Gemm -> Relu blocks (default 4)")
    ap.add_argument("--alexnet", action="store_true", help="also AlexNet's structure (233 MB, random weights)")
    ap.add_argument("--jobs", type=int, default=2, help="discover -j (default 2)")
    ap.add_argument("--modes", nargs="+", default=["inline", "external"],
                    help="values of the parameters setting; 'default' = no config file")
    ap.add_argument("--keep", help="keep the work in this directory")
    ap.add_argument("--json", help="also write the summary rows as JSON to this file")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_weights_"))
    root.mkdir(parents=True, exist_ok=True)
    own = runtime_rss()
    print(f"the runtime's own peak RSS (Python + onnx + ONNX Runtime + IREE bindings): {own / MB:.0f} MB")
    builds = [(f"gemm{args.layers}x{d}", lambda d=d: gemm_stack(d, args.layers)) for d in args.dims]
    if args.alexnet:
        builds.append(("alexnet", alexnet))
    rows, failed, baselines = [], False, {}
    try:
        for name, build in builds:
            model = root / f"{name}.onnx"
            t0 = time.perf_counter()
            proto = build()
            onnx.save(proto, model)
            base = {"model_bytes": model.stat().st_size, "layer_bytes": largest_layer_bytes(proto), "runtime_rss": own}
            del proto
            baselines[name] = base
            print(f"\nmodel {model.name}: {base['model_bytes'] / MB:.1f} MB (built and saved in "
                  f"{time.perf_counter() - t0:.1f} s); largest layer's weights {base['layer_bytes'] / MB:.1f} MB")
            for mode in args.modes:
                mode_rows, mode_failed = bench_mode(mode, model, root, args.jobs, base)
                rows += mode_rows
                failed |= mode_failed
            if not args.keep:
                shutil.rmtree(root / name, ignore_errors=True)
        print()
        print_summary(rows) if rows else print("(no mode ran: none is supported by this checkout)")
        if args.json:
            Path(args.json).write_text(json.dumps({"baselines": baselines, "rows": rows}, indent=2) + "\n")
    finally:
        if args.keep:
            print(f"(work in {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
