"""One configuration on one backend -> one result record.

Backends (:data:`BACKENDS`): ``ckprofiler``, the real program (located by
:func:`locate_profiler`), and ``onnxruntime``, the cross-check that times the same
convolution here (:mod:`.ort_timing`, run as a subprocess so that the same timeout and
crash handling apply). Both print ckProfiler's output format, parsed by
:mod:`.profiler_output`; the result record is the seed's (operation, description,
priority_rank, success, returncode, elapsed_time, command, error, stdout) plus the parsed
figures.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys

from ..core.errors import TorqGenConfigError
from ..core.tools import bounded_message, first_error_line, run_tool
from . import profiler_args as pa
from . import profiler_output
from .convert import describe

BINARY = "ckProfiler"
ENV_VAR = "CK_PROFILER"
#: The seed's default --profiler-path.
DEFAULT_PROFILER_PATH = "./build/bin"
BACKENDS = ("ckprofiler", "onnxruntime")
#: Seconds for the help probe of a build (it prints and exits before any GPU work).
PROBE_TIMEOUT_S = 60.0
#: Characters of stdout kept in the results JSON (the whole text is in the per-config log).
STDOUT_TAIL = 4000


class ProfilerNotFound(TorqGenConfigError):
    """No ckProfiler executable where it was looked for; the message lists the places."""


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def locate_profiler(profiler_path: str | os.PathLike | None = None) -> str:
    """The absolute path of ``ckProfiler``: in ``profiler_path`` (a directory, or the binary
    itself; default ``./build/bin``, the seed's), else ``$CK_PROFILER`` (the binary or its
    directory), else on ``PATH``.

    Raises:
        ProfilerNotFound: none of them has it; the message says where it looked.
    """
    looked = []
    for label, place in (("--profiler-path", os.fspath(profiler_path) if profiler_path else DEFAULT_PROFILER_PATH),
                         (f"${ENV_VAR}", os.environ.get(ENV_VAR, ""))):
        if not place:
            looked.append(f"{label} (not set)")
            continue
        candidate = os.path.join(place, BINARY) if os.path.isdir(place) or not os.path.exists(place) else place
        if _executable(candidate):
            return os.path.abspath(candidate)
        looked.append(f"{label}: {candidate} ({'not executable' if os.path.exists(candidate) else 'no such file'})")
    found = shutil.which(BINARY)
    if found:
        return os.path.abspath(found)
    looked.append("PATH")
    raise ProfilerNotFound(f"{BINARY} not found; looked in " + "; ".join(looked)
                           + ". Build CK's profiler (make ckProfiler in its build directory) and pass --profiler-path "
                             "(ck_profiler_path= in the Snakemake form), or use the onnxruntime backend to time the "
                             "convolutions on this machine")


def fingerprint(binary: str) -> dict:
    """Path, size and mtime of the binary: a rebuilt profiler reruns the measurements."""
    st = os.stat(binary)
    return {"path": binary, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def probe_build(binary: str) -> dict:
    """What this build's command line accepts: does ``grouped_conv_bwd_data`` take split_k
    (its help mentions split-K only in builds from 2025 on)? A probe that fails assumes the
    newer form and says so.

    Returns:
        ``{"bwd_data_split_k": bool, "note": str | None}``.
    """
    try:
        res = run_tool([binary, pa.BWD_DATA], timeout_s=PROBE_TIMEOUT_S)
    except OSError as e:
        return {"bwd_data_split_k": True, "note": f"help probe failed ({e}); assumed a build with split_k"}
    if res.timed_out or res.crashed:
        return {"bwd_data_split_k": True, "note": f"help probe {res.describe_failure()}; assumed a build with split_k"}
    return {"bwd_data_split_k": "split" in (res.stdout + res.stderr).lower(), "note": None}


def backend_command(config: dict, backend: str, binary: str | None, build: dict | None) -> tuple[list[str], list[str]]:
    """The command line that runs ``config`` and the notes on how it was fitted.

    Raises:
        ConfigFormatError: the arguments do not fit the real program's count rule.
    """
    args, notes = pa.command_args(config, bwd_data_split_k=(build or {}).get("bwd_data_split_k", True))
    if backend == "ckprofiler":
        return [binary, *args], notes
    pa.problem_of_config(config, strict=True)  # the cross-check knows fp32/fp16/bf16 and the layouts above
    payload = json.dumps({k: config[k] for k in ("operation_type", "profiler_args")}, separators=(",", ":"))
    return [sys.executable, "-m", "torq_gen_config.ck.ort_timing", "--config-json", payload], notes


def run_config(config: dict, *, backend: str, binary: str | None, timeout_s: float,
               log_path: str | os.PathLike | None = None, build: dict | None = None) -> dict:
    """Run one normalized configuration and return its result record.

    Args:
        config: a configuration from :func:`profiler_args.normalize_config`.
        backend: one of :data:`BACKENDS`.
        binary: the ckProfiler path (``ckprofiler`` backend).
        timeout_s: wall-clock limit of the run in seconds; past it the process group is killed.
        log_path: the run's full stdout/stderr are appended there.
        build: :func:`probe_build`'s answer for ``binary``.

    Returns:
        The record (see docs/ck_profile.md, "Results"): ``status`` is ``success``, ``failed``,
        ``timeout``, ``crash`` or ``skipped`` (refused before running); ``success`` is true
        only for a run with a named best instance and a positive time.
    """
    if backend not in BACKENDS:
        raise TorqGenConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    op = config["operation_type"]
    record = {"operation": op, "config_id": pa.config_id(config), "backend": backend,
              "description": config["metadata"].get("description") or describe(op, pa.problem_of_config(config)),
              "priority_rank": config["metadata"].get("priority_rank"), "success": False, "status": "failed",
              "returncode": None, "signal": None, "elapsed_time": 0.0, "command": None, "error": None,
              "notes": list(config.get("notes") or []) + ([build["note"]] if (build or {}).get("note") else []),
              "stdout": "",
              "best": None, "instances": [], "valids": None, "avg_time_ms": None, "tflops": None, "gb_per_s": None}
    try:
        argv, notes = backend_command(config, backend, binary, build)
    except pa.ConfigFormatError as e:
        record.update(status="skipped", error=f"not run on {backend}: {e}")
        return record
    record["notes"] += notes
    record["command"] = shlex.join(argv)
    res = run_tool(argv, timeout_s=timeout_s, log_path=log_path)
    parsed = profiler_output.parse(res.stdout)
    record.update(returncode=res.returncode, signal=res.signal_name, elapsed_time=round(res.wall_ms / 1000.0, 3),
                  stdout=profiler_output.tail_with_best(res.stdout, STDOUT_TAIL),
                  instances=[vars(i) for i in parsed.instances], valids=parsed.valids,
                  best=vars(parsed.best) if parsed.best else None)
    if res.timed_out:
        record.update(status="timeout", error=f"timed out after {timeout_s:g} s (process group killed)")
    elif res.crashed:
        detail = first_error_line(res.stderr) if res.stderr.strip() else ""
        record.update(status="crash", error=f"crashed: killed by {res.signal_name}" + (f": {detail}" if detail else ""))
    elif res.returncode != 0:  # the reason is on stderr when there is one (stdout holds progress)
        text = res.stderr.strip() or profiler_output.strip_ansi(res.stdout).strip()
        record.update(error=f"exit status {res.returncode}: " + (bounded_message(first_error_line(text), 500) or "no output"))
    else:
        why = profiler_output.judge(parsed)
        if why:
            record.update(error=why)
        else:
            b = parsed.best
            record.update(success=True, status="success", avg_time_ms=b.avg_time_ms, tflops=b.tflops, gb_per_s=b.gb_per_s)
    return record
