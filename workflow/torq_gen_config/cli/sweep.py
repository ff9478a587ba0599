"""``torq-gen-config sweep --models models.tsv --output-dir zoo``: every model of a model
sheet discovered in ONE workflow (:mod:`torq_gen_config.pipeline.sweep`, rules/sweep.smk),
each in ``zoo/<name>/`` as a single discovery (``view``, ``edit``, ``run``, ``report`` work
on it), plus ``zoo/sweep.json`` and ``zoo/sweep.html``. A model that cannot run is a row
with its reason, never a stopped sweep; the exit status is then 1."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import workflow_files
from ..config import load_config_file
from ..core import run_lock
from ..core.errors import ConfigError
from ..core.fileio import read_json
from ..core.layout import SWEEP_HTML, SWEEP_JSON, SWEEP_LOCK
from ..pipeline.sweep import read_model_sheet
from ..pipeline.workflow_api import run_workflow, run_workflow_with_snakemake_args
from .options import add_execution_options, resolve_execution_options


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``sweep`` subcommand."""
    p = sub.add_parser(
        "sweep",
        help="discover every model of a model sheet in one workflow; a summary across models",
        description="Discover every model of a model sheet (tab-separated: name, model, and optionally "
                    "input_shapes, input_data, config: a YAML config file for that model) in ONE Snakemake "
                    "workflow: jobs of all models interleave under -j or a cluster profile. Each model goes to "
                    "OUTPUT_DIR/<name>/ as its own discovery; OUTPUT_DIR/sweep.json and sweep.html sum them up "
                    "(models x executors, op type x executor). A model added to the sheet runs alone on the "
                    "next sweep; a removed one leaves the summary and nothing is deleted. Exit status 1 when a "
                    "model could not run (its row says why), else 0. The Snakemake form: snakemake --cores N "
                    "--config models=models.tsv output_dir=zoo.",
        epilog="examples:\n"
               "  printf 'name\\tmodel\\nsq\\tlight_squeezenet.onnx\\n' > models.tsv\n"
               "  torq-gen-config sweep --models models.tsv --output-dir zoo -j 2\n"
               "  torq-gen-config compare zoo_before zoo   # what changed between two sweeps",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", required=True, metavar="SHEET.tsv", help="the model sheet (docs/sweep.md)")
    p.add_argument("--output-dir", required=True, help="where each model's discovery and the summary go")
    p.add_argument("--config-file", help="YAML settings for every model (executors, tolerance, ...); a row's "
                                         "config column adds its own on top")
    add_execution_options(p)
    p.add_argument("-n", "--dry-run", action="store_true", help="only show which jobs would run")
    p.add_argument("-q", "--quiet", action="store_true", help="show progress lines only, not each job")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the sweep; print each model's row and the summary's paths. Returns 1 when a
    model could not run, else 0 (bad input raises a TorqGenConfigError: status 2)."""
    resolve_execution_options(args)
    sheet = Path(args.models).expanduser().resolve()
    read_model_sheet(sheet)  # a bad sheet is one line before any work
    out = Path(args.output_dir).expanduser().resolve()
    config: dict = {"models": str(sheet), "output_dir": "."}
    if args.config_file:
        given = load_config_file(workflow_files.resolve_preset(args.config_file))
        if "models" in given or "model" in given:
            raise ConfigError(f"--config-file {args.config_file}: model and models come from the sheet")
        config = {**given, **config}
    lock = (SWEEP_LOCK, f"{out} for a model sweep", "torq-gen-config sweep")
    if args.profile:  # Snakemake's command-line layer reads the profile (its plugin settings too)
        out.mkdir(parents=True, exist_ok=True)
        run_lock.acquire(out / lock[0], what=lock[1], tool=lock[2])  # another sweep: one line, exit 2
        try:
            run_workflow_with_snakemake_args(config=config, workdir=out, cores=args.cores, quiet=args.quiet,
                                             profile=args.profile, extra_args=["-n"] if args.dry_run else [])
        finally:
            run_lock.release(out / lock[0])
    else:
        run_workflow(config=config, workdir=out, cores=args.cores, dryrun=args.dry_run, quiet=args.quiet, lock=lock)
    if args.dry_run:
        return 0
    summary = read_json(out / SWEEP_JSON, "sweep summary")
    for m in summary["models"]:
        if m["status"] == "failed":
            print(f"{m['name']}: could not run: {m['reason']}")
            continue
        counts = ", ".join(f"{ex} {c.get('success', 0)}/{sum(c.values())}" for ex, c in m["statuses"].items())
        print(f"{m['name']}: {m['layers']} layers; success of tested: {counts}; critical: {m['critical_layers']}")
    print(f"Sweep: {out / SWEEP_JSON} ({summary['totals']['models']} models, {summary['totals']['layers']} layers)")
    print(f"Page:  {out / SWEEP_HTML}")
    return 1 if summary["totals"]["failed"] else 0
