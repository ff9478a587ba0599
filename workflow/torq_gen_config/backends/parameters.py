"""Where a compiled module gets the model's weights (config ``parameters``,
docs/parameters.md): ``inline``, as constants of the module (the compiler sees, folds
and packs them), or ``external``, as IREE parameters that the runtime loads from the
weight store (``work/<model>/weights.irpa``) when the module is loaded; ``auto`` is
external when the stored weights are at least ``parameters_auto_mb`` MiB.

The setting is resolved once the preparation has run (:func:`resolve`: the weights'
size is in ``prepare.json``); an executor whose backend needs the weights inline
(:attr:`~.base.Backend.inline_weights_only`: torq) makes ``external`` a configuration
error (:func:`check_setting`) and ``auto`` inline. In external mode each layer and
partition is imported with its stored tensors as ``#stream.parameter.named`` globals
(:func:`torq_gen_config.mlir.importer.import_model`) and each executor runs with its
backend's runtime flag naming the store (:func:`with_parameters`).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from ..core.errors import ConfigError
from ..core.weight_store import FOLDED_FILE, STORE_FILE
from . import capabilities

#: the config values of ``parameters``
MODES = ("auto", "inline", "external")
#: ``parameters_auto_mb``'s default: below 1 GiB the per-layer copies of the weights (each
#: layer's MLIR and module hold its own) cost little disk and compile time, and inline
#: weights are what a deployed module usually carries; a model of >= 1 GiB of weights
#: (a large transformer) would put that much again into the MLIR files and the modules,
#: and near protobuf's 2 GB limit a whole-model import is a copy the machine may not fit.
DEFAULT_AUTO_MB = 1024


def inline_only(executors: Iterable[Mapping]) -> list[tuple[str, str]]:
    """``(name, why)`` of the executors whose backend needs the weights inline."""
    out = []
    for e in executors:
        why = capabilities(e.get("backend")).inline_weights_only
        if why:
            out.append((e["name"], why))
    return out


def check_setting(setting: str, executors: Iterable[Mapping]) -> None:
    """Refuse ``parameters: external`` with an executor that needs the weights inline.

    Raises:
        ConfigError: one line naming the executor and why.
    """
    if setting == "external":
        for name, why in inline_only(executors)[:1]:
            raise ConfigError(f"parameters: external (--parameters external) cannot be used with executor {name!r}: "
                              f"{why}; use inline or auto")


def size_text(n: int) -> str:
    """``n`` bytes as ``"1.2 GiB"``, ``"4.8 MiB"``, ``"12.0 KiB"`` or ``"512 B"``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def resolve(setting: str, auto_mb: float, weights_bytes: int | None, executors: Iterable[Mapping]) -> dict:
    """The mode of ``setting`` for this model and these executors.

    Args:
        setting: the config's ``parameters`` (:data:`MODES`).
        auto_mb: ``parameters_auto_mb``.
        weights_bytes: the stored tensors' bytes (``prepare.json``'s ``weights.tensor_bytes``;
            None: unknown, auto is then inline).
        executors: the executors tested (definitions with ``name`` and ``backend``).

    Returns:
        ``{"setting", "mode": "inline"|"external", "reason": str, "weights_bytes",
        "auto_mb"}``; ``reason`` says why in a few words (:func:`describe` gives the line).

    Raises:
        ConfigError: ``external`` with an executor that needs the weights inline.
    """
    executors = list(executors)
    check_setting(setting, executors)
    rec: dict[str, Any] = {"setting": setting, "weights_bytes": weights_bytes, "auto_mb": auto_mb}
    if setting in ("inline", "external"):
        return {**rec, "mode": setting, "reason": "chosen with --parameters or in the config"}
    pinned = inline_only(executors)
    if pinned:
        name, why = pinned[0]
        return {**rec, "mode": "inline", "reason": f"auto: executor {name!r} needs the weights inline: {why}"}
    if weights_bytes is None:
        return {**rec, "mode": "inline", "reason": "auto: the stored weights' size is unknown"}
    size = size_text(weights_bytes)
    if weights_bytes >= auto_mb * (1 << 20):
        return {**rec, "mode": "external", "reason": f"auto: {size} of weights >= {auto_mb:g} MiB"}
    return {**rec, "mode": "inline", "reason": f"auto: {size} of weights < {auto_mb:g} MiB"}


def resolve_from(settings: Mapping, prepare_info: Mapping, executors: Iterable[Mapping]) -> dict:
    """:func:`resolve` of ``settings`` (``{"setting", "auto_mb"}``, the rules' param) with
    the weights' size from ``prepare_info`` (``prepare.json``'s content)."""
    weights = (prepare_info.get("weights") or {}).get("tensor_bytes")
    return resolve(settings["setting"], settings["auto_mb"], weights, executors)


def archives(work_dir: str | os.PathLike, folded: str = FOLDED_FILE) -> list[str]:
    """The absolute paths of the archives the models of ``work_dir`` (``work/<model>``)
    refer to: the weight store and ``folded`` (the split's :data:`~torq_gen_config.core.weight_store.FOLDED_FILE`,
    or the full-model plan's :data:`~torq_gen_config.core.weight_store.FOLDED_RUN_FILE`)."""
    return [os.path.abspath(os.path.join(work_dir, STORE_FILE)), os.path.abspath(os.path.join(work_dir, folded))]


def describe(resolved: Mapping) -> str:
    """``"external (auto: 1.2 GiB of weights >= 1024 MiB)"``: the mode and why."""
    return f"{resolved['mode']} ({resolved['reason']})"


def with_parameters(executor: Mapping, resolved: Mapping | None, archives: list[str]) -> dict:
    """The executor definition as run in ``resolved``'s mode (a new dict): in external
    mode with ``"parameters": "external"`` (the MLIR import of its layers and partitions
    takes the stored tensors as parameters; part of what it compiles) and its backend's
    runtime flags that load ``archives`` (absolute paths: the weight store and the
    archive of folded values its models refer to, :func:`archives`;
    :meth:`~.base.Backend.with_parameters`, a run-only option); else unchanged."""
    ex = dict(executor)
    if not resolved or resolved.get("mode") != "external":
        return ex
    opts = capabilities(ex.get("backend")).with_parameters(ex.get("options"), list(archives))
    if opts is None:  # the backend reads the ONNX model itself: its weights come with it
        return ex
    return {**ex, "options": opts, "parameters": "external"}
