"""Old import path of the job entry points (re-export shim).

The jobs moved: rules/<topic>.smk calls torq_gen_config.steps.<topic>; the code shared
by every job is in :mod:`torq_gen_config.job_support`. Names are kept here for the
modules, tests and benchmarks that import them from ``torq_gen_config.jobs``.
"""

from __future__ import annotations

from .backends import executor_with_tool_options  # noqa: F401 (re-exported)
from .job_support import JOB_FAILURES, _log, append_to_shared_log, in_worker, records_failure  # noqa: F401
from .steps.layer_tests import (  # noqa: F401
    _test_layer_job,
    test_layer_job,
)
from .steps.markers import (  # noqa: F401
    SKIPPED_MARKER,
    TIMED_OUT_SUFFIX,
    record_timeout,
    was_skipped,
)
from .steps.prepare import (  # noqa: F401
    _only_inputs,
    _prepare_model_job,
    fixed_dims_lines,
    import_full_model_job,
    precision_summary,
    prepare_model_job,
    shape_summary,
)
from .steps.quantize import (  # noqa: F401
    _calibrate_job,
    _quantize_full_model_job,
    _quantize_layer_job,
    _quantize_settings,
    calibrate_job,
    map_quantized_layers_job,
    quantize_failure,
    quantize_full_model_job,
    quantize_layer_job,
    quantized_input_ranges,
)
from .steps.report import (  # noqa: F401
    _dist_version,
    _model_digest,
    _module_version,
    aggregate_job,
    build_provenance,
    precision_section,
)
from .steps.split import (  # noqa: F401
    _split_layers_job,
    import_layer_job,
    reference_job,
    split_layers_job,
)
