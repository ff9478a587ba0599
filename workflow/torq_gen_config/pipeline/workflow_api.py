"""Run the Snakemake workflow from Python (the ``torq-gen-config`` commands use this).

The workflow runs with the output directory as Snakemake's working directory, so
each output directory has its own ``.snakemake`` state and lock, and two discoveries
of different models can run at the same time. The Snakemake settings are read from
the workflow profile ``profiles/default/config.yaml`` (what a plain ``snakemake`` run
from the repository root uses): greedy scheduler, jobs as threads, keep going, rerun
incomplete, no "input" rerun trigger (:func:`profile_settings`). The Snakefile and the
profile are the checkout's, or the copy shipped in an installed wheel
(:mod:`torq_gen_config.workflow_files`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import threading
from pathlib import Path

from .. import workflow_files
from ..config import model_name, resolve_model_path
from ..core import isolation, run_lock
from ..core.errors import TorqGenConfigError
from ..core.fileio import atomic_write_text
from ..core.isolation import stop_signal
from ..core.job_support import JOB_FAILURES
from ..core.layout import lock_file
from ..core.lazy import (snakemake_api, snakemake_cli, snakemake_exceptions, snakemake_greedy, snakemake_logging,
                         snakemake_settings, yaml)
from ..core.progress import ProgressDisplay, display_mode
from ..model.subgraph import run_names
from .cluster import is_local, job_failure_lines, read_profile

# the checkout's, or the copy in an installed wheel (torq_gen_config.workflow_files)
SNAKEFILE = workflow_files.snakefile()
PROFILE = workflow_files.default_profile()
#: The profile settings the runner applies (other keys are refused: a setting added to
#: the profile must be applied here too, or the two forms would differ).
PROFILE_KEYS = ("force-use-threads", "scheduler", "keep-going", "rerun-incomplete", "rerun-triggers",
                "printshellcmds", "quiet", "resources")


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (``signum``: SIGINT for Ctrl-C, or SIGTERM)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = int(signum)


class WorkflowFailed(TorqGenConfigError):
    """Snakemake reported failed jobs or could not build the workflow."""


#: set by :func:`run_workflow` and :func:`run_workflow_with_snakemake_args`: the command
#: line runs the workflow in this process and decides its exit status itself
_CALLED_FROM_API = False


def called_from_api() -> bool:
    """Whether the workflow runs under this package's command line (in this process),
    not under Snakemake's own ``snakemake`` command."""
    return _CALLED_FROM_API


def run_workflow(*, config: dict, workdir: str | os.PathLike, cores: int = 2, targets: list[str] | None = None,
                 forcerun: list[str] | None = None, forceall: bool = False, dryrun: bool = False,
                 quiet: bool = False, verbose: bool = False, allowed_rules: list[str] | None = None,
                 lock: tuple[str, str, str] | None = None, resources: dict | None = None,
                 quiet_progress: bool = False, display: str | None = "auto") -> None:
    """Execute the workflow with ``config`` overriding ``config/config.yaml``.

    Args:
        config: config overrides (validated by the Snakefile against the schema).
        workdir: Snakemake working directory (created); relative paths in ``config``
            are resolved against it, so pass absolute paths.
        cores: local cores (jobs run in parallel up to this number).
        targets: target files or rules (default: the report and compiler JSON).
        forcerun: rules or files to rerun even if up to date.
        forceall: rerun every job.
        dryrun: only print what would run.
        quiet: hide Snakemake's per-job rule blocks (progress lines stay).
        verbose: Snakemake debug output.
        allowed_rules: only jobs of these rules may run (default: all); jobs of other
            rules are taken as up to date (``torq-gen-config run`` uses this so that it
            never reruns discovery).
        lock: ``(file name in workdir, what it guards, tool name)`` of the run lock, for the
            CK workflow (default: the discovery lock of the config's model).
        resources: global resources, as ``--resources`` (the CK workflow's ``ck_device``).
        quiet_progress: also hide Snakemake's progress lines (with ``quiet``).
        display: the progress display of a discovery or full-model run
            (:mod:`torq_gen_config.core.progress`): ``"auto"`` (default: live on a terminal,
            lines elsewhere, Snakemake's own output with ``verbose`` or ``dryrun``;
            :func:`progress.display_mode`), ``"live"``, ``"lines"``, or None
            (Snakemake's own output). The CK workflow (``lock`` given) keeps Snakemake's.

    Raises:
        WorkflowFailed: a job failed or the workflow could not be built; the message
            is Snakemake's reason in one line.
        RunLocked: another run holds the lock (the message names it).
    """
    global _CALLED_FROM_API
    _CALLED_FROM_API = True
    absent = workflow_files.missing()
    if absent:
        raise WorkflowFailed(absent)

    workdir = Path(workdir).resolve()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        reason = "it is a file" if workdir.is_file() else (e.strerror or e)
        raise WorkflowFailed(f"cannot use output directory {workdir}: {reason}") from None
    if not os.access(workdir, os.W_OK):
        raise WorkflowFailed(f"cannot use output directory {workdir}: not writable")
    # An OS-level lock per discovery (released by the kernel if this process dies),
    # the same the workflow takes in its onstart handler (torq_gen_config.core.run_lock).
    lock_path = workdir / (lock[0] if lock else _lock_name(config))
    # a run in progress: run_lock.RunLocked (bad input, exit status 2), not a failed workflow
    if lock:
        run_lock.acquire(lock_path, what=lock[1], tool=lock[2])
    else:
        run_lock.acquire(lock_path, what=f"{workdir} for {_report_name(config)}")
    interrupted = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        def on_sigint(signum, frame):  # remember it: Snakemake turns it into a WorkflowError
            if interrupted:  # a second one while stopping: let the stop finish
                return
            interrupted.append(signum)
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        if lock:
            execute(config=config, workdir=workdir, cores=cores, targets=targets, forcerun=forcerun, forceall=forceall,
                    dryrun=dryrun, quiet=quiet, verbose=verbose, allowed_rules=allowed_rules, resources=resources,
                    quiet_progress=quiet_progress)
        else:
            if display == "auto":
                display = display_mode(quiet=quiet, verbose=verbose, dryrun=dryrun)
            what = f"{'full-model run' if allowed_rules else 'discovery'} of {_report_name(config)}"
            _run_locked(config=config, workdir=workdir, cores=cores, targets=targets, forcerun=forcerun,
                        forceall=forceall, dryrun=dryrun, quiet=quiet, verbose=verbose, allowed_rules=allowed_rules,
                        display=display, display_what=what, log_file=config.get("log_file") or None)
    except WorkflowFailed:
        if interrupted or isolation.stop_signal():
            raise Interrupted(interrupted[0] if interrupted else isolation.stop_signal()) from None
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        run_lock.release(lock_path)


def _run_locked(*, config, workdir: Path, cores, targets, forcerun, forceall, dryrun, quiet, verbose,
                allowed_rules=None, display=None, display_what="workflow", log_file=None) -> None:
    # a Snakemake lock left by a killed run is removed when the workflow is parsed
    # (rules/common.smk: run_lock.clear_stale_snakemake_locks)
    JOB_FAILURES.clear()
    execute(config=config, workdir=workdir, cores=cores, targets=targets, forcerun=forcerun, forceall=forceall,
            dryrun=dryrun, quiet=quiet, verbose=verbose, allowed_rules=allowed_rules, failures=JOB_FAILURES,
            display=display, display_what=display_what, log_file=log_file)


def execute(*, config: dict, workdir: Path, cores: int, targets: list[str] | None = None,
            forcerun: list[str] | None = None, forceall: bool = False, dryrun: bool = False, quiet: bool = False,
            verbose: bool = False, allowed_rules: list[str] | None = None, resources: dict | None = None,
            failures: list[str] | None = None, quiet_progress: bool = False, display: str | None = None,
            display_what: str = "workflow", log_file: str | None = None) -> None:
    """One Snakemake run of the repository's Snakefile through its API, with the settings of
    ``profiles/default`` (:func:`profile_settings`; the profile's ``quiet`` choices only
    with ``quiet``). Used by both workflows (discovery and CK profiling).

    Args:
        resources: global resources (``{"ck_device": 1}``), as ``--resources``; over the profile's.
        failures: bad-input messages jobs recorded; the first leads the error message.
        quiet_progress: also hide the progress lines (with ``quiet``).
        display: ``"live"`` or ``"lines"``: a :class:`progress.ProgressDisplay` (titled
            ``display_what``) replaces Snakemake's console handler, and Snakemake's own
            messages go to ``log_file`` (when given) instead; None: Snakemake's output.

    Raises:
        WorkflowFailed: a job failed or the workflow could not be built (one line).
    """
    failures = failures if failures is not None else []
    profile = profile_settings()
    quiet_set = {snakemake_settings.Quietness.parse_choice(q) for q in profile.get("quiet") or []} if quiet else None
    if quiet and quiet_progress:
        quiet_set.add(snakemake_settings.Quietness.PROGRESS)
    try:
        st = snakemake_settings
        with snakemake_api.SnakemakeApi(st.OutputSettings(quiet=quiet_set, dryrun=dryrun, verbose=verbose,
                                                          printshellcmds=bool(profile.get("printshellcmds")),
                                                          show_failed_logs=True)) as api, \
                _progress_display(display, display_what, log_file):
            wf = api.workflow(
                snakefile=SNAKEFILE,
                workdir=workdir,
                resource_settings=st.ResourceSettings(cores=cores,
                                                      resources={**profile["resources"], **(resources or {})}),
                config_settings=st.ConfigSettings(config=config),
            )
            dag = wf.dag(st.DAGSettings(targets=frozenset(targets or []), forcerun=frozenset(forcerun or []),
                                        forceall=forceall, force_incomplete=bool(profile.get("rerun-incomplete")),
                                        allowed_rules=frozenset(allowed_rules or []),
                                        rerun_triggers=frozenset(st.RerunTrigger.parse_choice(t)
                                                                 for t in profile["rerun-triggers"])))
            dag.execute_workflow(
                executor="local",
                pseudo_executor="dryrun" if dryrun else None,
                execution_settings=st.ExecutionSettings(keep_going=bool(profile.get("keep-going")),
                                                        use_threads=bool(profile.get("force-use-threads")),
                                                        ignore_incomplete=False),
                scheduling_settings=st.SchedulingSettings(scheduler=profile["scheduler"]),
                scheduler_settings=snakemake_greedy.SchedulerSettings(),  # required with greedy (docs/toolchain.md)
            )
    except snakemake_exceptions.WorkflowError as e:
        raise WorkflowFailed(_with_job_failures(_one_line(e), failures)) from None
    except Exception as e:  # snakemake raises several exception types for bad workflows
        if type(e).__name__ in ("WorkflowError", "RuleException", "MissingInputException", "IncompleteFilesException",
                                "LockException", "ChildIOException"):
            raise WorkflowFailed(_with_job_failures(_one_line(e), failures)) from None
        raise


def _progress_display(mode: str | None, what: str, log_file: str | None):
    """A context that puts a :class:`progress.ProgressDisplay` in place of Snakemake's
    console handler (Snakemake's log handler hook: handlers on its logger, set up by
    ``SnakemakeApi``), or does nothing for ``mode`` None."""
    if mode is None:
        return contextlib.nullcontext()


    display = ProgressDisplay(mode, what=what, log_file=log_file, stopping=stop_signal)

    @contextlib.contextmanager
    def installed():
        removed = [h for h in snakemake_logging.logger.handlers if h.name == "DefaultStreamHandler"]
        for h in removed:
            snakemake_logging.logger.removeHandler(h)
        snakemake_logging.logger.addHandler(display)
        try:
            with display:
                yield display
        finally:
            snakemake_logging.logger.removeHandler(display)
            for h in removed:
                snakemake_logging.logger.addHandler(h)

    return installed()


def profile_settings(path: str | os.PathLike = PROFILE) -> dict:
    """The workflow profile's settings (``profiles/default/config.yaml``), keyed as there
    (``"rerun-triggers"``: list of str, ``"resources"``: ``{name: int}``, ...).

    Raises:
        WorkflowFailed: the profile is missing, unreadable, or has a key outside
            :data:`PROFILE_KEYS`.
    """
    try:
        settings = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise WorkflowFailed(f"cannot read the workflow profile {path}: {_one_line(e)}") from None
    unknown = sorted(set(settings) - set(PROFILE_KEYS))
    if unknown:
        raise WorkflowFailed(f"{path}: setting(s) {', '.join(unknown)} not applied by torq_gen_config.pipeline.workflow_api "
                             "(add them there, so that both forms of a run use them)")
    resources = {}
    for item in settings.get("resources") or []:
        name, _, value = str(item).partition("=")
        resources[name.strip()] = int(value)
    return {**settings, "resources": resources}


def profile_argv(settings: dict, *, quiet: bool) -> list[str]:
    """The profile's settings (:func:`profile_settings`) as Snakemake command-line flags;
    ``quiet`` adds the profile's ``--quiet`` choices (else none)."""
    argv = []
    for key, value in settings.items():
        if key == "quiet" and not quiet:
            continue
        if key == "resources":
            argv += ["--resources", *(f"{k}={v}" for k, v in value.items())] if value else []
        elif isinstance(value, bool):
            argv += [f"--{key}"] if value else []
        elif isinstance(value, list):
            argv += [f"--{key}", *map(str, value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def _report_name(config: dict) -> str:
    """The report name of a config: the model's stem, plus the subgraph suffix."""
    try:
        return run_names(config).name
    except TorqGenConfigError:  # reported by the workflow itself, with its context
        return model_name(resolve_model_path(config["model"]))


def _lock_name(config: dict) -> str:
    return lock_file(_report_name(config))


def _with_job_failures(message: str, failures: list[str]) -> str:
    """Snakemake's message, led by the first bad-input error a job raised (its
    reason, e.g. the int64 tensor out of int32 range), if any."""
    if not failures:
        return message
    more = f" (+{len(failures) - 1} more failed job(s), see above)" if len(failures) > 1 else ""
    return f"{failures[0]}{more}"


def run_workflow_with_snakemake_args(*, config: dict, workdir: str | os.PathLike, cores: int | None,
                                     extra_args: list[str], quiet: bool = False, forceall: bool = False,
                                     profile: str | os.PathLike | None = None) -> None:
    """Run the workflow through Snakemake's own command-line layer, for extra Snakemake
    arguments given after ``--`` (``torq-gen-config discover ... -- --printshellcmds``)
    and for a profile of the user's (``discover --profile profiles/slurm``).

    The config is written to ``<workdir>/.torq-gen-config.yaml`` and passed with
    ``--configfile``; the profile's settings (:func:`profile_argv`) are passed as flags
    before ``extra_args``, so the user's flags win. With ``profile``, Snakemake reads that
    profile instead of ``profiles/default`` (every key, executor plugin settings included,
    as ``snakemake --profile``); ``cores`` (None: the profile's) is then ``--jobs``, the
    number of jobs submitted at a time, when the profile names a cluster executor.

    Raises:
        WorkflowFailed: Snakemake rejected the arguments or a job failed.
        RunLocked: another run holds the lock (the message names it).
    """
    global _CALLED_FROM_API
    _CALLED_FROM_API = True
    absent = workflow_files.missing()
    if absent:
        raise WorkflowFailed(absent)
    workdir = Path(workdir).resolve()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        reason = "it is a file" if workdir.is_file() else (e.strerror or e)
        raise WorkflowFailed(f"cannot use output directory {workdir}: {reason}") from None
    cfg_path = workdir / ".torq-gen-config.yaml"
    atomic_write_text(cfg_path, yaml.safe_dump(config, sort_keys=False))
    # --cores last: the profile's list-valued flags (--resources, --quiet) take any number
    # of values and would swallow a target given after `--`
    argv = ["--snakefile", str(SNAKEFILE), "--directory", str(workdir), "--configfile", str(cfg_path)]
    if profile is None:
        argv += [*profile_argv(profile_settings(), quiet=quiet), "--cores", str(cores or os.cpu_count() or 1)]
    else:
        settings = read_profile(profile)
        local = is_local(str(settings.get("executor") or "local"))
        argv += ["--profile", str(Path(profile).expanduser().resolve()), "--workflow-profile", "none"]
        if cores is not None:
            argv += ["--cores" if local else "--jobs", str(cores)]
        elif local and "cores" not in settings:
            argv += ["--cores", str(os.cpu_count() or 1)]
    if forceall:
        argv.append("--forceall")

    lock_path = workdir / _lock_name(config)
    run_lock.acquire(lock_path, what=f"{workdir} for {_report_name(config)}")  # RunLocked: exit status 2
    try:
        given = (f"the settings of --profile {profile}" if profile is not None and not extra_args else
                 f"the arguments after --: {' '.join(extra_args)}" if profile is None else
                 f"the settings of --profile {profile} or the arguments after --: {' '.join(extra_args)}")
        usage = io.StringIO()
        try:
            with contextlib.redirect_stderr(usage):  # argparse prints its whole usage, then the reason
                parser, args = snakemake_cli.parse_args(argv + list(extra_args))
        except SystemExit:
            reason = next((ln.split("error: ", 1)[1] for ln in reversed(usage.getvalue().splitlines())
                           if "error: " in ln), "see snakemake --help")
            raise WorkflowFailed(f"Snakemake rejected {given}: {reason}") from None
        except Exception as e:  # Snakemake's own checks of the values (e.g. a malformed --resources)
            raise WorkflowFailed(f"Snakemake rejected {given}: {_one_line(e)}") from None

        try:
            with job_failure_lines():  # a failed job in one line (the profile's quiet hides Snakemake's block)
                ok = snakemake_cli.args_to_api(args, parser)
        except Exception as e:
            raise WorkflowFailed(_one_line(e)) from None
        if not ok:
            raise WorkflowFailed("Snakemake reported a failure (see its messages above)")
    finally:
        run_lock.release(lock_path)


def _one_line(e: BaseException) -> str:
    """Snakemake's error as one line: its first lines, without its framing ("Error:",
    "WorkflowError: ", the "Wildcards:" block that follows an input function's error)."""
    lines = []
    for ln in str(e).strip().splitlines():
        ln = ln.strip()
        if ln.startswith("Wildcards:"):
            break
        ln = re.sub(r"^(Error|WorkflowError|RuleException|InputFunctionException):\s*", "", ln)
        if ln:
            lines.append(ln)
    return " ".join(lines[:3])[:500] if lines else type(e).__name__
