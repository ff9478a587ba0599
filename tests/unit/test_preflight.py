"""preflight: the checks of a config against its model before any job, one place for the
command line and the Snakemake form (issue 40 item 4)."""

from __future__ import annotations

import numpy as np
import pytest

from torq_gen_config import preflight as preflight_module
from torq_gen_config.config import DEFAULT_CONFIG_PATH, load_config_file, validate_config
from torq_gen_config.core.errors import ConfigError, ModelError
from torq_gen_config.preflight import preflight


def _config(**patch) -> dict:
    cfg = load_config_file(DEFAULT_CONFIG_PATH)  # the default model: light_squeezenet, input data_0 1x3x224x224
    cfg.update({"output_dir": "out", **patch})
    return validate_config(cfg)


@pytest.mark.parametrize("patch,error,words", [
    ({"model": "missing.onnx"}, ModelError, "model file not found"),
    ({"input_shapes": ["nosuch:1x3x224x224"]}, ConfigError, "which the model does not have"),
    ({"input_shapes": ["data_0:1x3"]}, ConfigError, "has rank 2, the model's input has rank 4"),
    ({"input_data": "absent.npy"}, ConfigError, "no such file"),
])
def test_what_the_model_does_not_take_is_one_error_before_any_job(tmp_path, monkeypatch, patch, error, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=words):
        preflight(_config(**patch))


def test_input_data_of_another_shape_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(ModelError, match="data_0. has shape 1x3x8x8, the model expects 1x3x224x224"):
        preflight(_config(input_data=str(tmp_path / "x.npy")))
    np.save(tmp_path / "y.npy", np.zeros((1, 3, 224, 224), np.float32))
    preflight(_config(input_data=str(tmp_path / "y.npy")))


def test_a_config_checked_once_per_process(tmp_path, monkeypatch):
    """The command line checks, then runs the workflow in its process: the run context's
    parse does not read the model again (a 4 GB model's graph)."""
    calls = []
    real = preflight_module.load_model
    monkeypatch.setattr(preflight_module, "load_model", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(preflight_module, "_CHECKED", set())
    config = _config(input_shapes=["data_0:1x3x224x224"])
    preflight(config)
    preflight({**config, "output_dir": "elsewhere"})  # what the checks do not read may differ
    assert len(calls) == 1
    with pytest.raises(ConfigError, match="only its dynamic dims can be set"):  # another config: checked
        preflight({**config, "input_shapes": ["data_0:1x3x112x112"]})
    assert len(calls) == 2
