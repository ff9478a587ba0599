# Layer split (checkpoint: the layer list is known only after it ran), then per layer
# the reference outputs and the MLIR import.


checkpoint split_layers:
    input:
        model=rules.prepare_model.output.model,
        info=rules.prepare_model.output.info,
    output:
        manifest=os.path.join(LAYERS, "manifest.json"),
    log:
        os.path.join(LOGS, "split_layers.log"),
    run:
        jobs.split_layers_job(prepared=input.model, info_path=input.info, manifest=output.manifest, log=log[0])


checkpoint propagate_layer_inputs:
    input:
        model=rules.prepare_model.output.model,
        manifest=os.path.join(LAYERS, "manifest.json"),
        data=input_data_file(),
    output:
        info=os.path.join(WORK, "propagated_inputs.json"),
    params:
        inputs=config["inputs"],
    log:
        os.path.join(LOGS, "propagate_layer_inputs.log"),
    run:
        jobs.propagate_inputs_job(prepared=input.model, manifest=input.manifest, info=output.info,
                                  input_settings=params.inputs, input_data=input.data[0] if input.data else None,
                                  log=log[0])


rule layer_reference:
    input:
        unpack(get_reference_inputs),
    output:
        reference=os.path.join(LAYERS, "{layer}", "reference.npz"),
    params:
        inputs=config["inputs"],
        layer_inputs=config["layer_inputs"],
        precision=LAYER_PRECISION,
    log:
        os.path.join(LOGS, "layer_reference", "{layer}.log"),
    run:
        jobs.reference_job(layer_onnx=input.model, reference=output.reference, input_settings=params.inputs,
                           inputs_path=input.get("inputs"), calibration=input.get("calibration"), log=log[0])


rule import_layer:
    input:
        model=get_layer_model,
    output:
        mlir=os.path.join(LAYERS, "{layer}", "model.mlir"),
        status=os.path.join(LAYERS, "{layer}", "import.json"),
    params:
        precision=LAYER_PRECISION,
    log:
        os.path.join(LOGS, "import_layer", "{layer}.log"),
    run:
        jobs.import_layer_job(layer_onnx=input.model, mlir=output.mlir, status=output.status, log=log[0])
