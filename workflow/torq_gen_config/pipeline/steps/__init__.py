"""The workflow's steps: one module per rules file (rules/<topic>.smk -> steps/<topic>.py).

Each rule's ``run:`` block is one call, ``steps.<topic>.<rule>(input, output, params,
log)``: the step unpacks what the rule declares, calls the library (the ``*_job``
functions of the same module, which take plain paths and values), writes and logs.
Every config value a job reads comes in through ``params``; the few that must not
rerun finished jobs when they change (timeout, tolerance, log file, verbosity: a
tolerance change re-derives verdicts in the report without recompiling) are wrapped
in :class:`Untracked`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Untracked:
    """A rule param whose changes do not rerun finished jobs: Snakemake records only
    params of plain types (int, str, list, dict, ...) and skips other objects when it
    compares a job's params with the last run's ("params" rerun trigger)."""

    value: Any


def untracked(value: Any) -> Untracked:
    """``value`` as a param Snakemake passes to the job but does not compare between runs."""
    return Untracked(value)
