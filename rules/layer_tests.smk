# One job per (unit of layers, executor) (pipeline/units.py): the unit's compile batches
# (compile_batch > 1, backends with batch_compile; docs/compile_batches.md), then
# compile, run and compare each layer, each writing its own result.json. Tolerance,
# timeout, log file and verbosity are untracked params: the report re-derives verdicts
# from the stored metrics, so a tolerance change recompiles nothing (a larger timeout
# reruns what timed out: param rerun). The runtime measurement settings
# (collect_timing) are a tracked param: switching timing on must rerun the tests.


rule test_unit:
    input:
        unpack(get.unit_test_inputs),
    output:
        result=os.path.join(ctx.units, "{unit}", "{executor}.json"),
    params:
        **get.unit_test_params(),
    log:
        ctx.log("test_unit", "{unit}.{executor}.log"),
    threads: 1
    run:
        steps.layer_tests.test_unit(input, output, params, log)


# One layer's verdict asked for on its own (a re-target: `snakemake <layer>/<executor>/
# result.json`): not part of the main DAG (the units are); it recompiles the layer's
# compile batch if that is out of date and tests this layer only.
rule test_layer:
    input:
        unpack(get.layer_test_inputs),
    output:
        result=layout.layer_result_file(ctx.layers, "{layer}", "{executor}"),
    params:
        **get.unit_test_params(),
        unit_record=get.unit_record,
    log:
        ctx.log("test_layer", "{layer}.{executor}.log"),
    threads: 1
    run:
        steps.layer_tests.test_layer(input, output, params, log)
