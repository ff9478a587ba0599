"""Job of rules/report.smk: the report JSON and the compiler JSON from the layer
results, with the recommendation per layer and the run's provenance."""

from __future__ import annotations

import os
import sys

from ...backends.parameters import resolve_from
from ...core.fileio import read_json
from ...core.job_support import records_failure
from ...core.keep_work import finish
from ...core.layout import clear_outdated
from ...core.logs import append_record
from ...report.assemble import assemble_report
from ...core.errors import EXIT_NOTHING_ASSIGNED
from ...report.publish import compiler_json_error, publish_report, read_report_summary
from ...report.summary import status_counts_line
from ..workflow_api import called_from_api
from . import step


@records_failure
def aggregate_job(*, report: str, compiler: str, log: str | None = None, work_dir: str | None = None,
                  keep_work: str = "minimal", **kwargs) -> dict:
    """Rule ``aggregate_report``: the discovery report
    (:func:`~torq_gen_config.report.assemble.assemble_report`, whose keyword arguments
    ``kwargs`` are), published with its compiler JSON to ``report`` / ``compiler``.
    Every test is done by then: with ``keep_work`` ``minimal`` the intermediates the
    finished run no longer needs are removed from ``work_dir`` first; the report records
    the work directory's size (``work_dir``, :func:`~torq_gen_config.core.keep_work.finish`)."""
    rep = assemble_report(**kwargs)
    if work_dir:
        rep["work_dir"] = finish_work_dir(work_dir, keep_work, (kwargs.get("options") or {}).get("model"),
                                          output_dir=kwargs.get("output_dir"))
    publish_report(report, compiler, rep, rederive=False, force=True)
    append_record(log, f"report written: {report}")
    return rep


def finish_work_dir(work_dir: str, keep_work: str, model: str | None, *, output_dir: str | None = None) -> dict:
    """The report's ``work_dir`` section after the clean-up of ``keep_work``
    (:func:`~torq_gen_config.core.keep_work.finish`; what it removed: one line on stderr)."""
    return finish(work_dir, keep_work, model, output_dir=output_dir,
                  echo=lambda line: print(line, file=sys.stderr, flush=True))


@step
def aggregate_report(input, output, params, log) -> dict:
    """Rule ``aggregate_report``: the report JSON and the compiler JSON
    (:func:`aggregate_job`), then the report is no longer out of date; prints one line.

    Inputs: ``manifest``, ``info``, ``locations``, ``results``, ``quant`` (with quantize:
    the mapped manifest and the quantization info), ``user_choices`` (the user's
    overrides from ``edit``, when there are some). The layers' results are beside the
    manifest, the report is in the output directory. Params: ``model_name``,
    ``executors``, ``unavailable``, ``tolerance``, ``options``, ``skip_ops``, ``dedup_layers``,
    ``recommend_by_timing``, ``outdated``, ``keep_work`` (``minimal``: the work
    directory's intermediates removed, :func:`aggregate_job`), ``parameters`` (the
    weights setting, resolved here with ``info``: the report's ``provenance.parameters``).
    Returns the report (dict).
    """
    resolved = resolve_from(params.parameters, read_json(input.info, "preparation info"), params.executors)
    rep = aggregate_job(model_name=params.model_name, manifest=input.manifest, prepare_info=input.info,
                        locations=input.locations, results_root=os.path.dirname(input.manifest),
                        executors=params.executors, tolerance=params.tolerance, options=params.options,
                        report=output.report, compiler=output.compiler,
                        output_dir=os.path.dirname(output.report) or os.curdir, skip_ops=params.skip_ops,
                        dedup_layers=params.dedup_layers,
                        user_choices=input.user_choices[0] if input.user_choices else None,
                        recommend_by_timing=params.recommend_by_timing,
                        quantized_manifest=input.quant[0] if input.quant else None,
                        quantize_info=input.quant[1] if input.quant else None,
                        unavailable=params.unavailable, log=log[0],
                        work_dir=os.path.dirname(os.path.dirname(input.manifest)), keep_work=params.keep_work,
                        parameters=resolved)
    clear_outdated(params.outdated)
    summary = rep["discovery_report"]["summary"]
    print(f"report: {output.report} ({len(rep['ops'])} layers, {summary['distinct_layers_tested']} tested; "
          f"{status_counts_line(summary)})")
    return rep


def exit_if_nothing_assigned(report: str) -> None:
    """The Snakefile's ``onsuccess``: under Snakemake's own command, a run whose compiler
    JSON assigns no op although the model has layers ends with that reason on stderr and
    exit status :data:`~torq_gen_config.core.errors.EXIT_NOTHING_ASSIGNED` (the command line,
    which runs the workflow in-process, says it itself: :func:`torq_gen_config.cli.discover.discover`)."""
    if called_from_api() or not os.path.isfile(report):
        return
    try:
        reason = compiler_json_error(read_report_summary(report)[1])
    except Exception:  # noqa: BLE001 - an unreadable report is reported where it is read
        return
    if reason:
        print(f"torq-gen-config: error: {reason}", file=sys.stderr)
        sys.exit(EXIT_NOTHING_ASSIGNED)
