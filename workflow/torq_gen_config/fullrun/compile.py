"""Compile one partition of a full-model plan for its executor (``compiled.json``)."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from ..backends import capabilities, make_backend
from ..backends.base import StageError, failure_summary
from ..core.layout import MLIR_FILE
from ..core.limits import MESSAGE_CHARS as MESSAGE_LIMIT, SUMMARY_CHARS as SUMMARY_LIMIT
from ..core.tools import bounded_message
from ..core.external_data import load_model
from ..mlir.importer import import_model
from .common import COMPILED_SCHEMA, _round


def compile_partition(*, pid: str, model_path: str, executor: Mapping, work_dir: str, timeout_s: float,
                      log_path: str | None) -> dict:
    """Compile one partition for its executor; never raises for a failing partition.

    For backends that compile MLIR the partition is imported first
    (:func:`torq_gen_config.mlir.importer.import_model`, into ``<work_dir>/model.mlir``,
    removed once the module compiled: it is imported again for any later compile); with
    the stored weights as IREE parameters when the executor definition says
    ``"parameters": "external"`` (:func:`~torq_gen_config.backends.parameters.with_parameters`).
    The whole-model partition of a whole-model plan (one its backend's
    :meth:`~torq_gen_config.backends.whole_model.WholeModel.is_whole_model`
    recognises) is compiled by that backend's hook (torq: ``full.mlir`` with
    ``model_path``, its executor map, as ``--torq-executor-map``; a missing
    ``torq-compile`` is a ``compile`` error whose message names every place searched).

    Returns:
        The ``compiled.json`` content: ``status`` ``"ok"`` with ``compile_ms``,
        ``import_ms`` and ``artifact`` (``path``, ``info``: what
        :meth:`~torq_gen_config.backends.base.Backend.run` needs), or ``"error"``
        with ``failure`` (``stage``: import/compile/timeout/crash, ``during``,
        ``summary``, ``message``).
    """

    res: dict[str, Any] = {
        "schema": COMPILED_SCHEMA, "pid": pid, "executor": executor.get("name"), "backend": executor.get("backend"),
        "status": None, "compile_ms": None, "import_ms": None, "artifact": None, "failure": None,
        "compiled_at": time.time(),
    }

    def fail(stage: str, message: str, during: str | None = None) -> dict:
        res["status"] = "error"
        res["failure"] = {"stage": stage, "during": during,
                          "summary": failure_summary(stage, message)[:SUMMARY_LIMIT],
                          "message": bounded_message(message, MESSAGE_LIMIT)}
        return res

    Path(work_dir).mkdir(parents=True, exist_ok=True)
    kind = executor.get("backend")
    cls = capabilities(kind)
    hooks = cls.whole_model()
    if hooks is not None and hooks.is_whole_model(executor):
        try:
            out = hooks.compile(executor, model_path=model_path, work_dir=work_dir, timeout_s=timeout_s,
                                log_path=log_path)
        except StageError as e:
            return fail(e.stage, e.message, e.during)
        except Exception as e:  # a backend bug must not stop the workflow
            return fail("compile", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        res["status"] = "ok"
        res["compile_ms"] = _round(out["compile_ms"])
        res["artifact"] = out["artifact"]
        res["tool"] = out.get("tool")
        return res
    if cls.chain_unavailable:
        return fail("compile", f"executor {executor.get('name')!r}: {cls.chain_unavailable}")
    try:
        backend = make_backend(executor)
    except Exception as e:
        return fail("compile", f"backend {kind!r} is not available: {e}")
    mlir_path = None
    if backend.needs_mlir:
        mlir_path = str(Path(work_dir) / MLIR_FILE)
        imp = import_partition(model_path, mlir_path, parameters=executor.get("parameters") == "external")
        if imp["status"] != "ok":
            return fail("import", imp["message"])
        res["import_ms"] = imp["import_ms"]
    try:
        artifact = backend.compile(onnx_path=model_path, mlir_path=mlir_path, work_dir=work_dir,
                                   timeout_s=timeout_s, log_path=log_path)
    except StageError as e:
        return fail(e.stage, e.message, e.during)
    except Exception as e:  # a backend bug must not stop the workflow
        return fail("compile", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    if mlir_path:  # imported anew for each compile; its text holds the weights twice over
        Path(mlir_path).unlink(missing_ok=True)
    res["status"] = "ok"
    res["compile_ms"] = _round(artifact.compile_ms)
    res["artifact"] = {"path": artifact.path, "info": artifact.info}
    res["tool"] = _describe(backend, timeout_s)
    return res


def import_partition(model_path: str, mlir_path: str, parameters: bool = False) -> dict:
    """Import one partition's ONNX model into ``mlir_path`` (written atomically, only
    on success) with :func:`torq_gen_config.mlir.importer.import_model` (``parameters``:
    the stored weights as IREE parameters; else they are references to the weight store,
    written in for each compile: ``stored_by_reference``); never raises.

    Returns:
        ``{"status": "ok"|"error", "stage": None|"import", "message": str|None
        (``<exception type>: <text>``), "import_ms": float|None, "parameters":
        "inline"|"external"}`` (the form of a layer's ``import.json``).
    """
    mode = "external" if parameters else "inline"
    try:
        imp = import_model(load_model(model_path, weights=False), mlir_path, parameters=parameters,
                           stored_by_reference=True)
    except Exception as e:  # importer errors come as many exception types
        return {"status": "error", "stage": "import", "message": f"{type(e).__name__}: {str(e).strip()}",
                "import_ms": None, "parameters": mode}
    return {"status": "ok", "stage": None, "message": None, "import_ms": imp["import_ms"], "parameters": mode}


def safe_describe(executor: Mapping, timeout_s: float) -> dict | None:
    """The executor's tool description for ``compiled.json`` (``tool``), or None when it
    cannot be had (the backend cannot be made, its probe fails)."""
    try:
        return _describe(make_backend(executor), timeout_s)
    except Exception:
        return None


def _describe(backend, timeout_s: float) -> dict | None:
    try:
        return backend.describe(probe_timeout_s=min(float(timeout_s), 60.0))
    except Exception:
        return None
