"""Every tensor stored once (issue 37), on the shared light_squeezenet discovery: each value
in ``values/`` once and named by the records that use it, a layer's input the same file as
its producer's reference output, no run files or successful executors' outputs left,
the logs of successes folded into their unit's log, no module or layer MLIR left by the
default ``keep_work: minimal``. Marked ``slow``: reads a real discovery."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import work

from torq_gen_config.core.value_store import refs_in
from torq_gen_config.reference import load_reference

pytestmark = pytest.mark.slow


def _records(w):
    return {p: json.loads(p.read_text()) for p in (w / "layers").glob("*/*.json")
            if p.name in ("inputs.json", "reference.json")}


def test_each_value_is_stored_once_and_layers_share_their_producers_values(squeezenet_discovery):
    out, r = squeezenet_discovery
    assert r.returncode == 0, r.stderr[-2000:]
    w = work(out, "light_squeezenet")
    records = _records(w)
    referenced = {d for rec in records.values() for d in refs_in(rec)}
    stored = {p.stem for p in (w / "values").glob("*.npy")}
    assert stored == referenced  # nothing unreferenced left, nothing missing
    assert not list((w / "values").glob("*.tmp"))
    # a value of the whole-model run is one file, whoever reads it: the consumers' inputs are
    # the producer's reference outputs (same digest), which bounds the store by the activations
    man = json.loads((w / "layers" / "manifest.json").read_text())
    produced = {}
    for layer in man["layers"]:
        rec = records.get(w / "layers" / layer["slug"] / "reference.json")
        if rec and rec["status"] == "ok":
            produced.update({n: ref["digest"] for n, ref in rec["outputs"].items()})
    shared = 0
    for layer in man["layers"]:
        rec = records.get(w / "layers" / layer["slug"] / "inputs.json")
        for name, ref in ((rec or {}).get("values") or {}).items():
            if name in produced:
                assert ref["digest"] == produced[name], (layer["layer_id"], name)
                shared += 1
    assert shared >= len(man["layers"]) - 1
    # the second engine's outputs are kept only where the engines disagree
    kept = [rec["second"].get("outputs_kept") for p, rec in records.items() if p.name == "reference.json"]
    assert kept and all(k in (True, False) for k in kept)
    assert all(not rec.get("second_outputs") for p, rec in records.items()
               if p.name == "reference.json" and rec["second"].get("outputs_kept") is False)
    # a reference reads back as arrays, memory-mapped from the store
    conv = next(x for x in man["layers"] if x["op_type"] == "Conv")
    ins, outs, meta = load_reference(w / "layers" / conv["slug"] / "reference.json")
    assert isinstance(next(iter(ins.values())), np.memmap) and meta["status"] == "ok" and outs


def test_no_run_files_outputs_modules_or_success_logs_are_left(squeezenet_discovery):
    out, r = squeezenet_discovery
    w = work(out, "light_squeezenet")
    layer_files = [p.relative_to(w).as_posix() for p in (w / "layers").rglob("*") if p.is_file()]
    left = [f for f in layer_files if f.rsplit("/", 1)[-1].startswith(("in_", "out_", "bench_in_"))
            or f.endswith((".vmfb", ".npz", "model.mlir"))]
    report = json.loads((out / "torq_gen_config_light_squeezenet.json").read_text())
    statuses = {e["status"] for op in report["ops"].values() for e in op["executors"].values()}
    assert statuses == {"success"}, statuses  # so no executor's outputs are kept either
    assert not left, left[:10]
    assert not list(w.glob("batches/*/*/*.vmfb"))
    # the tool output of each successful test is in its unit's log, not in a file per layer
    assert not list((w / "logs" / "test_layer").glob("*.log"))
    unit_logs = "".join(p.read_text() for p in (w / "logs" / "test_unit").glob("*.log"))
    assert "folded in" in unit_logs and "iree-run-module" in unit_logs and "/values/" in unit_logs
    assert report["work_dir"]["freed_files"] > 0
