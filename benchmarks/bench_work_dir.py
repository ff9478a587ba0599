#!/usr/bin/env python
"""Benchmark: the on-disk size of the work directory against the model's own data.

Models (built with onnx.helper, seeded random float32 weights, opset 17, IR 8, static shapes):
  yolo         a YOLOv8n-like detector at HxW (``--yolo-size``, default 640): SiLU Conv blocks
               (Conv, Sigmoid, Mul) down to stride 32, C2f blocks (Split, Concat), an SPPF (three
               MaxPool k5 s1 p2), a neck (Resize nearest x2, Concat), heads at strides 8/16/32
               (Reshape, Concat); ~220 nodes
  transformer  a transformer-encoder stack (seq 128, hidden 256, 4 heads, MLP 1024,
               ``--transformer-blocks`` blocks, default 4; GELU Erf-based in even blocks,
               Tanh-based in odd ones)
  cnn          a ResNet-18-like CNN at 224x224 (Conv, BatchNormalization, Relu, Add, MaxPool,
               GlobalAveragePool, Gemm); 69 nodes
  decoder      (opt-in, ``--decoder``) a Llama-architecture decoder (hidden 2048, 22 blocks,
               32 heads, 4 KV heads, SwiGLU MLP 5632, vocab 32000, 128 tokens; RMSNorm from
               Pow/ReduceMean/Add/Sqrt/Div/Mul, rotary embedding from cos/sin initializers,
               grouped KV by Unsqueeze/Expand/Reshape); ~4.4 GB of weights, streamed to an ONNX
               external data file as they are made (the model proto never holds them)
Per model: weights bytes (every initializer), activation bytes (graph inputs and every node
output at its inferred static shape, once), nodes. Per variant (``new``: this venv's
``torq-gen-config``, or ``--new``'s checkout; ``baseline``: ``python -m torq_gen_config`` with
PYTHONPATH=<--baseline>/workflow, checked to import that checkout and use its Snakefile), from a
fresh output directory: ``discover --model M --output-dir OUT -j J -q``, then ``run --model M
--output-dir OUT -q``; after each: wall time, exit status, peak RSS of the largest process, its
peak anonymous RSS (less file-backed pages: mapped weights), and of the summed process tree (psutil, every 50 ms; the benchmark is the subreaper of orphaned
workers), and of ``OUT/work/<model>/``: allocated bytes (st_blocks, du-style; hard links once),
apparent bytes, files, layers (manifest), bytes per layer, bytes by kind of file (the path with
layer slug and executor folder as ``*``, numbered and hex names as ``*``:
``layers/*/*/out_*.npy``; ``logs/**``) and the goal: work <= 1.5 x (weights + activations)
+ 50 KiB x layers. ``--compare-reports``: the verdicts
(every layer's every executor's ``status`` in ``OUT/torq_gen_config_<model>.json``) that
differ between baseline and new (goal: 0).

Usage: python benchmarks/bench_work_dir.py [--models yolo,transformer,cnn] [--yolo-size 640]
           [--transformer-blocks 4] [--decoder [--decoder-blocks 22] [--decoder-hidden 2048]]
           [--baseline CHECKOUT [--only-baseline] [--compare-reports]] [--new CHECKOUT] [-j 2]
           [--keep DIR] [--json PATH]
(without --keep, the work goes to a temporary directory that is removed at the end)
Baseline checkout: git -C <repo> worktree add /work/baseline <commit>
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
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

REPO = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).parent / "torq-gen-config")
MB, KIB = 1024 * 1024, 1024
GOAL_FACTOR, GOAL_PER_LAYER = 1.5, 50 * KIB
MODELS = ("yolo", "transformer", "cnn", "decoder")


class Builder:
    """Nodes and initializers of one graph, with seeded random float32 weights; with
    ``external`` the weights are written to that file as they are made (ONNX external data)."""

    def __init__(self, seed: int = 0, external: Path | None = None):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.consts: dict[tuple, str] = {}
        self.count = 0
        self.external, self.offset = external, 0
        if external:
            external.write_bytes(b"")

    def fresh(self, prefix: str) -> str:
        """A new unique tensor or node name."""
        self.count += 1
        return f"{prefix}{self.count}"

    def weight(self, shape: tuple, std: float) -> str:
        """A random N(0, std) float32 initializer of ``shape``; its name."""
        name = self.fresh("w")
        arr = (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std))
        if self.external is None:
            self.inits.append(numpy_helper.from_array(arr, name))
            return name
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.external.name), ("offset", self.offset), ("length", arr.nbytes)):
            t.external_data.add(key=key, value=str(value))
        with open(self.external, "ab") as data:
            data.write(arr.tobytes())
        self.offset += arr.nbytes
        self.inits.append(t)
        return name

    def const(self, value, dtype=np.int64) -> str:
        """An inline initializer holding ``value`` (shapes, scales, tables); one per value."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self.consts:
            self.consts[key] = self.fresh("c")
            self.inits.append(numpy_helper.from_array(arr, self.consts[key]))
        return self.consts[key]

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs):
        """Append a node; its output name (a list of names when ``n_out`` > 1)."""
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.fresh(f"{op_type}_"), **attrs))
        return outs if n_out > 1 else outs[0]

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[str]) -> onnx.ModelProto:
        """The model, its outputs typed with their inferred static shapes."""
        untyped = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        model = helper.make_model(helper.make_graph(self.nodes, name, inputs, untyped, initializer=self.inits),
                                  opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        types = value_types(onnx.shape_inference.infer_shapes(model))
        del model.graph.output[:]
        model.graph.output.extend(helper.make_value_info(o, types[o]) for o in outputs)
        return model


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """name -> type of every typed value of a (shape-inferred) model's graph."""
    g = model.graph
    return {v.name: v.type for v in [*g.input, *g.value_info, *g.output] if v.type.HasField("tensor_type")}


def yolo(size: int = 640) -> onnx.ModelProto:
    """A YOLOv8n-like detector: images [1,3,size,size] -> [1,144,anchors]."""
    b = Builder(1)

    def conv(x, cin, cout, k=1, s=1, act=True):
        y = b.op("Conv", [x, b.weight((cout, cin, k, k), (cin * k * k) ** -0.5), b.weight((cout,), 0.1)],
                 kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4)
        return b.op("Mul", [y, b.op("Sigmoid", [y])]) if act else y

    def c2f(x, cin, cout, n, shortcut):
        c = cout // 2
        parts = b.op("Split", [conv(x, cin, 2 * c), b.const([c, c])], n_out=2, axis=1)
        for _ in range(n):
            h = conv(conv(parts[-1], c, c, 3), c, c, 3)
            parts.append(b.op("Add", [parts[-1], h]) if shortcut else h)
        return conv(b.op("Concat", parts, axis=1), (2 + n) * c, cout)

    def up(x):
        return b.op("Resize", [x, "", b.const([1, 1, 2, 2], np.float32)], mode="nearest",
                    coordinate_transformation_mode="asymmetric", nearest_mode="floor")

    h = c2f(conv(conv("images", 3, 16, 3, 2), 16, 32, 3, 2), 32, 32, 1, True)
    p3 = c2f(conv(h, 32, 64, 3, 2), 64, 64, 2, True)
    p4 = c2f(conv(p3, 64, 128, 3, 2), 128, 128, 2, True)
    h = c2f(conv(p4, 128, 256, 3, 2), 256, 256, 1, True)
    s = conv(h, 256, 128)  # SPPF
    pools = [s]
    for _ in range(3):
        pools.append(b.op("MaxPool", [pools[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
    p5 = conv(b.op("Concat", pools, axis=1), 512, 256)
    n4 = c2f(b.op("Concat", [up(p5), p4], axis=1), 384, 128, 1, False)
    o3 = c2f(b.op("Concat", [up(n4), p3], axis=1), 192, 64, 1, False)
    o4 = c2f(b.op("Concat", [conv(o3, 64, 64, 3, 2), n4], axis=1), 192, 128, 1, False)
    o5 = c2f(b.op("Concat", [conv(o4, 128, 128, 3, 2), p5], axis=1), 384, 256, 1, False)
    heads = []
    for o, c in ((o3, 64), (o4, 128), (o5, 256)):
        box = conv(conv(conv(o, c, 64, 3), 64, 64, 3), 64, 64, act=False)
        cls = conv(conv(conv(o, c, 80, 3), 80, 80, 3), 80, 80, act=False)
        heads.append(b.op("Reshape", [b.op("Concat", [box, cls], axis=1), b.const([1, 144, -1])]))
    out = b.op("Concat", heads, axis=2)
    return b.model("yolo", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])], [out])


def transformer(blocks: int = 4, seq: int = 128, hidden: int = 256, heads: int = 4, mlp: int = 1024) -> onnx.ModelProto:
    """A transformer-encoder stack: x [1,seq,hidden] -> [1,seq,hidden]."""
    b, hd = Builder(2), hidden // heads

    def linear(x, din, dout):
        return b.op("Add", [b.op("MatMul", [x, b.weight((din, dout), din ** -0.5)]), b.weight((dout,), 0.02)])

    def norm(x):
        return b.op("LayerNormalization", [x, b.const(np.ones(hidden), np.float32), b.weight((hidden,), 0.02)],
                    axis=-1, epsilon=1e-5)

    def split_heads(x, perm):
        return b.op("Transpose", [b.op("Reshape", [x, b.const([1, seq, heads, hd])])], perm=perm)

    def gelu(x, tanh):
        if tanh:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            cube = b.op("Mul", [b.op("Pow", [x, b.const(3.0, np.float32)]), b.const(0.044715, np.float32)])
            inner = b.op("Mul", [b.op("Add", [x, cube]), b.const(np.sqrt(2 / np.pi), np.float32)])
            one_plus = b.op("Add", [b.op("Tanh", [inner]), b.const(1.0, np.float32)])
        else:  # 0.5 x (1 + erf(x / sqrt(2)))
            erf = b.op("Erf", [b.op("Div", [x, b.const(np.sqrt(2.0), np.float32)])])
            one_plus = b.op("Add", [erf, b.const(1.0, np.float32)])
        return b.op("Mul", [b.op("Mul", [x, one_plus]), b.const(0.5, np.float32)])

    x = "x"
    for i in range(blocks):
        h = norm(x)
        q = split_heads(linear(h, hidden, hidden), [0, 2, 1, 3])
        k = split_heads(linear(h, hidden, hidden), [0, 2, 3, 1])
        v = split_heads(linear(h, hidden, hidden), [0, 2, 1, 3])
        scores = b.op("Mul", [b.op("MatMul", [q, k]), b.const(hd ** -0.5, np.float32)])
        att = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
        att = b.op("Reshape", [b.op("Transpose", [att], perm=[0, 2, 1, 3]), b.const([1, seq, hidden])])
        x = b.op("Add", [x, linear(att, hidden, hidden)])
        x = b.op("Add", [x, linear(gelu(linear(norm(x), hidden, mlp), i % 2 == 1), mlp, hidden)])
    return b.model("transformer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])], [x])


def cnn() -> onnx.ModelProto:
    """A ResNet-18-like CNN: x [1,3,224,224] -> [1,1000]."""
    b = Builder(3)

    def cbn(x, cin, cout, k, s, relu=True):
        y = b.op("Conv", [x, b.weight((cout, cin, k, k), (cin * k * k) ** -0.5)], kernel_shape=[k, k],
                 strides=[s, s], pads=[k // 2] * 4)
        bn = [b.const(1 + 0.1 * b.rng.standard_normal(cout), np.float32), b.weight((cout,), 0.1),
              b.weight((cout,), 0.1), b.const(b.rng.uniform(0.5, 1.5, cout), np.float32)]
        y = b.op("BatchNormalization", [y, *bn], epsilon=1e-5)
        return b.op("Relu", [y]) if relu else y

    x = b.op("MaxPool", [cbn("x", 3, 64, 7, 2)], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for s in (stride, 1):
            h = cbn(cbn(x, cin, cout, 3, s), cout, cout, 3, 1, relu=False)
            short = cbn(x, cin, cout, 1, s, relu=False) if s != 1 or cin != cout else x
            x, cin = b.op("Relu", [b.op("Add", [h, short])]), cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    y = b.op("Gemm", [x, b.weight((1000, 512), 512 ** -0.5), b.weight((1000,), 0.01)], transB=1)
    return b.model("cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])], [y])


def decoder(path: Path, blocks: int = 22, hidden: int = 2048, heads: int = 32, kv_heads: int = 4,
            vocab: int = 32000, seq: int = 128) -> onnx.ModelProto:
    """A Llama-architecture decoder: input_ids [1,seq] int64 -> logits [1,seq,vocab]; its weights
    go to ``<path>.data`` (external data of the model to be saved at ``path``)."""
    b, hd, mlp = Builder(4, external=Path(f"{path}.data")), hidden // heads, hidden * 11 // 4
    inv = 1.0 / 10000 ** (np.arange(0, hd, 2) / hd)
    angles = np.concatenate([np.outer(np.arange(seq), inv)] * 2, axis=-1)[None, None]
    cos, sin = b.const(np.cos(angles), np.float32), b.const(np.sin(angles), np.float32)
    mask = b.const(np.triu(np.full((seq, seq), -1e9), 1)[None, None], np.float32)

    def rms(x):
        mean = b.op("ReduceMean", [b.op("Pow", [x, b.const(2.0, np.float32)])], axes=[-1], keepdims=1)
        den = b.op("Sqrt", [b.op("Add", [mean, b.const(1e-5, np.float32)])])
        return b.op("Mul", [b.op("Div", [x, den]), b.const(np.ones(hidden), np.float32)])

    def proj(x, din, dout):
        return b.op("MatMul", [x, b.weight((din, dout), din ** -0.5)])

    def split_heads(x, n):
        return b.op("Transpose", [b.op("Reshape", [x, b.const([1, seq, n, hd])])], perm=[0, 2, 1, 3])

    def rope(t):
        half = [b.op("Slice", [t, b.const([lo]), b.const([hi]), b.const([3])]) for lo, hi in ((0, hd // 2), (hd // 2, hd))]
        rot = b.op("Concat", [b.op("Neg", [half[1]]), half[0]], axis=-1)
        return b.op("Add", [b.op("Mul", [t, cos]), b.op("Mul", [rot, sin])])

    def repeat_kv(t):
        t = b.op("Expand", [b.op("Unsqueeze", [t, b.const([2])]), b.const([1, kv_heads, heads // kv_heads, seq, hd])])
        return b.op("Reshape", [t, b.const([1, heads, seq, hd])])

    x = b.op("Gather", [b.weight((vocab, hidden), 0.02), "input_ids"], axis=0)
    for _ in range(blocks):
        h = rms(x)
        q = rope(split_heads(proj(h, hidden, hidden), heads))
        k = repeat_kv(rope(split_heads(proj(h, hidden, kv_heads * hd), kv_heads)))
        v = repeat_kv(split_heads(proj(h, hidden, kv_heads * hd), kv_heads))
        s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
        s = b.op("Softmax", [b.op("Add", [b.op("Mul", [s, b.const(hd ** -0.5, np.float32)]), mask])], axis=-1)
        att = b.op("Transpose", [b.op("MatMul", [s, v])], perm=[0, 2, 1, 3])
        x = b.op("Add", [x, proj(b.op("Reshape", [att, b.const([1, seq, hidden])]), hidden, hidden)])
        h = rms(x)
        gate = proj(h, hidden, mlp)
        gated = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), proj(h, hidden, mlp)])
        x = b.op("Add", [x, proj(gated, mlp, hidden)])
    logits = proj(rms(x), hidden, vocab)
    return b.model("decoder", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])], [logits])


def tensor_bytes(elem_type: int, dims) -> int:
    """Bytes of a tensor of ONNX element type ``elem_type`` and shape ``dims``."""
    return int(np.prod(dims, dtype=np.int64)) * np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize


def model_figures(model: onnx.ModelProto) -> dict:
    """Weights bytes (every initializer), activation bytes (graph inputs and every node output
    at its inferred static shape, once; outputs without a static shape counted apart), nodes."""
    weights = sum(tensor_bytes(t.data_type, t.dims) for t in model.graph.initializer)
    types = value_types(onnx.shape_inference.infer_shapes(model))
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    names += [o for n in model.graph.node for o in n.output if o]
    act, unknown = 0, 0
    for name in dict.fromkeys(names):
        tt = types[name].tensor_type if name in types else None
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim] if tt and tt.HasField("shape") else [-1]
        if min(dims, default=0) < 0:
            unknown += 1
        else:
            act += tensor_bytes(tt.elem_type, dims)
    return {"weights_bytes": weights, "activation_bytes": act, "unshaped_values": unknown, "nodes": len(model.graph.node)}


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (Linux prctl), so orphaned workers
    (a multiprocessing forkserver outliving its parent) stay in the sampled tree."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_orphans(timeout: float = 30.0) -> int:
    """Wait for the children left to this process (orphans re-parented here), at most
    ``timeout`` s; returns how many still run then."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid:
            continue
        if time.monotonic() > deadline:
            return len(psutil.Process().children())
        time.sleep(0.05)


def describe(p: psutil.Process, width: int = 60) -> str:
    """A process's command line, paths cut to their last component, at most ``width`` chars."""
    cmd = p.cmdline()
    code = cmd[cmd.index("-c") + 1] if "-c" in cmd[:-1] else ""
    if "multiprocessing.forkserver" in code:
        return "forkserver"
    words = [" ".join(w.split())[:30] if any(c.isspace() for c in w)
             else os.path.basename(w) if "/" in w and not w.startswith("-") else w for w in cmd]
    text = " ".join(words) or "?"
    return text if len(text) <= width else text[: width - 3] + "..."


def run_sampled(cmd: list[str], env: dict, cwd: Path, interval: float = 0.05) -> dict:
    """Run ``cmd``; sample the RSS of every descendant of this process every ``interval`` s.

    Returns wall time, exit status, the output's tail, the peak RSS of any single process
    with its command line, its peak anonymous RSS (RSS less file-backed and shared pages:
    memory-mapped weights are page cache, given back under pressure), the peak of the
    tree's summed RSS and the orphans left after 30 s.
    """
    peak = {"rss": 0, "cmd": "", "tree": 0, "anon": 0, "anon_cmd": ""}
    done, me = threading.Event(), psutil.Process()

    def sample() -> None:
        while not done.is_set():
            tree = 0
            try:
                procs = me.children(recursive=True)
            except psutil.Error:
                procs = []
            for p in procs:
                try:
                    mem = p.memory_info()
                    tree += mem.rss
                    if mem.rss > peak["rss"]:
                        peak["rss"], peak["cmd"] = mem.rss, describe(p)
                    if mem.rss - mem.shared > peak["anon"]:
                        peak["anon"], peak["anon_cmd"] = mem.rss - mem.shared, describe(p)
                except psutil.Error:
                    continue
            peak["tree"] = max(peak["tree"], tree)
            done.wait(interval)

    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        wall = time.perf_counter() - t0
        lingering = reap_orphans()
        done.set()
        sampler.join()
        log.seek(0)
        text = log.read().decode(errors="replace")
    return {"wall_s": round(wall, 2), "rc": rc, "output_tail": text[-3000:], "peak_rss_bytes": peak["rss"],
            "peak_rss_process": peak["cmd"], "peak_anon_rss_bytes": peak["anon"], "peak_anon_rss_process": peak["anon_cmd"],
            "peak_tree_rss_bytes": peak["tree"], "lingering": lingering}


_HEX = re.compile(r"[0-9a-f]{8,}")
_NUM = re.compile(r"(?:(?<=[_.-])|^)\d+(?=[_.-]|$)")


def kind(rel: Path) -> str:
    """The kind of a work-dir file: its relative path, layer slug and executor folder as ``*``
    (``layers/*/*/result.json``), numbered and hex-named parts as ``*``, ``logs/**``."""
    parts = list(rel.parts)
    if parts[0] == "logs":
        return "logs/**"
    if parts[0] == "layers" and len(parts) >= 3:
        parts[1] = "*"
        if len(parts) >= 4:
            parts[2] = "*"
    return "/".join(_NUM.sub("*", _HEX.sub("*", p)) for p in parts)


def scan(work: Path) -> dict:
    """du-style figures of ``work``: allocated bytes (st_blocks * 512), apparent bytes, files,
    hard links counted once, and the same per kind of file (:func:`kind`)."""
    seen, kinds, total = set(), {}, {"bytes": 0, "apparent_bytes": 0, "files": 0}
    for dirpath, _, names in os.walk(work):
        for name in names:
            full = Path(dirpath, name)
            try:
                st = full.lstat()
            except OSError:
                continue
            first = (st.st_dev, st.st_ino) not in seen
            seen.add((st.st_dev, st.st_ino))
            row = kinds.setdefault(kind(full.relative_to(work)), {"bytes": 0, "apparent_bytes": 0, "files": 0})
            for r in (row, total):
                r["bytes"] += st.st_blocks * 512 if first else 0
                r["apparent_bytes"] += st.st_size if first else 0
                r["files"] += 1
    return {**total, "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["bytes"]))}


def variant_env(baseline: Path | None) -> tuple[list[str], dict]:
    """The command prefix and environment of a variant (baseline: its checkout's package)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if baseline is None:
        return [CLI], env
    return [sys.executable, "-m", "torq_gen_config"], {**env, "PYTHONPATH": str(baseline / "workflow")}


def check_variant(name: str, checkout: Path, env: dict) -> None:
    """Exit unless the variant imports ``checkout``'s package and uses its Snakefile."""
    code = ("import torq_gen_config as t, torq_gen_config.workflow_files as w; "
            "print(t.__file__); print(w.snakefile())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=tempfile.gettempdir(), check=False)
    lines = r.stdout.split()
    print(f"{name}: package {lines[0] if lines else '?'}, Snakefile {lines[1] if len(lines) > 1 else '?'}")
    if r.returncode != 0 or len(lines) < 2 or not all(Path(p).resolve().is_relative_to(checkout.resolve()) for p in lines):
        sys.exit(f"{name}: does not run from {checkout}:\n{r.stdout}{r.stderr}")


def bench_variant(name: str, prefix: list[str], env: dict, model: Path, root: Path, jobs: int, figs: dict) -> dict:
    """Discover then run ``model`` with one variant from a fresh output directory; the figures."""
    out = root / model.stem / name
    shutil.rmtree(out.parent / name, ignore_errors=True)
    out.mkdir(parents=True)
    work = out / "work" / model.stem
    rows, base = {}, figs["weights_bytes"] + figs["activation_bytes"]
    for command, flags in (("discover", ["-j", str(jobs)]), ("run", [])):
        print(f"[{model.stem}/{name}] {command} ...", file=sys.stderr, flush=True)
        res = run_sampled([*prefix, command, "--model", str(model), "--output-dir", str(out), *flags, "-q"], env, out)
        disk = scan(work) if work.is_dir() else {"bytes": 0, "apparent_bytes": 0, "files": 0, "kinds": {}}
        disk["out_bytes"] = scan(out)["bytes"]
        manifest = work / "layers" / "manifest.json"
        layers = len(json.loads(manifest.read_text())["layers"]) if manifest.is_file() else 0
        limit = GOAL_FACTOR * base + GOAL_PER_LAYER * layers
        rows[command] = {**res, **disk, "layers": layers, "bytes_per_layer": disk["bytes"] / layers if layers else None,
                         "ratio": disk["bytes"] / base, "limit_bytes": limit, "pass": disk["bytes"] <= limit}
        if res["rc"] != 0:
            print(f"[{model.stem}/{name}] {command} exited {res['rc']}:\n{res['output_tail']}")
            if command == "discover":
                break
    return {"output_dir": str(out), "report": str(out / f"torq_gen_config_{model.stem}.json"), **rows}


def compare_reports(old: Path, new: Path) -> dict:
    """Verdicts (``ops[layer]["executors"][executor]["status"]``) that differ between two reports
    (a verdict missing on one side counts); a few examples."""
    try:
        a, b = (json.loads(p.read_text()).get("ops") or {} for p in (old, new))
    except (OSError, ValueError) as e:
        return {"error": str(e)}
    diffs, total = [], 0
    for layer in sorted(set(a) | set(b)):
        ea, eb = ((ops.get(layer) or {}).get("executors") or {} for ops in (a, b))
        for ex in sorted(set(ea) | set(eb)):
            total += 1
            sa, sb = ((e.get(ex) or {}).get("status", "<missing>") for e in (ea, eb))
            if sa != sb:
                diffs.append(f"{layer} on {ex}: {sa} -> {sb}")
    return {"verdicts": total, "differ": len(diffs), "examples": diffs[:10]}


def fmt(value, unit: str = "") -> str:
    """A table cell."""
    if value is None:
        return "-"
    if unit == "MB":
        return f"{value / MB:.2f}"
    if unit == "KB":
        return f"{value / KIB:.1f}"
    if isinstance(value, bool):
        return "PASS" if value else "FAIL"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


#: The rows of a model's table: (figure, label, unit).
ROWS = (("wall_s", "wall s", ""), ("rc", "exit", ""), ("peak_rss_bytes", "peak RSS MB", "MB"),
        ("peak_anon_rss_bytes", "peak anonymous RSS MB", "MB"),
        ("peak_tree_rss_bytes", "peak tree RSS MB", "MB"), ("layers", "layers", ""),
        ("bytes", "work MB (allocated)", "MB"), ("apparent_bytes", "work MB (apparent)", "MB"), ("files", "files", ""),
        ("out_bytes", "output dir MB (allocated)", "MB"), ("bytes_per_layer", "KB per layer", "KB"),
        ("ratio", "work / (weights+act)", ""), ("limit_bytes", "goal limit MB", "MB"), ("pass", "goal", ""))


def print_model(name: str, figs: dict, results: dict, top: int) -> None:
    """One model's table: rows of figures, a column per variant, new/baseline when both ran."""
    names, both = list(results), len(results) == 2
    print(f"\n== {name}: weights {figs['weights_bytes'] / MB:.2f} MB, activations {figs['activation_bytes'] / MB:.2f} MB"
          f" ({figs['unshaped_values']} values without a static shape), {figs['nodes']} nodes")
    print(f"{'':<34}" + "".join(f"{n:>14}" for n in names) + (f"{'new/base':>10}" if both else ""))
    for command in ("discover", "run"):
        for key, label, unit in ROWS:
            vals = [results[n].get(command, {}).get(key) for n in names]
            line = f"{command + ' ' + label:<34}" + "".join(f"{fmt(v, unit):>14}" for v in vals)
            if both and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals) and vals[0]:
                line += f"{vals[1] / vals[0]:>10.2f}"
            print(line)
        print(f"  {command}: peak RSS in " + "; ".join(f"{n} [{results[n].get(command, {}).get('peak_rss_process', '-')}]"
                                                     for n in names))
        print(f"  {command}: peak anonymous RSS in " + "; ".join(
            f"{n} [{results[n].get(command, {}).get('peak_anon_rss_process', '-')}]" for n in names))
        kinds = {}
        for n in names:
            for k, row in results[n].get(command, {}).get("kinds", {}).items():
                kinds.setdefault(k, {})[n] = row
        order = sorted(kinds, key=lambda k: -max(r["bytes"] for r in kinds[k].values()))
        print(f"  {command}: kinds of file, allocated MB (files) per variant, largest first")
        for k in order[:top]:
            cells = [kinds[k].get(n) for n in names]
            print("  " + "".join(f"{fmt(c['bytes'], 'MB') + ' (' + str(c['files']) + ')' if c else '-':>18}"
                                 for c in cells) + f"  {k}")
        if order[top:]:
            rest = [sum(kinds[k].get(n, {}).get("bytes", 0) for k in order[top:]) for n in names]
            print("  " + "".join(f"{fmt(r, 'MB'):>18}" for r in rest) + f"  ({len(order) - top} other kinds)")


def build(name: str, path: Path, args: argparse.Namespace) -> onnx.ModelProto:
    """The model ``name`` at the sizes of ``args`` (the decoder's weights go next to ``path``)."""
    if name == "yolo":
        return yolo(args.yolo_size)
    if name == "transformer":
        return transformer(args.transformer_blocks)
    if name == "decoder":
        return decoder(path, args.decoder_blocks, args.decoder_hidden)
    return cnn()


def parse_models(text: str) -> list[str]:
    """``"yolo,cnn"`` -> ``["yolo", "cnn"]`` (each one of MODELS)."""
    names = [s for s in text.replace(" ", "").split(",") if s]
    bad = [n for n in names if n not in MODELS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"models are among {', '.join(MODELS)}: {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", "--sizes", type=parse_models, default=["yolo", "transformer", "cnn"],
                    help="models to run, comma-separated (default yolo,transformer,cnn; also decoder)")
    ap.add_argument("--yolo-size", type=int, default=640, help="yolo input H = W (default 640; a multiple of 32)")
    ap.add_argument("--transformer-blocks", type=int, default=4, help="transformer encoder blocks (default 4)")
    ap.add_argument("--decoder", action="store_true", help="also the Llama-like decoder (~4.4 GB of weights)")
    ap.add_argument("--decoder-blocks", type=int, default=22, help="decoder blocks (default 22)")
    ap.add_argument("--decoder-hidden", type=int, default=2048, help="decoder hidden size (default 2048; a multiple of 64)")
    ap.add_argument("--baseline", type=Path, help="a checkout of the older code, run as its python -m torq_gen_config")
    ap.add_argument("--new", type=Path, help="run the 'new' variant from this checkout as its python -m torq_gen_config "
                    "(default: this venv's torq-gen-config, from this checkout)")
    ap.add_argument("--only-baseline", action="store_true", help="run the baseline only (not this checkout)")
    ap.add_argument("--compare-reports", action="store_true", help="count verdicts that differ, baseline vs new")
    ap.add_argument("--jobs", "-j", type=int, default=2, help="discover -j (default 2)")
    ap.add_argument("--top", type=int, default=12, help="kinds of file listed per command (default 12)")
    ap.add_argument("--keep", type=Path, help="keep models and outputs in this directory")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    args = ap.parse_args(argv)
    if (args.only_baseline or args.compare_reports) and not args.baseline:
        ap.error("--only-baseline and --compare-reports need --baseline")
    models = args.models + (["decoder"] if args.decoder and "decoder" not in args.models else [])
    variants = {}
    if args.baseline:
        variants["baseline"] = variant_env(args.baseline.resolve())
        check_variant("baseline", args.baseline, variants["baseline"][1])
    if not args.only_baseline:
        variants["new"] = variant_env(args.new.resolve() if args.new else None)
        check_variant("new", args.new or REPO, variants["new"][1])
    subreaper = become_subreaper()
    root = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="bench_work_dir_"))
    (root / "models").mkdir(parents=True, exist_ok=True)
    everything, failed = {"jobs": args.jobs, "subreaper": subreaper, "models": {}}, False
    try:
        for name in models:
            path = root / "models" / f"{name}.onnx"
            t0 = time.perf_counter()
            proto = build(name, path, args)
            onnx.save_model(proto, path)
            figs = model_figures(proto)
            del proto
            print(f"[{name}] built and saved in {time.perf_counter() - t0:.1f} s: {figs}", file=sys.stderr, flush=True)
            results = {v: bench_variant(v, prefix, env, path, root, args.jobs, figs) for v, (prefix, env) in variants.items()}
            failed |= any(r.get(c, {}).get("rc", 0) not in (0, None) for r in results.values() for c in ("discover", "run"))
            entry = {**figs, "results": results}
            print_model(name, figs, results, args.top)
            if args.compare_reports and len(results) == 2:
                entry["compare"] = cmp = compare_reports(Path(results["baseline"]["report"]), Path(results["new"]["report"]))
                print(f"  verdicts that differ, baseline vs new: {cmp.get('differ', cmp.get('error'))} of "
                      f"{cmp.get('verdicts', '?')} (goal 0)" + "".join(f"\n    {e}" for e in cmp.get("examples", [])))
            for r in results.values():
                for c in ("discover", "run"):
                    r.get(c, {}).pop("output_tail", None)
            everything["models"][name] = entry
            if not args.keep:
                shutil.rmtree(root / name, ignore_errors=True)
                for f in (root / "models").glob(f"{name}.onnx*"):
                    f.unlink()
        if args.json:
            args.json.write_text(json.dumps(everything, indent=2, default=str) + "\n")
    finally:
        if args.keep:
            print(f"(models and outputs in {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
