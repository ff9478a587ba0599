"""Every JSON file the tool writes validates against its schema in ``workflow/schemas/``.

The end-to-end tests run ``discover``, ``run``, ``edit`` and ``ck-profile`` on real models
(onnx's light_squeezenet, a small Conv/Relu/MaxPool model for the precision and subgraph
modes, the ResNet-50 convolution trace of ``tests/data``), then validate every ``*.json``
under the output directory against the schema :mod:`torq_gen_config.core.schemas` maps its
path to. A JSON file with no schema fails the test, so a new output needs a schema; each
schema must reject the file with any of its required top-level fields renamed (so
``required`` is not empty and names fields the tool really writes).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import REPO, TensorProto, copy_discovery, helper, make_model, run_cli, tvi, work
from torq_gen_config.core.schemas import OUTPUT_SCHEMAS, SCHEMA_DIR, load_schema, schema_for, validator

SNAKEMAKE_STATE = ".snakemake"  # Snakemake's own metadata, not an output of the tool
cached_validator = functools.lru_cache(maxsize=None)(validator)


def validate_tree(root: Path) -> dict[str, list[str]]:
    """Validate every JSON file under ``root`` against its schema; fail on any error or on
    a file with no schema. Returns schema name -> the relative paths it validated."""
    seen: dict[str, list[str]] = {}
    unmapped, errors = [], []
    for path in sorted(root.rglob("*.json")):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] == SNAKEMAKE_STATE:
            continue
        name = schema_for(rel)
        if name is None:
            unmapped.append(rel)
            continue
        doc = json.loads(path.read_text())
        v = cached_validator(name)
        for e in list(v.iter_errors(doc))[:3]:
            errors.append(f"{rel} ({name}) at /{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}")
        if name not in seen:  # once per schema: a renamed required field is caught
            check_rename_is_caught(v, doc, rel)
        seen.setdefault(name, []).append(rel)
    assert not unmapped, f"JSON outputs with no schema (add one to workflow/schemas and schemas.OUTPUT_SCHEMAS): {unmapped}"
    assert not errors, "\n".join(errors)
    return seen


def check_rename_is_caught(v: jsonschema.Draft202012Validator, doc, rel: str) -> None:
    """The document with any one of its required top-level fields renamed is invalid
    (for a list document: its first item)."""
    obj = doc[0] if isinstance(doc, list) and doc else doc
    schema = v.schema if isinstance(doc, dict) else v.schema.get("items", {})
    required = schema.get("required") or []
    assert required, f"{rel}: its schema requires no field"
    for key in required:
        bad = copy.deepcopy(obj)
        bad[key + "_renamed"] = bad.pop(key)
        assert not v.is_valid(bad if isinstance(doc, dict) else [bad]), f"{rel}: renaming {key!r} still validates"


# --- fast checks on the schemas themselves --------------------------------------------

def test_every_schema_is_valid_draft_2020_12():
    names = {p.name for p in SCHEMA_DIR.glob("*.schema.yaml")}
    for name in sorted(names):
        schema = load_schema(name)
        assert schema.get("$schema") == "https://json-schema.org/draft/2020-12/schema", name
        jsonschema.Draft202012Validator.check_schema(schema)
    mapped = {name for _, name in OUTPUT_SCHEMAS}
    assert mapped <= names, f"mapped but missing: {sorted(mapped - names)}"
    # config: the input; report: what view/edit/run accept, part of report_output by $ref; value_ref:
    # a value of the value store, part of layer_inputs and layer_reference by $ref
    # inputs, not outputs: the config, a report read back, a value reference, a model sheet's row
    assert names - mapped == {"config.schema.yaml", "report.schema.yaml", "value_ref.schema.yaml",
                              "models.schema.yaml"}, sorted(names - mapped)


@pytest.mark.parametrize("rel, name", [
    ("torq_gen_config_m.json", "report_output.schema.yaml"),
    ("torq_gen_config_m_compiler.json", "compiler.schema.yaml"),
    ("torq_gen_config_m_subgraph_a_b_compiler.json", "compiler.schema.yaml"),
    ("work/m/layers/Conv_r0/llvm-cpu/result.json", "layer_result.schema.yaml"),
    ("work/m/layers/Conv_r0/import.json", "import.schema.yaml"),
    ("work/m/layers/Conv_r0/inputs.json", "layer_inputs.schema.yaml"),
    ("work/m/layers/Conv_r0/reference.json", "layer_reference.schema.yaml"),
    ("work/m/units/0000/llvm-cpu.keys.json", "unit_keys.schema.yaml"),
    ("work/m/units/0000/prepared.keys.json", "unit_keys.schema.yaml"),
    ("work/m/batches/llvm-cpu/0000-0123456789/batch.json", "compile_batch.schema.yaml"),
    ("work/m/layers/Conv_r0/quantize.json", "layer_quantize.schema.yaml"),
    ("work/m/full/partitions/p0-abc/compiled.json", "full_compiled.schema.yaml"),
    ("runs/fwd_3ef066e5e79f/result.json", "ck_run_result.schema.yaml"),
    ("work/m/layers/Conv_r0/llvm-cpu/other.json", None),
    ("work/m/unknown.json", None),
])
def test_schema_for_maps_output_paths(rel, name):
    assert schema_for(rel) == name


def test_enums_reject_an_unknown_status_and_stage():
    v = validator("layer_result.schema.yaml")
    assert not v.is_valid({"status": "sucess"}) and any(e.validator == "enum" for e in v.iter_errors({"status": "sucess"}))
    fr = {"failure_report": {"type": "error", "stage": "link", "summary": "", "message": None}}
    assert any("stage" in list(e.absolute_path) for e in v.iter_errors(fr))
    ck = validator("ck_run_result.schema.yaml")
    assert any(e.validator == "enum" for e in ck.iter_errors({"status": "ok"}))


# --- end to end -----------------------------------------------------------------------

def small_cnn(path: Path) -> Path:
    """Conv (3->4, 3x3, pad 1) -> Relu -> MaxPool 2x2 on float32 [1, 3, 8, 8]: 3 layers."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.2).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool")]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 4, 4])], [w, b])
    onnx.save(m, path)
    return path


def ok(r) -> None:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.slow
def test_squeezenet_discover_run_edit_outputs_validate(tmp_path, squeezenet_path, squeezenet_discovery):
    # the session's default discovery (conftest; its compile_batch is 32, so batch.json files are
    # validated too), copied: run and edit change the outputs
    shared, r = squeezenet_discovery
    ok(r)
    out = copy_discovery(shared, tmp_path / "out")
    ok(run_cli("run", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q"))
    ok(run_cli("edit", "--model", squeezenet_path, "--output-dir", out, "--layer", "Relu_r1", "--executor", "vmvx"))
    ok(run_cli("edit", "--model", squeezenet_path, "--output-dir", out, "--layer", "Softmax", "--tolerance-max", "0.05"))
    seen = validate_tree(out)
    assert {"report_output.schema.yaml", "compiler.schema.yaml", "prepare.schema.yaml", "locations.schema.yaml",
            "manifest.schema.yaml", "import.schema.yaml", "layer_result.schema.yaml", "user_choices.schema.yaml",
            "full_assignment.schema.yaml", "full_plan.schema.yaml", "full_compiled.schema.yaml",
            "full_result.schema.yaml", "compile_batch.schema.yaml"} <= set(seen), sorted(seen)
    assert len(seen["layer_result.schema.yaml"]) == 66 * 3
    assert len(seen["compile_batch.schema.yaml"]) == 3 * 2  # 66 layers in batches of 32, two iree executors
    # a verdict with a bogus status, a report with a renamed field: the schemas reject them
    res = json.loads((work(out) / "layers" / "Conv_r0" / "llvm-cpu" / "result.json").read_text())
    assert not validator("layer_result.schema.yaml").is_valid({**res, "status": "passed"})
    rep = json.loads((out / "torq_gen_config_light_squeezenet.json").read_text())
    rep["ops"]["Conv_r0"]["executors"]["vmvx"]["status"] = "passed"
    assert not validator("report.schema.yaml").is_valid(rep)  # the read check of view/edit/run
    assert not validator("report_output.schema.yaml").is_valid(rep)
    del rep["ops"]["Conv_r0"]["executors"]["vmvx"]["status"]
    assert not validator("report_output.schema.yaml").is_valid(rep)


@pytest.mark.slow
@pytest.mark.parametrize("quant_format", ["qdq", "qoperator"])
def test_quantized_discover_and_run_outputs_validate(tmp_path, quant_format):
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    flags = ["--quantize", "--quant-format", quant_format]
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", *flags))
    r = run_cli("run", "--model", model, "--output-dir", out, "-j", "2", "-q", *flags)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: an int8 difference is a verdict, not a failure
    seen = validate_tree(out)
    assert {"calibration.schema.yaml", "quantize.schema.yaml", "layer_quantize.schema.yaml",
            "quantized_manifest.schema.yaml", "full_result.schema.yaml"} <= set(seen), sorted(seen)


@pytest.mark.slow
def test_bf16_timing_skip_mode_subgraph_outputs_validate(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--skip-mode", "--collect-timing",
               "--timing-runs", "2", "--auto-convert-bf16"))
    ok(run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--subgraph-from", "Relu_r",
               "--subgraph-to", "MaxPool_y"))
    seen = validate_tree(out)
    assert len(seen["report_output.schema.yaml"]) == 2 and len(seen["prepare.schema.yaml"]) == 2, seen
    results = [json.loads((out / p).read_text()) for p in seen["layer_result.schema.yaml"]]
    assert {r["status"] for r in results} >= {"skipped"}
    assert any((r.get("timing") or {}).get("runtime") for r in results)


@pytest.mark.slow
def test_ck_profile_outputs_validate(tmp_path):
    exe = Path(sys.executable).parent / "ck-profile"
    configs = tmp_path / "ck_profiler_configs.json"

    def ck(*args):
        return subprocess.run([str(exe), *map(str, args)], cwd=tmp_path, capture_output=True, text=True, timeout=600)

    ok(ck("convert", REPO / "tests" / "data" / "resnet50_conv_ir.json", configs))
    ok(ck("run", configs, "--backend", "onnxruntime", "--max-ops", "3", "-j", "2", "--quiet", "--work-dir", tmp_path,
          "--output", tmp_path / "profiler_results.json"))
    seen = validate_tree(tmp_path)
    assert {"ck_configs.schema.yaml", "ck_manifest.schema.yaml", "ck_config.schema.yaml", "ck_run_result.schema.yaml",
            "ck_results.schema.yaml"} <= set(seen), sorted(seen)
    assert len(seen["ck_run_result.schema.yaml"]) == 3


@pytest.mark.slow
def test_torq_discover_and_run_outputs_validate(tmp_path, monkeypatch):
    """The torq backend through the fake tools of tests/fixtures/fake_torq (they record
    their command lines and delegate to IREE): its verdicts, whole-model plan and
    executor map."""
    for var in ("TORQ_COMPILE", "TORQ_RUN_MODULE", "IREE_BUILD_DIR", "FAKE_TORQ_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORQ_TOOL_PATH", str(REPO / "tests" / "fixtures" / "fake_torq"))
    monkeypatch.setenv("FAKE_TORQ_LOG", str(tmp_path / "fake_torq_log.jsonl"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")  # the fixtures' python3
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    cfg = REPO / "config" / "torq.yaml"
    ok(run_cli("discover", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q"))
    ok(run_cli("run", "--model", model, "--output-dir", out, "--config-file", cfg, "-j", "2", "-q"))
    seen = validate_tree(out)
    maps = [p for p in seen["compiler.schema.yaml"] if p.endswith("/executor_map.json")]
    assert len(maps) == 1, seen["compiler.schema.yaml"]
    plan = json.loads((work(out) / "full" / "plan.json").read_text())
    assert plan["mode"] == "torq"
    results = [json.loads((out / p).read_text()) for p in seen["layer_result.schema.yaml"]]
    assert {r["backend"] for r in results} == {"torq"} and len(results) == 9


def test_run_lock_holder_validates(tmp_path):
    """The holder record exists only while a run holds the lock: taken here in-process."""
    from torq_gen_config.core import run_lock

    lock = tmp_path / ".torq-gen-config-m.lock"
    run_lock.acquire(lock)
    try:
        assert validate_tree(tmp_path) == {"lock.schema.yaml": [".torq-gen-config-m.lock.json"]}
    finally:
        run_lock.release(lock)
