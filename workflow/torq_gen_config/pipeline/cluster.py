"""Cluster execution through a Snakemake executor plugin (``profiles/slurm``): the checks
before ``torq-gen-config discover --profile DIR``.

A cluster profile is a Snakemake profile with an ``executor`` key; Snakemake and the
plugin do the submitting. What is left to us: a missing plugin or an unreachable SLURM
controller is a one-line error before Snakemake starts (the slurm plugin runs
``scontrol show config`` when it is imported, which waits ~9 s for a controller that
does not answer, and submitting then fails); and a local run does not pay for that
call when the plugin is installed (:func:`import_slurm_plugin_without_probe`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from ..core.errors import ConfigError
from ..core.lazy import snakemake_logger_plugins, yaml
from ..core.progress import short_error, unit_label

#: What to install for an executor, when its plugin is missing.
INSTALL_HINT = "pip install -e '.[cluster]'"
#: Seconds `scontrol ping` may take (it answers in milliseconds, also when the controller is down).
PING_TIMEOUT_S = 10
LOCAL_EXECUTORS = ("local", "dryrun", "touch")


def profile_file(profile: str | os.PathLike) -> Path:
    """The settings file of the Snakemake profile directory ``profile`` (``config.yaml``
    or ``profile.yaml``, as Snakemake looks for them).

    Raises:
        ConfigError: no such directory, or no settings file in it.
    """
    d = Path(profile).expanduser()
    if not d.is_dir():
        raise ConfigError(f"--profile {profile}: no such profile directory")
    for name in ("profile.yaml", "config.yaml"):
        if (d / name).is_file():
            return d / name
    raise ConfigError(f"--profile {profile}: no profile.yaml or config.yaml in it")


def read_profile(profile: str | os.PathLike) -> dict:
    """The settings of a Snakemake profile directory, keyed as in its file.

    Raises:
        ConfigError: the profile is missing, not YAML, or not a mapping.
    """
    path = profile_file(profile)
    try:
        settings = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"--profile {profile}: cannot read {path.name}: {str(e).splitlines()[0]}") from None
    if not isinstance(settings, dict):
        raise ConfigError(f"--profile {profile}: {path.name} is not a mapping of settings")
    return settings


def is_local(executor: str) -> bool:
    """Whether Snakemake runs the jobs of ``executor`` on this machine."""
    return executor in LOCAL_EXECUTORS


def profile_executor(profile: str | os.PathLike) -> str:
    """The ``executor`` a profile names (``local`` when it names none).

    Raises:
        ConfigError: the profile is missing or unreadable.
    """
    return str(read_profile(profile).get("executor") or "local")


def check_profile(profile: str | os.PathLike) -> str:
    """Check that a run with ``profile`` can start: its executor plugin is installed and,
    for ``slurm``, a SLURM controller answers. Returns the executor name.

    Raises:
        ConfigError: one line saying what is missing.
    """
    executor = profile_executor(profile)
    if is_local(executor):
        return executor
    module = "snakemake_executor_plugin_" + executor.replace("-", "_")
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"--profile {profile}: executor {executor!r} needs snakemake-executor-plugin-{executor}, "
                          f"which is not installed ({INSTALL_HINT if executor == 'slurm' else 'pip install it'})")
    if executor == "slurm":
        reason = slurm_controller_problem()
        if reason:
            raise ConfigError(f"--profile {profile}: {reason}")
    return executor


#: The slurm executor plugin's module; importing it runs ``scontrol show config``
#: (:func:`import_slurm_plugin_without_probe`).
SLURM_PLUGIN = "snakemake_executor_plugin_slurm"
#: What ``SLURM_CONF`` names while the plugin is imported for a local run: an empty file, so
#: ``scontrol`` stops at once ("Unable to process configuration file") instead of asking a
#: controller. (Not a missing file: SLURM 22.05 then looks for a configless controller,
#: measured 59 s here.)
NO_SLURM_CONF = os.devnull


def import_slurm_plugin_without_probe() -> bool:
    """Import the slurm executor plugin, when it is installed and not imported yet, with
    ``SLURM_CONF`` naming an empty file (:data:`NO_SLURM_CONF`); returns whether it was
    imported here.

    Snakemake imports every installed executor plugin when a run starts (to find the one
    it needs), and this plugin runs ``scontrol show config`` at import, for the help text
    of its ``--slurm-status-command`` option (the MinJobAge it reports). Where a
    slurm.conf names a controller that does not answer (a login node's client set up
    for a cluster that is down, or daemons stopped on a test host), that call waits
    ~9 s before it gives up: 9 s at every local ``discover`` that used no cluster at all.
    Imported this way, the call fails in milliseconds. Nothing else is lost: the plugin
    asks SLURM again at run time (the status command's default when its executor is
    used, MinJobAge at every status check), so only that help text differs, which no
    torq-gen-config command shows. For local runs only (no profile, or a profile whose
    executor is local): a cluster run keeps the plugin's own import.
    """
    if SLURM_PLUGIN in sys.modules or importlib.util.find_spec(SLURM_PLUGIN) is None:
        return False
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = NO_SLURM_CONF
    try:
        importlib.import_module(SLURM_PLUGIN)
    except Exception:  # a broken plugin: Snakemake's own import of it reports the error
        return False
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
    return True


def slurm_controller_problem() -> str | None:
    """Why no job can be submitted to SLURM from here (no ``scontrol``/``sbatch``, no
    configuration, or the controller does not answer ``scontrol ping``), else None."""
    for tool in ("sbatch", "squeue", "scontrol"):
        if shutil.which(tool) is None:
            return f"SLURM's {tool} is not on PATH (run on a SLURM login node, or install the SLURM client)"
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=PING_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no SLURM controller answered `scontrol ping` within {PING_TIMEOUT_S} s"
    text = " ".join((r.stdout + r.stderr).split())
    if r.returncode != 0 or " is UP" not in r.stdout:
        return f"no SLURM controller answers (`scontrol ping`: {text[:200] or f'exit status {r.returncode}'})"
    return None


#: The slurm executor plugin's line for a submission: ``Job 7 has been submitted with SLURM
#: jobid 4 (log: .../.snakemake/slurm_logs/rule_test_unit/0000_vmvx/4.log).``
SUBMITTED_RE = re.compile(r"^Job (?P<job>\d+) has been submitted with SLURM jobid (?P<slurm>[\w.]+)"
                          r"(?: \(log: (?P<log>[^)]+)\))?")
#: SLURM's reasons of a pending job that only wait for their turn (anything else, e.g. a
#: drained or down node, a held job, is said once: :class:`JobFailureLines`).
SLURM_ROUTINE_REASONS = ("None", "Resources", "Priority", "BeginTime", "Dependency", "")
#: Seconds between two looks at the submitted jobs that are still pending.
PENDING_CHECK_S = 15.0


class JobFailureLines(logging.Handler):
    """One line per failed job for a run through Snakemake's command-line layer
    (``discover --profile profiles/slurm``, or Snakemake arguments after ``--``), where
    no :class:`ProgressDisplay` runs and the profile's ``quiet: [rules]`` keeps Snakemake's
    error block off the console: the line of :func:`progress.short_error` (the rule, the unit and its
    layers, the SLURM job id and state, the log).

    And while SLURM jobs of the run wait for a reason other than their turn (a drained or
    down node, a held job: squeue's reason, every :data:`PENDING_CHECK_S` s), one line per
    job saying so: ``waiting: SLURM job 61 (rule test_unit, unit 0002 on vmvx (layers ...))
    pending: ReqNodeNotAvail ...``. The jobs are those the slurm plugin reported submitted.

    Put on the ``snakemake`` logger (:func:`job_failure_lines`): Snakemake replaces the
    handlers of its own logger (``snakemake.logging``) when a run starts, and its records
    reach the parent's handlers whatever its console filter drops.
    """

    def __init__(self, stream=None, *, check_s: float = PENDING_CHECK_S):
        super().__init__(level=logging.INFO)
        self.stream = stream if stream is not None else sys.stderr
        self.check_s = check_s
        self.jobs: dict[int, dict] = {}  # Snakemake job id -> rule, input, output
        self.submitted: dict[str, int] = {}  # SLURM job id -> Snakemake job id
        self.said_waiting: set[str] = set()
        self.finished: set[str] = set()
        self._print_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._emit(record)
        except Exception:  # pragma: no cover - logging must not fail the workflow
            self.handleError(record)

    def _emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event == snakemake_logger_plugins.LogEvent.JOB_INFO:
            self.jobs[record.jobid] = {"rule": record.rule_name, "input": list(record.input or []),
                                       "output": list(record.output or [])}
        elif event == snakemake_logger_plugins.LogEvent.JOB_ERROR:
            external = (getattr(record, "aux", None) or {}).get("external_jobid")
            if external:
                self.finished.add(str(external))
            self.line(short_error(record))
        elif event == snakemake_logger_plugins.LogEvent.JOB_FINISHED:
            pass
        elif record.levelno == logging.INFO and isinstance(record.msg, str):
            m = SUBMITTED_RE.match(record.msg)
            if m:
                self.submitted[m["slurm"]] = int(m["job"])
                self._watch()

    def line(self, text: str) -> None:
        with self._print_lock:
            self.stream.write(text.rstrip("\n") + "\n")
            self.stream.flush()

    def label(self, slurm_id: str) -> str:
        """``rule test_unit, unit 0002 on vmvx (layers A .. B (32))`` for a submitted job."""
        job = self.jobs.get(self.submitted.get(slurm_id, -1))
        if job is None:
            return "a job of this run"
        unit = unit_label(job["output"])
        return f"rule {job['rule']}, " + (unit or (f"for {job['output'][0]}" if job["output"] else ""))

    # ---- the pending jobs
    def _watch(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_loop, daemon=True, name="torq-gen-config-squeue")
            self._watcher.start()

    def _watch_loop(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.check_pending()
            except Exception:  # squeue missing or odd: nothing to say, the run goes on
                pass

    def check_pending(self, squeue=None) -> None:
        """Look at the submitted jobs once: a job pending for another reason than its turn
        gets its line (once). ``squeue(ids)``: ``[(id, state, reason)]`` (tests)."""
        ids = [i for i in self.submitted if i not in self.finished and i not in self.said_waiting]
        if not ids:
            return
        for job_id, state, reason in (squeue or _squeue)(ids):
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                self.finished.add(job_id)
            elif state == "PENDING" and reason.split(",")[0].strip() not in SLURM_ROUTINE_REASONS \
                    and job_id not in self.said_waiting:
                self.said_waiting.add(job_id)
                self.line(f"waiting: SLURM job {job_id} ({self.label(job_id)}) is pending: {reason}"
                          + _node_states_text())

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        super().close()


def _squeue(ids: list[str]) -> list[tuple[str, str, str]]:
    """``squeue``'s (job id, state, reason) of ``ids`` (jobs it no longer knows are left out)."""
    r = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i|%T|%r", "--jobs", ",".join(ids)],
                       capture_output=True, text=True, timeout=30)
    rows = []
    for ln in r.stdout.splitlines():
        parts = ln.strip().split("|", 2)
        if len(parts) == 3:
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def _node_states_text() -> str:
    """``; node(s) drained: localhost (reason: maintenance)`` for the nodes SLURM does not
    give jobs now (drained, down, failing), else ``""``."""
    try:
        r = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N|%t|%E"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    off: dict[str, list[str]] = {}
    for ln in r.stdout.splitlines():
        parts = ln.strip().split("|", 2)
        if len(parts) == 3 and parts[1].rstrip("*~#!%$@^-").lower() in ("drain", "drng", "drained", "down", "fail",
                                                                         "failg", "maint", "resv", "inval"):
            why = f" (reason: {parts[2]})" if parts[2] and parts[2] != "none" else ""
            off.setdefault(parts[1].rstrip("*~#!%$@^-"), []).append(parts[0] + why)
    return "".join(f"; node(s) {state}: {', '.join(sorted(set(nodes)))}" for state, nodes in sorted(off.items()))


def job_failure_lines(stream=None):
    """A context in which a :class:`JobFailureLines` is on the ``snakemake`` logger (Snakemake's
    command-line runs: ``workflow_api.run_workflow_with_snakemake_args``)."""
    @contextlib.contextmanager
    def installed():
        handler = JobFailureLines(stream)
        parent = logging.getLogger("snakemake")
        parent.addHandler(handler)
        try:
            yield handler
        finally:
            parent.removeHandler(handler)
            handler.close()

    return installed()
