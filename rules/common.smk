# Configuration, paths and input functions shared by the rules. Logic lives in the
# torq_gen_config package (workflow/torq_gen_config); this file only wires it up.
import json
import os
import re

from snakemake.exceptions import WorkflowError
from snakemake_interface_executor_plugins.settings import ExecMode

from torq_gen_config import backends
from torq_gen_config.core import isolation, layout, run_lock
from torq_gen_config.discovery import batch_compile
from torq_gen_config.pipeline import steps
from torq_gen_config.pipeline.steps import units
import torq_gen_config.pipeline.steps.full_model
import torq_gen_config.pipeline.steps.layer_tests
import torq_gen_config.pipeline.steps.prepare
import torq_gen_config.pipeline.steps.quantize
import torq_gen_config.pipeline.steps.report
import torq_gen_config.pipeline.steps.report_html
import torq_gen_config.pipeline.steps.split
import torq_gen_config.pipeline.steps.units
from torq_gen_config.pipeline.steps import untracked
from torq_gen_config.pipeline.steps.markers import skipped_rerun_token, timeout_rerun_token
from torq_gen_config.backends import NEEDS_MLIR
from torq_gen_config.backends import parameters as weights_mode
from torq_gen_config.config import (PRECISION_KEYS, check_save_bf16_path, model_name, parse_input_shapes,
                                    resolve_model_path, validate_config)
from torq_gen_config.core.errors import ReportError, TorqGenConfigError
from torq_gen_config.core.fileio import damaged_work_file, file_fingerprint, read_json, remove_temporary_files
from torq_gen_config.model import tested_layers as layer_test_plan
from torq_gen_config.model.prepare import model_fingerprint
from torq_gen_config.reference.model_inputs import MODEL_INPUTS_FILE
from torq_gen_config.model.subgraph import CONFIG_KEYS as SUBGRAPH_KEYS, report_name

try:
    config.update(validate_config(config))
except TorqGenConfigError as e:
    raise WorkflowError(str(e))

# in-process work runs in supervised workers (torq_gen_config.core.isolation): a new run may
# start them, and Ctrl-C / SIGTERM stop them and the tools at once
isolation.reset()
isolation.install_stop_handlers()

MODEL_PATH = str(resolve_model_path(config["model"]))
if MODEL_PATH.lower().endswith(".tflite"):
    raise WorkflowError(f"{MODEL_PATH}: TFLite models are not supported; torq-gen-config is ONNX-only")
if not os.path.isfile(MODEL_PATH):
    raise WorkflowError(f"model file not found: {MODEL_PATH}")
if "{" in MODEL_PATH or "}" in MODEL_PATH:
    raise WorkflowError(f"the model path must not contain braces (Snakemake wildcards): {MODEL_PATH}; rename or copy the file")
try:
    check_save_bf16_path(MODEL_PATH, config["save_bf16_model"] if config["auto_convert_bf16"] else None)
except TorqGenConfigError as e:
    raise WorkflowError(str(e))
OUT = os.path.normpath(config["output_dir"] or os.path.join("results", model_name(MODEL_PATH)))
if "{" in OUT or "}" in OUT:
    raise WorkflowError(f"output_dir must not contain braces (Snakemake wildcards): {OUT}")
# Subgraph mode (subgraph_from/subgraph_to; docs/subgraph.md): the range resolved in
# the user's model, else None. Its files get NAME_SUFFIX ("_subgraph_<f>_<t>"); every
# file is keyed by MODEL_NAME (torq_gen_config.core.layout), so models and subgraphs can
# share an output directory.
# The name in the report/compiler JSON file names and in the reports: the model's
# file stem (plus NAME_SUFFIX in subgraph mode).
try:
    MODEL_NAME, SUBGRAPH = report_name(config, MODEL_PATH, labels=SUBGRAPH_KEYS)
except TorqGenConfigError as e:
    raise WorkflowError(str(e))
NAME_SUFFIX = SUBGRAPH["suffix"] if SUBGRAPH else ""
WORK = os.path.normpath(os.path.join(OUT, layout.work_dir(MODEL_NAME)))
LAYERS = os.path.join(WORK, layout.LAYERS_DIR)
LOGS = os.path.join(WORK, layout.LOGS_DIR)
CONFIGURED_EXECUTORS = {e["name"]: e for e in config["executors"] if e["name"] not in config["skip_executors"]}
# executors whose device or execution provider this machine lacks (a GPU executor on a
# CPU machine): name -> reason, asked once per parse; they get no layer jobs and the
# report names them once (unavailable_executors), instead of one error per layer
UNAVAILABLE = backends.unavailable_executors(
    [backends.executor_with_tool_options(e, config["compiler_options"], config["runtime_options"],
                                         backends.run_wide_overrides(config)) for e in CONFIGURED_EXECUTORS.values()],
    timeout_s=config["timeout_s"])
if len(UNAVAILABLE) == len(CONFIGURED_EXECUTORS):
    raise WorkflowError("no configured executor can run on this machine: "
                        + "; ".join(f"{n}: {r}" for n, r in UNAVAILABLE.items()))
EXECUTORS = {n: e for n, e in CONFIGURED_EXECUTORS.items() if n not in UNAVAILABLE}
# Precision modes (docs/precision.md). CONVERSION applies when preparing the model;
# QUANTIZE adds rules/quantize.smk's jobs and tests each layer's quantized model.
CONVERSION = {k: config[k] for k in ("auto_convert_bf16", "auto_convert_int32", "save_bf16_model")}
QUANTIZE = bool(config["quantize"])
QUANT = os.path.join(WORK, layout.QUANT_DIR)
QUANT_SETTINGS = {k: config[k] for k in ("quant_format", "per_channel", "full_integer")} if QUANTIZE else None
# what a layer's tests depend on besides its files: a param of the reference, import
# and test jobs, so switching quantize (another model file, maybe older) reruns them
LAYER_PRECISION = {"quantize": QUANT_SETTINGS}
RUN_LOCK = os.path.join(OUT, layout.lock_file(MODEL_NAME))
# a Snakemake lock that a killed run left on this output directory would make this run
# refuse ("Directory cannot be locked"); it is removed when no run holds the directory.
# Not in a cluster job (exec mode remote/subprocess): the main process that submitted it holds the lock.
if os.path.isdir(OUT) and workflow.exec_mode == ExecMode.DEFAULT:
    try:  # a live run of this model here: say who, before Snakemake's own lock refuses
        run_lock.check_free(RUN_LOCK, what=f"{OUT} for {MODEL_NAME}")
    except run_lock.RunLocked as e:
        raise WorkflowError(str(e))
    run_lock.clear_stale_snakemake_locks(os.getcwd(), OUT)
# Set by every job that changes what the report is made from, removed when the report
# is written again: while it exists, view/edit/run say the report is out of date
# (a failed or stopped rerun leaves it; torq_gen_config.report.staleness).
REPORT_OUTDATED = os.path.join(WORK, layout.OUTDATED_MARKER)
# the job's time limit (s): a param that reruns nothing when changed (a larger limit
# reruns what timed out: get_timeout_rerun, get_test_rerun)
TIMEOUT = untracked(config["timeout_s"])
USER_CHOICES = os.path.normpath(os.path.join(OUT, layout.user_choices_file(MODEL_NAME)))


REPORT = os.path.normpath(os.path.join(OUT, layout.report_file(MODEL_NAME)))
COMPILER_JSON = os.path.normpath(os.path.join(OUT, layout.compiler_file(MODEL_NAME)))


wildcard_constraints:
    layer=r"[A-Za-z0-9._-]+",
    batch=r"[0-9]{4}-[0-9a-f]{10}",
    unit=r"[0-9]{4}",
    executor="|".join(re.escape(n) for n in EXECUTORS),


def final_outputs():
    """The report and compiler JSON of the configured model; in subgraph mode also
    the full-subgraph run (rules/full_model.smk; `torq-gen-config discover` runs it
    as a second step and merges it into the report)."""
    if SUBGRAPH:
        return [REPORT, COMPILER_JSON, FULL_RESULT]
    return [REPORT, COMPILER_JSON]


def subgraph_range():
    """The (from, to) layer IDs of the subgraph (prepare_model cuts it out), or None."""
    return (SUBGRAPH["from"]["layer_id"], SUBGRAPH["to"]["layer_id"]) if SUBGRAPH else None


_MANIFEST_CACHE = {}


def manifest_layers(known=False):
    """Layers of the split (after the checkpoint ran), cached per manifest mtime.
    ``known``: for params only (a job's input functions have asked the checkpoint
    already): the manifest the checkpoint gave before, by one stat, without asking it
    again (0.2 ms a call, thousands of calls at 5,000 layers)."""
    if known and _MANIFEST_CACHE:
        (path, mtime), layers = next(iter(_MANIFEST_CACHE.items()))
        try:
            if os.stat(path).st_mtime_ns == mtime:
                return layers
        except OSError:
            pass
    path = checkpoints.split_layers.get().output.manifest
    key = (path, os.stat(path).st_mtime_ns)
    if key not in _MANIFEST_CACHE:
        try:
            layers = read_json(path, "layer manifest")["layers"]
        except (ReportError, KeyError, TypeError) as e:  # damaged outside the workflow: made again next run
            layout.mark_outdated(REPORT_OUTDATED)  # the CLI's next discover forces the report (and the split)
            raise WorkflowError(str(damaged_work_file(path, e, redo="split the model anew"))) from None
        _MANIFEST_CACHE.clear()
        _MANIFEST_CACHE[key] = {l["slug"]: l for l in layers}
    return _MANIFEST_CACHE[key]


def input_data_file():
    """The user's model-input .npz (input_data), as a list (empty if none)."""
    if config["input_data"]:
        return [str(resolve_model_path(config["input_data"]))]
    return []


# The model's input values (work/model_inputs.npz, written by prepare_model): the
# user's input_data, else generated ones; every whole-model step starts from them.
MODEL_INPUTS = os.path.join(WORK, MODEL_INPUTS_FILE)
try:
    INPUT_SHAPES = parse_input_shapes(config["input_shapes"])
except TorqGenConfigError as e:
    raise WorkflowError(str(e))
# which input data file this is (a param: rerun triggers do not include "input")
INPUT_DATA_FINGERPRINT = file_fingerprint(input_data_file()[0]) if input_data_file() else None


def get_executor(wildcards):
    """The executor definition (name, backend, options): a per-job param, so a change
    to one executor reruns only that executor's jobs. compiler_options/runtime_options
    are appended to the flags of compiler-based backends, and in external weights mode
    the flag that loads the weight store (run_executor)."""
    return run_executor(wildcards.executor)


def canonical(value):
    """``value`` (JSON data) with its keys in sorted order: Snakemake compares params by
    their text, and the same executor written with its keys in another order must not
    rerun its jobs."""
    return json.loads(json.dumps(value, sort_keys=True))


def tested_layers():
    """Slugs of the layers that get test jobs: not skipped by skip_ops, testable (a
    layer with an unknown input/output type gets no jobs, the report says why) and,
    with dedup_layers, only the first layer of each signature."""
    layers = manifest_layers()
    plan = layer_test_plan.plan_layer_tests(layers.values(), config["skip_ops"], config["dedup_layers"])
    return [slug for slug, layer in layers.items() if plan[layer["layer_id"]][0] == layer_test_plan.TEST]


# Compile batches (rules/layer_tests.smk, rule test_unit; docs/compile_batches.md)
BATCHES = os.path.join(WORK, batch_compile.BATCHES_DIR)
COMPILE_BATCH = config["compile_batch"]
_BATCH_CACHE = {}


# Both are the same for the whole parse and asked for by every unit job (cached: a
# backend lookup each cost 0.1 s of a 1,000-layer no-op; docs/scale.md).
BATCHED = {name: COMPILE_BATCH > 1 and backends.capabilities(e["backend"]).batch_compile for name, e in EXECUTORS.items()}
_EFFECTIVE = {}


def batched(executor):
    """Whether the executor's layers are compiled in batches (compile_batch > 1 and
    its backend has batch_compile)."""
    return BATCHED[executor]


def effective_executor(name):
    """The executor ``name`` with the run-wide tool options applied, keys sorted (a
    fresh copy: params must not share mutable values)."""
    if name not in _EFFECTIVE:
        _EFFECTIVE[name] = json.dumps(canonical(backends.executor_with_tool_options(
            EXECUTORS[name], config["compiler_options"], config["runtime_options"], backends.run_wide_overrides(config))))
    return json.loads(_EFFECTIVE[name])


def layer_batches(executor):
    """The compile batches of the tested layers for ``executor``: ``({batch id: [slug,
    ...]}, {slug: batch id})``, cached per manifest. The members are the same for every
    batched executor; the ids are slots keyed by the executor's settings
    (batch_compile.plan_batches: another membership keeps the directories, other
    settings retest)."""
    layers = manifest_layers(known=True)  # a param's (get_unit_batches)
    key = (id(layers), COMPILE_BATCH, executor)
    if key not in _BATCH_CACHE:
        if len(_BATCH_CACHE) > 2 * len(EXECUTORS):  # another manifest: drop the old plans
            _BATCH_CACHE.clear()
        settings = {"executor": run_executor(executor), "timing": get_timing(None)}
        plan = batch_compile.plan_batches(
            tested_layers(), COMPILE_BATCH, batch_compile.settings_key(settings),
            # inline, the merged text holds the batch's weights; external, every run of one of its
            # layers loads all of the module's parameters: a budget either way (docs/parameters.md)
            weights={slug: batch_compile.layer_weight_bytes(layer) for slug, layer in layers.items()},
            unit=units.unit_size(COMPILE_BATCH))
        _BATCH_CACHE[key] = ({b["id"]: b["members"] for b in plan},
                             {slug: b["id"] for b in plan for slug in b["members"]})
    return _BATCH_CACHE[key]


# How compiled modules get the weights (config parameters, docs/parameters.md): the
# setting, resolved with the stored weights' size once prepare_model ran. The rules after
# the split checkpoint resolve it in their params (resolved_parameters); those that may be
# planned before the preparation (aggregate_report, plan_full_model) get the setting and
# resolve it in the job, with prepare.json as an input.
PARAMETER_SETTINGS = {"setting": config["parameters"], "auto_mb": config["parameters_auto_mb"]}
# the weight store and the split's archive of folded values (absolute: a runtime flag)
WEIGHT_ARCHIVES = weights_mode.archives(WORK)
_PARAMETERS_CACHE = {}


def resolved_parameters():
    """The weights mode (backends.parameters.resolve: mode, reason, ...), cached per
    prepare.json mtime; only for jobs after the split checkpoint (prepare.json is there)."""
    path = os.path.join(WORK, "prepare.json")
    if not os.path.isfile(path):  # removed: the preparation runs again, and the jobs after it see it
        return weights_mode.resolve_from(PARAMETER_SETTINGS, {}, list(EXECUTORS.values()))
    key = (path, os.stat(path).st_mtime_ns)
    if key not in _PARAMETERS_CACHE:
        _PARAMETERS_CACHE.clear()
        _PARAMETERS_CACHE[key] = weights_mode.resolve_from(PARAMETER_SETTINGS, read_json(path, "preparation info"),
                                                           list(EXECUTORS.values()))
    return _PARAMETERS_CACHE[key]


def parameters_mode(wildcards):
    """inline or external (a param of the layers' import: a change imports them again)."""
    return resolved_parameters()["mode"]


def run_executor(name):
    """The executor ``name`` as its layer tests run it: effective_executor, and in external
    mode with the weight store's archives as its runtime parameters (backends.parameters.with_parameters)."""
    return canonical(weights_mode.with_parameters(effective_executor(name), resolved_parameters(), WEIGHT_ARCHIVES))


def get_timing(wildcards):
    """Runtime measurement settings of the test jobs (a per-job param, so switching
    collect_timing or changing the run counts reruns them), or None when off."""
    if not config["collect_timing"]:
        return None
    return {"runs": config["timing_runs"], "warmup": config["timing_warmup"]}


def run_options():
    """Options recorded in the report's provenance."""
    return {
        "model": MODEL_PATH,
        "output_dir": OUT,
        "target_opset": config["target_opset"],
        "timeout_s": config["timeout_s"],
        "inputs": config["inputs"],
        "tolerance": config["tolerance"],
        "skip_executors": config["skip_executors"],
        "skip_ops": config["skip_ops"],
        "dedup_layers": config["dedup_layers"],
        "layer_inputs": config["layer_inputs"],
        "input_data": input_data_file()[0] if input_data_file() else None,
        "input_shapes": config["input_shapes"],
        "reference": config["reference"],
        "skip_mode": config["skip_mode"],
        "compiler_options": config["compiler_options"],
        **backends.run_wide_overrides(config),  # a backend's run-wide settings (torq_hw, torq_hw_type)
        "runtime_options": config["runtime_options"],
        "parameters": config["parameters"],
        "parameters_auto_mb": config["parameters_auto_mb"],
        "collect_timing": config["collect_timing"],
        "timing_runs": config["timing_runs"],
        "timing_warmup": config["timing_warmup"],
        "recommend_by_timing": config["recommend_by_timing"],
        # precision modes: `run` refuses other values (docs/precision.md)
        **{k: config[k] for k in PRECISION_KEYS},
        "save_bf16_model": config["save_bf16_model"],
        # subgraph mode only (the options of a full-model run stay as they were)
        **({"subgraph_from": config["subgraph_from"], "subgraph_to": config["subgraph_to"],
            "subgraph": {**{k: SUBGRAPH[k] for k in ("from", "to", "suffix")},
                         "work_dir": layout.work_dir(MODEL_NAME)}} if SUBGRAPH else {}),
    }


def calibration_data_file():
    """The user's calibration .npz (quantize), as a list (empty if none)."""
    if QUANTIZE and config["calibration_data"]:
        return [str(resolve_model_path(config["calibration_data"]))]
    return []


def run_model():
    """The model that `run` partitions and the locations describe: the prepared
    model, or with quantize the quantized full model."""
    return os.path.join(QUANT, "quantized.onnx") if QUANTIZE else os.path.join(WORK, "prepared.onnx")


def run_manifest():
    """The layers over run_model()'s nodes: the split's manifest, or with quantize
    the layers mapped onto the quantized model (rule map_quantized_layers)."""
    return os.path.join(QUANT, "manifest.json") if QUANTIZE else os.path.join(LAYERS, "manifest.json")


def quantize_report_inputs(wildcards):
    """With quantize: the layers mapped onto the quantized model (their line:col in
    its MLIR) and the full model's quantization info; else nothing."""
    if not QUANTIZE:
        return []
    return [os.path.join(QUANT, "manifest.json"), os.path.join(QUANT, "quantize.json")]


def user_choices_input(wildcards):
    """The user's overrides (written by `edit`), as a list (empty when there are none)."""
    return [USER_CHOICES] if os.path.exists(USER_CHOICES) else []


# Full-model run (rules/full_model.smk)
FULL = os.path.join(WORK, layout.FULL_DIR)
PARTS = os.path.join(FULL, layout.PARTITIONS_DIR)
FULL_ASSIGNMENT = os.path.join(FULL, layout.ASSIGNMENT_FILE)
FULL_PLAN = os.path.join(FULL, layout.PLAN_FILE)
FULL_REFERENCE = os.path.join(FULL, layout.REFERENCE_FILE)
FULL_RESULT = os.path.join(FULL, layout.RESULT_FILE)
# compile batches of partitions (compile_batch > 1): FULL/batches/<executor>/<batch id>/
PART_BATCHES = os.path.join(FULL, batch_compile.BATCHES_DIR)


wildcard_constraints:
    pid=r"[A-Za-z0-9][A-Za-z0-9_.+-]*-[0-9a-f]{12}",


_PLAN_CACHE = {}


def full_plan(whole=False):
    """The plan written by the checkpoint (after it ran), cached per mtime: pid ->
    partition, or with ``whole`` the plan itself."""
    path = checkpoints.plan_full_model.get().output.plan
    key = (path, os.stat(path).st_mtime_ns)
    if key not in _PLAN_CACHE:
        with open(path) as f:
            plan = json.load(f)
        _PLAN_CACHE.clear()
        # module mode (fullrun/module_mode.py): the module is a partition of its own too
        parts = plan["partitions"] + ([plan["module"]] if plan.get("module") else [])
        _PLAN_CACHE[key] = ({p["pid"]: p for p in parts}, plan)
    return _PLAN_CACHE[key][1 if whole else 0]


def get_partition_inputs(wildcards):
    """The partition's model (get_partition_model) and, for a member of a compile batch
    this plan compiles, the batch's module and batch.json (a batch kept from an earlier
    run is no input: nothing rebuilds it, and its members' compiled.json stay)."""
    inputs = {"model": get_partition_model(wildcards)}
    part = full_plan()[wildcards.pid]
    for b in full_plan(whole=True).get("compile_batches") or []:
        if b["id"] == part.get("compile_batch") and b["executor"] == part["executor"] and not b.get("kept"):
            d = os.path.join(PART_BATCHES, b["executor"], b["id"])
            inputs.update(batch_module=os.path.join(d, "module.vmfb"), batch_info=os.path.join(d, "batch.json"))
    return inputs


def get_partition_batch(wildcards):
    """The id of the compile batch of the partition, or None (a param: switching
    compile_batch recompiles)."""
    return full_plan()[wildcards.pid].get("compile_batch")


def _partition_batch(wildcards):
    for b in full_plan(whole=True).get("compile_batches") or []:
        if b["id"] == wildcards.batch and b["executor"] == wildcards.executor:
            return b
    raise WorkflowError(f"unknown partition batch {wildcards.batch!r} of executor {wildcards.executor!r}: "
                        f"not in {FULL_PLAN}")


def get_partition_batch_models(wildcards):
    """The ONNX models of the batch's partitions, in batch order."""
    plan = full_plan()
    return [os.path.join(PARTS, pid, os.path.basename(plan[pid]["model"])) for pid in _partition_batch(wildcards)["members"]]


def get_partition_batch_def(wildcards):
    """How the batch's partitions are compiled (their compile_def, the same for all)."""
    return full_plan()[_partition_batch(wildcards)["members"][0]]["compile_def"]


def get_partition_batch_members(wildcards):
    """The batch's members, ``[{"slug": pid, "layer_id": label}]`` (a param)."""
    _partition_batch(wildcards)
    return steps.full_model.partition_batch_members(full_plan(whole=True), wildcards.batch)


def get_partition_model(wildcards):
    """The partition's ONNX model, or for a torq plan its executor map (a side file
    of the plan checkpoint)."""
    plan = full_plan()
    if wildcards.pid not in plan:
        raise WorkflowError(f"unknown partition {wildcards.pid!r}: not in {FULL_PLAN}")
    return os.path.join(PARTS, wildcards.pid, os.path.basename(plan[wildcards.pid]["model"]))


def get_compile_def(wildcards):
    """How the partition is compiled: a deterministic function of the pid (the pid
    hashes it), so this param changes only when the pid does."""
    return full_plan()[wildcards.pid]["compile_def"]


def all_compiled(wildcards):
    """compiled.json of every partition of the plan (known once the checkpoint ran)."""
    plan = full_plan(whole=True)
    if plan.get("module"):  # module mode: the chain is compiled only when the module fails or differs
        return [os.path.join(PARTS, plan["module"]["pid"], "compiled.json")]
    return [os.path.join(PARTS, pid, "compiled.json") for pid in full_plan()]


def assignment_digest(wildcards):
    """What the report assigns (a param: an edit of the report that changes the
    assignment reruns the assignment rule even when the compiler JSON stays the same)."""
    return steps.full_model.selection_digest_of(REPORT, COMPILER_JSON)


def run_input_data():
    """`run --input-data` other than discovery's (full-model reference only), as a list."""
    return [str(resolve_model_path(config["run_input_data"]))] if config["run_input_data"] else []


# Units of work (pipeline/steps/units.py, docs/scale.md): ~32 tested layers per job, a whole
# number of compile batches; rules prepare_unit (rules/split.smk) and test_unit
# (rules/layer_tests.smk) write each member's files and keep what is up to date.
UNITS = os.path.join(WORK, units.UNITS_DIR)
# whether any executor compiles the layers' MLIR (else no layer is imported)
IMPORT_MLIR = any(NEEDS_MLIR[e["backend"]] for e in EXECUTORS.values())
_UNIT_CACHE = {}


def layer_units(known=False):
    """The units of the tested layers: ``({unit id: [slug, ...]}, {slug: unit id})``,
    cached per manifest (units.plan_units); ``known``: see manifest_layers."""
    layers = manifest_layers(known)
    key = (id(layers), COMPILE_BATCH)
    if key not in _UNIT_CACHE:
        _UNIT_CACHE.clear()
        plan = units.plan_units(tested_layers(), COMPILE_BATCH)
        _UNIT_CACHE[key] = ({u["id"]: u["members"] for u in plan}, {s: u["id"] for u in plan for s in u["members"]})
    return _UNIT_CACHE[key]


def unit_of(slug, known=False):
    """The unit id of a tested layer (a WorkflowError for another name)."""
    unit = layer_units(known)[1].get(slug)
    if unit is None:
        why = "not a tested layer (skip_ops, dedup_layers or not testable)" if slug in manifest_layers() else \
            f"not in {LAYERS}/manifest.json"
        raise WorkflowError(f"unknown layer {slug!r}: {why}")
    return unit


def _unit(wildcards, known=True):
    """The unit of a unit job (wildcard unit) or of a one-layer job (wildcard layer)."""
    return wildcards.unit if "unit" in wildcards.keys() else unit_of(wildcards.layer, known)


def _unit_slugs(wildcards, known=True):
    """The unit's members; ``known`` (params): see manifest_layers. Input functions
    pass False: they are what asks the split checkpoint."""
    unit = _unit(wildcards, known)
    slugs = layer_units(known)[0].get(unit)
    if slugs is None:
        raise WorkflowError(f"unknown unit {unit!r}: the tested layers of {LAYERS}/manifest.json make "
                            f"{len(layer_units()[0])} unit(s)")
    return slugs


def get_unit_members(wildcards):
    """The unit's layers, ``[{"layer_id", "slug", "op_type", "node_index"}]`` in order (a param)."""
    layers = manifest_layers(known=True)
    return [{k: layers[s][k] for k in ("layer_id", "slug", "op_type", "node_index")} for s in _unit_slugs(wildcards)]


def get_prepare_inputs(wildcards):
    """The split's manifest (its checkpoint wrote the layers' models and inputs before
    it) and, with quantize, the calibration ranges and the full model's quantization
    info. The layers' own files are not inputs but a param (get_prepare_files): one
    stat each, where Snakemake's matching of an input file to the rules costs ~0.1 ms
    a file at every start (docs/scale.md)."""
    _unit_slugs(wildcards, known=False)  # the checkpoint, before the params read the manifest
    # the archives the layer models refer to (a removed one is made again by its job)
    inputs = {"manifest": os.path.join(LAYERS, "manifest.json"), "weights": os.path.join(WORK, "weights.irpa"),
              "folded": os.path.join(WORK, "folded.irpa")}
    if QUANTIZE:
        inputs["ranges"] = os.path.join(QUANT, "calibration.json")
        inputs["full"] = os.path.join(QUANT, "quantize.json")
    return inputs


def get_prepare_files(wildcards):
    """The identity (size, mtime ns) of each member's split model and propagated inputs
    (a param: the split rewrites only the files that changed, so another value reruns
    the unit, whose keys redo only those layers)."""
    propagate = config["layer_inputs"] == "propagate"
    return {s: [units.file_identity(os.path.join(LAYERS, s, "model.onnx")),
                units.file_identity(os.path.join(LAYERS, s, "inputs.npz")) if propagate else None]
            for s in _unit_slugs(wildcards)}


def get_prepare_rerun(wildcards):
    """The prepare job's rerun param (read-only): per member that timed out under a
    smaller --timeout than now, new tokens (steps.markers.timeout_rerun_token)."""
    out = {}
    for s in _unit_slugs(wildcards):
        d = os.path.join(LAYERS, s)
        tokens = [timeout_rerun_token(os.path.join(d, f), config["timeout_s"]) for f in ("reference.npz", "import.json")]
        if any(tokens):
            out[s] = tokens
    return out


def _earlier_executors(executor):
    """Skip mode: the executors before ``executor`` in priority order (else none)."""
    if not config["skip_mode"]:
        return []
    names = list(EXECUTORS)
    return names[:names.index(executor)]


def get_unit_test_inputs(wildcards):
    """The unit's prepare record and, in skip mode, its records of the executors
    before this one (a layer's executors are tested in priority order).

    The unit's members are looked up here too, not only in the params: that asks for the
    split checkpoint, so a job run on its own (a cluster node: --target-jobs with
    --allowed-rules test_unit) has the checkpoint in its DAG before the params read the
    manifest (Snakemake refuses a param that depends on a checkpoint outside the inputs)."""
    _unit_slugs(wildcards, known=False)
    inputs = {"prepared": os.path.join(UNITS, wildcards.unit, units.PREPARED_FILE)}
    earlier = _earlier_executors(wildcards.executor)
    if earlier:
        inputs["earlier"] = [os.path.join(UNITS, wildcards.unit, f"{e}.json") for e in earlier]
    return inputs


def get_layer_test_inputs(wildcards):
    """One layer's test asked for on its own: its unit's prepare record and, in skip
    mode, its results of the executors before this one."""
    inputs = {"prepared": os.path.join(UNITS, unit_of(wildcards.layer), units.PREPARED_FILE)}
    earlier = _earlier_executors(wildcards.executor)
    if earlier:
        inputs["earlier"] = [layout.layer_result_file(LAYERS, wildcards.layer, e) for e in earlier]
    return inputs


def get_unit_batches(wildcards):
    """The compile batches of the unit for the executor, ``[{"id", "members"}]``, or
    None when its layers are compiled in their own tests (a param: another membership
    or other settings recompile; the members' keys decide what is tested again)."""
    if not batched(wildcards.executor):
        return None
    slugs = set(_unit_slugs(wildcards))
    return [{"id": b, "members": m} for b, m in layer_batches(wildcards.executor)[0].items() if m[0] in slugs]


def get_unit_test_rerun(wildcards):
    """The test job's rerun param (read-only): the members' skip-mode placeholders
    (outside skip mode) and timeout records under a smaller --timeout, and the
    batches' timeout records (steps.markers)."""
    out = {}
    for s in _unit_slugs(wildcards):
        d = os.path.join(LAYERS, s, wildcards.executor)
        tokens = [skipped_rerun_token(d, config["skip_mode"]),
                  timeout_rerun_token(os.path.join(d, "result.json"), config["timeout_s"])]
        if any(tokens):
            out[s] = tokens
    for b in get_unit_batches(wildcards) or []:
        token = timeout_rerun_token(os.path.join(BATCHES, wildcards.executor, b["id"], "batch.json"), config["timeout_s"])
        if token:
            out[b["id"]] = token
    return out


_RECORD_CACHE = {}

#: a unit's drift when nothing changed outside the workflow (and before any unit record)
NO_DRIFT = {"prepared": [], "results": {}}


def _unit_record_raw(path):
    """A unit's record (prepared.json or <executor>.json) as read, cached per mtime; None
    when there is none (or it cannot be read: the unit job makes it)."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
    except OSError:
        return None
    if key not in _RECORD_CACHE:
        if len(_RECORD_CACHE) > 4 * (len(EXECUTORS) + 1) * max(1, len(layer_units()[0])):
            _RECORD_CACHE.clear()
        try:
            rec = read_json(path, "unit record")
            _RECORD_CACHE[key] = {"members": {m["slug"]: m for m in rec["members"]}, "drift": rec.get("drift")}
        except (ReportError, KeyError, TypeError):
            _RECORD_CACHE[key] = None
    return _RECORD_CACHE[key]


def _unit_record(path):
    """A unit record's members as ``{slug: member}`` (:func:`_unit_record_raw`), or None."""
    rec = _unit_record_raw(path)
    return rec["members"] if rec else None


_DRIFT_CACHE = {}


def _prepared_drift(unit):
    """Members of ``unit`` whose prepared files differ from what its preparation
    recorded (cached per record: the executors' test jobs share it)."""
    path = os.path.join(UNITS, unit, units.PREPARED_FILE)
    record = _unit_record(path)
    if not record:
        return []
    key = (path, os.stat(path).st_mtime_ns)
    if key not in _DRIFT_CACHE:
        _DRIFT_CACHE[key] = sorted(s for s, m in record.items()
                                   if any(units.file_identity(os.path.join(LAYERS, s, f)) != ident
                                          for f, ident in (m.get("files") or {}).items()))
    return _DRIFT_CACHE[key]


def get_unit_drift(wildcards):
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
    value first computed in a run is kept for the run (:data:`_DRIFT_SEEN`). A stat per
    file: 4 per layer, once, and one per (layer, executor)."""
    unit = _unit(wildcards)
    seen = _DRIFT_SEEN.get((unit, wildcards.executor))
    if seen is not None:
        return seen
    path = os.path.join(UNITS, unit, f"{wildcards.executor}.json")
    record = _unit_record_raw(path)
    results = (record or {}).get("members") or {}
    # with the current identity: a second change of the same file (damaged, then
    # removed by the report job) gives another value, hence another rerun
    changed = {s: now for s, m in sorted(results.items())
               if "result" in m and (now := units.file_identity(
                   layout.layer_result_file(LAYERS, s, wildcards.executor))) != m["result"]}
    prepared = _prepared_drift(unit)
    if not prepared and not changed:
        drift = (record or {}).get("drift") or NO_DRIFT
    else:
        drift = {"prepared": prepared, "results": changed}
        if changed:
            drift["record"] = units.file_identity(path)
    _DRIFT_SEEN[(unit, wildcards.executor)] = drift
    return drift


# The drift of each (unit, executor) as first seen in this run (this parse): Snakemake
# evaluates the params again when the job starts, after it removed the job's output (the
# unit record), and the job must record the value Snakemake stored (from the DAG).
_DRIFT_SEEN = {}


def forced(rule):
    """Whether this run recomputes the jobs of ``rule`` whatever the members' keys say
    (Snakemake's --forceall, i.e. `discover --recompute-cache`, or --forcerun RULE): an
    untracked param of the unit jobs, which then redo every member."""
    settings = getattr(workflow, "dag_settings", None)  # set after the parse: ask in a param function
    return bool(settings and (settings.forceall or rule in settings.forcerun))


# The params of rules test_unit and test_layer (rules/layer_tests.smk).
UNIT_TEST_PARAMS = dict(
    unit=_unit,
    members=get_unit_members,
    executor=get_executor,
    batches=get_unit_batches,
    needs_mlir=lambda wildcards: NEEDS_MLIR[EXECUTORS[wildcards.executor]["backend"]],
    timing=get_timing,
    precision=LAYER_PRECISION,
    rerun=get_unit_test_rerun,
    drift=get_unit_drift,
    tolerance=untracked(config["tolerance"]),
    timeout_s=TIMEOUT,
    skip_mode=untracked(config["skip_mode"]),
    earlier=lambda wildcards: untracked(_earlier_executors(wildcards.executor)),
    log_file=untracked(config["log_file"] or None),
    verbose=untracked(config["verbose"]),
    layers_dir=untracked(LAYERS),
    logs_dir=untracked(LOGS),
    batches_dir=untracked(BATCHES),
    force=lambda wildcards: untracked(forced("test_unit")),
    outdated=REPORT_OUTDATED,
)


def all_unit_results(wildcards):
    """Every (unit, executor) record to produce; known once the split ran."""
    return [os.path.join(UNITS, u, f"{e}.json") for u in layer_units()[0] for e in EXECUTORS]
