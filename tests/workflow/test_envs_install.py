"""The pip section of envs/torq-gen-config.yaml installs into a fresh virtual environment and
gives a working package.

Conda cannot be installed here, so this is the part of ``conda env create -f
envs/torq-gen-config.yaml`` that pip does: a new venv (this Python, which the env file's
``python`` constraint must allow), ``pip install -r`` of the pip section written as a
requirements file (the machine's usual index and pip settings, no extra flags), then the
package from a copy of the checkout with ``pip install --no-deps`` (the step README gives
after creating the environment; the env file does not list the package: it says why). In
that venv the modules the jobs import load, and ``pip check`` finds every requirement,
the package's own (pyproject's) included, satisfied. About 1-3 minutes, most of it downloads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from test_wheel_install import clean_env, copy_checkout

pytestmark = pytest.mark.slow

ENV_FILE = REPO / "envs" / "torq-gen-config.yaml"
IMPORTS = "torq_gen_config, snakemake, onnx, iree.compiler, iree.runtime, onnxruntime"


def run(cmd, *, cwd, venv, timeout=1200) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=clean_env(venv))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r


def test_pip_section_installs_into_a_fresh_venv(tmp_path):
    env = yaml.safe_load(ENV_FILE.read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    (python_spec,) = [d for d in conda if d.startswith("python") and d[len("python"):][:1] in "<>=!~"]
    this_python = Version(".".join(map(str, sys.version_info[:3])))
    assert this_python in SpecifierSet(python_spec[len("python"):]), \
        f"this Python {this_python} is not one the env file allows ({python_spec}): the test would prove nothing"
    (pip_lines,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("".join(line + "\n" for line in pip_lines))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "-r", requirements], cwd=tmp_path, venv=venv)
    run([python, "-m", "pip", "install", "-q", "--no-deps", copy_checkout(tmp_path / "src")], cwd=tmp_path,
        venv=venv)

    elsewhere = tmp_path / "elsewhere"  # not the checkout: the package must come from the venv
    elsewhere.mkdir()
    r = run([python, "-c", f"import {IMPORTS}; print(torq_gen_config.__file__)"], cwd=elsewhere, venv=venv)
    package = Path(r.stdout.strip().splitlines()[-1]).resolve()
    assert package.is_relative_to(venv.resolve()), package
    run([python, "-m", "pip", "check"], cwd=elsewhere, venv=venv)
    assert os.access(venv / "bin" / "torq-gen-config", os.X_OK)
    run([venv / "bin" / "torq-gen-config", "--help"], cwd=elsewhere, venv=venv, timeout=300)
