"""Where the JSON schemas of the tool's outputs are, and which output each one describes.

Every JSON file that ``discover``, ``run``, ``edit``, ``conformance`` and ``ck-profile`` write has a schema
(JSON Schema draft 2020-12, YAML) in ``workflow/schemas/`` (shipped in the wheel: :mod:`workflow_files`); the tests validate every JSON
file of real runs against them (``tests/workflow/test_output_schemas.py``), so a renamed or missing
field, or a new output without a schema, fails a test. Only paths and the file -> schema
map live here: no validation at run time (the report's own check is in ``report.build``).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path, PurePosixPath

from .. import workflow_files
from .layout import (
    ASSIGNMENT_FILE,
    BATCHES_DIR,
    CALIBRATION_FILE,
    COMPILED_FILE,
    FULL_DIR,
    LAYER_INPUTS_FILE,
    LAYER_REFERENCE_FILE,
    LAYERS_DIR,
    LOCATIONS_FILE,
    MANIFEST_FILE,
    MODULE_SIDE_FILE,
    PARTITIONS_DIR,
    PLAN_FILE,
    PREPARE_INFO_FILE,
    QUANTIZE_INFO_FILE,
    QUANT_DIR,
    REPORT_SUMMARY_FILE,
    RESULT_FILE,
    UNITS_DIR,
    compiler_file,
    full_run_file,
    lock_file,
    report_file,
    user_choices_file,
    work_dir,
)
from .lazy import jsonschema, referencing, yaml

SCHEMA_DIR = workflow_files.schema_dir()  # in a checkout or an installed wheel

_W = work_dir("*")  # work/<any name>
_PARTS = full_run_file("*", PARTITIONS_DIR)
# (pattern of the path relative to the output directory, schema file); first match wins,
# so the more specific pattern comes first. ``*`` matches within one path component.
# The discover/run paths are made from core/layout's names (the one place of the layout).
OUTPUT_SCHEMAS: tuple[tuple[str, str], ...] = (
    # discover / edit / run, in <output dir>
    (compiler_file("*"), "compiler.schema.yaml"),
    (report_file("*"), "report_output.schema.yaml"),  # with report.schema.yaml by $ref
    (lock_file("*") + ".json", "lock.schema.yaml"),
    (f"{_W}/{PREPARE_INFO_FILE}", "prepare.schema.yaml"),
    (f"{_W}/{LOCATIONS_FILE}", "locations.schema.yaml"),
    (user_choices_file("*"), "user_choices.schema.yaml"),
    (f"{_W}/{LAYERS_DIR}/{MANIFEST_FILE}", "manifest.schema.yaml"),
    (f"{_W}/{LAYERS_DIR}/*/import.json", "import.schema.yaml"),
    (f"{_W}/{LAYERS_DIR}/*/{LAYER_INPUTS_FILE}", "layer_inputs.schema.yaml"),
    (f"{_W}/{LAYERS_DIR}/*/{LAYER_REFERENCE_FILE}", "layer_reference.schema.yaml"),
    (f"{_W}/{LAYERS_DIR}/*/quantize.json", "layer_quantize.schema.yaml"),
    (f"{_W}/{LAYERS_DIR}/*/*/{RESULT_FILE}", "layer_result.schema.yaml"),
    (f"{_W}/{BATCHES_DIR}/*/*/batch.json", "compile_batch.schema.yaml"),
    (f"{_W}/{UNITS_DIR}/*/prepared.json", "unit_prepared.schema.yaml"),  # before the executors' records
    (f"{_W}/{UNITS_DIR}/*/*.keys.json", "unit_keys.schema.yaml"),
    (f"{_W}/{UNITS_DIR}/*/*.json", "unit_tests.schema.yaml"),
    (f"{_W}/{REPORT_SUMMARY_FILE}", "report_summary.schema.yaml"),
    (f"{_W}/keep_work.json", "keep_work.schema.yaml"),
    (f"{_W}/{QUANT_DIR}/{CALIBRATION_FILE}", "calibration.schema.yaml"),
    (f"{_W}/{QUANT_DIR}/{QUANTIZE_INFO_FILE}", "quantize.schema.yaml"),
    (f"{_W}/{QUANT_DIR}/{MANIFEST_FILE}", "quantized_manifest.schema.yaml"),
    (full_run_file("*", ASSIGNMENT_FILE), "full_assignment.schema.yaml"),
    (full_run_file("*", PLAN_FILE), "full_plan.schema.yaml"),
    (full_run_file("*", RESULT_FILE), "full_result.schema.yaml"),
    (f"{_PARTS}/*/{COMPILED_FILE}", "full_compiled.schema.yaml"),
    (f"{_PARTS}/*/import.json", "import.schema.yaml"),  # a partition of a compile batch
    (f"{_W}/{FULL_DIR}/{BATCHES_DIR}/*/*/batch.json", "compile_batch.schema.yaml"),
    (f"{_PARTS}/*/executor_map.json", "compiler.schema.yaml"),
    (f"{_PARTS}/*/{MODULE_SIDE_FILE}", "full_module_placement.schema.yaml"),  # module mode
    # a model sweep, in its output directory (each <name>/ is a discover output directory)
    ("sweep.json", "sweep.schema.yaml"),
    # conformance, in its output directory (each tests/<test>/out/ is a discover output directory)
    ("conformance.json", "conformance.schema.yaml"),
    ("conformance_verdicts.json", "conformance_verdicts.schema.yaml"),
    ("tests/*/conformance_result.json", "conformance_test.schema.yaml"),
    # ck-profile, in its output directory (results/ck/<configs>/) and the files it converts
    ("manifest.json", "ck_manifest.schema.yaml"),
    ("configs/*.json", "ck_config.schema.yaml"),
    ("runs/*/result.json", "ck_run_result.schema.yaml"),
    ("profiler_results.json", "ck_results.schema.yaml"),
    ("ck_profiler_configs.json", "ck_configs.schema.yaml"),
)


def schema_path(name: str) -> Path:
    """The path of schema file ``name`` (e.g. ``"layer_result.schema.yaml"``); it may not exist."""
    return SCHEMA_DIR / name


def schema_for(relpath: str | PurePosixPath) -> str | None:
    """The schema file name for an output at ``relpath`` (relative to its output
    directory, ``/``-separated), or None when no pattern of :data:`OUTPUT_SCHEMAS` matches."""
    parts = PurePosixPath(relpath).parts
    for pattern, name in OUTPUT_SCHEMAS:
        pparts = PurePosixPath(pattern).parts
        if len(pparts) == len(parts) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pparts)):
            return name
    return None


def load_schema(name: str) -> dict:
    """Schema file ``name`` as a dict.

    Raises:
        FileNotFoundError: no such schema file.
    """
    with open(schema_path(name), encoding="utf-8") as f:
        return yaml.safe_load(f)


def validator(name: str):
    """A draft 2020-12 validator (``jsonschema.Draft202012Validator``) for schema file
    ``name``; a ``$ref`` to another schema file of :data:`SCHEMA_DIR` (by file name) is
    resolved from that directory.

    Raises:
        FileNotFoundError: no such schema file (also one that a ``$ref`` names).
    """
    def retrieve(uri: str) -> referencing.Resource:
        return referencing.Resource.from_contents(load_schema(uri))

    return jsonschema.Draft202012Validator(load_schema(name), registry=referencing.Registry(retrieve=retrieve))
