"""envs/torq-gen-config.yaml, the job environment for cluster nodes without a shared virtual
environment, pins what pyproject.toml pins.

Conda is not installed here, so these checks read the files: the env file is a conda
environment file (name, channels, dependencies with pip and a pip section), its pip section
is ``[project].dependencies`` with the same specifiers (name, extras, specifier, marker;
order does not matter), and every Python it allows is one that pyproject's
``requires-python`` and Snakemake's ``Requires-Python`` allow.
tests/workflow/test_envs_install.py installs the pip section into a fresh venv.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

import pytest
import yaml
from conftest import REPO
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ENV_FILE = REPO / "envs" / "torq-gen-config.yaml"
#: the keys conda accepts at the top of an environment file
ENV_KEYS = {"name", "channels", "dependencies", "prefix", "variables"}
#: a conda package spec as this file writes them: a name, then an optional PEP 440-style
#: constraint (">=3.11,<3.14"); no build strings or channel prefixes
CONDA_SPEC = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._-]*)\s*(?P<constraint>(?:[<>=!~][^\s]*)?)$")
#: Python minor versions to try against the constraints (3.0 .. 3.39)
MINORS = [Version(f"3.{minor}") for minor in range(40)]


@pytest.fixture(scope="module")
def env() -> dict:
    return yaml.safe_load(ENV_FILE.read_text())


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def conda_specs(env) -> dict[str, str]:
    """The env file's conda dependencies (strings): name -> constraint."""
    specs = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            m = CONDA_SPEC.match(dep)
            assert m, f"not a conda package spec: {dep!r}"
            assert m["name"] not in specs, f"{m['name']} listed twice"
            specs[m["name"]] = m["constraint"]
    return specs


def pip_section(env) -> list[str]:
    sections = [dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict)]
    assert len(sections) == 1 and all(isinstance(d, dict) and set(d) == {"pip"}
                                      for d in env["dependencies"] if not isinstance(d, str)), env["dependencies"]
    return sections[0]


def by_name(lines) -> dict[str, tuple]:
    """Requirement lines -> canonical name -> (extras, specifier, marker), one per name."""
    out = {}
    for line in lines:
        req = Requirement(line)  # a path, URL or pip option (-e, -r) is not a requirement: it fails here
        name = canonicalize_name(req.name)
        assert name not in out, f"{req.name} listed twice"
        out[name] = (frozenset(req.extras), req.specifier, str(req.marker) if req.marker else None)
    return out


def test_is_a_conda_environment_file(env):
    assert isinstance(env, dict) and set(env) <= ENV_KEYS, env
    assert env["name"] == "torq-gen-config"
    assert env["channels"][0] == "conda-forge" and "nodefaults" in env["channels"], env["channels"]
    assert "defaults" not in env["channels"]
    assert isinstance(env["dependencies"], list) and env["dependencies"]
    specs = conda_specs(env)
    assert "pip" in specs, "a pip section needs pip among the conda dependencies"
    assert "python" in specs
    assert all(isinstance(line, str) and line.strip() for line in pip_section(env))


def test_pip_section_pins_what_pyproject_pins(env, project):
    """Name, extras, specifier and marker of each requirement, order-independent; the
    package itself is not listed (the env file says why; README installs it with
    ``pip install --no-deps .``)."""
    pinned = by_name(pip_section(env))
    wanted = by_name(project["dependencies"])
    differ = {name: {"envs": pinned.get(name), "pyproject": wanted.get(name)}
              for name in sorted(set(pinned) | set(wanted)) if pinned.get(name) != wanted.get(name)}
    assert not differ, differ
    assert canonicalize_name(project["name"]) not in pinned


def test_python_is_one_that_pyproject_and_snakemake_allow(env, project):
    """The conda ``python`` constraint has a lower and an upper bound, allows some Python
    minor versions, and each of them satisfies pyproject's ``requires-python`` and the
    installed Snakemake's ``Requires-Python`` (every snakemake >= 9.20 needs >= 3.11, so a
    Python that pyproject alone allows, 3.10, would not resolve)."""
    constraint = conda_specs(env)["python"]
    allowed = SpecifierSet(constraint)
    ops = {spec.operator for spec in allowed}
    assert ops & {">=", ">"} and ops & {"<", "<="}, f"python{constraint}: give a lower and an upper bound"
    minors = [v for v in MINORS if v in allowed]
    assert minors, f"python{constraint} allows no Python 3 minor version"
    requires_python = SpecifierSet(project["requires-python"])
    snakemake_python = SpecifierSet(importlib.metadata.metadata("snakemake")["Requires-Python"] or "")
    assert [str(v) for v in minors if v not in requires_python] == [], project["requires-python"]
    assert [str(v) for v in minors if v not in snakemake_python] == [], str(snakemake_python)
