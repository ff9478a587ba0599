"""TORQ's tools: where ``torq-compile`` / ``torq-run-module`` are found, the executor
options and the command lines (the per-layer and the full-model compile, the run).

See the package doc (:mod:`torq_gen_config.backends.torq`) for the options and the
command lines; ``docs/torq_backend.md`` for the forcing flags.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...core.errors import ConfigError
from ...core.tools import ToolNotFoundError, tool_from_env
from ..base import check_options

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

_OPTIONS = {
    "executor": str,
    "torq_hw": str,
    "torq_hw_type": str,
    "compile_flags": list,
    "run_flags": list,
}

REPO_ROOT = Path(__file__).resolve().parents[4]


# ------------------------------------------------------------------ tool lookup
def _torq_package_dir() -> str | None:
    """Directory of the installed ``torq`` package (found without importing it), or None."""
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

    Precedence (the original tool's: docs/original_tool.md, 'TORQ tools'):

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
    chosen = tool_from_env(name, env_var, "$TORQ_TOOL_PATH, the installed torq wheels, the build tree and PATH")
    if chosen:
        return chosen
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

