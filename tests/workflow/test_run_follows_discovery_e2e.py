"""``run`` follows the discovery it runs (issue 38 item 3): ``discover`` with every
non-default option (in four groups), then ``run``, then ``run`` again, with the real tools:
both runs exit 0, re-make neither the prepared model nor the split (their files keep their
modification times), and leave no out-of-date marker (the report still describes the work
files); a conflicting model-defining flag on run's command line is refused in one line,
the same value is accepted. Before: ``discover --layer-inputs random`` then ``run``
re-split with ``propagate`` and the next ``run`` refused with exit 2; ``discover
--quantize`` then ``run`` without the flag was refused. About 2 minutes on 2 cores."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import one_line_error, run_cli, work
from onnx import TensorProto, helper, numpy_helper

from torq_gen_config.core.layout import LAYERS_DIR, MANIFEST_FILE, OUTDATED_MARKER, PREPARED_MODEL_FILE
from torq_gen_config.report.staleness import staleness

pytestmark = pytest.mark.slow

GROUPS = {
    "layers": ["--layer-inputs", "random", "--dedup-layers", "--skip-ops", "Relu", "--skip-executors", "vmvx",
               "--compile-batch", "1", "--keep-outputs", "--keep-work", "all", "--timeout", "120",
               "--tolerance-avg", "0.02", "--tolerance-max", "0.03", "--skip-mode", "--collect-timing",
               "--timing-runs", "2", "--timing-warmup", "0"],
    "model": ["--input-shapes", "x:3x8", "--target-opset", "18", "--reference", "onnx", "--parameters", "external"],
    "data": ["--input-data", "{data}", "--auto-convert-int32"],
    "quantize": ["--quantize", "--per-channel", "--quant-format", "qoperator", "--calibration-samples", "5"],
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("follows")
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Add", ["r", "B"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                              [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
                               numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "B")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, d / "dyn.onnx")
    np.savez(d / "in.npz", x=rng.standard_normal((3, 8)).astype(np.float32))
    return d


@pytest.mark.parametrize("group", list(GROUPS))
def test_discover_then_run_twice(model, group):
    import json

    path, out = model / "dyn.onnx", model / f"out_{group}"
    opts = [o.replace("{data}", str(model / "in.npz")) for o in GROUPS[group]]
    r = run_cli("discover", "--model", path, "--output-dir", out, "-j", "2", "-q", *opts)
    assert r.returncode == 0, r.stderr[-3000:]
    w = work(out)
    files = [w / PREPARED_MODEL_FILE, w / LAYERS_DIR / MANIFEST_FILE]
    made = [f.stat().st_mtime_ns for f in files]
    report = out / "torq_gen_config_dyn.json"
    for attempt in (1, 2):
        r = run_cli("run", "--model", path, "--output-dir", out)
        assert r.returncode == 0, f"run {attempt}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
        assert "Status: success" in r.stdout
        assert not (w / OUTDATED_MARKER).exists(), (w / OUTDATED_MARKER).read_text()
        assert [f.stat().st_mtime_ns for f in files] == made, "run re-made the prepared model or the split"
        rep = json.loads(report.read_text())
        assert staleness(report, rep, path) == [] and rep["full_model"]["status"] == "success"
    if group == "quantize":  # another value: refused before anything runs; the same value: accepted
        r = run_cli("run", "--model", path, "--output-dir", out, "--quant-format", "qdq")
        assert r.returncode == 2
        assert "--quant-format qdq differs from discovery's (--quant-format: qoperator" in one_line_error(r)
        r = run_cli("run", "--model", path, "--output-dir", out, "--quantize", "--quant-format", "qoperator")
        assert r.returncode == 0, r.stderr[-3000:]
    if group == "data":
        r = run_cli("run", "--model", path, "--output-dir", out, "--auto-convert-bf16")
        assert r.returncode == 2 and "--auto-convert-bf16 differs from discovery's" in one_line_error(r)
