"""End-to-end ``torq-gen-config run`` with the real tools (IREE llvm-cpu and vmvx,
ONNX Runtime): one discovery of light_squeezenet, then full-model runs with a mixed
assignment, reruns, a one-layer change, the compiler JSON alone, and bad input.

Marked ``slow`` (about 4 minutes on 2 cores, most of it the discovery).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, one_line_error, run_cli, run_snakemake, tvi, work
from onnx import numpy_helper

pytestmark = pytest.mark.slow
NAME = "light_squeezenet"


def run_cmd(*args, timeout=900):
    """``torq-gen-config run ... --keep-work all`` (the console script): these tests check
    that a rerun reuses the compiled batches, which the default ``minimal`` removes."""
    return run_cli("run", *args, "--keep-work", "all", timeout=timeout)


def compile_lines(r) -> list[str]:
    return [ln for ln in r.stdout.splitlines() if ln.startswith("compiled partition ")]


def load(out: Path) -> tuple[dict, dict]:
    report = json.loads((out / f"torq_gen_config_{NAME}.json").read_text())
    result = json.loads((work(out) / "full" / "result.json").read_text())
    return report, result


def set_assignment(out: Path, choose) -> None:
    """Edit the report JSON: ``choose(layer_id, op)`` -> executor for every layer."""
    p = out / f"torq_gen_config_{NAME}.json"
    report = json.loads(p.read_text())
    for lid, op in report["ops"].items():
        op["recommended_executor"] = choose(lid, op)
        op["recommendation_source"] = "user"
    p.write_text(json.dumps(report, indent=2))


def mixed(lid, op):
    """Every Conv on vmvx, the first MaxPool on ONNX Runtime, the rest on llvm-cpu."""
    if op["op_type"] == "Conv":
        return "vmvx"
    return "ort" if lid == "MaxPool_r2" else "llvm-cpu"


@pytest.fixture(scope="module")
def discovered(tmp_path_factory, squeezenet_path) -> Path:
    out = tmp_path_factory.mktemp("run") / "sq"
    r = run_cli("discover", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def mixed_run(discovered, squeezenet_path):
    """discover -> view -> edit -> run, as a user does: every Conv on vmvx, MaxPool_r2 on
    ort, the rest on llvm-cpu, set with `torq-gen-config edit`."""
    common = ["--model", squeezenet_path, "--output-dir", discovered]
    r = run_cli("view", *common)
    assert r.returncode == 0 and "light_squeezenet" in r.stdout, r.stderr
    for layer, executor in (("ALL", "llvm-cpu"), ("Conv_*", "vmvx"), ("MaxPool_r2", "ort")):
        r = run_cli("edit", *common, "--layer", layer, "--executor", executor)
        assert r.returncode == 0, r.stderr
    report = json.loads((discovered / f"torq_gen_config_{NAME}.json").read_text())
    assert {lid: op["recommended_executor"] for lid, op in report["ops"].items()} == \
        {lid: mixed(lid, op) for lid, op in report["ops"].items()}
    r = run_cmd(*common, "-j", "2", "-q")
    return discovered, r


@pytest.fixture
def mixed_copy(mixed_run, tmp_path):
    """A copy of the mixed run's output directory (mtimes kept, so nothing is out of date)
    for a test that changes it: each test starts from the same state whatever ran before."""
    out, r = mixed_run
    copy = tmp_path / "sq"
    shutil.copytree(out, copy, symlinks=True)
    return copy, r


def test_mixed_assignment_runs_and_matches(mixed_run):
    out, r = mixed_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report, result = load(out)
    fm = report["full_model"]
    assert fm["status"] == "success" and result["status"] == "success"
    assert fm["metrics"]["num_elements"] == 1000 and fm["num_over_tolerance"] == 0
    assert fm["assignment"]["source"] == "report"
    assert fm["assignment"]["layer_counts"] == {"vmvx": 26, "llvm-cpu": 39, "ort": 1}
    assert fm["assignment"]["layers_without_recommendation"] == []
    parts = fm["partitions"]
    assert fm["num_partitions"] == len(parts) == len(compile_lines(r))
    assert {p["executor"] for p in parts} == {"vmvx", "llvm-cpu", "ort"}
    ort_parts = [p for p in parts if p["executor"] == "ort"]
    assert len(ort_parts) == 1 and ort_parts[0]["layer_ids"] == ["MaxPool_r2"]
    # consecutive partitions differ in executor, node ranges tile the non-constant nodes
    assert all(a["executor"] != b["executor"] for a, b in zip(parts, parts[1:]))
    assert all(a["last_node"] < b["first_node"] for a, b in zip(parts, parts[1:]))
    assert sum(len(p["layer_ids"]) for p in parts) == 66
    assert all(p["compile_ms"] > 0 and p["run_ms"] > 0 for p in parts)
    assert all(p["partition_check"]["status"] == "success" for p in parts)
    assert fm["timing"]["compile_ms_total"] > 0 and fm["timing"]["run_ms_total"] > 0
    text = report["final_report_text"]
    assert text.startswith("=" * 72) and "Per-Layer Status:" in text
    assert text.count("--- Full Model Comparison ---") == 1 and "Status: success" in text
    assert "--- Full Model Comparison ---" in r.stdout and "Max relative difference" in r.stdout
    # the compiler JSON was regenerated from the edited report
    compiler = json.loads((out / f"torq_gen_config_{NAME}_compiler.json").read_text())
    by_loc = {op["mlir_location"]: op["recommended_executor"] for op in report["ops"].values()}
    assert {k: v["executor"] for k, v in compiler["op_assignments"].items()} == by_loc
    # the run's reference is the full prepared model's, with the layer-test input settings
    import torq_gen_config.reference as ref

    inputs, outputs, meta = ref.load_reference(work(out) / "full" / "reference.npz")
    prepared = onnx.load(work(out) / "prepared.onnx")
    expect = ref.make_inputs(prepared, {"seed": 1234})
    assert list(inputs) == list(expect) and all(np.array_equal(inputs[k], expect[k]) for k in expect)
    assert meta["graph_optimization_level"] == "disabled" and list(outputs) == ["softmaxout_1"]


def test_rerun_with_unchanged_assignment_runs_no_job(mixed_run, squeezenet_path):
    out, _ = mixed_run
    before = (work(out) / "full" / "result.json").stat().st_mtime_ns
    r = run_cmd("--model", squeezenet_path, "--output-dir", out, "-j", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Nothing to be done" in r.stdout + r.stderr
    assert compile_lines(r) == []
    assert (work(out) / "full" / "result.json").stat().st_mtime_ns == before
    report, _ = load(out)
    assert report["final_report_text"].count("--- Full Model Comparison ---") == 1


def test_one_layer_change_recompiles_only_the_partitions_it_touches(mixed_copy, squeezenet_path):
    out, _ = mixed_copy
    _, before = load(out)
    old = {p["pid"]: p for p in before["partitions"]}
    parts_dir = work(out) / "full" / "partitions"
    mtimes = {pid: (parts_dir / pid / "compiled.json").stat().st_mtime_ns for pid in old}
    # Relu_r4 sits between two vmvx Convs: its move to vmvx merges three partitions into one
    set_assignment(out, lambda lid, op: "vmvx" if lid == "Relu_r4" else mixed(lid, op))
    r = run_cmd("--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report, after = load(out)
    assert after["status"] == "success"
    assert after["num_partitions"] == before["num_partitions"] - 2
    new = [p for p in after["partitions"] if p["pid"] not in old]
    assert len(new) == 1 and new[0]["layer_ids"] == ["Conv_r3", "Relu_r4", "Conv_r5"]
    assert [ln.split()[2].rstrip(":") for ln in compile_lines(r)] == [new[0]["pid"]]
    for p in after["partitions"]:
        if p["pid"] in old:
            assert (parts_dir / p["pid"] / "compiled.json").stat().st_mtime_ns == mtimes[p["pid"]]
    # partitions that are not in the plan any more are removed
    assert sorted(d.name for d in parts_dir.iterdir()) == sorted(p["pid"] for p in after["partitions"])


def test_an_edit_after_the_run_marks_the_full_model_result_out_of_date(mixed_copy, squeezenet_path):
    """The full-model section belongs to the assignment it ran: an edit that moves a layer
    it placed marks it out of date (JSON and text), an edit back clears the mark."""
    out, _ = mixed_copy
    common = ["--model", squeezenet_path, "--output-dir", out]
    report, _ = load(out)
    assert "stale" not in report["full_model"]
    assert report["full_model"]["assignment"]["layer_executors"]["Relu_r4"] == "llvm-cpu"
    r = run_cli("edit", *common, "--layer", "Relu_r4", "--executor", "vmvx")
    assert r.returncode == 0, r.stderr
    report, _ = load(out)
    stale = report["full_model"]["stale"]
    assert "Relu_r4 (llvm-cpu -> vmvx)" in stale and "torq-gen-config run" in stale
    assert f"OUT OF DATE: {stale}" in report["final_report_text"]
    r = run_cli("edit", *common, "--layer", "Relu_r4", "--executor", "llvm-cpu")
    assert r.returncode == 0, r.stderr
    report, _ = load(out)
    assert "stale" not in report["full_model"] and "OUT OF DATE" not in report["final_report_text"]


def test_run_with_only_the_compiler_json(mixed_copy, squeezenet_path, tmp_path):
    out, _ = mixed_copy
    report_path = out / f"torq_gen_config_{NAME}.json"
    saved = tmp_path / report_path.name
    shutil.move(report_path, saved)
    try:
        r = run_cmd("--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert not report_path.exists()  # neither rerun discovery nor made up a report
        result = json.loads((work(out) / "full" / "result.json").read_text())
        assert result["status"] == "success" and result["source"] == "compiler_json"
        assert result["source_file"] == f"torq_gen_config_{NAME}_compiler.json"
        assert compile_lines(r) == []  # the same assignment: every partition was compiled already
        assert "no report JSON" in r.stdout
    finally:
        shutil.move(saved, report_path)


def test_neither_json_is_a_clear_error(tmp_path, squeezenet_path):
    r = run_cmd("--model", squeezenet_path, "--output-dir", tmp_path / "empty")
    assert r.returncode == 2
    assert r.stderr.startswith("torq-gen-config: error: no report JSON")
    assert "torq-gen-config discover" in r.stderr and r.stdout == ""


def test_unknown_executor_is_bad_input(mixed_copy, squeezenet_path):
    out, _ = mixed_copy
    p = out / f"torq_gen_config_{NAME}.json"
    saved = p.read_text()
    try:
        set_assignment(out, lambda lid, op: "gpu" if lid == "Conv_r0" else mixed(lid, op))
        r = run_cmd("--model", squeezenet_path, "--output-dir", out)
        assert r.returncode == 2 and "'gpu'" in one_line_error(r) and "not configured" in one_line_error(r)
    finally:
        p.write_text(saved)


def test_failing_partition_exits_1_with_the_stage(mixed_copy, squeezenet_path, tmp_path):
    """Runs last among the squeezenet tests: a compile option every iree partition rejects."""
    out, _ = mixed_copy
    r = run_cmd("--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q",
                "--compiler-option=--no-such-iree-flag", "--debug-ir", tmp_path / "ir")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    report, result = load(out)
    assert result["status"] == "error" and result["failure"]["stage"] == "compile"
    assert "--no-such-iree-flag" in result["failure"]["message"]
    assert report["full_model"]["status"] == "error"
    assert report["full_model"]["options"]["compiler_options"] == ["--no-such-iree-flag"]
    assert report["full_model"]["options"]["debug_ir"] == str(tmp_path / "ir")
    assert "Status: error" in report["final_report_text"]
    plan = json.loads((work(out) / "full" / "plan.json").read_text())
    p0 = next(p for p in plan["partitions"] if p["backend"] == "iree")
    assert f"--dump-compilation-phases-to={tmp_path / 'ir' / p0['pid']}" in p0["compile_def"]["options"]["compile_flags"]


def small_cnn(path: Path) -> Path:
    w = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.05, np.float32), "w")
    c = numpy_helper.from_array(np.full((1, 4, 4, 4), 0.5, np.float32), "c")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Add", ["pool", "c"], ["y"], name="add"),
    ]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 4, 4])], [w, c])
    onnx.save(m, path)
    return path


def test_snakemake_form_full_model_target(tmp_path):
    """`snakemake full_model`: discovery, then the full model from the report; an edit
    of a recommendation in the report reruns the assignment and the run, nothing else."""
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "cnn"
    cfg = ["--config", f"model={model}", f"output_dir={out}", "run_mode=partitions"]  # (module mode: test_run_module_e2e)
    r = run_snakemake("--cores", "2", "full_model", *cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((work(out) / "full" / "result.json").read_text())
    assert result["status"] == "success" and result["source"] == "report" and result["num_partitions"] == 1
    r = run_snakemake("--cores", "2", "-n", "full_model", *cfg)
    assert "Nothing to be done" in r.stdout + r.stderr, r.stdout[-2000:]
    rp = out / "torq_gen_config_cnn.json"
    report = json.loads(rp.read_text())
    report["ops"]["Relu_relu"]["recommended_executor"] = "vmvx"
    rp.write_text(json.dumps(report, indent=2))
    r = run_snakemake("--cores", "2", "full_model", *cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "test_layer" not in r.stdout + r.stderr
    result = json.loads((work(out) / "full" / "result.json").read_text())
    assert result["status"] == "success" and result["num_partitions"] == 3
    assert [p["executor"] for p in result["partitions"]] == ["llvm-cpu", "vmvx", "llvm-cpu"]


def test_run_is_judged_against_the_spec_where_onnx_runtime_fails(tmp_path):
    # ONNX Runtime has no uint16 Min/Max kernels ("Could not find an implementation for
    # Min(13)"): the layers and the whole run are judged against onnx's reference
    # implementation, and say so; the spec's outputs are numpy's min/max
    nodes = [helper.make_node("Min", ["a", "b"], ["m"]), helper.make_node("Max", ["m", "b"], ["y"])]
    model = make_model(nodes, [tvi("a", TensorProto.UINT16, [4, 5]), tvi("b", TensorProto.UINT16, [4, 5])],
                       [tvi("y", TensorProto.UINT16, [4, 5])])
    path = tmp_path / "minmax.onnx"
    onnx.save(model, path)
    out = tmp_path / "o"
    r = run_cli("discover", "--model", path, "--output-dir", out, "-j", "2", "-q", "--skip-executors", "vmvx")
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cmd("--model", path, "--output-dir", out, "-q", "--run-mode", "partitions")  # the partition check below
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Judged against: reference: onnx (ONNX Runtime failed: " in r.stdout
    result = json.loads((work(out) / "full" / "result.json").read_text())
    assert result["status"] == "success" and result["reference"]["used"] == "onnx"
    assert "Could not find an implementation for Min(13)" in result["reference"]["fallback"]
    check = result["partitions"][0]["partition_check"]
    assert check["status"] == "success" and "reference: onnx (ONNX Runtime failed" in check["summary"]
    from torq_gen_config.reference import load_reference

    inputs, outputs, meta = load_reference(work(out) / "full" / "reference.npz")
    assert meta["status"] == "error" and meta["second"]["status"] == "ok"
    np.testing.assert_array_equal(meta["second_outputs"]["y"], np.maximum(np.minimum(inputs["a"], inputs["b"]),
                                                                          inputs["b"]))
    report = json.loads((out / "torq_gen_config_minmax.json").read_text())
    assert report["full_model"]["reference"]["fallback"] == result["reference"]["fallback"]
