"""Config validation: defaults, unknown keys, bad values, duplicate executors, model paths."""

from __future__ import annotations

import pytest

from torq_gen_config.config import DEFAULT_CONFIG_PATH, load_config_file, resolve_model_path, validate_config
from torq_gen_config.core.errors import ConfigError


def base():
    return load_config_file(DEFAULT_CONFIG_PATH)


def test_default_config_is_valid_and_real():
    cfg = validate_config(base())
    assert [e["name"] for e in cfg["executors"]] == ["llvm-cpu", "vmvx", "ort"]
    assert [e["backend"] for e in cfg["executors"]] == ["iree", "iree", "onnxruntime"]
    assert cfg["tolerance"] == {"fp_avg_tol": 0.01, "fp_max_tol": 0.01, "bf16_avg_tol": 0.01, "bf16_max_tol": 0.05}
    assert not (cfg["quantize"] or cfg["auto_convert_bf16"] or cfg["auto_convert_int32"])
    assert resolve_model_path(cfg["model"]).name == "light_squeezenet.onnx"
    assert resolve_model_path(cfg["model"]).exists()


def test_defaults_filled_in():
    cfg = validate_config({"model": "m.onnx", "executors": [{"name": "a", "backend": "iree"}]})
    assert cfg["timeout_s"] == 300 and cfg["target_opset"] == 17
    assert cfg["inputs"]["seed"] == 1234 and cfg["executors"][0]["options"] == {}


@pytest.mark.parametrize("patch,message", [
    ({"bogus": 1}, "'bogus' was unexpected"),
    ({"timeout_s": -1}, "timeout_s"),
    ({"tolerance": {"fp_max_tol": 0}}, "tolerance/fp_max_tol"),
    ({"tolerance": {"fp_maxtol": 0.1}}, "'fp_maxtol' was unexpected"),
    ({"executors": [{"name": "x", "backend": "tensorrt"}]}, "executors/0/backend"),
    ({"executors": [{"name": "bad/name", "backend": "iree"}]}, "executors/0/name"),
    ({"executors": []}, "executors"),
    ({"target_opset": 0}, "target_opset"),
])
def test_invalid_values_give_one_line_errors(patch, message):
    cfg = {**base(), **patch}
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_duplicate_executor_names():
    cfg = {**base(), "executors": [{"name": "a", "backend": "iree"}, {"name": "a", "backend": "onnxruntime"}]}
    with pytest.raises(ConfigError, match="used twice"):
        validate_config(cfg)


def test_skip_executors_validated():
    with pytest.raises(ConfigError, match="unknown executor"):
        validate_config({**base(), "skip_executors": ["tensorrt"]})
    with pytest.raises(ConfigError, match="every configured executor"):
        validate_config({**base(), "skip_executors": ["llvm-cpu", "vmvx", "ort"]})
    assert validate_config({**base(), "skip_executors": ["vmvx"]})["skip_executors"] == ["vmvx"]


def test_tool_options_reach_compiler_backends_only():
    from torq_gen_config.backends import executor_with_tool_options

    iree = {"name": "a", "backend": "iree", "options": {"compile_flags": ["--x"]}}
    torq = {"name": "nss", "backend": "torq", "options": {"torq_hw": "default"}}
    ort = {"name": "o", "backend": "onnxruntime", "options": {}}
    got = executor_with_tool_options(iree, ["--y"], ["--r"], {"torq_hw": "SL2610", "torq_hw_type": "hw"})
    assert got["options"] == {"compile_flags": ["--x", "--y"], "run_flags": ["--r"]}
    got = executor_with_tool_options(torq, [], [], {"torq_hw": "SL2610", "torq_hw_type": "hw"})
    assert got["options"] == {"torq_hw": "SL2610", "torq_hw_type": "hw"}
    assert executor_with_tool_options(ort, ["--y"], ["--r"], {"torq_hw": "SL2610", "torq_hw_type": "hw"}) is ort
    assert iree["options"] == {"compile_flags": ["--x"]}  # the config is not changed in place


def test_the_newest_opset_of_the_installed_onnx_is_known_without_importing_it():
    """config._ONNX_OPSETS spares every Snakemake start the onnx import; it must say what
    the installed onnx says."""
    import onnx.defs

    from torq_gen_config.config import _onnx_max_opset

    assert _onnx_max_opset() == onnx.defs.onnx_opset_version()
