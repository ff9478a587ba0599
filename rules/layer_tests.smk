# One job per (layer, executor): compile, run, compare, result.json.
# Tolerance, timeout, log file and verbosity are untracked params: the report
# re-derives verdicts from the stored metrics, so a tolerance change recompiles
# nothing (a larger timeout reruns what timed out: param rerun). The runtime
# measurement settings (collect_timing) are a tracked param: switching timing on
# must rerun the tests to measure.


rule test_layer:
    input:
        unpack(get_test_inputs),
    output:
        result=os.path.join(LAYERS, "{layer}", "{executor}", "result.json"),
    params:
        layer=get_layer,
        executor=get_executor,
        timing=get_timing,
        precision=LAYER_PRECISION,
        rerun=get_test_rerun,
        batch=get_test_batch,
        tolerance=untracked(config["tolerance"]),
        timeout_s=TIMEOUT,
        log_file=untracked(config["log_file"] or None),
        verbose=untracked(config["verbose"]),
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "test_layer", "{layer}.{executor}.log"),
    threads: 1
    run:
        steps.layer_tests.test_layer(input, output, params, log)


# One compiler process per (batch of layers, executor) for backends that compile
# batches (compile_batch > 1; docs/compile_batches.md): one module, one function per
# layer; the test jobs above run their function from it. Layers the batch cannot
# compile are left to their own test job, which compiles them alone. The tests' batch
# inputs are ancient (rules/common.smk, batch_input): a batch compiled again for one
# member retests only that member. Not in a SLURM group (profiles/slurm).
rule compile_batch:
    input:
        unpack(get_batch_inputs),
    output:
        module=os.path.join(BATCHES, "{executor}", "{batch}", "module.vmfb"),
        info=os.path.join(BATCHES, "{executor}", "{batch}", "batch.json"),
    params:
        executor=get_executor,
        members=get_batch_members,
        rerun=get_batch_rerun,
        timeout_s=TIMEOUT,
        outdated=REPORT_OUTDATED,
    log:
        os.path.join(LOGS, "compile_batch", "{executor}.{batch}.log"),
    threads: 1
    priority: 20  # the longest jobs, each waited for by its members' tests
    run:
        steps.layer_tests.compile_batch(input, output, params, log)
