"""The files of one discovery in its output directory: one place for their names.

Everything a run writes is keyed by the report name (the model's file stem, plus
``_subgraph_<f>_<t>`` in subgraph mode), so that several models, and the subgraphs of
one model, can share an output directory without touching each other's files::

    <output dir>/torq_gen_config_<name>.json            report JSON
    <output dir>/torq_gen_config_<name>_compiler.json   compiler JSON
    <output dir>/torq_gen_config_<name>.html            HTML report (`torq-gen-config report`, rule report_html)
    <output dir>/work/<name>/                           everything else (layers, logs, full, ...)
    <output dir>/.torq-gen-config-<name>.lock           held while a run of <name> runs
"""

from __future__ import annotations

import os
from pathlib import Path

#: Folder of the per-name work directories, relative to the output directory.
WORK_ROOT = "work"
#: File in a work directory that exists while the report is older than the work files
#: (a job that feeds the report ran after it was written; removed when it is written).
OUTDATED_MARKER = ".report-outdated"
REPORT_PREFIX = "torq_gen_config_"


def work_dir(name: str) -> str:
    """The work directory of report ``name``, relative to the output directory."""
    return f"{WORK_ROOT}/{name}"


def report_file(name: str) -> str:
    """File name of the report JSON of ``name``."""
    return f"{REPORT_PREFIX}{name}.json"


def compiler_file(name: str) -> str:
    """File name of the compiler JSON of ``name``."""
    return f"{REPORT_PREFIX}{name}_compiler.json"


def html_report_file(name: str) -> str:
    """File name of the HTML report of ``name`` (next to its report JSON)."""
    return f"{REPORT_PREFIX}{name}.html"


def lock_file(name: str) -> str:
    """File name of the run lock of ``name`` (in the output directory)."""
    return f".torq-gen-config-{name}.lock"


def user_choices_file(name: str) -> str:
    """The person-made choices of ``edit`` for ``name``, relative to the output directory."""
    return f"{work_dir(name)}/user_choices.json"


def output_paths(output_dir: str | os.PathLike, name: str) -> dict[str, Path]:
    """Absolute paths of one discovery's files: ``report``, ``compiler``, ``work``, ``lock``,
    ``user_choices``."""
    out = Path(output_dir)
    return {"report": out / report_file(name), "compiler": out / compiler_file(name), "work": out / work_dir(name),
            "lock": out / lock_file(name), "user_choices": out / user_choices_file(name)}


def mark_outdated(marker: str | os.PathLike) -> None:
    """Create the out-of-date marker (:data:`OUTDATED_MARKER`) with the time it was set."""
    import time

    p = Path(marker)
    p.parent.mkdir(parents=True, exist_ok=True)
    if not p.exists():
        p.write_text(time.strftime("%Y-%m-%d %H:%M:%S") + "\n")


def clear_outdated(marker: str | os.PathLike) -> None:
    """Remove the out-of-date marker (the report was just written)."""
    Path(marker).unlink(missing_ok=True)
