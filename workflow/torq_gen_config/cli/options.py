"""Option groups shared by the commands (model, executors, tolerance, precision, tool
options) and the one place that turns parsed options into a workflow config and an output
layout (the Polygraphy pattern: defined once, subscribed to by each command)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .. import workflow_files
from ..backends import run_wide_options
from ..core.errors import ConfigError


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Options shared by the commands that work on a model (discover, run)."""
    p.add_argument("--model", required=True, help="path to the ONNX model (.onnx); onnx:<path> is a file inside the "
                                                  "installed onnx package, e.g. the embedded default "
                                                  "onnx:backend/test/data/light/light_squeezenet.onnx")
    p.add_argument("--output-dir", default=".", help="directory for the report and compiler JSON (default: current directory); "
                                                       "intermediate files go to <output-dir>/work")
    p.add_argument("--config-file", help="YAML file with workflow settings (executors, tolerance, ...) "
                                         "on top of config/config.yaml; a preset of the workflow (config/gpu.yaml, "
                                         "config/torq.yaml) is found from any directory")
    p.add_argument("--subgraph-from", metavar="OP",
                   help="subgraph mode: first node of the range, as layer ID (<OpType>_<first output name>) or "
                        "output name (with --subgraph-to); files get _subgraph_<f>_<t> in their names")
    p.add_argument("--subgraph-to", metavar="OP",
                   help="subgraph mode: last node of the range (inclusive)")
    p.add_argument("--input-data", metavar="FILE.npz",
                   help="model inputs keyed by input name (arrays of the input's shape, or [N, *shape]: the first "
                        "sample is used); they feed the whole-model reference run (layer inputs) and the full-model "
                        "run, and set symbolic dims (default: seeded, op-aware generated inputs)")
    p.add_argument("--input-shapes", nargs="+", metavar="NAME:DIMS",
                   help="values of symbolic input dims, e.g. --input-shapes input:1x3x224x224 mask:1x77 (dims not "
                        "given default to 1; the report lists what was fixed)")
    p.add_argument("--reference", choices=["onnxruntime", "onnx"],
                   help="the reference verdicts are computed against: onnxruntime (default; ONNX Runtime CPU, "
                        "optimizations off) or onnx (onnx's reference implementation of the spec); the other one is "
                        "recorded as a second opinion and disputes are listed")
    p.add_argument("--target-opset", type=int, metavar="N",
                   help="upgrade models below opset N to N (default 17: IREE's importer needs it for several ops); "
                        "an upgrade that would change the model's inputs or outputs is not applied")
    p.add_argument("--parameters", choices=["auto", "inline", "external"],
                   help="how compiled modules get the weights (docs/parameters.md): inline (module constants), "
                        "external (IREE parameters loaded at run time from work/<model>/weights.irpa; not with torq "
                        "executors) or auto (default: external when the weights are >= parameters_auto_mb MiB)")
    add_precision_options(p)


def add_execution_options(p: argparse.ArgumentParser, *, what: str = "parallel jobs") -> None:
    """Where the jobs run (discover, run): -j and a Snakemake profile (a cluster's)."""
    p.add_argument("-j", "--jobs", "--cores", dest="cores", type=int, default=None,
                   help=f"{what} (default: number of CPU cores; with a cluster --profile: jobs submitted at a "
                        "time, default the profile's)")
    p.add_argument("--profile", metavar="DIR",
                   help="Snakemake profile to run with instead of profiles/default, e.g. profiles/slurm (every job "
                        "but the cheap ones submitted to SLURM; needs pip install -e '.[cluster]'; README, "
                        "\"Running on a cluster\")")


def add_keep_work_option(p: argparse.ArgumentParser) -> None:
    """``--keep-work minimal|all`` (discover, run): what a finished run keeps in its work directory."""
    p.add_argument("--keep-work", choices=["minimal", "all"],
                   help="minimal (default): once the report is written, remove what the finished run no longer "
                        "needs (compiled modules, batch and layer MLIR, partition modules: each a copy of the "
                        "weights); a later job that needs one makes it again; all: keep every intermediate in "
                        "<output-dir>/work/<model> (a re-target reuses its compiled batch)")
    p.add_argument("--keep-outputs", action="store_true", default=None,
                   help="keep every executor's outputs of each layer test (<layer>/<executor>/outputs.npz); by "
                        "default they are kept only where the verdict is not a success. Applies to the tests this run "
                        "makes: add --recompute-cache to test again what is up to date")


def add_reduce_options(p: argparse.ArgumentParser, *, what: str = "the run") -> None:
    """``--reduce`` and ``--reduce-budget`` (run; discover in subgraph mode: the full-subgraph test)."""
    p.add_argument("--reduce", action="store_true",
                   help=f"when {what} fails (compile, run, or a difference beyond tolerance), search for the "
                        "smallest subgraph that fails the same way under the same assignment (bisect, then node by "
                        "node) and write it with its inputs and a one-line reproducer to reduced/ beside the report "
                        "(docs/full_model_run.md, 'Reducing a failing run')")
    p.add_argument("--reduce-budget", metavar="BOUND",
                   help="bound of --reduce: seconds (600, 600s, 10m, 1h) and/or partition compiles (40c), "
                        "comma-separated (default: unbounded); candidates already run are reused free")


def resolve_execution_options(args: argparse.Namespace) -> None:
    """Check -j and --profile before any work: a cluster profile whose plugin is missing or
    whose controller does not answer is a one-line error now (not a 9 s wait and a failed
    submission later). Without a profile, -j defaults to the number of CPU cores. A profile
    of the workflow's (``profiles/slurm``) is found from any directory, also in a wheel
    (``args.profile`` becomes its path: :func:`workflow_files.resolve_preset`). A local run
    imports the slurm executor plugin, when installed, without its import-time probe of
    the SLURM controller (:func:`cluster.import_slurm_plugin_without_probe`: up to 9 s).

    Raises:
        ConfigError: -j below 1, or the profile cannot be used.
    """
    from ..pipeline.cluster import check_profile, import_slurm_plugin_without_probe, is_local

    if args.cores is not None and args.cores < 1:
        raise ConfigError("--jobs must be at least 1")
    executor = "local"
    if getattr(args, "profile", None):
        # profiles/slurm is also found from another directory, or in an installed wheel
        args.profile = str(workflow_files.resolve_preset(args.profile))
        executor = check_profile(args.profile)
    elif args.cores is None:
        args.cores = os.cpu_count() or 1
    if is_local(executor):  # the slurm plugin's `scontrol show config` at import: not for a local run
        import_slurm_plugin_without_probe()


def add_precision_options(p: argparse.ArgumentParser) -> None:
    """The precision-mode options (docs/precision.md); ``run`` follows discovery's (another value is refused)."""
    g = p.add_argument_group("precision modes (docs/precision.md; run follows discovery's: another value is refused)")
    g.add_argument("--auto-convert-bf16", action="store_true",
                   help="convert FP32 tensors to BF16 before the layer split (schema-aware; model I/O become bf16; "
                        "opset 22); references are computed in fp32 on bf16-rounded inputs and rounded to bf16")
    g.add_argument("--save-bf16-model", metavar="PATH", help="with --auto-convert-bf16, also save the converted model")
    g.add_argument("--auto-convert-int32", action="store_true",
                   help="convert INT64 tensors to INT32 (UINT64 to UINT32); INT64_MIN/MAX sentinels are clamped, "
                        "other out-of-range values are an error")
    g.add_argument("--quantize", action="store_true",
                   help="int8 (A8W8) static quantization with onnxruntime.quantization: each layer on its own for "
                        "its tests, the whole model once for the MLIR locations and the full-model run")
    g.add_argument("--per-channel", action="store_true", help="with --quantize: per-channel weight scales")
    g.add_argument("--full-integer", action="store_true",
                   help="with --quantize: int8 model I/O (graph-input QuantizeLinear / graph-output "
                        "DequantizeLinear removed)")
    g.add_argument("--quant-format", choices=["qdq", "qoperator", "hybrid"],
                   help="with --quantize: qdq (default), qoperator (QLinearConv, ...) or hybrid (QOperator where "
                        "every compute op is supported, else QDQ)")
    g.add_argument("--calibration-data", metavar="FILE.npz",
                   help="with --quantize: calibration samples keyed by model input name (arrays [N, *shape] or "
                        "one sample); default: seeded random samples in the float input range")
    g.add_argument("--calibration-samples", type=int, metavar="N",
                   help="with --quantize and no --calibration-data: number of random calibration samples (default 20)")


def build_config(args: argparse.Namespace) -> dict:
    """The validated workflow config for the given command-line options.

    Raises:
        ConfigError: an invalid config file or option value.
        ModelError: the model is missing, unreadable or not ONNX.
    """
    from ..config import DEFAULT_CONFIG_PATH, load_config_file, resolve_model_path, validate_config
    from ..preflight import preflight

    absent = workflow_files.missing()
    if absent:
        raise ConfigError(absent)
    model = resolve_model_path(args.model).resolve()  # also onnx:<path in the onnx package>, as in the config
    config = load_config_file(DEFAULT_CONFIG_PATH)
    if getattr(args, "config_file", None):
        # config/gpu.yaml and config/torq.yaml are also found from another directory (and in a wheel)
        config.update(load_config_file(workflow_files.resolve_preset(args.config_file)))
    config["model"] = str(model)
    config["output_dir"] = "."
    tol = dict(config.get("tolerance") or {})
    if getattr(args, "tolerance_avg", None) is not None:
        tol["fp_avg_tol"] = args.tolerance_avg
    if getattr(args, "tolerance_max", None) is not None:
        tol["fp_max_tol"] = args.tolerance_max
    if tol:
        config["tolerance"] = tol
    if getattr(args, "timeout", None) is not None:
        config["timeout_s"] = args.timeout
    if getattr(args, "layer_inputs", None):
        config["layer_inputs"] = args.layer_inputs
    if getattr(args, "input_data", None):
        config["input_data"] = str(Path(args.input_data).expanduser().resolve())
    if getattr(args, "input_shapes", None):
        config["input_shapes"] = list(args.input_shapes)
    if getattr(args, "reference", None):
        config["reference"] = args.reference
    if getattr(args, "target_opset", None) is not None:
        config["target_opset"] = args.target_opset
    if getattr(args, "dedup_layers", False):
        config["dedup_layers"] = True
    if getattr(args, "compile_batch", None) is not None:
        config["compile_batch"] = args.compile_batch
    if getattr(args, "parameters", None):
        config["parameters"] = args.parameters
    if getattr(args, "keep_work", None):
        config["keep_work"] = args.keep_work
    if getattr(args, "keep_outputs", None):
        config["keep_outputs"] = True
    if getattr(args, "run_mode", None):
        config["run_mode"] = args.run_mode
    if getattr(args, "skip_mode", False):
        config["skip_mode"] = True
    if getattr(args, "skip_executors", None):
        config["skip_executors"] = _csv(args.skip_executors)
    for option in run_wide_options():
        if getattr(args, option.key, None):
            config[option.key] = getattr(args, option.key)
    if getattr(args, "compiler_option", None):
        config["compiler_options"] = list(args.compiler_option)
    if getattr(args, "runtime_option", None):
        config["runtime_options"] = list(args.runtime_option)
    if getattr(args, "collect_timing", False):
        config["collect_timing"] = True
    if getattr(args, "timing_runs", None) is not None:
        config["timing_runs"] = args.timing_runs
    if getattr(args, "timing_warmup", None) is not None:
        config["timing_warmup"] = args.timing_warmup
    if getattr(args, "recommend_by_timing", False):
        config["recommend_by_timing"] = True
    if getattr(args, "log_file", None):
        config["log_file"] = str(Path(args.log_file).expanduser().resolve())
    if getattr(args, "verbose", False):
        config["verbose"] = True
    if getattr(args, "skip_ops", None):
        config["skip_ops"] = _csv(args.skip_ops)
    if getattr(args, "subgraph_from", None) is not None:
        config["subgraph_from"] = args.subgraph_from
    if getattr(args, "subgraph_to", None) is not None:
        config["subgraph_to"] = args.subgraph_to
    for key in ("auto_convert_bf16", "auto_convert_int32", "quantize", "per_channel", "full_integer"):
        if getattr(args, key, False):
            config[key] = True
    for key in ("save_bf16_model", "calibration_data"):
        if getattr(args, key, None):
            config[key] = str(Path(getattr(args, key)).expanduser().resolve())
    if getattr(args, "quant_format", None):
        config["quant_format"] = args.quant_format
    if getattr(args, "calibration_samples", None) is not None:
        config["calibration_samples"] = args.calibration_samples
    if getattr(args, "calibration_samples", None) is not None and not config.get("quantize"):
        raise ConfigError("--calibration-samples needs --quantize")
    config = validate_config(config)
    preflight(config)  # the model and the inputs given for it, as the Snakemake form checks them
    return config


def _csv(text: str) -> list[str]:
    """Split a comma-separated option value, dropping blanks."""
    return [t.strip() for t in text.split(",") if t.strip()]
