"""The weights setting (torq_gen_config.backends.parameters, docs/parameters.md): how auto
resolves and says why, the executor definitions of external mode, and the refusal of
external with a torq executor (config, CLI)."""

from __future__ import annotations

import pytest
from conftest import REPO, SQUEEZENET, cli_in_process, one_line_error

from torq_gen_config.backends.parameters import describe, resolve, resolve_from, size_text, with_parameters
from torq_gen_config.config import DEFAULT_CONFIG_PATH, load_config_file, validate_config
from torq_gen_config.core.errors import ConfigError

IREE = {"name": "llvm-cpu", "backend": "iree", "options": {"target": "llvm-cpu", "run_flags": ["--x"]}}
ORT = {"name": "ort", "backend": "onnxruntime", "options": {}}
NSS = {"name": "nss", "backend": "torq", "options": {"executor": "nss"}}
GIB = 1 << 30


def test_auto_is_external_from_the_threshold_and_says_why():
    r = resolve("auto", 1024, int(1.2 * GIB), [IREE, ORT])
    assert r["mode"] == "external"
    assert describe(r) == "external (auto: 1.2 GiB of weights >= 1024 MiB)"
    small = resolve("auto", 1024, 5 << 20, [IREE, ORT])
    assert describe(small) == "inline (auto: 5.0 MiB of weights < 1024 MiB)"
    assert resolve("auto", 0.5, 1 << 20, [IREE])["mode"] == "external"  # a fraction of a MiB
    assert resolve("auto", 1024, None, [IREE])["mode"] == "inline"
    assert resolve_from({"setting": "auto", "auto_mb": 1}, {"weights": {"tensor_bytes": 2 << 20}}, [IREE])["mode"] \
        == "external"
    assert size_text(512) == "512 B" and size_text(1536) == "1.5 KiB"


def test_explicit_settings_and_torq():
    assert describe(resolve("inline", 1024, 10 * GIB, [IREE])) == "inline (chosen with --parameters or in the config)"
    assert describe(resolve("external", 1024, 0, [IREE])) == "external (chosen with --parameters or in the config)"
    pinned = resolve("auto", 1, 10 * GIB, [IREE, NSS])
    assert pinned["mode"] == "inline" and "'nss'" in pinned["reason"] and "compile time" in pinned["reason"]
    with pytest.raises(ConfigError, match="external.*'nss'.*compile time"):
        resolve("external", 1024, 0, [IREE, NSS])


def test_external_executor_definitions():
    ext = with_parameters(IREE, {"mode": "external"}, ["/w/weights.irpa", "/w/folded.irpa"])
    assert ext["parameters"] == "external"
    assert ext["options"]["run_flags"] == ["--x", "--parameters=model=/w/weights.irpa",
                                           "--parameters=model=/w/folded.irpa"]
    assert IREE["options"]["run_flags"] == ["--x"]  # a new dict
    assert with_parameters(IREE, {"mode": "inline"}, ["/w/weights.irpa"]) == IREE
    assert with_parameters(ORT, {"mode": "external"}, ["/w/weights.irpa"]) == ORT  # it reads the ONNX model


def test_config_refuses_external_with_a_torq_executor():
    torq = load_config_file(REPO / "config" / "torq.yaml")
    with pytest.raises(ConfigError, match="parameters: external"):
        validate_config({**torq, "parameters": "external"})
    assert validate_config({**torq, "parameters": "auto"})["parameters"] == "auto"
    cfg = load_config_file(DEFAULT_CONFIG_PATH)
    assert (cfg["parameters"], cfg["parameters_auto_mb"]) == ("auto", 1024)
    with pytest.raises(ConfigError, match="parameters"):
        validate_config({**cfg, "parameters": "sometimes"})
    both = {**cfg, "executors": cfg["executors"] + torq["executors"][:1], "skip_executors": ["nss"],
            "parameters": "external"}
    assert validate_config(both)["parameters"] == "external"  # the torq executor is skipped


def test_cli_external_with_torq_is_a_one_line_error(tmp_path, capsys):
    r = cli_in_process(capsys, "discover", "--model", SQUEEZENET, "--output-dir", tmp_path, "--config-file",
                       REPO / "config" / "torq.yaml", "--parameters", "external")
    assert r.returncode == 2
    assert "packs the weights" in one_line_error(r)
