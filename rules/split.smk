# Layer split (checkpoint: the layer list is known only after it ran) with each layer's
# inputs from the whole-model run, then per layer the reference outputs and the MLIR import.


# With layer_inputs: propagate (the default) the checkpoint also runs the whole model
# on its input values and writes each layer's inputs.npz (side files, like the layer
# models: rewritten only when they change).
checkpoint split_layers:
    input:
        model=rules.prepare_model.output.model,
        info=rules.prepare_model.output.info,
        model_inputs=MODEL_INPUTS,
    output:
        manifest=os.path.join(LAYERS, "manifest.json"),
    params:
        layer_inputs=config["layer_inputs"],
    log:
        os.path.join(LOGS, "split_layers.log"),
    run:
        report_outdated()
        jobs.split_layers_job(prepared=input.model, info_path=input.info, manifest=output.manifest,
                              model_inputs=input.model_inputs, layer_inputs=params.layer_inputs,
                              timeout_s=config["timeout_s"], log=log[0])


# Both reference engines (onnxruntime and onnx's reference implementation); the
# configured one (reference) is what the verdicts are computed against.
rule layer_reference:
    input:
        unpack(get_reference_inputs),
    output:
        reference=os.path.join(LAYERS, "{layer}", "reference.npz"),
    params:
        inputs=config["inputs"],
        layer_inputs=config["layer_inputs"],
        engine=config["reference"],
        precision=LAYER_PRECISION,
    log:
        os.path.join(LOGS, "layer_reference", "{layer}.log"),
    run:
        report_outdated()
        jobs.reference_job(layer_onnx=input.model, reference=output.reference, input_settings=params.inputs,
                           inputs_path=input.get("inputs"), calibration=input.get("calibration"),
                           engine=params.engine, timeout_s=config["timeout_s"], log=log[0])


rule import_layer:
    input:
        unpack(get_import_inputs),
    output:
        mlir=os.path.join(LAYERS, "{layer}", "model.mlir"),
        status=os.path.join(LAYERS, "{layer}", "import.json"),
    params:
        precision=LAYER_PRECISION,
    log:
        os.path.join(LOGS, "import_layer", "{layer}.log"),
    run:
        report_outdated()
        jobs.import_layer_job(layer_onnx=input.model, mlir=output.mlir, status=output.status,
                              timeout_s=config["timeout_s"], log=log[0])
