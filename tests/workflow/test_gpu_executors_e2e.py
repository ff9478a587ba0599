"""GPU executors (config/gpu.yaml) on a machine without a GPU: the CUDA executors are
reported once as unavailable, with the reason, get no layer jobs, and discovery
completes with the CPU verdicts; with no executor left, a one-line error (exit 2)."""

from __future__ import annotations

import ctypes.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, run_cli, tvi, work
from onnx import numpy_helper

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _no_gpu() -> bool:
    import onnxruntime as ort

    return ctypes.util.find_library("cuda") is None and "CUDAExecutionProvider" not in ort.get_available_providers()


needs_cpu_only = pytest.mark.skipif(not _no_gpu(), reason="this machine has a CUDA driver or ORT's CUDA provider")


def conv_relu(path: Path) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    onnx.save(make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 2, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                         [w]), path)
    return path


@needs_cpu_only
def test_gpu_config_without_a_gpu_completes_with_the_cpu_verdicts(tmp_path):
    model, out = conv_relu(tmp_path / "cr.onnx"), tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "--config-file", REPO / "config" / "gpu.yaml",
                "-j", "2", "-q")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads((out / "torq_gen_config_cr.json").read_text())
    assert report["executors"] == ["llvm-cpu"]
    unavailable = {u["name"]: u for u in report["unavailable_executors"]}
    assert list(unavailable) == ["cuda", "ort-cuda"]
    assert unavailable["cuda"]["backend"] == "iree" and "libcuda.so" in unavailable["cuda"]["reason"]
    assert "no execution provider CUDAExecutionProvider" in unavailable["ort-cuda"]["reason"]
    statuses = [(lid, name, e["status"]) for lid, op in report["ops"].items() for name, e in op["executors"].items()]
    assert statuses == [("Conv_c", "llvm-cpu", "success"), ("Relu_y", "llvm-cpu", "success")]
    assert not any((work(out) / "layers").glob("*/cuda")) and not any((work(out) / "layers").glob("*/ort-cuda"))
    # once per executor in the text, in view and on the console, never per layer
    for text in (report["final_report_text"], r.stdout):
        assert text.count("unavailable on this machine") == 2
    v = run_cli("view", "--model", model, "--output-dir", out)
    assert v.returncode == 0 and v.stdout.count("Unavailable here, not tested:") == 2, v.stdout
    compiler = json.loads((out / "torq_gen_config_cr_compiler.json").read_text())
    assert {a["executor"] for a in compiler["op_assignments"].values()} == {"llvm-cpu"}
    # a rerun finds nothing to do (the probe result is stable, no job depends on it)
    r2 = run_cli("discover", "--model", model, "--output-dir", out, "--config-file", REPO / "config" / "gpu.yaml")
    assert r2.returncode == 0 and "Nothing to be done" in r2.stdout + r2.stderr, r2.stdout[-2000:]


@needs_cpu_only
def test_no_executor_left_is_a_one_line_error(tmp_path):
    cfg = tmp_path / "only_gpu.yaml"
    cfg.write_text("executors:\n  - {name: cuda, backend: iree, options: {target: cuda}}\n")
    r = run_cli("discover", "--model", conv_relu(tmp_path / "cr.onnx"), "--output-dir", tmp_path / "out",
                "--config-file", cfg)
    assert r.returncode == 2
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("torq-gen-config: error:")]
    assert len(errors) == 1 and "no configured executor can run on this machine: cuda: no cuda device" in errors[0]
