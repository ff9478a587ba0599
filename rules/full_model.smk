# Full-model run (`torq-gen-config run`, or `snakemake --cores N full_model`): the
# prepared model (with quantize: the quantized full model) as a chain of partitions (maximal runs of consecutive nodes on the
# same executor), each compiled for its executor, run in order with host numpy in
# between, and compared with the ONNX Runtime reference of the whole model.
# A torq assignment (every assigned executor of backend torq) is one "partition",
# pid torq-<hash of executor map, full.mlir, options>, whose side file is the
# executor map: compile_partition compiles work/full.mlir once with
# --torq-executor-map, run_full_model runs that module once.
# docs/full_model_run.md describes the files; the logic is in
# torq_gen_config.full_model, the job entry points in torq_gen_config.full_model_jobs.
from torq_gen_config import full_model_jobs

FULL = os.path.join(WORK, "full")
PARTS = os.path.join(FULL, "partitions")
FULL_ASSIGNMENT = os.path.join(FULL, "assignment.json")
FULL_PLAN = os.path.join(FULL, "plan.json")
FULL_REFERENCE = os.path.join(FULL, "reference.npz")
FULL_RESULT = os.path.join(FULL, "result.json")


wildcard_constraints:
    pid=r"[A-Za-z0-9][A-Za-z0-9_.+-]*-[0-9a-f]{12}",


_PLAN_CACHE = {}


def full_plan():
    """The plan written by the checkpoint (after it ran), cached per mtime."""
    path = checkpoints.plan_full_model.get().output.plan
    key = (path, os.stat(path).st_mtime_ns)
    if key not in _PLAN_CACHE:
        with open(path) as f:
            plan = json.load(f)
        _PLAN_CACHE.clear()
        _PLAN_CACHE[key] = {p["pid"]: p for p in plan["partitions"]}
    return _PLAN_CACHE[key]


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
    return [os.path.join(PARTS, pid, "compiled.json") for pid in full_plan()]


def assignment_digest(wildcards):
    """What the report assigns (a param: an edit of the report that changes the
    assignment reruns the assignment rule even when the compiler JSON stays the same)."""
    return full_model_jobs.selection_digest_of(REPORT, COMPILER_JSON)


# Snakemake form only (`torq-gen-config run` writes assignment.json itself, with its
# command-line options, and does not let this rule run). The input is the compiler
# JSON, written together with the report by aggregate_report (and by `edit`); `run`
# rewrites it only when its bytes change, so the report's full_model section, which
# `run` adds, triggers nothing. (Not ancient(REPORT): with an ancient input,
# Snakemake 9.27 can drop the job from the DAG after a checkpoint update although
# its output is missing.) The job reads the report next to it.
rule full_assignment:
    input:
        compiler=COMPILER_JSON,
    output:
        assignment=FULL_ASSIGNMENT,
    params:
        digest=assignment_digest,
    log:
        os.path.join(LOGS, "full_assignment.log"),
    run:
        full_model_jobs.assignment_job(report=REPORT, compiler=input.compiler, assignment=output.assignment,
                                       log=log[0])


checkpoint plan_full_model:
    input:
        assignment=FULL_ASSIGNMENT,
        model=run_model(),
        manifest=run_manifest(),
        locations=rules.import_full_model.output.locations,
        mlir=rules.import_full_model.output.mlir,
    output:
        plan=FULL_PLAN,
    params:
        # torq_hw/torq_hw_type applied as in discovery (compiler/runtime options are
        # applied by the plan itself)
        executors=[backends.executor_with_tool_options(e, [], [], config["torq_hw"], config["torq_hw_type"])
                   for e in EXECUTORS.values()],
        compiler_options=config["compiler_options"],
        runtime_options=config["runtime_options"],
        precision=LAYER_PRECISION,
    log:
        os.path.join(LOGS, "plan_full_model.log"),
    run:
        full_model_jobs.plan_job(assignment=input.assignment, prepared=input.model, manifest=input.manifest,
                                 locations=input.locations, executors=params.executors, plan=output.plan,
                                 compiler_options=params.compiler_options, runtime_options=params.runtime_options,
                                 full_mlir=input.mlir, timeout_s=config["timeout_s"], log=log[0])


rule compile_partition:
    input:
        model=get_partition_model,
    output:
        compiled=os.path.join(PARTS, "{pid}", "compiled.json"),
    params:
        executor=get_compile_def,
    log:
        os.path.join(LOGS, "compile_partition", "{pid}.log"),
    run:
        full_model_jobs.compile_partition_job(pid=wildcards.pid, model=input.model, executor=params.executor,
                                              compiled=output.compiled, timeout_s=config["timeout_s"], log=log[0],
                                              log_file=config["log_file"] or None, verbose=config["verbose"])


def run_input_data():
    """`run --input-data` other than discovery's (full-model reference only), as a list."""
    return [str(resolve_model_path(config["run_input_data"]))] if config["run_input_data"] else []


# on the model's input values (MODEL_INPUTS: --input-data, else generated), or on the
# inputs given to `run` (run_input_data)
rule full_reference:
    input:
        model=run_model(),
        model_inputs=MODEL_INPUTS,
        run_data=run_input_data(),
    output:
        reference=FULL_REFERENCE,
    params:
        inputs=config["inputs"],
        engine=config["reference"],
        run_data=file_fingerprint(run_input_data()[0]) if run_input_data() else None,
        precision=LAYER_PRECISION,
    log:
        os.path.join(LOGS, "full_reference.log"),
    run:
        full_model_jobs.full_reference_job(prepared=input.model, reference=output.reference,
                                           input_settings=params.inputs, model_inputs=input.model_inputs,
                                           run_data=input.run_data[0] if input.run_data else None,
                                           quantized=QUANTIZE, engine=params.engine,
                                           timeout_s=config["timeout_s"], log=log[0])


rule run_full_model:
    input:
        plan=FULL_PLAN,
        compiled=all_compiled,
        reference=FULL_REFERENCE,
    output:
        result=FULL_RESULT,
    log:
        os.path.join(LOGS, "run_full_model.log"),
    run:
        full_model_jobs.run_full_model_job(plan=input.plan, reference=input.reference, result=output.result,
                                           tolerance=config["tolerance"], timeout_s=config["timeout_s"], log=log[0],
                                           log_file=config["log_file"] or None, verbose=config["verbose"])


rule full_model:
    input:
        FULL_RESULT,
