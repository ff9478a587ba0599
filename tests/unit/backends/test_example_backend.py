"""The example backend of docs/backends.md (tests/fixtures/example_backend.py),
registered with one line, runs real models end to end through the public API: the
config accepts it, one layer is compiled, run, compared and timed, and it runs a
partition of a full-model chain next to a built-in backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.backends import BACKEND_KINDS, executor_with_tool_options, make_backend, needs_mlir
from torq_gen_config.compare import DEFAULT_TOLERANCE
from torq_gen_config.config import DEFAULT_CONFIG_PATH, load_config_file, validate_config
from torq_gen_config.core.errors import ConfigError
from torq_gen_config.fullrun.compile import compile_partition
from torq_gen_config.fullrun.selection import make_assignment, selection_from_report
from torq_gen_config.fullrun.plan import make_plan
from torq_gen_config.fullrun.execute import run_partitions
from torq_gen_config.discovery.layer_test import run_layer_test
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.split import split_layers
from torq_gen_config.reference import compute_reference

REPO = Path(__file__).resolve().parents[3]

EXAMPLE = {"name": "ort-all", "backend": "ort-example", "options": {"threads": 1}}
ORT = {"name": "ort", "backend": "onnxruntime", "options": {"providers": ["CPUExecutionProvider"]}}


@pytest.fixture
def registered(monkeypatch):
    # the one line docs/backends.md says a new backend takes (here for one test only)
    monkeypatch.setitem(BACKEND_KINDS, "ort-example", "fixtures.example_backend:OrtCpuBackend")


def conv_relu(path):
    """Conv (3x3, 2 -> 4 channels, bias) then Relu, on 1x2x8x8 floats."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    onnx.save(make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 2, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                         [w, b]), path)
    return path


def test_the_config_accepts_a_kind_only_once_it_is_registered(monkeypatch):
    config = {**load_config_file(DEFAULT_CONFIG_PATH), "executors": [EXAMPLE]}
    with pytest.raises(ConfigError, match="executors/0/backend"):
        validate_config(config)
    monkeypatch.setitem(BACKEND_KINDS, "ort-example", "fixtures.example_backend:OrtCpuBackend")
    assert validate_config(config)["executors"][0]["backend"] == "ort-example"


def test_capabilities_come_from_the_class(registered):
    assert needs_mlir("ort-example") is False
    assert executor_with_tool_options(EXAMPLE, ["--x"], ["--y"]) is EXAMPLE  # takes no tool options
    with pytest.raises(ConfigError, match="unknown option"):
        make_backend({**EXAMPLE, "options": {"providers": []}})


def test_one_real_layer_compiles_runs_compares_and_is_timed(tmp_path, registered):
    model, info = prepare_model(conv_relu(tmp_path / "m.onnx"))
    man = split_layers(model, info, tmp_path / "layers")
    layer = man["layers"][0]
    assert layer["op_type"] == "Conv"
    layer_onnx = tmp_path / "layers" / layer["slug"] / "model.onnx"
    compute_reference(layer_onnx, tmp_path / "ref.npz", {"seed": 1})
    work = tmp_path / "work"
    res = run_layer_test(layer=layer, executor=EXAMPLE, layer_onnx=str(layer_onnx),
                         reference_npz=str(tmp_path / "ref.npz"), layer_mlir=None, import_status=None,
                         work_dir=str(work), result_path=str(work / "result.json"), log_path=None,
                         tolerance=DEFAULT_TOLERANCE, timeout_s=60, timing={"runs": 3, "warmup": 1})
    assert res["status"] == "success", res.get("summary")
    assert res["timing"]["compile_ms"] is not None and res["timing"]["run_ms"] is not None
    assert res["timing"]["runtime"]["runs"] == 3
    assert res["tool"]["kind"] == "ort-example" and res["tool"]["onnxruntime_version"]


def test_it_runs_a_partition_of_a_full_model_chain(tmp_path, registered):
    model, info = prepare_model(conv_relu(tmp_path / "m.onnx"))
    man = split_layers(model, info, tmp_path / "layers")
    onnx.save(model, tmp_path / "prepared.onnx")
    ids = [l["layer_id"] for l in man["layers"]]
    report = {"model_name": "m", "executors": ["ort-all", "ort"],
              "ops": {lid: {"recommended_executor": ex, "executors": {}} for lid, ex in zip(ids, ["ort-all", "ort"])}}
    assignment = make_assignment(selection_from_report(report, source_file="r.json"))
    plan = make_plan(model, man, None, assignment, [EXAMPLE, ORT], tmp_path / "parts")
    assert [p["executor"] for p in plan["partitions"]] == ["ort-all", "ort"]
    assert plan["partitions"][0]["needs_mlir"] is False
    compiled = {p["pid"]: compile_partition(pid=p["pid"], model_path=p["model"], executor=p["compile_def"],
                                            work_dir=str(tmp_path / "parts" / p["pid"]), timeout_s=60, log_path=None)
                for p in plan["partitions"]}
    assert all(c["status"] == "ok" for c in compiled.values()), compiled
    compute_reference(tmp_path / "prepared.onnx", tmp_path / "ref.npz", {"seed": 7})
    res = run_partitions(plan, reference_npz=str(tmp_path / "ref.npz"), compiled=compiled,
                         tolerance=DEFAULT_TOLERANCE, timeout_s=60, partitions_dir=tmp_path / "parts")
    assert res["status"] == "success", res["summary"]
    assert [r["status"] for r in res["partitions"]] == ["ran", "ran"]


def test_the_docs_show_the_example_verbatim():
    doc = (REPO / "docs" / "backends.md").read_text()
    assert "```python\n" + (REPO / "tests" / "fixtures" / "example_backend.py").read_text() + "```" in doc
    assert 'BACKEND_KINDS["ort-example"] = "fixtures.example_backend:OrtCpuBackend"' in doc
