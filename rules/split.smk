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
        timeout_s=TIMEOUT,
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "split_layers.log"),
    run:
        steps.split.split_layers(input, output, params, log)


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
        rerun=get_timeout_rerun("reference.npz"),
        timeout_s=TIMEOUT,
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "layer_reference", "{layer}.log"),
    threads: 1
    run:
        steps.split.layer_reference(input, output, params, log)


rule import_layer:
    input:
        unpack(get_import_inputs),
    output:
        mlir=os.path.join(LAYERS, "{layer}", "model.mlir"),
        status=os.path.join(LAYERS, "{layer}", "import.json"),
    params:
        precision=LAYER_PRECISION,
        rerun=get_timeout_rerun("import.json"),
        timeout_s=TIMEOUT,
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "import_layer", "{layer}.log"),
    threads: 1
    # before the references and tests that are ready too: the compile batches wait for
    # all their members' imports, and they are the longest jobs
    priority: 10
    run:
        steps.split.import_layer(input, output, params, log)
