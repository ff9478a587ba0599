"""The unit of work (pipeline/units.py, docs/scale.md) changes how the work is scheduled,
not what is computed: on light_squeezenet and a transformer-encoder stack, every
(layer, executor) verdict of `discover` equals the one the per-layer job functions give
when called one layer at a time (the shape of the workflow before units: a reference
and an import job per layer, a compile job per batch, a test job per layer and executor).
Also: a unit job stopped half-way keeps the members it finished.

Marked ``slow``: each test runs discovery with the real tools.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from conftest import REPO, run_cli, work
from fixtures.models import transformer_encoder_stack

from torq_gen_config.backends import capabilities, needs_mlir
from torq_gen_config.discovery.batch_compile import plan_batches
from torq_gen_config.config import load_config_file
from torq_gen_config.pipeline.steps import layer_tests
from torq_gen_config.pipeline.steps.split import import_layer_job, reference_job

pytestmark = pytest.mark.slow


def verdicts(layers_dir: Path, root: Path) -> dict:
    """(slug, executor) -> status, failure stage, message (paths of ``root`` replaced),
    metrics and second-opinion check of every result.json under ``layers_dir``."""
    out = {}
    for f in layers_dir.glob("*/*/result.json"):
        r = json.loads(f.read_text())
        fr = r.get("failure_report") or {}
        msg = (fr.get("message") or "").replace(str(root), "<root>")
        out[(r["layer_slug"], r["executor"])] = (r["status"], fr.get("stage"), msg,
                                                 json.dumps(r.get("metrics"), sort_keys=True),
                                                 json.dumps(r.get("reference_check"), sort_keys=True))
    return out


def per_layer_jobs(layers_dir: Path, root: Path) -> dict:
    """The verdicts of the per-layer job functions, one layer at a time, on a copy of
    the split's layer files (the discovery's own files stay as they were): a reference
    and an import per layer, one compile per batch of the default size and executor,
    then a test per (layer, executor) from its batch's module."""
    import shutil

    cfg = load_config_file(REPO / "config" / "config.yaml")
    copy = root / "per_layer"
    shutil.copytree(layers_dir, copy, ignore=shutil.ignore_patterns("*.npz", "*.mlir", "*.json", "*.key", "*.vmfb",
                                                                     "*.npy"))
    shutil.copy(layers_dir / "manifest.json", copy / "manifest.json")
    for archive in layers_dir.parent.glob("*.irpa"):  # the weights the layer models refer to (weight_store)
        shutil.copy(archive, copy.parent / archive.name)  # their folder: ../.. of a layer model, as in work/<model>
    for f in layers_dir.glob("*/inputs.json"):  # the layer inputs of the whole-model run (values: ../../values)
        shutil.copy(f, copy / f.parent.name / "inputs.json")
    shutil.copytree(layers_dir.parent / "values", copy.parent / "values")
    layers = [l for l in json.loads((copy / "manifest.json").read_text())["layers"] if not l.get("not_testable")]
    by_slug = {l["slug"]: l for l in layers}
    for layer in layers:
        d = copy / layer["slug"]
        reference_job(layer_onnx=str(d / "model.onnx"), reference=str(d / "reference.json"),
                      values_dir=str(copy.parent / "values"), input_settings=cfg["inputs"],
                      inputs_path=str(d / "inputs.json"), engine=cfg["reference"], timeout_s=cfg["timeout_s"],
                      tolerance=cfg["tolerance"])
        import_layer_job(layer_onnx=str(d / "model.onnx"), mlir=str(d / "model.mlir"), status=str(d / "import.json"),
                         timeout_s=cfg["timeout_s"])
    for ex in cfg["executors"]:
        batch_of = {}
        if capabilities(ex["backend"]).batch_compile:
            for b in plan_batches([l["slug"] for l in layers], cfg["compile_batch"]):
                bdir = root / "per_layer_batches" / ex["name"] / b["id"]
                members = [{"slug": s, "layer_id": by_slug[s]["layer_id"], "mlir": str(copy / s / "model.mlir"),
                            "import_status": str(copy / s / "import.json")} for s in b["members"]]
                layer_tests.compile_batch_job(executor=ex, members=members, out_dir=str(bdir),
                                              timeout_s=cfg["timeout_s"])
                batch_of.update({s: {"module": str(bdir / "module.vmfb"), "info": str(bdir / "batch.json")}
                                 for s in b["members"]})
        for layer in layers:
            d = copy / layer["slug"]
            needs = needs_mlir(ex["backend"])
            layer_rec = {k: layer[k] for k in ("layer_id", "slug", "op_type", "node_index")}
            layer_tests.test_layer_job(layer=layer_rec, executor=ex, layer_onnx=str(d / "model.onnx"),
                                       reference=str(d / "reference.json"), mlir=str(d / "model.mlir") if needs else None,
                                       import_status=str(d / "import.json") if needs else None,
                                       result=str(d / ex["name"] / "result.json"), tolerance=cfg["tolerance"],
                                       timeout_s=cfg["timeout_s"], batch=batch_of.get(layer["slug"]))
    return verdicts(copy, root)


@pytest.mark.parametrize("which", ["light_squeezenet", "transformer_stack"])
def test_unit_verdicts_equal_the_per_layer_jobs(which, tmp_path, request):
    if which == "light_squeezenet":
        model = request.getfixturevalue("squeezenet_path")
        # the session's default discovery (conftest: one run, read only; per_layer_jobs works on a copy)
        out, r = request.getfixturevalue("squeezenet_discovery")
    else:
        model = tmp_path / "stack.onnx"
        onnx.save(transformer_encoder_stack(2), model)  # 80 layers: 3 units
        out = tmp_path / "out"
        r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    layers_dir = work(out, Path(model).stem) / "layers"
    units = sorted(p.name for p in (layers_dir.parent / "units").iterdir())
    assert units == ["0000", "0001", "0002"]  # 66 and 80 layers: units of 32
    got = verdicts(layers_dir, out.parent)  # the discovery's root, as tmp_path was for its own run
    expected = per_layer_jobs(layers_dir, tmp_path)
    assert len(got) == len(expected) == sum(1 for _ in layers_dir.glob("*/*/result.json"))
    differ = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
    assert not differ, [(k, got.get(k), expected.get(k)) for k in differ[:3]]
    # the report says the same: every layer tested on every executor
    report = json.loads((out / f"torq_gen_config_{Path(model).stem}.json").read_text())
    assert report["discovery_report"]["summary"]["distinct_layers_tested"] == len(got) // 3


def test_a_unit_stopped_half_way_keeps_what_it_finished(tmp_path):
    """kill -9 of the whole run while a unit's tests are under way: the verdicts written
    before the kill are kept (same file, same mtime) and the next run tests only the rest."""
    model = tmp_path / "stack.onnx"
    onnx.save(transformer_encoder_stack(1), model)  # 41 layers: 2 units
    out = tmp_path / "out"
    cmd = [str(Path(sys.executable).parent / "torq-gen-config"), "discover", "--model", str(model), "--output-dir",
           str(out), "-j", "1", "-q", "--skip-executors", "vmvx,ort"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    layers_dir = work(out, "stack") / "layers"
    units = work(out, "stack") / "units"  # a unit job's keys: units/<unit>/llvm-cpu.keys.json

    def finished() -> dict:
        done = {}
        for keys in units.glob("*/llvm-cpu.keys.json"):  # either unit may run first
            try:
                done.update({Path(name).parent.parent.name: None for name in json.loads(keys.read_text())["keys"]})
            except (OSError, ValueError):  # being written
                pass
        return done

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(finished()) < 5:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    done = {s: (layers_dir / s / "llvm-cpu" / "result.json").stat().st_mtime_ns for s in finished()}
    assert 5 <= len(done) < 41, len(done)
    r = run_cli(*cmd[1:])
    assert r.returncode == 0, r.stderr[-3000:]
    after = {f.parent.parent.name: f.stat().st_mtime_ns for f in layers_dir.glob("*/llvm-cpu/result.json")}
    assert len(after) == 41
    assert all(after[s] == m for s, m in done.items()), "a finished verdict was redone or lost"
    # the resumed run printed a verdict line for the others only
    tested = [ln for ln in r.stdout.splitlines() if ln.startswith("[llvm-cpu] ")]
    assert len(tested) == 41 - len(done), (len(tested), len(done))


def test_a_verdict_file_edited_damaged_or_deleted_is_tested_again(tmp_path):
    """Found by the fresh-user test: a result.json edited by hand stayed in the report,
    and one damaged, then removed by the report job, was never tested again."""
    from test_e2e import small_cnn

    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    args = ("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert run_cli(*args).returncode == 0
    layers = work(out, "cnn") / "layers"
    edited, damaged = sorted(layers.glob("*/ort/result.json"))[:2]
    rec = json.loads(edited.read_text())
    edited.write_text(json.dumps({**rec, "status": "error"}, indent=2))
    damaged.write_text(damaged.read_text()[:100])
    r = run_cli(*args)  # the unit reruns: both are tested again, and the run says why
    assert r.returncode == 0, r.stderr[-2000:]
    for p in (edited, damaged):
        assert f"{p.parent.parent.name} on ort: result.json changed outside the workflow" in r.stdout, r.stdout
    assert json.loads(edited.read_text())["status"] == "success"
    assert json.loads(damaged.read_text())["status"] == "success"
    report = json.loads((out / "torq_gen_config_cnn.json").read_text())
    assert {e["status"] for op in report["ops"].values() for e in op["executors"].values()} == {"success"}
    damaged.unlink()
    r = run_cli(*args)
    assert r.returncode == 0 and damaged.is_file(), r.stderr[-2000:]
    report_mtime = (out / "torq_gen_config_cnn.json").stat().st_mtime_ns
    # the drift is handled: the next run is a no-op (its drift param gives back the value
    # the unit ran with; found by the fresh-user test: it reran the unit and rewrote the report)
    r = run_cli(*args[:-1])
    assert "Nothing to be done" in r.stderr, r.stderr[-2000:]
    assert (out / "torq_gen_config_cnn.json").stat().st_mtime_ns == report_mtime
    damaged.unlink()  # the same file gone again: the same drift as before, in a newer record
    r = run_cli(*args)
    assert r.returncode == 0 and damaged.is_file(), r.stderr[-2000:]
    r = run_cli(*args[:-1])
    assert "Nothing to be done" in r.stderr, r.stderr[-2000:]
    # the report itself cut short (found by the fresh-user test: every rerun was the same
    # error): named, made again from the work files, nothing retested
    report = out / "torq_gen_config_cnn.json"
    text = report.read_text()
    report.write_text(text[:len(text) // 2])
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "is not valid JSON" in r.stderr and "making it again from the work files" in r.stderr
    assert json.loads(report.read_text())["ops"] == json.loads(text)["ops"]
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("[")]  # no layer tested
