# Full-model run (`torq-gen-config run`, or `snakemake --cores N full_model`): the
# prepared model (with quantize: the quantized full model) as a chain of partitions (maximal runs of consecutive nodes on the
# same executor), each compiled for its executor, run in order with host numpy in
# between, and compared with the ONNX Runtime reference of the whole model.
# A torq assignment (every assigned executor of backend torq) is one "partition",
# pid torq-<hash of executor map, full.mlir, options>, whose side file is the
# executor map: compile_partition compiles work/full.mlir once with
# --torq-executor-map, run_full_model runs that module once.
# docs/full_model_run.md describes the files; the logic is in
# torq_gen_config.fullrun, the steps in torq_gen_config.pipeline.steps.full_model; the
# paths (ctx.full_*) are in torq_gen_config.pipeline.context, its input functions (get.*) too.


# Snakemake form only (`torq-gen-config run` writes assignment.json itself, with its
# command-line options, and does not let this rule run). The input is the compiler
# JSON, written together with the report by aggregate_report (and by `edit`); `run`
# rewrites it only when its bytes change, so the report's full_model section, which
# `run` adds, triggers nothing. (Not ancient(REPORT): with an ancient input,
# Snakemake 9.27 can drop the job from the DAG after a checkpoint update although
# its output is missing.) The job reads the report next to it.
rule full_assignment:
    localrule: True
    input:
        compiler=ctx.compiler_json,
    output:
        assignment=ctx.full_assignment,
    params:
        digest=get.assignment_digest,
        report=ctx.report,
    log:
        ctx.log("full_assignment.log"),
    run:
        steps.full_model.full_assignment(input, output, params, log)


checkpoint plan_full_model:
    input:
        assignment=ctx.full_assignment,
        model=ctx.run_model,
        manifest=ctx.run_manifest,
        locations=rules.import_full_model.output.locations,
        mlir=rules.import_full_model.output.mlir,
        # the stored weights' size: parameters: auto is resolved with it
        info=rules.prepare_model.output.info,
        # the partition models refer to the weight store: a removed store is made again
        weights=rules.prepare_model.output.weights,
    output:
        plan=ctx.full_plan,
    params:
        # the archives' absolute paths are in the external-mode run flags: a moved output
        # directory plans (and runs) again
        store=os.path.abspath(ctx.weights),
        # run-wide backend settings (torq_hw, ...) applied as in discovery (compiler/runtime
        # options are applied by the plan itself)
        executors=ctx.plan_executors,
        compiler_options=config["compiler_options"],
        runtime_options=config["runtime_options"],
        compile_batch=config["compile_batch"],
        # auto | module | partitions (fullrun/module/mode.py): one IREE module or a chain
        run_mode=config.get("run_mode", "auto"),
        precision=ctx.layer_precision,
        # weights inline or as IREE parameters (docs/parameters.md), resolved in the job
        parameters=ctx.parameter_settings,
        timeout_s=ctx.timeout,
    log:
        ctx.log("plan_full_model.log"),
    run:
        steps.full_model.plan_full_model(input, output, params, log)


# With compile_batch > 1: the partitions of one executor (backends with batch_compile)
# imported and compiled as one module, one function per partition, one compiler
# process per batch (docs/compile_batches.md, "The full-model run"). Each member's
# compile_partition job below takes its function from it, or compiles it alone when the
# batch left it out. The module (a copy of its members' weights) is temp(): removed once
# run_full_model, its last reader, is done, and made again only if a job that reads it
# must run again (keep_work: all keeps it).
rule compile_partition_batch:
    input:
        models=get.partition_batch_models,
    output:
        module=batch_module_output(os.path.join(ctx.part_batches, "{executor}", "{batch}", layout.MODULE_FILE)),
        info=os.path.join(ctx.part_batches, "{executor}", "{batch}", layout.BATCH_FILE),
    params:
        executor=get.partition_batch_def,
        members=get.partition_batch_members,
        timeout_s=ctx.timeout,
        log_file=untracked(config["log_file"] or None),
    log:
        ctx.log("compile_partition_batch", "{executor}.{batch}.log"),
    threads: 1
    priority: 20  # the longest jobs, each waited for by its members
    run:
        steps.full_model.compile_partition_batch(input, output, params, log, wildcards)


rule compile_partition:
    input:
        unpack(get.partition_inputs),
    output:
        compiled=os.path.join(ctx.parts, "{pid}", layout.COMPILED_FILE),
    params:
        executor=get.compile_def,
        batch=get.partition_batch,
        timeout_s=ctx.timeout,
        log_file=untracked(config["log_file"] or None),
        verbose=untracked(config["verbose"]),
    log:
        ctx.log("compile_partition", "{pid}.log"),
    threads: 1
    run:
        steps.full_model.compile_partition(input, output, params, log, wildcards)


# on the model's input values (MODEL_INPUTS: --input-data, else generated), or on the
# inputs given to `run` (run_input_data)
rule full_reference:
    input:
        model=ctx.run_model,
        model_inputs=ctx.model_inputs,
        run_data=ctx.run_input_data,
    output:
        reference=ctx.full_reference,
    params:
        inputs=config["inputs"],
        engine=config["reference"],
        run_data=ctx.run_data_fingerprint,
        precision=ctx.layer_precision,
        quantized=ctx.quantize,
        # ONNX Runtime with all optimizations measured against the reference (the
        # full-model tolerance widens to it); a param, so older references are made again
        optimized_check=True,
        timeout_s=ctx.timeout,
    log:
        ctx.log("full_reference.log"),
    run:
        steps.full_model.full_reference(input, output, params, log)


rule run_full_model:
    input:
        plan=ctx.full_plan,
        compiled=get.all_compiled,
        # the batch modules the partitions run from (temp(): removed after this job)
        batch_modules=get.all_batch_modules,
        reference=ctx.full_reference,
    output:
        result=ctx.full_result,
    params:
        tolerance=untracked(config["tolerance"]),
        timeout_s=ctx.timeout,
        log_file=untracked(config["log_file"] or None),
        verbose=untracked(config["verbose"]),
    log:
        ctx.log("run_full_model.log"),
    run:
        steps.full_model.run_full_model(input, output, params, log)


rule full_model:
    localrule: True
    input:
        ctx.full_result,
