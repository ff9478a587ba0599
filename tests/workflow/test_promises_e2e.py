"""README promises that had no test of their own, with exact expectations.

* the default run (onnx's light_squeezenet, the default executors): every one of the
  198 (layer, executor) verdicts is ``success`` and llvm-cpu (first in priority) is
  recommended for all 66 layers;
* the Snakemake form writes to ``results/<model>/`` when no ``output_dir`` is given;
* ``run`` exits 1 on a difference (here: the report's tolerance set to 1e-12);
* a change to one executor's options reruns only that executor's jobs (the same
  executors with their keys in another order rerun nothing), and ``--runtime-option``
  only those of the iree executors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import yaml

from conftest import REPO, TensorProto, helper, run_cli, run_snakemake, work
from test_output_schemas import small_cnn

pytestmark = pytest.mark.slow
EXECUTORS = ["llvm-cpu", "vmvx", "ort"]


def ok(r) -> None:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def retested(stdout: str) -> list[str]:
    """The executors of the ``[executor] layer: status`` lines of a discover run, sorted."""
    return sorted(ln.split("]")[0][1:] for ln in stdout.splitlines() if ln.startswith("[") and "] " in ln)


def test_default_squeezenet_run_is_all_success_on_llvm_cpu(squeezenet_discovery):
    out, r = squeezenet_discovery  # discover --model light_squeezenet -j 2 -q (conftest: one run, read only)
    ok(r)
    report = json.loads((out / "torq_gen_config_light_squeezenet.json").read_text())
    statuses = [e["status"] for op in report["ops"].values() for e in op["executors"].values()]
    assert len(report["ops"]) == 66 and len(statuses) == 198
    assert statuses == ["success"] * 198, sorted(set(statuses))
    assert [op["recommended_executor"] for op in report["ops"].values()] == ["llvm-cpu"] * 66
    summary = report["discovery_report"]["summary"]
    assert report["has_critical_failures"] is False and report["discovery_report"]["critical_failures"] == []
    assert summary["distinct_layers_tested"] == 66
    compiler = json.loads((out / "torq_gen_config_light_squeezenet_compiler.json").read_text())
    assert len(compiler["op_assignments"]) == 66
    assert {a["executor"] for a in compiler["op_assignments"].values()} == {"llvm-cpu"}


def test_snakemake_form_writes_to_results_model_by_default(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("Snakefile", "rules", "config", "profiles", "scripts"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, checkout / name)
    model = small_cnn(checkout / "cnn.onnx")
    ok(run_snakemake("--cores", "2", "--config", f"model={model.name}", cwd=checkout))
    out = checkout / "results" / "cnn"
    report = json.loads((out / "torq_gen_config_cnn.json").read_text())
    assert (out / "torq_gen_config_cnn_compiler.json").is_file()
    assert sorted(report["ops"]) == ["Conv_c", "MaxPool_y", "Relu_r"]
    assert (work(out, "cnn") / "layers" / "Conv_c" / "ort" / "result.json").is_file()
    assert not list(checkout.glob("torq_gen_config_*.json"))  # not in the working directory


def test_run_exits_1_on_a_difference(tmp_path):
    """Elementwise math (Tanh, Exp): ONNX Runtime with its graph optimizations computes what
    the reference does, so the full-model tolerance is not widened (the rule of
    compare/tolerance.py); llvm-cpu's approximations are a few ulp off: a difference at 1e-12."""
    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Exp", ["t"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])])
    model = tmp_path / "tanh_exp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    out = tmp_path / "out"
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q"))
    ok(run_cli("edit", "--model", model, "--output-dir", out, "--layer", "ALL", "--executor", "llvm-cpu"))
    ok(run_cli("run", "--model", model, "--output-dir", out, "-q"))  # within tolerance: 0
    path = out / "torq_gen_config_tanh_exp.json"
    report = json.loads(path.read_text())
    assert report["full_model"]["status"] == "success" and not report["full_model"].get("tolerance_widened")
    report["default_tolerance"] = {k: 1e-12 for k in report["default_tolerance"]}  # llvm-cpu is not bit-exact here
    path.write_text(json.dumps(report))
    r = run_cli("run", "--model", model, "--output-dir", out, "-q")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Status: difference" in r.stdout
    assert "within tolerance" not in r.stdout  # the job's line is judged with the same tolerance
    report = json.loads(path.read_text())
    assert report["full_model"]["status"] == "difference" and report["full_model"]["num_over_tolerance"] > 0
    assert json.loads((work(out) / "full" / "result.json").read_text())["status"] == "success"  # stored metrics kept


def test_one_executor_option_change_reruns_only_that_executor(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q"))
    results = {p: p.stat().st_mtime_ns for p in (work(out) / "layers").glob("*/*/result.json")}
    assert len(results) == 9
    executors = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["executors"]
    assert [e["name"] for e in executors] == EXECUTORS
    # the same executors with their keys in another (sorted) order: nothing reruns
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump({"executors": executors}, sort_keys=True))
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--config-file", same)
    ok(r)
    assert retested(r.stdout) == [], r.stdout
    # the default executors with one run flag more on vmvx (iree-run-module's own default value)
    for e in executors:
        if e["name"] == "vmvx":
            e["options"]["run_flags"] = list(e["options"].get("run_flags") or []) + ["--print_statistics=false"]
    cfg = tmp_path / "vmvx.yaml"
    cfg.write_text(yaml.safe_dump({"executors": executors}, sort_keys=True))
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--config-file", cfg)
    ok(r)
    assert retested(r.stdout) == ["vmvx"] * 3, r.stdout
    changed = sorted(p.parent.name for p, m in results.items() if p.stat().st_mtime_ns != m)
    assert changed == ["vmvx"] * 3
    # --runtime-option goes to the iree executors only: ort keeps its verdicts
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--config-file", cfg,
                "--runtime-option=--print_statistics=false")
    ok(r)
    assert retested(r.stdout) == ["llvm-cpu"] * 3 + ["vmvx"] * 3, r.stdout
    report = json.loads((out / "torq_gen_config_cnn.json").read_text())
    assert report["provenance"]["options"]["runtime_options"] == ["--print_statistics=false"]
    assert all(e["status"] == "success" for op in report["ops"].values() for e in op["executors"].values())


def test_retarget_one_deleted_result_after_double_dash(tmp_path):
    """README: a deleted layer result is redone by naming its file after ``--`` (the
    profile's list-valued flags must not swallow the target); only that job runs."""
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q"))
    target = work(out) / "layers" / "Conv_c" / "vmvx" / "result.json"
    before = {p: p.stat().st_mtime_ns for p in (work(out) / "layers").glob("*/*/result.json") if p != target}
    target.unlink()
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "1", "-q", "--",
                str(target.relative_to(out)))
    ok(r)
    assert retested(r.stdout) == ["vmvx"], r.stdout
    assert json.loads(target.read_text())["status"] == "success"
    assert all(p.stat().st_mtime_ns == m for p, m in before.items())


def test_edit_choices_survive_a_real_discover_and_reset_drops_them(tmp_path):
    """README (Review and edit): a person's choice is kept by the next `discover`, which
    rebuilds the report from the layer results and user_choices.json; `edit --reset`
    drops it and the next `discover` gives discovery's recommendation again."""
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q"))
    report_path = out / "torq_gen_config_cnn.json"
    before = json.loads(report_path.read_text())["ops"]
    layer = next(iter(before))
    assert before[layer]["recommended_executor"] == "llvm-cpu"
    ok(run_cli("edit", "--model", model, "--output-dir", out, "--layer", layer, "--executor", "ort"))
    # a later discovery with another tolerance rebuilds the report: the choice stays
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-q", "--tolerance-avg", "0.02"))
    after = json.loads(report_path.read_text())
    assert after["default_tolerance"]["fp_avg_tol"] == 0.02
    assert after["ops"][layer]["recommended_executor"] == "ort"
    assert after["ops"][layer]["recommendation_source"] == "user"
    compiler = json.loads((out / "torq_gen_config_cnn_compiler.json").read_text())
    assert compiler["op_assignments"][after["ops"][layer]["mlir_location"]]["executor"] == "ort"
    # --reset, then discovery again: discovery's recommendation is back
    ok(run_cli("edit", "--model", model, "--output-dir", out, "--layer", layer, "--reset"))
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-q"))
    final = json.loads(report_path.read_text())["ops"][layer]
    assert final["recommended_executor"] == "llvm-cpu" and final.get("recommendation_source") != "user"
