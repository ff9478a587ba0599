# The second workflow: CK Profiler runs of PyTorch convolutions (docs/ck_profile.md).
#   snakemake --cores 2 ck_profile --config ck_configs=ck_profiler_configs.json [ck_backend=onnxruntime]
#   snakemake --cores 2 ck_profile --config ck_trace=conv_repros_ir.json       # convert first
# One job per distinct configuration; results in <ck_output_dir>/profiler_results.json.


include: "ck_common.smk"


rule ck_profile:
    input:
        manifest=os.path.join(CK_OUT, "manifest.json"),
        results=ck_result_files,
    output:
        results=os.path.join(CK_OUT, ck_steps.RESULTS_FILE),
    params:
        backend=CK["ck_backend"],
        profiler=ck_profiler_param,
        summary=CK["ck_summary"],
    log:
        os.path.join(CK_OUT, "logs", "ck_profile.log"),
    default_target: True
    run:
        ck_steps.aggregate_job(manifest=input.manifest, result_files=list(input.results), output=output.results,
                               backend=params.backend, profiler=params.profiler, log=log[0],
                               summary=params.summary)


if CK["ck_trace"]:

    rule ck_convert:
        input:
            trace=CK["ck_trace"],
        output:
            configs=CK_CONFIGS,
        params:
            quiet=CK["ck_quiet"],
        log:
            os.path.join(CK_OUT, "logs", "ck_convert.log"),
        run:
            ck_steps.convert_job(trace=input.trace, output=output.configs, quiet=params.quiet, log=log[0])


# Per-configuration files are side files (like the layer models of split_layers):
# rewritten only when their content changes, so unchanged configurations are not rerun.
checkpoint ck_select:
    input:
        configs=CK_CONFIGS,
    output:
        manifest=os.path.join(CK_OUT, "manifest.json"),
    params:
        max_ops=CK["ck_max_ops"],
    log:
        os.path.join(CK_OUT, "logs", "ck_select.log"),
    run:
        ck_steps.select_job(configs=input.configs, manifest=output.manifest,
                            configs_dir=os.path.join(CK_OUT, "configs"), max_ops=params.max_ops, log=log[0])


# Measurements on one machine must not overlap (they would skew each other's times):
# each job holds one "ck_device" (profiles/default gives 1; --resources ck_device=N).
rule ck_profile_config:
    input:
        config=os.path.join(CK_OUT, "configs", "{cid}.json"),
    output:
        result=os.path.join(CK_OUT, "runs", "{cid}", "result.json"),
    log:
        os.path.join(CK_OUT, "runs", "{cid}", "profiler.log"),
    params:
        backend=CK["ck_backend"],
        profiler=ck_profiler_param,
        timeout_s=CK["ck_timeout_s"],
        quiet=CK["ck_quiet"],
    resources:
        ck_device=1,
        runtime=int(CK["ck_timeout_s"] // 60) + 5,
        gpu=1 if CK["ck_backend"] == "ckprofiler" else 0,
    run:
        ck_steps.profile_job(config_file=input.config, result=output.result, log=log[0], backend=params.backend,
                             profiler=params.profiler, timeout_s=params.timeout_s, quiet=params.quiet)
