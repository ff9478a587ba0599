"""Full-model run with the TORQ backend (``torq-gen-config run`` with torq executors).

A torq assignment is not cut into partitions: ``work/full.mlir`` is compiled ONCE by
``torq-compile ... --torq-executor-map=<executor map>`` (keys ``line:col`` in that file)
and run once by ``torq-run-module``. The TORQ tools are the TEST FIXTURES of
``tests/fixtures/fake_torq`` (they record their argv in ``$FAKE_TORQ_LOG`` and hand the
work to IREE's llvm-cpu compiler and runtime), as in ``tests/unit/backends/test_torq_backend.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from conftest import (FAKE_COMPILE, FAKE_DIR, FAKE_RUN, REPO, TORQ_VARS, VENV_BIN, TensorProto,  # noqa: F401
                      helper, make_model, run_cli, tvi, work)
from onnx import numpy_helper

from torq_gen_config.core.errors import ConfigError
from torq_gen_config.backends.torq.whole_model import TORQ_MAP_FILE
from torq_gen_config.fullrun.compile import compile_partition
from torq_gen_config.fullrun.execute import run_partitions
from torq_gen_config.fullrun.plan import make_plan
from torq_gen_config.fullrun.report_section import full_model_section, render_full_model_text
from torq_gen_config.fullrun.selection import (
    assignment_mode,
    check_selection,
    make_assignment,
    selection_from_compiler_json,
    selection_from_report,
)
from torq_gen_config.mlir.importer import import_full_model, layer_location
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.split import split_layers
from torq_gen_config.reference import compute_reference

TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
TORQ = [{"name": n, "backend": "torq", "options": {"executor": n, "torq_hw": "default", "torq_hw_type": "sim"}}
        for n in ("nss", "css", "host")]
ORT = {"name": "ort", "backend": "onnxruntime", "options": {"providers": ["CPUExecutionProvider"]}}


# ------------------------------------------------------------------- helpers


def _clear_torq_env(monkeypatch):
    for var in TORQ_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake_torq(monkeypatch, tmp_path) -> Path:
    """The fake TORQ tools through TORQ_TOOL_PATH; returns the argv log file."""
    _clear_torq_env(monkeypatch)
    log = tmp_path / "fake_torq_log.jsonl"
    monkeypatch.setenv("TORQ_TOOL_PATH", str(FAKE_DIR))
    monkeypatch.setenv("FAKE_TORQ_LOG", str(log))
    monkeypatch.setenv("PATH", VENV_BIN + os.pathsep + os.environ.get("PATH", ""))  # python3 of the fixtures
    return log


def no_torq_tools(monkeypatch, tmp_path):
    """No TORQ tool anywhere the lookup searches (skips where a real one is installed)."""
    if importlib.util.find_spec("torq") is not None:
        pytest.skip("a torq package is installed: its tools would be found")
    if (REPO.parent / "iree-build" / "tools" / "torq-compile").exists():
        pytest.skip("a sibling build tree has torq-compile")
    _clear_torq_env(monkeypatch)
    path = os.pathsep.join([VENV_BIN, "/usr/bin", "/bin"])
    if shutil.which("torq-compile", path=path):
        pytest.skip("torq-compile is on PATH")
    monkeypatch.setenv("PATH", path)


def read_log(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def compiles(log: Path) -> list[dict]:
    return [r for r in read_log(log) if r["tool"] == "torq-compile" and r["argv"][1:] != ["--version"]]


def four_layer_model(path: Path) -> Path:
    """Conv -> Relu -> Sigmoid -> Add(relu, sigmoid): 4 layers, one skip connection."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.uniform(-0.3, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.full((4,), 0.1, np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv_out"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["conv_out"], ["relu_out"], name="relu"),
        helper.make_node("Sigmoid", ["relu_out"], ["sig_out"], name="sig"),
        helper.make_node("Add", ["relu_out", "sig_out"], ["y"], name="add"),
    ]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                   [w, b])
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def prep(tmp_path_factory):
    """The prepared 4-layer model, its manifest, full.mlir and locations, and the reference."""
    d = tmp_path_factory.mktemp("torq_full")
    model, info = prepare_model(four_layer_model(d / "m4.onnx"))
    man = split_layers(model, info, d / "layers")
    onnx.save(model, d / "prepared.onnx")
    locations = import_full_model(d / "prepared.onnx", d / "full.mlir")
    assert locations["status"] == "ok", locations
    compute_reference(d / "prepared.onnx", d / "reference.npz", {"seed": 5})
    return {"dir": d, "model": model, "man": man, "locations": locations, "mlir": str(d / "full.mlir"),
            "ids": [l["layer_id"] for l in man["layers"]], "reference": str(d / "reference.npz")}


def report_for(prep, executors: dict) -> dict:
    ops = {lid: {"recommended_executor": executors.get(lid), "executors": {}} for lid in prep["ids"]}
    return {"model_name": "m4", "ops": ops}


def plan_for(prep, parts: Path, executors: dict, config=TORQ, **kw) -> dict:
    a = make_assignment(selection_from_report(report_for(prep, executors), source_file="r.json"))
    return make_plan(prep["model"], prep["man"], prep["locations"], a, config, parts, full_mlir=prep["mlir"], **kw)


def loc_of(prep, lid: str) -> str:
    layer = next(l for l in prep["man"]["layers"] if l["layer_id"] == lid)
    return layer_location(layer, prep["locations"])


def compile_and_run(plan: dict, parts: Path, prep) -> tuple[dict, dict]:
    p = plan["partitions"][0]
    c = compile_partition(pid=p["pid"], model_path=p["model"], executor=p["compile_def"],
                          work_dir=str(parts / p["pid"]), timeout_s=300, log_path=str(parts / "compile.log"))
    res = run_partitions(plan, reference_npz=prep["reference"], compiled={p["pid"]: c}, tolerance=TOL, timeout_s=300,
                         partitions_dir=parts)
    return c, res


# ---------------------------------------------------------------- mode


def test_mode_torq_partitions_and_mixed(prep):
    ids = prep["ids"]
    sel = selection_from_report(report_for(prep, {ids[0]: "nss", ids[1]: "host"}), source_file="r.json")
    assert check_selection(sel, TORQ) == "torq"
    assert check_selection(sel, [ORT, *TORQ]) == "torq"  # only the assigned executors count
    sel = selection_from_report(report_for(prep, {ids[0]: "ort"}))
    assert check_selection(sel, [*TORQ, ORT]) == "partitions"
    # nothing assigned: the first configured executor decides
    sel = selection_from_report(report_for(prep, {}))
    assert assignment_mode(sel, TORQ) == "torq" and assignment_mode(sel, [ORT, *TORQ]) == "partitions"
    # torq and non-torq in one assignment: a clear error (exit status 2 in the CLI)
    sel = selection_from_report(report_for(prep, {ids[0]: "nss", ids[1]: "ort", ids[2]: "css"}), source_file="r.json")
    with pytest.raises(ConfigError, match=r"r\.json mixes executors of the torq backend \[nss \(torq: 1 layer\(s\), "
                                          r"e\.g\. Conv_conv_out\), css .*\] with other executors \[ort "
                                          r"\(onnxruntime: 1 layer\(s\), e\.g\. Relu_relu_out\)\]"):
        check_selection(sel, [*TORQ, ORT])
    # also for a compiler JSON
    sel = selection_from_compiler_json({"op_assignments": {"5:10": {"executor": "nss"}, "6:10": {"executor": "ort"}}})
    with pytest.raises(ConfigError, match="mixes executors of the torq backend"):
        check_selection(sel, [*TORQ, ORT])


# ---------------------------------------------------------------- plan


def test_torq_plan_is_one_whole_model_partition_with_an_executor_map(prep, tmp_path):
    ids = prep["ids"]
    parts = tmp_path / "parts"
    choice = {ids[0]: "nss", ids[1]: "css", ids[3]: "host"}  # ids[2]: null
    plan = plan_for(prep, parts, choice)
    assert plan["mode"] == "torq" and plan["num_partitions"] == 1 and plan["torq_executors"] == ["nss", "css", "host"]
    p = plan["partitions"][0]
    assert p["pid"].startswith("torq-") and p["whole_model_torq"] and p["layer_ids"] == ids
    assert p["compile_def"]["whole_model_torq"]["mlir"] == prep["mlir"]
    assert p["inputs"] == ["x"] and p["outputs"] == ["y"]
    assert plan["executor_map"] == p["model"] == str(parts / p["pid"] / TORQ_MAP_FILE)
    doc = json.loads(Path(plan["executor_map"]).read_text())
    assert doc == {"op_assignments": {loc_of(prep, ids[0]): {"executor": "nss"},
                                      loc_of(prep, ids[1]): {"executor": "css"},
                                      loc_of(prep, ids[3]): {"executor": "host"}}, "model_name": "m4"}
    # the null layer is not in the map: the compiler places it; listed like a fallback
    assert plan["fallbacks"] == [{"layer_id": ids[2], "executor": None,
                                  "reason": "no recommendation (not tested); not in the executor map: "
                                            "torq-compile places it"}]
    assert plan["layer_executors"] == choice
    # unchanged assignment: same pid, map untouched; a change: a new pid, the old directory pruned
    mtime = Path(plan["executor_map"]).stat().st_mtime_ns
    assert plan_for(prep, parts, choice)["partitions"][0]["pid"] == p["pid"]
    assert Path(plan["executor_map"]).stat().st_mtime_ns == mtime
    plan2 = plan_for(prep, parts, {**choice, ids[2]: "css"})
    assert plan2["partitions"][0]["pid"] != p["pid"] and plan2["fallbacks"] == []
    assert sorted(d.name for d in parts.iterdir()) == [plan2["partitions"][0]["pid"]]
    # runtime options do not change the pid, compiler options do
    assert plan_for(prep, parts, choice, runtime_options=["--print_statistics"])["partitions"][0]["pid"] == p["pid"]
    assert plan_for(prep, parts, choice, compiler_options=["--iree-opt-level=O1"])["partitions"][0]["pid"] != p["pid"]


def test_map_uses_the_torq_executor_option_and_options_must_agree(prep, tmp_path):
    ids = prep["ids"]
    npu = [{"name": "npu-a", "backend": "torq", "options": {"executor": "nss"}},
           {"name": "cpu-b", "backend": "torq", "options": {"executor": "host"}}]
    plan = plan_for(prep, tmp_path / "p", {ids[0]: "npu-a", ids[1]: "cpu-b"}, config=npu)
    doc = json.loads(Path(plan["executor_map"]).read_text())
    assert sorted(v["executor"] for v in doc["op_assignments"].values()) == ["host", "nss"]
    differ = [npu[0], {**npu[1], "options": {"executor": "host", "torq_hw": "other"}}]
    with pytest.raises(ConfigError, match="'npu-a' and 'cpu-b' differ in option 'torq_hw'"):
        plan_for(prep, tmp_path / "q", {ids[0]: "npu-a", ids[1]: "cpu-b"}, config=differ)


def test_compiler_json_assignment_builds_the_same_map(prep, tmp_path):
    ids = prep["ids"]
    oa = {loc_of(prep, ids[0]): {"executor": "css"}, loc_of(prep, ids[1]): {"executor": None}, "999:1": {"executor": "nss"}}
    a = make_assignment(selection_from_compiler_json({"op_assignments": oa, "model_name": "m4"}, source_file="c.json"))
    plan = make_plan(prep["model"], prep["man"], prep["locations"], a, TORQ, tmp_path / "p", full_mlir=prep["mlir"])
    doc = json.loads(Path(plan["executor_map"]).read_text())
    assert doc["op_assignments"] == {loc_of(prep, ids[0]): {"executor": "css"}}
    assert [f["layer_id"] for f in plan["fallbacks"]] == ids[1:]
    assert any("999:1" in w for w in plan["warnings"])


# ---------------------------------------------------------------- compile and run


def test_whole_model_compile_and_run_through_the_fakes(fake_torq, prep, tmp_path):
    ids = prep["ids"]
    parts = tmp_path / "parts"
    plan = plan_for(prep, parts, {ids[0]: "nss", ids[1]: "css", ids[3]: "host"})
    c, res = compile_and_run(plan, parts, prep)
    pid = plan["partitions"][0]["pid"]
    assert c["status"] == "ok", c["failure"]
    vmfb = str(parts / pid / "module.vmfb")
    expected = [FAKE_COMPILE, prep["mlir"], "-o", vmfb, "--torq-hw=default", "--torq-target-host-triple=native",
                f"--torq-executor-map={parts / pid / TORQ_MAP_FILE}"]
    assert c["artifact"]["info"]["argv"] == expected
    log = read_log(fake_torq)
    comp = compiles(fake_torq)
    assert len(comp) == 1 and comp[0]["argv"] == expected and comp[0]["forced_executor"] is None
    assert comp[0]["executor_map_assignments"] == 3 and comp[0]["cwd"] == str(parts / pid)
    runs = [r for r in log if r["tool"] == "torq-run-module"]
    run_dir = parts / pid / "run"
    assert len(runs) == 1 and runs[0]["argv"] == [
        FAKE_RUN, f"--module={vmfb}", "--function=g", f"--output=@{run_dir}/outputs/output_0.bin",
        "--torq_hw_type=sim", f"--input=1x3x8x8xf32=@{run_dir}/inputs/input_0.bin"]
    assert res["status"] == "success", res["summary"]
    assert res["mode"] == "torq" and res["num_partitions"] == 1 and res["metrics"]["max_rel_diff"] < 1e-5
    row = res["partitions"][0]
    assert row["status"] == "ran" and row["compile_ms"] > 0 and row["run_ms"] > 0 and row["partition_check"] is None
    assert res["timing"]["compile_ms_total"] == row["compile_ms"] and res["timing"]["run_ms_total"] == row["run_ms"]
    assert res["torq"]["compile_argv"] == expected and res["torq"]["num_map_entries"] == 3
    assert [f["layer_id"] for f in res["fallbacks"]] == [ids[2]]
    json.dumps(res, allow_nan=False)
    section = full_model_section(res, tolerance=TOL, result_file="work/full/result.json")
    assert section["status"] == "success" and section["mode"] == "torq"
    assert section["assignment"]["layer_counts"] == {"nss": 1, "css": 1, "host": 1}
    assert section["assignment"]["layers_without_recommendation"][0]["executor"] is None
    text = render_full_model_text(section)
    assert "one torq-compile with --torq-executor-map (3 line:col entries" in text
    assert f"{ids[2]} -> compiler (no recommendation" in text


def test_missing_tools_give_an_error_result_naming_the_searched_places(monkeypatch, prep, tmp_path):
    no_torq_tools(monkeypatch, tmp_path)
    parts = tmp_path / "parts"
    plan = plan_for(prep, parts, {prep["ids"][0]: "nss"})
    c, res = compile_and_run(plan, parts, prep)
    assert c["status"] == "error" and c["failure"]["stage"] == "compile"
    assert res["status"] == "error" and res["failure"]["stage"] == "compile"
    for part in ("'torq-compile' not found", "$TORQ_COMPILE (unset)", "$TORQ_TOOL_PATH (unset)",
                 "torq/_compiler_libs/torq-compile", "iree-build", "PATH="):
        assert part in res["failure"]["message"], part
    assert res["failure"]["summary"].startswith("whole model on torq (one torq-compile with --torq-executor-map, 4 layers)")
    assert "'torq-compile' not found" in (parts / "compile.log").read_text()


# ---------------------------------------------------------------- torq-gen-config run


def torq_config(tmp_path: Path, executors=None) -> Path:
    cfg = tmp_path / "torq.yaml"
    if executors is None:
        shutil.copy(REPO / "config" / "torq.yaml", cfg)
    else:
        raw = yaml.safe_load((REPO / "config" / "torq.yaml").read_text())
        raw["executors"] = executors
        cfg.write_text(yaml.safe_dump(raw))
    return cfg


@pytest.mark.slow
def test_run_cli_compiles_the_whole_model_once(fake_torq, tmp_path):
    model = four_layer_model(tmp_path / "m4.onnx")
    out = tmp_path / "out"
    cfg = torq_config(tmp_path)
    r = run_cli("discover", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report_path, compiler_path = out / "torq_gen_config_m4.json", out / "torq_gen_config_m4_compiler.json"
    report = json.loads(report_path.read_text())
    assert {op["recommended_executor"] for op in report["ops"].values()} == {"nss"}
    n_log = len(read_log(fake_torq))

    r = run_cli("run", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    new = read_log(fake_torq)[n_log:]
    comp = [x for x in new if x["tool"] == "torq-compile" and x["argv"][1:] != ["--version"]]
    runs = [x for x in new if x["tool"] == "torq-run-module"]
    assert len(comp) == 1 and len(runs) == 1
    plan = json.loads((work(out) / "full" / "plan.json").read_text())
    pid = plan["partitions"][0]["pid"]
    map_path = work(out) / "full" / "partitions" / pid / TORQ_MAP_FILE
    argv = comp[0]["argv"]
    assert argv[1] == str(work(out) / "full.mlir") and argv[-1] == f"--torq-executor-map={map_path}"
    assert argv == [FAKE_COMPILE, str(work(out) / "full.mlir"), "-o", str(map_path.parent / "module.vmfb"),
                    "--torq-hw=default", "--torq-target-host-triple=native", f"--torq-executor-map={map_path}"]
    # the map is the compiler JSON (same line:col keys, executors), which is keyed to the report's mlir_file
    assert json.loads(map_path.read_text())["op_assignments"] == json.loads(compiler_path.read_text())["op_assignments"]
    report = json.loads(report_path.read_text())
    assert report["mlir_file"].endswith("full.mlir")
    fm = report["full_model"]
    assert fm["status"] == "success", fm["summary"]
    assert fm["mode"] == "torq" and fm["num_partitions"] == 1 and fm["assignment"]["layer_counts"] == {"nss": 4}
    assert fm["torq"]["num_map_entries"] == 4 and fm["result_file"] == "work/m4/full/result.json"
    assert "--- Full Model Comparison ---" in report["final_report_text"]
    assert "Executor map:" in r.stdout and "Status: success" in r.stdout

    # a rerun with the same assignment runs nothing
    result_file = work(out) / "full" / "result.json"
    mtime = result_file.stat().st_mtime_ns
    n_log = len(read_log(fake_torq))
    r = run_cli("run", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(read_log(fake_torq)) == n_log and result_file.stat().st_mtime_ns == mtime

    # an assignment change (one layer to css, one to null) recompiles once
    report = json.loads(report_path.read_text())
    lids = list(report["ops"])
    report["ops"][lids[1]]["recommended_executor"] = "css"
    report["ops"][lids[2]]["recommended_executor"] = None
    report_path.write_text(json.dumps(report, indent=2))
    r = run_cli("run", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    comp = [x for x in read_log(fake_torq)[n_log:] if x["tool"] == "torq-compile" and x["argv"][1:] != ["--version"]]
    assert len(comp) == 1 and comp[0]["executor_map_assignments"] == 3
    fm = json.loads(report_path.read_text())["full_model"]
    assert fm["status"] == "success" and fm["assignment"]["layer_counts"] == {"nss": 2, "css": 1}
    assert [f["layer_id"] for f in fm["assignment"]["layers_without_recommendation"]] == [lids[2]]
    new_pid = json.loads((work(out) / "full" / "plan.json").read_text())["partitions"][0]["pid"]
    assert new_pid != pid and not (work(out) / "full" / "partitions" / pid).exists()


@pytest.mark.slow
def test_run_cli_without_tools_is_an_error_and_mixing_is_bad_input(monkeypatch, tmp_path):
    no_torq_tools(monkeypatch, tmp_path)
    model = four_layer_model(tmp_path / "m4.onnx")
    out = tmp_path / "out"
    cfg = torq_config(tmp_path)
    r = run_cli("discover", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q")
    # every layer failed to compile: the compiler JSON assigns nothing (exit 3, its error says why)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    # no recommendation: the whole model is left to the compiler
    r = run_cli("run", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    fm = json.loads((out / "torq_gen_config_m4.json").read_text())["full_model"]
    assert fm["status"] == "error" and fm["mode"] == "torq" and fm["failure"]["stage"] == "compile"
    for part in ("'torq-compile' not found", "$TORQ_COMPILE (unset)", "$TORQ_TOOL_PATH (unset)",
                 "torq/_compiler_libs/torq-compile", "PATH="):
        assert part in fm["failure"]["message"], part
    assert len(fm["assignment"]["layers_without_recommendation"]) == 4
    assert "Status: error" in r.stdout and "'torq-compile' not found" in r.stdout

    # torq and non-torq executors in one assignment: exit status 2, nothing runs
    report_path = out / "torq_gen_config_m4.json"
    report = json.loads(report_path.read_text())
    lids = list(report["ops"])
    report["ops"][lids[0]]["recommended_executor"] = "nss"
    report["ops"][lids[1]]["recommended_executor"] = "ort"
    report_path.write_text(json.dumps(report, indent=2))
    mixed = torq_config(tmp_path, [{"name": "nss", "backend": "torq", "options": {"executor": "nss"}},
                                   {"name": "ort", "backend": "onnxruntime"}])
    r = run_cli("run", "--model", model, "--output-dir", out, "--config-file", mixed, "-j", "2", "-q")
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mixes executors of the torq backend [nss (torq: 1 layer(s)" in r.stderr
    assert "with other executors [ort (onnxruntime: 1 layer(s)" in r.stderr
