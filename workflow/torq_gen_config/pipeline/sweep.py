"""A model sweep: the rows of a model sheet (``models.tsv``), each one discovery of its own,
all in ONE Snakemake workflow (rules/sweep.smk: one Snakemake module per model, its rules
prefixed ``<name>__``), so that jobs of different models interleave and ``-j`` or a cluster
sees all of them (Snakemake's sample-sheet idiom; docs/sweep.md).

The sheet is tab-separated with a header line; columns ``name`` and ``model`` are
required, ``input_shapes``, ``input_data`` and ``config`` optional (the row schema:
``workflow/schemas/models.schema.yaml``). Paths in it are relative to the sheet's folder.
A row whose model cannot be read is not a stopped sweep: it is kept with its reason
(:func:`check_row`) and the summary lists it.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..config import DEFAULT_CONFIG_PATH, load_config_file, parse_input_shapes, validate_config
from ..core.errors import ConfigError, TorqGenConfigError
from ..core.lazy import jsonschema
from ..core.schemas import load_schema
from ..preflight import preflight

#: the columns a sheet may have, in the order they are documented
COLUMNS = ("name", "model", "input_shapes", "input_data", "config")
#: the separator between a model's name and its rules' names (``yolo__aggregate_report``)
RULE_PREFIX_SEP = "__"


@dataclass(frozen=True)
class SweepRow:
    """One model of a sweep: its name, its model path (absolute, or ``onnx:...``), the
    config its discovery runs with (``config``), and why it cannot run (``failure``, None
    when it can)."""

    name: str
    model: str
    config: dict = field(default_factory=dict)
    failure: str | None = None

    @property
    def module(self) -> str:
        """The Snakemake module's name."""
        return f"sweep_{self.name}"

    @property
    def prefix(self) -> str:
        """The prefix of the module's rules."""
        return f"{self.name}{RULE_PREFIX_SEP}"


def read_model_sheet(path: str | os.PathLike) -> list[dict]:
    """The rows of a model sheet, each validated (empty cells left out).

    Returns:
        ``[{"name", "model", ...}]`` in sheet order, paths as written.

    Raises:
        ConfigError: one line: no such file, no header, an unknown column, a row that
            breaks the schema (its line and the problem), a duplicate name.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"model sheet {p}: no such file")
    schema = load_schema("models.schema.yaml")
    with open(p, encoding="utf-8", newline="") as f:
        reader = csv.DictReader((ln for ln in f if ln.strip() and not ln.lstrip().startswith("#")), delimiter="\t")
        header = reader.fieldnames or []
        unknown = [c for c in header if c not in COLUMNS]
        if not header or "name" not in header or "model" not in header:
            raise ConfigError(f"model sheet {p}: the header line needs the columns name and model (tab-separated; "
                              f"optional: {', '.join(COLUMNS[2:])})")
        if unknown:
            raise ConfigError(f"model sheet {p}: unknown column {unknown[0]!r} (columns: {', '.join(COLUMNS)})")
        rows, seen = [], {}
        for k, raw in enumerate(reader, 2):
            if None in raw:
                raise ConfigError(f"model sheet {p}, row {k}: more cells than columns (tab-separated)")
            row = {c: v.strip() for c, v in raw.items() if v is not None and v.strip()}
            errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(row), key=lambda e: list(e.path))
            if errors:
                where = "/".join(str(x) for x in errors[0].path) or "row"
                raise ConfigError(f"model sheet {p}, row {k} ({where}): {errors[0].message}")
            if row["name"] in seen:
                raise ConfigError(f"model sheet {p}, row {k}: name {row['name']!r} is also row {seen[row['name']]}")
            seen[row["name"]] = k
            rows.append(row)
    if not rows:
        raise ConfigError(f"model sheet {p}: no model rows")
    return rows


def sweep_rows(sheet: str | os.PathLike, base: Mapping, output_dir: str) -> list[SweepRow]:
    """The sweep's models: each row's discovery config (``base``, the outer workflow's
    config without ``models``, then the row's config file, then its model, input shapes,
    input data and ``output_dir/<name>``) and whether it can run (:func:`check_row`).

    Raises:
        ConfigError: the sheet itself is bad (:func:`read_model_sheet`).
    """
    where = Path(sheet).expanduser().resolve().parent
    out = []
    for row in read_model_sheet(sheet):
        config = {k: v for k, v in base.items() if k not in ("models", "output_dir", "model")}
        failure = None
        try:
            if row.get("config"):
                config.update(load_config_file(str(_rel(where, row["config"]))))
            model = row["model"] if row["model"].startswith("onnx:") else str(_rel(where, row["model"]))
            if row.get("input_shapes"):
                config["input_shapes"] = row["input_shapes"].split()
                parse_input_shapes(config["input_shapes"])
            if row.get("input_data"):
                config["input_data"] = str(_rel(where, row["input_data"]))
            check_row(model, config)
        except TorqGenConfigError as e:
            model, failure = row["model"], str(e)
        config.update(model=model, output_dir=sweep_file(output_dir, row["name"]))
        out.append(SweepRow(name=row["name"], model=model, config=config, failure=failure))
    return out


def sweep_file(output_dir: str, *parts: str) -> str:
    """A path in the sweep's output directory, normalized (Snakemake matches files by
    their path: no ``./``)."""
    return os.path.normpath(os.path.join(output_dir, *parts))


def model_files(rows: list[SweepRow], output_dir: str, name_to_file) -> list[str]:
    """Each model's file ``name_to_file(name)`` (e.g. its report) in its folder, for the
    rows that run."""
    return [sweep_file(output_dir, r.name, name_to_file(r.name)) for r in rows if not r.failure]


def summary_rows(rows: list[SweepRow], output_dir: str, report_name) -> list[dict]:
    """The rows as the summary step takes them: ``{"name", "model", "failure", "report"}``."""
    return [{"name": r.name, "model": r.model, "failure": r.failure,
             "report": None if r.failure else sweep_file(output_dir, r.name, report_name(r.name))} for r in rows]


def check_row(model: str, config: Mapping) -> None:
    """What must hold before a row's discovery joins the workflow (its parse would
    otherwise stop the whole sweep): the row's config is valid and passes the checks
    against its model that a single discovery makes before any job
    (:func:`torq_gen_config.preflight.preflight`: the model file is ONNX, its input
    shapes and input data fit the model).

    Raises:
        ModelError / ConfigError: one line naming the problem.
    """
    preflight(validate_config({**load_config_file(DEFAULT_CONFIG_PATH), **config, "model": model}))


def _rel(base: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p
