"""Old import path of the job entry points (re-export shim).

The jobs moved: rules/<topic>.smk calls torq_gen_config.steps.<topic>; the code shared
by every job is in :mod:`torq_gen_config.job_support`. Names are kept here for the
modules, tests and benchmarks that import them from ``torq_gen_config.jobs``.

The names of the steps package are resolved on first use (PEP 562): ``full_model_jobs``
imports this module, and ``steps.full_model`` imports ``full_model_jobs``, so importing
``steps`` from here would close an import cycle.
"""

from __future__ import annotations

import importlib

from .backends import executor_with_tool_options  # noqa: F401 (re-exported)
from .job_support import JOB_FAILURES, _log, append_to_shared_log, in_worker, records_failure  # noqa: F401

#: name -> module of torq_gen_config.steps that defines it
_MOVED = {
    **dict.fromkeys(["prepare_model_job", "_prepare_model_job", "_only_inputs", "shape_summary", "fixed_dims_lines",
                     "precision_summary", "import_full_model_job"], "prepare"),
    **dict.fromkeys(["split_layers_job", "_split_layers_job", "reference_job", "import_layer_job"], "split"),
    **dict.fromkeys(["test_layer_job", "_test_layer_job"], "layer_tests"),
    **dict.fromkeys(["SKIPPED_MARKER", "_RERUN_MARKER", "was_skipped", "mark_for_rerun", "TIMED_OUT_SUFFIX",
                     "record_timeout", "rerun_after_timeout", "_newer_marker"], "markers"),
    **dict.fromkeys(["aggregate_job", "precision_section", "build_provenance", "_model_digest", "_module_version", "_dist_version"],
                    "report"),
    **dict.fromkeys(["calibrate_job", "_calibrate_job", "_quantize_settings", "quantize_full_model_job",
                     "_quantize_full_model_job", "quantize_layer_job", "_quantize_layer_job", "quantize_failure",
                     "map_quantized_layers_job", "quantized_input_ranges"], "quantize"),
}


def __getattr__(name: str):
    if name in _MOVED:
        return getattr(importlib.import_module(f"{__package__}.steps.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_MOVED})
