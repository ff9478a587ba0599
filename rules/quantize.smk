# --quantize (docs/precision.md): calibrate on the FP32 prepared model, quantize the
# whole model once (its MLIR gives the compiler JSON's line:col, `run` partitions it),
# quantize each layer on its own with the same ranges (its tests: rule prepare_unit,
# rules/split.smk), and map the layers
# onto the quantized model's compute ops (LCS over op types; fused activations drop
# out of the compiler JSON). Only part of the DAG when quantize is on.


rule calibrate_model:
    input:
        model=rules.prepare_model.output.model,
        data=ctx.calibration_data,
    output:
        ranges=ctx.calibration,
    params:
        samples=config["calibration_samples"],
        seed=config["inputs"]["seed"],
        float_range=config["inputs"]["float_range"],
        # dropping the file is no input change Snakemake sees: the path is a param
        data=ctx.calibration_data,
        timeout_s=ctx.timeout,
        outdated=ctx.report_outdated,
    log:
        ctx.log("calibrate_model.log"),
    run:
        steps.quantize.calibrate_model(input, output, params, log)


rule quantize_full_model:
    input:
        model=rules.prepare_model.output.model,
        ranges=rules.calibrate_model.output.ranges,
        data=ctx.calibration_data,
    output:
        model=ctx.quantized_model,
        info=ctx.quantize_info,
    params:
        settings=ctx.quant_settings,
        samples=config["calibration_samples"],
        seed=config["inputs"]["seed"],
        float_range=config["inputs"]["float_range"],
        data=ctx.calibration_data,
        timeout_s=ctx.timeout,
        outdated=ctx.report_outdated,
    log:
        ctx.log("quantize_full_model.log"),
    run:
        steps.quantize.quantize_full_model(input, output, params, log)


rule map_quantized_layers:
    input:
        manifest=ctx.manifest,
        model=rules.quantize_full_model.output.model,
    output:
        manifest=ctx.quant_manifest,
    params:
        outdated=ctx.report_outdated,
    log:
        ctx.log("map_quantized_layers.log"),
    run:
        steps.quantize.map_quantized_layers(input, output, params, log)
