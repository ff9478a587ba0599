"""Old import path of the full-model job bodies (re-export shim): they are in
:mod:`torq_gen_config.steps.full_model`, next to the rule entry points of
rules/full_model.smk."""

from .steps.full_model import (  # noqa: F401
    _emit,
    _plan_job,
    assignment_job,
    compile_partition_job,
    full_reference_job,
    plan_job,
    read_selection,
    run_full_model_job,
    selection_digest_of,
)
