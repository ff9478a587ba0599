"""ck-profile: PyTorch convolution traces -> CK Profiler configurations -> profiler runs.

The second tool of this repository. It replaces two scripts, ``convert_pytorch_to_ck.py``
and ``run_ck_profiler.py`` ("the seed" in this package: their formats and command lines
are kept); facts about the real program in docs/ck_profile.md. Its modules, bottom to
top (imports point down only; from the rest of the package it uses only the basic layer:
errors, fileio, tools)::

    problem          ConvProblem: one grouped convolution, output size, FLOP and byte counts
    profiler_args    the real ckProfiler's command line: op names, dtype/layout codes, argc rule
    trace_ir         TraceLens event-replay IR records -> validated ConvProblems
    convert          a trace -> configurations (the seed's JSON format) and the summary
    profiler_output  parsing ckProfiler's stdout (Perf lines, valids, the best block)
    ort_timing       the cross-check backend: the same convolutions timed with ONNX Runtime
    profile          one configuration on one backend -> one result record
    results          the results JSON (the seed's format plus the parsed figures)
    steps            the Snakemake jobs of rules/ck_profiler.smk
    cli              ``ck-profile convert|run`` and the seed's two script command lines
"""
