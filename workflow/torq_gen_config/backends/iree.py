"""IREE backend: compile a layer's MLIR with ``iree-compile``, run it with ``iree-run-module``.

Executor options (all optional):

``target`` (str, default ``"llvm-cpu"``)
    IREE compiler target backend: ``"llvm-cpu"``, ``"vmvx"`` (local CPU devices),
    ``"cuda"``, ``"rocm"`` or ``"vulkan-spirv"``.
``device`` (str)
    ``iree-run-module --device`` value. Default ``"local-task"`` for llvm-cpu and
    vmvx (``"local-sync"`` also works), ``"cuda"`` for cuda, ``"hip"`` for rocm,
    ``"vulkan"`` for vulkan-spirv.
``target_cpu`` (str, default ``"host"``)
    ``--iree-llvmcpu-target-cpu`` for llvm-cpu; ignored for other targets.
``compile_flags`` (list of str)
    Extra ``iree-compile`` flags, appended after the target flags. GPU architectures
    go here, e.g. ``--iree-cuda-target=sm_80`` (IREE 3.13 defaults to sm_60 and
    rejects sm_90/sm_100; see iree-org/iree#22147) or ``--iree-rocm-target=gfx942``
    (required for rocm). Layers with f64 inputs/outputs need
    ``--iree-input-demote-f64-to-f32=false``: by default IREE demotes f64 to f32
    and the run then fails with ``buffer view byte length ... exceeds backing buffer``.
``run_flags`` (list of str)
    Extra ``iree-run-module`` flags, appended at the end. With ``parameters: external``
    the workflow adds ``--parameters=model=<archive>`` for the weight store's (docs/parameters.md).
``compile_threads`` (bool, default ``False``)
    Let ``iree-compile`` use its MLIR thread pool. Off by default: a layer module is
    tiny, and ``--mlir-disable-threading`` made one llvm-cpu Conv compile faster
    (0.50 s vs 0.65 s wall, 0.47 s vs 0.61 s CPU, measured here), while the workflow
    already runs one job per core.

Tools: ``iree-compile``, ``iree-run-module`` and (for timing) ``iree-benchmark-module``
are the native binaries of the installed ``iree-base-compiler`` / ``iree-base-runtime``
wheels (not the Python wrapper scripts in ``bin/``, which hide a crash's signal),
unless the environment variables ``IREE_COMPILE`` / ``IREE_RUN_MODULE`` /
``IREE_BENCHMARK_MODULE`` name other executables; the fallback is the interpreter's
``bin`` directory, then ``PATH``.

Timing (:meth:`IreeBackend.benchmark`, workflow option ``collect_timing``): one
``iree-benchmark-module`` process per (layer, executor) measures the wall time of
single calls of ``main`` inside that process; process start-up, module loading and
input parsing happen once before the clock starts and are not measured (the
verification run's ``run_ms`` does include them).

Data types at the ``iree-run-module`` boundary (IREE 3.13, checked): bool, int8-64,
uint8-64, float16, float32 and bfloat16 inputs go through ``.npy`` files, float8 inputs
through raw ``.bin`` files with their type (``--input=4xf8E5M2=@in_0.bin``: IREE reads
numpy's ``<f1`` descriptor as a generic f8); outputs are read from ``.npy`` files except
bfloat16 and float8 ones (IREE cannot write them as ``.npy``: ``UNIMPLEMENTED;
unsupported data encoding``), which are read from raw ``.bin`` files using the static
shape of the MLIR signature; such an output with a dynamic shape is therefore not
supported. IREE writes unsigned outputs as signed ``.npy``;
they are reinterpreted with the unsigned dtype of the MLIR signature. String and
object arrays are not supported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.layout import MODULE_FILE
from ..core.lazy import metadata, ml_dtypes, np
from ..core.tools import ToolNotFoundError, bounded_message, run_tool, tool_version
from ..core.value_store import store_file_of
from ..core.weight_store import PARAMETER_SCOPE
from .base import Backend, CompiledArtifact, StageError, check_inputs, check_options, raise_for_tool_failure
from .timing import check_timing_args, runtime_stats
from .iree_tools import (
    _RAW_DTYPES,
    FUNCTION,
    _fix_dtype,
    _has_f64,
    _iree_version_line,
    compile_mlir_module,
    iree_tool_path,
    parse_benchmark_json,
    unavailable_device_reason,
)

__all__ = ["IreeBackend", "TARGETS"]

#: target backend -> (``--iree-hal-target-device`` value, default runtime ``--device``)
TARGETS: dict[str, tuple[str, str]] = {
    "llvm-cpu": ("local", "local-task"),
    "vmvx": ("local", "local-task"),
    "cuda": ("cuda", "cuda"),
    "rocm": ("hip", "hip"),
    "vulkan-spirv": ("vulkan", "vulkan"),
}

_OPTIONS = {
    "target": str,
    "device": str,
    "target_cpu": str,
    "compile_flags": list,
    "run_flags": list,
    "compile_threads": bool,
}

_DEMOTE_F64_OFF = "--iree-input-demote-f64-to-f32=false"


class IreeBackend(Backend):
    """Executor backed by the IREE compiler and runtime command-line tools (see module doc)."""

    kind = "iree"
    needs_mlir = True
    packages = ("iree-base-compiler", "iree-base-runtime")
    takes_tool_options = True
    run_only_options = ("run_flags", "device")  # iree-run-module's flags and --device
    batch_compile = True

    @classmethod
    def with_parameters(cls, options: dict | None, archives: list[str]) -> dict:
        """``options`` with ``--parameters=model=<archive>`` per archive appended to ``run_flags`` (a new dict)."""
        return {**(options or {}), "run_flags": [*((options or {}).get("run_flags") or []),
                                                  *(f"--parameters={PARAMETER_SCOPE}={a}" for a in archives)]}

    @classmethod
    def with_debug_ir(cls, options: dict, directory: str) -> dict:
        """``options`` with ``--dump-compilation-phases-to=<directory>`` appended to
        ``compile_flags`` (in place)."""
        options["compile_flags"] = list(options.get("compile_flags") or []) + [
            f"--dump-compilation-phases-to={directory}"]
        return options

    def __init__(self, name: str, options: dict | None):
        """Validate the options.

        Raises:
            ConfigError: unknown option, wrong type, unknown ``target``, or
                ``compile_flags``/``run_flags`` not a list of strings.
        """
        super().__init__(name, options)
        check_options(name, self.options, _OPTIONS)
        target = self.options.get("target") or "llvm-cpu"
        if target not in TARGETS:
            raise ConfigError(
                f"executor {name!r}: unknown IREE target {target!r} (known targets: {', '.join(TARGETS)})"
            )
        for key in ("compile_flags", "run_flags"):
            flags = self.options.get(key) or []
            if not all(isinstance(x, str) for x in flags):
                raise ConfigError(f"executor {name!r}: option {key!r} must be a list of strings, got {flags!r}")
        self.target: str = target
        self.hal_device: str = TARGETS[target][0]
        self.device: str = self.options.get("device") or TARGETS[target][1]
        self.target_cpu: str | None = (self.options.get("target_cpu") or "host") if target == "llvm-cpu" else None
        self.compile_flags: list[str] = list(self.options.get("compile_flags") or [])
        self.run_flags: list[str] = list(self.options.get("run_flags") or [])
        self.compile_threads: bool = bool(self.options.get("compile_threads", False))
        self._tools: dict[str, str] = {}

    # ----------------------------------------------------------------- tools
    def _tool(self, name: str) -> str:
        if name not in self._tools:
            self._tools[name] = iree_tool_path(name)
        return self._tools[name]

    def target_flags(self) -> list[str]:
        """The ``iree-compile`` flags selecting this executor's device and target.

        Returns:
            e.g. ``["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host"]`` or ``["--iree-hal-target-device=cuda"]``.
        """
        flags = [f"--iree-hal-target-device={self.hal_device}"]
        if self.hal_device == "local":
            flags.append(f"--iree-hal-local-target-device-backends={self.target}")
        if self.target_cpu:
            flags.append(f"--iree-llvmcpu-target-cpu={self.target_cpu}")
        return flags

    def compile_argv(self, mlir_path: str, output_path: str) -> list[str]:
        """The full ``iree-compile`` command line for one layer.

        Raises:
            ToolNotFoundError: ``iree-compile`` cannot be found.
        """
        threading = [] if self.compile_threads else ["--mlir-disable-threading"]
        return [self._tool("iree-compile"), mlir_path, *self.target_flags(), *threading, *self.compile_flags,
                "-o", output_path]

    # -------------------------------------------------------------- compile
    def compile(self, *, onnx_path: str, mlir_path: str | None, work_dir: str, timeout_s: float,
                log_path: str | None) -> CompiledArtifact:
        """Compile the layer's MLIR into ``<work_dir>/module.vmfb``.

        Command: ``iree-compile <mlir> --iree-hal-target-device=<local|cuda|hip|vulkan>
        [--iree-hal-local-target-device-backends=<target>] [--iree-llvmcpu-target-cpu=<cpu>]
        <compile_flags> -o <work_dir>/module.vmfb``. An old ``module.vmfb`` is removed
        first and a failed compile's partial output is removed, so the file exists
        only after a successful compile.

        Args:
            onnx_path: the layer ONNX (recorded in ``info`` only).
            mlir_path: the layer MLIR from ``iree-import-onnx`` (function ``@main``).
            work_dir: output directory (created).
            timeout_s: wall-clock limit in seconds.
            log_path: log file for the command line and compiler output.

        Returns:
            CompiledArtifact with ``path`` = the ``.vmfb``, ``compile_ms`` = iree-compile
            wall time in ms, ``info`` = ``{"argv", "target", "device", "vmfb_bytes",
            "signature" (see :func:`parse_mlir_signature`), "compiler_stderr"}``.

        Raises:
            StageError: ``"compile"`` (non-zero exit; message = bounded stderr),
                ``"timeout"`` / ``"crash"`` with ``during="compile"``.
            ValueError: ``mlir_path`` is None.
            FileNotFoundError: ``mlir_path`` does not exist.
            ToolNotFoundError: ``iree-compile`` cannot be found.
        """
        if mlir_path is None:
            raise ValueError(f"executor {self.name!r} (iree) needs the layer's MLIR file, got mlir_path=None")
        if not os.path.isfile(mlir_path):
            raise FileNotFoundError(f"layer MLIR file not found: {mlir_path}")
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
        out = work / MODULE_FILE
        out.unlink(missing_ok=True)
        argv = self.compile_argv(os.path.abspath(mlir_path), str(out.absolute()))
        return compile_mlir_module(argv, tool="iree-compile", out=out, mlir_path=mlir_path, onnx_path=onnx_path,
                                   timeout_s=timeout_s, log_path=log_path,
                                   info={"target": self.target, "device": self.device})

    # ------------------------------------------------------------------ run
    def run(
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
        """Run the compiled module once with ``iree-run-module``.

        An input that is a value of the value store, memory-mapped whole
        (:func:`~torq_gen_config.core.value_store.store_file_of`), is read by the tool from
        its store file; any other is written as ``<work_dir>/in_<i>.npy``, in
        ``input_names`` order. The command is ``iree-run-module --module=<vmfb> --device=<device>
        --function=<info["function"], default main> --input=@in_0.npy ... --output=@out_0.npy ... <run_flags>``
        (run inside ``work_dir``); outputs are read back and named after
        ``output_names`` in order (see the module doc for dtype handling).

        Args:
            artifact: from :meth:`compile` (``path`` = the ``.vmfb``).
            inputs: arrays by name; shapes/dtypes must match the layer's signature.
            input_names: call order of the inputs.
            output_names: names for the function's results, in order; there must be
                exactly as many as the function returns.
            work_dir: directory for the ``.npy`` files (created).
            timeout_s: wall-clock limit in seconds.
            log_path: log file for the command line and runtime output.

        Returns:
            ``(outputs, run_ms)``: arrays by output name, and the wall time of the
            ``iree-run-module`` process in ms (includes process start-up and module
            loading, about 25 ms on a CPU; not a kernel benchmark).

        Raises:
            StageError: ``"run"`` (non-zero exit, e.g. a shape mismatch or a missing
                driver; an input or output IREE cannot exchange), ``"timeout"`` /
                ``"crash"`` with ``during="run"``.
            ValueError: an input is missing, or ``artifact.path`` is None.
            FileNotFoundError: the module file does not exist.
            ToolNotFoundError: ``iree-run-module`` cannot be found.
        """
        check_inputs(inputs, input_names)
        if artifact.path is None:
            raise ValueError(f"executor {self.name!r}: artifact has no module path")
        module = os.path.abspath(artifact.path)
        if not os.path.isfile(module):
            raise FileNotFoundError(f"IREE module not found: {module}")
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)

        signature = (artifact.info or {}).get("signature") or {}
        out_sig = signature.get("outputs") or []
        if len(out_sig) != len(output_names):
            out_sig = [None] * len(output_names)

        function = (artifact.info or {}).get("function") or FUNCTION
        argv = [self._tool("iree-run-module"), f"--module={module}", f"--device={self.device}", f"--function={function}"]
        argv += self._write_inputs(work, inputs, input_names, "in")
        out_files: list[tuple[str, dict | None, bool]] = []
        for i, (name, sig) in enumerate(zip(output_names, out_sig)):
            raw = sig is not None and sig["dtype"] in _RAW_DTYPES
            if raw and any(d is None for d in sig["shape"]):
                raise StageError(
                    "run",
                    f"output {name!r} is {sig['dtype']} with a dynamic shape {sig['shape']}: iree-run-module cannot "
                    f"write {sig['dtype']} .npy files and a raw .bin output needs a static shape",
                )
            fname = f"out_{i}.bin" if raw else f"out_{i}.npy"
            (work / fname).unlink(missing_ok=True)
            argv.append(f"--output=@{fname}")
            out_files.append((fname, sig, raw))
        argv += self.run_flags

        res = run_tool(argv, timeout_s=timeout_s, cwd=str(work), log_path=log_path)
        try:
            raise_for_tool_failure(res, tool="iree-run-module", during="run", timeout_s=timeout_s)
        except StageError as e:
            if e.stage == "run" and _DEMOTE_F64_OFF not in self.compile_flags and _has_f64(signature):
                e.message += (
                    f"\nhint: this layer has f64 inputs/outputs; IREE demotes f64 to f32 unless compiled "
                    f"with {_DEMOTE_F64_OFF} (add it to the executor's compile_flags)"
                )
                e.args = (e.message,)
            raise

        outputs: dict[str, Any] = {}
        for name, (fname, sig, raw) in zip(output_names, out_files):
            path = work / fname
            if not path.is_file():
                raise StageError("run", f"iree-run-module exited with status 0 but wrote no output file {fname} for {name!r}")
            if raw:
                data = np.fromfile(path, dtype=getattr(ml_dtypes, sig["dtype"]))
                expected = int(np.prod(sig["shape"], dtype=np.int64))
                if data.size != expected:
                    raise StageError(
                        "run",
                        f"output {name!r}: raw {sig['dtype']} file holds {data.size} values, expected {expected} "
                        f"for shape {sig['shape']}",
                    )
                arr = data.reshape(sig["shape"])
            else:
                arr = np.load(path, allow_pickle=False)
                if sig is not None:
                    arr = _fix_dtype(arr, sig["dtype"])
            outputs[name] = arr
        return outputs, res.wall_ms

    # ------------------------------------------------------------ benchmark
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
        """Runtime of the compiled module, measured by ``iree-benchmark-module``.

        Command (run inside ``work_dir``): ``iree-benchmark-module --module=<vmfb>
        --device=<device> --function=<info["function"], default main> --input=@bench_in_0.npy ...
        --benchmark_repetitions=<warmup + runs> --benchmark_min_time=1x
        --benchmark_format=json <run_flags>``.

        What is measured: each repetition is exactly one call of ``main``
        (``--benchmark_min_time=1x``) and its ``real_time`` (wall clock, taken
        inside the benchmark process by Google Benchmark) is one sample: the VM
        invocation, the HAL submission, the dispatches and the wait for the
        result, including output buffer allocation. Not measured: process
        start-up, module loading and input parsing (done once before the first
        repetition), compilation. Warm-up: ``iree-benchmark-module`` only offers a
        time-based warm-up (``--benchmark_min_warmup_time`` in seconds), so the
        first ``warmup`` repetitions run in the same process and are dropped,
        which gives an exact count. The executor's ``run_flags`` are passed too
        (device and task-system flags are shared by both tools).

        Args:
            artifact: from :meth:`compile` (``path`` = the ``.vmfb``).
            inputs: arrays by name (written as ``bench_in_<i>.npy``).
            input_names: call order of the inputs.
            output_names: unused (the outputs are not read back).
            work_dir: directory for the input files (created).
            runs: timed repetitions (>= 1).
            warmup: dropped repetitions before them (>= 0).
            timeout_s: wall-clock limit of the benchmark process, in seconds.
            log_path: log file for the command line and the tool's output.

        Returns:
            See :meth:`Backend.benchmark`; ``method`` starts with
            ``"iree-benchmark-module"``.

        Raises:
            StageError: ``"run"`` (non-zero exit, or output without the expected
                repetitions), ``"timeout"`` / ``"crash"`` with ``during="run"``.
            ValueError: bad ``runs``/``warmup``, a missing input, no module path.
            FileNotFoundError: the module file does not exist.
            ToolNotFoundError: ``iree-benchmark-module`` cannot be found.
        """
        runs, warmup = check_timing_args(runs, warmup)
        check_inputs(inputs, input_names)
        if artifact.path is None:
            raise ValueError(f"executor {self.name!r}: artifact has no module path")
        module = os.path.abspath(artifact.path)
        if not os.path.isfile(module):
            raise FileNotFoundError(f"IREE module not found: {module}")
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
        function = (artifact.info or {}).get("function") or FUNCTION
        argv = [self._tool("iree-benchmark-module"), f"--module={module}", f"--device={self.device}",
                f"--function={function}", *self._write_inputs(work, inputs, input_names, prefix="bench_in"),
                f"--benchmark_repetitions={warmup + runs}", "--benchmark_min_time=1x",
                "--benchmark_format=json", *self.run_flags]
        res = run_tool(argv, timeout_s=timeout_s, cwd=str(work), log_path=log_path)
        raise_for_tool_failure(res, tool="iree-benchmark-module", during="run", timeout_s=timeout_s)
        samples = parse_benchmark_json(res.stdout, function)
        if len(samples) != warmup + runs:
            raise StageError(
                "run",
                f"iree-benchmark-module reported {len(samples)} repetition(s) of {function}, expected "
                f"{warmup + runs}:\n{bounded_message(res.stdout + res.stderr, 2000)}",
            )
        method = (f"iree-benchmark-module --device={self.device}: wall time of one call of {function} per "
                  f"repetition (--benchmark_min_time=1x), inside the benchmark process; first {warmup} "
                  "repetition(s) dropped as warm-up; excludes process start-up and module loading")
        return runtime_stats(samples[warmup:], warmup=warmup, method=method)

    def _write_inputs(self, work: Path, inputs: dict, input_names: list[str], prefix: str) -> list[str]:
        """The ``--input=@...`` flags of the inputs: a value-store file where the input maps
        one whole (no copy), else ``<prefix>_<i>.npy`` (or ``.bin``) written in ``work``."""
        flags: list[str] = []
        for i, name in enumerate(input_names):
            stored = store_file_of(inputs[name])
            if stored is not None and inputs[name].dtype.name not in _RAW_DTYPES:
                flags.append(f"--input=@{os.path.abspath(stored)}")
                continue
            arr = np.asarray(inputs[name])
            if arr.dtype.name in _RAW_DTYPES and arr.dtype.name != "bfloat16":  # float8: raw bytes + type
                fname = f"{prefix}_{i}.bin"
                np.require(arr, requirements="C").tofile(work / fname)
                shape = "x".join(str(d) for d in arr.shape)
                flags.append(f"--input={shape + 'x' if shape else ''}{_RAW_DTYPES[arr.dtype.name]}=@{fname}")
                continue
            if arr.dtype.kind in "OUS" or arr.dtype.type is np.void:
                raise StageError("run", f"input {name!r} has dtype {arr.dtype}, which the IREE tools cannot read")
            fname = f"{prefix}_{i}.npy"
            np.save(work / fname, np.require(arr, requirements="C"), allow_pickle=False)  # keeps 0-d shapes
            flags.append(f"--input=@{fname}")
        return flags

    def unavailable_reason(self, *, timeout_s: float = 60.0) -> str | None:
        """Why this executor's runtime device is missing here (a ``cuda``/``hip``/``vulkan``
        driver without its library or without a device), or None; local devices are always
        there (:func:`~torq_gen_config.backends.iree_tools.unavailable_device_reason`)."""
        try:
            tool = self._tool("iree-run-module")
        except ToolNotFoundError:
            return None  # each job says where it looked, as for a local device
        return unavailable_device_reason(tool, self.device, timeout_s=timeout_s)

    # ------------------------------------------------------------- describe
    def describe(self, *, probe_timeout_s: float = 60.0) -> dict:
        """Provenance of this executor (the compiler's ``--version`` is probed once per
        run, within ``probe_timeout_s`` seconds: :func:`torq_gen_config.core.tools.tool_version`).

        Returns:
            ``{"kind", "name", "target", "device", "target_cpu", "compile_flags",
            "run_flags", "target_flags", "iree_compile", "iree_run_module",
            "iree_compiler_version", "iree_runtime_version"}``; a tool that cannot be
            found appears as ``{"error": message}`` instead of its path.
        """
        d: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "target": self.target,
            "device": self.device,
            "target_cpu": self.target_cpu,
            "compile_flags": list(self.compile_flags),
            "run_flags": list(self.run_flags),
            "target_flags": self.target_flags(),
        }
        for tool, key in (("iree-compile", "iree_compile"), ("iree-run-module", "iree_run_module")):
            try:
                d[key] = self._tool(tool)
            except ToolNotFoundError as e:
                d[key] = {"error": str(e)}
        d["iree_compiler_version"] = (tool_version(d["iree_compile"], timeout_s=probe_timeout_s,
                                                   pick=_iree_version_line)
                                      if isinstance(d["iree_compile"], str) else None)
        try:
            d["iree_runtime_version"] = metadata.version("iree-base-runtime")
        except metadata.PackageNotFoundError:
            d["iree_runtime_version"] = None
        return d
