"""``pip install .`` (a wheel, not an editable install) gives a working ``torq-gen-config``.

The wheel is really built (``pip wheel`` with this environment's setuptools, no build
isolation, no index: offline) from a copy of the checkout, and installed into a fresh
virtual environment that sees this environment's site-packages for the dependencies (a
``.pth`` file: nothing is downloaded) but not the checkout: the checkout is on neither
``sys.path`` nor ``PYTHONPATH`` there. From a directory that is not the checkout, the
installed ``torq-gen-config`` runs discovery of a small real model with the real tools, and
the installed copy of the workflow serves as a Snakemake module. An editable install reads
the checkout's files (no copy that could go stale).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO
from test_output_schemas import small_cnn, validate_tree
from test_snakemake_module import check_module_run, write_outer_workflow

from torq_gen_config import workflow_files

pytestmark = pytest.mark.slow

#: What a copy of the checkout leaves out (the build needs none of it; tests/ is 1 MB).
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "results", "out", "build", "dist", ".snakemake", "__pycache__",
                                    "*.egg-info", ".pytest_cache", ".import_linter_cache", "tests", "benchmarks")


def offline_build_unsupported() -> str | None:
    """Why this environment cannot build a wheel without the network, or None: it needs
    setuptools >= 70.1 (bdist_wheel built in) or the ``wheel`` package (the test extra
    installs setuptools >= 70.1). In CI (``CI`` set, as .ci/run runs) that is a failure."""
    reason = _offline_build_unsupported()
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI must run the wheel test: {reason}")
    return reason


def _offline_build_unsupported() -> str | None:
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is not installed (pip install -e '.[test]')"
    major, minor = (int(x) for x in (version.split(".") + ["0"])[:2])
    if (major, minor) >= (70, 1):
        return None
    try:
        importlib.metadata.version("wheel")
        return None
    except importlib.metadata.PackageNotFoundError:
        return (f"setuptools {version} builds wheels only with the wheel package; "
                "pip install -e '.[test]' installs setuptools>=70.1")


def copy_checkout(dst: Path) -> Path:
    shutil.copytree(REPO, dst, ignore=NOT_COPIED)
    return dst


def outer_site_dirs() -> list[str]:
    """This environment's package directories, without the checkout's package folder (an
    editable install's path to it is not a site-packages directory, and the .pth files of
    the directories listed here are not read in the fresh venv). A venv inside the checkout
    (``.venv``, as in CI) is kept: its site-packages hold no torq_gen_config."""
    package_dir = (REPO / "workflow").resolve()
    dirs = []
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p) and os.path.isdir(p) \
                and not Path(p).resolve().is_relative_to(package_dir) and p not in dirs:
            dirs.append(p)
    return dirs


def fresh_venv(where: Path) -> Path:
    """A new virtual environment (no pip of its own) whose ``.pth`` file adds this
    environment's package directories after its own; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60, env=clean_env(where)).stdout.strip()
    Path(site, "_outer_environment.pth").write_text("".join(d + "\n" for d in outer_site_dirs()))
    return python


def clean_env(venv: Path) -> dict:
    """The environment of a command in ``venv``: no PYTHONPATH (the checkout is not on the
    path), the venv's bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    return env


def run(cmd, *, cwd, venv, timeout=600) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=clean_env(venv))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r


WHERE = ("import json, sys, torq_gen_config; from torq_gen_config import workflow_files as w; "
         "print(json.dumps({'package': torq_gen_config.__file__, 'root': str(w.root()), 'missing': w.missing(), "
         "'gpu': str(w.resolve_preset('config/gpu.yaml')), 'path': sys.path}))")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    reason = offline_build_unsupported()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("wheel")
    src = copy_checkout(tmp / "src")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (found,) = (tmp / "dist").glob("torq_gen_config-*.whl")
    return found


def test_the_wheel_ships_the_workflow_files(wheel):
    """Every file of Snakefile, rules/ (captions too), config/, profiles/, workflow/schemas/,
    at the same relative path under torq_gen_config/_workflow_files/."""
    names = set(zipfile.ZipFile(wheel).namelist())
    prefix = f"torq_gen_config/{workflow_files.INSTALLED_DIR}/"
    expected = set()
    for entry in workflow_files.SHIPPED:
        p = REPO / entry
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
        expected |= {prefix + f.relative_to(REPO).as_posix() for f in files}
    assert expected and expected <= names, sorted(expected - names)
    assert {n for n in names if n.startswith(prefix)} == expected
    assert prefix + "rules/captions/html_report.rst" in names
    assert "torq_gen_config/workflow_files.py" in names and "torq_gen_config/cli/main.py" in names


def test_a_wheel_from_the_sdist_has_the_same_files(wheel, tmp_path):
    """The sdist (``python -m build``'s first step) carries what the wheel needs (MANIFEST.in):
    the wheel built from it has the same files as the one built from the checkout."""
    src = copy_checkout(tmp_path / "src")
    build_sdist = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", build_sdist, str(tmp_path / "sdist")], cwd=src, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    sdist = tmp_path / "sdist" / r.stdout.strip().splitlines()[-1]
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(tmp_path / "dist"), str(sdist)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (from_sdist,) = (tmp_path / "dist").glob("torq_gen_config-*.whl")
    assert set(zipfile.ZipFile(from_sdist).namelist()) == set(zipfile.ZipFile(wheel).namelist())


def test_installed_wheel_runs_from_another_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", wheel],
        cwd=tmp_path, venv=venv)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model = small_cnn(elsewhere / "cnn.onnx")

    # the installed package and its copy of the workflow; no checkout on the path
    where = json.loads(run([python, "-c", WHERE], cwd=elsewhere, venv=venv).stdout)
    copy = venv.resolve() / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" \
        / "torq_gen_config" / workflow_files.INSTALLED_DIR
    assert Path(where["package"]).resolve().is_relative_to(venv.resolve()), where["package"]
    assert Path(where["root"]).resolve() == copy and where["missing"] is None
    assert Path(where["gpu"]).resolve() == copy / "config" / "gpu.yaml"
    package_dir = (REPO / "workflow").resolve()
    assert not [p for p in where["path"] if p and (Path(p).resolve().is_relative_to(package_dir)
                                                   or Path(p).resolve() == REPO.resolve())], where["path"]

    # discovery with the console script the wheel installed
    r = run([venv / "bin" / "torq-gen-config", "discover", "--model", "cnn.onnx", "--output-dir", "out", "-j", "2",
             "-q"], cwd=elsewhere, venv=venv)
    assert "FINAL EXECUTOR DISCOVERY REPORT" in r.stdout
    out = elsewhere / "out"
    report = json.loads((out / "torq_gen_config_cnn.json").read_text())
    assert len(report["ops"]) == 3
    assert all(e["status"] == "success" for op in report["ops"].values() for e in op["executors"].values())
    seen = validate_tree(out)
    assert {"report_output.schema.yaml", "compiler.schema.yaml"} <= set(seen)
    assert not (elsewhere / "results").exists()  # the CLI's output dir only

    # the installed copy as a Snakemake module of another workflow, with its own profile settings
    outer = tmp_path / "outer"
    write_outer_workflow(outer, model)
    run([python, "-m", "snakemake", "--cores", "2", "--workflow-profile", copy / "profiles" / "default"],
        cwd=outer, venv=venv)
    check_module_run(outer, "cnn", layers=3)


def test_editable_install_reads_the_checkout(tmp_path):
    """``pip install -e``: no copy of the workflow files is made, and an edit of the
    checkout's config is what the package reads at once."""
    reason = offline_build_unsupported()
    if reason:
        pytest.skip(reason)
    src = copy_checkout(tmp_path / "src")
    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation", "--ignore-installed",
         "-q", "-e", src], cwd=tmp_path, venv=venv)
    where = json.loads(run([python, "-c", WHERE], cwd=tmp_path, venv=venv).stdout)
    assert Path(where["package"]).resolve() == (src / "workflow" / "torq_gen_config" / "__init__.py").resolve()
    assert Path(where["root"]).resolve() == src.resolve() and where["missing"] is None
    assert not list(src.rglob(workflow_files.INSTALLED_DIR)) and not list(venv.rglob(workflow_files.INSTALLED_DIR))
    config = src / "config" / "config.yaml"
    config.write_text(config.read_text().replace("timeout_s: 300", "timeout_s: 123"))
    read = ("from torq_gen_config.config import DEFAULT_CONFIG_PATH, load_config_file; "
            "print(load_config_file(DEFAULT_CONFIG_PATH)['timeout_s'])")
    assert run([python, "-c", read], cwd=tmp_path, venv=venv).stdout.strip() == "123"
