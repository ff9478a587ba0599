"""Backends: how an executor compiles and runs one layer.

The registry :data:`BACKEND_KINDS` maps a backend kind (the ``backend`` field of an
executor in the configuration) to ``"module:Class"``. Backend modules are imported
lazily, only when an executor of that kind is made, so a backend whose
dependencies are missing or broken does not affect the others.

To add a backend: write ``torq_gen_config/backends/<kind>.py`` with a
:class:`~torq_gen_config.backends.base.Backend` subclass and add one line here
(``docs/backends.md``). Everything else the workflow needs to know about a backend
(whether it compiles MLIR, takes the tool options, can run a partition of the
full-model chain, compiles a whole model at once) is a capability of its class; the
config schema's ``backend`` enum is this registry's keys (``config.py``).
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.errors import ConfigError
from .base import Backend, CompiledArtifact, RunWideOption, StageError

__all__ = [
    "BACKEND_KINDS",
    "Backend",
    "BackendUnavailableError",
    "CompiledArtifact",
    "StageError",
    "UnknownBackendError",
    "backend_class",
    "make_backend",
    "capabilities",
    "effective_executor",
    "executor_with_tool_options",
    "needs_mlir",
    "run_wide_options",
    "run_wide_overrides",
    "unavailable_executors",
]

#: backend kind -> "module:Class": the one line a new backend adds (docs/backends.md)
BACKEND_KINDS: dict[str, str] = {
    "iree": "torq_gen_config.backends.iree:IreeBackend",
    "onnxruntime": "torq_gen_config.backends.onnxruntime:OnnxRuntimeBackend",
    "torq": "torq_gen_config.backends.torq:TorqBackend",
}


class UnknownBackendError(ConfigError, ValueError):
    """An executor names a backend kind that is not in :data:`BACKEND_KINDS`."""


class BackendUnavailableError(ConfigError, ImportError):
    """The module of a requested backend cannot be imported (missing or broken dependency)."""


def backend_class(kind: str) -> type[Backend]:
    """The Backend subclass registered for ``kind``, imported on first use.

    Raises:
        UnknownBackendError (a ValueError): ``kind`` is not registered; the message
            lists the known kinds.
        BackendUnavailableError (an ImportError): the backend's module fails to
            import or lacks the class; the message names the backend and the error.
    """
    if kind not in BACKEND_KINDS:
        raise UnknownBackendError(
            f"unknown backend {kind!r} (known backends: {', '.join(sorted(BACKEND_KINDS))})"
        )
    target = BACKEND_KINDS[kind]
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or any error raised while the module runs
        raise BackendUnavailableError(
            f"backend {kind!r} is unavailable: importing {module_name} failed: {type(e).__name__}: {e}"
        ) from e
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendUnavailableError(
            f"backend {kind!r} is unavailable: {module_name} has no Backend subclass {class_name!r}"
        )
    return cls


def make_backend(executor: Mapping[str, Any]) -> Backend:
    """Create the backend object for one executor of the configuration.

    Args:
        executor: ``{"name": str, "backend": kind, "options": dict}``; ``options``
            may be omitted (empty).

    Returns:
        An instance of the registered Backend subclass, with validated options.

    Raises:
        ConfigError: ``executor`` is not a mapping, or lacks a non-empty ``name``
            or ``backend`` string; or the backend rejects the options.
        UnknownBackendError (ConfigError and ValueError): unknown backend kind; the
            message lists the known kinds.
        BackendUnavailableError (ConfigError and ImportError): the backend's module
            cannot be imported; the message names the executor, backend and error.
    """
    if not isinstance(executor, Mapping):
        raise ConfigError(f"an executor must be a mapping with name/backend/options, got {type(executor).__name__}")
    name = executor.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"executor {dict(executor)!r}: 'name' must be a non-empty string")
    kind = executor.get("backend")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"executor {name!r}: 'backend' must be a non-empty string")
    options = executor.get("options")
    try:
        cls = backend_class(kind)
    except UnknownBackendError as e:
        raise UnknownBackendError(f"executor {name!r}: {e}") from None
    except BackendUnavailableError as e:
        raise BackendUnavailableError(f"executor {name!r}: {e}") from e.__cause__
    return cls(name, options if options is not None else {})


def capabilities(kind: str | None) -> type[Backend]:
    """The class whose capabilities describe backend ``kind``: its registered class,
    or :class:`Backend` itself (default capabilities) when ``kind`` is unknown or its
    module fails to import (the error surfaces when an executor of it is made)."""
    try:
        return backend_class(kind) if isinstance(kind, str) else Backend
    except (UnknownBackendError, BackendUnavailableError):
        return Backend


def needs_mlir(kind: str | None) -> bool:
    """Whether backend ``kind`` compiles the layer's MLIR (its class's ``needs_mlir``), so
    the workflow must import the layer first. A kind that is unknown or whose module fails
    to import counts as needing MLIR: the import runs and its jobs fail with the error."""
    try:
        return bool(backend_class(kind).needs_mlir) if isinstance(kind, str) else True
    except (UnknownBackendError, BackendUnavailableError):
        return True


def effective_executor(executor: Mapping, compiler_options: Iterable[str] = (),
                       runtime_options: Iterable[str] = ()) -> dict:
    """The executor definition a full-model run uses (a deep copy): the config's
    ``compiler_options`` / ``runtime_options`` (``--compiler-option`` /
    ``--runtime-option``) applied as by :func:`executor_with_tool_options`, as in discovery."""
    ex = copy.deepcopy(dict(executor))
    ex["options"] = dict(ex.get("options") or {})
    return copy.deepcopy(executor_with_tool_options(ex, list(compiler_options), list(runtime_options)))


def run_wide_options() -> list[RunWideOption]:
    """Every registered backend's run-wide settings (:class:`~.base.RunWideOption`),
    in registry order, each key once: the CLI adds a flag, the config schema a key,
    for each. A backend whose module fails to import offers none."""
    seen: dict[str, RunWideOption] = {}
    for kind in BACKEND_KINDS:
        for option in capabilities(kind).run_wide_options:
            seen.setdefault(option.key, option)
    return list(seen.values())


def run_wide_overrides(config: Mapping[str, Any]) -> dict[str, str]:
    """The run-wide settings of ``config`` (validated config dict): key -> value
    (str, ``""`` = keep each executor's option), for :func:`executor_with_tool_options`."""
    return {o.key: config.get(o.key) or "" for o in run_wide_options()}


def executor_with_tool_options(executor: dict, compiler_options: list[str], runtime_options: list[str],
                               overrides: Mapping[str, str] | None = None) -> dict:
    """The executor definition with the user's tool options applied (a new dict).

    ``compiler_options``/``runtime_options`` are appended to ``compile_flags`` /
    ``run_flags`` of backends that take them (``takes_tool_options``: iree, torq);
    each not-empty value of ``overrides`` (:func:`run_wide_overrides`: config key ->
    value) replaces the option of that name of backends that offer it as a
    run-wide option (torq: ``torq_hw``, ``torq_hw_type``). Executors of other
    backends (or of unknown ones) are returned unchanged (the same object).
    """
    opts = capabilities(executor["backend"]).with_tool_options(
        executor.get("options"), compiler_options, runtime_options, overrides)
    if opts is None:
        return executor
    return {**executor, "options": opts}


_UNAVAILABLE_CACHE: dict[str, str | None] = {}


def unavailable_executors(executors: Iterable[Mapping], *, timeout_s: float = 60.0) -> dict[str, str]:
    """The executors (definitions with the tool options applied) that cannot run on
    this machine: name -> reason (:meth:`Backend.unavailable_reason`: a GPU executor's
    device or execution provider is missing). Each definition is probed once per
    process (the Snakefile asks at every parse). An executor whose definition is
    invalid or whose backend fails to import is not reported here: its jobs say why.
    """
    found = {}
    for executor in executors:
        key = json.dumps(executor, sort_keys=True, default=str)
        if key not in _UNAVAILABLE_CACHE:
            try:
                reason = make_backend(executor).unavailable_reason(timeout_s=timeout_s)
            except Exception:  # a bad definition or a broken probe: the executor's own jobs say why
                reason = None
            _UNAVAILABLE_CACHE[key] = reason
        if _UNAVAILABLE_CACHE[key]:
            found[executor["name"]] = _UNAVAILABLE_CACHE[key]
    return found
