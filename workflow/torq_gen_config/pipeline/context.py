"""One run context: what a discovery run is, computed once from its (validated) config.

:class:`RunContext` is a frozen object: the model, the report name, every path of the
output and work directories (from :mod:`torq_gen_config.core.layout`), the executors
(configured, unavailable on this machine, used), the precision settings, the compile
batches and the limits. ``rules/common.smk`` builds it once per parse and the rules wire
its fields; the command line names its files with the same rule
(:func:`torq_gen_config.model.subgraph.run_names`).

:class:`RunInputs` holds what needs the DAG: the input and param functions of the rules
after the split and plan checkpoints (the ``checkpoints`` object of the Snakefile is
given to it), with their caches (a manifest or plan read once per mtime).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import backends
from ..backends import parameters as weights_mode
from ..config import (
    PRECISION_KEYS,
    model_name,
    parse_input_shapes,
    resolve_model_path,
)
from ..core import layout, run_lock
from ..core.errors import ConfigError, ReportError
from ..core.fileio import damaged_work_file, file_fingerprint, read_json
from ..core.lazy import snakemake_exceptions
from ..core.weight_store import FOLDED_FILE, STORE_FILE
from ..discovery import batch_compile
from ..model import tested_layers as layer_test_plan
from ..model.prepare import model_fingerprint
from ..model.subgraph import run_names
from ..model.subgraph import CONFIG_KEYS as SUBGRAPH_KEYS
from ..preflight import check_model_path
from . import units
from .steps import Untracked, untracked
from .steps import full_model as full_model_steps
from .markers import skipped_rerun_token, timeout_rerun_token

#: A unit's drift when nothing changed outside the workflow (and before any unit record).
NO_DRIFT = {"prepared": [], "results": {}}


def canonical(value: Any) -> Any:
    """``value`` (JSON data) with its keys in sorted order: Snakemake compares params by
    their text, and the same executor written with its keys in another order must not
    rerun its jobs."""
    return json.loads(json.dumps(value, sort_keys=True))


def _list_of(path: str | None) -> list[str]:
    return [path] if path else []


@dataclass(frozen=True)
class RunContext:
    """One discovery run (built by :meth:`from_config`); every path is normalised as the
    rules have always written it (relative to Snakemake's working directory when the
    output directory is)."""

    config: Mapping[str, Any]
    model_path: str
    out: str
    model_name: str
    subgraph: dict | None
    #: the names of the files under the output directory (layout)
    work: str
    report: str
    compiler_json: str
    html_report: str
    user_choices: str
    run_lock: str
    report_outdated: str
    #: folders of the work directory
    layers: str
    logs: str
    quant: str
    units: str
    batches: str
    full: str
    parts: str
    part_batches: str
    #: files of the work directory
    prepared_model: str
    prepare_info: str
    model_inputs: str
    weights: str
    folded: str
    full_mlir: str
    locations: str
    manifest: str
    report_summary: str
    calibration: str
    quantized_model: str
    quantize_info: str
    quant_manifest: str
    full_assignment: str
    full_plan: str
    full_reference: str
    full_result: str
    weight_archives: tuple[str, ...]
    #: executors: as configured (minus skip_executors), this machine's unavailable ones
    #: (name -> reason), those that get jobs
    configured_executors: Mapping[str, dict]
    unavailable: Mapping[str, str]
    executors: Mapping[str, dict]
    #: precision, inputs, batches, limits
    conversion: Mapping[str, Any]
    quant_settings: Mapping[str, Any] | None
    layer_precision: Mapping[str, Any]
    input_shapes: Mapping[str, list[int]]
    compile_batch: int
    batched: Mapping[str, bool]
    import_mlir: bool
    parameter_settings: Mapping[str, Any]
    timeout: Untracked

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, probe: bool = True) -> RunContext:
        """The context of a validated config (:func:`torq_gen_config.config.validate_config`).
        ``probe``: ask which executors' devices this machine lacks (once per process per
        definition: the DAG has no jobs for them); without, every configured one is used.

        Raises:
            ConfigError, ModelError: the model is missing, a TFLite file, or its path or the
                output directory holds braces; save_bf16_model would overwrite the model; a
                subgraph end is unknown; the input shapes do not parse; no configured executor
                can run on this machine.
        """
        model_path = check_model_path(config)  # the checks that read the model: preflight (main process)
        out = os.path.normpath(config["output_dir"] or os.path.join("results", model_name(model_path)))
        if "{" in out or "}" in out:
            raise ConfigError(f"output_dir must not contain braces (Snakemake wildcards): {out}")
        names = run_names(config, model_path, labels=SUBGRAPH_KEYS)
        name = names.name
        work = os.path.normpath(os.path.join(out, names.work))
        full, quant = os.path.join(work, layout.FULL_DIR), os.path.join(work, layout.QUANT_DIR)
        configured = {e["name"]: e for e in config["executors"] if e["name"] not in config["skip_executors"]}
        unavailable = backends.unavailable_executors(
            [backends.executor_with_tool_options(e, config["compiler_options"], config["runtime_options"],
                                                 backends.run_wide_overrides(config)) for e in configured.values()],
            timeout_s=config["timeout_s"]) if probe else {}
        if len(unavailable) == len(configured):
            raise ConfigError("no configured executor can run on this machine: "
                              + "; ".join(f"{n}: {r}" for n, r in unavailable.items()))
        executors = {n: e for n, e in configured.items() if n not in unavailable}
        quant_settings = ({k: config[k] for k in ("quant_format", "per_channel", "full_integer")}
                          if config["quantize"] else None)
        compile_batch = config["compile_batch"]
        return cls(
            config=config, model_path=model_path, out=out, model_name=name, subgraph=names.subgraph,
            work=work,
            report=os.path.normpath(os.path.join(out, layout.report_file(name))),
            compiler_json=os.path.normpath(os.path.join(out, layout.compiler_file(name))),
            html_report=os.path.normpath(os.path.join(out, layout.html_report_file(name))),
            user_choices=os.path.normpath(os.path.join(out, layout.user_choices_file(name))),
            run_lock=os.path.join(out, layout.lock_file(name)),
            report_outdated=os.path.join(work, layout.OUTDATED_MARKER),
            layers=os.path.join(work, layout.LAYERS_DIR), logs=os.path.join(work, layout.LOGS_DIR),
            quant=quant, units=os.path.join(work, layout.UNITS_DIR),
            batches=os.path.join(work, layout.BATCHES_DIR), full=full,
            parts=os.path.join(full, layout.PARTITIONS_DIR), part_batches=os.path.join(full, layout.BATCHES_DIR),
            prepared_model=os.path.join(work, layout.PREPARED_MODEL_FILE),
            prepare_info=os.path.join(work, layout.PREPARE_INFO_FILE),
            model_inputs=os.path.join(work, layout.MODEL_INPUTS_FILE),
            weights=os.path.join(work, STORE_FILE), folded=os.path.join(work, FOLDED_FILE),
            full_mlir=os.path.join(work, layout.FULL_MLIR_FILE), locations=os.path.join(work, layout.LOCATIONS_FILE),
            manifest=os.path.join(work, layout.LAYERS_DIR, layout.MANIFEST_FILE),
            report_summary=os.path.join(work, layout.REPORT_SUMMARY_FILE),
            calibration=os.path.join(quant, layout.CALIBRATION_FILE),
            quantized_model=os.path.join(quant, layout.QUANTIZED_MODEL_FILE),
            quantize_info=os.path.join(quant, layout.QUANTIZE_INFO_FILE),
            quant_manifest=os.path.join(quant, layout.MANIFEST_FILE),
            full_assignment=os.path.join(full, layout.ASSIGNMENT_FILE), full_plan=os.path.join(full, layout.PLAN_FILE),
            full_reference=os.path.join(full, layout.REFERENCE_FILE), full_result=os.path.join(full, layout.RESULT_FILE),
            weight_archives=tuple(weights_mode.archives(work)),
            configured_executors=configured, unavailable=unavailable, executors=executors,
            conversion={k: config[k] for k in ("auto_convert_bf16", "auto_convert_int32", "save_bf16_model")},
            quant_settings=quant_settings, layer_precision={"quantize": quant_settings},
            input_shapes=parse_input_shapes(config["input_shapes"]),
            compile_batch=compile_batch,
            batched={n: compile_batch > 1 and backends.capabilities(e["backend"]).batch_compile
                     for n, e in executors.items()},
            import_mlir=any(backends.needs_mlir(e["backend"]) for e in executors.values()),
            parameter_settings={"setting": config["parameters"], "auto_mb": config["parameters_auto_mb"]},
            timeout=untracked(config["timeout_s"]),
        )

    # ------------------------------------------------------------------ files
    @property
    def quantize(self) -> bool:
        return self.quant_settings is not None

    def log(self, *parts: str) -> str:
        """A job's log file under the work directory's logs."""
        return os.path.join(self.logs, *parts)

    @property
    def final_outputs(self) -> list[str]:
        """The report and compiler JSON; in subgraph mode also the full-subgraph run
        (rules/full_model.smk; `torq-gen-config discover` runs it as a second step and merges
        it into the report)."""
        return [self.report, self.compiler_json] + ([self.full_result] if self.subgraph else [])

    @property
    def subgraph_range(self) -> tuple[str, str] | None:
        """The (from, to) layer IDs of the subgraph (prepare_model cuts it out), or None."""
        sub = self.subgraph
        return (sub["from"]["layer_id"], sub["to"]["layer_id"]) if sub else None

    @property
    def input_data(self) -> list[str]:
        """The user's model-input .npz (input_data), as a list (empty if none)."""
        return _list_of(self.config["input_data"] and str(resolve_model_path(self.config["input_data"])))

    @property
    def calibration_data(self) -> list[str]:
        """The user's calibration .npz (quantize), as a list (empty if none)."""
        data = self.quantize and self.config["calibration_data"]
        return _list_of(data and str(resolve_model_path(data)))

    @property
    def run_input_data(self) -> list[str]:
        """`run --input-data` other than discovery's (full-model reference only), as a list."""
        return _list_of(self.config["run_input_data"] and str(resolve_model_path(self.config["run_input_data"])))

    @property
    def run_model(self) -> str:
        """The model that `run` partitions and the locations describe: the prepared
        model, or with quantize the quantized full model."""
        return self.quantized_model if self.quantize else self.prepared_model

    @property
    def run_manifest(self) -> str:
        """The layers over run_model's nodes: the split's manifest, or with quantize the
        layers mapped onto the quantized model (rule map_quantized_layers)."""
        return self.quant_manifest if self.quantize else self.manifest

    # ------------------------------------------------------------ the params
    def model_fingerprint(self, wildcards=None) -> Any:
        """Which model file (and external weights) this is (a param of prepare_model)."""
        return model_fingerprint(self.model_path)

    def input_data_fingerprint(self, wildcards=None) -> Any:
        """Which input data file this is (a param: rerun triggers do not include "input")."""
        return file_fingerprint(self.input_data[0]) if self.input_data else None

    def run_data_fingerprint(self, wildcards=None) -> Any:
        """Which `run --input-data` file this is, or None."""
        return file_fingerprint(self.run_input_data[0]) if self.run_input_data else None

    def timing(self, wildcards=None) -> dict | None:
        """Runtime measurement settings of the test jobs (a per-job param, so switching
        collect_timing or changing the run counts reruns them), or None when off."""
        if not self.config["collect_timing"]:
            return None
        return {"runs": self.config["timing_runs"], "warmup": self.config["timing_warmup"]}

    @property
    def executor_defs(self) -> list[dict]:
        """The executors that get jobs, keys sorted (the report's)."""
        return [canonical(e) for e in self.executors.values()]

    @property
    def unavailable_defs(self) -> list[dict]:
        """The executors this machine cannot run, with the reason (the report names them once)."""
        return [{"name": n, "backend": self.configured_executors[n]["backend"], "reason": r}
                for n, r in self.unavailable.items()]

    @property
    def plan_executors(self) -> list[dict]:
        """The executors with the run-wide backend settings (torq_hw, ...) applied as in
        discovery (the plan applies compiler/runtime options itself)."""
        return [backends.executor_with_tool_options(e, [], [], backends.run_wide_overrides(self.config))
                for e in self.executors.values()]

    @property
    def full_mlir_weights(self) -> bool:
        """Whether the weights stay in full.mlir: an executor compiles the whole model from it."""
        return any(backends.capabilities(e["backend"]).whole_model() is not None for e in self.executors.values())

    def run_options(self) -> dict:
        """Options recorded in the report's provenance."""
        c = self.config
        return {
            "model": self.model_path, "output_dir": self.out, "target_opset": c["target_opset"],
            "timeout_s": c["timeout_s"], "inputs": c["inputs"], "tolerance": c["tolerance"],
            "skip_executors": c["skip_executors"], "skip_ops": c["skip_ops"], "dedup_layers": c["dedup_layers"],
            "layer_inputs": c["layer_inputs"], "input_data": self.input_data[0] if self.input_data else None,
            "input_shapes": c["input_shapes"], "reference": c["reference"], "skip_mode": c["skip_mode"],
            "compiler_options": c["compiler_options"],
            **backends.run_wide_overrides(c),  # a backend's run-wide settings (torq_hw, torq_hw_type)
            "runtime_options": c["runtime_options"], "parameters": c["parameters"],
            "parameters_auto_mb": c["parameters_auto_mb"], "collect_timing": c["collect_timing"],
            "timing_runs": c["timing_runs"], "timing_warmup": c["timing_warmup"],
            "recommend_by_timing": c["recommend_by_timing"],
            # precision modes: `run` refuses other values (docs/precision.md)
            **{k: c[k] for k in PRECISION_KEYS},
            "save_bf16_model": c["save_bf16_model"],
            # subgraph mode only (the options of a full-model run stay as they were)
            **({"subgraph_from": c["subgraph_from"], "subgraph_to": c["subgraph_to"],
                "subgraph": {**{k: self.subgraph[k] for k in ("from", "to", "suffix")},
                             "work_dir": layout.work_dir(self.model_name)}} if self.subgraph else {}),
        }

    # ------------------------------------------------------------ the run lock
    def check_run_lock(self, cwd: str | os.PathLike) -> None:
        """Before Snakemake's own lock of the working directory (it is checked after the
        parse, before any hook): a live run of this model here is named (RunLocked), and a
        Snakemake lock that a killed run left on this output directory is removed (it would
        make this run refuse: "Directory cannot be locked")."""
        if os.path.isdir(self.out):
            run_lock.check_free(self.run_lock, what=f"{self.out} for {self.model_name}")
            run_lock.clear_stale_snakemake_locks(cwd, self.out)

    def inputs(self, checkpoints: Any, workflow: Any) -> RunInputs:
        """The input and param functions of the rules, over the Snakefile's ``checkpoints``."""
        return RunInputs(self, checkpoints, workflow)


class RunInputs:
    """The rules' input and param functions that need the DAG (the split and plan
    checkpoints), with their caches. Methods taking ``wildcards`` are given to the rules
    as they are."""

    def __init__(self, ctx: RunContext, checkpoints: Any, workflow: Any):
        self.ctx, self.checkpoints, self.workflow = ctx, checkpoints, workflow
        self._manifest: dict = {}
        self._units: dict = {}
        self._batches: dict = {}
        self._effective: dict = {}
        self._parameters: dict = {}
        self._plan: dict = {}
        self._records: dict = {}
        self._drift: dict = {}
        # the drift of each (unit, executor) as first seen in this run (this parse):
        # Snakemake evaluates the params again when the job starts, after it removed the
        # job's output (the unit record), and the job must record the value Snakemake
        # stored (from the DAG)
        self._drift_seen: dict = {}

    # ------------------------------------------------------------- the split
    def manifest_layers(self, known: bool = False) -> dict:
        """Layers of the split (after the checkpoint ran), cached per manifest mtime.
        ``known``: for params only (a job's input functions have asked the checkpoint
        already): the manifest the checkpoint gave before, by one stat, without asking it
        again (0.2 ms a call, thousands of calls at 5,000 layers)."""
        if known and self._manifest:
            (path, mtime), layers = next(iter(self._manifest.items()))
            try:
                if os.stat(path).st_mtime_ns == mtime:
                    return layers
            except OSError:
                pass
        path = self.checkpoints.split_layers.get().output.manifest
        key = (path, os.stat(path).st_mtime_ns)
        if key not in self._manifest:
            try:
                layers = read_json(path, "layer manifest")["layers"]
            except (ReportError, KeyError, TypeError) as e:  # damaged outside the workflow: made again next run
                layout.mark_outdated(self.ctx.report_outdated)  # the CLI's next discover forces the report (and the split)
                raise snakemake_exceptions.WorkflowError(str(damaged_work_file(path, e, redo="split the model anew"))) from None
            self._manifest.clear()
            self._manifest[key] = {la["slug"]: la for la in layers}
        return self._manifest[key]

    def tested_layers(self) -> list[str]:
        """Slugs of the layers that get test jobs: not skipped by skip_ops, testable (a
        layer with an unknown input/output type gets no jobs, the report says why) and,
        with dedup_layers, only the first layer of each signature."""
        layers = self.manifest_layers()
        plan = layer_test_plan.plan_layer_tests(layers.values(), self.ctx.config["skip_ops"],
                                                self.ctx.config["dedup_layers"])
        return [slug for slug, layer in layers.items() if plan[layer["layer_id"]][0] == layer_test_plan.TEST]

    def layer_units(self, known: bool = False) -> tuple[dict, dict]:
        """The units of the tested layers: ``({unit id: [slug, ...]}, {slug: unit id})``,
        cached per manifest (units.plan_units); ``known``: see manifest_layers."""
        layers = self.manifest_layers(known)
        key = (id(layers), self.ctx.compile_batch)
        if key not in self._units:
            self._units.clear()
            plan = units.plan_units(self.tested_layers(), self.ctx.compile_batch)
            self._units[key] = ({u["id"]: u["members"] for u in plan}, {s: u["id"] for u in plan for s in u["members"]})
        return self._units[key]

    def unit_of(self, slug: str, known: bool = False) -> str:
        """The unit id of a tested layer (a WorkflowError for another name)."""
        unit = self.layer_units(known)[1].get(slug)
        if unit is None:
            why = ("not a tested layer (skip_ops, dedup_layers or not testable)" if slug in self.manifest_layers()
                   else f"not in {self.ctx.manifest}")
            raise snakemake_exceptions.WorkflowError(f"unknown layer {slug!r}: {why}")
        return unit

    def unit(self, wildcards, known: bool = True) -> str:
        """The unit of a unit job (wildcard unit) or of a one-layer job (wildcard layer)."""
        # Wildcards is a list: `in` alone would look at the values
        return wildcards.unit if "unit" in wildcards.keys() else self.unit_of(wildcards.layer, known)  # noqa: SIM118

    def unit_slugs(self, wildcards, known: bool = True) -> list[str]:
        """The unit's members; ``known`` (params): see manifest_layers. Input functions
        pass False: they are what asks the split checkpoint."""
        unit = self.unit(wildcards, known)
        slugs = self.layer_units(known)[0].get(unit)
        if slugs is None:
            raise snakemake_exceptions.WorkflowError(f"unknown unit {unit!r}: the tested layers of {self.ctx.manifest} make "
                                f"{len(self.layer_units()[0])} unit(s)")
        return slugs

    def unit_members(self, wildcards) -> list[dict]:
        """The unit's layers, ``[{"layer_id", "slug", "op_type", "node_index"}]`` in order (a param)."""
        layers = self.manifest_layers(known=True)
        return [{k: layers[s][k] for k in ("layer_id", "slug", "op_type", "node_index")}
                for s in self.unit_slugs(wildcards)]

    def all_unit_results(self, wildcards) -> list[str]:
        """Every (unit, executor) record to produce; known once the split ran."""
        return [os.path.join(self.ctx.units, u, f"{e}.json") for u in self.layer_units()[0] for e in self.ctx.executors]

    # ----------------------------------------------------------- the executors
    def effective_executor(self, name: str) -> dict:
        """The executor ``name`` with the run-wide tool options applied, keys sorted (a
        fresh copy: params must not share mutable values)."""
        if name not in self._effective:
            c = self.ctx.config
            self._effective[name] = json.dumps(canonical(backends.executor_with_tool_options(
                self.ctx.executors[name], c["compiler_options"], c["runtime_options"], backends.run_wide_overrides(c))))
        return json.loads(self._effective[name])

    def resolved_parameters(self) -> dict:
        """The weights mode (backends.parameters.resolve: mode, reason, ...), cached per
        prepare.json mtime; only for jobs after the split checkpoint (prepare.json is there)."""
        path = self.ctx.prepare_info
        executors = list(self.ctx.executors.values())
        if not os.path.isfile(path):  # removed: the preparation runs again, and the jobs after it see it
            return weights_mode.resolve_from(self.ctx.parameter_settings, {}, executors)
        key = (path, os.stat(path).st_mtime_ns)
        if key not in self._parameters:
            self._parameters.clear()
            self._parameters[key] = weights_mode.resolve_from(self.ctx.parameter_settings,
                                                              read_json(path, "preparation info"), executors)
        return self._parameters[key]

    def parameters_mode(self, wildcards) -> str:
        """inline or external (a param of the layers' import: a change imports them again)."""
        return self.resolved_parameters()["mode"]

    def run_executor(self, name: str) -> dict:
        """The executor ``name`` as its layer tests run it: effective_executor, and in external
        mode with the weight store's archives as its runtime parameters (backends.parameters.with_parameters)."""
        return canonical(weights_mode.with_parameters(self.effective_executor(name), self.resolved_parameters(),
                                                      list(self.ctx.weight_archives)))

    def executor(self, wildcards) -> dict:
        """The executor definition (name, backend, options): a per-job param, so a change
        to one executor reruns only that executor's jobs. compiler_options/runtime_options
        are appended to the flags of compiler-based backends, and in external weights mode
        the flag that loads the weight store (run_executor)."""
        return self.run_executor(wildcards.executor)

    def earlier_executors(self, executor: str) -> list[str]:
        """Skip mode: the executors before ``executor`` in priority order (else none)."""
        if not self.ctx.config["skip_mode"]:
            return []
        names = list(self.ctx.executors)
        return names[:names.index(executor)]

    def layer_batches(self, executor: str) -> tuple[dict, dict]:
        """The compile batches of the tested layers for ``executor``: ``({batch id: [slug,
        ...]}, {slug: batch id})``, cached per manifest. The members are the same for every
        batched executor; the ids are slots keyed by the executor's settings
        (batch_compile.plan_batches: another membership keeps the directories, other
        settings retest)."""
        layers = self.manifest_layers(known=True)  # a param's (unit_batches)
        key = (id(layers), self.ctx.compile_batch, executor)
        if key not in self._batches:
            if len(self._batches) > 2 * len(self.ctx.executors):  # another manifest: drop the old plans
                self._batches.clear()
            settings = {"executor": self.run_executor(executor), "timing": self.ctx.timing()}
            plan = batch_compile.plan_batches(
                self.tested_layers(), self.ctx.compile_batch, batch_compile.settings_key(settings),
                # inline, the merged text holds the batch's weights; external, every run of one of its
                # layers loads all of the module's parameters: a budget either way (docs/parameters.md)
                weights={slug: batch_compile.layer_weight_bytes(layer) for slug, layer in layers.items()},
                unit=units.unit_size(self.ctx.compile_batch))
            self._batches[key] = ({b["id"]: b["members"] for b in plan},
                                  {slug: b["id"] for b in plan for slug in b["members"]})
        return self._batches[key]

    # -------------------------------------------------- prepare_unit, test_unit
    def prepare_inputs(self, wildcards) -> dict:
        """The split's manifest (its checkpoint wrote the layers' models and inputs before
        it) and, with quantize, the calibration ranges and the full model's quantization
        info. The layers' own files are not inputs but a param (prepare_files): one
        stat each, where Snakemake's matching of an input file to the rules costs ~0.1 ms
        a file at every start (docs/scale.md)."""
        self.unit_slugs(wildcards, known=False)  # the checkpoint, before the params read the manifest
        ctx = self.ctx
        # the archives the layer models refer to (a removed one is made again by its job)
        inputs = {"manifest": ctx.manifest, "weights": ctx.weights, "folded": ctx.folded}
        if ctx.quantize:
            inputs["ranges"] = ctx.calibration
            inputs["full"] = ctx.quantize_info
        return inputs

    def prepare_files(self, wildcards) -> dict:
        """The identity (size, mtime ns) of each member's split model and propagated inputs
        (a param: the split rewrites only the files that changed, so another value reruns
        the unit, whose keys redo only those layers)."""
        propagate = self.ctx.config["layer_inputs"] == "propagate"
        layers = self.ctx.layers
        return {s: [units.file_identity(os.path.join(layers, s, layout.MODEL_FILE)),
                    units.file_identity(os.path.join(layers, s, layout.LAYER_INPUTS_FILE)) if propagate else None]
                for s in self.unit_slugs(wildcards)}

    def prepare_rerun(self, wildcards) -> dict:
        """The prepare job's rerun param (read-only): per member that timed out under a
        smaller --timeout than now, new tokens (markers.timeout_rerun_token)."""
        out = {}
        for s in self.unit_slugs(wildcards):
            d = os.path.join(self.ctx.layers, s)
            tokens = [timeout_rerun_token(os.path.join(d, f), self.ctx.config["timeout_s"])
                      for f in (layout.LAYER_REFERENCE_FILE, layout.IMPORT_FILE)]
            if any(tokens):
                out[s] = tokens
        return out

    def unit_test_inputs(self, wildcards) -> dict:
        """The unit's prepare record and, in skip mode, its records of the executors
        before this one (a layer's executors are tested in priority order).

        The unit's members are looked up here too, not only in the params: that asks for the
        split checkpoint, so a job run on its own (a cluster node: --target-jobs with
        --allowed-rules test_unit) has the checkpoint in its DAG before the params read the
        manifest (Snakemake refuses a param that depends on a checkpoint outside the inputs)."""
        self.unit_slugs(wildcards, known=False)
        inputs = {"prepared": os.path.join(self.ctx.units, wildcards.unit, units.PREPARED_FILE)}
        earlier = self.earlier_executors(wildcards.executor)
        if earlier:
            inputs["earlier"] = [os.path.join(self.ctx.units, wildcards.unit, f"{e}.json") for e in earlier]
        return inputs

    def layer_test_inputs(self, wildcards) -> dict:
        """One layer's test asked for on its own: its unit's prepare record and, in skip
        mode, its results of the executors before this one."""
        inputs = {"prepared": os.path.join(self.ctx.units, self.unit_of(wildcards.layer), units.PREPARED_FILE)}
        earlier = self.earlier_executors(wildcards.executor)
        if earlier:
            inputs["earlier"] = [layout.layer_result_file(self.ctx.layers, wildcards.layer, e) for e in earlier]
        return inputs

    def unit_record(self, wildcards) -> Untracked:
        """The unit record a one-layer test updates (untracked)."""
        return untracked(os.path.join(self.ctx.units, self.unit_of(wildcards.layer), f"{wildcards.executor}.json"))

    def unit_batches(self, wildcards) -> list[dict] | None:
        """The compile batches of the unit for the executor, ``[{"id", "members"}]``, or
        None when its layers are compiled in their own tests (a param: another membership
        or other settings recompile; the members' keys decide what is tested again)."""
        if not self.ctx.batched[wildcards.executor]:
            return None
        slugs = set(self.unit_slugs(wildcards))
        return [{"id": b, "members": m} for b, m in self.layer_batches(wildcards.executor)[0].items() if m[0] in slugs]

    def unit_test_rerun(self, wildcards) -> dict:
        """The test job's rerun param (read-only): the members' skip-mode placeholders
        (outside skip mode) and timeout records under a smaller --timeout, and the
        batches' timeout records (markers)."""
        out = {}
        timeout_s = self.ctx.config["timeout_s"]
        for s in self.unit_slugs(wildcards):
            d = os.path.join(self.ctx.layers, s, wildcards.executor)
            tokens = [skipped_rerun_token(d, self.ctx.config["skip_mode"]),
                      timeout_rerun_token(os.path.join(d, layout.RESULT_FILE), timeout_s)]
            if any(tokens):
                out[s] = tokens
        for b in self.unit_batches(wildcards) or []:
            token = timeout_rerun_token(os.path.join(self.ctx.batches, wildcards.executor, b["id"], layout.BATCH_FILE),
                                        timeout_s)
            if token:
                out[b["id"]] = token
        return out

    def _unit_record_raw(self, path: str) -> dict | None:
        """A unit's record (prepared.json or <executor>.json) as read, cached per mtime; None
        when there is none (or it cannot be read: the unit job makes it)."""
        try:
            key = (path, os.stat(path).st_mtime_ns)
        except OSError:
            return None
        if key not in self._records:
            if len(self._records) > 4 * (len(self.ctx.executors) + 1) * max(1, len(self.layer_units()[0])):
                self._records.clear()
            try:
                rec = read_json(path, "unit record")
                self._records[key] = {"members": {m["slug"]: m for m in rec["members"]}, "drift": rec.get("drift")}
            except (ReportError, KeyError, TypeError):
                self._records[key] = None
        return self._records[key]

    def _prepared_drift(self, unit: str) -> list[str]:
        """Members of ``unit`` whose prepared files differ from what its preparation
        recorded (cached per record: the executors' test jobs share it)."""
        path = os.path.join(self.ctx.units, unit, units.PREPARED_FILE)
        rec = self._unit_record_raw(path)
        record = rec["members"] if rec else None
        if not record:
            return []
        key = (path, os.stat(path).st_mtime_ns)
        if key not in self._drift:
            self._drift[key] = sorted(s for s, m in record.items()
                                      if any(units.file_identity(os.path.join(self.ctx.layers, s, f)) != ident
                                             for f, ident in (m.get("files") or {}).items()))
        return self._drift[key]

    def unit_drift(self, wildcards) -> dict:
        """Members whose files changed outside the workflow since the unit's records were
        written (read-only; a param of the test jobs, so such a change reruns the unit):
        ``prepared``: a layer's reference, MLIR, import status or quantized model differs
        from what its preparation recorded (edited, damaged, deleted: its test key no longer
        matches, so it is tested again); ``results``: its verdict file differs from what
        the last test job recorded ({slug: identity now}; deleted or edited: the job finds
        the file is not the one its key was recorded for, and tests it again), with
        ``record``, the identity of the unit's record (the same file changed again after the
        unit reran is another value). The value is only a trigger: the job decides from the
        files. With nothing changed, the value the last test job ran with (kept in its
        record): a drift already handled reruns nothing (NO_DRIFT before any record). The
        value first computed in a run is kept for the run. A stat per file: 4 per layer,
        once, and one per (layer, executor)."""
        unit = self.unit(wildcards)
        seen = self._drift_seen.get((unit, wildcards.executor))
        if seen is not None:
            return seen
        path = os.path.join(self.ctx.units, unit, f"{wildcards.executor}.json")
        record = self._unit_record_raw(path)
        results = (record or {}).get("members") or {}
        # with the current identity: a second change of the same file (damaged, then
        # removed by the report job) gives another value, hence another rerun
        changed = {s: now for s, m in sorted(results.items())
                   if "result" in m and (now := units.file_identity(
                       layout.layer_result_file(self.ctx.layers, s, wildcards.executor))) != m["result"]}
        prepared = self._prepared_drift(unit)
        if not prepared and not changed:
            drift = (record or {}).get("drift") or NO_DRIFT
        else:
            drift = {"prepared": prepared, "results": changed}
            if changed:
                drift["record"] = units.file_identity(path)
        self._drift_seen[(unit, wildcards.executor)] = drift
        return drift

    def forced(self, rule: str) -> bool:
        """Whether this run recomputes the jobs of ``rule`` whatever the members' keys say
        (Snakemake's --forceall, i.e. `discover --recompute-cache`, or --forcerun RULE): an
        untracked param of the unit jobs, which then redo every member."""
        settings = getattr(self.workflow, "dag_settings", None)  # set after the parse: ask in a param function
        return bool(settings and (settings.forceall or rule in settings.forcerun))

    def unit_test_params(self) -> dict:
        """The params of rules test_unit and test_layer (rules/layer_tests.smk)."""
        ctx, c = self.ctx, self.ctx.config
        return dict(  # noqa: C408 (keyword names, as in a rule's params)
            unit=self.unit,
            members=self.unit_members,
            executor=self.executor,
            batches=self.unit_batches,
            needs_mlir=lambda wildcards: backends.needs_mlir(ctx.executors[wildcards.executor]["backend"]),
            timing=ctx.timing,
            precision=ctx.layer_precision,
            rerun=self.unit_test_rerun,
            drift=self.unit_drift,
            tolerance=untracked(c["tolerance"]),
            timeout_s=ctx.timeout,
            keep_outputs=untracked(c["keep_outputs"]),
            skip_mode=untracked(c["skip_mode"]),
            earlier=lambda wildcards: untracked(self.earlier_executors(wildcards.executor)),
            log_file=untracked(c["log_file"] or None),
            verbose=untracked(c["verbose"]),
            layers_dir=untracked(ctx.layers),
            logs_dir=untracked(ctx.logs),
            batches_dir=untracked(ctx.batches),
            force=lambda wildcards: untracked(self.forced("test_unit")),
            outdated=ctx.report_outdated,
        )

    # ------------------------------------------------------------ the report
    def quantize_report_inputs(self, wildcards) -> list[str]:
        """With quantize: the layers mapped onto the quantized model (their line:col in
        its MLIR) and the full model's quantization info; else nothing."""
        if not self.ctx.quantize:
            return []
        return [self.ctx.quant_manifest, self.ctx.quantize_info]

    def user_choices_input(self, wildcards) -> list[str]:
        """The user's overrides (written by `edit`), as a list (empty when there are none)."""
        return [self.ctx.user_choices] if os.path.exists(self.ctx.user_choices) else []

    # --------------------------------------------------- the full-model run
    def full_plan(self, whole: bool = False) -> dict:
        """The plan written by the checkpoint (after it ran), cached per mtime: pid ->
        partition, or with ``whole`` the plan itself."""
        path = self.checkpoints.plan_full_model.get().output.plan
        key = (path, os.stat(path).st_mtime_ns)
        if key not in self._plan:
            with open(path) as f:
                plan = json.load(f)
            self._plan.clear()
            # module mode (fullrun/module/mode.py): the module is a partition of its own too
            parts = plan["partitions"] + ([plan["module"]] if plan.get("module") else [])
            self._plan[key] = ({p["pid"]: p for p in parts}, plan)
        return self._plan[key][1 if whole else 0]

    def partition_model(self, wildcards) -> str:
        """The partition's ONNX model, or for a torq plan its executor map (a side file
        of the plan checkpoint)."""
        plan = self.full_plan()
        if wildcards.pid not in plan:
            raise snakemake_exceptions.WorkflowError(f"unknown partition {wildcards.pid!r}: not in {self.ctx.full_plan}")
        return os.path.join(self.ctx.parts, wildcards.pid, os.path.basename(plan[wildcards.pid]["model"]))

    def partition_inputs(self, wildcards) -> dict:
        """The partition's model (partition_model) and, for a member of a compile batch
        this plan compiles, the batch's module and batch.json (a batch kept from an earlier
        run is no input: nothing rebuilds it, and its members' compiled.json stay)."""
        inputs = {"model": self.partition_model(wildcards)}
        part = self.full_plan()[wildcards.pid]
        for b in self.full_plan(whole=True).get("compile_batches") or []:
            if b["id"] == part.get("compile_batch") and b["executor"] == part["executor"] and not b.get("kept"):
                d = os.path.join(self.ctx.part_batches, b["executor"], b["id"])
                inputs.update(batch_module=os.path.join(d, layout.MODULE_FILE),
                              batch_info=os.path.join(d, layout.BATCH_FILE))
        return inputs

    def partition_batch(self, wildcards) -> str | None:
        """The id of the compile batch of the partition, or None (a param: switching
        compile_batch recompiles)."""
        return self.full_plan()[wildcards.pid].get("compile_batch")

    def _partition_batch(self, wildcards) -> dict:
        for b in self.full_plan(whole=True).get("compile_batches") or []:
            if b["id"] == wildcards.batch and b["executor"] == wildcards.executor:
                return b
        raise snakemake_exceptions.WorkflowError(f"unknown partition batch {wildcards.batch!r} of executor {wildcards.executor!r}: "
                            f"not in {self.ctx.full_plan}")

    def partition_batch_models(self, wildcards) -> list[str]:
        """The ONNX models of the batch's partitions, in batch order."""
        plan = self.full_plan()
        return [os.path.join(self.ctx.parts, pid, os.path.basename(plan[pid]["model"]))
                for pid in self._partition_batch(wildcards)["members"]]

    def partition_batch_def(self, wildcards) -> dict:
        """How the batch's partitions are compiled (their compile_def, the same for all)."""
        return self.full_plan()[self._partition_batch(wildcards)["members"][0]]["compile_def"]

    def partition_batch_members(self, wildcards) -> list[dict]:
        """The batch's members, ``[{"slug": pid, "layer_id": label}]`` (a param)."""
        self._partition_batch(wildcards)
        return full_model_steps.partition_batch_members(self.full_plan(whole=True), wildcards.batch)

    def compile_def(self, wildcards) -> dict:
        """How the partition is compiled: a deterministic function of the pid (the pid
        hashes it), so this param changes only when the pid does."""
        return self.full_plan()[wildcards.pid]["compile_def"]

    def all_compiled(self, wildcards) -> list[str]:
        """compiled.json of every partition of the plan (known once the checkpoint ran)."""
        plan = self.full_plan(whole=True)
        if plan.get("module"):  # module mode: the chain is compiled only when the module fails or differs
            return [os.path.join(self.ctx.parts, plan["module"]["pid"], layout.COMPILED_FILE)]
        return [os.path.join(self.ctx.parts, pid, layout.COMPILED_FILE) for pid in self.full_plan()]

    def all_batch_modules(self, wildcards) -> list[str]:
        """The module of every compile batch this plan compiles (not one kept from an
        earlier run): run_full_model runs its partitions' functions from them."""
        plan = self.full_plan(whole=True)
        if plan.get("module"):
            return []
        return [os.path.join(self.ctx.part_batches, b["executor"], b["id"], layout.MODULE_FILE)
                for b in plan.get("compile_batches") or [] if not b.get("kept")]

    def assignment_digest(self, wildcards) -> str:
        """What the report assigns (a param: an edit of the report that changes the
        assignment reruns the assignment rule even when the compiler JSON stays the same)."""
        return full_model_steps.selection_digest_of(self.ctx.report, self.ctx.compiler_json)
