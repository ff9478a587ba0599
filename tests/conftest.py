"""Shared fixtures: real models shipped by the onnx wheel, and small hand-built models."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from filelock import FileLock
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

REPO = Path(__file__).resolve().parents[1]

# the TORQ tools' TEST FIXTURES (tests/fixtures/fake_torq) and the variables that choose them
FAKE_DIR = REPO / "tests" / "fixtures" / "fake_torq"
FAKE_COMPILE = str(FAKE_DIR / "torq-compile")
FAKE_RUN = str(FAKE_DIR / "torq-run-module")
VENV_BIN = os.path.dirname(sys.executable)
TORQ_VARS = ("TORQ_COMPILE", "TORQ_RUN_MODULE", "TORQ_TOOL_PATH", "IREE_BUILD_DIR", "FAKE_TORQ_MODE", "FAKE_TORQ_LOG")
ONNX_DIR = Path(onnx.__file__).parent
LIGHT = ONNX_DIR / "backend" / "test" / "data" / "light"
SQUEEZENET = LIGHT / "light_squeezenet.onnx"


# the longest test modules, longest first (wall seconds under 3 workers on 2 cores, CI of
# 2026-12-05: 437, 335, 182, 156, 153, 153, 147, 131, 125, 125, 118, 113, 91, 84, 72; the SLURM
# one mostly waits on the cluster), started first (pyproject.toml: --no-loadscope-reorder keeps
# this order): with one module per xdist worker, a long module started last runs alone at the end
LONGEST_FIRST = tuple(f"workflow/test_{m}.py" for m in (
    "slurm_e2e", "e2e", "faults_e2e", "precision_e2e", "run_e2e", "units_e2e", "run_batches_e2e", "readme",
    "fidelity_e2e", "compile_batches_e2e", "run_module_e2e", "reduce_e2e", "parameters_e2e", "output_schemas",
    "conformance_e2e"))


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker more than the usable cores. The end-to-end tests spend part of
    their time waiting (timeouts they provoke, sleeping fake tools, the SLURM queue): on 2
    cores, CI took 23.0 min with two workers (the CPUs ~70% busy), 20.4 with three and 20.4
    with four (2026-12-05, before the ml_dtypes pin)."""
    return len(os.sched_getaffinity(0)) + 1


def pytest_collection_modifyitems(config, items):
    """Runs the modules of :data:`LONGEST_FIRST` first, in that order; every module's
    tests stay together and in their order (a stable sort, the same on every worker)."""
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return next((i for i, m in enumerate(LONGEST_FIRST) if path.endswith(m)), len(LONGEST_FIRST))

    items.sort(key=rank)


@pytest.fixture(scope="session")
def squeezenet_path() -> Path:
    """onnx's light_squeezenet (SqueezeNet 1.0 structure, opset 9, 105 nodes, 66 layers)."""
    assert SQUEEZENET.exists(), SQUEEZENET
    return SQUEEZENET


def make_model(nodes, inputs, outputs, initializers=(), opset=17, name="g"):
    """A small ONNX model built with onnx.helper (checked)."""
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tvi(name, dtype, shape):
    """Shorthand for helper.make_tensor_value_info."""
    return helper.make_tensor_value_info(name, dtype, shape)


def if_model() -> onnx.ModelProto:
    """ReduceSum -> Greater -> If whose branches (Relu / Neg) read the input ``x`` directly
    (no operand), shapes inferred, opset 17: the If model of the placement tests."""
    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [tvi("t", f, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [tvi("e", f, [2])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    graph = helper.make_graph(nodes, "g", [tvi("x", f, [2])], [tvi("y", f, [2])],
                              [nh.from_array(np.zeros((), np.float32), "zero")])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def folding_model() -> onnx.ModelProto:
    """MatMul -> unnamed Relu -> Mul (constant) -> Add of a folded chain (Shape -> unnamed
    Cast -> ReduceSum of the input's static shape) -> unnamed Sigmoid; Mul and Add both
    named ``dup`` (Model Explorer's node ids: tests/unit/report/test_model_explorer.py and
    tests/workflow/test_model_explorer_e2e.py)."""
    h, T = helper, TensorProto
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["mm"], name="matmul0"),
        h.make_node("Relu", ["mm"], ["r"]),
        h.make_node("Constant", [], ["c"], value=nh.from_array(np.array([2.0], np.float32), "cv")),
        h.make_node("Shape", ["x"], ["shp"], name="shape_fold"),
        h.make_node("Cast", ["shp"], ["shpf"], to=T.FLOAT),
        h.make_node("ReduceSum", ["shpf"], ["s"], keepdims=1, name="sum_fold"),
        h.make_node("Mul", ["r", "c"], ["m"], name="dup"),
        h.make_node("Add", ["m", "s"], ["a"], name="dup"),
        h.make_node("Sigmoid", ["a"], ["y"]),
    ]
    w = nh.from_array(np.full((4, 4), 0.1, np.float32), "W")
    return make_model(nodes, [tvi("x", T.FLOAT, [2, 4])], [tvi("y", T.FLOAT, [2, 4])], [w], name="small")


def work(out, name: str | None = None) -> Path:
    """The work directory of a discovery in ``out``: ``out/work/<name>``
    (torq_gen_config.core.layout); without ``name``, the only one there."""
    root = Path(out) / "work"
    if name is not None:
        return root / name
    found = [d for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
    assert len(found) == 1, f"expected one work directory in {root}, found {found}"
    return found[0]


def run_cli(*args, cwd=None, timeout=900):
    """Run the torq-gen-config console script of this Python's environment (not another
    one on PATH); returns CompletedProcess (text)."""
    exe = str(Path(sys.executable).parent / "torq-gen-config")
    return subprocess.run([exe, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def one_line_error(r) -> str:
    """The one ``torq-gen-config: error: ...`` line of a refused command (CompletedProcess),
    asserting that there is exactly one and no traceback; returns it."""
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("torq-gen-config: error: ")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return errors[0]


def cli_in_process(capsys, *args):
    """Run ``torq_gen_config.cli.main.main`` in this process, for commands that are refused
    before any workflow starts (no console-script start: ~1 s each). Returns a
    CompletedProcess like ``run_cli``'s (returncode, stdout, stderr from ``capsys``), so
    ``one_line_error`` applies; argparse's usage errors (SystemExit) give their status. The
    state a refused command must leave alone in the test process (working directory,
    environment, SIGINT/SIGTERM handlers) is asserted unchanged."""
    from torq_gen_config.cli.main import main

    argv = [str(a) for a in args]
    cwd, env = os.getcwd(), dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    capsys.readouterr()  # what the test printed before is not the command's
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    assert (os.getcwd(), dict(os.environ)) == (cwd, env), "the command changed the process state"
    assert {s: signal.getsignal(s) for s in handlers} == handlers, "the command left signal handlers set"
    return subprocess.CompletedProcess(["torq-gen-config", *argv], code, out, err)


def run_snakemake(*args, cwd=REPO, timeout=900):
    """Run snakemake from the repository root (picks up profiles/default)."""
    exe = str(Path(sys.executable).parent / "snakemake")
    return subprocess.run([exe, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def squeezenet_discovery(tmp_path_factory):
    """ONE default discovery of light_squeezenet through the console script
    (``discover --model SQUEEZENET --output-dir OUT -j 2 -q``, ~45 s on 2 cores), shared by
    the tests that read its outputs (tests/workflow: test_e2e, test_promises_e2e,
    test_units_e2e, test_reduce_e2e, test_output_schemas), instead of one discovery each.
    Under pytest-xdist the workers share it too: the first that needs it makes it under a
    file lock in the run's common temporary directory, the others wait and read its record.
    Returns ``(out, completed)``.
    READ ONLY: a test that changes or reruns anything works on ``copy_discovery(out, ...)``.
    Its files' digest is checked at the end of the session, so a test that writes into it
    fails there instead of passing on another's changes."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' common directory of this run
    home = root / "squeezenet_discovery"
    out, record = home / "out", home / "completed.json"
    with FileLock(str(root / "squeezenet_discovery.lock")):
        if record.exists():
            r = subprocess.CompletedProcess(**json.loads(record.read_text()))
        else:
            shutil.rmtree(home, ignore_errors=True)  # a failed attempt's leftovers
            home.mkdir(parents=True)
            r = run_cli("discover", "--model", SQUEEZENET, "--output-dir", out, "-j", "2", "-q")
            assert r.returncode == 0, r.stderr[-3000:]
            record.write_text(json.dumps({"args": r.args, "returncode": r.returncode,
                                          "stdout": r.stdout, "stderr": r.stderr}))
    before = _tree_digest(out)
    yield out, r
    assert _tree_digest(out) == before, f"a test changed the shared discovery in {out}"


def _tree_digest(root: Path) -> dict:
    """path -> (size, mtime_ns) of every file under ``root`` (symlinks as their target)."""
    return {str(p.relative_to(root)): (os.lstat(p).st_size, os.lstat(p).st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


def copy_discovery(src: Path, dst: Path) -> Path:
    """A private copy of a shared discovery's output directory (symlinks kept), for tests
    that modify, edit or rerun it; returns ``dst``."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


__all__ = ["make_model", "tvi", "work", "run_cli", "run_snakemake", "TensorProto", "helper", "REPO", "LIGHT", "SQUEEZENET", "os",
           "cli_in_process", "copy_discovery"]
