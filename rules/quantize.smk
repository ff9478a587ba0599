# --quantize (docs/precision.md): calibrate on the FP32 prepared model, quantize the
# whole model once (its MLIR gives the compiler JSON's line:col, `run` partitions it),
# quantize each layer on its own with the same ranges (its tests), and map the layers
# onto the quantized model's compute ops (LCS over op types; fused activations drop
# out of the compiler JSON). Only part of the DAG when quantize is on.


rule calibrate_model:
    input:
        model=rules.prepare_model.output.model,
        data=calibration_data_file(),
    output:
        ranges=os.path.join(QUANT, "calibration.json"),
    params:
        samples=config["calibration_samples"],
        seed=config["inputs"]["seed"],
        float_range=config["inputs"]["float_range"],
        # dropping the file is no input change Snakemake sees: the path is a param
        data=calibration_data_file(),
    log:
        os.path.join(LOGS, "calibrate_model.log"),
    run:
        report_outdated()
        jobs.calibrate_job(prepared=input.model, ranges=output.ranges, samples=params.samples, seed=params.seed,
                           float_range=params.float_range, data=input.data[0] if input.data else None,
                           timeout_s=config["timeout_s"], log=log[0])


rule quantize_full_model:
    input:
        model=rules.prepare_model.output.model,
        ranges=rules.calibrate_model.output.ranges,
        data=calibration_data_file(),
    output:
        model=os.path.join(QUANT, "quantized.onnx"),
        info=os.path.join(QUANT, "quantize.json"),
    params:
        settings=QUANT_SETTINGS,
        samples=config["calibration_samples"],
        seed=config["inputs"]["seed"],
        float_range=config["inputs"]["float_range"],
        data=calibration_data_file(),
    log:
        os.path.join(LOGS, "quantize_full_model.log"),
    run:
        report_outdated()
        jobs.quantize_full_model_job(prepared=input.model, ranges=input.ranges, quantized=output.model,
                                     info=output.info, settings=params.settings, samples=params.samples,
                                     seed=params.seed, float_range=params.float_range,
                                     data=input.data[0] if input.data else None,
                                     timeout_s=config["timeout_s"], log=log[0])


# each layer in the format the whole model got (hybrid decides once, for the model)
rule quantize_layer:
    input:
        model=get_split_model,
        ranges=rules.calibrate_model.output.ranges,
        full=rules.quantize_full_model.output.info,
    output:
        model=os.path.join(LAYERS, "{layer}", "quantized.onnx"),
        info=os.path.join(LAYERS, "{layer}", "quantize.json"),
    params:
        settings=QUANT_SETTINGS,
    log:
        os.path.join(LOGS, "quantize_layer", "{layer}.log"),
    run:
        report_outdated()
        jobs.quantize_layer_job(layer_onnx=input.model, ranges=input.ranges, quantized=output.model,
                                info=output.info, settings=params.settings, full_model_info=input.full,
                                timeout_s=config["timeout_s"], log=log[0])


rule map_quantized_layers:
    input:
        manifest=os.path.join(LAYERS, "manifest.json"),
        model=rules.quantize_full_model.output.model,
    output:
        manifest=os.path.join(QUANT, "manifest.json"),
    log:
        os.path.join(LOGS, "map_quantized_layers.log"),
    run:
        report_outdated()
        jobs.map_quantized_layers_job(manifest=input.manifest, quantized=input.model, mapped=output.manifest,
                                      log=log[0])
