# Model preparation and the full-model MLIR with its node -> line:col map.


# Also the model's input values (MODEL_INPUTS): the user's input_data or generated
# ones, in subgraph mode the values of the subgraph's inputs in a whole-model run.
rule prepare_model:
    input:
        model=ctx.model_path,
        data=ctx.input_data,
    output:
        model=ctx.prepared_model,
        weights=ctx.weights,
        info=ctx.prepare_info,
        model_inputs=ctx.model_inputs,
    params:
        target_opset=config["target_opset"],
        # which file (and external weights) this is: another model in the same output
        # directory, even an older file, reruns everything (mtime alone would miss it)
        model=ctx.model_fingerprint,
        precision=ctx.conversion,
        inputs=config["inputs"],
        input_shapes=ctx.input_shapes,
        input_data=ctx.input_data_fingerprint,
        # subgraph mode: prepare_model cuts out the subgraph; the range is untracked,
        # its node indices are part of the output paths (WORK)
        subgraph=untracked(ctx.subgraph_range),
        timeout_s=ctx.timeout,
        outdated=ctx.report_outdated,
    log:
        ctx.log("prepare_model.log"),
    run:
        steps.prepare.prepare_model(input, output, params, log)


# with quantize: the quantized full model (its nodes are what the compiler sees)
rule import_full_model:
    input:
        model=ctx.run_model,
    output:
        mlir=ctx.full_mlir,
        locations=ctx.locations,
    params:
        # switching quantize changes the input file (maybe to an older one)
        precision=ctx.layer_precision,
        # the weights stay in full.mlir only when an executor compiles the whole model from it
        weights=ctx.full_mlir_weights,
        timeout_s=ctx.timeout,
        outdated=ctx.report_outdated,
    log:
        ctx.log("import_full_model.log"),
    run:
        steps.prepare.import_full_model(input, output, params, log)
