"""Steps of rules/full_model.smk (``torq-gen-config run``, or ``snakemake full_model``):
the whole model as a chain of partitions with the report's assignment, compiled and
run in order, compared with the whole model's reference. The job bodies are in
:mod:`torq_gen_config.full_model_jobs`; docs/full_model_run.md describes the files."""

from __future__ import annotations

from .. import full_model_jobs


def full_assignment(input, output, params, log) -> None:
    """Rule ``full_assignment``: assignment.json from the compiler JSON (input) and the
    report next to it (param ``report``, a path; param ``digest``: what it assigns)."""
    full_model_jobs.assignment_job(report=params.report, compiler=input.compiler, assignment=output.assignment,
                                   log=log[0])


def plan_full_model(input, output, params, log) -> None:
    """Checkpoint ``plan_full_model``: plan.json and the partitions' side files.
    Params: ``executors``, ``compiler_options``, ``runtime_options``; untracked ``timeout_s``."""
    full_model_jobs.plan_job(assignment=input.assignment, prepared=input.model, manifest=input.manifest,
                             locations=input.locations, executors=params.executors, plan=output.plan,
                             compiler_options=params.compiler_options, runtime_options=params.runtime_options,
                             full_mlir=input.mlir, timeout_s=params.timeout_s.value, log=log[0])


def compile_partition(input, output, params, log, wildcards) -> None:
    """Rule ``compile_partition``: one partition (wildcard ``pid``) compiled for its
    executor (param ``executor``); untracked ``timeout_s``, ``log_file``, ``verbose``."""
    full_model_jobs.compile_partition_job(pid=wildcards.pid, model=input.model, executor=params.executor,
                                          compiled=output.compiled, timeout_s=params.timeout_s.value, log=log[0],
                                          log_file=params.log_file.value, verbose=params.verbose.value)


def full_reference(input, output, params, log) -> None:
    """Rule ``full_reference``: the whole model's reference outputs on the model's input
    values (or on ``run --input-data``). Params: ``inputs``, ``engine``, ``quantized``;
    untracked ``timeout_s``."""
    full_model_jobs.full_reference_job(prepared=input.model, reference=output.reference,
                                       input_settings=params.inputs, model_inputs=input.model_inputs,
                                       run_data=input.run_data[0] if input.run_data else None,
                                       quantized=params.quantized, engine=params.engine,
                                       timeout_s=params.timeout_s.value, log=log[0])


def run_full_model(input, output, params, log) -> None:
    """Rule ``run_full_model``: result.json of the whole-model run; untracked
    ``tolerance``, ``timeout_s``, ``log_file``, ``verbose``."""
    full_model_jobs.run_full_model_job(plan=input.plan, reference=input.reference, result=output.result,
                                       tolerance=params.tolerance.value, timeout_s=params.timeout_s.value,
                                       log=log[0], log_file=params.log_file.value, verbose=params.verbose.value)
