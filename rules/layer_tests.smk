# One job per (layer, executor): compile, run, compare, result.json.
# Tolerance and timeout are read from the config inside the job, not params: the
# report re-derives verdicts from the stored metrics, so a tolerance change
# recompiles nothing. The runtime measurement settings (collect_timing) are a
# param: switching timing on must rerun the tests to measure.


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
    log:
        os.path.join(LOGS, "test_layer", "{layer}.{executor}.log"),
    run:
        report_outdated()
        jobs.test_layer_job(layer=params.layer, executor=params.executor, layer_onnx=input.model,
                            reference=input.reference, mlir=input.get("mlir"),
                            import_status=input.get("import_status"), result=output.result,
                            tolerance=config["tolerance"], timeout_s=config["timeout_s"], log=log[0],
                            log_file=config["log_file"] or None, verbose=config["verbose"],
                            earlier_results=input.get("earlier") or [], timing=params.timing)
