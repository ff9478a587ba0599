# Aggregate: recommendation per layer, report JSON and compiler JSON.


def quantize_report_inputs(wildcards):
    """With quantize: the layers mapped onto the quantized model (their line:col in
    its MLIR) and the full model's quantization info; else nothing."""
    if not QUANTIZE:
        return []
    return [os.path.join(QUANT, "manifest.json"), os.path.join(QUANT, "quantize.json")]


rule aggregate_report:
    input:
        manifest=os.path.join(LAYERS, "manifest.json"),
        info=rules.prepare_model.output.info,
        locations=rules.import_full_model.output.locations,
        results=all_layer_results,
        quant=quantize_report_inputs,
    output:
        report=REPORT,
        compiler=COMPILER_JSON,
    params:
        executors=list(EXECUTORS.values()),
        tolerance=config["tolerance"],
        options=run_options(),
        recommend_by_timing=config["recommend_by_timing"],
    log:
        os.path.join(LOGS, "aggregate_report.log"),
    run:
        rep = jobs.aggregate_job(model_name=MODEL_NAME, manifest=input.manifest, prepare_info=input.info,
                                 locations=input.locations, results_root=LAYERS, executors=params.executors,
                                 tolerance=params.tolerance, options=params.options, report=output.report,
                                 compiler=output.compiler, output_dir=OUT, skip_ops=config["skip_ops"],
                                 dedup_layers=config["dedup_layers"],
                                 user_choices=os.path.join(WORK, "user_choices.json"),
                                 recommend_by_timing=params.recommend_by_timing,
                                 quantized_manifest=input.quant[0] if input.quant else None,
                                 quantize_info=input.quant[1] if input.quant else None, log=log[0])
        layout.clear_outdated(REPORT_OUTDATED)
        summary = rep["discovery_report"]["summary"]
        print(f"report: {output.report} ({len(rep['ops'])} layers, {summary['distinct_layers_tested']} tested; "
              f"{summary['status_counts']})")
