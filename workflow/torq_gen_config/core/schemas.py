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

SCHEMA_DIR = workflow_files.schema_dir()  # in a checkout or an installed wheel

# (pattern of the path relative to the output directory, schema file); first match wins,
# so the more specific pattern comes first. ``*`` matches within one path component.
OUTPUT_SCHEMAS: tuple[tuple[str, str], ...] = (
    # discover / edit / run, in <output dir>
    ("torq_gen_config_*_compiler.json", "compiler.schema.yaml"),
    ("torq_gen_config_*.json", "report_output.schema.yaml"),  # with report.schema.yaml by $ref
    (".torq-gen-config-*.lock.json", "lock.schema.yaml"),
    ("work/*/prepare.json", "prepare.schema.yaml"),
    ("work/*/locations.json", "locations.schema.yaml"),
    ("work/*/user_choices.json", "user_choices.schema.yaml"),
    ("work/*/layers/manifest.json", "manifest.schema.yaml"),
    ("work/*/layers/*/import.json", "import.schema.yaml"),
    ("work/*/layers/*/quantize.json", "layer_quantize.schema.yaml"),
    ("work/*/layers/*/*/result.json", "layer_result.schema.yaml"),
    ("work/*/batches/*/*/batch.json", "compile_batch.schema.yaml"),
    ("work/*/units/*/prepared.json", "unit_prepared.schema.yaml"),  # before the executors' records
    ("work/*/units/*/*.json", "unit_tests.schema.yaml"),
    ("work/*/report_summary.json", "report_summary.schema.yaml"),
    ("work/*/keep_work.json", "keep_work.schema.yaml"),
    ("work/*/quant/calibration.json", "calibration.schema.yaml"),
    ("work/*/quant/quantize.json", "quantize.schema.yaml"),
    ("work/*/quant/manifest.json", "quantized_manifest.schema.yaml"),
    ("work/*/full/assignment.json", "full_assignment.schema.yaml"),
    ("work/*/full/plan.json", "full_plan.schema.yaml"),
    ("work/*/full/result.json", "full_result.schema.yaml"),
    ("work/*/full/partitions/*/compiled.json", "full_compiled.schema.yaml"),
    ("work/*/full/partitions/*/import.json", "import.schema.yaml"),  # a partition of a compile batch
    ("work/*/full/batches/*/*/batch.json", "compile_batch.schema.yaml"),
    ("work/*/full/partitions/*/executor_map.json", "compiler.schema.yaml"),
    ("work/*/full/partitions/*/placement.json", "full_module_placement.schema.yaml"),  # module mode
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
    import yaml

    with open(schema_path(name), encoding="utf-8") as f:
        return yaml.safe_load(f)


def validator(name: str):
    """A draft 2020-12 validator (``jsonschema.Draft202012Validator``) for schema file
    ``name``; a ``$ref`` to another schema file of :data:`SCHEMA_DIR` (by file name) is
    resolved from that directory.

    Raises:
        FileNotFoundError: no such schema file (also one that a ``$ref`` names).
    """
    import jsonschema
    from referencing import Registry, Resource

    def retrieve(uri: str) -> Resource:
        return Resource.from_contents(load_schema(uri))

    return jsonschema.Draft202012Validator(load_schema(name), registry=Registry(retrieve=retrieve))
