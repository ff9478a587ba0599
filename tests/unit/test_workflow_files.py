"""torq_gen_config.workflow_files: where the Snakefile, rules, config, schemas and profiles are
(the checkout's when the package runs from one, else the copy shipped in the wheel), and the
command line finding the workflow's presets (config/gpu.yaml, profiles/slurm) from any directory."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from conftest import REPO

from torq_gen_config import config
from torq_gen_config import workflow_files
from torq_gen_config.core import schemas
from torq_gen_config.pipeline import workflow_api
from torq_gen_config.core.errors import ConfigError


def test_from_a_checkout_the_checkouts_files():
    assert workflow_files.from_checkout()
    assert workflow_files.root() == REPO
    assert workflow_files.snakefile() == REPO / "Snakefile"
    assert workflow_files.schema_dir() == REPO / "workflow" / "schemas"
    assert workflow_files.missing() is None
    # the users of the paths
    assert config.DEFAULT_CONFIG_PATH == REPO / "config" / "config.yaml"
    assert config.SCHEMA_PATH == REPO / "workflow" / "schemas" / "config.schema.yaml"
    assert schemas.SCHEMA_DIR == REPO / "workflow" / "schemas"
    assert workflow_api.SNAKEFILE == REPO / "Snakefile"
    assert workflow_api.PROFILE == REPO / "profiles" / "default" / "config.yaml"


def test_every_shipped_entry_exists_and_the_sdist_carries_it():
    """What setup.py copies into the wheel exists, and MANIFEST.in puts each into the sdist
    (a wheel built from the sdist would otherwise miss it)."""
    for name in workflow_files.SHIPPED:
        assert (REPO / name).exists(), name
    manifest = (REPO / "MANIFEST.in").read_text()
    for name in workflow_files.SHIPPED:
        kind = "graft" if (REPO / name).is_dir() else "include"
        assert re.search(rf"^{kind} {re.escape(name)}$", manifest, re.M), (kind, name)


def _installed(monkeypatch, tmp_path, *, with_copy: bool) -> Path:
    """Make the module believe it runs from site-packages/torq_gen_config (not a checkout)."""
    pkg = tmp_path / "site-packages" / "torq_gen_config"
    pkg.mkdir(parents=True)
    monkeypatch.setattr(workflow_files, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(workflow_files, "CHECKOUT_ROOT", pkg.parents[1])
    monkeypatch.setattr(workflow_files, "INSTALLED_ROOT", pkg / workflow_files.INSTALLED_DIR)
    if with_copy:
        for name in workflow_files.SHIPPED:
            p = pkg / workflow_files.INSTALLED_DIR / name
            if (REPO / name).is_dir():
                p.mkdir(parents=True)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text("")
    return pkg / workflow_files.INSTALLED_DIR


def test_installed_uses_the_copy_in_the_package(monkeypatch, tmp_path):
    copy = _installed(monkeypatch, tmp_path, with_copy=True)
    assert not workflow_files.from_checkout()
    assert workflow_files.root() == copy
    assert workflow_files.snakefile() == copy / "Snakefile"
    assert workflow_files.default_profile() == copy / "profiles" / "default" / "config.yaml"
    assert workflow_files.missing() is None


def test_installed_without_the_copy_says_what_is_missing(monkeypatch, tmp_path):
    copy = _installed(monkeypatch, tmp_path, with_copy=False)
    reason = workflow_files.missing()
    assert reason.startswith("workflow file(s) Snakefile, rules, config, profiles, workflow/schemas missing in ")
    assert str(copy) in reason and "reinstall" in reason
    # the command line turns it into its one-line error before anything runs
    from torq_gen_config.cli.options import build_config

    with pytest.raises(ConfigError, match="missing in"):
        build_config(argparse.Namespace(model=str(tmp_path / "m.onnx")))
    with pytest.raises(workflow_api.WorkflowFailed, match="missing in"):
        workflow_api.run_workflow(config={"model": str(tmp_path / "m.onnx")}, workdir=tmp_path / "out")


def test_a_checkout_without_its_snakefile_is_not_a_checkout(monkeypatch, tmp_path):
    """A package directory named workflow/torq_gen_config with no Snakefile above it (an
    unpacked wheel in a folder called workflow, say) uses the copy in the package."""
    pkg = tmp_path / "workflow" / "torq_gen_config"
    pkg.mkdir(parents=True)
    monkeypatch.setattr(workflow_files, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(workflow_files, "CHECKOUT_ROOT", tmp_path)
    monkeypatch.setattr(workflow_files, "INSTALLED_ROOT", pkg / workflow_files.INSTALLED_DIR)
    assert not workflow_files.from_checkout()
    (tmp_path / "Snakefile").write_text("")
    assert workflow_files.from_checkout() and workflow_files.root() == tmp_path


def test_resolve_preset(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    # from another directory: the workflow's own presets
    assert workflow_files.resolve_preset("config/gpu.yaml") == REPO / "config" / "gpu.yaml"
    assert workflow_files.resolve_preset("profiles/slurm") == REPO / "profiles" / "slurm"
    # a file of that name in the current directory wins
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "gpu.yaml").write_text("timeout_s: 5\n")
    assert workflow_files.resolve_preset("config/gpu.yaml") == Path("config/gpu.yaml")
    # neither: as given (the caller says it is not found); absolute paths as given
    assert workflow_files.resolve_preset("config/none.yaml") == Path("config/none.yaml")
    assert workflow_files.resolve_preset(tmp_path / "x.yaml") == tmp_path / "x.yaml"


def test_discover_options_find_the_presets_from_another_directory(monkeypatch, tmp_path, squeezenet_path):
    """--config-file config/torq.yaml and --profile profiles/slurm, given in a directory that
    is not the checkout (as the README spells them), name the workflow's files."""
    from torq_gen_config.cli import options

    monkeypatch.chdir(tmp_path)
    cfg = options.build_config(argparse.Namespace(model=str(squeezenet_path), config_file="config/torq.yaml"))
    assert [e["backend"] for e in cfg["executors"]] == ["torq"] * len(cfg["executors"])
    seen = []
    monkeypatch.setattr("torq_gen_config.pipeline.cluster.check_profile", lambda p: seen.append(p))
    args = argparse.Namespace(cores=None, profile="profiles/slurm")
    options.resolve_execution_options(args)
    assert seen == [str(REPO / "profiles" / "slurm")] and args.profile == seen[0]
