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

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from .errors import ConfigError

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
    import yaml

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
    import sys

    if SLURM_PLUGIN in sys.modules or importlib.util.find_spec(SLURM_PLUGIN) is None:
        return False
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = NO_SLURM_CONF
    try:
        importlib.import_module(SLURM_PLUGIN)
    except Exception:  # a broken plugin: Snakemake reports it at its own import, as before
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
