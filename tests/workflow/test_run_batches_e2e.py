"""``torq-gen-config run`` with compile batches (docs/compile_batches.md, "The full-model
run"): the partitions of each IREE executor compiled as one module give the same
full-model result as one compile per partition; a partition the batch cannot compile
gets its one-partition error.

Marked ``slow``: real discovery (ONNX Runtime only: the assignment is then set in the
report, as `edit` would) and real `run`s with IREE llvm-cpu and vmvx.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import SQUEEZENET, run_cli, work
from test_compile_batches_e2e import mixed_model
from test_output_schemas import validate_tree

pytestmark = pytest.mark.slow
EXECUTORS = ("executors:\n"
             "  - {name: llvm-cpu, backend: iree, options: {target: llvm-cpu, device: local-sync}}\n"
             "  - {name: vmvx, backend: iree, options: {target: vmvx, device: local-sync}}\n"
             "  - {name: ort, backend: onnxruntime, options: {}}\n")


def ok(r, status=0) -> None:
    assert r.returncode == status, r.stdout[-3000:] + r.stderr[-3000:]


def discover(model: Path, out: Path, cfg: Path) -> Path:
    """Discovery with ONNX Runtime only (the IREE executors' verdicts are not needed here)."""
    ok(run_cli("discover", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q",
               "--skip-executors", "llvm-cpu,vmvx"))
    return out


def report_file(out: Path) -> Path:
    return next(p for p in out.glob("torq_gen_config_*.json") if not p.name.endswith("_compiler.json"))


def assign(out: Path, choose) -> None:
    """Set every layer's recommended executor in the report JSON (``choose(layer_id, op)``)."""
    p = report_file(out)
    report = json.loads(p.read_text())
    for lid, op in report["ops"].items():
        op["recommended_executor"] = choose(lid, op)
        op["recommendation_source"] = "user"
    p.write_text(json.dumps(report, indent=2))


def run_with(out: Path, model: Path, tmp_path: Path, compile_batch: int, status: int = 0, keep_work: str = "all"):
    """``run`` with ``compile_batch``; ``keep_work: all`` by default (the batch modules stay for
    the next run to reuse; ``minimal`` removes them once the run is done)."""
    cfg = tmp_path / f"batch{compile_batch}.yaml"
    cfg.write_text(EXECUTORS + f"compile_batch: {compile_batch}\n")
    r = run_cli("run", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q",
                "--keep-work", keep_work)
    ok(r, status)
    report = json.loads(report_file(out).read_text())
    return r, report["full_model"]


def comparable(fm: dict, out: Path) -> dict:
    """What must not depend on batching: status, metrics, failure (paths replaced), and
    per partition pid, executor, layers, status, partition check."""
    failure = json.loads(json.dumps(fm["failure"]).replace(str(out), "<out>")) if fm["failure"] else None
    return {"status": fm["status"], "metrics": fm["metrics"], "failure": failure,
            "num_over_tolerance": fm["num_over_tolerance"], "assignment": fm["assignment"],
            "partitions": [{k: p[k] for k in ("pid", "executor", "layer_ids", "status", "partition_check")}
                           for p in fm["partitions"]]}


def mixed(lid, op):
    """Every Conv on vmvx, the first MaxPool on ONNX Runtime, the rest on llvm-cpu."""
    if op["op_type"] == "Conv":
        return "vmvx"
    return "ort" if lid == "MaxPool_r2" else "llvm-cpu"


def test_batched_run_of_squeezenet_equals_one_compile_per_partition(tmp_path):
    cfg = tmp_path / "executors.yaml"
    cfg.write_text(EXECUTORS)
    one = discover(SQUEEZENET, tmp_path / "one", cfg)
    assign(one, mixed)
    batched = tmp_path / "batched"
    shutil.copytree(one, batched, symlinks=True)
    _, fm1 = run_with(one, SQUEEZENET, tmp_path, 1)
    r, fm8 = run_with(batched, SQUEEZENET, tmp_path, 8)
    assert fm1["status"] == "success" and comparable(fm8, batched) == comparable(fm1, one)
    iree = [p for p in fm8["partitions"] if p["backend"] == "iree"]
    assert len(iree) >= 40 and fm8["options"]["compile_batch"] == 8
    # every IREE partition ran its function from a batch module: compile_ms is its share
    assert all(p["compile_batch"]["compile_ms_is"] == "share" for p in iree)
    assert all("compile_batch" not in p for p in fm1["partitions"])
    batches = sorted((work(batched) / "full" / "batches").glob("*/*/batch.json"))
    recs = [json.loads(b.read_text()) for b in batches]
    assert len(recs) == len({(p["compile_batch"]["executor"], p["compile_batch"]["id"]) for p in iree})
    assert all(len(b["members"]) <= 8 and b["compiled"] == len(b["members"]) and len(b["compiles"]) == 1 for b in recs)
    assert sum(len(b["members"]) for b in recs) == len({p["pid"] for p in iree})
    assert "partitions compiled in" in r.stdout and "batch module(s)" in r.stdout
    seen = validate_tree(batched)  # batch.json, the members' import.json and compiled.json
    assert len(seen["compile_batch.schema.yaml"]) == len(recs) and len(seen["import.schema.yaml"]) >= len({p["pid"] for p in iree})
    # a rerun with nothing changed runs no job
    r, _ = run_with(batched, SQUEEZENET, tmp_path, 8)
    assert "Nothing to be done" in r.stdout + r.stderr
    # a one-layer change compiles only the partition it creates; the others keep their batches
    parts_dir = work(batched) / "full" / "partitions"
    mtimes = {p["pid"]: (parts_dir / p["pid"] / "compiled.json").stat().st_mtime_ns for p in fm8["partitions"]}
    assign(batched, lambda lid, op: "vmvx" if lid == "Relu_r4" else mixed(lid, op))
    r, fm = run_with(batched, SQUEEZENET, tmp_path, 8)
    new = [p for p in fm["partitions"] if p["pid"] not in mtimes]
    assert fm["status"] == "success" and len(new) == 1 and new[0]["layer_ids"] == ["Conv_r3", "Relu_r4", "Conv_r5"]
    assert [ln.split()[2].rstrip(":") for ln in r.stdout.splitlines() if ln.startswith("compiled partition ")] == \
        [new[0]["pid"]]
    assert all((parts_dir / p["pid"] / "compiled.json").stat().st_mtime_ns == mtimes[p["pid"]]
               for p in fm["partitions"] if p["pid"] in mtimes)
    assert "compile_batch" not in new[0] and all("compile_batch" in p for p in fm["partitions"] if p is not new[0]
                                                 and p["backend"] == "iree")
    assign(batched, mixed)
    # back to one compile per partition: the same result again, the batches removed
    r, fm = run_with(batched, SQUEEZENET, tmp_path, 1)
    assert comparable(fm, batched) == comparable(fm1, one) and not batches[0].exists()


def test_a_partition_its_batch_cannot_compile_fails_as_alone(tmp_path):
    """mixed_model: Conv, Relu, LpPool, Cast, Abs, Cast, Sigmoid; llvm-cpu gets Conv, LpPool
    (fails to compile: IREE 3.13 "failed to legalize") and Sigmoid, with ORT in between."""
    cfg = tmp_path / "executors.yaml"
    cfg.write_text(EXECUTORS)
    model = mixed_model(tmp_path / "mixed.onnx")
    one = discover(model, tmp_path / "one", cfg)
    assign(one, lambda lid, op: "llvm-cpu" if op["op_type"] in ("Conv", "LpPool", "Sigmoid") else "ort")
    batched = tmp_path / "batched"
    shutil.copytree(one, batched, symlinks=True)
    _, fm1 = run_with(one, model, tmp_path, 1, status=1)
    _, fm8 = run_with(batched, model, tmp_path, 8, status=1, keep_work="minimal")
    # keep_work minimal: the batch modules (temp()) are gone once the run is done, their
    # records stay, and a rerun with nothing changed does not make them again
    batch_dir = work(batched) / "full" / "batches"
    assert list(batch_dir.glob("*/*/batch.json")) and not list(batch_dir.glob("*/*/module.vmfb"))
    r, _ = run_with(batched, model, tmp_path, 8, status=1, keep_work="minimal")
    assert "Nothing to be done" in r.stdout + r.stderr
    assert fm1["status"] == "error" and fm1["failure"]["stage"] == "compile"
    assert "failed to legalize" in fm1["failure"]["message"]
    assert comparable(fm8, batched) == comparable(fm1, one)
    lp = next(p for p in fm8["partitions"] if p["layer_ids"] == ["LpPool_p"])
    assert lp["compile_batch"]["compiled_alone"].startswith("the batch compile failed at this layer")
    compiled = {p.parent.name: json.loads(p.read_text()) for p in (work(batched) / "full" / "partitions").glob(
        "*/compiled.json")}
    alone = {p.parent.name: json.loads(p.read_text()) for p in (work(one) / "full" / "partitions").glob("*/compiled.json")}
    for pid, c in compiled.items():  # status and failure as one-partition compiles
        assert (c["status"], json.dumps(c["failure"]).replace(str(batched), "<out>")) == \
            (alone[pid]["status"], json.dumps(alone[pid]["failure"]).replace(str(one), "<out>"))
