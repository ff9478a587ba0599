# Aggregate: recommendation per layer, report JSON and compiler JSON.


rule aggregate_report:
    input:
        manifest=os.path.join(LAYERS, "manifest.json"),
        info=rules.prepare_model.output.info,
        locations=rules.import_full_model.output.locations,
        results=all_layer_results,
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
                                 recommend_by_timing=params.recommend_by_timing, log=log[0])
        summary = rep["discovery_report"]["summary"]
        print(f"report: {output.report} ({len(rep['ops'])} layers, {summary['distinct_layers_tested']} tested; "
              f"{summary['status_counts']})")
