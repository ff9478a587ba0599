# Aggregate: recommendation per layer, report JSON and compiler JSON.


# The only writer of the discovery report during discovery; `edit` changes
# user_choices.json (an input when it exists) and re-renders the report the same way.
rule aggregate_report:
    localrule: True
    input:
        manifest=ctx.manifest,
        info=rules.prepare_model.output.info,
        locations=rules.import_full_model.output.locations,
        units=get.all_unit_results,
        quant=get.quantize_report_inputs,
        user_choices=get.user_choices_input,
    output:
        report=ctx.report,
        compiler=ctx.compiler_json,
        # written by publish_report after the report; last, so Snakemake's touch of the
        # outputs leaves it not older than the report (report/publish.py)
        summary=ctx.report_summary,
    params:
        model_name=ctx.model_name,
        executors=ctx.executor_defs,
        unavailable=ctx.unavailable_defs,
        tolerance=config["tolerance"],
        options=ctx.run_options(),
        skip_ops=config["skip_ops"],
        dedup_layers=config["dedup_layers"],
        recommend_by_timing=config["recommend_by_timing"],
        # weights inline or as IREE parameters (docs/parameters.md): the report says which and why
        parameters=ctx.parameter_settings,
        outdated=ctx.report_outdated,
        # minimal: the finished run's intermediates removed (torq_gen_config.core.keep_work); a
        # change reruns this job, which removes them (or keeps what is made from now on)
        keep_work=config["keep_work"],
    log:
        ctx.log("aggregate_report.log"),
    run:
        steps.report.aggregate_report(input, output, params, log)
