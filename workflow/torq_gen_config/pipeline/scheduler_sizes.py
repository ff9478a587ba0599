"""Snakemake's scheduler sizes only the inputs that a scheduling choice uses.

Snakemake 9 (``snakemake/scheduling/job_scheduler.py``, ``JobScheduler.job_selector``)
looks up the size of every input of every ready job before each selection, one
``exists`` and one ``size`` call per path, and a selection follows every finished job:
``jobs x ready inputs`` file lookups in the scheduler's thread. Discovery has many small
jobs (a test per layer and executor), so on light_densenet121 with ``dedup_layers``
(1981 jobs, up to ~1500 ready) those lookups were most of the scheduler's time: 221 s
-> 186 s wall, 380 s -> 315 s CPU on 2 vCPUs with :func:`size_only_temp_inputs` applied.

The sizes feed only the schedulers' rewards: the greedy scheduler ranks jobs by
priority, then by the size of their ``temp()`` inputs (to free disk early), then by the
size of all inputs; the MILP scheduler uses the ``temp()`` sizes. This workflow's only
``temp()`` files are the full-model run's batch modules, and it ranks its jobs by
``priority``, so after the patch the ``temp()`` inputs are still sized and every other
input counts as size 0 (ties in priority keep
Snakemake's order). A Snakemake without that method, or with another signature, is left
as it is (:func:`size_only_temp_inputs` returns False; ``tests/unit/test_scheduler_sizes.py``
pins the method on the installed Snakemake).
"""

from __future__ import annotations

import asyncio
import inspect

_PATCHED = "_torq_gen_config_sizes_only_temp"


class _SizeOrNone(dict):
    """Input sizes (bytes) by path; a path not looked up has no size (None), which the
    schedulers count as 0."""

    def __missing__(self, key):
        return None


def size_only_temp_inputs() -> bool:
    """Make Snakemake's job scheduler look up the sizes of ``temp()`` inputs only.

    Replaces ``JobScheduler.update_input_sizes`` (process-wide, once; idempotent).
    Sizes are bytes, as Snakemake's ``_IOFile.size``.

    Returns:
        True when the patch is in place, False when this Snakemake has no such
        method (another version: nothing is changed).
    """
    try:
        from snakemake.scheduling.job_scheduler import JobScheduler  # optional: another Snakemake may lack it
    except ImportError:
        return False
    original = getattr(JobScheduler, "update_input_sizes", None)
    if original is None or not inspect.iscoroutinefunction(original):
        return False
    if getattr(original, _PATCHED, False):
        return True
    if list(inspect.signature(original).parameters) != ["self", "jobs"]:
        return False

    async def update_input_sizes(self, jobs) -> None:
        if not isinstance(self._input_sizes, _SizeOrNone):
            self._input_sizes = _SizeOrNone(self._input_sizes)

        async def get_size(path):
            return path, await path.size() if await path.exists() else None

        paths = {path for job in jobs for path in job.input if path.is_flagged("temp")}
        if paths:
            self._input_sizes.update(await asyncio.gather(*[get_size(path) for path in paths]))

    setattr(update_input_sizes, _PATCHED, True)
    update_input_sizes.__wrapped__ = original
    JobScheduler.update_input_sizes = update_input_sizes
    return True
