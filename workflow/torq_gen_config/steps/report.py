"""Job of rules/report.smk: the report JSON and the compiler JSON from the layer
results, with the recommendation per layer and the run's provenance."""

from __future__ import annotations

import os

from ..job_support import _log, records_failure
from ..layout import clear_outdated
from ..report.assemble import (  # noqa: F401 (re-exported: their old home)
    _dist_version,
    _model_digest,
    _module_version,
    assemble_report,
    build_provenance,
    precision_section,
)
from ..report.publish import publish_report
from ..report.summary import status_counts_line


@records_failure
def aggregate_job(*, report: str, compiler: str, log: str | None = None, **kwargs) -> dict:
    """Rule ``aggregate_report``: the discovery report
    (:func:`~torq_gen_config.report.assemble.assemble_report`, whose keyword arguments
    ``kwargs`` are), published with its compiler JSON to ``report`` / ``compiler``."""
    rep = assemble_report(**kwargs)
    publish_report(report, compiler, rep, rederive=False, force=True)
    _log(log, f"report written: {report}")
    return rep


def aggregate_report(input, output, params, log) -> dict:
    """Rule ``aggregate_report``: the report JSON and the compiler JSON
    (:func:`aggregate_job`), then the report is no longer out of date; prints one line.

    Inputs: ``manifest``, ``info``, ``locations``, ``results``, ``quant`` (with quantize:
    the mapped manifest and the quantization info), ``user_choices`` (the user's
    overrides from ``edit``, when there are some). The layers' results are beside the
    manifest, the report is in the output directory. Params: ``model_name``,
    ``executors``, ``unavailable``, ``tolerance``, ``options``, ``skip_ops``, ``dedup_layers``,
    ``recommend_by_timing``, ``outdated``. Returns the report (dict).
    """
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
                        unavailable=params.unavailable, log=log[0])
    clear_outdated(params.outdated)
    summary = rep["discovery_report"]["summary"]
    print(f"report: {output.report} ({len(rep['ops'])} layers, {summary['distinct_layers_tested']} tested; "
          f"{status_counts_line(summary)})")
    return rep
