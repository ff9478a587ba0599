"""TORQ backend: compile a layer with ``torq-compile`` forced onto one TORQ executor
(NSS, CSS or Host), run it with ``torq-run-module``.

Executor options (all optional):

``executor`` (``"nss"`` | ``"css"`` | ``"host"``; default: the executor's name)
    The TORQ executor the layer is forced onto. The forcing is done with the
    compiler's disable flags (the layer-ID-keyed ``--torq-executor-map`` of the
    reference tool never matched anything in the C++ pass, see
    ``docs/torq_backend.md``):

    - nss:  ``--torq-disable-css --torq-disable-host``
    - css:  ``--torq-disable-slices --torq-disable-host``
    - host: ``--torq-disable-slices --torq-disable-css``
``torq_hw`` (str, default ``"default"``)
    ``torq-compile --torq-hw=<torq_hw>`` (``default`` is the SL2610).
``torq_hw_type`` (str, default ``"sim"``)
    ``torq-run-module --torq_hw_type=<torq_hw_type>``. For ``sim`` and ``aws_fpga``
    the compile also gets ``--torq-target-host-triple=native`` (the host code runs
    on this machine), as the reference tool does.
``compile_flags`` (list of str)
    Extra ``torq-compile`` flags, after the forcing flags.
``run_flags`` (list of str)
    Extra ``torq-run-module`` flags, after ``--torq_hw_type``.

Command lines (``<work>`` is the job's work directory, absolute)::

    torq-compile <layer.mlir> -o <work>/module.vmfb --torq-hw=<torq_hw>
        [--torq-target-host-triple=native] <forcing flags> <compile_flags>
    torq-run-module --module=<work>/module.vmfb --function=main
        --output=@<work>/outputs/output_0.bin ... --torq_hw_type=<torq_hw_type> <run_flags>
        --input=<shape>x<type>=@<work>/inputs/input_0.bin ...

Inputs are written as raw little-endian ``.bin`` files and described with IREE's
type names (``f32``, ``f16``, ``bf16``, ``f64``, ``i1`` for bool, ``i8`` ... ``i64``,
``ui8`` ... ``ui64``; a scalar is ``--input=f32=@file``). Outputs are read back from
the raw ``.bin`` files the runtime writes, with the shape and dtype of the layer's
MLIR signature (or given by the caller, see :meth:`TorqBackend.run`); one dynamic
dimension is inferred from the file size.

The full-model compile (all layers, placed by the compiler JSON) is built by
:func:`full_model_compile_argv`: no forcing flags, ``--torq-executor-map=<compiler
JSON>`` last.

Tools: see :func:`find_torq_tool` (``$TORQ_COMPILE`` / ``$TORQ_RUN_MODULE``,
``$TORQ_TOOL_PATH``, the installed ``torq`` wheels, the build tree, ``PATH``). A
missing tool is a ``compile`` (``torq-compile``) or ``run`` (``torq-run-module``)
error verdict whose message names every place searched.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import ConfigError
from ..tools import ToolNotFoundError, bounded_message, run_tool, tool_version
from .base import Backend, CompiledArtifact, StageError, check_inputs, check_options, raise_for_tool_failure

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "TorqBackend",
    "TORQ_EXECUTORS",
    "FORCING_FLAGS",
    "TOOLS",
    "find_torq_tool",
    "tool_search_places",
    "full_model_compile_argv",
    "run_module_argv",
    "iree_type_name",
    "input_spec",
    "write_input_bin",
    "read_output_bin",
]

#: TORQ executors in the seed's priority order.
TORQ_EXECUTORS = ("nss", "css", "host")

#: executor -> the torq-compile flags that force a layer onto it.
FORCING_FLAGS: dict[str, tuple[str, ...]] = {
    "nss": ("--torq-disable-css", "--torq-disable-host"),
    "css": ("--torq-disable-slices", "--torq-disable-host"),
    "host": ("--torq-disable-slices", "--torq-disable-css"),
}

#: tool name -> (environment variable, sub-directory of the installed ``torq`` package)
TOOLS: dict[str, tuple[str, str]] = {
    "torq-compile": ("TORQ_COMPILE", "_compiler_libs"),
    "torq-run-module": ("TORQ_RUN_MODULE", "_runtime_libs"),
}

#: hardware types whose compile gets ``--torq-target-host-triple=native``.
NATIVE_HOST_HW_TYPES = ("sim", "aws_fpga")

FUNCTION = "main"
MODULE_FILE = "module.vmfb"
INPUTS_DIR = "inputs"
OUTPUTS_DIR = "outputs"

_OPTIONS = {
    "executor": str,
    "torq_hw": str,
    "torq_hw_type": str,
    "compile_flags": list,
    "run_flags": list,
}

# numpy dtype name -> IREE element type name (the --input=<shape>x<type> syntax).
_IREE_TYPES = {
    "bool": "i1",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "ui8",
    "uint16": "ui16",
    "uint32": "ui32",
    "uint64": "ui64",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
}
# Messages LLVM's crash handler prints before re-raising the signal.

REPO_ROOT = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------ tool lookup
def _torq_package_dir() -> str | None:
    """Directory of the installed ``torq`` package (found without importing it), or None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torq")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _is_exe(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _build_tree(repo_root: str | os.PathLike | None) -> tuple[str, str]:
    """(build directory, how it was chosen) for the build-tree step of the lookup."""
    env = os.environ.get("IREE_BUILD_DIR", "")
    if env:
        return env, "$IREE_BUILD_DIR"
    root = Path(repo_root) if repo_root is not None else REPO_ROOT
    return str(root.parent / "iree-build"), "../iree-build next to the repository"


def tool_search_places(name: str, *, repo_root: str | os.PathLike | None = None) -> list[tuple[str, str | None]]:
    """The places :func:`find_torq_tool` searches, in order, as ``(description, candidate path)``.

    The candidate is None where a step does not apply (variable unset, ``torq`` not
    installed); the PATH step has the candidate ``None`` and is searched with
    :func:`shutil.which`.

    Raises:
        ValueError: ``name`` is not ``"torq-compile"`` or ``"torq-run-module"``.
    """
    if name not in TOOLS:
        raise ValueError(f"find_torq_tool: unknown tool {name!r} (known: {', '.join(TOOLS)})")
    env_var, sub = TOOLS[name]
    places: list[tuple[str, str | None]] = []
    value = os.environ.get(env_var, "")
    places.append((f"${env_var}" + (f"={value!r}" if value else " (unset)"), value or None))
    tool_path = os.environ.get("TORQ_TOOL_PATH", "")
    dirs = [d for d in tool_path.split(os.pathsep) if d]
    if dirs:
        for d in dirs:
            places.append((f"$TORQ_TOOL_PATH entry {os.path.join(d, name)}", os.path.join(d, name)))
    else:
        places.append(("$TORQ_TOOL_PATH (unset)", None))
    pkg = _torq_package_dir()
    if pkg:
        cand = os.path.join(pkg, sub, name)
        places.append((f"installed wheel {cand}", cand))
    else:
        places.append((f"installed wheel torq/{sub}/{name} (package 'torq' not installed)", None))
    build, how = _build_tree(repo_root)
    cand = os.path.join(build, "tools", name)
    places.append((f"build tree {cand} ({how})", cand))
    places.append((f"PATH={os.environ.get('PATH', '')}", None))
    return places


def find_torq_tool(name: str, *, repo_root: str | os.PathLike | None = None) -> str:
    """Absolute path of ``torq-compile`` or ``torq-run-module``.

    Precedence (seed 001 section 2, "Runtime Requirements"):

    1. ``$TORQ_COMPILE`` / ``$TORQ_RUN_MODULE``: a path, or a name looked up on
       ``PATH``. Set but not an executable is an error (no silent fallback);
    2. the directories of ``$TORQ_TOOL_PATH`` (separated like ``PATH``);
    3. the installed wheels: ``torq/_compiler_libs/torq-compile``,
       ``torq/_runtime_libs/torq-run-module`` inside the installed ``torq`` package;
    4. a build tree: ``$IREE_BUILD_DIR/tools/<name>``, or when that variable is
       unset ``<repo>/../iree-build/tools/<name>``;
    5. ``PATH``.

    Args:
        name: ``"torq-compile"`` or ``"torq-run-module"``.
        repo_root: the repository whose sibling ``iree-build`` is searched (default:
            this checkout; for tests).

    Returns:
        The absolute path of an existing executable file.

    Raises:
        ToolNotFoundError: not found; the message names every place searched.
        ValueError: unknown tool name.
    """
    places = tool_search_places(name, repo_root=repo_root)
    env_var = TOOLS[name][0]
    value = os.environ.get(env_var, "")
    if value:
        if os.sep in value or (os.altsep and os.altsep in value):
            if _is_exe(value):
                return os.path.abspath(value)
        else:
            found = shutil.which(value)
            if found:
                return os.path.abspath(found)
        raise ToolNotFoundError(
            f"{name}: ${env_var}={value!r} is not an executable file (unset {env_var} to search "
            "$TORQ_TOOL_PATH, the installed torq wheels, the build tree and PATH)"
        )
    for _desc, cand in places[1:-1]:
        if cand and _is_exe(cand):
            return os.path.abspath(cand)
    found = shutil.which(name)
    if found:
        return os.path.abspath(found)
    searched = "; ".join(desc for desc, _ in places)
    raise ToolNotFoundError(
        f"TORQ tool {name!r} not found; searched: {searched}. Install the TORQ compiler/runtime wheels, "
        f"or set ${env_var} (the executable) or $TORQ_TOOL_PATH (directories)"
    )


# --------------------------------------------------------------- command lines
def _parse_options(name: str, options: Mapping[str, Any] | None) -> dict:
    """Validated options with defaults: executor, torq_hw, torq_hw_type, compile_flags, run_flags."""
    options = dict(options or {})
    check_options(name, options, _OPTIONS)
    executor = options.get("executor") or name
    if executor not in FORCING_FLAGS:
        if options.get("executor"):
            raise ConfigError(
                f"executor {name!r}: option 'executor' must be one of {', '.join(TORQ_EXECUTORS)}, got {executor!r}"
            )
        raise ConfigError(
            f"executor {name!r}: the name is not a TORQ executor ({', '.join(TORQ_EXECUTORS)}); "
            "set options.executor"
        )
    for key in ("compile_flags", "run_flags"):
        flags = options.get(key) or []
        if not all(isinstance(x, str) for x in flags):
            raise ConfigError(f"executor {name!r}: option {key!r} must be a list of strings, got {flags!r}")
    for key in ("torq_hw", "torq_hw_type"):
        if options.get(key) == "":
            raise ConfigError(f"executor {name!r}: option {key!r} must not be empty")
    return {
        "executor": executor,
        "torq_hw": options.get("torq_hw") or "default",
        "torq_hw_type": options.get("torq_hw_type") or "sim",
        "compile_flags": list(options.get("compile_flags") or []),
        "run_flags": list(options.get("run_flags") or []),
    }


def _hw_flags(torq_hw: str, torq_hw_type: str) -> list[str]:
    flags = [f"--torq-hw={torq_hw}"]
    if torq_hw_type in NATIVE_HOST_HW_TYPES:
        flags.append("--torq-target-host-triple=native")
    return flags


def full_model_compile_argv(
    mlir: str | os.PathLike,
    out_vmfb: str | os.PathLike,
    executor_map_json: str | os.PathLike,
    options: Mapping[str, Any] | None = None,
) -> list[str]:
    """The ``torq-compile`` command line for a full-model compile placed by a compiler JSON.

    ``torq-compile <mlir> -o <out_vmfb> --torq-hw=<torq_hw> [--torq-target-host-triple=native]
    <compile_flags> --torq-executor-map=<executor_map_json>``: no forcing flags (every
    executor stays enabled); the compiler's ExecutorAssignmentPass places each op by
    the ``line:col`` keys of the map's ``op_assignments``.

    Args:
        mlir: the full model's MLIR (the file the map's ``line:col`` keys refer to).
        out_vmfb: the module to write.
        executor_map_json: the compiler JSON (``{"op_assignments": {"L:C": {"executor"}}}``).
        options: a torq executor's options (``torq_hw``, ``torq_hw_type``,
            ``compile_flags``; ``executor`` and ``run_flags`` are accepted and unused).

    Returns:
        The argv list; paths are made absolute.

    Raises:
        ConfigError: invalid options.
        ToolNotFoundError: ``torq-compile`` cannot be found (the message names every
            place searched).
    """
    opts = dict(options or {})
    opts.setdefault("executor", "nss")  # the forcing executor is irrelevant here
    o = _parse_options("torq-full-model", opts)
    return [
        find_torq_tool("torq-compile"),
        os.path.abspath(mlir),
        "-o",
        os.path.abspath(out_vmfb),
        *_hw_flags(o["torq_hw"], o["torq_hw_type"]),
        *o["compile_flags"],
        f"--torq-executor-map={os.path.abspath(executor_map_json)}",
    ]


def run_module_argv(
    module: str | os.PathLike,
    inputs: Sequence[tuple[str, str | os.PathLike]],
    outputs: Sequence[str | os.PathLike],
    options: Mapping[str, Any] | None = None,
    *,
    function: str = FUNCTION,
) -> list[str]:
    """The ``torq-run-module`` command line.

    ``torq-run-module --module=<module> --function=<function> --output=@<out_0> ...
    --torq_hw_type=<torq_hw_type> <run_flags> --input=<spec_0>=@<in_0> ...``

    Args:
        module: the ``.vmfb``.
        inputs: ``(spec, raw file)`` per function argument in order; ``spec`` as made by
            :func:`input_spec` (``"1x3x8x8xf32"``).
        outputs: the raw ``.bin`` files the runtime writes, one per result in order.
        options: a torq executor's options (``torq_hw_type``, ``run_flags``).
        function: the exported function.

    Raises:
        ConfigError: invalid options.
        ToolNotFoundError: ``torq-run-module`` cannot be found.
    """
    opts = dict(options or {})
    opts.setdefault("executor", "nss")
    o = _parse_options("torq-run", opts)
    return [
        find_torq_tool("torq-run-module"),
        f"--module={os.path.abspath(module)}",
        f"--function={function}",
        *[f"--output=@{os.path.abspath(p)}" for p in outputs],
        f"--torq_hw_type={o['torq_hw_type']}",
        *o["run_flags"],
        *[f"--input={spec}=@{os.path.abspath(p)}" for spec, p in inputs],
    ]


# ------------------------------------------------------------------ raw data
def iree_type_name(dtype: Any) -> str:
    """IREE's element type name for a numpy dtype (``float32`` -> ``f32``, ``bool`` -> ``i1``).

    Raises:
        ValueError: a dtype IREE's tools cannot exchange (strings, objects, complex, ...).
    """
    import numpy as np

    name = np.dtype(dtype).name
    if name not in _IREE_TYPES:
        raise ValueError(f"dtype {name} has no IREE element type (supported: {', '.join(_IREE_TYPES)})")
    return _IREE_TYPES[name]


def input_spec(arr: "np.ndarray") -> str:
    """``<d0>x<d1>x...x<type>`` for an array (``f32`` alone for a scalar)."""
    return "x".join([*(str(int(d)) for d in arr.shape), iree_type_name(arr.dtype)])


def write_input_bin(arr: "np.ndarray", path: str | os.PathLike) -> str:
    """Write ``arr`` as raw little-endian data (row-major) and return its :func:`input_spec`.

    Raises:
        ValueError: unsupported dtype.
    """
    import numpy as np

    arr = np.asarray(arr)
    spec = input_spec(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.require(arr, requirements="C").tofile(os.fspath(path))
    return spec


def _numpy_dtype(dtype: str):
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype).newbyteorder("<")


def read_output_bin(path: str | os.PathLike, shape: Sequence[int | None], dtype: str) -> "np.ndarray":
    """Read a raw output file written by ``torq-run-module --output=@<file>.bin``.

    Args:
        path: the file.
        shape: the result's shape; at most one ``None`` (dynamic) dimension, inferred
            from the file size.
        dtype: numpy dtype name (``"float32"``, ``"bool"``, ``"bfloat16"``, ...).

    Returns:
        The array, in native byte order.

    Raises:
        ValueError: unknown dtype, more than one dynamic dimension, or a file size
            that does not fit the shape.
    """
    import numpy as np

    try:
        dt = _numpy_dtype(dtype)
    except TypeError:
        raise ValueError(f"cannot read a raw output of element type {dtype!r}") from None
    data = np.fromfile(os.fspath(path), dtype=dt)
    shape = list(shape)
    unknown = [i for i, d in enumerate(shape) if d is None]
    if len(unknown) > 1:
        raise ValueError(f"raw output {os.fspath(path)}: shape {shape} has more than one dynamic dimension")
    known = int(np.prod([d for d in shape if d is not None], dtype=np.int64))
    if unknown:
        if known == 0 or data.size % known:
            raise ValueError(f"raw output {os.fspath(path)}: {data.size} values do not fit shape {shape}")
        shape[unknown[0]] = data.size // known
    elif data.size != known:
        raise ValueError(
            f"raw output {os.fspath(path)}: holds {data.size} {dtype} values, expected {known} for shape {shape}"
        )
    arr = data.reshape(shape)
    return arr.astype(arr.dtype.newbyteorder("=")) if arr.dtype.byteorder == ">" else arr


# ------------------------------------------------------------------- backend
class TorqBackend(Backend):
    """Executor on a TORQ NPU executor (nss, css or host), via torq-compile / torq-run-module."""

    kind = "torq"
    needs_mlir = True

    def __init__(self, name: str, options: dict | None):
        """Validate the options.

        Raises:
            ConfigError: unknown option or wrong type; ``executor`` not nss/css/host
                (or, without the option, an executor name that is not one of them);
                ``compile_flags``/``run_flags`` not lists of strings.
        """
        super().__init__(name, options)
        o = _parse_options(name, self.options)
        self.executor: str = o["executor"]
        self.torq_hw: str = o["torq_hw"]
        self.torq_hw_type: str = o["torq_hw_type"]
        self.compile_flags: list[str] = o["compile_flags"]
        self.run_flags: list[str] = o["run_flags"]
        self._tools: dict[str, str] = {}

    # ----------------------------------------------------------------- tools
    def _tool(self, name: str) -> str:
        if name not in self._tools:
            self._tools[name] = find_torq_tool(name)
        return self._tools[name]

    def forcing_flags(self) -> list[str]:
        """The disable flags that force a layer onto this executor."""
        return list(FORCING_FLAGS[self.executor])

    def compile_argv(self, mlir_path: str, output_path: str) -> list[str]:
        """The full ``torq-compile`` command line for one layer (see the module doc).

        Raises:
            ToolNotFoundError: ``torq-compile`` cannot be found.
        """
        return [self._tool("torq-compile"), mlir_path, "-o", output_path,
                *_hw_flags(self.torq_hw, self.torq_hw_type), *self.forcing_flags(), *self.compile_flags]

    def run_argv(self, module: str, inputs: Sequence[tuple[str, str]], outputs: Sequence[str],
                 function: str = FUNCTION) -> list[str]:
        """The full ``torq-run-module`` command line (see :func:`run_module_argv`).

        Raises:
            ToolNotFoundError: ``torq-run-module`` cannot be found.
        """
        return [self._tool("torq-run-module"), f"--module={module}", f"--function={function}",
                *[f"--output=@{p}" for p in outputs], f"--torq_hw_type={self.torq_hw_type}", *self.run_flags,
                *[f"--input={spec}=@{p}" for spec, p in inputs]]

    # -------------------------------------------------------------- compile
    def compile(
        self,
        *,
        onnx_path: str,
        mlir_path: str | None,
        work_dir: str,
        timeout_s: float,
        log_path: str | None,
    ) -> CompiledArtifact:
        """Compile the layer's MLIR into ``<work_dir>/module.vmfb`` on this TORQ executor.

        The command (run in ``work_dir``) is ``torq-compile <mlir> -o <work>/module.vmfb
        --torq-hw=<torq_hw> [--torq-target-host-triple=native] <forcing flags>
        <compile_flags>``. An old module is removed first, a failed compile's partial
        output afterwards.

        Returns:
            CompiledArtifact with ``path`` = the ``.vmfb``, ``compile_ms``, and ``info`` =
            ``{"argv", "onnx_path", "mlir_path", "executor", "torq_hw", "torq_hw_type",
            "function", "vmfb_bytes", "signature", ["compiler_stderr"]}``.

        Raises:
            StageError: ``"compile"`` (non-zero exit, or ``torq-compile`` not found:
                the message names every place searched), ``"timeout"`` / ``"crash"``
                with ``during="compile"``.
            ValueError: ``mlir_path`` is None.
            FileNotFoundError: ``mlir_path`` does not exist.
        """
        from .iree import compile_mlir_module

        if mlir_path is None:
            raise ValueError(f"executor {self.name!r} (torq) needs the layer's MLIR file, got mlir_path=None")
        if not os.path.isfile(mlir_path):
            raise FileNotFoundError(f"layer MLIR file not found: {mlir_path}")
        work = Path(work_dir).absolute()
        work.mkdir(parents=True, exist_ok=True)
        out = work / MODULE_FILE
        out.unlink(missing_ok=True)
        try:
            argv = self.compile_argv(os.path.abspath(mlir_path), str(out))
        except ToolNotFoundError as e:
            _log_line(log_path, f"torq backend: {e}")
            raise StageError("compile", str(e)) from None
        return compile_mlir_module(argv, tool="torq-compile", out=out, mlir_path=mlir_path, onnx_path=onnx_path,
                                   timeout_s=timeout_s, log_path=log_path, cwd=str(work),
                                   info={"executor": self.executor, "torq_hw": self.torq_hw,
                                         "torq_hw_type": self.torq_hw_type})

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
        output_specs: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[dict[str, "np.ndarray"], float]:
        """Run the compiled module once with ``torq-run-module``.

        Inputs go to ``<work>/inputs/input_<i>.bin`` (raw, ``input_names`` order),
        outputs come back from ``<work>/outputs/output_<i>.bin`` (raw), read with the
        shapes/dtypes of ``output_specs`` when given, else of the layer's MLIR
        signature (``artifact.info["signature"]``).

        Args:
            artifact: from :meth:`compile` (or any CompiledArtifact whose ``path`` is a
                TORQ ``.vmfb``; ``info["function"]`` names the function, default main).
            inputs, input_names, output_names, work_dir, timeout_s, log_path: as in
                :meth:`Backend.run`.
            output_specs: ``[{"shape": [...], "dtype": "float32"}, ...]``, one per
                output name (overrides the signature).

        Returns:
            ``(outputs, run_ms)``; ``run_ms`` is the wall time of the ``torq-run-module``
            process (simulator start-up included).

        Raises:
            StageError: ``"run"`` (non-zero exit, ``torq-run-module`` not found, an
                input dtype it cannot take, a missing or ill-sized output file, no
                output shapes known), ``"timeout"`` / ``"crash"`` with ``during="run"``.
            ValueError: an input is missing, ``artifact.path`` is None, or
                ``output_specs`` has the wrong length.
            FileNotFoundError: the module file does not exist.
        """
        check_inputs(inputs, input_names)
        if artifact.path is None:
            raise ValueError(f"executor {self.name!r}: artifact has no module path")
        module = os.path.abspath(artifact.path)
        if not os.path.isfile(module):
            raise FileNotFoundError(f"TORQ module not found: {module}")
        info = artifact.info or {}
        if output_specs is not None:
            specs = [dict(s) for s in output_specs]
            if len(specs) != len(output_names):
                raise ValueError(f"output_specs has {len(specs)} entries for {len(output_names)} outputs")
        else:
            specs = ((info.get("signature") or {}).get("outputs") or [])
            if len(specs) != len(output_names):
                raise StageError(
                    "run",
                    f"cannot read torq-run-module's raw outputs: the layer's MLIR signature gives "
                    f"{len(specs)} result type(s) for {len(output_names)} outputs {output_names}",
                )
        work = Path(work_dir).absolute()
        in_dir, out_dir = work / INPUTS_DIR, work / OUTPUTS_DIR
        in_dir.mkdir(parents=True, exist_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)

        in_files: list[tuple[str, str]] = []
        for i, name in enumerate(input_names):
            path = in_dir / f"input_{i}.bin"
            try:
                spec = write_input_bin(inputs[name], path)
            except ValueError as e:
                raise StageError("run", f"input {name!r}: {e}; torq-run-module cannot read it") from None
            in_files.append((spec, str(path)))
        out_files = [str(out_dir / f"output_{i}.bin") for i in range(len(output_names))]
        for p in out_files:
            Path(p).unlink(missing_ok=True)
        try:
            argv = self.run_argv(module, in_files, out_files, function=info.get("function") or FUNCTION)
        except ToolNotFoundError as e:
            _log_line(log_path, f"torq backend: {e}")
            raise StageError("run", str(e)) from None

        res = run_tool(argv, timeout_s=timeout_s, cwd=str(work), log_path=log_path)
        raise_for_tool_failure(res, tool="torq-run-module", during="run", timeout_s=timeout_s)

        outputs: dict[str, Any] = {}
        for name, path, spec in zip(output_names, out_files, specs):
            if not os.path.isfile(path):
                raise StageError("run", f"torq-run-module exited with status 0 but wrote no output file {path} "
                                        f"for {name!r}")
            try:
                outputs[name] = read_output_bin(path, spec["shape"], spec["dtype"])
            except ValueError as e:
                raise StageError("run", f"output {name!r}: {e}") from None
        return outputs, res.wall_ms

    # ------------------------------------------------------------- describe
    def describe(self, *, probe_timeout_s: float = 60.0) -> dict:
        """Provenance of this executor (the compiler's ``--version`` is probed once per
        run, within ``probe_timeout_s`` seconds: :func:`torq_gen_config.tools.tool_version`).

        Returns:
            ``{"kind", "name", "executor", "torq_hw", "torq_hw_type", "forcing_flags",
            "compile_flags", "run_flags", "torq_compile", "torq_run_module",
            "torq_compiler_version"}``; a tool that cannot be found appears as
            ``{"error": message}`` (the places searched) instead of its path.
        """
        d: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "executor": self.executor,
            "torq_hw": self.torq_hw,
            "torq_hw_type": self.torq_hw_type,
            "forcing_flags": self.forcing_flags(),
            "compile_flags": list(self.compile_flags),
            "run_flags": list(self.run_flags),
        }
        for tool, key in (("torq-compile", "torq_compile"), ("torq-run-module", "torq_run_module")):
            try:
                d[key] = self._tool(tool)
            except ToolNotFoundError as e:
                d[key] = {"error": str(e)}
        d["torq_compiler_version"] = (tool_version(d["torq_compile"], timeout_s=probe_timeout_s)
                                      if isinstance(d["torq_compile"], str) else None)
        return d

def _log_line(log_path: str | None, text: str) -> None:
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(text.rstrip("\n") + "\n")
