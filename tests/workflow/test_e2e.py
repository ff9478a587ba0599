"""End-to-end runs of the whole workflow with the real tools (IREE, ONNX Runtime).

Marked ``slow``: they run the Snakemake workflow as a user does, in both forms
(``snakemake`` from the repository root and ``torq-gen-config discover``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import (REPO, TensorProto, cli_in_process, helper, make_model, one_line_error, run_cli, run_snakemake, tvi,
                      work)
from onnx import numpy_helper

from torq_gen_config.mlir.importer import operator_at

pytestmark = pytest.mark.slow
EXECUTORS = ["llvm-cpu", "vmvx", "ort"]


def small_cnn(path: Path, bias: float = 0.1, add: float = 0.5) -> Path:
    """Conv -> Relu -> MaxPool -> Add: 4 layers, compiles in ~1 s per executor."""
    w = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.05, np.float32), "w")
    b = numpy_helper.from_array(np.full((4,), bias, np.float32), "b")
    c = numpy_helper.from_array(np.full((1, 4, 4, 4), add, np.float32), "c")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv/out"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["conv/out"], ["relu"], name="relu"),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Add", ["pool", "c"], ["y"], name="add"),
    ]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 4, 4])], [w, b, c])
    onnx.save(m, path)
    return path


def load_outputs(out: Path, name: str) -> tuple[dict, dict]:
    report = json.loads((out / f"torq_gen_config_{name}.json").read_text())
    compiler = json.loads((out / f"torq_gen_config_{name}_compiler.json").read_text())
    return report, compiler


def check_compiler_keys(out: Path, report: dict, compiler: dict) -> None:
    """Every compiler JSON key is the line:col of a torch.operator of the layer's op type."""
    lines = (out / report["mlir_file"]).read_text().splitlines()
    by_loc = {op["mlir_location"]: (lid, op) for lid, op in report["ops"].items()}
    assert compiler["op_assignments"]
    for loc, assignment in compiler["op_assignments"].items():
        lid, op = by_loc[loc]
        assert operator_at(lines, loc) == f"onnx.{op['op_type']}", (lid, loc)
        assert assignment["executor"] == op["recommended_executor"]


def test_snakemake_form_squeezenet(tmp_path, squeezenet_path):
    out = tmp_path / "sq"
    r = run_snakemake("--cores", "2", "--config", f"model={squeezenet_path}", f"output_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    report, compiler = load_outputs(out, "light_squeezenet")
    assert report["model_name"] == "light_squeezenet"
    assert len(report["ops"]) == 66
    for lid, op in report["ops"].items():
        assert set(op["executors"]) == set(EXECUTORS), lid
        # light_squeezenet is 198/198 success on the three default executors
        assert [e["status"] for e in op["executors"].values()] == ["success"] * 3, lid
        assert op["recommended_executor"] in EXECUTORS, lid
    assert len(compiler["op_assignments"]) == 66
    check_compiler_keys(out, report, compiler)
    prov = report["provenance"]
    assert all(v.count(".") >= 1 and all(x.isdigit() for x in v.split(".")[:2]) for v in prov["versions"].values()), prov["versions"]
    assert prov["reference"]["ort_versions"] == [prov["versions"]["onnxruntime"]]
    assert [e["name"] for e in prov["executors"]] == EXECUTORS

    # nothing changed: nothing to do
    r = run_snakemake("--cores", "2", "-n", "--config", f"model={squeezenet_path}", f"output_dir={out}")
    assert r.returncode == 0 and "Nothing to be done" in (r.stdout + r.stderr), (r.stdout + r.stderr)[-2000:]

    # re-target one (layer, executor): only that job runs
    target = work(out) / "layers" / "Conv_r0" / "vmvx" / "result.json"
    before = json.loads(target.read_text())
    target.unlink()
    r = run_snakemake("--cores", "1", str(target), "--config", f"model={squeezenet_path}", f"output_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert "1 of 1 steps (100%) done" in log, log[-2000:]
    assert json.loads(target.read_text())["status"] == before["status"]


def test_cli_discover_squeezenet(squeezenet_discovery):
    out, r = squeezenet_discovery  # discover --model light_squeezenet -j 2 -q (conftest: one run, read only)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FINAL EXECUTOR DISCOVERY REPORT" in r.stdout
    report, compiler = load_outputs(out, "light_squeezenet")
    assert len(report["ops"]) == 66
    assert all(len(op["executors"]) == 3 for op in report["ops"].values())
    assert report["mlir_file"] == "work/light_squeezenet/full.mlir"
    check_compiler_keys(out, report, compiler)
    assert "steps" in r.stderr  # Snakemake's progress lines


def lppool_model(path: Path) -> Path:
    """Relu -> LpPool -> Relu. IREE 3.13 cannot legalize onnx.LpPool (measured: "failed to
    legalize operation 'torch.operator' that was explicitly marked illegal"); ORT runs it."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu1"),
        helper.make_node("LpPool", ["a"], ["p"], kernel_shape=[2, 2], name="lppool"),
        helper.make_node("Relu", ["p"], ["y"], name="relu2"),
    ]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 2, 4, 4])], [tvi("y", TensorProto.FLOAT, [1, 2, 3, 3])])
    onnx.save(m, path)
    return path


def test_compile_failure_falls_to_next_executor(tmp_path):
    """A layer IREE cannot compile: stage compile with the compiler's message; ORT takes it."""
    model = lppool_model(tmp_path / "failing.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    report, compiler = load_outputs(out, "failing")
    assert list(report["ops"]) == ["Relu_a", "LpPool_p", "Relu_y"]
    op = report["ops"]["LpPool_p"]
    for name in ("llvm-cpu", "vmvx"):
        fr = op["executors"][name]["failure_report"]
        assert op["executors"][name]["status"] == "error"
        assert fr["stage"] == "compile", fr
        assert "failed to legalize operation" in fr["message"] and "onnx.LpPool" in fr["message"]
    assert op["executors"]["ort"]["status"] == "success"
    assert op["recommended_executor"] == "ort"
    assert report["ops"]["Relu_a"]["recommended_executor"] == "llvm-cpu"
    assert report["ops"]["Relu_y"]["recommended_executor"] == "llvm-cpu"
    assert compiler["op_assignments"][op["mlir_location"]] == {"executor": "ort"}
    assert not report["has_critical_failures"]


@pytest.mark.parametrize("kind", ["missing", "text", "tflite", "truncated"])
def test_bad_model_inputs(tmp_path, capsys, squeezenet_path, kind):
    out = tmp_path / "out"
    if kind == "missing":
        model = tmp_path / "nope.onnx"
    elif kind == "text":
        model = tmp_path / "text.onnx"
        model.write_text("hello, I am not a model\n")
    elif kind == "tflite":
        model = tmp_path / "m.tflite"
        model.write_bytes(b"\x1c\x00\x00\x00TFL3" + b"\x00" * 100)
    else:
        model = tmp_path / "trunc.onnx"
        data = squeezenet_path.read_bytes()
        model.write_bytes(data[: len(data) // 2])
    r = cli_in_process(capsys, "discover", "--model", model, "--output-dir", out)  # refused before the workflow
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torq-gen-config: error:"), r.stderr
    assert not list(out.glob("torq_gen_config_*.json"))
    # the Snakemake form fails too, without writing a result
    r = run_snakemake("--cores", "1", "--config", f"model={model}", f"output_dir={out}")
    assert r.returncode == 1 and "Error in file" in r.stderr and model.name in r.stderr, r.stderr[-2000:]
    assert not (out / f"torq_gen_config_{model.stem}.json").exists()


@pytest.mark.parametrize("layer_inputs,change,retested_layer,kept_layer", [
    # generated layer inputs: a change of the Conv's bias changes only the Conv layer
    ("random", {"bias": 0.2}, "Conv_conv/out", "Relu_relu"),
    # propagated inputs (the default): the layers after the Conv see other values too,
    # so change the last layer's constant: only it is retested
    ("propagate", {"add": 0.7}, "Add_y", "Relu_relu"),
])
def test_model_change_reruns_only_affected_layers(tmp_path, layer_inputs, change, retested_layer, kept_layer):
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    cfg = ["--config", f"model={model}", f"output_dir={out}", f"layer_inputs={layer_inputs}"]
    r = run_snakemake("--cores", "2", *cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    kept = work(out) / "layers" / kept_layer / "llvm-cpu" / "result.json"
    kept_mtime = kept.stat().st_mtime_ns
    small_cnn(tmp_path / "cnn.onnx", **change)
    r = run_snakemake("--cores", "2", *cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert kept.stat().st_mtime_ns == kept_mtime, "an unchanged layer was retested"
    report, _ = load_outputs(out, "cnn")
    assert len(report["ops"]) == 4
    # one console line per finished (layer, executor) job: "[executor] layer_id: status ..."
    retested = sorted(ln.split(":")[0] for ln in log.splitlines() if ln.startswith("[") and "] " in ln)
    assert retested == [f"[{e}] {retested_layer}" for e in ("llvm-cpu", "ort", "vmvx")], log[-3000:]


def test_timeout_becomes_error_verdict(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    r = run_snakemake("--cores", "2", "--config", f"model={model}", f"output_dir={out}", "timeout_s=0.001")
    # 3 when ONNX Runtime timed out too on every layer: a compiler JSON assigning nothing is not a success
    assert r.returncode in (0, 3), r.stderr[-3000:]
    report, compiler = load_outputs(out, "cnn")
    for op in report["ops"].values():
        for name in ("llvm-cpu", "vmvx"):
            e = op["executors"][name]
            assert e["status"] == "error" and e["failure_report"]["stage"] == "timeout"


@pytest.mark.parametrize("form,sig", [("cli", signal.SIGKILL), ("snakemake", signal.SIGTERM)])
def test_interrupted_run_resumes(tmp_path, squeezenet_path, form, sig):
    """Kill a run mid-way; the next call resumes and keeps every finished verdict.

    SIGKILL leaves Snakemake's lock behind: the CLI detects that no run holds the
    directory and clears it. SIGTERM lets Snakemake clean up itself."""
    out = tmp_path / "out"
    bindir = Path(sys.executable).parent
    if form == "cli":
        cmd = [str(bindir / "torq-gen-config"), "discover", "--model", str(squeezenet_path), "--output-dir", str(out), "-j", "2"]
    else:
        cmd = [str(bindir / "snakemake"), "--cores", "2", "--config", f"model={squeezenet_path}", f"output_dir={out}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    layers = work(out, squeezenet_path.stem) / "layers"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(layers.glob("*/*/result.json"))) < 12:
        time.sleep(0.2)
    os.killpg(proc.pid, sig)
    proc.wait(timeout=300)  # SIGTERM: Snakemake lets the running jobs finish
    done = {p: p.stat().st_mtime_ns for p in layers.glob("*/*/result.json")}
    assert len(done) >= 12
    for p in done:
        json.loads(p.read_text())  # every result that exists is complete (atomic writes)
    if form == "cli":
        r = run_cli("discover", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q")
    else:
        r = run_snakemake("--cores", "2", "--config", f"model={squeezenet_path}", f"output_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    kept = sum(1 for p, m in done.items() if p.exists() and p.stat().st_mtime_ns == m)
    assert kept >= len(done) - 2, f"only {kept} of {len(done)} finished results were kept"
    report, _ = load_outputs(out, "light_squeezenet")
    assert len(report["ops"]) == 66 and all(len(op["executors"]) == 3 for op in report["ops"].values())


def test_ctrl_c_ends_with_one_message_not_the_stopped_jobs_blocks(tmp_path, squeezenet_path):
    """Ctrl-C during discovery: exit 130 and a few lines (the periodic progress lines, the
    summary, the one 'interrupted' line); Snakemake's block per stopped job (RuleException:
    RunStopped, Error in rule ...: 30-145 lines before) goes to the log file only. The progress
    lines come every few seconds, so their number depends on the machine's load: counted apart."""
    out = tmp_path / "out"
    cmd = [str(Path(sys.executable).parent / "torq-gen-config"), "discover", "--model", str(squeezenet_path),
           "--output-dir", str(out), "-j", "2"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    layers = work(out, squeezenet_path.stem) / "layers"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(layers.glob("*/*/result.json"))) < 6:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-3000:]
    assert "RuleException" not in stderr and "Error in rule" not in stderr, stderr[-3000:]
    progress = [ln for ln in stderr.splitlines() if ln.startswith("progress: ")]
    assert all(re.fullmatch(r"progress: \d+ of \d+ steps.*elapsed.*", ln) for ln in progress), progress
    assert len(stderr.splitlines()) - len(progress) <= 8, stderr
    assert stderr.rstrip().endswith("interrupted; finished layers are kept, rerun the same command to resume")


def test_a_damaged_reference_is_a_failed_job_not_an_executor_verdict_and_the_next_run_repairs_it(tmp_path):
    """A reference.json cut short outside the workflow (its mtime new, so Snakemake reuses it):
    the tests that read it fail with one line naming it (no `internal` error verdicts, no
    executor blamed); the file is removed and the next plain rerun makes it and the tests
    again (the report job is forced: the last run did not finish the report)."""
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    args = ("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert run_cli(*args).returncode == 0
    layer = next(p for p in (work(out, "cnn") / "layers").iterdir() if p.name.startswith("Relu"))
    ref = layer / "reference.json"
    ref.write_bytes(ref.read_bytes()[:300])
    r = run_cli(*args)
    assert r.returncode == 2 and "internal" not in r.stdout, r.stdout + r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    # with -j 2 two jobs may read it: the one that finds it damaged removes it, the other then
    # finds it gone and says so; either may be the last line
    rel = ref.relative_to(out)
    assert (f"{rel} is damaged" in last or f"{rel} is gone (another job found it damaged" in last) \
        and "run the same command again" in last, r.stderr[-2000:]
    assert not ref.exists()
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    report, _ = load_outputs(out, "cnn")
    op = next(v for k, v in report["ops"].items() if k.startswith("Relu"))
    assert {e["status"] for e in op["executors"].values()} == {"success"}
    assert "Nothing to be done" in run_cli(*args[:-1]).stderr  # repaired: the next run is a no-op


def test_a_damaged_layer_manifest_is_one_line_and_the_next_run_splits_again(tmp_path):
    """Found by a fresh-user test: a cut-short layers/manifest.json gave a garbled message
    ("Error: JSONDecodeError ... Wildcards:") at every rerun, and only --recompute-cache got
    out of it."""
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    args = ("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert run_cli(*args).returncode == 0
    manifest = work(out, "cnn") / "layers" / "manifest.json"
    manifest.write_text(manifest.read_text()[:120])
    r = run_cli(*args)
    line = one_line_error(r)
    assert f"work file {manifest.relative_to(out)} is damaged" in line and "Wildcards" not in line, line
    assert not manifest.exists()
    r = run_cli(*args)
    assert r.returncode == 0 and manifest.exists(), r.stderr[-2000:]
    assert "Nothing to be done" in run_cli(*args[:-1]).stderr


def test_tolerance_change_rederives_without_recompiling(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    cfg = ["--config", f"model={model}", f"output_dir={out}"]
    r = run_snakemake("--cores", "2", *cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    report, _ = load_outputs(out, "cnn")
    conv = report["ops"]["Conv_conv/out"]["executors"]["llvm-cpu"]
    assert conv["status"] == "success" and conv["metrics"]["max_rel_diff"] > 0
    tiny = conv["metrics"]["max_rel_diff"] / 2
    r = run_snakemake("--cores", "2", *cfg, f"tolerance={{fp_avg_tol: 0.01, fp_max_tol: {tiny!r}}}")
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert not [ln for ln in log.splitlines() if ln.startswith("[") and "] " in ln], "a layer test ran again"
    report, _ = load_outputs(out, "cnn")
    assert report["default_tolerance"]["fp_max_tol"] == tiny
    conv = report["ops"]["Conv_conv/out"]["executors"]["llvm-cpu"]
    assert conv["status"] == "difference"
    assert conv["failure_report"]["type"] == "accuracy_failure"


def test_skip_executors_and_ops(tmp_path, capsys):
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q",
                "--skip-executors", "vmvx", "--skip-ops", "maxpool")
    assert r.returncode == 0, r.stderr[-3000:]
    report, compiler = load_outputs(out, "cnn")
    assert report["executors"] == ["llvm-cpu", "ort"]
    pool = report["ops"]["MaxPool_pool"]
    assert pool["executors"] == {} and pool["recommended_executor"] is None
    assert "skip" in pool["skipped_reason"]
    assert pool["mlir_location"] not in compiler["op_assignments"]
    assert len(compiler["op_assignments"]) == 3
    assert not (work(out) / "layers" / "MaxPool_pool" / "llvm-cpu").exists()
    assert all(set(op["executors"]) == {"llvm-cpu", "ort"} for lid, op in report["ops"].items() if lid != "MaxPool_pool")
    assert report["provenance"]["options"]["skip_ops"] == ["maxpool"]
    r = cli_in_process(capsys, "discover", "--model", model, "--output-dir", out, "--skip-executors", "nope")
    assert r.returncode == 2 and "unknown executor(s) nope" in one_line_error(r)


def test_log_file_and_compiler_options(tmp_path):
    """--log-file receives the compiler stderr of a failing layer; a compiler option is
    recorded, reaches iree-compile and reruns only the iree executors' jobs."""
    model = lppool_model(tmp_path / "failing.onnx")
    out, log_file = tmp_path / "out", tmp_path / "diag.log"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--log-file", log_file)
    assert r.returncode == 0, r.stderr[-3000:]
    text = log_file.read_text()
    assert "LpPool_p on llvm-cpu" in text and "failed to legalize operation" in text
    # the console keeps one line per job: the compiler's cause (file name only), not its notes
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[llvm-cpu] LpPool_p:")]
    assert len(lines) == 1 and "failed to legalize operation" in lines[0], r.stdout
    assert "see current operation" not in r.stdout and str(tmp_path) not in lines[0]
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q",
                "--compiler-option=--iree-opt-const-eval=false")
    assert r.returncode == 0, r.stderr[-3000:]
    retested = sorted(ln.split("]")[0] + "]" for ln in r.stdout.splitlines() if ln.startswith("[") and "] " in ln)
    assert retested == ["[llvm-cpu]"] * 3 + ["[vmvx]"] * 3, r.stdout
    report, _ = load_outputs(out, "failing")
    assert report["provenance"]["options"]["compiler_options"] == ["--iree-opt-const-eval=false"]
    # Relu_a succeeded: its test's log is folded into its unit's log; LpPool_p's (a compile error) is its own
    assert not (work(out) / "logs" / "test_layer" / "Relu_a.llvm-cpu.log").exists()
    log = (work(out) / "logs" / "test_unit" / "0000.llvm-cpu.log").read_text()
    assert "--- Relu_a on llvm-cpu" in log and "--iree-opt-const-eval=false" in log
    assert "--iree-opt-const-eval=false" in (work(out) / "logs" / "test_layer" / "LpPool_p.llvm-cpu.log").read_text()


def test_skip_mode(tmp_path):
    """Skip mode: one success per layer, the rest skipped; a second skip-mode run tests
    nothing; a run without skip mode produces the skipped verdicts and only those."""
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"

    def jobs_run(r):
        return sorted(ln.split(":")[0] for ln in r.stdout.splitlines() if ln.startswith("[") and "] " in ln)

    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--skip-mode")
    assert r.returncode == 0, r.stderr[-3000:]
    report, compiler = load_outputs(out, "cnn")
    for lid, op in report["ops"].items():
        statuses = {n: e["status"] for n, e in op["executors"].items()}
        assert statuses == {"llvm-cpu": "success", "vmvx": "skipped", "ort": "skipped"}, (lid, statuses)
        assert op["recommended_executor"] == "llvm-cpu"
        assert "llvm-cpu already succeeded" in op["executors"]["vmvx"]["failure_report"]["summary"]
    assert report["discovery_report"]["summary"]["status_counts"]["skipped"] == 8
    assert not (work(out) / "layers" / "Relu_relu" / "vmvx" / "module.vmfb").exists()
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--skip-mode")
    assert r.returncode == 0 and jobs_run(r) == [], r.stdout
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    ran = jobs_run(r)
    assert len(ran) == 8 and not any(x.startswith("[llvm-cpu]") for x in ran), ran
    report, _ = load_outputs(out, "cnn")
    assert all(e["status"] == "success" for op in report["ops"].values() for e in op["executors"].values())
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert jobs_run(r) == [], r.stdout
    # --recompute-cache under --skip-mode retests the first executor of every layer
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--skip-mode", "--recompute-cache")
    assert r.returncode == 0, r.stderr[-3000:]
    ran = jobs_run(r)
    assert [x for x in ran if x.startswith("[llvm-cpu]")] == [f"[llvm-cpu] {lid}" for lid in sorted(report["ops"])], ran


def test_dedup_layers(tmp_path, squeezenet_path):
    """--dedup-layers on squeezenet: 38 distinct layers tested for 66; duplicates copy
    the verdicts of the first layer with the same signature."""
    out = tmp_path / "out"
    r = run_cli("discover", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q", "--dedup-layers")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "38 distinct layers tested for 66 layers" in r.stdout
    assert "Total layers tested: 66 (28 of them copy the verdicts of an identical layer: --dedup-layers)" in r.stdout
    report, compiler = load_outputs(out, "light_squeezenet")
    assert len(report["ops"]) == 66 and len(compiler["op_assignments"]) == 66
    dups = {lid: op["duplicate_of"] for lid, op in report["ops"].items() if "duplicate_of" in op}
    assert len(dups) == 28
    tested = {p.parent.parent.name for p in (work(out) / "layers").glob("*/*/result.json")}
    assert len(tested) == 38
    # the timing statistics count the layers measured, not their copies
    for name, stats in report["discovery_report"]["summary"]["timing_summary"].items():
        measured = sum(1 for p in (work(out) / "layers").glob(f"*/{name}/result.json")
                       if json.loads(p.read_text())["status"] != "error")
        assert stats["compile_ms"]["samples"] == measured <= 38, name
    for lid, src in dups.items():
        assert src in report["ops"] and "duplicate_of" not in report["ops"][src]
        assert report["ops"][lid]["op_type"] == report["ops"][src]["op_type"]
        assert report["ops"][lid]["recommended_executor"] == report["ops"][src]["recommended_executor"]
        assert {n: e["status"] for n, e in report["ops"][lid]["executors"].items()} == \
            {n: e["status"] for n, e in report["ops"][src]["executors"].items()}


def test_layer_inputs_propagate_and_input_data(tmp_path):
    """--layer-inputs propagate: layers see the whole model's activations (the layer after
    Relu gets non-negative inputs); --input-data feeds the model's real inputs."""
    from torq_gen_config.reference import load_reference

    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    x = np.random.default_rng(0).uniform(0, 2, size=(1, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--input-data", tmp_path / "x.npz")
    assert r.returncode == 0, r.stderr[-3000:]
    layers = work(out) / "layers"
    conv_dir = next(layers.glob("Conv_conv_out-*"))
    ins, outs, meta = load_reference(conv_dir / "reference.json")
    np.testing.assert_array_equal(ins["x"], x)
    assert meta["layer_inputs"] == f"propagate (whole-model run on input_data {tmp_path / 'x.npz'})"
    _, conv_out, _ = ins, outs, meta
    relu_in, _, _ = load_reference(layers / "Relu_relu" / "reference.json")
    np.testing.assert_allclose(relu_in["conv/out"], outs["conv/out"], rtol=1e-6)  # handed over from the Conv
    add_in, _, _ = load_reference(layers / "Add_y" / "reference.json")
    assert add_in["pool"].min() >= 0  # post-ReLU values
    report, _ = load_outputs(out, "cnn")
    assert report["provenance"]["options"]["layer_inputs"] == "propagate"
    assert report["provenance"]["options"]["input_data"].endswith("x.npz")
    # back to random inputs: references (and so the tests) are redone
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--layer-inputs", "random")
    assert r.returncode == 0, r.stderr[-3000:]
    add_in, _, meta = load_reference(layers / "Add_y" / "reference.json")
    assert meta["layer_inputs"] == "random" and add_in["pool"].min() < 0
    bad = tmp_path / "bad.npz"
    np.savez(bad, wrong=x)
    r = run_cli("discover", "--model", model, "--output-dir", tmp_path / "o2", "--input-data", bad)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and [ln for ln in err if ln.startswith("torq-gen-config: error:")] == err[-1:], r.stderr[-2000:]
    assert "has no array 'x'" in err[-1]


def test_snakemake_args_passed_through(tmp_path):
    """Extra Snakemake arguments after -- reach Snakemake (here: force one rule)."""
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    report_path = out / "torq_gen_config_cnn.json"
    before = report_path.stat().st_mtime_ns
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--", "--forcerun", "aggregate_report")
    assert r.returncode == 0, r.stderr[-3000:]
    assert report_path.stat().st_mtime_ns > before
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("[") and "] " in ln], "layer tests ran"
    r = run_cli("discover", "--model", model, "--output-dir", out, "--", "--no-such-snakemake-flag")
    assert r.returncode == 2 and "rejected the arguments" in r.stderr
