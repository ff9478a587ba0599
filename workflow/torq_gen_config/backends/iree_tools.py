"""IREE's tools and module files, shared by the backends that drive IREE-based
compilers (iree, torq): where the tools are, the argument and result types of an
imported layer's MLIR, compiling a module, and ``iree-benchmark-module``'s JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

from ..core.lazy import np
from ..core.logs import append_record
from ..core.tools import bounded_message, find_tool, run_tool
from ..mlir.importer import has_stored_weights, write_with_weights
from .base import CompiledArtifact, StageError, raise_for_tool_failure

#: the folder beside a module where an MLIR file that refers to weight-store bytes is written
#: out with them for its compile (same file name: diagnostics name it; kept when the compile fails)
WITH_WEIGHTS_DIR = ".with_weights"

#: The exported function of every layer module (the ONNX graph is named "main"
#: before import, and the importer names the function after the graph).
FUNCTION = "main"


# torch-mlir element types -> numpy dtype names (bfloat16 is ml_dtypes').
_TORCH_DTYPES = {
    "i1": "bool",
    "si8": "int8",
    "si16": "int16",
    "si32": "int32",
    "si64": "int64",
    "ui8": "uint8",
    "ui16": "uint16",
    "ui32": "uint32",
    "ui64": "uint64",
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "f8E4M3FN": "float8_e4m3fn",
    "f8E4M3FNUZ": "float8_e4m3fnuz",
    "f8E5M2": "float8_e5m2",
    "f8E5M2FNUZ": "float8_e5m2fnuz",
    "f8E8M0FNU": "float8_e8m0fnu",
}
# ml_dtypes element types exchanged as raw bytes: iree-run-module cannot read or write
# them as .npy ("unsupported data encoding"); name -> IREE's element type spelling
_RAW_DTYPES = {np_name: ir for ir, np_name in _TORCH_DTYPES.items() if np_name.startswith(("bfloat16", "float8"))}
_VTENSOR = re.compile(r"!torch\.vtensor<\[([^\]]*)\],([^>]+)>")


def _iree_version_line(line: str) -> bool:
    """The line of ``iree-compile --version`` that names IREE's version."""
    return "version" in line.lower() and "IREE" in line

def _package_dir(module: str) -> str | None:
    """Directory of an installed package, without importing it (only its parents)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def iree_tool_path(name: str) -> str:
    """Path of an IREE command-line tool (``"iree-compile"``, ``"iree-run-module"`` or
    ``"iree-benchmark-module"``).

    Search order: ``$IREE_COMPILE`` / ``$IREE_RUN_MODULE`` / ``$IREE_BENCHMARK_MODULE``;
    the native binary inside the installed wheel (``iree/compiler/_mlir_libs`` or
    ``iree/_runtime_libs``); the interpreter's ``bin`` directory; ``PATH``.

    Raises:
        ToolNotFoundError: not found; the message names every place searched.
        ValueError: ``name`` is not one of the three tools.
    """
    if name == "iree-compile":
        env_var, pkg_dirs = "IREE_COMPILE", [("iree.compiler", "_mlir_libs")]
    elif name == "iree-run-module":
        env_var, pkg_dirs = "IREE_RUN_MODULE", [("iree._runtime_libs", "")]
    elif name == "iree-benchmark-module":
        env_var, pkg_dirs = "IREE_BENCHMARK_MODULE", [("iree._runtime_libs", "")]
    else:
        raise ValueError(f"iree_tool_path: unknown tool {name!r}")
    dirs = []
    for pkg, sub in pkg_dirs:
        d = _package_dir(pkg)
        if d:
            dirs.append(os.path.join(d, sub) if sub else d)
    return find_tool(name, env_var, search_dirs=dirs)


def _parse_types(text: str) -> list[dict]:
    out = []
    for dims, elt in _VTENSOR.findall(text):
        dims = dims.strip()
        shape = [] if not dims else [None if d.strip() == "?" else int(d) for d in dims.split(",")]
        out.append({"shape": shape, "dtype": _TORCH_DTYPES.get(elt.strip(), elt.strip())})
    return out


def compile_mlir_module(argv: list[str], *, tool: str, out: Path, mlir_path: str | os.PathLike,
                        onnx_path: str | os.PathLike | None, timeout_s: float, log_path: str | None,
                        info: dict[str, Any], cwd: str | None = None) -> CompiledArtifact:
    """Run a compiler command line ``argv`` that turns ``mlir_path`` into the module
    ``out`` (``iree-compile``, ``torq-compile``) and describe the result.

    Returns:
        A :class:`CompiledArtifact` (``compile_ms``: the tool's wall time) whose
        ``info`` holds ``argv``, ``onnx_path``, ``mlir_path``, ``function``,
        ``vmfb_bytes``, ``signature`` (:func:`parse_mlir_signature`), bounded
        ``compiler_stderr`` when not empty, and the backend's own ``info`` keys.

    An MLIR file whose weights are references to the weight store (a layer imported with
    ``stored_by_reference``, or a batch merged from such layers) is first written out with
    them (:func:`~torq_gen_config.mlir.importer.write_with_weights`) to
    ``<out's folder>/.with_weights/<its name>``, which the tool compiles in its place; that
    copy is removed after a successful compile and kept after a failed one (the log's
    command line names it, to rerun).

    Raises:
        StageError: the tool timed out, crashed, failed or wrote no module
            (:func:`~torq_gen_config.backends.base.raise_for_tool_failure`); a
            partial module is removed.
    """
    full = None
    if has_stored_weights(mlir_path):
        full = out.parent / WITH_WEIGHTS_DIR / Path(mlir_path).name
        write_with_weights(mlir_path, full)
        names = {os.fspath(mlir_path), os.path.abspath(mlir_path)}
        argv = [str(full.absolute()) if a in names else a for a in argv]
        append_record(log_path, f"{mlir_path} refers to the weight store: compiled as {full} (the weights written in)")
    try:
        res = run_tool(argv, timeout_s=timeout_s, cwd=cwd, log_path=log_path)
        raise_for_tool_failure(res, tool=tool, during="compile", timeout_s=timeout_s)
        if not out.is_file():
            raise StageError("compile", f"{tool} exited with status 0 but wrote no module ({out})")
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    if full is not None:
        full.unlink(missing_ok=True)
        try:
            full.parent.rmdir()
        except OSError:  # another compile's copy is there
            pass
    try:
        signature = parse_mlir_signature(mlir_path)
    except OSError:
        signature = None
    details: dict[str, Any] = {
        "argv": argv,
        "onnx_path": os.fspath(onnx_path) if onnx_path else None,
        "mlir_path": os.fspath(mlir_path),
        **info,
        "function": FUNCTION,
        "vmfb_bytes": out.stat().st_size,
        "signature": signature,
    }
    if res.stderr.strip():
        details["compiler_stderr"] = bounded_message(res.stderr, 2000)
    return CompiledArtifact(path=str(out), compile_ms=res.wall_ms, info=details)


def parse_mlir_signature(mlir_path: str | os.PathLike, function: str = FUNCTION) -> dict | None:
    """Read the argument and result tensor types of ``func.func @<function>`` in an imported layer.

    Only the lines up to the function header are read (the weights blob at the end
    of the file is not).

    Args:
        mlir_path: an MLIR file written by ``iree-import-onnx``.
        function: the function name (``"main"``).

    Returns:
        ``{"inputs": [...], "outputs": [...]}``, each item ``{"shape": [int | None, ...],
        "dtype": str}`` (numpy dtype names, ``"bfloat16"`` for bf16, the torch-mlir
        name for anything else; ``None`` for a dynamic dimension), or None when the
        header is not found or not of the ``!torch.vtensor`` form.

    Raises:
        OSError: the file cannot be read.
    """
    header = f"func.func @{function}("
    with open(mlir_path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            pos = line.find(header)
            if pos < 0:
                continue
            rest = line[pos + len(header):]
            arrow = rest.find(") -> ")
            if arrow < 0:  # no results, or the header spans several lines
                return None
            args, results = rest[:arrow], rest[arrow + len(") -> "):]
            for stop in (" attributes ", " {"):
                cut = results.find(stop)
                if cut >= 0:
                    results = results[:cut]
            return {"inputs": _parse_types(args), "outputs": _parse_types(results)}
    return None


_TIME_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0}


def parse_benchmark_json(text: str, function: str = FUNCTION) -> list[float]:
    """Per-repetition wall times (ms) of ``function`` from ``iree-benchmark-module --benchmark_format=json``.

    Only ``"run_type": "iteration"`` entries are used (the ``mean``/``median``/...
    aggregates are not), in ``repetition_index`` order; each one's ``real_time``
    is divided by its ``iterations`` and converted from its ``time_unit``.

    Raises:
        StageError: ``"run"`` when the text holds no JSON object with benchmarks.
    """
    start = text.find("{")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except ValueError as e:
        data = None
        err = f": {e}"
    else:
        err = ""
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise StageError("run", f"iree-benchmark-module printed no JSON benchmark results{err}\n"
                                f"{bounded_message(text, 2000)}")
    rows = []
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        name = str(b.get("run_name") or b.get("name") or "")
        if not (name.startswith(f"BM_{function}/") or name == f"BM_{function}"):
            continue
        iterations = max(int(b.get("iterations") or 1), 1)
        scale = _TIME_UNITS_MS.get(str(b.get("time_unit") or "ns"), 1e-6)
        rows.append((int(b.get("repetition_index") or 0), float(b["real_time"]) * scale / iterations))
    rows.sort(key=lambda r: r[0])
    return [ms for _, ms in rows]


#: runtime drivers that need no device library: always available
LOCAL_DRIVERS = ("local-sync", "local-task")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def unavailable_device_reason(run_module: str, device: str, *, timeout_s: float = 60.0) -> str | None:
    """Why the IREE runtime device ``device`` (``iree-run-module --device`` value, e.g.
    ``"cuda"`` or ``"cuda://0"``) cannot be used on this machine, or None when it can.

    Asks ``iree-run-module --list_devices=<driver>`` (bounded by ``min(timeout_s, 60)``
    seconds): a driver whose library is missing exits non-zero with IREE's status line
    (``UNAVAILABLE; CUDA driver library 'libcuda.so' ... not available``), a driver
    with no device lists none. Local drivers are not asked (:data:`LOCAL_DRIVERS`).
    """
    driver = device.split("://", 1)[0]
    if driver in LOCAL_DRIVERS:
        return None
    argv = [run_module, f"--list_devices={driver}"]
    res = run_tool(argv, timeout_s=min(timeout_s, 60.0))
    cmd = f"iree-run-module --list_devices={driver}"
    if res.timed_out:
        return f"{cmd} timed out after {min(timeout_s, 60.0):g} s"
    text = _ANSI.sub("", (res.stderr or "") + "\n" + (res.stdout or ""))
    if res.returncode != 0:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "FLAGS ERROR" not in ln]
        status = next((ln for ln in lines if "UNAVAILABLE" in ln or "NOT_FOUND" in ln), lines[0] if lines else "")
        status = re.sub(r"^\S+\.(?:c|cc|cpp):\d+: ", "", status)  # IREE's source location
        return f"no {driver} device: {bounded_message(status, 300) or f'{cmd} exited with {res.returncode}'}"
    if not any(ln.strip().startswith(f"{driver}://") for ln in (res.stdout or "").splitlines()):
        return f"no {driver} device: {cmd} lists none"
    return None


def _has_f64(signature: dict) -> bool:
    return any(t.get("dtype") == "float64" for k in ("inputs", "outputs") for t in (signature or {}).get(k) or [])


def _fix_dtype(arr: "np.ndarray", expected: str) -> "np.ndarray":
    """Reinterpret IREE's signless integer output as the signature's unsigned dtype."""
    if expected.startswith("uint") and arr.dtype.kind == "i":
        target = np.dtype(expected)
        if target.itemsize == arr.dtype.itemsize:
            return arr.view(target)
    return arr
