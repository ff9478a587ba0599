# Layer split (checkpoint: the layer list is known only after it ran) with each layer's
# inputs from the whole-model run, then per layer the reference outputs and the MLIR import.


# With layer_inputs: propagate (the default) the checkpoint also runs the whole model
# on its input values, stores each value a layer receives once (values/) and writes each
# layer's inputs.json (side files, like the layer models: rewritten only when they change).
checkpoint split_layers:
    input:
        model=rules.prepare_model.output.model,
        # the layer models refer to the weight store: a removed store is made again
        weights=rules.prepare_model.output.weights,
        info=rules.prepare_model.output.info,
        model_inputs=ctx.model_inputs,
    output:
        manifest=ctx.manifest,
        folded=ctx.folded,
    params:
        layer_inputs=config["layer_inputs"],
        timeout_s=ctx.timeout,
        outdated=ctx.report_outdated,
    log:
        ctx.log("split_layers.log"),
    run:
        steps.split.split_layers(input, output, params, log)


# Per unit of layers (pipeline/units.py: ~32 layers, a whole number of compile batches):
# each member's quantized model (--quantize), its inputs and both reference engines'
# outputs (the configured one, reference, is what the verdicts are computed against;
# each value once in the work directory's value store, reference.json names them),
# and its MLIR import when an executor compiles MLIR. The per-layer files are written
# beside the layer's model; a member whose files are up to date (its key) is kept.
rule prepare_unit:
    input:
        unpack(get.prepare_inputs),
    output:
        prepared=os.path.join(ctx.units, "{unit}", units.PREPARED_FILE),
    params:
        unit=lambda wildcards: wildcards.unit,
        members=get.unit_members,
        files=get.prepare_files,
        inputs=config["inputs"],
        layer_inputs=config["layer_inputs"],
        engine=config["reference"],
        precision=ctx.layer_precision,
        quantize=ctx.quant_settings,
        import_mlir=ctx.import_mlir,
        # inline or external weights (docs/parameters.md): another mode imports the layers again
        parameters=get.parameters_mode,
        rerun=get.prepare_rerun,
        timeout_s=ctx.timeout,
        layers_dir=untracked(ctx.layers),
        logs_dir=untracked(ctx.logs),
        # which second-engine outputs are kept (those further than a tenth of it from the first)
        tolerance=untracked(config["tolerance"]),
        force=lambda wildcards: untracked(get.forced("prepare_unit")),
        outdated=ctx.report_outdated,
    log:
        ctx.log("prepare_unit", "{unit}.log"),
    threads: 1
    # before the tests that are ready too: each unit's tests wait for all of its members
    priority: 10
    run:
        steps.split.prepare_unit(input, output, params, log)
