"""cli.options.build_config: the discover/run flags reach the workflow config, and the
executor definitions the jobs are keyed on (their params) carry them."""

from __future__ import annotations

import argparse

import onnx
from conftest import TensorProto, helper, make_model, tvi

from torq_gen_config.backends import executor_with_tool_options, run_wide_overrides
from torq_gen_config.cli.discover import add_parser
from torq_gen_config.cli.options import build_config


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["discover", *argv])


def _model(tmp_path):
    path = tmp_path / "relu.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                         [tvi("x", TensorProto.FLOAT, [2, 3])], [tvi("y", TensorProto.FLOAT, [2, 3])]), path)
    return str(path)


def test_flags_reach_the_config(tmp_path):
    model = _model(tmp_path)
    default = build_config(_parse("--model", model))
    assert (default["timeout_s"], default["verbose"], default["runtime_options"], default["torq_hw"]) == \
        (300, False, [], "")
    cfg = build_config(_parse("--model", model, "--tolerance-avg", "0.002", "--tolerance-max", "0.03",
                              "--timeout", "42", "--runtime-option=--print_statistics=false",
                              "--compiler-option=--iree-opt-level=O2", "--torq-hw", "SL2610",
                              "--torq-hw-type", "hw", "-v", "--log-file", str(tmp_path / "x.log")))
    assert cfg["tolerance"]["fp_avg_tol"] == 0.002 and cfg["tolerance"]["fp_max_tol"] == 0.03
    assert cfg["timeout_s"] == 42 and cfg["verbose"] is True and cfg["log_file"] == str(tmp_path / "x.log")
    assert cfg["runtime_options"] == ["--print_statistics=false"]
    assert cfg["compiler_options"] == ["--iree-opt-level=O2"]
    assert (cfg["torq_hw"], cfg["torq_hw_type"]) == ("SL2610", "hw")


def test_the_job_keys_carry_the_tool_options(tmp_path):
    """What the run context's executor param (pipeline/context.py, RunInputs.executor) makes of the config: the per-job param that
    decides which (layer, executor) jobs rerun."""
    cfg = build_config(_parse("--model", _model(tmp_path), "--runtime-option=--r", "--compiler-option=--c",
                              "--torq-hw", "SL2610"))
    iree = {"name": "a", "backend": "iree", "options": {"target": "vmvx"}}
    torq = {"name": "nss", "backend": "torq", "options": {"executor": "nss", "torq_hw": "default"}}
    ort = {"name": "o", "backend": "onnxruntime", "options": {}}
    key = {e["name"]: executor_with_tool_options(e, cfg["compiler_options"], cfg["runtime_options"],
                                                 run_wide_overrides(cfg)) for e in (iree, torq, ort)}
    assert key["a"]["options"] == {"target": "vmvx", "compile_flags": ["--c"], "run_flags": ["--r"]}
    assert key["nss"]["options"]["torq_hw"] == "SL2610" and key["nss"]["options"]["compile_flags"] == ["--c"]
    assert key["o"] is ort  # ONNX Runtime takes no tool options: its jobs do not rerun


def test_the_model_may_be_named_inside_the_onnx_package_as_in_the_config():
    """--model onnx:<path> (the config's spelling of the embedded default model)."""
    import pathlib

    cfg = build_config(_parse("--model", "onnx:backend/test/data/light/light_squeezenet.onnx"))
    want = pathlib.Path(onnx.__file__).resolve().parent / "backend/test/data/light/light_squeezenet.onnx"
    assert pathlib.Path(cfg["model"]) == want


def test_view_and_edit_find_the_report_of_an_onnx_package_model(tmp_path):
    from torq_gen_config.report.files import compiler_path_for_model, report_path_for_model

    model = "onnx:backend/test/data/light/light_squeezenet.onnx"
    assert report_path_for_model(model, tmp_path) == tmp_path / "torq_gen_config_light_squeezenet.json"
    assert compiler_path_for_model(model, tmp_path) == tmp_path / "torq_gen_config_light_squeezenet_compiler.json"
