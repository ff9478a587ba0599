"""Where a report's files are and how a report JSON is read for ``view`` and ``edit``:
the report and compiler JSON of a model, the user-choices sidecar, loading with checks
(a compiler JSON given instead of the report is named as such)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..config import model_name
from ..core.errors import ConfigError, ReportError
from ..core.fileio import read_json
from .build import check_report
from ..core.layout import REPORT_PREFIX, compiler_file, report_file, user_choices_file


# --------------------------------------------------------------------------- paths


def report_path_for_model(model: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """``<output_dir>/torq_gen_config_<model stem>.json`` (:mod:`torq_gen_config.core.layout`)."""

    return Path(output_dir).expanduser() / report_file(model_name(model))


def compiler_path_for_model(model: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """``<output_dir>/torq_gen_config_<model stem>_compiler.json`` (:mod:`torq_gen_config.core.layout`)."""

    return Path(output_dir).expanduser() / compiler_file(model_name(model))


def compiler_path_for_report(report_path: str | os.PathLike) -> Path:
    """The compiler JSON next to a report: ``<report stem>_compiler.json``."""
    p = Path(report_path)
    return p.with_name(f"{p.stem}_compiler.json")


def user_choices_path(report_path: str | os.PathLike, report: Mapping | None = None) -> Path:
    """The user-choices sidecar of a report: ``<report dir>/work/<name>/user_choices.json``
    (:mod:`torq_gen_config.core.layout`; ``name`` the report's ``model_name``, else the name in
    the report's file name), so that the choices of one model (or subgraph) never reach
    another's report in the same directory."""

    return Path(report_path).parent / user_choices_file(model_name_of(report, report_path)[0])


def model_name_of(data: Mapping | None, path: str | os.PathLike) -> tuple[str, bool]:
    """``(name, from the file name?)`` of a report or compiler JSON: its ``model_name``, else
    the name in its file name (``torq_gen_config_<name>.json``, for a compiler JSON
    ``torq_gen_config_<name>_compiler.json``; another file: its stem). The original tool's
    older reports have no ``model_name`` (docs/original_tool.md, 'Report JSON')."""
    name = data.get("model_name") if isinstance(data, Mapping) else None
    if isinstance(name, str) and name:
        return name, False
    stem = Path(path).stem.removeprefix(REPORT_PREFIX)
    return (stem.removesuffix("_compiler") if is_compiler_json(data) else stem), True


def resolve_report_path(report: str | None, model: str | None, output_dir: str | None) -> Path:
    """Report path from either a positional path or ``--model``/``--output-dir``.

    Raises:
        ConfigError: neither or both forms were given.
    """
    if report and model:
        raise ConfigError("give either a report JSON path or --model/--output-dir, not both")
    if report:
        return Path(report).expanduser()
    if model:
        return report_path_for_model(model, output_dir or ".")
    raise ConfigError("give a report JSON path, or --model (with --output-dir) to find it")


# --------------------------------------------------------------------------- loading


def is_compiler_json(data: Any) -> bool:
    """True for a compiler JSON (``op_assignments`` and no ``ops``)."""
    return isinstance(data, Mapping) and "op_assignments" in data and "ops" not in data


def _report_name_for_compiler(path: Path) -> Path:
    stem = path.stem
    if stem.endswith("_compiler"):
        return path.with_name(stem[: -len("_compiler")] + ".json")
    return path.with_name("torq_gen_config_<model>.json")


def load_report(path: str | os.PathLike) -> dict:
    """Read a report JSON for editing.

    Raises:
        ReportError: the file is missing or not valid JSON; it is a compiler
            JSON (the message names the report JSON to use instead); or it has
            no ``ops`` object.
    """
    path = Path(path)
    if not path.exists() and compiler_path_for_report(path).exists():
        raise ReportError(
            f"report JSON not found: {path} (only the compiler JSON {compiler_path_for_report(path)} is there; "
            "edit needs the report JSON: run 'torq-gen-config discover' to create it)"
        )
    data = read_json(path, "report JSON")
    if is_compiler_json(data):
        raise ReportError(
            f"{path} is a compiler JSON (op_assignments), which is derived from the report; "
            f"edit the report JSON instead: {_report_name_for_compiler(path)}"
        )
    if not isinstance(data, dict) or not isinstance(data.get("ops"), dict):
        raise ReportError(f"{path} is not a torq-gen-config report JSON: it has no 'ops' object")
    check_report(data, str(path))
    # a report of the original tool: the name its files are written under (and the
    # compiler JSON's model_name) comes from the file name
    data["model_name"] = model_name_of(data, path)[0]
    return data
