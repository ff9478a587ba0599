"""ONNX Runtime sessions: the options of an onnxruntime executor, the workflow's
reference session (CPU, optimizations off), runs that return any dtype, and the log
lines of the onnxruntime backend. onnxruntime is imported only inside the functions.
Sessions on the tool's model files are opened with
:func:`~torq_gen_config.core.external_data.open_session` (their weights in the store, their
dims left symbolic where ONNX Runtime refuses them fixed)."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping

from ..core import ort_io
from ..core.errors import ConfigError
from ..core.lazy import difflib, ort
from ..core.logs import append_record
from ..core.external_data import open_session
from ..core.tools import bounded_message
from .base import StageError, check_options
from .timing import runtime_stats

if TYPE_CHECKING:  # pragma: no cover
    import onnxruntime

#: option value -> name of the ``onnxruntime.GraphOptimizationLevel`` member
OPT_LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}

_OPTIONS = {
    "providers": list,
    "graph_optimization_level": str,
    "intra_op_num_threads": int,
}


def ort_version() -> str:
    """The version of the installed onnxruntime (e.g. ``"1.32.0"``).

    Raises:
        ImportError: onnxruntime is not installed.
    """
    return ort.__version__


def ort_reference_session(onnx_path: str | os.PathLike, intra_op_num_threads: int = 1) -> "onnxruntime.InferenceSession":
    """The reference engine: an onnxruntime CPU session with ALL graph optimisations disabled.

    Disabling the optimisations (``ORT_DISABLE_ALL``) keeps every node as written
    (no fusion, no constant folding, no layout change), so the reference computes
    the ONNX semantics node by node.

    Args:
        onnx_path: the ONNX model (a layer or a whole model).
        intra_op_num_threads: threads inside one operator (default 1: deterministic
            reductions; 0 lets onnxruntime choose).

    Returns:
        An ``onnxruntime.InferenceSession`` on ``CPUExecutionProvider``.

    Raises:
        FileNotFoundError: ``onnx_path`` does not exist.
        onnxruntime's exceptions (``...onnxruntime_pybind11_state.Fail``, ``InvalidGraph``,
            ``NotImplemented``, ...): the model cannot be loaded, e.g. an operator or
            type that the CPU provider does not implement.
    """
    if not os.path.isfile(onnx_path):
        raise FileNotFoundError(f"ONNX model not found: {onnx_path}")

    def options():
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = int(intra_op_num_threads)
        so.log_severity_level = 4  # failures come back as exceptions; no stderr noise
        return so

    # a layer model's weights are in the work directory's store; its dims free if need be
    return open_session(onnx_path, options, ["CPUExecutionProvider"])[0]



def _run_session(session, fetch: list[str], feed: dict, run_options) -> list:
    """``session.run``, or ``run_with_ort_values`` when a fetched output has a type that
    ``session.run`` cannot return (bfloat16, float8, int4, ...): :func:`torq_gen_config.core.ort_io.run`;
    such outputs come back as ml_dtypes arrays."""
    return ort_io.run(session, fetch, feed, run_options)


def _check_provider_names(name: str, provider_names: list[str]) -> None:
    """A provider name onnxruntime does not know at all (``get_all_providers()``: every
    provider of any build) is a misspelling, a config error, not an unavailable executor.
    onnxruntime is imported only when a name other than CPUExecutionProvider is given."""
    others = [n for n in provider_names if n != "CPUExecutionProvider"]
    if not others:
        return


    known = ort.get_all_providers()
    for n in others:
        if n not in known:
            close = difflib.get_close_matches(n, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else f" (known: {', '.join(known)})"
            raise ConfigError(f"executor {name!r}: onnxruntime knows no execution provider {n!r}{hint}")


def parse_ort_options(name: str, options: Mapping[str, Any]) -> tuple[list, str, int]:
    """Validate an onnxruntime executor's options (imports onnxruntime only to check a
    provider name other than CPUExecutionProvider).

    Returns:
        ``(providers, graph_optimization_level, intra_op_num_threads)``: providers as
        names or ``(name, {options})`` pairs (default ``["CPUExecutionProvider"]``),
        a key of :data:`OPT_LEVELS` (default ``"all"``), threads >= 0 (default 1).

    Raises:
        ConfigError: unknown option, wrong type, unknown optimisation level,
            malformed provider entry, a provider name onnxruntime does not know, or a
            negative thread count.
    """
    check_options(name, options, _OPTIONS)
    providers = options.get("providers")
    if providers is None:
        providers = ["CPUExecutionProvider"]
    if not providers:
        raise ConfigError(f"executor {name!r}: option 'providers' must not be empty")
    parsed: list[str | tuple[str, dict]] = []
    for p in providers:
        if isinstance(p, str) and p:
            parsed.append(p)
        elif (
            isinstance(p, (list, tuple))
            and len(p) == 2
            and isinstance(p[0], str)
            and p[0]
            and isinstance(p[1], dict)
        ):
            parsed.append((p[0], dict(p[1])))
        else:
            raise ConfigError(
                f"executor {name!r}: each entry of 'providers' must be a provider name or "
                f"[name, {{options}}], got {p!r}"
            )
    _check_provider_names(name, [p if isinstance(p, str) else p[0] for p in parsed])
    level = options.get("graph_optimization_level") or "all"
    if level not in OPT_LEVELS:
        raise ConfigError(
            f"executor {name!r}: graph_optimization_level must be one of {', '.join(OPT_LEVELS)}, got {level!r}"
        )
    threads = options.get("intra_op_num_threads")
    threads = 1 if threads is None else threads
    if threads < 0:
        raise ConfigError(f"executor {name!r}: intra_op_num_threads must be >= 0, got {threads}")
    return parsed, level, threads


def time_session_runs(session, fetch: list[str], feed: dict, *, runs: int, warmup: int, timeout_s: float,
                      log_path: str | os.PathLike | None, label: str) -> dict:
    """Runtime of ``session``: ``warmup`` untimed ``session.run`` calls, then ``runs``
    calls each timed with ``time.perf_counter`` (milliseconds), all with ``feed``,
    fetching ``fetch``. A ``threading.Timer`` sets ``RunOptions.terminate`` when the
    whole measurement passes ``timeout_s`` seconds (onnxruntime checks it between nodes).
    ``label`` starts the records appended to ``log_path``.

    Returns:
        :func:`~torq_gen_config.backends.timing.runtime_stats` of the samples.

    Raises:
        StageError: ``"timeout"`` (``during="run"``) or ``"run"`` (onnxruntime error).
    """
    run_options = ort.RunOptions()
    fired = threading.Event()

    def _terminate() -> None:
        fired.set()
        run_options.terminate = True

    samples: list[float] = []
    timer = threading.Timer(timeout_s, _terminate)
    timer.daemon = True
    start = time.perf_counter()
    timer.start()
    try:
        for _ in range(warmup):
            _run_session(session, fetch, feed, run_options)
        for _ in range(runs):
            t0 = time.perf_counter()
            _run_session(session, fetch, feed, run_options)
            samples.append((time.perf_counter() - t0) * 1000.0)
            if fired.is_set():
                break
    except Exception as e:  # onnxruntime raises its own pybind exception types
        if not fired.is_set():
            msg = bounded_message(f"{type(e).__name__}: {e}")
            append_record(log_path, f"{label}\n--- FAILED (run)\n{msg}")
            raise StageError("run", msg) from None
    finally:
        timer.cancel()
    wall_ms = (time.perf_counter() - start) * 1000.0
    if fired.is_set():
        msg = (f"onnxruntime benchmark ({warmup} warm-up + {runs} timed runs) exceeded the {timeout_s:g} s limit "
               f"after {wall_ms / 1000.0:.3g} s and {len(samples)} timed run(s)")
        append_record(log_path, f"{label}\n--- TIMED OUT\n{msg}")
        raise StageError("timeout", msg, during="run")
    method = (f"onnxruntime in-process: time.perf_counter around each session.run ({', '.join(session.get_providers())}); "
              f"{warmup} untimed warm-up run(s) first; excludes session creation")
    stats = runtime_stats(samples, warmup=warmup, method=method)
    append_record(log_path, f"{label}\n--- ok; {warmup} warm-up + "
                            f"{runs} timed runs in {wall_ms:.1f} ms; median {stats['median_ms']} ms, "
                            f"min {stats['min_ms']} ms")
    return stats


def missing_providers(provider_names: list[str]) -> str | None:
    """What of ``provider_names`` (execution provider names) the installed onnxruntime
    lacks, as one line (``onnxruntime 1.32.0 has no execution provider
    CUDAExecutionProvider (available: ...)``), or None when it has them all."""
    available = ort.get_available_providers()
    missing = [n for n in provider_names if n not in available]
    if not missing:
        return None
    return (f"onnxruntime {ort.__version__} has no execution provider {', '.join(missing)} "
            f"(available: {', '.join(available)})")
