"""torq_gen_config.pipeline.scheduler_sizes: Snakemake's scheduler sizes only temp() inputs.

The patch rests on three facts of the installed Snakemake, pinned here so that an
upgrade that changes them fails this test rather than the scheduling.
"""

import asyncio
import inspect

from snakemake.scheduling.job_scheduler import JobScheduler

from torq_gen_config.pipeline import scheduler_sizes


def test_the_installed_snakemake_has_what_the_patch_replaces():
    assert scheduler_sizes.size_only_temp_inputs() is True
    assert scheduler_sizes.size_only_temp_inputs() is True  # idempotent
    patched = JobScheduler.update_input_sizes
    original = patched.__wrapped__
    assert list(inspect.signature(original).parameters) == ["self", "jobs"]
    # the selection asks for the sizes of the ready jobs, then hands them to the scheduler
    source = inspect.getsource(JobScheduler.job_selector)
    assert "self.update_input_sizes(jobs)" in source and "self._input_sizes" in source


def test_greedy_reward_counts_a_size_of_none_as_zero():
    from snakemake.scheduling.greedy import Scheduler

    source = inspect.getsource(Scheduler.job_reward)
    assert "input_sizes[f] or 0" in source


class _Path(str):
    def __new__(cls, name, size, temp=False):
        p = super().__new__(cls, name)
        p._size, p._temp = size, temp
        p.lookups = 0
        return p

    def is_flagged(self, flag):
        return flag == "temp" and self._temp

    async def exists(self):
        self.lookups += 1
        return self._size is not None

    async def size(self):
        return self._size


class _Job:
    def __init__(self, *inputs):
        self.input = list(inputs)


class _Scheduler:
    def __init__(self):
        self._input_sizes = {}


def test_only_temp_inputs_are_looked_up_and_others_have_no_size():
    assert scheduler_sizes.size_only_temp_inputs()
    plain, temp, gone = _Path("a.npz", 10), _Path("b.tmp", 20, temp=True), _Path("c.tmp", None, temp=True)
    sched = _Scheduler()
    asyncio.run(JobScheduler.update_input_sizes(sched, [_Job(plain, temp), _Job(temp, gone)]))
    assert plain.lookups == 0 and temp.lookups == 1 and gone.lookups == 1
    assert sched._input_sizes[temp] == 20
    assert sched._input_sizes[gone] is None
    assert sched._input_sizes[plain] is None  # not looked up: counts as 0 in the rewards
    assert sum(sched._input_sizes[f] or 0 for f in (plain, temp, gone)) == 20
