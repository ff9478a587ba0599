# The run's context and the input functions shared by the rules. What a run is (model,
# report name, paths, executors, precision, batches, limits) is computed once, in
# torq_gen_config.pipeline.context.RunContext; this file builds it and wires it up.
#   ctx: the RunContext (frozen): ctx.work, ctx.layers, ctx.executors, ctx.timeout, ...
#   get: its RunInputs over the checkpoints: get.unit_members, get.prepare_inputs, ...
import os
import re

from snakemake.exceptions import WorkflowError
from snakemake_interface_executor_plugins.settings import ExecMode

from torq_gen_config.config import validate_config
from torq_gen_config.core import isolation, layout, run_lock
from torq_gen_config.core.errors import TorqGenConfigError
from torq_gen_config.core.fileio import remove_temporary_files
from torq_gen_config.pipeline import steps
from torq_gen_config.pipeline.context import RunContext
from torq_gen_config.preflight import preflight
from torq_gen_config.pipeline import units
from torq_gen_config.pipeline.steps import untracked
import torq_gen_config.pipeline.steps.full_model
import torq_gen_config.pipeline.steps.layer_tests
import torq_gen_config.pipeline.steps.prepare
import torq_gen_config.pipeline.steps.quantize
import torq_gen_config.pipeline.steps.report
import torq_gen_config.pipeline.steps.report_html
import torq_gen_config.pipeline.steps.split

try:
    config.update(validate_config(config))
    # executors whose device or execution provider this machine lacks (a GPU executor on
    # a CPU machine) are probed here, once per process: they get no jobs (the DAG a dry
    # run shows), and the report names them once instead of one error per layer
    ctx = RunContext.from_config(config)
except TorqGenConfigError as e:
    raise WorkflowError(str(e))

if workflow.exec_mode == ExecMode.DEFAULT:
    # The model and the inputs given for it checked as the command line checks them (one
    # line instead of a failed job; done once per process: the command line checked them).
    # A Snakemake lock that a killed run left on this output directory would make this run
    # refuse ("Directory cannot be locked"); Snakemake checks it after the parse and before
    # any hook, so here: a live run of this model is named, a stale lock removed. Not in a
    # cluster job (exec mode remote/subprocess): the main process that submitted it holds it.
    try:
        preflight(config)
        ctx.check_run_lock(os.getcwd())
    except TorqGenConfigError as e:  # run_lock.RunLocked too
        raise WorkflowError(str(e))
else:
    # A cluster job's process runs no onstart: its in-process work runs in supervised
    # workers (torq_gen_config.core.isolation) that SIGTERM (scancel) must stop at once.
    isolation.reset()
    isolation.install_stop_handlers()


def start_run():
    """The main process's start (onstart; not for dry runs): the run lock (the same OS
    lock as the command line, so both forms exclude each other), the stop handlers, and
    what writers killed mid-write (kill -9) left in the work directory."""
    try:
        run_lock.acquire(ctx.run_lock, what=f"{ctx.out} for {ctx.model_name}")
    except run_lock.RunLocked as e:
        raise WorkflowError(str(e))
    # in-process work runs in supervised workers (torq_gen_config.core.isolation): a new run
    # may start them, and Ctrl-C / SIGTERM stop them and the tools at once (after the
    # scheduler has put its own SIGTERM handler in place)
    isolation.reset()
    isolation.install_stop_handlers()
    if os.path.isdir(ctx.work):  # no writer is alive now
        remove_temporary_files(ctx.work)


get = ctx.inputs(checkpoints, workflow)


def batch_module_output(path):
    """A full-model compile batch's module: temp() unless keep_work is all (rules/full_model.smk)."""
    return path if config["keep_work"] == "all" else temp(path)


wildcard_constraints:
    layer=r"[A-Za-z0-9._-]+",
    batch=r"[0-9]{4}-[0-9a-f]{10}",
    unit=r"[0-9]{4}",
    executor="|".join(re.escape(n) for n in ctx.executors),
    pid=r"[A-Za-z0-9][A-Za-z0-9_.+-]*-[0-9a-f]{12}",
