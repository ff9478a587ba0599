"""The checks of a validated config against the model before any job: one place for the
command line (``discover``, ``run``, ``sweep``'s rows) and the Snakemake form (the run
context, in the main process), so that both give the same one-line errors instead of a
failed job later.

What is checked, in this order: the model path (not a ``.tflite``, a file, no braces:
Snakemake wildcards), ``save_bf16_model`` not over the model, the model's graph (a
protobuf with a graph: read without its weights), ``--input-shapes`` against the model's
inputs (names, ranks, static dims), ``--input-data`` against them (names, shapes, dtype
kinds; not with the bf16/int32 conversions, which change the input types first: the
prepare job checks then), and ``--calibration-data`` with ``--quantize``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .config import check_save_bf16_path, parse_input_shapes, resolve_model_path
from .core.errors import ConfigError
from .core.lazy import onnx
from .model.prepare import check_model_file, load_model
from .model.symbolic_dims import fix_symbolic_dims
from .precision.calibration import calibration_samples
from .reference.model_inputs import load_input_data, open_input_data

#: the config keys the checks read
_READ = ("model", "save_bf16_model", "auto_convert_bf16", "auto_convert_int32", "input_shapes", "input_data",
         "quantize", "calibration_data")
#: configs already checked in this process (the command line checks, then runs the
#: workflow in the same process, whose run context would check the same config again)
_CHECKED: set[str] = set()


def check_model_path(config: Mapping[str, Any]) -> str:
    """The model file of ``config`` (``onnx:`` paths resolved), checked without reading it.

    Raises:
        ModelError: a ``.tflite`` model, no such file, a directory, an empty file
            (:func:`~torq_gen_config.model.prepare.check_model_file`).
        ConfigError: braces in its path, or ``save_bf16_model`` would overwrite it.
    """
    model_path = str(resolve_model_path(config["model"]))
    check_model_file(model_path)
    if "{" in model_path or "}" in model_path:
        raise ConfigError(f"the model path must not contain braces (Snakemake wildcards): {model_path}; "
                          "rename or copy the file")
    check_save_bf16_path(model_path, config["save_bf16_model"] if config["auto_convert_bf16"] else None)
    return model_path


def preflight(config: Mapping[str, Any]) -> None:
    """Check a validated config (:func:`torq_gen_config.config.validate_config`) against
    its model before any job runs (module docstring); a config checked before in this
    process is not checked again.

    Raises:
        ConfigError, ModelError: see :func:`check_model_path`; an ``--input-shapes`` entry that names
            no input or contradicts a static dim; ``--input-data`` the model does not take;
            unreadable calibration data.
        ModelError: the model is not an ONNX file (not a protobuf, truncated, no graph);
            input data of another shape or dtype kind than the model takes.
    """
    key = repr([config.get(k) for k in _READ])
    if key in _CHECKED:
        return
    model_path = check_model_path(config)
    model = load_model(model_path, graph_only=True)
    if config.get("input_shapes") or config.get("input_data"):
        inputs_only = onnx.ModelProto()
        weights = {t.name for t in model.graph.initializer}  # opset < 9 models list them as inputs
        inputs_only.graph.input.extend(vi for vi in model.graph.input if vi.name not in weights)
        if config.get("input_shapes"):
            fix_symbolic_dims(inputs_only, parse_input_shapes(config["input_shapes"]))
        if config.get("input_data"):
            if not Path(config["input_data"]).is_file():
                raise ConfigError(f"--input-data {config['input_data']}: no such file")
            open_input_data(config["input_data"]).close()  # not an .npz or .npy: said now
            if not (config["auto_convert_bf16"] or config["auto_convert_int32"]):
                load_input_data(config["input_data"], inputs_only)
    if config["quantize"] and config["calibration_data"]:
        calibration_samples(model, n=1, seed=0, data_path=config["calibration_data"])
    _CHECKED.add(key)
