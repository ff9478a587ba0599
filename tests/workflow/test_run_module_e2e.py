"""``torq-gen-config run --run-mode module`` end to end with real IREE (issue 22, phase 2),
on a small MatMul/Add/Relu/Concat model with seeded random weights built with
onnx.helper: discover, put one layer on vmvx with ``edit``, run as one module (mode,
reason, placement read back, verdict, compile and run time in the report and ``view``),
rerun unchanged (no recompile), change one layer's executor (recompiles), and ``auto``
with ``ort`` in the assignment falls back to partitions with the reason. About a
minute on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TensorProto, make_model, one_line_error, run_cli, tvi, work
from onnx import numpy_helper
from test_output_schemas import validate_tree

pytestmark = pytest.mark.slow
NAME = "mlp"


def _model(path: Path) -> None:
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)

    from onnx import helper

    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
             helper.make_node("MatMul", ["x", "W2"], ["m2"], name="mm2"),
             helper.make_node("Relu", ["m2"], ["r2"], name="relu2"),
             helper.make_node("Concat", ["r1", "r2"], ["y"], name="cat", axis=1)]
    model = make_model(nodes, [tvi("x", f, [1, 16])], [tvi("y", f, [1, 32])],
                       [init("W1", (16, 16)), init("b1", (16,)), init("W2", (16, 16))], name=NAME)
    import onnx

    onnx.save(model, path)


def _report(out: Path) -> dict:
    return json.loads((out / f"torq_gen_config_{NAME}.json").read_text())


def _module_compiled(out: Path) -> dict[str, float]:
    """pid -> compiled_at of every module compile in the work directory."""
    parts = work(out) / "full" / "partitions"
    return {d.name: json.loads((d / "compiled.json").read_text())["compiled_at"]
            for d in parts.glob("module-*") if (d / "compiled.json").is_file()}


@pytest.fixture(scope="module")
def discovered(tmp_path_factory):
    d = tmp_path_factory.mktemp("module_run")
    _model(d / f"{NAME}.onnx")
    out = d / "out"
    r = run_cli("discover", "--model", d / f"{NAME}.onnx", "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    return d / f"{NAME}.onnx", out


def _layer(report: dict, op_type: str, k: int = 0) -> str:
    return [lid for lid, op in report["ops"].items() if op["op_type"] == op_type][k]


def test_module_mode_placement_cache_and_fallback(discovered):
    model, out = discovered
    common = ["--model", model, "--output-dir", out]
    report = _report(out)
    relu, mm = _layer(report, "Relu", 1), _layer(report, "MatMul", 0)
    for layer, ex in (("ALL", "llvm-cpu"), (relu, "vmvx")):
        assert run_cli("edit", *common, "--layer", layer, "--executor", ex).returncode == 0

    r = run_cli("run", *common, "--run-mode", "module", "-j", "2", "-q")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    fm = _report(out)["full_model"]
    assert fm["mode"] == "module" and fm["status"] == "success", fm.get("summary")
    assert "run mode module" in fm["mode_reason"]
    rows = fm["placement"]["layers"]
    assert rows[relu]["assigned"] == "vmvx" and rows[mm]["assigned"] == "llvm-cpu"
    # the read-back is the truth: the Relu on vmvx ran there, or is flagged as elsewhere
    assert rows[relu]["ran_on"] == ["vmvx"] or relu in fm["placement"]["elsewhere"]
    assert fm["placement"]["two_backends"] == {}
    assert fm["module"]["compile_ms"] > 0 and fm["module"]["run_ms"] > 0
    print(f"module: compile {fm['module']['compile_ms']:.0f} ms, run {fm['module']['run_ms']:.0f} ms, "
          f"placement {fm['placement']['counts']}")
    v = run_cli("view", *common)
    assert "Mode: module" in v.stdout and "Placement (read back" in v.stdout, v.stdout[-2000:]
    first = _module_compiled(out)
    assert len(first) == 1
    seen = validate_tree(out)  # plan, result, the module's placement.json and compiled.json
    assert "full_module_placement.schema.yaml" in seen

    # unchanged assignment: the module is not compiled again
    r = run_cli("run", *common, "--run-mode", "module", "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _module_compiled(out) == first

    # one layer's executor changed: a new module is compiled
    # (with --debug-ir: the placed IR, the stream-level IR, the sources and the record)
    assert run_cli("edit", *common, "--layer", mm, "--executor", "vmvx").returncode == 0
    dbg = out.parent / "dbg"
    r = run_cli("run", *common, "--run-mode", "module", "-j", "2", "-q", "--debug-ir", dbg)
    assert r.returncode == 0, r.stderr[-2000:]
    now = _module_compiled(out)
    assert len(now) == 1 and set(now) != set(first)
    assert _report(out)["full_model"]["placement"]["layers"][mm]["assigned"] == "vmvx"
    for name in ("placed.mlir", "stream.mlir", "placement.json", "README.txt"):
        assert (dbg / "module" / name).is_file(), name
    assert "#hal.device.affinity<@device_vmvx>" in (dbg / "module" / "stream.mlir").read_text()
    assert list((dbg / "module" / "sources").glob("*.mlir"))

    # auto with ort in the assignment: partitions, with the reason
    assert run_cli("edit", *common, "--layer", relu, "--executor", "ort").returncode == 0
    r = run_cli("run", *common, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    fm = _report(out)["full_model"]
    assert fm["mode"] == "partitions" and "'ort'" in fm["mode_reason"] and "auto" in fm["mode_reason"]
    print(f"partitions: compile {fm['timing']['compile_ms_total']} ms, run {fm['timing']['run_ms_total']} ms")

    # module forced with ort in the assignment: one line, exit 2
    r = run_cli("run", *common, "--run-mode", "module")
    assert r.returncode == 2
    assert "--run-mode module is impossible" in one_line_error(r) and "ort" in one_line_error(r)
