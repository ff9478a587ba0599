"""The run context (pipeline/context.py): what a run is, built once from the config, and
the rules' wiring file that uses it (rules/common.smk stays thin)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from torq_gen_config.commands.outputs import output_layout
from torq_gen_config.config import (
    DEFAULT_CONFIG_PATH,
    load_config_file,
    validate_config,
)
from torq_gen_config.core import layout
from torq_gen_config.core.errors import ConfigError, ModelError
from torq_gen_config.model.subgraph import run_names
from torq_gen_config.pipeline.context import RunContext
from torq_gen_config.pipeline.steps import Untracked

REPO = Path(__file__).resolve().parents[3]


def _config(tmp_path, **patch) -> dict:
    cfg = load_config_file(DEFAULT_CONFIG_PATH)
    cfg.update({"output_dir": str(tmp_path / "out"), **patch})
    return validate_config(cfg)


def test_built_from_a_config_dict_with_the_layout_paths(tmp_path):
    ctx = RunContext.from_config(_config(tmp_path))
    out, name = str(tmp_path / "out"), "light_squeezenet"
    work = os.path.join(out, layout.work_dir(name))
    assert (ctx.out, ctx.model_name, ctx.subgraph, ctx.work) == (out, name, None, work)
    assert ctx.report == os.path.join(out, layout.report_file(name))
    assert ctx.compiler_json == os.path.join(out, layout.compiler_file(name))
    assert ctx.html_report == os.path.join(out, layout.html_report_file(name))
    assert ctx.user_choices == os.path.join(out, layout.user_choices_file(name))
    assert ctx.run_lock == os.path.join(out, layout.lock_file(name))
    assert ctx.report_outdated == os.path.join(work, layout.OUTDATED_MARKER)
    assert (ctx.layers, ctx.logs, ctx.quant) == tuple(os.path.join(work, d) for d in (
        layout.LAYERS_DIR, layout.LOGS_DIR, layout.QUANT_DIR))
    assert (ctx.units, ctx.batches) == (os.path.join(work, layout.UNITS_DIR), os.path.join(work, layout.BATCHES_DIR))
    for field, file in (("prepared_model", layout.PREPARED_MODEL_FILE), ("prepare_info", layout.PREPARE_INFO_FILE),
                        ("model_inputs", layout.MODEL_INPUTS_FILE), ("full_mlir", layout.FULL_MLIR_FILE),
                        ("locations", layout.LOCATIONS_FILE), ("report_summary", layout.REPORT_SUMMARY_FILE)):
        assert getattr(ctx, field) == os.path.join(work, file)
    assert ctx.manifest == os.path.join(ctx.layers, layout.MANIFEST_FILE)
    assert (ctx.calibration, ctx.quantized_model, ctx.quantize_info, ctx.quant_manifest) == tuple(
        os.path.join(ctx.quant, f) for f in (layout.CALIBRATION_FILE, layout.QUANTIZED_MODEL_FILE,
                                             layout.QUANTIZE_INFO_FILE, layout.MANIFEST_FILE))
    assert ctx.part_batches == os.path.join(work, layout.FULL_DIR, layout.BATCHES_DIR)
    assert (ctx.run_model, ctx.run_manifest) == (ctx.prepared_model, ctx.manifest)
    for field, file in (("full_assignment", layout.ASSIGNMENT_FILE), ("full_plan", layout.PLAN_FILE),
                        ("full_reference", layout.REFERENCE_FILE), ("full_result", layout.RESULT_FILE)):
        assert getattr(ctx, field) == os.path.join(out, layout.full_run_file(name, file))
    assert ctx.parts == os.path.join(work, layout.FULL_DIR, layout.PARTITIONS_DIR)
    assert ctx.final_outputs == [ctx.report, ctx.compiler_json]
    # the executors, batches and limits of the default config
    assert list(ctx.executors) == ["llvm-cpu", "vmvx", "ort"] and ctx.unavailable == {}
    assert ctx.batched == {"llvm-cpu": True, "vmvx": True, "ort": False} and ctx.import_mlir
    assert isinstance(ctx.timeout, Untracked) and ctx.timeout.value == 300
    assert ctx.run_options()["output_dir"] == out and ctx.run_options()["model"] == ctx.model_path


def test_the_context_is_frozen(tmp_path):
    ctx = RunContext.from_config(_config(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.work = "elsewhere"


def test_the_default_output_dir_and_the_cli_share_the_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, output_dir="", skip_executors=["vmvx"], quantize=True)
    ctx = RunContext.from_config(cfg)
    assert ctx.out == os.path.join("results", "light_squeezenet") and list(ctx.executors) == ["llvm-cpu", "ort"]
    assert ctx.run_model == os.path.join(ctx.quant, "quantized.onnx")
    names = run_names(cfg)
    assert output_layout(cfg) == {"name": names.name, "work": names.work, "subgraph": None}
    assert os.path.join(ctx.out, names.work) == ctx.work


def test_a_bad_model_path_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="model file not found"):
        RunContext.from_config(_config(tmp_path, model=str(tmp_path / "missing.onnx")))


def test_common_smk_stays_thin():
    """The rules' wiring file: the run's logic is in the package (issue 25: ~200 lines)."""
    lines = (REPO / "rules" / "common.smk").read_text().splitlines()
    assert len(lines) <= 220, f"rules/common.smk has {len(lines)} lines"
