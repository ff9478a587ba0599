# Rerun markers: an extra input that redoes a job whose output is a skip-mode
# "skipped" placeholder or records a timeout under a smaller limit than now
# (get_reference_inputs, get_import_inputs, get_test_inputs name them while the DAG
# is built, without writing; this job creates the marker when the jobs run).


rule rerun_marker:
    output:
        marker="{path}.rerun-{stamp}",
    wildcard_constraints:
        stamp=r"[0-9]+",
    # declared for the linter: nothing is logged (no file is made)
    log:
        "{path}.rerun-{stamp}.log",
    localrule: True
    run:
        write_rerun_marker(output.marker)
