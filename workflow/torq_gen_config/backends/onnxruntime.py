"""onnxruntime backend: run a layer's ONNX in-process with an ``InferenceSession``.

Executor options (all optional):

``providers`` (list, default ``["CPUExecutionProvider"]``)
    Execution providers in priority order. Each item is a provider name or a
    ``[name, {provider options}]`` pair, e.g. ``["CUDAExecutionProvider", {"device_id": 0}]``.
    A provider that this onnxruntime build does not have, or that fails to
    initialise (onnxruntime then silently falls back to the CPU), makes the session
    step fail instead of measuring the wrong executor.
``graph_optimization_level`` (str, default ``"all"``)
    ``"all"``, ``"extended"``, ``"basic"`` or ``"disabled"`` (also ``"layout"``
    where the installed onnxruntime has ``ORT_ENABLE_LAYOUT``).
``intra_op_num_threads`` (int, default 1)
    Threads inside one operator; 0 lets onnxruntime choose.

"Compile" is the creation of the ``InferenceSession`` (its time is ``compile_ms``; a
failure is stage ``session``, not ``compile``); the layer model's dims are left symbolic
where ONNX Runtime refuses them fixed (:func:`~torq_gen_config.core.external_data.open_session`: an ``If``
branch that is never taken may not type-check once they are fixed); the session is kept in
``CompiledArtifact.handle`` and reused by :meth:`OnnxRuntimeBackend.run` and
:meth:`OnnxRuntimeBackend.benchmark` (timing: ``session.run`` calls timed with
``time.perf_counter`` in this process, after untimed warm-up runs).

This module also provides the reference engine of the workflow:
:func:`ort_reference_session` (CPU, all graph optimisations disabled) and
:func:`ort_version`. onnxruntime is imported only inside the functions.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..core import ort_io
from ..core.external_data import open_session
from ..core.isolation import WorkerCrash, WorkerTimeout, run_isolated, run_isolated_each
from ..core.lazy import np, ort
from ..core.logs import append_record
from ..core.tools import bounded_message
from .base import Backend, CompiledArtifact, StageError, check_inputs
from .timing import check_timing_args
from .ort_session import (
    OPT_LEVELS,
    _run_session,
    missing_providers,
    parse_ort_options,
    time_session_runs,
)
from ..core.limits import call_limit


__all__ = ["OnnxRuntimeBackend"]


class OnnxRuntimeBackend(Backend):
    """Executor backed by an in-process onnxruntime ``InferenceSession`` (see module doc)."""

    kind = "onnxruntime"
    needs_mlir = False
    packages = ("onnxruntime",)

    def __init__(self, name: str, options: dict | None):
        """Validate the options (onnxruntime is imported only for a non-CPU provider name).

        Raises:
            ConfigError: unknown option, wrong type, unknown optimisation level,
                malformed provider entry, or a negative thread count.
        """
        super().__init__(name, options)
        providers, level, threads = parse_ort_options(name, self.options)
        self.providers: list[str | tuple[str, dict]] = providers
        self.graph_optimization_level: str = level
        self.intra_op_num_threads: int = threads

    @property
    def provider_names(self) -> list[str]:
        """The requested provider names, in priority order."""
        return [p if isinstance(p, str) else p[0] for p in self.providers]

    def _session_options(self):
        level_name = OPT_LEVELS[self.graph_optimization_level]
        if not hasattr(ort.GraphOptimizationLevel, level_name):
            raise StageError(
                "session",
                f"graph_optimization_level {self.graph_optimization_level!r} ({level_name}) is not "
                f"supported by onnxruntime {ort.__version__}",
            )
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level_name)
        so.intra_op_num_threads = self.intra_op_num_threads
        so.log_severity_level = 4  # failures come back as exceptions (no stderr noise); provider fallback is checked explicitly
        return so

    def unavailable_reason(self, *, timeout_s: float = 60.0) -> str | None:
        """The configured execution providers this onnxruntime build lacks (e.g.
        ``CUDAExecutionProvider`` with the CPU package), or None (CPU only: not asked)."""
        if all(n == "CPUExecutionProvider" for n in self.provider_names):
            return None
        return missing_providers(self.provider_names)

    def _create_session(self, onnx_path: str) -> tuple[Any, float, str | None]:
        """Create the session (:func:`~torq_gen_config.core.external_data.open_session`: the layer model's dims
        are left symbolic where ONNX Runtime refuses them fixed).

        Returns:
            ``(session, wall_ms, note)``: ``note`` says why the dims were left symbolic, or None.

        Raises:
            StageError: ``"session"``: a requested provider is missing or fell back, or
                onnxruntime cannot create the session.
        """
        missing = missing_providers(self.provider_names)
        if missing:
            raise StageError("session", missing)
        start = time.perf_counter()
        try:
            session, note = open_session(onnx_path, self._session_options, self.providers)
        except StageError:
            raise
        except Exception as e:  # onnxruntime raises its own pybind exception types
            raise StageError("session", bounded_message(f"{type(e).__name__}: {e}")) from None
        wall_ms = (time.perf_counter() - start) * 1000.0
        active = session.get_providers()
        dropped = [n for n in self.provider_names if n not in active]
        if dropped:
            raise StageError(
                "session",
                f"onnxruntime could not initialise execution provider {', '.join(dropped)} "
                f"(session fell back to {', '.join(active)})",
            )
        return session, wall_ms, note

    def _compile_here(
        self,
        *,
        onnx_path: str,
        mlir_path: str | None,
        work_dir: str,
        timeout_s: float,
        log_path: str | None,
    ) -> CompiledArtifact:
        """Create the ``InferenceSession`` for the layer ONNX (timed as the compile).

        Session creation cannot be interrupted in-process: when it finishes after
        ``timeout_s`` the layer is reported as a compile timeout all the same.

        Args:
            onnx_path: the layer ONNX file.
            mlir_path: ignored.
            work_dir: unused (no files are written); accepted for the interface.
            timeout_s: limit in seconds, checked after the session is created.
            log_path: a one-line record of the session creation is appended here.

        Returns:
            CompiledArtifact with ``path=None``, ``compile_ms`` = session creation wall
            time in ms, ``info`` = ``{"onnx_path", "providers" (active ones),
            "graph_optimization_level", "intra_op_num_threads", "onnxruntime_version"}``
            (plus ``session_note`` where the dims were left symbolic) and ``handle`` =
            the session.

        Raises:
            StageError: ``"session"`` (onnxruntime cannot create the session, e.g. an
                unsupported operator or type; a requested provider is missing or fell
                back), ``"timeout"`` with ``during="session"``.
            FileNotFoundError: ``onnx_path`` does not exist.
        """
        if not os.path.isfile(onnx_path):
            raise FileNotFoundError(f"layer ONNX file not found: {onnx_path}")
        what = (
            f"onnxruntime InferenceSession({onnx_path}, providers={self.provider_names}, "
            f"graph_optimization_level={self.graph_optimization_level}, intra_op_num_threads={self.intra_op_num_threads})"
        )
        try:
            session, wall_ms, note = self._create_session(onnx_path)
        except StageError as e:
            append_record(log_path, f"{what}\n--- FAILED (session)\n{e.message}")
            raise
        append_record(log_path, f"{what}\n--- ok; wall {wall_ms:.1f} ms; active providers {session.get_providers()}"
                                + (f"; {note}" if note else ""))
        if timeout_s and wall_ms > timeout_s * 1000.0:
            raise StageError(
                "timeout",
                f"onnxruntime session creation took {wall_ms / 1000.0:.3g} s, over the {timeout_s:g} s limit",
                during="session",
            )

        info = {
            "onnx_path": os.fspath(onnx_path),
            "providers": session.get_providers(),
            "graph_optimization_level": self.graph_optimization_level,
            "intra_op_num_threads": self.intra_op_num_threads,
            "onnxruntime_version": ort.__version__,
        }
        if note:
            info["session_note"] = note
        return CompiledArtifact(path=None, compile_ms=wall_ms, info=info, handle=session)

    def _session_and_feed(self, artifact: CompiledArtifact, inputs: dict, input_names: list[str],
                          output_names: list[str] | None = None):
        """The artifact's session (recreated from ``info["onnx_path"]`` when it holds
        none) and the input feed in ``input_names`` order.

        ml_dtypes arrays (bfloat16, float8, int4, ..., which onnxruntime's numpy
        binding cannot convert: "Numpy_type 256 can't be converted to MLDataType") are
        fed as ``OrtValue``s made from their bit patterns. When one of ``output_names``
        has such a type (``session.run`` cannot return it), every input is fed as an
        ``OrtValue`` so that :func:`_run_session` can use ``run_with_ort_values``
        (:func:`torq_gen_config.core.ort_io.prepare_feed`).

        Raises:
            ValueError: the artifact has neither a session nor an ``onnx_path``.
        """

        session = artifact.handle
        if session is None:
            onnx_path = (artifact.info or {}).get("onnx_path")
            if not onnx_path:
                raise ValueError(f"executor {self.name!r}: artifact has no session and no onnx_path")
            session, _, _ = self._create_session(onnx_path)
            artifact.handle = session
        feed = {n: np.asarray(inputs[n]) for n in input_names}
        return session, ort_io.prepare_feed(session, feed, list(output_names or []))

    def _run_here(
        self,
        artifact: CompiledArtifact,
        *,
        inputs: dict[str, "np.ndarray"],
        input_names: list[str],
        output_names: list[str],
        work_dir: str,
        timeout_s: float,
        log_path: str | None,
    ) -> tuple[dict[str, "np.ndarray"], float]:
        """Run the session once, in-process, with a timeout.

        A ``threading.Timer`` sets ``RunOptions.terminate`` after ``timeout_s``;
        onnxruntime checks the flag between nodes, so one long-running node is not
        interrupted before it finishes. When ``artifact.handle`` is None (e.g. the
        artifact came from another process) the session is created again from
        ``artifact.info["onnx_path"]``.

        Args:
            artifact: from :meth:`compile`.
            inputs: arrays by name, of the dtypes/shapes the model declares.
            input_names: the inputs to feed.
            output_names: the outputs to fetch, in order.
            work_dir: unused (accepted for the interface).
            timeout_s: wall-clock limit in seconds.
            log_path: a one-line record of the run is appended here.

        Returns:
            ``(outputs, run_ms)``: numpy arrays by output name (bfloat16, float8,
            int4, ... ones as ml_dtypes arrays), and the wall time of the run in ms.

        ml_dtypes inputs (bfloat16, float8, int4, ...) are fed as ``OrtValue``s of
        their bit patterns; when an output has such a type the session runs with
        ``run_with_ort_values`` (``session.run`` cannot return it;
        :mod:`torq_gen_config.core.ort_io`).
        A bfloat16 operator without an onnxruntime kernel fails at :meth:`compile`
        (``NOT_IMPLEMENTED``).

        Raises:
            StageError: ``"timeout"`` with ``during="run"`` (terminated), ``"run"`` (any
                other onnxruntime error, e.g. a wrong input shape or dtype), or
                ``"session"`` when the session has to be recreated and that fails.
            ValueError: an input is missing, or the artifact has neither a session
                nor an ``onnx_path``.
        """
        check_inputs(inputs, input_names)
        session, feed = self._session_and_feed(artifact, inputs, input_names, output_names)

        run_options = ort.RunOptions()
        fired = threading.Event()

        def _terminate() -> None:
            fired.set()
            run_options.terminate = True

        timer = threading.Timer(timeout_s, _terminate)
        timer.daemon = True
        start = time.perf_counter()
        timer.start()
        try:
            results = _run_session(session, list(output_names), feed, run_options)
        except Exception as e:  # onnxruntime raises its own pybind exception types
            wall_ms = (time.perf_counter() - start) * 1000.0
            if fired.is_set():
                msg = (
                    f"onnxruntime run exceeded the {timeout_s:g} s limit and was terminated "
                    f"after {wall_ms / 1000.0:.3g} s (RunOptions.terminate)"
                )
                append_record(log_path, f"onnxruntime run {artifact.info.get('onnx_path')}\n--- TIMED OUT\n{msg}")
                raise StageError("timeout", msg, during="run") from None
            msg = bounded_message(f"{type(e).__name__}: {e}")
            append_record(log_path, f"onnxruntime run {artifact.info.get('onnx_path')}\n--- FAILED (run)\n{msg}")
            raise StageError("run", msg) from None
        finally:
            timer.cancel()
        wall_ms = (time.perf_counter() - start) * 1000.0
        append_record(log_path, f"onnxruntime run {artifact.info.get('onnx_path')}\n--- ok; wall {wall_ms:.3f} ms")
        return dict(zip(output_names, results)), wall_ms

    def _benchmark_here(
        self,
        artifact: CompiledArtifact,
        *,
        inputs: dict[str, "np.ndarray"],
        input_names: list[str],
        output_names: list[str],
        work_dir: str,
        runs: int,
        warmup: int,
        timeout_s: float,
        log_path: str | None,
    ) -> dict:
        """Runtime of the layer's session, measured in this process.

        ``warmup`` untimed ``session.run`` calls, then ``runs`` calls each timed
        with ``time.perf_counter``; every call gets the same inputs (converted to
        numpy, or ml_dtypes ones to ``OrtValue``s, once, before the loop) and fetches
        every output of ``output_names`` (bfloat16/float8/int4 outputs through
        ``run_with_ort_values``, as in :meth:`run`).

        What is measured: one ``session.run`` call: onnxruntime's Python binding
        (input and output conversion), the execution of the graph on the session's
        providers and the output copies. Not measured: session creation (that is
        ``compile_ms``), input preparation, any process start-up (there is none).
        A ``threading.Timer`` sets ``RunOptions.terminate`` when the whole
        measurement passes ``timeout_s`` (checked by onnxruntime between nodes).

        Args:
            artifact: from :meth:`compile` (the session is recreated when
                ``handle`` is None).
            inputs, input_names, output_names: as for :meth:`run`.
            work_dir: unused.
            runs: timed calls (>= 1).
            warmup: untimed calls before them (>= 0).
            timeout_s: wall-clock limit of the whole measurement, in seconds.
            log_path: a one-line record of the measurement is appended here.

        Returns:
            See :meth:`Backend.benchmark`; ``method`` starts with ``"onnxruntime"``.

        Raises:
            StageError: ``"timeout"`` with ``during="run"``, ``"run"`` (onnxruntime error).
            ValueError: bad ``runs``/``warmup`` or a missing input.
        """
        runs, warmup = check_timing_args(runs, warmup)
        check_inputs(inputs, input_names)
        session, feed = self._session_and_feed(artifact, inputs, input_names, output_names)
        return time_session_runs(session, list(output_names), feed, runs=runs, warmup=warmup, timeout_s=timeout_s,
                                 log_path=log_path, label=f"onnxruntime benchmark {artifact.info.get('onnx_path')}")

    # Public methods: the work runs in a supervised worker process (a hang or a crash of
    # onnxruntime must not take the run with it; torq_gen_config.core.isolation).
    def compile(self, *, onnx_path: str, mlir_path: str | None, work_dir: str, timeout_s: float,
                log_path: str | None) -> CompiledArtifact:
        """:meth:`_compile_here` in a supervised worker; the artifact comes back without
        its session (:meth:`run` creates one from ``info["onnx_path"]``).

        Raises:
            StageError: as :meth:`_compile_here`; ``"timeout"``/``"crash"`` with
                ``during="session"`` when the worker had to be stopped or died.
        """
        return self._in_worker("compile", "session", timeout_s, onnx_path=onnx_path, mlir_path=mlir_path,
                               work_dir=work_dir, timeout_s=timeout_s, log_path=log_path)

    def run(self, artifact: CompiledArtifact, *, inputs: dict, input_names: list[str], output_names: list[str],
            work_dir: str, timeout_s: float, log_path: str | None) -> tuple[dict, float]:
        """:meth:`_run_here` in a supervised worker (see :meth:`compile`).

        Raises:
            StageError: as :meth:`_run_here`; ``"timeout"``/``"crash"`` with
                ``during="run"`` when the worker had to be stopped or died.
        """
        return self._in_worker("run", "run", timeout_s, _artifact(artifact), inputs=inputs, input_names=input_names,
                               output_names=output_names, work_dir=work_dir, timeout_s=timeout_s, log_path=log_path)

    def compile_and_run(self, *, onnx_path: str, mlir_path: str | None, inputs: dict, input_names: list[str],
                        output_names: list[str], work_dir: str, timeout_s: float,
                        log_path: str | None) -> tuple[CompiledArtifact, dict, float]:
        """:meth:`_compile_here` then :meth:`_run_here` in one supervised worker, each
        bounded on its own; the run uses the session the compile created there.

        Returns / Raises: as :meth:`Backend.compile_and_run`; a worker that had to be
        stopped or died is ``"timeout"``/``"crash"`` with ``during`` the step it was in.
        """
        limit = call_limit(timeout_s)
        compiled, ran = run_isolated_each(
            [(_call_in_worker, (self.name, self.options, "compile", (),
                                dict(onnx_path=onnx_path, mlir_path=mlir_path, work_dir=work_dir,
                                     timeout_s=timeout_s, log_path=log_path)), {}),
             (_call_in_worker, (self.name, self.options, "run", (None,),
                                dict(inputs=inputs, input_names=input_names, output_names=output_names,
                                     work_dir=work_dir, timeout_s=timeout_s, log_path=log_path)), {})],
            limit_s=limit, what=[f"onnxruntime compile of executor {self.name}",
                                 f"onnxruntime run of executor {self.name}"])
        if isinstance(compiled, BaseException):
            raise self._worker_failure(compiled, "compile", "session", limit)
        if isinstance(ran, BaseException):
            error = self._worker_failure(ran, "run", "run", limit)
            if isinstance(error, StageError):
                error.compile_ms = compiled.compile_ms
            raise error
        outputs, run_ms = ran
        return compiled, outputs, run_ms

    def benchmark(self, artifact: CompiledArtifact, *, inputs: dict, input_names: list[str], output_names: list[str],
                  work_dir: str, runs: int, warmup: int, timeout_s: float, log_path: str | None) -> dict:
        """:meth:`_benchmark_here` in a supervised worker (see :meth:`compile`)."""
        return self._in_worker("benchmark", "run", timeout_s, _artifact(artifact), inputs=inputs,
                               input_names=input_names, output_names=output_names, work_dir=work_dir, runs=runs,
                               warmup=warmup, timeout_s=timeout_s, log_path=log_path)

    def _in_worker(self, method: str, during: str, call_timeout_s: float, *args, **kwargs):
        limit = call_limit(call_timeout_s)
        try:
            return run_isolated(_call_in_worker, (self.name, self.options, method, args, kwargs), limit_s=limit,
                                what=f"onnxruntime {method} of executor {self.name}")
        except (WorkerTimeout, WorkerCrash) as e:
            raise self._worker_failure(e, method, during, limit) from None

    @staticmethod
    def _worker_failure(error: BaseException, method: str, during: str, limit: float) -> BaseException:
        """The exception to raise for a worker call's failure: a stopped or dead worker
        becomes a ``"timeout"``/``"crash"`` StageError; anything else is itself."""
        if isinstance(error, WorkerTimeout):
            return StageError("timeout", f"onnxruntime {method} did not finish within {limit:g} s (the worker "
                                         "process was stopped)", during=during)
        if isinstance(error, WorkerCrash):
            return StageError("crash", f"onnxruntime crashed during {method} ({error.signal_name or 'no signal'}): "
                                       f"{error}", during=during)
        return error

    def describe(self, *, probe_timeout_s: float = 60.0) -> dict:
        """Provenance of this executor.

        Returns:
            ``{"kind", "name", "providers", "graph_optimization_level",
            "intra_op_num_threads", "onnxruntime_version", "available_providers"}``;
            when onnxruntime cannot be imported the version is ``{"error": message}``.
        """
        d: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "providers": [p if isinstance(p, str) else [p[0], p[1]] for p in self.providers],
            "graph_optimization_level": self.graph_optimization_level,
            "intra_op_num_threads": self.intra_op_num_threads,
        }
        try:
            version = ort.__version__  # the first use imports onnxruntime (core/lazy.py)
        except Exception as e:  # pragma: no cover - the package is a dependency
            d["onnxruntime_version"] = {"error": f"cannot import onnxruntime: {e}"}
            d["available_providers"] = []
        else:
            d["onnxruntime_version"] = version
            d["available_providers"] = ort.get_available_providers()
        return d


def _artifact(artifact: CompiledArtifact) -> CompiledArtifact:
    """The artifact without its session (a session cannot cross processes)."""
    return CompiledArtifact(path=artifact.path, compile_ms=artifact.compile_ms, info=dict(artifact.info or {}))


#: In a worker: the artifact (with its session) the compile just before created, taken
#: by the run that follows it.
_compiled_here: list[CompiledArtifact] = []


def _call_in_worker(name: str, options: dict, method: str, args: tuple, kwargs: dict):
    """In a worker: the backend's in-process ``_<method>_here``; a compiled artifact
    comes back without its session (kept in the worker for a later call that passes
    ``None`` as the artifact: :meth:`OnnxRuntimeBackend.compile_and_run`)."""
    backend = OnnxRuntimeBackend(name, options)
    if method == "compile":
        _compiled_here.clear()  # a failed compile must not leave an earlier job's session
    elif args and args[0] is None:
        if not _compiled_here:
            raise StageError("run", "internal: no session was created in this worker before the run")
        args = (_compiled_here.pop(),) + tuple(args[1:])
    result = getattr(backend, f"_{method}_here")(*args, **kwargs)
    if isinstance(result, CompiledArtifact):
        _compiled_here[:] = [result]
        result = _artifact(result)
    return result
