"""``--keep-work minimal`` end to end on a 3-layer Gemm model with the real tools: the
finished run's intermediates are removed, the size line and the report's ``work_dir``
say so, a rerun runs nothing and leaves the report as it is, ``view`` works, a
re-targeted layer gets the same verdict (the removed MLIR imported again with its old
identity, only that layer tested), and ``run`` removes its partition modules and stays a
no-op. Marked ``slow``: about 30 s of real discovery and runs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, run_cli, tvi, work
from onnx import numpy_helper

from torq_gen_config.core.schemas import validator

pytestmark = pytest.mark.slow


def _gemm3(path, n=128):
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array((rng.standard_normal((n, n)) * 0.05).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(np.zeros(n, np.float32), f"b{i}")]
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"y{i}"]))
        prev = f"y{i}"
    onnx.save(make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, n])], [tvi(prev, TensorProto.FLOAT, [1, n])],
                         inits), path)
    return path


def _verdicts(report: dict) -> dict:
    return {(k, e): (v["status"], json.dumps(v.get("metrics"), sort_keys=True))
            for k, op in report["ops"].items() for e, v in op["executors"].items()}


def _bulky(w):
    return sorted(p.relative_to(w).as_posix() for p in [*w.rglob("*.vmfb"), *w.glob("layers/*/model.mlir"),
                                                         *w.glob("layers/*/*/out_*.npy")])


def test_keep_work_minimal_discover_rerun_retarget_and_run(tmp_path):
    model = _gemm3(tmp_path / "gemm3.onnx")
    out = tmp_path / "out"
    args = ["--model", model, "--output-dir", out, "-j", "2", "-q", "--keep-work", "minimal"]
    r = run_cli("discover", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    w = work(out)
    removed = [ln for ln in r.stderr.splitlines() if ln.startswith("--keep-work minimal: removed ")]
    assert len(removed) == 1, r.stderr[-3000:]
    assert _bulky(w) == []
    size = [ln for ln in r.stdout.splitlines() if ln.startswith("Work directory: ")]
    assert len(size) == 1 and "x the model's" in size[0] and "--keep-work minimal freed" in size[0], r.stdout[-1500:]
    report_path = out / "torq_gen_config_gemm3.json"
    report = json.loads(report_path.read_text())
    sec = report["work_dir"]
    assert sec["path"] == "work/gemm3" and sec["freed_files"] > 0 and sec["removable_bytes"] == 0
    assert sec["model_bytes"] == model.stat().st_size and sec["ratio"] == round(sec["bytes"] / sec["model_bytes"], 2)
    validator("report_output.schema.yaml").validate(report)
    record = json.loads((w / "keep_work.json").read_text())
    validator("keep_work.schema.yaml").validate(record)
    assert sorted(record["restorable"]) == [f"layers/Gemm_y{i}/model.mlir" for i in range(3)]
    before = _verdicts(report)

    # (a) the same command again: no job, the same report (bytes and mtime)
    stat = report_path.stat()
    r = run_cli("discover", *args, "-n")
    assert r.returncode == 0 and "Nothing to be done" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    r = run_cli("discover", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "steps done" not in r.stdout + r.stderr and "removed" not in r.stderr, r.stderr[-3000:]
    assert report_path.stat().st_mtime_ns == stat.st_mtime_ns and json.loads(report_path.read_text()) == report

    # (b) view reads what is left, and shows the size recorded with the report
    r = run_cli("view", report_path)
    assert r.returncode == 0 and "Work directory: work/gemm3" in r.stdout, (r.stdout + r.stderr)[-3000:]

    # (c) a re-targeted layer: only it is tested, from its batch compiled again out of the MLIR
    # imported again with its old identity, and it gets the same verdict
    (w / "layers" / "Gemm_y1" / "vmvx" / "result.json").unlink()
    r = run_cli("discover", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[vmvx] Gemm_y1: success" in r.stdout and "Gemm_y0:" not in r.stdout, r.stdout[-3000:]
    tested = {m["slug"]: m["tested"] for m in json.loads((w / "units" / "0000" / "vmvx.json").read_text())["members"]}
    assert tested == {"Gemm_y0": False, "Gemm_y1": True, "Gemm_y2": False}
    assert json.loads((w / "keep_work.json").read_text())["restorable"] == record["restorable"]
    assert _bulky(w) == []
    assert _verdicts(json.loads(report_path.read_text())) == before  # statuses and metrics

    # the full-model run: its partition module removed too, and a rerun is a no-op
    r = run_cli("run", *args)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "Work directory: " in r.stdout and not list((w / "full").rglob("*.vmfb")), r.stdout[-2000:]
    text = report_path.read_bytes()
    r = run_cli("run", *args)
    assert r.returncode == 0 and "steps done" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert report_path.read_bytes() == text
