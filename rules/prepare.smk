# Model preparation and the full-model MLIR with its node -> line:col map.


# Also the model's input values (MODEL_INPUTS): the user's input_data or generated
# ones, in subgraph mode the values of the subgraph's inputs in a whole-model run.
rule prepare_model:
    input:
        model=MODEL_PATH,
        data=input_data_file(),
    output:
        model=os.path.join(WORK, "prepared.onnx"),
        weights=os.path.join(WORK, "weights.irpa"),
        info=os.path.join(WORK, "prepare.json"),
        model_inputs=MODEL_INPUTS,
    params:
        target_opset=config["target_opset"],
        # which file (and external weights) this is: another model in the same output
        # directory, even an older file, reruns everything (mtime alone would miss it)
        model=model_fingerprint(MODEL_PATH),
        precision=CONVERSION,
        inputs=config["inputs"],
        input_shapes=INPUT_SHAPES,
        input_data=INPUT_DATA_FINGERPRINT,
        # subgraph mode: prepare_model cuts out the subgraph; the range is untracked,
        # its node indices are part of the output paths (WORK)
        subgraph=untracked(subgraph_range()),
        timeout_s=TIMEOUT,
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "prepare_model.log"),
    run:
        steps.prepare.prepare_model(input, output, params, log)


# with quantize: the quantized full model (its nodes are what the compiler sees)
rule import_full_model:
    input:
        model=run_model(),
    output:
        mlir=os.path.join(WORK, "full.mlir"),
        locations=os.path.join(WORK, "locations.json"),
    params:
        # switching quantize changes the input file (maybe to an older one)
        precision=LAYER_PRECISION,
        # the weights stay in full.mlir only when an executor compiles the whole model from it
        weights=any(backends.capabilities(e["backend"]).whole_model() is not None for e in EXECUTORS.values()),
        timeout_s=TIMEOUT,
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "import_full_model.log"),
    run:
        steps.prepare.import_full_model(input, output, params, log)
