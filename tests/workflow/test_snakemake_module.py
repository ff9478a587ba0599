"""torq-gen-config as a Snakemake module of another workflow (README, "Use as a Snakemake module").

An outer workflow in a scratch directory (not the checkout): the README's example, which declares
``module torq_gen_config: snakefile: ...; config: config["torq_gen_config"]`` with only
``model:`` in that config, takes every rule with ``use rule * from torq_gen_config``, adds a
rule of its own that reads the module's compiler JSON, and runs on a small real ONNX model
with the real tools. The report and compiler JSON must appear and validate against their
schemas. ``tests/workflow/test_wheel_install.py`` runs the same outer workflow on the copy of
the workflow installed from the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_output_schemas import small_cnn, validate_tree

pytestmark = pytest.mark.slow

README = REPO / "README.md"


def outer_snakefile() -> str:
    """The outer workflow: the README's example (the python block of "Use as a Snakemake
    module"), verbatim, so the README's form is the tested one."""
    text = README.read_text()
    section = text[text.index("### Use as a Snakemake module"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]


EXECUTORS = ["llvm-cpu", "vmvx", "ort"]


def write_outer_workflow(where: Path, model: Path) -> None:
    """The outer workflow (:func:`outer_snakefile`) and its config.yaml, whose
    ``torq_gen_config`` section has only ``model``, into ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "Snakefile").write_text(outer_snakefile())
    (where / "config.yaml").write_text(f"torq_gen_config:\n  model: {model}\n")


def check_module_run(where: Path, model_name: str, layers: int) -> dict:
    """The outer workflow's run left the module's report and compiler JSON (valid, every
    layer with a verdict per default executor) and its own rule's output; returns the report."""
    out = where / "results" / model_name
    report = json.loads((out / f"torq_gen_config_{model_name}.json").read_text())
    compiler = json.loads((out / f"torq_gen_config_{model_name}_compiler.json").read_text())
    seen = validate_tree(out)
    assert {"report_output.schema.yaml", "compiler.schema.yaml", "layer_result.schema.yaml"} <= set(seen), seen
    assert len(report["ops"]) == layers
    for lid, op in report["ops"].items():
        assert list(op["executors"]) == EXECUTORS, lid  # the defaults of config/config.yaml
        assert op["recommended_executor"] in EXECUTORS, (lid, op)
    assert len(compiler["op_assignments"]) == layers
    assert (where / "assignments.txt").read_text() == f"{layers}\n"
    return report


def snakemake_env() -> dict:
    """This environment, with the checkout's package first on the path (as the tests use it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "workflow"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_use_rule_star_from_the_module_with_only_a_model(tmp_path):
    where = tmp_path / "outer"
    model = small_cnn(tmp_path / "cnn.onnx")
    write_outer_workflow(where, model)
    # the workflow profile settings of torq-gen-config (jobs as threads: ~8 s here instead of
    # ~65 s with one Python process per job), as the README says
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--workflow-profile", str(REPO / "profiles" / "default")]
    r = subprocess.run(cmd, cwd=where, capture_output=True, text=True, timeout=600, env=snakemake_env())
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    report = check_module_run(where, "cnn", layers=3)
    assert report["provenance"]["options"]["timeout_s"] == 300  # a default the module did not get

    # a rerun does nothing; a dry run lists no job
    r = subprocess.run([*cmd, "-n"], cwd=where, capture_output=True, text=True, timeout=600, env=snakemake_env())
    assert r.returncode == 0 and "Nothing to be done" in (r.stdout + r.stderr), (r.stdout + r.stderr)[-3000:]
