"""The workflow's steps: one module per rules file (rules/<topic>.smk -> steps/<topic>.py).

Each rule's ``run:`` block is one call, ``steps.<topic>.<rule>(input, output, params,
log)``: the step (an adapter made by :func:`step`) unpacks what the rule declares, calls
the library (the ``*_job`` functions of the same module, which take plain paths and
values), writes and logs. Every config value a job reads comes in through ``params``; the
few that must not rerun finished jobs when they change (timeout, tolerance, log file,
verbosity: a tolerance change re-derives verdicts in the report without recompiling) are
wrapped in :class:`Untracked` by the rule and unwrapped by :func:`step`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from ...core.layout import mark_outdated


@dataclass(frozen=True)
class Untracked:
    """A rule param whose changes do not rerun finished jobs: Snakemake records only
    params of plain types (int, str, list, dict, ...) and skips other objects when it
    compares a job's params with the last run's ("params" rerun trigger)."""

    value: Any


def untracked(value: Any) -> Untracked:
    """``value`` as a param Snakemake passes to the job but does not compare between runs."""
    return Untracked(value)


class RuleParams:
    """A rule's ``params`` as its step reads them: each attribute's value, an
    :class:`Untracked` one unwrapped."""

    def __init__(self, params: Any):
        self._params = params

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._params, name)
        return value.value if isinstance(value, Untracked) else value


def step(fn: Callable | None = None, *, feeds_report: bool = False) -> Callable:
    """Make ``fn(input, output, params, log[, wildcards])`` a rule's step: ``params``
    reaches it as :class:`RuleParams`; with ``feeds_report`` (the job's outputs are read by
    the report) the report's out-of-date marker (param ``outdated``) is set before it runs,
    so that an interrupted run leaves a report that says it is out of date."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def adapter(input, output, params, log, *rest):
            if feeds_report:
                mark_outdated(params.outdated)
            return fn(input, output, RuleParams(params), log, *rest)
        return adapter
    return wrap(fn) if fn is not None else wrap
