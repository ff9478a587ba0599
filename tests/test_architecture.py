"""The package's import structure (pyproject.toml [tool.importlinter]): no cycles between
sibling modules or packages at any depth, ck-profile layered and using only the basic layer."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def test_import_contracts_hold():
    exe = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    r = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "Contracts: 3 kept, 0 broken." in r.stdout
