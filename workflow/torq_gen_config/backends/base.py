"""The backend interface: compile a layer for an executor, run it, describe the executor.

A *backend* is a kind of executor (``"iree"``, ``"onnxruntime"``, ...). An *executor*
is a named, configured backend from the configuration::

    {"name": "iree-cpu", "backend": "iree", "options": {"target": "llvm-cpu"}}

For each layer the workflow calls :meth:`Backend.compile` once, then
:meth:`Backend.run` with the layer's inputs. A failure of the layer on the executor
(the compiler rejects an op, the run errors out, a timeout, a crash) is raised as
:class:`StageError`; it is a result to record, not a bug. Other exceptions
(``ValueError`` for a wrong call, :class:`~torq_gen_config.core.tools.ToolNotFoundError`
for a missing tool, :class:`~torq_gen_config.core.errors.ConfigError` for bad options)
mean the workflow itself or its setup is wrong.

This module imports no heavy dependency (no numpy at import time).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

from ..core.errors import ConfigError
from ..core.tools import bounded_message, first_error_line

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .whole_model import WholeModel

__all__ = ["STAGES", "DURING", "StageError", "CompiledArtifact", "Backend", "RunWideOption", "check_options",
           "check_inputs"]

#: Stages a layer can fail at, in pipeline order. "session" is the creation of an
#: in-process runtime session (ONNX Runtime's ``InferenceSession``), the step an onnxruntime
#: executor has in place of a compile. "timeout" and "crash" say how a step ended;
#: ``StageError.during`` then says which one it was.
STAGES = ("import", "compile", "session", "run", "timeout", "crash")
#: Values of ``StageError.during``.
DURING = ("import", "compile", "session", "run")


@dataclass(frozen=True)
class RunWideOption:
    """A run-wide setting a backend offers: one config key and one command-line flag
    that override the executor option of the same name for every executor of that
    backend (e.g. torq's ``torq_hw`` / ``--torq-hw``). The CLI, the config schema and
    the rules get these from the registry, so the generic code names no backend.

    Attributes:
        key: the config key and the executor option it overrides (str; an empty
            value keeps each executor's own option).
        flag: the ``discover``/``run`` command-line flag, e.g. ``"--torq-hw"``.
        metavar: the flag's value name in ``--help``.
        help: one line for ``--help`` and the config schema's description.
    """

    key: str
    flag: str
    metavar: str
    help: str


class StageError(Exception):
    """A layer failed on an executor at a given stage.

    Attributes:
        stage: one of :data:`STAGES`: ``"import"`` (ONNX to MLIR), ``"compile"``
            (the compiler rejected the layer), ``"session"`` (a runtime session could
            not be created: ONNX Runtime refused the model), ``"run"`` (the
            run failed), ``"timeout"`` (ran past its time limit), ``"crash"`` (the
            tool died of a signal).
        message: the tool's message, already bounded (see
            :func:`torq_gen_config.core.tools.bounded_message`); ``str(err) == message``.
        during: for ``"timeout"`` and ``"crash"``, the step that was running
            (``"import"``, ``"compile"``, ``"session"`` or ``"run"``); for the other stages it
            defaults to None (the stage itself says it).

    Raises:
        ValueError: ``stage`` or ``during`` is not one of the allowed values.
    """

    def __init__(self, stage: str, message: str, *, during: str | None = None):
        if stage not in STAGES:
            raise ValueError(f"StageError: unknown stage {stage!r} (expected one of {', '.join(STAGES)})")
        if during is not None and during not in DURING:
            raise ValueError(f"StageError: unknown 'during' {during!r} (expected one of {', '.join(DURING)})")
        message = str(message) if message is not None else ""
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.during = during

    @property
    def summary(self) -> str:
        """One line (<= 512 chars) for tables.

        For ``"timeout"`` and ``"crash"`` it is the message's first line (which says
        what timed out or crashed); otherwise the first error line of the message.
        """
        if self.stage in ("timeout", "crash"):
            return first_error_line(self.message.strip().split("\n", 1)[0]) or self.stage
        return first_error_line(self.message) or self.stage

    def to_dict(self) -> dict:
        """JSON-ready form: ``{"stage", "during", "message", "summary"}``."""
        return {"stage": self.stage, "during": self.during, "message": self.message, "summary": self.summary}

    def __repr__(self) -> str:
        during = f", during={self.during!r}" if self.during else ""
        return f"StageError({self.stage!r}, {self.summary!r}{during})"

    def __reduce__(self):  # pickled across the worker boundary (torq_gen_config.core.isolation)
        return (_stage_error, (self.stage, self.message, self.during))


def _stage_error(stage: str, message: str, during: str | None) -> StageError:
    return StageError(stage, message, during=during)


@dataclass
class CompiledArtifact:
    """What :meth:`Backend.compile` produced for one layer.

    Attributes:
        path: the compiled file (e.g. an IREE ``.vmfb``), or None for in-process
            backends that keep no file.
        compile_ms: wall-clock compile time in milliseconds (None if not measured).
        info: JSON-serialisable details for provenance (command line, flags, I/O
            signature, ...). Its content is backend-specific.
        handle: an in-process object kept between compile and run (e.g. an
            onnxruntime ``InferenceSession``); never serialised, None for
            file-based backends.
    """

    path: str | None
    compile_ms: float | None
    info: dict = field(default_factory=dict)
    handle: Any = field(default=None, repr=False, compare=False)


class Backend(ABC):
    """Base class of all backends.

    Subclasses set the class attributes :attr:`kind` and :attr:`needs_mlir`, parse
    and validate their options in ``__init__`` and implement :meth:`compile`,
    :meth:`run` and :meth:`describe`.

    What differs per backend for the workflow (its *capabilities*) is read from the
    class, never from the backend's name: :attr:`needs_mlir`,
    :attr:`chain_unavailable`, :attr:`takes_tool_options`, :attr:`override_options`,
    :attr:`run_only_options`, :attr:`inline_weights_only`, :meth:`with_tool_options`,
    :meth:`with_parameters`, :meth:`with_debug_ir` and :meth:`whole_model`. The defaults suit an in-process backend without a compiler
    (``onnxruntime``).

    Attributes:
        kind: backend kind as used in the configuration (``"iree"``, ``"onnxruntime"``).
        needs_mlir: True when the compile input is the layer's MLIR file (the
            workflow must import the layer first); False when it is the layer ONNX.
        chain_unavailable: why an executor of this backend cannot run one partition
            of a whole-model chain (``torq-gen-config run``); None when it can.
        takes_tool_options: the config's ``compiler_options`` / ``runtime_options``
            are appended to the options ``compile_flags`` / ``run_flags``.
        run_wide_options: the run-wide settings (:class:`RunWideOption`: a config key and a
            CLI flag each) that override the executor option of the same name when not
            empty (torq: ``torq_hw``, ``torq_hw_type``).
        override_options: the keys of :attr:`run_wide_options` (derived).
        packages: the Python distributions the backend runs on, whose versions the
            report's provenance records (``iree-base-compiler``, ...).
        run_only_options: option keys that only matter at run time (a change
            recompiles nothing in the full-model run).
        batch_compile: :meth:`compile` also compiles a module holding several layers,
            each its own exported function (``torq_gen_config.discovery.batch_compile``), and
            :meth:`run` runs the function named by ``artifact.info["function"]``.
        inline_weights_only: why the compiler needs the weights inside the module
            (``parameters: external`` is refused, auto is inline), or None.
        name: the executor's name from the configuration.
        options: the executor's options as given (a shallow copy).
    """

    kind: str = ""
    needs_mlir: bool = False
    chain_unavailable: ClassVar[str | None] = None
    takes_tool_options: ClassVar[bool] = False
    run_wide_options: ClassVar[tuple[RunWideOption, ...]] = ()
    packages: ClassVar[tuple[str, ...]] = ()
    run_only_options: ClassVar[tuple[str, ...]] = ()
    batch_compile: ClassVar[bool] = False
    inline_weights_only: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.override_options = tuple(o.key for o in cls.run_wide_options)

    override_options: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def with_tool_options(cls, options: Mapping[str, Any] | None, compiler_options: Sequence[str],
                          runtime_options: Sequence[str], overrides: Mapping[str, str] | None = None) -> dict | None:
        """The executor options with the run-wide tool options applied (a new dict),
        or None when this backend takes none (the executor is used unchanged).

        ``compiler_options`` / ``runtime_options`` (lists of str) are appended to
        ``compile_flags`` / ``run_flags`` when :attr:`takes_tool_options`; each key of
        :attr:`override_options` whose value in ``overrides`` is not empty replaces
        the option.
        """
        if not cls.takes_tool_options:
            return None
        opts = dict(options or {})
        if compiler_options or runtime_options:
            opts["compile_flags"] = list(opts.get("compile_flags") or []) + list(compiler_options)
            opts["run_flags"] = list(opts.get("run_flags") or []) + list(runtime_options)
        for key in cls.override_options:
            if (overrides or {}).get(key):
                opts[key] = overrides[key]
        return opts

    @classmethod
    def with_parameters(cls, options: Mapping[str, Any] | None, archives: Sequence[str]) -> dict | None:
        """The options that load the weight store's ``archives`` (IREE parameter archives)
        at run time (``parameters: external``, docs/parameters.md; a new dict), or None
        when the backend takes no parameters (the default: it reads the ONNX model)."""
        return None

    @classmethod
    def with_debug_ir(cls, options: dict, directory: str) -> dict:
        """``options`` with the compiler flags that dump the compilation phases into
        ``directory`` (``torq-gen-config run --debug-ir``); unchanged by default (the
        backend has no such dump). May change ``options`` in place; returns it."""
        return options

    @classmethod
    def whole_model(cls) -> "WholeModel | None":
        """The hooks that compile and run a whole model at once with this backend
        (its compiler places each op itself), or None (the default: the full-model
        run is a chain of partitions). Imported lazily by the backends that have them."""
        return None

    def __init__(self, name: str, options: Mapping[str, Any] | None):
        """Store the executor name and options.

        Raises:
            ConfigError: ``name`` is empty or ``options`` is not a mapping.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{self.kind or type(self).__name__} executor: name must be a non-empty string (got {name!r})")
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"executor {name!r}: options must be a mapping, got {type(options).__name__}"
            )
        self.name = name
        self.options = dict(options)

    @abstractmethod
    def compile(self, *, onnx_path: str, mlir_path: str | None, work_dir: str, timeout_s: float,
                log_path: str | None) -> CompiledArtifact:
        """Compile one layer.

        Args:
            onnx_path: the layer's ONNX file.
            mlir_path: the layer's MLIR file (required when :attr:`needs_mlir`).
            work_dir: a directory for this (layer, executor) pair; created if missing.
            timeout_s: wall-clock limit in seconds.
            log_path: text log to append the tool's command line and output to.

        Returns:
            The :class:`CompiledArtifact`.

        Raises:
            StageError: stage ``"compile"``, or ``"timeout"``/``"crash"`` with
                ``during="compile"``.
        """

    @abstractmethod
    def run(self, artifact: CompiledArtifact, *, inputs: dict[str, "np.ndarray"], input_names: list[str],
            output_names: list[str], work_dir: str, timeout_s: float,
            log_path: str | None) -> tuple[dict[str, "np.ndarray"], float]:
        """Run a compiled layer once.

        Args:
            artifact: what :meth:`compile` returned.
            inputs: input arrays by name (any shape/dtype the layer takes).
            input_names: the layer's inputs in graph order (the call order).
            output_names: the layer's outputs in graph order.
            work_dir: a directory for temporary files; created if missing.
            timeout_s: wall-clock limit in seconds.
            log_path: text log to append the tool's command line and output to.

        Returns:
            ``(outputs, run_ms)``: output arrays by name (every name of
            ``output_names``) and the wall-clock time of the run in milliseconds.

        Raises:
            StageError: stage ``"run"``, or ``"timeout"``/``"crash"`` with ``during="run"``.
            ValueError: an input named in ``input_names`` is missing from ``inputs``.
        """

    def compile_and_run(
        self,
        *,
        onnx_path: str,
        mlir_path: str | None,
        inputs: dict[str, "np.ndarray"],
        input_names: list[str],
        output_names: list[str],
        work_dir: str,
        timeout_s: float,
        log_path: str | None,
    ) -> tuple[CompiledArtifact, dict[str, "np.ndarray"], float]:
        """:meth:`compile` then one :meth:`run` (a layer test's verification run).

        Backends whose work runs in a worker process override it to do both in one
        worker (one process start per layer test instead of two).

        Args:
            as for :meth:`compile` and :meth:`run`; ``timeout_s`` bounds each of the two.

        Returns:
            ``(artifact, outputs, run_ms)``: as :meth:`compile` and :meth:`run` return.

        Raises:
            StageError: as :meth:`compile` or :meth:`run`; when the run failed, the
                error carries the compile time as ``compile_ms`` (ms).
            ValueError: as :meth:`run`.
        """
        artifact = self.compile(onnx_path=onnx_path, mlir_path=mlir_path, work_dir=work_dir, timeout_s=timeout_s,
                                log_path=log_path)
        try:
            outputs, run_ms = self.run(artifact, inputs=inputs, input_names=input_names, output_names=output_names,
                                       work_dir=work_dir, timeout_s=timeout_s, log_path=log_path)
        except StageError as e:
            e.compile_ms = artifact.compile_ms
            raise
        return artifact, outputs, run_ms

    @abstractmethod
    def describe(self, *, probe_timeout_s: float = 60.0) -> dict:
        """Provenance: backend kind, executor name, effective options, tool paths and versions
        (a tool's ``--version`` probe bounded by ``probe_timeout_s`` seconds).

        Returns:
            A JSON-serialisable dict; it never raises for a missing tool (the problem
            is reported in the dict instead).
        """

    def benchmark(
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
        """Measure the runtime of a compiled layer: ``warmup`` untimed runs, then ``runs`` timed ones.

        Called after a successful :meth:`run` of the same artifact with the same
        inputs (the workflow's ``collect_timing``). What one sample covers is
        backend-specific and said in the subclass docstring and in ``"method"``;
        it never includes process start-up or compilation.

        Args:
            artifact: what :meth:`compile` returned.
            inputs, input_names, output_names, work_dir, log_path: as for :meth:`run`.
            runs: timed runs (>= 1).
            warmup: untimed runs before them (>= 0).
            timeout_s: wall-clock limit in seconds for the whole measurement.

        Returns:
            ``{"runs": N, "warmup": W, "median_ms", "min_ms", "mean_ms", "max_ms",
            "samples_ms": [N floats], "method": str}`` in milliseconds, rounded to
            4 decimals (see :func:`runtime_stats`).

        Raises:
            StageError: the measurement failed (``"run"``, or ``"timeout"``/``"crash"``
                with ``during="run"``); the caller records it next to the verdict.
            NotImplementedError: this backend cannot measure runtimes (the
                default; backends override it).
            ValueError: ``runs < 1``, ``warmup < 0`` or a missing input.
        """
        raise NotImplementedError(f"backend {self.kind or type(self).__name__!r} does not implement benchmark()")

    def unavailable_reason(self, *, timeout_s: float = 60.0) -> str | None:
        """Why this executor cannot run on this machine at all (its device or execution
        provider is missing: a GPU executor on a CPU machine), or None when it can.

        Asked once per run for each executor, before any layer job
        (:func:`~torq_gen_config.backends.unavailable_executors`): an unavailable
        executor gets no layer jobs and is reported once, with this reason, instead of
        one error per layer. The default (no device to miss) is None. Probes are
        bounded by ``timeout_s`` seconds.
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, options={self.options!r})"


def check_options(
    executor: str,
    options: Mapping[str, Any],
    allowed: Mapping[str, type | tuple[type, ...]],
) -> None:
    """Check that ``options`` only has known keys with values of the right type.

    Args:
        executor: executor name, for the message.
        options: the options to check.
        allowed: option name -> accepted type(s). ``None`` values are always accepted
            (meaning "use the default"). ``bool`` is not accepted where ``int`` is.

    Raises:
        ConfigError: an unknown key (the message lists the known ones) or a value of
            the wrong type.
    """
    for key, value in options.items():
        if key not in allowed:
            raise ConfigError(
                f"executor {executor!r}: unknown option {key!r} "
                f"(known options: {', '.join(sorted(allowed)) or 'none'})"
            )
        if value is None:
            continue
        types = allowed[key] if isinstance(allowed[key], tuple) else (allowed[key],)
        if isinstance(value, bool) and bool not in types:
            ok = False
        else:
            ok = isinstance(value, types)
        if not ok:
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(
                f"executor {executor!r}: option {key!r} must be {names}, got {type(value).__name__} {value!r}"
            )


def check_inputs(inputs: Mapping[str, Any], input_names: list[str]) -> None:
    """Check that every name of ``input_names`` has an array in ``inputs``.

    Raises:
        ValueError: names missing from ``inputs`` (listed in the message).
    """
    missing = [n for n in input_names if n not in inputs]
    if missing:
        raise ValueError(
            f"missing input array(s) {missing} (given: {sorted(inputs)})"
        )


#: Text that LLVM/MLIR-based tools print when they die of an internal crash but still
#: exit with a status (not a signal): treated as a crash, not as a compile error.
CRASH_MARKERS = ("Stack dump:", "PLEASE submit a bug report", "Please report issues to https://github.com/")


def raise_for_tool_failure(res: "ToolResult", *, tool: str, during: str, timeout_s: float) -> None:  # noqa: F821
    """Raise the :class:`StageError` that describes a failed tool run; return if it succeeded.

    Shared by the backends that drive command-line tools (iree, torq): a timeout is
    stage ``timeout``, death by a signal or a crash report (:data:`CRASH_MARKERS`) is
    stage ``crash``, any other non-zero exit is stage ``during`` with the tool's
    message (bounded; see :func:`torq_gen_config.core.tools.bounded_message`).

    Args:
        res: the finished tool run (:class:`torq_gen_config.core.tools.ToolResult`).
        tool: the tool's name, for the message.
        during: ``"compile"`` or ``"run"``.
        timeout_s: the limit the tool ran under (s), for the message.
    """
    text = res.stderr if res.stderr.strip() else res.stdout
    if res.timed_out:
        msg = f"{tool} timed out after {timeout_s:g} s (process group killed)"
        partial = bounded_message(text, 3000)
        raise StageError("timeout", msg + ("\n" + partial if partial else ""), during=during)
    if res.crashed:
        msg = f"{tool} crashed: killed by {res.signal_name}" + (
            " (a SIGKILL without a timeout: most often the kernel's out-of-memory killer)"
            if res.signal_name == "SIGKILL" else "")
        detail = bounded_message(text, 3500, from_error=False)
        raise StageError("crash", msg + ("\n" + detail if detail else ""), during=during)
    if res.returncode != 0:
        if any(m in res.stderr for m in CRASH_MARKERS):
            msg = f"{tool} crashed (exit status {res.returncode} with a crash report)"
            detail = bounded_message(text, 3500, from_error=False)
            raise StageError("crash", msg + ("\n" + detail if detail else ""), during=during)
        detail = bounded_message(text) or f"{tool} failed with exit status {res.returncode} and no output"
        raise StageError(during, detail)


def failure_summary(stage: str, message: str) -> str:
    """A failed stage in one line: ``"<stage> failed: <the message's telling line>"``; a
    crash or a timeout says it in its own first line (``iree-compile crashed: killed by
    SIGKILL ...``), which is kept as it is (not "crash failed: ...")."""
    if stage in ("crash", "timeout"):
        return (message or "").strip().splitlines()[0] if (message or "").strip() else f"{stage}"
    return f"{stage} failed: {first_error_line(message)}"
