"""Workflow configuration: schema validation, defaults and path resolution.

The same JSON schema (``workflow/schemas/config.schema.yaml``) validates the
configuration in the Snakefile (``snakemake.utils.validate``) and in the CLI, so
both forms accept exactly the same keys.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
from pathlib import Path
from typing import Any

from . import workflow_files
from .core.errors import ConfigError
from .core.lazy import jsonschema, metadata, onnx, yaml

# in a checkout or an installed wheel (torq_gen_config.workflow_files)
SCHEMA_PATH = workflow_files.schema_dir() / "config.schema.yaml"
DEFAULT_CONFIG_PATH = workflow_files.config_file()
ONNX_PACKAGE_PREFIX = "onnx:"


def load_schema() -> dict:
    """Return the config JSON schema (draft 2020-12) as a dict, with the ``enum`` of an
    executor's ``backend`` filled in from the backend registry (``sorted(BACKEND_KINDS)``)
    and one string key (default ``""``) per run-wide option a backend offers
    (:func:`~torq_gen_config.backends.run_wide_options`, e.g. torq's ``torq_hw``), so
    that registering a backend is the one line it takes to allow it in the config."""
    # function-level: importing the registry imports no backend module until asked (an edit imports none)
    from .backends import BACKEND_KINDS, run_wide_options

    with open(SCHEMA_PATH, encoding="utf-8") as f:
        schema = yaml.safe_load(f)
    schema["properties"]["executors"]["items"]["properties"]["backend"]["enum"] = sorted(BACKEND_KINDS)
    for option in run_wide_options():
        schema["properties"].setdefault(option.key, {"type": "string", "default": "",
                                                     "description": f"{option.help} ({option.flag})"})
    return schema


def load_config_file(path: str | os.PathLike) -> dict:
    """Read a YAML config file.

    Raises:
        ConfigError: missing file or invalid YAML.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, not {type(data).__name__}")
    return data


def validate_config(config: dict) -> dict:
    """Validate ``config`` against the schema, fill in defaults, check cross-field rules.

    Returns:
        A new dict with schema defaults filled in.

    Raises:
        ConfigError: one line naming the offending key and the problem.
    """
    config = copy.deepcopy(config)
    schema = load_schema()  # read once: the coercion and the validator share it
    _coerce_scalars(config, schema)
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = _with_defaults(validator_cls)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ConfigError(f"invalid configuration at {where}: {e.message}")
    check_executors(config["executors"])
    names = [e["name"] for e in config["executors"]]
    unknown = [n for n in config.get("skip_executors", []) if n not in names]
    if unknown:
        raise ConfigError(f"skip_executors names unknown executor(s) {', '.join(unknown)}; configured: {', '.join(names)}")
    if set(config.get("skip_executors", [])) >= set(names):
        raise ConfigError("skip_executors skips every configured executor; nothing would be tested")
    check_values(config)
    return config


def check_values(config: dict) -> None:
    """Checks beyond the schema: finite numbers, ordered ranges, a known opset, and
    executor options that their backend accepts (checked now, not per layer).

    Raises:
        ConfigError: the first problem found, naming the key.
    """
    for key, value in [("timeout_s", config.get("timeout_s"))] + [
            (f"tolerance/{k}", v) for k, v in (config.get("tolerance") or {}).items()]:
        if value is not None and not math.isfinite(float(value)):
            raise ConfigError(f"invalid configuration at {key}: {value} is not a finite number")
    for key in ("float_range", "int_range", "uint8_range"):
        lo, hi = (config.get("inputs") or {}).get(key, (0, 1))
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
            raise ConfigError(f"invalid configuration at inputs/{key}: [{lo}, {hi}] must be finite with low < high")
    max_opset = _onnx_max_opset()
    if max_opset is not None and config.get("target_opset", 17) > max_opset:
        raise ConfigError(f"invalid configuration at target_opset: {config['target_opset']} is newer than the "
                          f"installed onnx supports ({max_opset})")
    check_precision_flags(config)
    try:
        parse_input_shapes(config.get("input_shapes") or [])
    except ConfigError as e:
        raise ConfigError(f"invalid configuration at input_shapes: {e}") from None
    from .backends import make_backend  # light: see load_schema

    for ex in config["executors"]:
        try:
            make_backend(ex)
        except ConfigError as e:
            raise ConfigError(f"invalid configuration at executors ({ex['name']}): {e}") from None
    from .backends.parameters import check_setting  # light: see load_schema

    skipped = set(config.get("skip_executors") or [])
    check_setting(config.get("parameters", "auto"), [e for e in config["executors"] if e["name"] not in skipped])


_ONNX_OPSETS = {"1.23": 28}
"""The newest opset of an onnx release (``onnx.defs.onnx_opset_version()``), for the pinned
one (pyproject.toml): importing onnx to ask costs every Snakemake start about 0.5 s."""


def _onnx_max_opset() -> int | None:
    """The newest ONNX opset the installed onnx knows (None: onnx is not installed)."""
    try:
        release = ".".join(metadata.version("onnx").split(".")[:2])
    except metadata.PackageNotFoundError:  # pragma: no cover
        return None
    if release in _ONNX_OPSETS:
        return _ONNX_OPSETS[release]

    return onnx.defs.onnx_opset_version()


PRECISION_KEYS = ("auto_convert_bf16", "auto_convert_int32", "quantize", "per_channel", "full_integer",
                  "quant_format", "calibration_data", "calibration_samples")
"""Configuration keys of the precision modes: recorded in the report and checked by
``run`` (docs/precision.md)."""

_CLI_FLAG = {"auto_convert_bf16": "--auto-convert-bf16", "auto_convert_int32": "--auto-convert-int32",
             "quantize": "--quantize", "per_channel": "--per-channel", "full_integer": "--full-integer",
             "save_bf16_model": "--save-bf16-model", "calibration_data": "--calibration-data"}


def check_precision_flags(config: dict) -> None:
    """Flag rules of the precision modes (docs/original_tool.md, 'Dtype conversion'):
    bf16 and int32 conversion each exclude ``quantize``; ``per_channel``,
    ``full_integer`` and ``calibration_data`` need ``quantize``;
    ``save_bf16_model`` needs ``auto_convert_bf16``. (With ``full_integer`` the int8
    layer inputs do not match the propagated float values: those layers get
    generated inputs, and their references say so.)

    Raises:
        ConfigError: naming both flags (CLI spelling and config key).
    """
    def on(key):
        return bool(config.get(key))

    for conv in ("auto_convert_bf16", "auto_convert_int32"):
        if on(conv) and on("quantize"):
            raise ConfigError(f"{_CLI_FLAG[conv]} ({conv}) cannot be combined with --quantize (quantize): "
                              "int8 quantization starts from the FP32 model; choose one precision mode")
    for dep in ("per_channel", "full_integer", "calibration_data"):
        if on(dep) and not on("quantize"):
            raise ConfigError(f"{_CLI_FLAG[dep]} ({dep}) needs --quantize (quantize: true)")
    if config.get("quant_format", "qdq") != "qdq" and not on("quantize"):
        raise ConfigError(f"--quant-format {config['quant_format']} (quant_format) needs --quantize (quantize: true)")
    if on("save_bf16_model") and not on("auto_convert_bf16"):
        raise ConfigError("--save-bf16-model (save_bf16_model) needs --auto-convert-bf16 (auto_convert_bf16: true)")


def check_save_bf16_path(model_path: str | os.PathLike, save_path: str | os.PathLike | None) -> None:
    """``--save-bf16-model`` must not name the input model (it would be replaced by
    its bf16 conversion) or a directory.

    Raises:
        ConfigError: naming the path.
    """
    if not save_path:
        return
    save = Path(save_path).expanduser().resolve()
    if save == Path(model_path).expanduser().resolve():
        raise ConfigError(f"--save-bf16-model {save} is the input model itself; it would be overwritten by its bf16 "
                          "conversion: choose another path")
    if save.is_dir():
        raise ConfigError(f"--save-bf16-model {save} is a directory; give a file path (e.g. {save}/model_bf16.onnx)")


def check_precision_matches(report: dict, config: dict, *, report_name: str = "the report") -> None:
    """``run`` must use the precision flags discovery used (as the original tool required,
    without recording them: docs/original_tool.md, 'Dtype conversion'). ``run`` takes them from the report
    (``cli/run.py`` ``with_discovery_inputs``), so this catches only a config that still
    differs; reports written before the flags were recorded count as "all off".

    Raises:
        ConfigError: the flags differ; the message shows both sets as CLI flags.
    """
    recorded = ((report.get("provenance") or {}).get("options") or {})
    defaults = {"auto_convert_bf16": False, "auto_convert_int32": False, "quantize": False, "per_channel": False,
                "full_integer": False, "quant_format": "qdq", "calibration_data": "", "calibration_samples": 20}
    # the number of random samples matters only without a calibration file
    keys = [k for k in PRECISION_KEYS
            if k != "calibration_samples" or (config.get("quantize") and not config.get("calibration_data"))]
    if not config.get("quantize") and not recorded.get("quantize"):
        keys = [k for k in keys if k in ("auto_convert_bf16", "auto_convert_int32", "quantize")]
    disc = {k: recorded.get(k, defaults[k]) for k in keys}
    now = {k: config.get(k, defaults[k]) for k in keys}
    if disc != now:
        raise ConfigError(f"the precision flags differ from discovery's ({report_name}): discovery used "
                          f"{_flags_text(disc)}, this run has {_flags_text(now)}; pass the same flags to run "
                          "(the compiler JSON's line:col refer to the model discovery imported)")


def _flags_text(values: dict) -> str:
    parts = []
    for k, v in values.items():
        if k == "quant_format":
            if values.get("quantize"):
                parts.append(f"--quant-format={v}")
        elif k == "calibration_samples":
            if values.get("quantize") and not values.get("calibration_data"):
                parts.append(f"--calibration-samples={v}")
        elif k == "calibration_data":
            if v:
                parts.append(f"--calibration-data={v}")
        elif v:
            parts.append(_CLI_FLAG[k])
    return "[" + " ".join(parts) + "]" if parts else "[no precision flags]"


def _coerce_scalars(instance, schema: dict) -> None:
    """Turn strings into numbers/booleans where the schema asks for them, in place.

    Snakemake's ``--config key={a: 1}`` parses nested values with YAML's base loader,
    so nested numbers arrive as strings (``'0.01'``); top-level ones are converted by
    Snakemake itself. Strings that do not parse are left for the validator to reject.
    """
    if isinstance(instance, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in instance:
                continue
            value = instance[key]
            if isinstance(value, str):
                instance[key] = _parse_scalar(value, sub.get("type"))
            else:
                _coerce_scalars(value, sub)
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(instance):
            if isinstance(value, str):
                instance[i] = _parse_scalar(value, schema["items"].get("type"))
            else:
                _coerce_scalars(value, schema["items"])


def _parse_scalar(value: str, wanted) -> object:
    try:
        if wanted == "integer":
            return int(value)
        if wanted == "number":
            return float(value)
        if wanted == "boolean" and value.lower() in ("true", "false"):
            return value.lower() == "true"
    except ValueError:
        pass
    return value


def check_executors(executors: list[dict]) -> None:
    """Cross-field checks the schema cannot express: unique executor names.

    Raises:
        ConfigError: duplicate executor name.
    """
    seen: set[str] = set()
    for ex in executors:
        if ex["name"] in seen:
            raise ConfigError(f"executor name {ex['name']!r} is used twice; names must be unique")
        seen.add(ex["name"])


def resolve_model_path(model: str, base_dir: str | os.PathLike | None = None) -> Path:
    """Turn the ``model`` config value into an absolute path.

    ``onnx:<relative path>`` points inside the installed onnx package (the embedded
    default model ships there). Other values are paths relative to ``base_dir``
    (default: the current directory).
    """
    if model.startswith(ONNX_PACKAGE_PREFIX):
        spec = importlib.util.find_spec("onnx")
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError("the onnx package is not installed, cannot resolve " + model)
        return Path(list(spec.submodule_search_locations)[0]) / model[len(ONNX_PACKAGE_PREFIX):]
    p = Path(model).expanduser()
    if not p.is_absolute():
        p = Path(base_dir or os.getcwd()) / p
    return p


def model_name(model_path: str | os.PathLike) -> str:
    """The model name used in file names and the report: the file stem (also of an
    ``onnx:<path in the onnx package>`` value)."""
    return Path(str(model_path).removeprefix(ONNX_PACKAGE_PREFIX)).stem


def _with_defaults(validator_cls: Any) -> Any:
    """Extend a jsonschema validator class so that ``default`` values are filled in."""
    validate_properties = validator_cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_cls, {"properties": set_defaults})


def parse_input_shapes(specs: list[str] | str) -> dict[str, list[int]]:
    """``NAME:1x32x16x16`` entries (Polygraphy's ``--input-shapes`` form; a scalar is
    ``NAME:``; names may contain ``:``, the last one separates) -> ``{name: [dims]}``.

    Raises:
        ConfigError: an entry without ``:``, a dim that is not a non-negative integer,
            or a name given twice.
    """
    if isinstance(specs, str):
        specs = specs.split()
    out: dict[str, list[int]] = {}
    for spec in specs:
        if ":" not in spec:
            raise ConfigError(f"--input-shapes entry {spec!r}: expected NAME:DIMS such as input:1x3x224x224")
        name, dims = spec.rsplit(":", 1)
        if not name:
            raise ConfigError(f"--input-shapes entry {spec!r}: the input name is empty")
        try:
            shape = [int(d) for d in dims.split("x")] if dims.strip() else []
        except ValueError:
            shape = None
        if shape is None or any(d < 0 for d in shape):
            raise ConfigError(f"--input-shapes entry {spec!r}: dims must be non-negative integers separated by 'x'")
        if name in out:
            raise ConfigError(f"--input-shapes gives {name!r} twice")
        out[name] = shape
    return out
