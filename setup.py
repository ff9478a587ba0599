"""Build hook (the project's metadata is in pyproject.toml): a wheel ships the workflow files.

``pip install .`` must give a ``torq-gen-config`` that runs from any directory, so the build
copies the files the workflow reads at run time (``torq_gen_config.workflow_files.SHIPPED``:
Snakefile, rules/ with the report captions, config/, profiles/, workflow/schemas/) into the
package as ``torq_gen_config/_workflow_files/``, in the checkout's relative layout. An editable
install (``pip install -e .``) gets no copy: it runs from the checkout and reads the
checkout's files (torq_gen_config.workflow_files), so an edit is never shadowed by a stale copy.
"""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _workflow_files():
    """torq_gen_config.workflow_files, loaded from its file (it imports nothing of the package,
    so the build needs none of the package's dependencies)."""
    spec = importlib.util.spec_from_file_location(
        "_torq_gen_config_workflow_files", ROOT / "workflow" / "torq_gen_config" / "workflow_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithWorkflowFiles(build_py):
    """build_py that also copies the workflow files into the built package (not in editable mode)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        files = _workflow_files()
        target = Path(self.build_lib) / "torq_gen_config" / files.INSTALLED_DIR
        if target.exists():  # a previous build's copy: files removed since must not linger
            shutil.rmtree(target)
        for name in files.SHIPPED:
            src = ROOT / name
            if not src.exists():  # an sdist without them (MANIFEST.in) would build a broken wheel
                raise FileNotFoundError(f"workflow file {src} missing: the wheel would not run")
            dst = target / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"))
            else:
                shutil.copy2(src, dst)


setup(cmdclass={"build_py": BuildPyWithWorkflowFiles})
