# Layer split (checkpoint: the layer list is known only after it ran) with each layer's
# inputs from the whole-model run, then per layer the reference outputs and the MLIR import.


# With layer_inputs: propagate (the default) the checkpoint also runs the whole model
# on its input values and writes each layer's inputs.npz (side files, like the layer
# models: rewritten only when they change).
checkpoint split_layers:
    input:
        model=rules.prepare_model.output.model,
        # the layer models refer to the weight store: a removed store is made again
        weights=rules.prepare_model.output.weights,
        info=rules.prepare_model.output.info,
        model_inputs=MODEL_INPUTS,
    output:
        manifest=os.path.join(LAYERS, "manifest.json"),
        folded=os.path.join(WORK, "folded.irpa"),
    params:
        layer_inputs=config["layer_inputs"],
        timeout_s=TIMEOUT,
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "split_layers.log"),
    run:
        steps.split.split_layers(input, output, params, log)


# Per unit of layers (pipeline/steps/units.py: ~32 layers, a whole number of compile batches):
# each member's quantized model (--quantize), its inputs and both reference engines'
# outputs (the configured one, reference, is what the verdicts are computed against),
# and its MLIR import when an executor compiles MLIR. The per-layer files are written
# beside the layer's model; a member whose files are up to date (its key) is kept.
rule prepare_unit:
    input:
        unpack(get_prepare_inputs),
    output:
        prepared=os.path.join(UNITS, "{unit}", "prepared.json"),
    params:
        unit=lambda wildcards: wildcards.unit,
        members=get_unit_members,
        files=get_prepare_files,
        inputs=config["inputs"],
        layer_inputs=config["layer_inputs"],
        engine=config["reference"],
        precision=LAYER_PRECISION,
        quantize=QUANT_SETTINGS,
        import_mlir=IMPORT_MLIR,
        # inline or external weights (docs/parameters.md): another mode imports the layers again
        parameters=parameters_mode,
        rerun=get_prepare_rerun,
        timeout_s=TIMEOUT,
        layers_dir=untracked(LAYERS),
        logs_dir=untracked(LOGS),
        force=lambda wildcards: untracked(forced("prepare_unit")),
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "prepare_unit", "{unit}.log"),
    threads: 1
    # before the tests that are ready too: each unit's tests wait for all of its members
    priority: 10
    run:
        steps.split.prepare_unit(input, output, params, log)
