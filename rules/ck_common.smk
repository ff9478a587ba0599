# Settings, paths and input functions of the CK workflow (rules/ck_profiler.smk); the logic
# is in torq_gen_config.ck (steps: the job bodies).
import os

from snakemake.exceptions import WorkflowError

from torq_gen_config.core import isolation, run_lock
from torq_gen_config.ck import steps as ck_steps
from torq_gen_config.core.errors import TorqGenConfigError

try:
    CK = ck_steps.settings(config)
except TorqGenConfigError as e:
    raise WorkflowError(str(e))
isolation.reset()
isolation.install_stop_handlers()  # Ctrl-C / SIGTERM kill the running profilers at once
CK_OUT = os.path.normpath(CK["ck_output_dir"])
CK_CONFIGS = CK["ck_configs"] or os.path.join(CK_OUT, ck_steps.CONFIGS_FILE)
CK_LOCK = os.path.join(CK_OUT, ck_steps.LOCK_FILE)
if os.path.isdir(CK_OUT):
    try:
        run_lock.check_free(CK_LOCK, what=f"{CK_OUT} (CK profiling)", tool="ck-profile")
    except run_lock.RunLocked as e:
        raise WorkflowError(str(e))
    run_lock.clear_stale_snakemake_locks(os.getcwd(), CK_OUT)


def ck_profiler_param(wildcards):
    try:
        return ck_steps.resolve_profiler(CK["ck_backend"], CK["ck_profiler_path"])
    except TorqGenConfigError as e:
        raise WorkflowError(str(e))


def ck_result_files(wildcards):
    manifest = checkpoints.ck_select.get().output.manifest
    return [os.path.join(CK_OUT, "runs", cid, "result.json") for cid in ck_steps.run_ids(manifest)]


onstart:
    try:
        run_lock.acquire(CK_LOCK, what=f"{CK_OUT} (CK profiling)", tool="ck-profile")
    except run_lock.RunLocked as e:
        raise WorkflowError(str(e))
    isolation.install_stop_handlers()


onsuccess:
    run_lock.release(CK_LOCK)


onerror:
    run_lock.release(CK_LOCK)
