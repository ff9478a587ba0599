# torq-gen-config: per-layer executor discovery for an ONNX model.
#   snakemake --cores 2                                   # embedded default model
#   snakemake --cores 2 --config model=path/to/model.onnx
#   snakemake --cores 2 ck_profile --config ck_configs=ck_profiler_configs.json   # the CK tool
# Stages: prepare the model (bf16/int32 conversion) -> [quantize] -> split into layers (checkpoint) -> reference + MLIR per
# layer -> compile/run/compare per (layer, executor) -> report and compiler JSON.
import os

from snakemake.utils import min_version, update_config

from torq_gen_config.config import load_config_file
from torq_gen_config.pipeline.scheduler_sizes import size_only_temp_inputs

min_version("9.20")
# Snakemake sizes every input of every ready job before each job selection; only temp()
# inputs' sizes are used (torq_gen_config/pipeline/scheduler_sizes.py: 16% of discovery's wall time
# on a 668-layer model).
size_only_temp_inputs()


# The default config, relative to this file, not to the main Snakefile (workflow.basedir):
# right also when this workflow is a module of another one, or the copy in an installed
# wheel; Snakemake's cached copy when the Snakefile is remote (a module from github(...)).
DEFAULT_CONFIG = (os.path.join(workflow.current_basedir, "config", "config.yaml")
                  if isinstance(workflow.current_basedir, os.PathLike) else workflow.source_path("config/config.yaml"))


configfile: DEFAULT_CONFIG


# A module (`module ...: config: ...`) skips configfile: and gets only the config it is given:
# the defaults go under it here (a no-op when configfile: was read).
_given = config.copy()
config.update(load_config_file(DEFAULT_CONFIG))
update_config(config, _given)


# The second workflow of this repository (CK Profiler runs of PyTorch convolutions,
# docs/ck_profile.md) when its input is given; else executor discovery.
if config.get("ck_configs") or config.get("ck_trace"):

    include: "rules/ck_profiler.smk"

elif config.get("models"):  # a model sheet: every model's discovery in one workflow (docs/sweep.md)

    include: "rules/sweep.smk"

    # here, not in the included file: Snakemake restores the default target after an include
    rule sweep:
        input:
            rules.sweep_summary.output,
        default_target: True
        localrule: True

else:

    include: "rules/common.smk"
    include: "rules/prepare.smk"
    include: "rules/split.smk"
    include: "rules/quantize.smk"
    include: "rules/layer_tests.smk"
    include: "rules/report.smk"
    include: "rules/full_model.smk"
    include: "rules/report_html.smk"

    # Cheap steps (all, aggregate_report, full_assignment, full_model) are `localrule: True`
    # rules: they run in the main process also with a cluster profile (profiles/slurm; a
    # submission costs ~10 s of queueing and polling, they take well under a second), also
    # when this workflow is a module used with a prefix (a `localrules:` list is not renamed).


    # One run per discovery: the same OS lock as the command line (torq_gen_config.core.run_lock),
    # taken when the jobs start (not for dry runs), so both forms exclude each other.
    onstart:
        start_run()


    onsuccess:
        run_lock.release(ctx.run_lock)
        # a compiler JSON that assigns nothing (its error says why) is not a success
        steps.report.exit_if_nothing_assigned(ctx.report)


    onerror:
        run_lock.release(ctx.run_lock)


    rule all:
        input:
            ctx.final_outputs,
        default_target: True
        localrule: True
