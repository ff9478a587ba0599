"""``torq-gen-config run``: run the whole model with the discovered assignment.

Reads the report JSON of the output directory (and regenerates the compiler JSON
from it), or, without a report, the compiler JSON as it is; computes each layer's
executor; then runs the full-model part of the Snakemake workflow
(``rules/full_model.smk``): the prepared model as a chain of partitions, each
compiled for its executor and run in order, compared with the ONNX Runtime
reference of the whole model. When every assigned executor is of the torq
backend, the whole model (``work/full.mlir``) is compiled once by torq-compile
with ``--torq-executor-map`` and run once (docs/torq_backend.md); torq and
non-torq executors in one assignment are bad input. ``--run-mode`` (config ``run_mode``):
``auto`` compiles an assignment of IREE executors whose devices are here as ONE IREE module with
per-op devices, ``module`` forces it (impossible: exit 2), ``partitions`` the chain
(:mod:`torq_gen_config.fullrun.module.mode`). The result goes into the report (``full_model``
section and the "--- Full Model Comparison ---" part of ``final_report_text``).
In subgraph mode (``--subgraph-from``/``--subgraph-to``) the same happens for the
subgraph, with its own report and work directory. What runs is
:func:`torq_gen_config.commands.run.run_assigned` (also the full-subgraph test at the end of a
subgraph ``discover``); here are the options and discovery's settings that ``run`` follows.

Exit status: 0 when the outputs match the reference, 1 for a difference, an error
(a partition failed to import, compile or run) or an unverified run, 2 for bad
input (no JSON, unknown executor, torq mixed with other executors, invalid model
or config).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import ConfigError, ReportError
from ..core.fileio import read_json
from ..commands.outputs import output_layout
from ..commands.run import reduce_assigned, run_assigned
from ..core.layout import PREPARED_MODEL_FILE, report_file
from ..model.prepare import load_model
from ..reference.model_inputs import load_input_data
from .options import (
    add_execution_options,
    add_keep_work_option,
    add_model_options,
    add_reduce_options,
    build_config,
    resolve_execution_options,
)


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``run`` subcommand."""
    p = sub.add_parser(
        "run",
        help="run the whole model with the discovered assignment and compare it with ONNX Runtime",
        description="Run the whole model with each layer on its assigned executor (from the report JSON, else the "
                    "compiler JSON, in --output-dir) as a chain of partitions, and compare the outputs with the "
                    "ONNX Runtime reference of the full model. With --subgraph-from/--subgraph-to: the subgraph "
                    "of a subgraph discovery, with its own report (docs/subgraph.md). Exit status 0: match; "
                    "1: difference or error; 2: bad input.",
    )
    add_model_options(p)
    add_execution_options(p, what="parallel compile jobs")
    p.add_argument("--run-mode", choices=["auto", "module", "partitions"],
                   help="module: the whole assignment as ONE IREE module with one device per executor (where each "
                        "op ran is read back from the compiled program); partitions: a chain of same-executor "
                        "partitions; auto (the config's run_mode, default): module when every assigned executor "
                        "is an IREE executor whose device is here (llvm-cpu, vmvx; cuda where a GPU is) and no "
                        "If/Loop body is assigned elsewhere, else "
                        "partitions (docs/full_model_run.md, 'Module mode')")
    p.add_argument("--debug-ir", metavar="DIR",
                   help="dump IREE's IR after each compilation phase of every partition to DIR/<partition id>; "
                        "in module mode the placed IR, the stream-level IR, the dispatch sources and the placement "
                        "record to DIR/<module pid> (README.txt there says how to read them)")
    p.add_argument("--compile-batch", type=int, metavar="N",
                   help="partitions compiled by one compiler process per iree executor (default: the config's "
                        "compile_batch; 1 = one compile per partition); the results are the same "
                        "(docs/full_model_run.md, 'Compile batches')")
    p.add_argument("--compiler-option", action="append", default=[], metavar="OPT",
                   help="extra flag for the compiler of iree executors (repeatable; write --compiler-option=--flag "
                        "for values that start with '-'); changing it recompiles")
    p.add_argument("--runtime-option", action="append", default=[], metavar="OPT",
                   help="extra flag for the runtime of iree executors (repeatable; --runtime-option=--flag)")
    add_keep_work_option(p)
    add_reduce_options(p)
    p.add_argument("-q", "--quiet", action="store_true", help="show progress lines only, not each job")
    p.add_argument("-v", "--verbose", action="store_true", help="print full failure messages and Snakemake's debug output")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the full model (in subgraph mode, the subgraph); print its comparison.
    Returns the exit status (0/1; bad input raises a TorqGenConfigError, which the
    command turns into status 2)."""
    from ..fullrun.reduce.search import parse_budget

    resolve_execution_options(args)
    config = build_config(args)
    layout = output_layout(config)
    out = Path(args.output_dir).expanduser().resolve()
    report_path = out / report_file(layout["name"])
    if report_path.is_file():
        from ..report.build import check_report
        from ..report.staleness import staleness

        recorded = read_json(report_path, "report JSON")
        check_report(recorded, str(report_path))
        stale = staleness(report_path, recorded, args.model)
        if stale:
            raise ReportError(f"{report_path.name}: {stale[0]}")
        config = with_discovery_inputs(config, recorded, args, layout, report_name=report_path.name,
                                       work=out / layout["work"])
    debug_ir = str(Path(args.debug_ir).expanduser().resolve()) if args.debug_ir else None
    budget = parse_budget(args.reduce_budget)  # a bad bound is an error before the run
    if args.reduce_budget and not args.reduce:
        raise ConfigError("--reduce-budget needs --reduce")
    status, section = run_assigned(config=config, out=out, layout=layout, cores=args.cores, quiet=args.quiet,
                                   verbose=args.verbose, debug_ir=debug_ir, model_arg=args.model,
                                   output_dir_arg=args.output_dir, profile=args.profile)
    if args.reduce:
        reduce_assigned(config=config, out=out, layout=layout, section=section, cores=args.cores or 1,
                        budget=budget)
    return status


#: Settings that define the prepared model, its input values and the layers' files: ``run``
#: uses discovery's (the compiler JSON's line:col and the layers' verdicts refer to them).
DISCOVERY_INPUT_KEYS = ("input_shapes", "target_opset", "inputs", "input_data", "layer_inputs",
                        "auto_convert_bf16", "auto_convert_int32", "save_bf16_model", "quantize", "per_channel",
                        "full_integer", "quant_format", "calibration_data", "calibration_samples")
#: Of those, the ones that change the model ``run`` runs: another value on run's command
#: line is refused (rerun discover with it first)
MODEL_DEFINING_FLAGS = {"target_opset": "--target-opset", "auto_convert_bf16": "--auto-convert-bf16",
                        "auto_convert_int32": "--auto-convert-int32", "save_bf16_model": "--save-bf16-model",
                        "quantize": "--quantize", "per_channel": "--per-channel", "full_integer": "--full-integer",
                        "quant_format": "--quant-format", "calibration_data": "--calibration-data",
                        "calibration_samples": "--calibration-samples"}


def with_discovery_inputs(config: dict, report: dict, args: argparse.Namespace, layout: dict, *,
                          report_name: str = "the report", work: Path | None = None) -> dict:
    """``config`` with discovery's settings (``DISCOVERY_INPUT_KEYS`` recorded in the report's
    provenance): the prepared model ``run`` partitions, its input values and the layers'
    files are the ones discovery made, so ``run`` re-makes none of them. ``--input-data``
    other than discovery's feeds only the full-model reference (config ``run_input_data``);
    other ``--input-shapes`` or model-defining flags
    (:data:`MODEL_DEFINING_FLAGS`: opset, precision conversion, quantization) than
    discovery's are refused. A setting the report does not record (an older report) is
    left as ``config`` has it.

    Raises:
        ConfigError: ``--input-shapes`` or a model-defining flag differs from discovery's,
            or discovery's input data file is gone, or another ``--input-data`` in
            subgraph mode (the subgraph's inputs come from a whole-model run).
        ModelError: another ``--input-data`` that the prepared model's inputs (in
            ``work``) do not take (a name or shape that does not fit).
    """
    recorded = (report.get("provenance") or {}).get("options") or {}
    if not all(k in recorded for k in ("input_shapes", "input_data")):
        return config
    config = dict(config)
    given_shapes = list(getattr(args, "input_shapes", None) or [])
    if given_shapes:
        from ..config import parse_input_shapes

        fixed = ((report.get("provenance") or {}).get("model") or {}).get("fixed_dims") or []
        set_by_discovery = {(d["input"], d["axis"]): d.get("to", 1) for d in fixed}
        for name, shape in parse_input_shapes(given_shapes).items():
            for axis, dim in enumerate(shape):
                if set_by_discovery.get((name, axis), dim) != dim:
                    used = ", ".join(f"{d['input']} dim {d['axis']} ({d['was']}) -> {d.get('to', 1)}" for d in fixed)
                    raise ConfigError(f"--input-shapes {' '.join(given_shapes)} differs from the shapes discovery "
                                      f"tested ({used}; {report_name}); rerun discover with the new ones first")
    for key, flag in MODEL_DEFINING_FLAGS.items():
        given = getattr(args, key, None)
        if given in (None, False) or key not in recorded:  # not on run's command line: discovery's applies
            continue
        if key in ("save_bf16_model", "calibration_data"):
            given = str(Path(given).expanduser().resolve())
        if given != recorded[key]:
            asked = flag if given is True else f"{flag} {given}"
            had = recorded[key] if recorded[key] not in (None, False, "") else "not given"
            raise ConfigError(f"{asked} differs from discovery's ({flag}: {had}; {report_name}): run follows the "
                              "discovery it runs; rerun discover with it first")
    for key in DISCOVERY_INPUT_KEYS:
        if key in recorded and key != "input_data":
            config[key] = recorded[key]
    if getattr(args, "reference", None) is None and recorded.get("reference"):
        config["reference"] = recorded["reference"]
    discovery_data = recorded.get("input_data") or ""
    given_data = config.get("input_data") if getattr(args, "input_data", None) else None
    if discovery_data and not Path(discovery_data).is_file():
        raise ConfigError(f"discovery's --input-data {discovery_data} ({report_name}) no longer exists; rerun discover")
    config["input_data"] = discovery_data
    if given_data and given_data != discovery_data:
        if layout.get("subgraph"):
            raise ConfigError("in subgraph mode the subgraph's inputs come from a whole-model run on discovery's "
                              "model inputs; pass --input-data to discover instead")
        prepared = Path(work or "") / PREPARED_MODEL_FILE
        if work is not None and prepared.is_file():  # the model's inputs take it: else one line now
            load_input_data(given_data, load_model(prepared, graph_only=True))
        config["run_input_data"] = given_data
    return config
