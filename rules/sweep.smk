# A model sweep (config `models`: a model sheet, docs/sweep.md): every row's discovery is
# a Snakemake module of this same workflow (its config: the outer one, the row's config
# file, model, input shapes and data, output_dir/<name>), its rules prefixed <name>__, so
# that all models are ONE DAG: jobs of different models interleave and -j or a cluster
# sees all of them. A row that cannot run (unreadable model) is not a module: the summary
# lists it with its reason. The summary, sweep.json and sweep.html, needs every model's
# report and HTML page (rerun: only what changed; a model added to the sheet runs alone).
from torq_gen_config import workflow_files
from torq_gen_config.pipeline import steps
import torq_gen_config.pipeline.steps.sweep
from torq_gen_config.pipeline.sweep import model_files, summary_rows, sweep_file, sweep_rows
from torq_gen_config.core.layout import SWEEP_HTML, SWEEP_JSON, html_report_file, report_file

SWEEP_OUT = config.get("output_dir") or "sweep"
SWEEP_ROWS = sweep_rows(config["models"], config, SWEEP_OUT)


rule sweep_summary:
    input:
        reports=model_files(SWEEP_ROWS, SWEEP_OUT, report_file),
        html=model_files(SWEEP_ROWS, SWEEP_OUT, html_report_file),
    output:
        summary=sweep_file(SWEEP_OUT, SWEEP_JSON),
        html=sweep_file(SWEEP_OUT, SWEEP_HTML),
    params:
        rows=summary_rows(SWEEP_ROWS, SWEEP_OUT, report_file),
        sheet=config["models"],
    log:
        sweep_file(SWEEP_OUT, "logs", "sweep_summary.log"),
    localrule: True
    run:
        steps.sweep.sweep_summary(input, output, params, log)


# each model's rules but its `all` (a default target of its own)
for _row in SWEEP_ROWS:
    if _row.failure:
        continue
    _module = _row.module
    _prefix = _row.prefix

    module:
        name: _module
        snakefile: str(workflow_files.snakefile())
        config: _row.config

    use rule * from _module exclude all as _prefix*
