"""``torq-gen-config run --run-mode module`` end to end with real IREE (issue 22, phase 2),
on a small MatMul/Add/Relu/Concat model with seeded random weights built with
onnx.helper: discover, put one layer on vmvx with ``edit``, run as one module (mode,
reason, placement read back, verdict, compile and run time in the report and ``view``),
rerun unchanged (no recompile), change one layer's executor (recompiles), and ``auto``
with ``ort`` in the assignment falls back to partitions with the reason; the compiler
JSON alone (no report) runs as one module. A transformer block built with onnx.helper
(LayerNormalization, Q/K/V projections, heads, Softmax attention, MLP, residuals) with a
seeded random llvm-cpu/vmvx assignment: the module matches the reference, its output
equals the partitions' within tolerance, and the placement reads back as assigned. An
If on vmvx between llvm-cpu layers runs there (read back), and a removed module
directory is planned and compiled again. About two and a half minutes on 2 cores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import TensorProto, cli_in_process, make_model, one_line_error, run_cli, tvi, work
from onnx import numpy_helper
from test_output_schemas import validate_tree

pytestmark = pytest.mark.slow
#: the runs keep their modules and run files (what these tests look at: a module reused, the
#: values its run wrote); the default, minimal, removes them once the report is written
KEEP = ("--keep-work", "all")
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

    r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q")
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
    r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _module_compiled(out) == first
    # a runtime option runs the module again with it, without compiling it again
    r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q", "--runtime-option=--task_topology_group_count=1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _module_compiled(out) == first
    log = "\n".join(p.read_text() for p in (work(out) / "logs").rglob("run_full_model*.log"))
    assert "--task_topology_group_count=1" in log, log[-2000:]

    # one layer's executor changed: a new module is compiled
    # (with --debug-ir: the placed IR, the stream-level IR, the sources and the record)
    assert run_cli("edit", *common, "--layer", mm, "--executor", "vmvx").returncode == 0
    dbg = out.parent / "dbg"
    r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q", "--debug-ir", dbg)
    assert r.returncode == 0, r.stderr[-2000:]
    now = _module_compiled(out)
    assert len(now) == 1 and set(now) != set(first)
    assert _report(out)["full_model"]["placement"]["layers"][mm]["assigned"] == "vmvx"
    mod_dbg = dbg / next(iter(now))  # DIR/<module pid>
    for name in ("placed.mlir", "stream.mlir", "placement.json", "README.txt"):
        assert (mod_dbg / name).is_file(), name
    assert "#hal.device.affinity<@device_vmvx>" in (mod_dbg / "stream.mlir").read_text()
    assert list((mod_dbg / "sources").glob("*.mlir"))
    assert f"Debug IR:      {dbg}/{mod_dbg.name} (README.txt)" in r.stdout
    shutil.rmtree(dbg)  # removed by hand: the next run writes it again
    r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q", "--debug-ir", dbg)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (mod_dbg / "README.txt").is_file() and "planning the run again" in r.stdout

    # auto with ort in the assignment: partitions, with the reason
    assert run_cli("edit", *common, "--layer", relu, "--executor", "ort").returncode == 0
    r = run_cli("run", *common, *KEEP, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    fm = _report(out)["full_model"]
    assert fm["mode"] == "partitions" and "'ort'" in fm["mode_reason"] and "auto" in fm["mode_reason"]
    print(f"partitions: compile {fm['timing']['compile_ms_total']} ms, run {fm['timing']['run_ms_total']} ms")

    # module forced with ort in the assignment: one line, exit 2
    r = run_cli("run", *common, *KEEP, "--run-mode", "module")
    assert r.returncode == 2
    assert "--run-mode module is impossible" in one_line_error(r) and "ort" in one_line_error(r)


def test_compiler_json_alone_runs_as_one_module(discovered, tmp_path):
    """What the original's assignment pass reads: the compiler JSON, without the report."""
    model, out = discovered
    common = ["--model", model, "--output-dir", out]
    report = _report(out)
    relu = _layer(report, "Relu", 1)
    for layer, ex in (("ALL", "llvm-cpu"), (relu, "vmvx")):
        assert run_cli("edit", *common, "--layer", layer, "--executor", ex).returncode == 0
    path = out / f"torq_gen_config_{NAME}.json"
    saved = tmp_path / path.name
    path.rename(saved)
    try:
        r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q")
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        assert not path.exists()
        result = json.loads((work(out) / "full" / "result.json").read_text())
        assert result["source"] == "compiler_json" and result["mode"] == "module", result.get("mode_reason")
        assert result["status"] == "success", result["summary"]
        vm = [k for k, row in result["module"]["placement"]["layers"].items() if row["assigned"] == "vmvx"]
        assert vm == [relu]
    finally:
        saved.rename(path)


def _transformer_block(path: Path, seq: int = 8, hidden: int = 32, heads: int = 4) -> None:
    """A pre-norm transformer block with seeded random weights (opset 17)."""
    from onnx import checker, helper

    rng = np.random.default_rng(0)
    d = hidden // heads
    inits = [numpy_helper.from_array((1 + rng.standard_normal(hidden) * 0.1).astype(np.float32), g)
             for g in ("g1", "g2")]
    inits += [numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
              for name, shape, scale in (("b1", (hidden,), 0.1), ("b2", (hidden,), 0.1), ("c1", (2 * hidden,), 0.1),
                                         *((w, (hidden, hidden), hidden ** -0.5) for w in ("Wq", "Wk", "Wv", "Wo")),
                                         ("W1", (hidden, 2 * hidden), hidden ** -0.5),
                                         ("W2", (2 * hidden, hidden), (2 * hidden) ** -0.5))]
    inits += [numpy_helper.from_array(np.array(d ** -0.5, np.float32), "scale"),
              numpy_helper.from_array(np.array([1, seq, heads, d], np.int64), "heads_shape"),
              numpy_helper.from_array(np.array([1, seq, hidden], np.int64), "flat_shape")]
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "g1", "b1"], ["ln1"], name="ln1", axis=-1),
             *(n("MatMul", ["ln1", f"W{c}"], [c], name=f"{c}_proj") for c in ("q", "k", "v")),
             *(n("Reshape", [c, "heads_shape"], [f"{c}4"], name=f"{c}_heads") for c in ("q", "k", "v")),
             n("Transpose", ["q4"], ["qh"], name="q_t", perm=[0, 2, 1, 3]),
             n("Transpose", ["k4"], ["kt"], name="k_t", perm=[0, 2, 3, 1]),
             n("Transpose", ["v4"], ["vh"], name="v_t", perm=[0, 2, 1, 3]),
             n("MatMul", ["qh", "kt"], ["s"], name="scores"), n("Mul", ["s", "scale"], ["ss"], name="scaled"),
             n("Softmax", ["ss"], ["p"], name="softmax", axis=-1), n("MatMul", ["p", "vh"], ["o"], name="attend"),
             n("Transpose", ["o"], ["ot"], name="o_t", perm=[0, 2, 1, 3]),
             n("Reshape", ["ot", "flat_shape"], ["oc"], name="o_flat"),
             n("MatMul", ["oc", "Wo"], ["proj"], name="o_proj"), n("Add", ["x", "proj"], ["r1"], name="residual1"),
             n("LayerNormalization", ["r1", "g2", "b2"], ["ln2"], name="ln2", axis=-1),
             n("MatMul", ["ln2", "W1"], ["h1"], name="fc1"), n("Add", ["h1", "c1"], ["h2"], name="fc1_bias"),
             n("Relu", ["h2"], ["h3"], name="act"), n("MatMul", ["h3", "W2"], ["h4"], name="fc2"),
             n("Add", ["r1", "h4"], ["y"], name="residual2")]
    f = TensorProto.FLOAT
    model = make_model(nodes, [tvi("x", f, [1, seq, hidden])], [tvi("y", f, [1, seq, hidden])], inits, name="block")
    checker.check_model(model)
    import onnx

    onnx.save(model, path)


def _final_output(out: Path, name: str, output: str) -> np.ndarray:
    """The model output ``output`` as the last run wrote it: the module's or the partition's that makes it."""
    plan = json.loads((work(out, name) / "full" / "plan.json").read_text())
    parts = [plan["module"]] if plan["mode"] == "module" else plan["partitions"]
    p = next(p for p in parts if output in p["outputs"])
    return np.load(work(out, name) / "full" / "partitions" / p["pid"] / "run" / f"out_{p['outputs'].index(output)}.npy")


def test_transformer_block_random_assignment_module_equals_partitions(tmp_path, capsys):
    model = tmp_path / "block.onnx"
    _transformer_block(model)
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    common = ["--model", model, "--output-dir", out]
    report = json.loads((out / "torq_gen_config_block.json").read_text())
    rng = np.random.default_rng(3)
    assignment = {lid: ("vmvx" if rng.random() < 0.5 else "llvm-cpu") for lid in report["ops"]}
    assert set(assignment.values()) == {"vmvx", "llvm-cpu"}
    for lid, ex in assignment.items():
        assert cli_in_process(capsys, "edit", *common, "--layer", lid, "--executor", ex).returncode == 0

    r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    fm = json.loads((out / "torq_gen_config_block.json").read_text())["full_model"]
    assert fm["mode"] == "module" and fm["status"] == "success", fm["summary"]
    rows = fm["placement"]["layers"]
    assert {lid: row["assigned"] for lid, row in rows.items()} == assignment
    ran = {lid: row["ran_on"] for lid, row in rows.items() if row["status"] != "no kernel"}
    assert ran == {lid: [assignment[lid]] for lid in ran} and fm["placement"]["elsewhere"] == []
    assert all(op.startswith(("Reshape", "Transpose")) for op in set(rows) - set(ran))  # only views make no kernel
    assert fm["placement"]["two_backends"] == {}
    module_y = _final_output(out, "block", "y")

    r = run_cli("run", *common, *KEEP, "--run-mode", "partitions", "-j", "2", "-q")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    fm = json.loads((out / "torq_gen_config_block.json").read_text())["full_model"]
    assert fm["mode"] == "partitions" and fm["status"] == "success" and len(fm["partitions"]) > 2
    partitions_y = _final_output(out, "block", "y")
    assert module_y.shape == partitions_y.shape == (1, 8, 32)
    np.testing.assert_allclose(module_y, partitions_y, rtol=1e-4, atol=1e-4)


def test_an_if_on_another_device_runs_there(tmp_path, capsys):
    """An If assigned to vmvx between llvm-cpu layers: one module (auto), its branches read
    outer values through transfers, so the read-back says the If ran on vmvx; a removed
    module directory is planned and compiled again on the next run."""
    from onnx import checker, helper

    f = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    branch = {name: helper.make_graph([helper.make_node(op, ["r", k], [o])], name, [], [tvi(o, f, [1, 8])],
                                      [numpy_helper.from_array(np.full((1, 8), v, np.float32), k)])
              for name, op, k, v, o in (("then", "Add", "one", 1.0, "t"), ("else", "Mul", "two", 2.0, "e"))}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"), helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("ReduceSum", ["r"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["i"], name="branch", then_branch=branch["then"], else_branch=branch["else"]),
             helper.make_node("Sigmoid", ["i"], ["y"], name="sig")]
    model = make_model(nodes, [tvi("x", f, [1, 8])], [tvi("y", f, [1, 8])],
                       [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
                        numpy_helper.from_array(np.array(0, np.float32), "zero")], name="ifm")
    checker.check_model(model)
    import onnx

    onnx.save(model, tmp_path / "ifm.onnx")
    out = tmp_path / "out"
    common = ["--model", tmp_path / "ifm.onnx", "--output-dir", out]
    r = run_cli("discover", *common, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "torq_gen_config_ifm.json").read_text())
    if_layer = _layer(report, "If")
    assert cli_in_process(capsys, "edit", *common, "--layer", "ALL", "--executor", "llvm-cpu").returncode == 0
    assert cli_in_process(capsys, "edit", *common, "--layer", if_layer, "--executor", "vmvx").returncode == 0
    for attempt in ("first", "after the module directory was removed"):
        r = run_cli("run", *common, *KEEP, "-j", "2", "-q")
        assert r.returncode == 0, (attempt, (r.stdout + r.stderr)[-3000:])
        fm = json.loads((out / "torq_gen_config_ifm.json").read_text())["full_model"]
        assert fm["mode"] == "module" and fm["status"] == "success", (attempt, fm.get("mode_reason"), fm["summary"])
        row = fm["placement"]["layers"][if_layer]
        assert row == {"assigned": "vmvx", "ran_on": ["vmvx"], "status": "as assigned"}, (attempt, row)
        assert fm["placement"]["elsewhere"] == []
        modules = list((work(out, "ifm") / "full" / "partitions").glob("module-*"))
        assert len(modules) == 1
        shutil.rmtree(modules[0])
    assert "placement.json is missing: planning the run again" in r.stdout


def test_the_cli_and_snakemake_forms_share_one_compiled_module(discovered):
    """The CLI runs the workflow in the output directory, `snakemake full_model` from the
    checkout: the plan's and the compile record's relative paths differ between them, and
    each form must still find the module the other compiled (it looked for
    work/<m>/... from the checkout, or a doubled output prefix, found by a fresh-user test)."""
    import os

    from conftest import REPO, run_snakemake

    model, out = discovered
    common = ["--model", model, "--output-dir", out]
    report = _report(out)
    for layer, ex in (("ALL", "llvm-cpu"), (_layer(report, "Relu", 1), "vmvx")):
        assert run_cli("edit", *common, "--layer", layer, "--executor", ex).returncode == 0
    r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    first = _module_compiled(out)
    (work(out) / "full" / "result.json").unlink()  # the Snakemake form runs the module again
    rel = os.path.relpath(out, REPO)  # a relative output_dir, as `snakemake --config output_dir=results/x`
    r = run_snakemake("--cores", "2", "full_model", "--config", f"model={model}", f"output_dir={rel}",
                      "run_mode=module", "keep_work=all")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads((work(out) / "full" / "result.json").read_text())
    assert res["mode"] == "module" and res["status"] == "success", (res.get("verdict"), r.stdout[-1500:])
    assert _module_compiled(out) == first  # the CLI's module, not compiled again
    (work(out) / "full" / "result.json").unlink()  # and back: the CLI runs what the plan of Snakemake names
    r = run_cli("run", *common, *KEEP, "--run-mode", "module", "-j", "2", "-q")
    assert r.returncode == 0 and "is missing" not in r.stdout, (r.stdout + r.stderr)[-2000:]
    fm = _report(out)["full_model"]
    assert fm["mode"] == "module" and fm["status"] == "success" and _module_compiled(out) == first, fm.get("verdict")
