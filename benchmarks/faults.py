#!/usr/bin/env python
"""Benchmark: bad inputs and faults, each run through the real console script.

One row of :data:`KINDS` is one kind of bad input or fault (a missing, truncated or
non-ONNX model, a model with external data, control flow or sequences, a crashing or
hanging compiler, a hanging reference, ``kill -9`` and Ctrl-C in the middle of a run and
the resumed run, two concurrent runs in both forms, malformed JSON for ``view``/``edit``,
bad configs, read-only and full output directories, ...). Each row runs
``torq-gen-config`` (or ``snakemake`` from the repository root, the Snakemake form) as a
subprocess with a hard time limit, then checks:

- the exit status (the value the row expects: 2 for a bad input, 0 for discovery that
  completed, also with failed layers, 130 for Ctrl-C, ...);
- the message: for a bad input, the last non-empty stderr line is the only
  ``torq-gen-config: error: ...`` line (and names the problem); for a fault, the verdict
  of the faulted layer in the report JSON (status and failure stage), with every other
  layer tested too;
- tracebacks: no ``Traceback (most recent call last)`` in stdout or stderr. Snakemake's
  own display of a failed job (``File ".../torq_gen_config/x.py", line N, in f`` lines)
  is counted apart, as "stack frames", and does not count as a traceback;
- what is left in the output directory: every ``*.json`` parses, no ``*.tmp`` file, the
  report is there when it should be, a report that no longer describes the work files or
  the model is flagged (``warning: ... out of date``, and ``run`` refuses it);
- finished verdicts lost on resume (``kill -9``/Ctrl-C rows): the ``result.json`` files
  under ``work/<name>/layers/*/*/`` that existed when the run died must be there after the
  resumed run with the same verdict (a file Snakemake reran as incomplete counts as
  "redone", not lost);
- time: each command's wall time against the bound its ``--timeout`` allows (a few bounded
  tool calls plus a fixed allowance for a tiny model), and signal-to-exit time for Ctrl-C;
- leftover processes: every process started by a command carries a marker in its
  environment; none may be alive 5 s after the command ended (workers, the forkserver,
  ``iree-compile``, fault scripts, descendants of a killed parent re-parented to init).

Fault fixtures are shell scripts named ``fault_*`` written into the row's directory and
passed as ``IREE_COMPILE``; models are built with ``onnx.helper`` (a few layers each), plus
onnx's shipped ``light_squeezenet.onnx`` for the rows marked squeezenet (``--quick`` skips
them). The read-only and full directories are tmpfs mounts (``mount -t tmpfs -o ro`` /
``size=200k``); where mounting is not permitted (not root, CI containers) those rows
say "not measured here" and count as neither clear nor failed.

It prints one table row per kind and a summary: kinds, % clear, corrupted, verdicts lost,
tracebacks, runs over their time bound, leftover processes. Exit status 1 when a goal is
missed (100% clear, 0 corrupted, 0 lost, 0 tracebacks, no run over its bound).

Usage (from the repository root, with the environment of the project's venv):
  python benchmarks/faults.py [--quick] [--only REGEX] [--keep DIR] [--list]

About 10 minutes on 2 cores with --quick, a few more without (squeezenet rows).
Adding a kind is one entry in KINDS.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

BIN = Path(sys.executable).parent
TGC = str(BIN / "torq-gen-config")
SNAKEMAKE = str(BIN / "snakemake")
ERROR_PREFIX = "torq-gen-config: error: "
#: Environment variable carried by every process a command starts (leftover check).
MARK_ENV = "TGC_FAULTS_RUN"
#: Seconds a command's processes get to end after it ended.
LEFTOVER_GRACE_S = 5.0
#: Allowance of one discovery of a tiny model (a few layers) on a busy 2-core machine, s.
TINY_S = 90.0
#: Allowance of a command that stops at a bad input (start-up, model load), s.
QUICK_S = 45.0
#: Most seconds from Ctrl-C / SIGTERM to the end of the run.
SIGNAL_EXIT_S = 10.0


def call_limit(timeout_s: float) -> float:
    """The product's limit of one bounded call (torq_gen_config.core.limits)."""
    from torq_gen_config.core.limits import call_limit as product_limit

    return product_limit(timeout_s)


# --------------------------------------------------------------------------------------
# Models (onnx.helper), written into a row's directory
# --------------------------------------------------------------------------------------

def _onnx():
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    return np, onnx, TensorProto, helper, numpy_helper


def _tvi(name, dtype, shape):
    from onnx import helper

    return helper.make_tensor_value_info(name, dtype, shape)


def _save(graph, path: Path, *, opsets=(("", 17),), check=True, **save_kw) -> Path:
    _, onnx, _, helper, _ = _onnx()
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    if check:
        onnx.checker.check_model(m)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, path, **save_kw)
    return path


def m_convrelu(d: Path, name: str = "convrelu", weight: float = 0.1) -> Path:
    """Conv -> Relu: 2 layers."""
    np, _, T, helper, nh = _onnx()
    w = nh.from_array(np.full((4, 3, 3, 3), weight, np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [_tvi("x", T.FLOAT, [1, 3, 8, 8])], [_tvi("y", T.FLOAT, [1, 4, 8, 8])], initializer=[w])
    return _save(g, d / f"{name}.onnx")


def m_chain(d: Path, n: int = 8, name: str = "chain") -> Path:
    """n layers (Conv, Relu, Sigmoid, Tanh, ... in turn): a run of a few seconds to interrupt."""
    np, _, T, helper, nh = _onnx()
    nodes, inits, prev = [], [], "x"
    unary = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp"]
    for i in range(n):
        out = f"t{i}"
        if i % 3 == 0:
            inits.append(nh.from_array(np.full((4, 4, 3, 3), 0.05 * (i + 1), np.float32), f"w{i}"))
            nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [out], pads=[1, 1, 1, 1]))
        else:
            nodes.append(helper.make_node(unary[i % len(unary)], [prev], [out]))
        prev = out
    g = helper.make_graph(nodes, "g", [_tvi("x", T.FLOAT, [1, 4, 8, 8])], [_tvi(prev, T.FLOAT, [1, 4, 8, 8])],
                          initializer=inits)
    return _save(g, d / f"{name}.onnx")


def m_external(d: Path, missing: bool = False) -> Path:
    """MatMul + Relu whose weight is in an external data file (removed when ``missing``)."""
    np, _, T, helper, nh = _onnx()
    w = nh.from_array(np.full((16, 16), 0.1, np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                          "g", [_tvi("x", T.FLOAT, [1, 16])], [_tvi("y", T.FLOAT, [1, 16])], initializer=[w])
    p = _save(g, d / "extdata.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="extdata.bin", size_threshold=0)
    if missing:
        (d / "extdata.bin").unlink()
    return p


def m_dynamic(d: Path) -> Path:
    """Symbolic batch and spatial dims (N, H, W)."""
    _, _, T, helper, _ = _onnx()
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])], "g",
                          [_tvi("x", T.FLOAT, ["N", 3, "H", "W"])], [_tvi("y", T.FLOAT, ["N", 3, "H", "W"])])
    return _save(g, d / "dynamic.onnx")


def m_custom_domain(d: Path) -> Path:
    """Relu -> com.example.Frobnicate (no engine knows it) -> Neg; types declared."""
    _, _, T, helper, _ = _onnx()
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("Frobnicate", ["r"], ["f"], domain="com.example"),
                           helper.make_node("Neg", ["f"], ["y"])], "g",
                          [_tvi("x", T.FLOAT, [1, 8])], [_tvi("y", T.FLOAT, [1, 8])],
                          value_info=[_tvi("f", T.FLOAT, [1, 8])])
    return _save(g, d / "custom.onnx", opsets=(("", 17), ("com.example", 1)))


def m_if(d: Path) -> Path:
    """Relu -> If (on a computed condition; both branches of the same type) -> Neg."""
    np, _, T, helper, nh = _onnx()
    then_g = helper.make_graph([helper.make_node("Sigmoid", ["r"], ["o1"])], "then", [], [_tvi("o1", T.FLOAT, [1, 8])])
    else_g = helper.make_graph([helper.make_node("Tanh", ["r"], ["o2"])], "else", [], [_tvi("o2", T.FLOAT, [1, 8])])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("ReduceSum", ["r"], ["s"], keepdims=0),
                           helper.make_node("Greater", ["s", "zero"], ["c"]),
                           helper.make_node("If", ["c"], ["i"], then_branch=then_g, else_branch=else_g),
                           helper.make_node("Neg", ["i"], ["y"])], "g",
                          [_tvi("x", T.FLOAT, [1, 8])], [_tvi("y", T.FLOAT, [1, 8])],
                          initializer=[nh.from_array(np.array(0.0, np.float32), "zero")],
                          value_info=[_tvi("i", T.FLOAT, [1, 8])])
    return _save(g, d / "ifmodel.onnx")


def m_loop(d: Path, trips: int = 3, name: str = "loop") -> Path:
    """Relu -> Loop (``trips`` iterations of Add 1; a 2**40 trip count never returns in
    ONNX Runtime) -> Neg; the Loop's output type declared, so the layer is testable."""
    np, _, T, helper, nh = _onnx()
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [_tvi("i", T.INT64, []), _tvi("cond_in", T.BOOL, []), _tvi("v_in", T.FLOAT, [1, 4])],
        [_tvi("cond_out", T.BOOL, []), _tvi("v_out", T.FLOAT, [1, 4])],
        initializer=[nh.from_array(np.ones((1, 4), np.float32), "one")])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("Loop", ["M", "C", "r"], ["l"], body=body),
                           helper.make_node("Neg", ["l"], ["y"])], "g",
                          [_tvi("x", T.FLOAT, [1, 4])], [_tvi("y", T.FLOAT, [1, 4])],
                          initializer=[nh.from_array(np.array(trips, np.int64), "M"),
                                       nh.from_array(np.array(True), "C")],
                          value_info=[_tvi("l", T.FLOAT, [1, 4])])
    return _save(g, d / f"{name}.onnx")


def m_hang_loop(d: Path) -> Path:
    """A Loop of 2**40 iterations: the reference (ONNX Runtime) never returns."""
    return m_loop(d, trips=2 ** 40, name="hangloop")


def m_multi_output(d: Path) -> Path:
    """Split into two outputs, both graph outputs, and a TopK (values and indices)."""
    _, _, T, helper, _ = _onnx()
    import numpy as np
    from onnx import numpy_helper as nh

    g = helper.make_graph([helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=1),
                           helper.make_node("Relu", ["a"], ["ya"]),
                           helper.make_node("TopK", ["b", "k"], ["v", "idx"], axis=1)], "g",
                          [_tvi("x", T.FLOAT, [1, 8])],
                          [_tvi("ya", T.FLOAT, [1, 4]), _tvi("v", T.FLOAT, [1, 2]), _tvi("idx", T.INT64, [1, 2])],
                          initializer=[nh.from_array(np.array([4, 4], np.int64), "sp"),
                                       nh.from_array(np.array([2], np.int64), "k")])
    return _save(g, d / "multiout.onnx")


def m_sequence(d: Path) -> Path:
    """Relu -> SequenceConstruct -> SequenceAt -> Neg (a sequence-typed tensor in between)."""
    np, _, T, helper, nh = _onnx()
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("Sigmoid", ["x"], ["s"]),
                           helper.make_node("SequenceConstruct", ["r", "s"], ["seq"]),
                           helper.make_node("SequenceAt", ["seq", "pos"], ["e"]),
                           helper.make_node("Neg", ["e"], ["y"])], "g",
                          [_tvi("x", T.FLOAT, [1, 4])], [_tvi("y", T.FLOAT, [1, 4])],
                          initializer=[nh.from_array(np.array(1, np.int64), "pos")])
    return _save(g, d / "sequence.onnx")


def m_odd_names(d: Path) -> Path:
    """Tensor and node names with '/', ':', spaces, unicode, braces, a dot and a leading
    dash; the file name has a space and unicode."""
    np, _, T, helper, nh = _onnx()
    w = nh.from_array(np.full((4, 4), 0.1, np.float32), "weights/{0}:0")
    g = helper.make_graph([helper.make_node("MatMul", ["in put:0", "weights/{0}:0"], ["-mm/out.0"], name="mm/ü 1"),
                           helper.make_node("Relu", ["-mm/out.0"], ["relu {x}/ä:1"], name="../relu"),
                           helper.make_node("Neg", ["relu {x}/ä:1"], ["out put"], name="")], "g",
                          [_tvi("in put:0", T.FLOAT, [1, 4])], [_tvi("out put", T.FLOAT, [1, 4])], initializer=[w])
    return _save(g, d / "odd näme model.onnx")


def m_zero_nodes(d: Path) -> Path:
    _, _, T, helper, _ = _onnx()
    g = helper.make_graph([], "g", [_tvi("x", T.FLOAT, [2])], [_tvi("x", T.FLOAT, [2])])
    return _save(g, d / "zeronodes.onnx", check=False)


def m_truncated(d: Path) -> Path:
    p = m_convrelu(d, name="truncated")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p


def m_bytes(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
        return d / name
    make.__name__ = f"m_bytes_{name}"
    return make


def m_directory(d: Path) -> Path:
    p = d / "dir.onnx"
    p.mkdir(parents=True, exist_ok=True)
    return p


def m_braces(d: Path) -> Path:
    return m_convrelu(d, name="model{1}")


def m_squeezenet(d: Path) -> Path:
    import onnx

    src = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
    dst = d / "light_squeezenet.onnx"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)
    return dst


# --------------------------------------------------------------------------------------
# Fault tools: shell scripts given as IREE_COMPILE
# --------------------------------------------------------------------------------------

def real_iree_compile() -> str:
    from torq_gen_config.backends.iree_tools import iree_tool_path

    saved = os.environ.pop("IREE_COMPILE", None)
    try:
        return iree_tool_path("iree-compile")
    finally:
        if saved is not None:
            os.environ["IREE_COMPILE"] = saved


def fault_tool(d: Path, name: str, body: str) -> Path:
    """Write the fault fixture ``d/name`` (a /bin/sh script, executable)."""
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_text("#!/bin/sh\n# fault fixture of benchmarks/faults.py\n" + body)
    p.chmod(0o755)
    return p


def fault_hanging_compile(d: Path, *, version_hangs: bool = False, exec_sleep: bool = True) -> Path:
    """iree-compile that hangs on every compile (``exec sleep``, or a child ``sleep`` when
    not ``exec_sleep``: a wrapper script); it answers ``--version`` unless ``version_hangs``."""
    marker = d / "compile-started"
    version = "" if version_hangs else f'case "$1" in --version) exec "{real_iree_compile()}" --version;; esac\n'
    sleep = "exec sleep 3600\n" if exec_sleep else "sleep 3600\necho done\n"
    name = "fault_hanging_iree_compile" + ("_and_version" if version_hangs else "") + ("" if exec_sleep else "_wrapper")
    return fault_tool(d, name, version + f'touch "{marker}"\n' + sleep)


def fault_crashing_compile(d: Path) -> Path:
    """iree-compile that answers --version, then dies of SIGSEGV on every compile."""
    return fault_tool(d, "fault_crashing_iree_compile",
                      f'case "$1" in --version) exec "{real_iree_compile()}" --version;; esac\nkill -SEGV $$\n')


def fault_slow_compile(d: Path, seconds: float, pattern: str = "*") -> Path:
    """The real iree-compile, after sleeping ``seconds`` when the command line matches
    ``pattern`` (a shell case pattern, e.g. ``*Conv*``)."""
    marker = d / "compile-started"
    real = real_iree_compile()
    return fault_tool(d, "fault_slow_iree_compile",
                      f'case "$1" in --version) exec "{real}" --version;; esac\n'
                      f'touch "{marker}"\ncase "$*" in {pattern}) sleep {seconds};; esac\nexec "{real}" "$@"\n')


# --------------------------------------------------------------------------------------
# Running commands and looking at what they leave
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Step:
    label: str
    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    wall: float
    bound: float
    leftovers: list[str]
    hard_killed: bool = False
    signal_at: float | None = None  # seconds after start when a signal was sent

    @property
    def text(self) -> str:
        return self.stdout + "\n" + self.stderr

    def error_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.startswith(ERROR_PREFIX)]

    def last_line(self) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def warnings(self) -> list[str]:
        return [ln for ln in self.text.splitlines() if ln.startswith("warning:")]


def _marked(marker: str) -> list:
    import psutil

    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARK_ENV) == marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def leftover_processes(marker: str, grace_s: float = LEFTOVER_GRACE_S) -> list[str]:
    """Processes still alive ``grace_s`` after a command ended that carry its marker;
    they are listed, then killed (so that they do not disturb the next rows)."""
    import psutil

    deadline = time.monotonic() + grace_s
    while True:
        alive = _marked(marker)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    out = []
    for p in alive:
        try:
            out.append(f"pid {p.pid} (ppid {p.ppid()}): {' '.join(p.cmdline())[:160]}")
            p.kill()
        except psutil.Error:
            pass
    return out


class Running:
    """A command started in its own session (so that Ctrl-C can go to its process group)."""

    def __init__(self, ctx: "Ctx", argv: list[str], *, label: str, env: dict | None, cwd: Path | None):
        self.ctx, self.argv, self.label = ctx, argv, label
        self.marker = uuid.uuid4().hex
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "workflow")] + [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        full_env.update(env or {})
        full_env[MARK_ENV] = self.marker
        n = len(ctx.steps) + len(ctx.running)
        self.out_path = ctx.d / f"step{n}-{_slug(label)}.out"
        self.err_path = ctx.d / f"step{n}-{_slug(label)}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.t0 = time.monotonic()
        self.signal_at = None
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
                                     env=full_env, cwd=cwd, start_new_session=True)
        ctx.running.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int, *, group: bool = False) -> None:
        """Send ``sig`` to the command (``group``: to its whole process group, as Ctrl-C in
        a terminal does)."""
        self.signal_at = time.monotonic() - self.t0
        try:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def wait(self, bound: float, *, hard: float | None = None) -> Step:
        """Wait for the end (at most ``hard`` s, default 2 x ``bound`` + 60, then the group
        is killed) and check what every command must satisfy."""
        hard = hard if hard is not None else bound * 2 + 60
        killed = False
        try:
            self.proc.wait(timeout=max(1.0, hard - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            killed = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        wall = time.monotonic() - self.t0
        self._out.close()
        self._err.close()
        left = leftover_processes(self.marker)
        step = Step(self.label, self.argv, self.proc.returncode, self.out_path.read_text(errors="replace"),
                    self.err_path.read_text(errors="replace"), wall, bound, left, killed, self.signal_at)
        self.ctx.running.remove(self)
        self.ctx.record(step)
        return step


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:40] or "x"


_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.M)
_PRODUCT_FRAME = re.compile(r'^\s*File ".*/torq_gen_config/[^"]*", line \d+', re.M)


def json_problems(root: Path) -> tuple[list[str], list[str]]:
    """(JSON files under ``root`` that do not parse, ``*.tmp`` files), relative paths."""
    bad, tmp = [], []
    if not root.exists():
        return bad, tmp
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        rel = str(p.relative_to(root))
        if p.name.endswith(".tmp"):
            tmp.append(rel)
        if p.suffix == ".json":
            try:
                json.loads(p.read_text())
            except (OSError, ValueError) as e:
                bad.append(f"{rel} ({type(e).__name__})")
    return bad, tmp


def results(out: Path, name: str) -> dict[str, dict]:
    """Finished verdicts: work/<name>/layers/<layer>/<executor>/result.json -> status,
    stage, content digest and mtime."""
    found = {}
    for p in sorted((out / "work" / name / "layers").glob("*/*/result.json")):
        try:
            data = p.read_bytes()
            res = json.loads(data)
        except (OSError, ValueError):
            res, data = {}, b""
        found[str(p.relative_to(out))] = {"status": res.get("status"),
                                          "stage": (res.get("failure_report") or {}).get("stage"),
                                          "sha": hashlib.sha256(data).hexdigest(), "mtime": p.stat().st_mtime_ns}
    return found


def mount_tmpfs(d: Path, options: str) -> str | None:
    """Mount a tmpfs at ``d``; None when done, else why not."""
    d.mkdir(parents=True, exist_ok=True)
    if not shutil.which("mount"):
        return "no mount command"
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True, text=True,
                       timeout=30)
    if p.returncode != 0:
        return (p.stderr.strip().splitlines() or ["mount failed"])[-1]
    return None


def umount(d: Path) -> None:
    subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30)


# --------------------------------------------------------------------------------------
# One row's context: runs commands, checks them, collects the outcome
# --------------------------------------------------------------------------------------

class NotMeasured(Exception):
    """The row cannot be measured on this machine (the reason is shown)."""


class Ctx:
    def __init__(self, kind: "Kind", root: Path):
        self.kind = kind
        self.d = root / _slug(kind.name)
        shutil.rmtree(self.d, ignore_errors=True)
        self.d.mkdir(parents=True)
        self.steps: list[Step] = []
        self.running: list[Running] = []
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.message = ""
        self.exit: str = ""
        self.corrupt: list[str] = []
        self.stale: list[str] = []
        self.lost: int | None = None
        self.redone = 0
        self.mounts: list[Path] = []
        self.root = root

    # ---- running
    def start(self, argv, *, label: str = "", env: dict | None = None, cwd: Path | None = None) -> Running:
        return Running(self, [str(a) for a in argv], label=label or Path(str(argv[1])).name, env=env, cwd=cwd)

    def run(self, argv, *, bound: float, expect: int | None = None, label: str = "", env: dict | None = None,
            cwd: Path | None = None) -> Step:
        step = self.start(argv, label=label, env=env, cwd=cwd).wait(bound)
        if expect is not None:
            self.expect_exit(step, expect)
        return step

    def cli(self, *args, **kw) -> Step:
        return self.run([TGC, *args], label=kw.pop("label", str(args[0]) if args else "cli"), **kw)

    def discover(self, model: Path, out: Path, *extra, **kw) -> Step:
        return self.cli("discover", "--model", model, "--output-dir", out, "-j", "1", "-q", *extra, **kw)

    def smk_argv(self, model: Path, out: Path, **config) -> list[str]:
        cfg = [f"model={model}", f"output_dir={out}"] + [f"{k}={v}" for k, v in config.items()]
        return [SNAKEMAKE, "--cores", "1", "--config", *cfg]

    def record(self, step: Step) -> None:
        self.steps.append(step)
        tb = len(_TRACEBACK.findall(step.text))
        if tb:
            first = step.text[_TRACEBACK.search(step.text).start():][:400].replace("\n", " | ")
            self.problems.append(f"{step.label}: {tb} traceback(s): {first}")
        if step.hard_killed:
            self.problems.append(f"{step.label}: still running after {step.wall:.0f} s (killed by the benchmark)")
        elif step.wall > step.bound:
            self.problems.append(f"{step.label}: took {step.wall:.1f} s, bound {step.bound:.0f} s")
        if step.leftovers:
            self.problems.append(f"{step.label}: {len(step.leftovers)} process(es) left: " + "; ".join(step.leftovers))

    # ---- checks
    def expect_exit(self, step: Step, code: int | tuple) -> None:
        codes = code if isinstance(code, tuple) else (code,)
        self.exit = (self.exit + " " if self.exit else "") + str(step.rc)
        if step.rc not in codes:
            tail = " | ".join(ln for ln in step.stderr.splitlines()[-3:] if ln.strip())
            self.problems.append(f"{step.label}: exit {step.rc}, expected {'/'.join(map(str, codes))} ({tail[:300]})")

    def expect_error(self, step: Step, words: str | None = None, *, only_line: bool = False) -> None:
        """A bad input: the last non-empty stderr line is the one ``torq-gen-config: error:``
        line (naming ``words``); ``only_line``: nothing else on stderr."""
        last = step.last_line()
        self.message = self.message or last[:200]
        errs = step.error_lines()
        if not last.startswith(ERROR_PREFIX):
            self.problems.append(f"{step.label}: last stderr line is not the error: {last[:200]!r}")
        elif len(errs) != 1:
            self.problems.append(f"{step.label}: {len(errs)} error lines")
        elif words and words.lower() not in last.lower():
            self.problems.append(f"{step.label}: the error does not say {words!r}: {last[:200]}")
        if only_line and len([ln for ln in step.stderr.splitlines() if ln.strip()]) != 1:
            self.problems.append(f"{step.label}: more than one line on stderr")
        frames = len(_PRODUCT_FRAME.findall(step.text))
        if frames:
            self.notes.append(f"{step.label}: Snakemake showed {frames} stack frame(s) of torq_gen_config above the error")

    def expect_warning(self, step: Step, words: str) -> None:
        hits = [w for w in step.warnings() if words.lower() in w.lower()]
        if not hits:
            self.problems.append(f"{step.label}: no 'warning: ...{words}...' line")
        else:
            self.message = self.message or hits[0][:200]

    def check_dir(self, out: Path, *, report: bool | None = None, name: str | None = None) -> None:
        """Every JSON parses, no temporary file is left; the report is there (or not)."""
        bad, tmp = json_problems(out)
        self.corrupt += [f"{out.name}/{b}" for b in bad]
        self.stale += [f"{out.name}/{t}" for t in tmp]
        if report is not None and name is not None:
            present = (out / f"torq_gen_config_{name}.json").is_file()
            if present != report:
                self.problems.append(f"report {'missing' if report else 'written'} in {out.name}")

    def expect_report(self, out: Path, name: str, verdicts: list[tuple] = (), *, every_layer: bool = True) -> dict:
        """The report is there and valid; ``verdicts``: (layer glob, executor glob, status,
        stage or None) that must hold for every matching pair (and match at least one);
        ``every_layer``: each layer has a verdict on every executor or a reason why not."""
        path = out / f"torq_gen_config_{name}.json"
        try:
            rep = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            self.problems.append(f"report {path.name}: {type(e).__name__}: {e}")
            return {}
        executors = [e if isinstance(e, str) else e.get("name") for e in rep.get("executors", [])]
        ops = rep.get("ops", {})
        if every_layer:
            for lid, op in ops.items():
                got = set((op.get("executors") or {}))
                if not op.get("not_testable_reason") and not op.get("skip_reason") and got != set(executors):
                    self.problems.append(f"layer {lid}: verdicts for {sorted(got)}, expected {executors}")
        summary = []
        for lpat, epat, status, stage in verdicts:
            matched = [(lid, ex, res) for lid, op in ops.items() if fnmatch.fnmatch(lid, lpat)
                       for ex, res in (op.get("executors") or {}).items() if fnmatch.fnmatch(ex, epat)]
            if not matched:
                self.problems.append(f"no verdict for {lpat} on {epat}")
            for lid, ex, res in matched:
                got_stage = (res.get("failure_report") or {}).get("stage")
                if res.get("status") != status or (stage is not None and got_stage != stage):
                    self.problems.append(f"{lid} on {ex}: {res.get('status')}/{got_stage}, expected {status}/{stage}")
            stages = sorted({f"{r.get('status')}" + (f"/{(r.get('failure_report') or {}).get('stage')}"
                                                     if r.get("failure_report") else "") for _, _, r in matched})
            summary.append(f"{lpat} on {epat}: {','.join(stages)}")
        counts = (rep.get("discovery_report") or {}).get("summary", {}).get("status_counts", {})
        self.message = self.message or ("; ".join(summary) + " | " if summary else "") + ", ".join(
            f"{v} {k}" for k, v in counts.items() if v)
        return rep

    def expect_resume(self, before: dict, after: dict) -> None:
        """Every verdict finished before the kill is still there with the same verdict."""
        lost = [k for k, v in before.items() if k not in after or
                (after[k]["status"], after[k]["stage"]) != (v["status"], v["stage"])]
        self.redone += sum(1 for k, v in before.items() if k in after and after[k]["sha"] != v["sha"])
        self.lost = (self.lost or 0) + len(lost)
        if lost:
            self.problems.append(f"{len(lost)} verdict(s) lost on resume: {lost[:3]}")

    def wait_for(self, cond: Callable[[], bool], timeout: float, what: str, running: Running | None = None) -> bool:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if cond():
                return True
            if running is not None and not running.alive():
                break
            time.sleep(0.1)
        self.problems.append(f"{what} did not happen within {timeout:.0f} s")
        return False

    def mount(self, d: Path, options: str) -> None:
        why = mount_tmpfs(d, options)
        if why:
            raise NotMeasured(f"not measured here: cannot mount a tmpfs ({why})")
        self.mounts.append(d)

    def cleanup(self, keep: bool) -> None:
        for r in list(self.running):  # a scenario that failed half-way
            try:
                os.killpg(r.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            r.wait(bound=1e9, hard=5)
        for m in reversed(self.mounts):
            if keep:
                shutil.copytree(m, m.with_name(m.name + ".copy"), dirs_exist_ok=True, symlinks=True)
            umount(m)


@dataclasses.dataclass
class Kind:
    """One row: ``scenario(ctx)`` runs the commands and checks what is specific to it."""
    name: str
    group: str
    scenario: Callable[[Ctx], None]
    squeezenet: bool = False


@dataclasses.dataclass
class Outcome:
    kind: Kind
    exit: str
    message: str
    corrupt: list[str]
    stale: list[str]
    lost: int | None
    redone: int
    tracebacks: int
    over_time: int
    leftovers: int
    wall: float
    bound: float
    problems: list[str]
    notes: list[str]
    not_measured: str | None = None

    @property
    def clear(self) -> bool:
        return self.not_measured is None and not self.problems and not self.corrupt and not self.stale


def run_kind(kind: Kind, root: Path, keep: bool = False) -> Outcome:
    ctx = Ctx(kind, root)
    not_measured = None
    try:
        kind.scenario(ctx)
    except NotMeasured as e:
        not_measured = str(e)
    except Exception as e:  # a broken scenario is a failed row, not a crashed benchmark
        import traceback

        ctx.problems.append(f"benchmark error: {type(e).__name__}: {e} :: {traceback.format_exc()[-600:]}")
    finally:
        ctx.cleanup(keep)
    steps = ctx.steps
    worst = max(steps, key=lambda s: s.wall / s.bound, default=None)
    message = (not_measured or ctx.message).replace(str(ctx.d) + "/", "").replace(ERROR_PREFIX, "error: ")
    out = Outcome(kind, ctx.exit or ("-" if not steps else str(steps[-1].rc)), message,
                  ctx.corrupt, ctx.stale, ctx.lost, ctx.redone,
                  sum(len(_TRACEBACK.findall(s.text)) for s in steps),
                  sum(1 for s in steps if s.hard_killed or s.wall > s.bound),
                  sum(len(s.leftovers) for s in steps), worst.wall if worst else 0.0, worst.bound if worst else 0.0,
                  ctx.problems, ctx.notes, not_measured)
    if not keep:
        shutil.rmtree(ctx.d, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------

def _name(model: Path) -> str:
    from torq_gen_config.config import model_name

    return model_name(model)


def bad_model(make: Callable[[Path], Path], words: str | None, *extra: str, bound: float = QUICK_S):
    """discover on a bad model (or with bad options): exit 2, one error line, nothing
    of the user's removed, nothing corrupted."""
    def scenario(ctx: Ctx) -> None:
        model = make(ctx.d / "models")
        before = sorted(p.name for p in (ctx.d / "models").rglob("*"))
        out = ctx.d / "out"
        args = [a.format(d=ctx.d, model=model) for a in extra]
        step = ctx.discover(model, out, *args, bound=bound, expect=2)
        ctx.expect_error(step, words)
        after = sorted(p.name for p in (ctx.d / "models").rglob("*"))
        if not set(before) <= set(after):
            ctx.problems.append(f"files removed: {sorted(set(before) - set(after))}")
        ctx.check_dir(out, report=False, name=_name(model) if model.suffix == ".onnx" else None)
    return scenario


def bad_command(argv: list[str], words: str | None, *, make: Callable[[Ctx], dict] | None = None,
                expect: int = 2, only_line: bool = True):
    """A command (placeholders filled from ``make(ctx)``) that must end with one error line."""
    def scenario(ctx: Ctx) -> None:
        fill = make(ctx) if make else {}
        fill.setdefault("d", ctx.d)
        args = [a.format(**fill) for a in argv]
        step = ctx.cli(*args, bound=QUICK_S, expect=expect)
        ctx.expect_error(step, words, only_line=only_line)
        ctx.check_dir(ctx.d)
    return scenario


def works(make: Callable[[Path], Path], verdicts: list[tuple] = (), *extra: str, env_tool=None,
          timeout: float | None = None, hangs: int = 0, expect: int = 0, wrapper=None):
    """discover completes (exit ``expect``) and the report has ``verdicts``; with
    ``env_tool(dir)`` as IREE_COMPILE; ``hangs`` bounded calls of ``timeout`` s may run
    one after the other (the time bound)."""
    def scenario(ctx: Ctx) -> None:
        model = make(ctx.d / "models")
        out = ctx.d / "out"
        env = {"IREE_COMPILE": str(env_tool(ctx.d / "tools"))} if env_tool else None
        args = list(extra) + (["--timeout", str(timeout)] if timeout else [])
        bound = TINY_S + hangs * call_limit(timeout or 300)
        argv = [TGC, "discover", "--model", model, "--output-dir", out, "-j", "1", "-q", *args]
        if wrapper:
            argv = wrapper + argv
        step = ctx.run(argv, bound=bound, expect=expect, env=env, label="discover")
        ctx.expect_report(out, _name(model), verdicts)
        ctx.check_dir(out, report=True, name=_name(model))
        if step.error_lines():
            ctx.problems.append(f"error line on a completed run: {step.error_lines()[0][:200]}")
    return scenario


_BASELINE_LOCK = threading.Lock()


def baseline(ctx: Ctx) -> tuple[Path, Path]:
    """A finished discovery of convrelu, made once per benchmark run and copied: returns
    (model, output dir) of the copy."""
    with _BASELINE_LOCK:
        base = ctx.root / "_baseline"
        if not (base / "out" / "torq_gen_config_convrelu.json").is_file():
            shutil.rmtree(base, ignore_errors=True)
            m = m_convrelu(base)
            env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"))
            p = subprocess.run([TGC, "discover", "--model", m, "--output-dir", base / "out", "-j", "1", "-q"],
                               capture_output=True, text=True, timeout=600, env=env)
            if p.returncode != 0:
                raise RuntimeError(f"baseline discovery failed: {p.stderr[-500:]}")
    model = m_convrelu(ctx.d / "models")
    out = ctx.d / "out"
    shutil.copytree(base / "out", out, symlinks=True)
    return model, out


def _report_of(out: Path, name: str = "convrelu") -> Path:
    return out / f"torq_gen_config_{name}.json"


def view_edit_bad(content: bytes | None, argv: list[str], words: str | None, *, compiler: bool = False):
    """view/edit of a report JSON (or compiler JSON) replaced by ``content``."""
    def scenario(ctx: Ctx) -> None:
        _, out = baseline(ctx)
        target = out / ("torq_gen_config_convrelu_compiler.json" if compiler else "torq_gen_config_convrelu.json")
        target.write_bytes(content)
        args = [a.format(report=_report_of(out), target=target, out=out, model=ctx.d / "models" / "convrelu.onnx")
                for a in argv]
        step = ctx.cli(*args, bound=QUICK_S, expect=2)
        ctx.expect_error(step, words, only_line=True)
        if target.read_bytes() != content:
            ctx.problems.append("the malformed file was changed")
    return scenario


def sc_config(yaml_text: str, words: str):
    def scenario(ctx: Ctx) -> None:
        cfg = ctx.d / "config.yaml"
        cfg.write_text(yaml_text)
        bad_model(m_convrelu, words, "--config-file", str(cfg))(ctx)
    return scenario


def sc_hanging_reference(ctx: Ctx) -> None:
    """Loop of 2**40 iterations, --timeout 5: the Loop layer is unverified (its reference
    timed out), the other layers get verdicts; the run stays within its bound."""
    model = m_hang_loop(ctx.d / "models")
    out = ctx.d / "out"
    t = 5
    # prepare's and the split's whole-model runs, ONNX Runtime and onnx's reference on the layer
    step = ctx.discover(model, out, "--timeout", str(t), bound=TINY_S + 4 * call_limit(t), expect=0)
    ctx.expect_report(out, "hangloop", [("Loop_*", "*", "unverified", "reference"), ("Relu_*", "*", "success", None),
                                        ("Neg_*", "*", "success", None)])
    ctx.check_dir(out, report=True, name="hangloop")
    rec = list((out / "work" / "hangloop" / "layers").glob("Loop_*/reference.json.timed-out"))
    if not rec:
        ctx.problems.append("the reference's timeout is not recorded (a larger --timeout would not redo it)")
    del step


def sc_worker_crash(ctx: Ctx) -> None:
    """A worker killed by a signal: the Loop of 2**40 iterations spins in ONNX Runtime and
    the kernel kills its process with SIGXCPU (RLIMIT_CPU of 8 s, below --timeout 60).
    The promise: a failing layer never stops the others (the report is written, with that
    layer failed); the process that spins first is the preparation's whole-model run."""
    prlimit = shutil.which("prlimit")
    if not prlimit:
        raise NotMeasured("not measured here: no prlimit")
    model = m_hang_loop(ctx.d / "models")
    out = ctx.d / "out"
    argv = [prlimit, "--cpu=8:40", TGC, "discover", "--model", model, "--output-dir", out, "-j", "1", "-q",
            "--timeout", "60"]
    step = ctx.run(argv, bound=TINY_S + 2 * 40, expect=0, label="discover under prlimit --cpu=8")
    if step.rc == 2:
        ctx.expect_error(step, "crashed")
        ctx.message = f"exit 2, no report: {step.last_line()[:170]}"
        ctx.problems.append("a crash in one node's ONNX Runtime call stopped the whole discovery (no report)")
    else:
        ctx.expect_report(out, "hangloop", [("Loop_*", "*", "unverified", None)])
    ctx.check_dir(out)


def _interrupt(ctx: Ctx, *, model_fn, sig: int, group: bool, form: str = "cli", expect: tuple | int,
               when: int = 3, env_tool=None, resume_form: str | None = None, extra: tuple = (),
               signal_bound: float = SIGNAL_EXIT_S, jobs: int = 1, when_marker: bool = False) -> None:
    """Start discovery, send ``sig`` once ``when`` verdicts are finished (or, with
    ``when_marker``, once the fault compiler started), check the exit, the time from the
    signal to the exit and the processes; then resume (same form, real tools) and check
    no finished verdict was lost."""
    model = model_fn(ctx.d / "models")
    name = _name(model)
    out = ctx.d / "out"
    env = {"IREE_COMPILE": str(env_tool(ctx.d / "tools"))} if env_tool else None
    if form == "cli":
        argv = [TGC, "discover", "--model", model, "--output-dir", out, "-j", str(jobs), "-q", *extra]
        cwd = None
    else:
        argv = ctx.smk_argv(model, out)
        argv[2] = str(jobs)
        cwd = REPO
    r = ctx.start(argv, label=f"{form} run", env=env, cwd=cwd)
    layers = out / "work" / name / "layers"
    if when_marker:
        cond = lambda: (ctx.d / "tools" / "compile-started").exists()  # noqa: E731
    else:
        cond = lambda: len(list(layers.glob("*/*/result.json"))) >= when  # noqa: E731
    reached = ctx.wait_for(cond, 300, "the run reaching the point of the signal", r)
    n_before_kill = len(list(layers.glob("*/*/result.json")))
    if r.alive():
        r.send(sig, group=group)
    else:
        ctx.problems.append("the run ended before the signal")
    step = r.wait(bound=TINY_S * 3)
    if step.signal_at is not None and step.rc is not None and reached:
        to_exit = step.wall - step.signal_at
        ctx.notes.append(f"signal after {step.signal_at:.1f} s, exit {to_exit:.1f} s later")
        if to_exit > signal_bound:
            ctx.problems.append(f"the run took {to_exit:.1f} s to end after the signal (bound {signal_bound:.0f} s)")
    ctx.expect_exit(step, expect)
    if sig == signal.SIGINT and form == "cli" and "interrupted" not in step.last_line():
        ctx.problems.append(f"no 'interrupted' line: {step.last_line()[:200]}")
    if sig == signal.SIGKILL:
        # a writer killed mid-write leaves its temporary file (nothing can prevent that);
        # what counts is that no JSON is corrupt now and the resumed run removes them
        bad, _ = json_problems(out)
        ctx.corrupt += [f"{out.name}/{b}" for b in bad]
        if layers.is_dir():  # make sure there is one for the resumed run to remove
            (layers / ".result.json.killed.tmp").write_text('{"half": ')
    else:
        ctx.check_dir(out, report=False, name=name)
    before = results(out, name)
    if not env_tool:  # real tools: a crash or timeout verdict can only be one the signal made up
        made_up = sorted(k for k, v in before.items() if v["stage"] in ("crash", "timeout"))
        if made_up:
            ctx.problems.append(f"{len(made_up)} verdict(s) made up by the stop (stage crash/timeout, kept on "
                                f"resume): {made_up[:3]}")
    ctx.message = f"{n_before_kill} verdicts at the signal; "
    # resume with the real tools
    rform = resume_form or form
    if rform == "cli":
        step2 = ctx.discover(model, out, *extra, "-j", str(jobs), bound=TINY_S * (4 if "squeezenet" in name else 1),
                             expect=0, label="resume")
    else:
        rargv = ctx.smk_argv(model, out)
        rargv[2] = str(jobs)
        step2 = ctx.run(rargv, bound=TINY_S, label="resume (snakemake)", cwd=REPO)
        if step2.rc != 0 and "LockException" in step2.text:
            ctx.problems.append("the next Snakemake-form run refused: stale Snakemake lock in the repository's "
                                ".snakemake after kill -9 (needs snakemake --unlock)")
            ctx.run(rargv + ["--unlock"], bound=QUICK_S, label="unlock", cwd=REPO)
            step2 = ctx.run(rargv, bound=TINY_S, label="resume after --unlock", cwd=REPO)
        ctx.expect_exit(step2, 0)
    after = results(out, name)
    ctx.expect_resume(before, after)
    ctx.expect_report(out, name)
    ctx.check_dir(out, report=True, name=name)
    ctx.message += f"resumed: {len(after)} verdicts, {ctx.lost or 0} lost, {ctx.redone} redone"


def sc_interrupt(**kw):
    return functools.partial(_interrupt, **kw)


def _hold_and_second(ctx: Ctx, *, first: str, second: str, same_model: bool = True) -> None:
    """The first run (``first`` form, a slow compiler so it lasts) holds the run lock of its
    discovery; the second (``second`` form, same model and directory) must refuse at once
    with one line naming the holder; the first must finish as if alone."""
    model = m_convrelu(ctx.d / "models")
    out = ctx.d / "out"
    # long enough for the second to reach its lock check: the Snakemake form's start takes
    # ~11 s on a host whose slurm.conf names a controller that is down (the slurm plugin's
    # `scontrol show config` at import waits ~9 s: the SLURM tests leave such a host)
    tool = fault_slow_compile(ctx.d / "tools", 10)
    env = {"IREE_COMPILE": str(tool)}
    if first == "cli":
        r1 = ctx.start([TGC, "discover", "--model", model, "--output-dir", out, "-j", "1", "-q"], env=env,
                       label="first (cli)")
    else:
        r1 = ctx.start(ctx.smk_argv(model, out), env=env, cwd=REPO, label="first (snakemake)")
    holder = out / ".torq-gen-config-convrelu.lock.json"
    ctx.wait_for(lambda: holder.exists() and (ctx.d / "tools" / "compile-started").exists(), 120,
                 "the first run taking the lock", r1)
    if second == "cli":
        s2 = ctx.discover(model, out, bound=QUICK_S, expect=2, label="second (cli)")
        ctx.expect_error(s2, "another torq-gen-config run is using")
        line = s2.last_line()
    else:
        s2 = ctx.run(ctx.smk_argv(model, out), bound=QUICK_S, expect=1, cwd=REPO, label="second (snakemake)")
        lines = [ln for ln in s2.stderr.splitlines() if "another torq-gen-config run is using" in ln]
        if len(lines) != 1:
            ctx.problems.append(f"second (snakemake): {len(lines)} lines naming the holder")
        line = lines[0] if lines else s2.last_line()
    if f"pid {r1.pid}" not in line:
        ctx.problems.append(f"the refusal does not name the holder pid {r1.pid}: {line[:200]}")
    ctx.message = line.removeprefix(ERROR_PREFIX)[:90] + "..."
    if r1.alive() is False:
        ctx.problems.append("the first run ended before the second was tried")
    s1 = r1.wait(bound=TINY_S + 4 * 10)
    ctx.expect_exit(s1, 0)
    ctx.expect_report(out, "convrelu", [("*", "*", "success", None)])
    ctx.check_dir(out, report=True, name="convrelu")


def sc_concurrent(first: str, second: str):
    return functools.partial(_hold_and_second, first=first, second=second)


def sc_two_models(ctx: Ctx) -> None:
    """Two discoveries of different models into one output directory at the same time:
    both complete, each with its own report."""
    a = m_convrelu(ctx.d / "models", name="model_a")
    b = m_chain(ctx.d / "models", n=3, name="model_b")
    out = ctx.d / "out"
    env = {"IREE_COMPILE": str(fault_slow_compile(ctx.d / "tools", 1.5))}
    ra = ctx.start([TGC, "discover", "--model", a, "--output-dir", out, "-j", "1", "-q"], env=env, label="model_a")
    rb = ctx.start([TGC, "discover", "--model", b, "--output-dir", out, "-j", "1", "-q"], env=env, label="model_b")
    sa, sb = ra.wait(bound=TINY_S * 2), rb.wait(bound=TINY_S * 2)
    ctx.expect_exit(sa, 0)
    ctx.expect_exit(sb, 0)
    ctx.expect_report(out, "model_a", [("*", "*", "success", None)])
    ctx.expect_report(out, "model_b", [("*", "*", "success", None)])
    ctx.check_dir(out)
    ctx.message = f"both reports written ({sa.wall:.0f} s and {sb.wall:.0f} s, in parallel)"


def sc_timeout_raised(ctx: Ctx) -> None:
    """A compile of the Conv layer takes 12 s: under --timeout 5 its two IREE verdicts are
    error/timeout; a rerun with --timeout 60 redoes those two jobs only (every other
    verdict file untouched) and they succeed. With compile batches (the default) the
    batch holding Conv is slow too: it times out, its layers are compiled alone (Relu's
    fast), and under --timeout 60 the batch is compiled again and Conv's tests run from it."""
    model = m_convrelu(ctx.d / "models")
    out = ctx.d / "out"
    env = {"IREE_COMPILE": str(fault_slow_compile(ctx.d / "tools", 12, "*Conv*|*batch.mlir*"))}
    ctx.discover(model, out, "--timeout", "5", bound=TINY_S + 2 * call_limit(5), expect=0, env=env, label="--timeout 5")
    ctx.expect_report(out, "convrelu", [("Conv_*", "llvm-cpu", "error", "timeout"), ("Conv_*", "vmvx", "error", "timeout"),
                                        ("Relu_*", "*", "success", None), ("Conv_*", "ort", "success", None)])
    first = results(out, "convrelu")
    prepared = (out / "work" / "convrelu" / "prepared.onnx").stat().st_mtime_ns
    ctx.message = ""
    ctx.discover(model, out, "--timeout", "60", bound=TINY_S + 2 * 12, expect=0, env=env, label="--timeout 60")
    ctx.expect_report(out, "convrelu", [("*", "*", "success", None)])
    second = results(out, "convrelu")
    redone = sorted(k for k in first if second.get(k, {}).get("mtime") != first[k]["mtime"])
    expected = sorted(k for k, v in first.items() if v["stage"] == "timeout")
    if redone != expected:
        ctx.problems.append(f"redone {redone}, expected only the timed-out {expected}")
    if (out / "work" / "convrelu" / "prepared.onnx").stat().st_mtime_ns != prepared:
        ctx.problems.append("the prepared model was rewritten")
    ctx.check_dir(out, report=True, name="convrelu")
    ctx.message = f"timed out: {len(expected)}; redone under --timeout 60: {len(redone)} -> success"


def sc_stale_after_failed_rerun(ctx: Ctx) -> None:
    """A finished discovery, then a rerun with another compiler option whose compiles hang
    and that is stopped with Ctrl-C: the old report stays; view and edit warn that it is
    out of date, run refuses it."""
    model, out = baseline(ctx)
    env = {"IREE_COMPILE": str(fault_hanging_compile(ctx.d / "tools"))}
    r = ctx.start([TGC, "discover", "--model", model, "--output-dir", out, "-j", "1", "-q",
                   "--compiler-option=--iree-opt-const-eval=false"], env=env, label="rerun")
    ctx.wait_for(lambda: (ctx.d / "tools" / "compile-started").exists(), 120, "a compile of the rerun", r)
    r.send(signal.SIGINT, group=True)
    ctx.expect_exit(r.wait(bound=TINY_S), 130)
    rep = _report_of(out)
    v = ctx.cli("view", rep, bound=QUICK_S, expect=0, label="view")
    ctx.expect_warning(v, "out of date")
    e = ctx.cli("edit", rep, "--list", bound=QUICK_S, expect=0, label="edit --list")
    ctx.expect_warning(e, "out of date")
    ru = ctx.cli("run", "--model", model, "--output-dir", out, "-j", "1", bound=QUICK_S, expect=2, label="run")
    ctx.expect_error(ru, "out of date")
    ctx.message = "view/edit warn, run refuses: " + ru.last_line().removeprefix(ERROR_PREFIX)[:80]
    ctx.check_dir(out, report=True, name="convrelu")


def sc_model_changed(ctx: Ctx) -> None:
    """The model file changed after discovery: view flags the report; run refuses it."""
    model, out = baseline(ctx)
    m_convrelu(model.parent, weight=0.3)  # same name, other weights
    v = ctx.cli("view", "--model", model, "--output-dir", out, bound=QUICK_S, expect=0, label="view")
    ctx.expect_warning(v, "changed since")
    ru = ctx.cli("run", "--model", model, "--output-dir", out, "-j", "1", bound=QUICK_S, expect=2, label="run")
    ctx.expect_error(ru, "changed since")
    ctx.check_dir(out, report=True, name="convrelu")


def sc_readonly_discover(ctx: Ctx) -> None:
    model = m_convrelu(ctx.d / "models")
    ro = ctx.d / "ro"
    if os.geteuid() == 0:
        ctx.mount(ro, "ro,size=64k")
    else:
        ro.mkdir()
        ro.chmod(0o555)
    for out in (ro, ro / "sub"):
        step = ctx.discover(model, out, bound=QUICK_S, expect=2, label=f"discover into {out.name}")
        ctx.expect_error(step, None, only_line=True)
        ctx.message = step.last_line()[len(ERROR_PREFIX):][:120]


def _report_in_tmpfs(ctx: Ctx, options: str) -> tuple[Path, dict]:
    model, src = baseline(ctx)
    d = ctx.d / "mnt"
    ctx.mount(d, options)
    shutil.copytree(src, d / "out", symlinks=True)
    files = {p: p.read_bytes() for p in (d / "out").glob("*.json")}
    return d / "out", files


def _unchanged(ctx: Ctx, files: dict) -> None:
    changed = [p.name for p, data in files.items() if not p.is_file() or p.read_bytes() != data]
    if changed:
        ctx.problems.append(f"changed: {changed}")


def sc_readonly_edit(ctx: Ctx) -> None:
    """edit and view of a report in a read-only directory: edit refuses with one line and
    changes nothing, view works."""
    if os.geteuid() != 0:
        raise NotMeasured("not measured here: needs root to mount a read-only tmpfs")
    out, files = _report_in_tmpfs(ctx, "size=2m")
    subprocess.run(["mount", "-o", "remount,ro", str(out.parent)], check=True, timeout=30)
    step = ctx.cli("edit", _report_of(out), "--layer", "Conv_*", "--executor", "vmvx", bound=QUICK_S, expect=2)
    ctx.expect_error(step, "read-only", only_line=True)
    ctx.cli("view", _report_of(out), bound=QUICK_S, expect=0, label="view")
    _unchanged(ctx, files)
    ctx.check_dir(out)


def sc_full_discover(ctx: Ctx) -> None:
    """discover into a 200 KiB tmpfs: one line (no space left), exit 2, nothing corrupted."""
    if os.geteuid() != 0:
        raise NotMeasured("not measured here: needs root to mount a tmpfs")
    model = m_convrelu(ctx.d / "models")
    full = ctx.d / "full"
    ctx.mount(full, "size=200k")
    step = ctx.discover(model, full / "out", bound=TINY_S, expect=2)
    ctx.expect_error(step, "no space left")
    ctx.check_dir(full / "out")


def sc_full_edit(ctx: Ctx) -> None:
    """edit of a report on a full disk: one line, the report and compiler JSON unchanged."""
    if os.geteuid() != 0:
        raise NotMeasured("not measured here: needs root to mount a tmpfs")
    out, files = _report_in_tmpfs(ctx, "size=1m")
    filler = out.parent / "filler"
    try:
        with open(filler, "wb", buffering=0) as f:  # fill the rest of the disk
            while True:
                f.write(b"\0" * 4096)
    except OSError:  # ENOSPC: full
        pass
    step = ctx.cli("edit", _report_of(out), "--layer", "Conv_*", "--executor", "vmvx", bound=QUICK_S, expect=2)
    ctx.expect_error(step, "no space left", only_line=True)
    _unchanged(ctx, files)
    filler.unlink()
    ctx.check_dir(out)


def sc_edit_bad_args(ctx: Ctx) -> None:
    _, out = baseline(ctx)
    before = {p: p.read_bytes() for p in out.glob("*.json")}
    s1 = ctx.cli("edit", _report_of(out), "--layer", "NoSuchLayer*", "--executor", "vmvx", bound=QUICK_S, expect=2,
                 label="edit unknown layer")
    ctx.expect_error(s1, "NoSuchLayer", only_line=True)
    s2 = ctx.cli("edit", _report_of(out), "--layer", "Conv_*", "--executor", "gpu9", bound=QUICK_S, expect=2,
                 label="edit unknown executor")
    ctx.expect_error(s2, "gpu9", only_line=True)
    _unchanged(ctx, before)


# --------------------------------------------------------------------------------------
# Cluster faults, through a real SLURM (profiles/slurm)
# --------------------------------------------------------------------------------------

#: The SLURM this run brought up (tests/workflow/local_slurm.py), stopped at the end of main().
_SLURM: list = []
SLURM_PROFILE = REPO / "profiles" / "slurm"
#: A discovery of a 2-layer model through SLURM: 5 submissions one after the other (model
#: steps, the unit's preparation, its tests), ~10 s of floor each (benchmarks/cluster_overhead.py).
SLURM_RUN_S = 240.0
#: What a job past its time limit adds: it is stopped 60 s after it started at runtime=1, then
#: its processes get KillWait (30 s) to end, and the plugin notices within ~10 s.
SLURM_TIME_LIMIT_S = 120.0
#: Seconds the drained node stays drained at most (the run's "waiting:" line comes within
#: progress.PENDING_CHECK_S = 15 s).
DRAIN_S = 40.0
_SLURM_JOBID = re.compile(r"submitted with SLURM jobid (\d+)")


def slurm_up() -> None:
    """A SLURM controller answers here, one already up (the SLURM e2e test's) or the local
    one brought up now for the rest of the run (as root, with Debian's slurm-wlm); else
    the row is not measured."""
    import importlib.util

    from torq_gen_config.pipeline.cluster import slurm_controller_problem

    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        raise NotMeasured("not measured here: snakemake-executor-plugin-slurm is not installed (pip install -e "
                          "'.[cluster]')")
    if shutil.which("scontrol") and slurm_controller_problem() is None:
        return
    sys.path.insert(0, str(REPO / "tests" / "workflow"))
    import local_slurm

    reason = local_slurm.unavailable_reason()
    if reason:
        raise NotMeasured(f"not measured here: no SLURM ({reason})")
    try:
        _SLURM.append(local_slurm.start(Path(tempfile.mkdtemp(prefix="tgc-faults-slurm-"))))
    except RuntimeError as e:
        raise NotMeasured(f"not measured here: SLURM did not come up ({str(e).splitlines()[0]})") from None


def stop_slurm() -> None:
    """Stop the SLURM :func:`slurm_up` brought up (by PID), if any."""
    while _SLURM:
        import local_slurm

        local_slurm.stop(_SLURM.pop())


def _slurm_nodes() -> list[str]:
    r = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N"], capture_output=True, text=True, timeout=30)
    return sorted(set(r.stdout.split()))


def fault_slow_compile_in_job(d: Path, pattern: str, seconds: float = 300) -> Path:
    """The real iree-compile, or, when the command line matches ``pattern`` (a shell case
    pattern, e.g. ``*=llvm-cpu*``), ``$SLURM_JOB_ID <arguments>`` appended to
    ``d/compile-started`` and the process replaced by a sleep of ``seconds``: a compile
    inside a SLURM job that stays there until the job is cancelled or past its time limit.
    One process, as a real compiler is (a shell waiting on a child ``sleep`` could die of
    SLURM's SIGTERM and leave the sleep behind, re-parented out of the job's process tree
    that proctrack/linuxproc follows)."""
    marker = d / "compile-started"
    real = real_iree_compile()
    return fault_tool(d, "fault_slow_iree_compile_in_job",
                      f'case "$1" in --version) exec "{real}" --version;; esac\n'
                      f'case "$*" in {pattern}) echo "$SLURM_JOB_ID $*" >> "{marker}"; exec sleep {seconds};; esac\n'
                      f'exec "{real}" "$@"\n')


def _slowed_job(d: Path, executor: str) -> str | None:
    """The SLURM job id whose compile for ``executor`` started (fault_slow_compile_in_job)."""
    try:
        lines = (d / "compile-started").read_text().splitlines()
    except OSError:
        return None
    for ln in lines:
        job, _, args = ln.partition(" ")
        if f"backends={executor}" in args and job.isdigit():
            return job
    return None


def sc_slurm(*, drain: bool = False, cancel: str | None = None, time_limit: str | None = None):
    """discover --profile profiles/slurm on a 2-layer model (one unit: one prepare_unit job,
    one test_unit job per executor) with faults on the real SLURM: ``drain``: the node(s)
    drained when the unit's preparation is written (its test jobs then wait), resumed once
    the run said so or after :data:`DRAIN_S`; ``cancel``: that executor's test_unit job gets
    ``scancel`` while its (slow) compile runs; ``time_limit``: that executor's test_unit job
    runs past its time limit (``--set-resources test_unit:runtime=1``, a compile of 300 s).

    Checked: each fault gives its one line naming the unit's layers and the SLURM job id
    (``job failed: ... SLURM job N CANCELLED`` / ``TIMEOUT``; ``waiting: SLURM job N ...
    pending``); the finished verdicts are all there after a rerun through SLURM with the
    real compiler (same status), which completes with every verdict a success."""
    def scenario(ctx: Ctx) -> None:
        slurm_up()
        model = m_convrelu(ctx.d / "models")
        name = _name(model)
        out = ctx.d / "out"
        slowed = [e for e in (cancel, time_limit) if e]
        env = {"IREE_COMPILE": str(fault_slow_compile_in_job(
            ctx.d / "tools", "|".join(f"*backends={e}*" for e in slowed)))} if slowed else None
        extra = ["--", "--set-resources", "test_unit:runtime=1"] if time_limit else []
        argv = [TGC, "discover", "--profile", SLURM_PROFILE, "--model", model, "--output-dir", out, "-q", *extra]
        r = ctx.start(argv, label="discover --profile slurm", env=env)
        nodes, drained, cancelled, expired = _slurm_nodes(), False, None, None
        prepared = out / "work" / name / "units" / "0000" / "prepared.json"
        try:
            if drain and ctx.wait_for(prepared.exists, SLURM_RUN_S, "the unit's preparation", r):
                for node in nodes:
                    subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=tgc-faults"],
                                   capture_output=True, timeout=30)
                drained = True
                t0 = time.monotonic()
                while time.monotonic() - t0 < DRAIN_S and r.alive() and \
                        "waiting: SLURM job" not in r.err_path.read_text(errors="replace"):
                    time.sleep(0.5)
            if drained:
                for node in nodes:
                    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True,
                                   timeout=30)
                drained = False
            if cancel and ctx.wait_for(lambda: _slowed_job(ctx.d / "tools", cancel), SLURM_RUN_S,
                                       f"the {cancel} compile in its SLURM job", r):
                cancelled = _slowed_job(ctx.d / "tools", cancel)
                time.sleep(1)
                subprocess.run(["scancel", cancelled], capture_output=True, timeout=30)
            if time_limit and ctx.wait_for(lambda: _slowed_job(ctx.d / "tools", time_limit), SLURM_RUN_S,
                                           f"the {time_limit} compile in its SLURM job", r):
                expired = _slowed_job(ctx.d / "tools", time_limit)
            step = r.wait(bound=SLURM_RUN_S + (SLURM_TIME_LIMIT_S if time_limit else 0))
        finally:
            for node in nodes if drained else []:
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True,
                               timeout=30)
            ours = _SLURM_JOBID.findall(r.err_path.read_text(errors="replace") + r.out_path.read_text(errors="replace"))
            if ours and r.alive():
                subprocess.run(["scancel", *ours], capture_output=True, timeout=30)
        ctx.expect_exit(step, (1, 2) if (cancel or time_limit) else 0)
        failed = [ln for ln in step.stderr.splitlines() if ln.startswith("job failed:")]
        waiting = [ln for ln in step.stderr.splitlines() if ln.startswith("waiting:")]
        members = json.loads(prepared.read_text())["members"] if prepared.is_file() else []
        layers = [m["slug"] for m in members]
        for what, job, state in (("scancel", cancelled, "CANCELLED"), ("time limit", expired, "TIMEOUT")):
            if job is None:
                continue
            mine = [ln for ln in failed if f"SLURM job {job} " in ln]
            if len(mine) != 1:
                ctx.problems.append(f"{what}: {len(mine)} 'job failed' line(s) for SLURM job {job}: {failed}")
            elif state not in mine[0] or not all(slug in mine[0] for slug in layers[:1] + layers[-1:]):
                ctx.problems.append(f"{what}: the line does not say {state} or name the layers {layers}: {mine[0]}")
        if drain:
            if len(waiting) < 1 or not all("SLURM job " in ln and "pending" in ln and layers[0] in ln
                                           for ln in waiting if "unit" in ln):
                ctx.problems.append(f"drain: no 'waiting: SLURM job ... pending' line naming the layers: {waiting}")
        if len(failed) != len([j for j in (cancelled, expired) if j]):
            ctx.problems.append(f"{len(failed)} 'job failed' line(s), expected one per fault: {failed}")
        ctx.message = " | ".join(failed + waiting)[:300] or step.last_line()[:200]
        ctx.check_dir(out)
        before = results(out, name)
        if cancel or time_limit:  # the next run resumes: through SLURM, with the real compiler
            step2 = ctx.run([TGC, "discover", "--profile", SLURM_PROFILE, "--model", model, "--output-dir", out, "-q"],
                            bound=SLURM_RUN_S, expect=0, label="rerun --profile slurm")
            del step2
            ctx.expect_resume(before, results(out, name))
        ctx.expect_report(out, name, [("*", "*", "success", None)])
        ctx.check_dir(out, report=True, name=name)
    return scenario


# --------------------------------------------------------------------------------------
# The table: one entry per kind
# --------------------------------------------------------------------------------------

SMK_NOTE = "Snakemake form: snakemake --cores 1 --config model=M output_dir=D from the repository root"

KINDS: list[Kind] = [
    # bad models: one line, exit 2
    Kind("missing model", "model", bad_model(lambda d: d / "nope.onnx", "model file not found")),
    Kind("truncated model", "model", bad_model(m_truncated, "not a valid ONNX model")),
    Kind("empty model", "model", bad_model(m_bytes("empty.onnx", b""), "empty")),
    Kind("non-ONNX file", "model", bad_model(m_bytes("text.onnx", b"this is not a model\n" * 20), "not a valid ONNX")),
    Kind(".tflite model", "model", bad_model(m_bytes("m.tflite", b"\x1c\0\0\0TFL3" + os.urandom(200)), "TFLite")),
    Kind("directory as model", "model", bad_model(m_directory, "directory")),
    Kind("external data missing", "model", bad_model(functools.partial(m_external, missing=True), "external data")),
    Kind("zero nodes", "model", bad_model(m_zero_nodes, "no nodes")),
    Kind("braces in model path", "model", bad_model(m_braces, "braces")),
    # models that must work: exit 0, a report with every layer
    Kind("external data present", "model", works(m_external, [("*", "*", "success", None)])),
    Kind("dynamic dims", "model", works(m_dynamic, [("*", "*", "success", None)])),
    Kind("custom-domain op", "model", works(m_custom_domain, [("Frobnicate_*", "*", "error", "compile"),
                                                              ("Relu_*", "*", "success", None),
                                                              ("Neg_*", "*", "success", None)])),
    Kind("If", "model", works(m_if, [("Relu_*", "*", "success", None)])),
    Kind("Loop (3 iterations)", "model", works(m_loop, [("Relu_*", "*", "success", None)])),
    Kind("multi-output", "model", works(m_multi_output, [("Relu_*", "*", "success", None)])),
    Kind("sequences", "model", works(m_sequence, [("Relu_*", "*", "success", None)])),
    Kind("odd names", "model", works(m_odd_names, [("*", "*", "success", None)])),
    # faults: verdicts, the other layers tested, the report written
    Kind("compiler crash (SIGSEGV)", "fault", works(m_convrelu, [("*", "llvm-cpu", "error", "crash"),
                                                                ("*", "vmvx", "error", "crash"),
                                                                ("*", "ort", "success", None)],
                                                   env_tool=fault_crashing_compile)),
    Kind("hanging compiler", "fault", works(m_convrelu, [("*", "llvm-cpu", "error", "timeout"),
                                                        ("*", "ort", "success", None)],
                                           env_tool=fault_hanging_compile, timeout=5, hangs=4)),
    Kind("hanging compiler, --version too", "fault",
         works(m_convrelu, [("*", "llvm-cpu", "error", "timeout"), ("*", "vmvx", "error", "timeout"),
                            ("*", "ort", "success", None)],
               env_tool=functools.partial(fault_hanging_compile, version_hangs=True), timeout=5, hangs=6)),
    Kind("hanging reference (Loop 2**40)", "fault", sc_hanging_reference),
    Kind("worker crash (SIGXCPU)", "fault", sc_worker_crash),
    Kind("timeout raised 5 -> 60 s", "fault", sc_timeout_raised),
    # interrupts and resume
    Kind("Ctrl-C mid-run", "signal", sc_interrupt(model_fn=m_chain, sig=signal.SIGINT, group=True, expect=130)),
    Kind("Ctrl-C during a hanging compile", "signal",
         sc_interrupt(model_fn=m_convrelu, sig=signal.SIGINT, group=True, expect=130, when_marker=True,
                      env_tool=fault_hanging_compile)),
    Kind("SIGTERM mid-run", "signal",
         sc_interrupt(model_fn=m_chain, sig=signal.SIGTERM, group=False, expect=(143, -15, 1))),
    Kind("kill -9 mid-run", "signal", sc_interrupt(model_fn=m_chain, sig=signal.SIGKILL, group=False, expect=-9)),
    Kind("kill -9 during a hanging compile", "signal",
         sc_interrupt(model_fn=m_convrelu, sig=signal.SIGKILL, group=False, expect=-9, when_marker=True,
                      env_tool=fault_hanging_compile)),
    Kind("kill -9, wrapper-script compiler", "signal",
         sc_interrupt(model_fn=m_convrelu, sig=signal.SIGKILL, group=False, expect=-9, when_marker=True,
                      env_tool=functools.partial(fault_hanging_compile, exec_sleep=False))),
    Kind("Ctrl-C mid-run (Snakemake form)", "signal",
         sc_interrupt(model_fn=m_chain, sig=signal.SIGINT, group=True, form="snakemake", expect=(1, 130))),
    Kind("kill -9 mid-run (Snakemake form)", "signal",
         sc_interrupt(model_fn=m_chain, sig=signal.SIGKILL, group=False, form="snakemake", expect=-9)),
    Kind("kill -9 mid-run (squeezenet)", "signal",
         sc_interrupt(model_fn=m_squeezenet, sig=signal.SIGKILL, group=False, expect=-9, when=30),
         squeezenet=True),
    # two runs at once
    Kind("concurrent: CLI, then Snakemake form", "concurrency", sc_concurrent("cli", "snakemake")),
    Kind("concurrent: Snakemake form, then CLI", "concurrency", sc_concurrent("snakemake", "cli")),
    Kind("concurrent: CLI, then CLI", "concurrency", sc_concurrent("cli", "cli")),
    Kind("two models, one output dir", "concurrency", sc_two_models),
    # view / edit / run on bad or stale reports
    Kind("view: truncated JSON", "report", view_edit_bad(b'{"ops": {"a": ', ["view", "{report}"], "not valid JSON")),
    Kind("view: empty file", "report", view_edit_bad(b"", ["view", "{report}"], "empty")),
    Kind("view: binary garbage", "report", view_edit_bad(b"\x00\xff\xfe" * 50, ["view", "{report}"], None)),
    Kind("view: wrong schema", "report",
         view_edit_bad(json.dumps({"ops": {"Conv_c": 3}, "executors": [], "model_name": "convrelu"}).encode(),
                       ["view", "{report}"], "at ops/Conv_c")),
    Kind("view: malformed compiler JSON", "report",
         view_edit_bad(b'{"op_assignments": [', ["view", "{target}"], "not valid JSON", compiler=True)),
    Kind("edit: truncated JSON", "report",
         view_edit_bad(b'{"ops": ', ["edit", "{report}", "--layer", "Conv_*", "--executor", "vmvx"], "not valid JSON")),
    Kind("edit --model: malformed report", "report",
         view_edit_bad(b"[1, 2", ["edit", "--model", "{model}", "--output-dir", "{out}", "--list"], "not valid JSON")),
    Kind("edit: unknown layer / executor", "report", sc_edit_bad_args),
    Kind("run: no report", "report",
         bad_command(["run", "--model", "{model}", "--output-dir", "{d}/empty", "-j", "1"], "no report JSON",
                     make=lambda ctx: {"model": m_convrelu(ctx.d / "models")})),
    Kind("stale report after a stopped rerun", "report", sc_stale_after_failed_rerun),
    Kind("model changed since the report", "report", sc_model_changed),
    # bad configs and options
    Kind("config: not YAML", "config", sc_config("timeout_s: [1\n", "not valid YAML")),
    Kind("config: unknown key", "config", sc_config("timeout_secs: 3\n", "timeout_secs")),
    Kind("config: value out of range", "config", sc_config("timeout_s: -3\n", "timeout_s")),
    Kind("config: bad executor", "config",
         sc_config("executors:\n  - {name: x, backend: nosuchbackend}\n", "nosuchbackend")),
    Kind("option: --jobs 0", "config", bad_model(m_convrelu, "--jobs", "--jobs", "0")),
    Kind("option: --input-data not .npz or .npy", "config",
         bad_model(m_convrelu, "neither an .npz archive nor an .npy array", "--input-data", "{model}")),
    Kind("option: --input-shapes wrong rank", "config",
         bad_model(m_convrelu, "rank", "--input-shapes", "x:1x3")),
    # the output directory
    Kind("output dir is a file", "disk", bad_model(m_convrelu, "is a file", "--output-dir", "{model}")),
    Kind("read-only output dir: discover", "disk", sc_readonly_discover),
    Kind("read-only output dir: edit", "disk", sc_readonly_edit),
    Kind("full output dir: discover", "disk", sc_full_discover),
    Kind("full output dir: edit", "disk", sc_full_edit),
    # cluster faults (a real SLURM: "not measured here" where it cannot be brought up)
    Kind("SLURM: scancel of a unit job mid-run", "cluster", sc_slurm(cancel="llvm-cpu")),
    Kind("SLURM: a unit job past its time limit", "cluster", sc_slurm(time_limit="llvm-cpu")),
    Kind("SLURM: node drained while jobs wait", "cluster", sc_slurm(drain=True)),
    Kind("SLURM: drain, scancel and time limit in one run", "cluster",
         sc_slurm(drain=True, cancel="vmvx", time_limit="llvm-cpu")),
]
KINDS_BY_NAME = {k.name: k for k in KINDS}


# --------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------

def _left(o: Outcome) -> str:
    parts = []
    if o.corrupt:
        parts.append(f"{len(o.corrupt)} corrupt")
    if o.stale:
        parts.append(f"{len(o.stale)} tmp")
    return ", ".join(parts) or "clean"


def _row(o: Outcome) -> list[str]:
    verdict = "n/a" if o.not_measured else ("clear" if o.clear else "FAIL")
    lost = "-" if o.lost is None else (f"{o.lost}" + (f" ({o.redone} redone)" if o.redone else ""))
    return [o.kind.name, o.exit, (o.message or "").replace("\n", " ")[:110], _left(o), lost, str(o.tracebacks),
            f"{o.wall:.1f}/{o.bound:.0f}", str(o.leftovers), verdict]


HEADERS = ["kind", "exit", "message / verdict", "left", "lost", "tb", "s/bound", "procs", "result"]


def print_table(outcomes: list[Outcome]) -> None:
    rows = [_row(o) for o in outcomes]
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(show_lines=False)
        for h in HEADERS:
            t.add_column(h, overflow="fold", max_width=60 if h.startswith("message") else None)
        for r in rows:
            style = None if r[-1] == "clear" else ("yellow" if r[-1] == "n/a" else "red")
            t.add_row(*r, style=style)
        Console(width=max(160, shutil.get_terminal_size((160, 20)).columns)).print(t)
    except ImportError:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
        print("  ".join(h.ljust(w) for h, w in zip(HEADERS, widths)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    for o in outcomes:
        if o.problems or o.corrupt or o.stale:
            print(f"\n[{o.kind.name}]")
            for p in o.problems:
                print(f"  - {p}")
            for c in o.corrupt:
                print(f"  - corrupt: {c}")
            for s in o.stale:
                print(f"  - left: {s}")
    notes = [(o.kind.name, n) for o in outcomes for n in o.notes if "stack frame" in n]
    if notes:
        print(f"\nNotes: Snakemake printed its job-failure stack (frames of torq_gen_config) above the one-line "
              f"error in {len({k for k, _ in notes})} row(s): {', '.join(sorted({k for k, _ in notes}))}")


def summary(outcomes: list[Outcome], seconds: float) -> dict:
    measured = [o for o in outcomes if not o.not_measured]
    s = {
        "kinds": len(outcomes),
        "measured": len(measured),
        "not_measured": len(outcomes) - len(measured),
        "clear": sum(o.clear for o in measured),
        "clear_pct": 100.0 * sum(o.clear for o in measured) / max(1, len(measured)),
        "corrupted": sum(len(o.corrupt) for o in measured),
        "tmp_left": sum(len(o.stale) for o in measured),
        "lost": sum(o.lost or 0 for o in measured),
        "tracebacks": sum(o.tracebacks for o in measured),
        "over_time": sum(o.over_time for o in measured),
        "leftover_processes": sum(o.leftovers for o in measured),
        "seconds": round(seconds, 1),
    }
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", metavar="REGEX", help="run the kinds whose name matches (re.search, case-insensitive)")
    ap.add_argument("--keep", metavar="DIR", help="keep every row's files (models, output dirs, logs) under DIR")
    ap.add_argument("--quick", action="store_true", help="skip the rows that need light_squeezenet (slow)")
    ap.add_argument("--list", action="store_true", help="list the kinds and exit")
    ap.add_argument("--json", metavar="FILE", help="also write the outcomes and the summary as JSON")
    args = ap.parse_args(argv)
    kinds = [k for k in KINDS if (not args.only or re.search(args.only, k.name, re.I))
             and not (args.quick and k.squeezenet)]
    if args.list:
        for k in kinds:
            print(f"{k.group:12s} {k.name}")
        return 0
    root = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="tgc-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    t0 = time.monotonic()
    outcomes = []
    try:
        for i, k in enumerate(kinds, 1):
            t = time.monotonic()
            o = run_kind(k, root, keep=bool(args.keep))
            outcomes.append(o)
            state = "n/a" if o.not_measured else ("clear" if o.clear else "FAIL")
            print(f"[{i}/{len(kinds)}] {k.name}: {state} ({time.monotonic() - t:.0f} s)", file=sys.stderr, flush=True)
    finally:
        stop_slurm()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    seconds = time.monotonic() - t0
    print_table(outcomes)
    s = summary(outcomes, seconds)
    print(f"\n{s['kinds']} kinds ({s['not_measured']} not measured here): {s['clear_pct']:.0f}% clear "
          f"({s['clear']}/{s['measured']}), {s['corrupted']} corrupted, {s['tmp_left']} temporary files left, "
          f"{s['lost']} verdicts lost, {s['tracebacks']} tracebacks, {s['over_time']} runs over their time bound, "
          f"{s['leftover_processes']} leftover processes; {s['seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": s, "rows": [
            {"kind": o.kind.name, "group": o.kind.group, "exit": o.exit, "message": o.message, "clear": o.clear,
             "not_measured": o.not_measured, "corrupt": o.corrupt, "tmp": o.stale, "lost": o.lost,
             "redone": o.redone, "tracebacks": o.tracebacks, "wall": round(o.wall, 1), "bound": round(o.bound, 1),
             "leftovers": o.leftovers, "problems": o.problems, "notes": o.notes} for o in outcomes]}, indent=1))
    missed = (s["clear"] < s["measured"] or s["corrupted"] or s["lost"] or s["tracebacks"] or s["over_time"]
              or s["leftover_processes"] or s["tmp_left"])
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
