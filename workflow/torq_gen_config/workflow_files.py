"""Where the workflow's own files are: the Snakefile, ``rules/``, ``config/``, ``profiles/``
and ``workflow/schemas/`` (the one place that answers it).

Two places, one relative layout::

    <checkout>/Snakefile, rules/, config/, profiles/, workflow/schemas/    a checkout (also `pip install -e .`)
    <site-packages>/torq_gen_config/_workflow_files/<the same>           an installed wheel (`pip install .`)

The package runs from a checkout when it sits at ``<checkout>/workflow/torq_gen_config`` next
to the checkout's ``Snakefile``; then the checkout's files are used, so an editable install
never reads a stale copy (it has none: ``setup.py`` copies the files into the package only
when it builds a wheel). Otherwise the copy shipped in the package is used. Nothing here
raises: :func:`missing` says what is absent, and the callers raise their own error type.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The files and folders that make the workflow, relative to its root; ``setup.py`` ships
#: exactly these (and MANIFEST.in puts them into the sdist).
SHIPPED = ("Snakefile", "rules", "config", "profiles", "workflow/schemas")
#: Folder of the installed copy inside the package (not a Python package: data only).
INSTALLED_DIR = "_workflow_files"

PACKAGE_DIR = Path(__file__).resolve().parent
#: Where the copy of an installed wheel is.
INSTALLED_ROOT = PACKAGE_DIR / INSTALLED_DIR
#: Where a checkout's files are, if the package runs from one (``workflow/torq_gen_config``).
CHECKOUT_ROOT = PACKAGE_DIR.parents[1]


def from_checkout() -> bool:
    """True when the package runs from a checkout (source tree or editable install): it
    sits in ``<root>/workflow/`` and ``<root>/Snakefile`` exists."""
    return PACKAGE_DIR.parent.name == "workflow" and (CHECKOUT_ROOT / "Snakefile").is_file()


def root() -> Path:
    """The folder holding the workflow files: the checkout's root when the package runs from
    a checkout, else the copy in the installed package (:data:`INSTALLED_ROOT`, which may be
    missing in a broken install: see :func:`missing`)."""
    return CHECKOUT_ROOT if from_checkout() else INSTALLED_ROOT


def path(relative: str | os.PathLike) -> Path:
    """A workflow file by its path relative to the workflow root (``"config/gpu.yaml"``)."""
    return root() / relative


def snakefile() -> Path:
    """The workflow's ``Snakefile`` (what ``snakemake --snakefile`` and a Snakemake
    ``module ...: snakefile:`` statement take)."""
    return path("Snakefile")


def config_file() -> Path:
    """The default configuration, ``config/config.yaml``."""
    return path("config/config.yaml")


def schema_dir() -> Path:
    """The folder of the JSON schemas (``workflow/schemas``)."""
    return path("workflow/schemas")


def default_profile() -> Path:
    """The settings file of the default workflow profile, ``profiles/default/config.yaml``."""
    return path("profiles/default/config.yaml")


def resolve_preset(given: str | os.PathLike) -> Path:
    """A file or folder the user named on the command line (``--config-file config/gpu.yaml``,
    ``--profile profiles/slurm``): the path as given (relative to the current directory) when
    it exists; else, when it is a relative path that exists under the workflow root, that one
    (so the README's spellings work from any directory, also with an installed wheel); else
    the path as given, for the caller's "not found" message."""
    p = Path(given).expanduser()
    if p.exists() or p.is_absolute():
        return p
    shipped = root() / p
    return shipped if shipped.exists() else p


def missing() -> str | None:
    """None when the workflow files are in place, else one line saying which are missing
    and where they were looked for."""
    where = root()
    absent = [name for name in SHIPPED if not (where / name).exists()]
    if not absent:
        return None
    how = ("the checkout" if from_checkout() else
           "the installed package (reinstall it: pip install torq-gen-config, or pip install -e . in a checkout)")
    return f"workflow file(s) {', '.join(absent)} missing in {where} ({how})"
