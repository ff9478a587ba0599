# Model preparation and the full-model MLIR with its node -> line:col map.


rule prepare_model:
    input:
        model=MODEL_PATH,
    output:
        model=os.path.join(WORK, "prepared.onnx"),
        info=os.path.join(WORK, "prepare.json"),
    params:
        target_opset=config["target_opset"],
        # which file (and external weights) this is: another model in the same output
        # directory, even an older file, reruns everything (mtime alone would miss it)
        model=model_fingerprint(MODEL_PATH),
        precision=CONVERSION,
    log:
        os.path.join(LOGS, "prepare_model.log"),
    # subgraph mode: prepare_model cuts out the subgraph (subgraph_range()); the range
    # is not a param, its node indices are part of the output paths (WORK)
    run:
        jobs.prepare_model_job(model=input.model, prepared=output.model, info_path=output.info,
                               target_opset=params.target_opset, subgraph=subgraph_range(),
                               precision=params.precision, log=log[0])


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
    log:
        os.path.join(LOGS, "import_full_model.log"),
    run:
        jobs.import_full_model_job(prepared=input.model, mlir=output.mlir, locations=output.locations, log=log[0])
