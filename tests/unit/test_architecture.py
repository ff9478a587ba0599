"""The package's import structure (pyproject.toml [tool.importlinter]): no cycles between
sibling modules or packages at any depth, the package layered by pipeline stage (README,
Layout; docs/architecture.md), ck-profile layered and using only the basic layer; the
contracts catch a violation; the root holds at most 8 modules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import REPO

LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_import_contracts_hold():
    r = _lint(REPO)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "Contracts: 4 kept, 0 broken." in r.stdout


def test_layers_contract_catches_an_upward_import(tmp_path):
    """A basic module (errors) importing the report layer breaks the layers contract."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(REPO / "workflow" / "torq_gen_config", tmp_path / "torq_gen_config",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "torq_gen_config" / "core" / "errors.py", "a", encoding="utf-8") as f:
        f.write("\nfrom .. import report  # noqa: E402,F401\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = _lint(tmp_path, env)
    assert r.returncode != 0
    assert "the package is layered" in r.stdout and "BROKEN" in r.stdout
    assert "torq_gen_config.core.errors -> torq_gen_config.report" in r.stdout


def test_the_folders_are_the_pipeline():
    """The package root holds at most 8 modules (the rest lives in the folder of its stage,
    docs/architecture.md), and every folder is a package the layers contract names."""
    import tomllib

    root = REPO / "workflow" / "torq_gen_config"
    modules = sorted(p.name for p in root.glob("*.py"))
    assert len(modules) <= 8, modules
    folders = {d.name for d in root.iterdir() if d.is_dir() and (d / "__init__.py").is_file()}
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c.get("containers") == ["torq_gen_config"])
    named = {part.strip() for line in layers for part in line.split("|")}
    assert folders <= named, f"folders the layers contract does not place: {sorted(folders - named)}"


def test_readme_layout_names_every_module():
    """The README's Layout section matches the tree: every package and every module of the
    package (down to the modules of its subpackages; ck/ and inputs/rules/ are described
    as a whole) is named there."""
    import re

    pkg = REPO / "workflow" / "torq_gen_config"
    text = (REPO / "README.md").read_text()
    start = text.index("## Layout")
    block = text[start:text.index("```", text.index("```", start) + 3)]
    missing = []
    for p in sorted(pkg.rglob("*.py")):
        rel = p.relative_to(pkg)
        if "__pycache__" in rel.parts or p.name in ("__init__.py", "__main__.py"):
            continue
        if rel.parts[0] == "ck" or rel.parts[:2] == ("inputs", "rules"):
            continue
        if not re.search(r"\b" + re.escape(p.stem) + r"\b", block):
            missing.append(str(rel))
    missing += [d.name + "/" for d in pkg.iterdir()
                if d.is_dir() and d.name != "__pycache__" and not re.search(r"\b" + re.escape(d.name) + "/", block)]
    assert not missing, f"not in the README's Layout section: {missing}"
