"""The entry to ``onnxruntime.quantization``: the error every quantization failure
becomes, and the guard that keeps ORT's logging from doubling Snakemake's lines.

``onnxruntime.quantization`` logs through the root logger
(``logging.warning(...)``), which configures the root logger with a stderr handler
when it has none (``logging.basicConfig``), so every later record of every logger
(Snakemake's console lines included) would be printed twice. Every import of and call
into ``onnxruntime.quantization`` in this package runs inside
:func:`_root_logger_guard`, which leaves the root logger's handlers and level as they
were.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from ..core.errors import ModelError
from ..core.lazy import load, oq
from ..core.limits import DETAIL_CHARS


class QuantizationError(ModelError):
    """Quantization of a model or layer failed (reason in the message); never replaced by the float model."""


_GUARD_LOCK = threading.Lock()
_GUARD = {"depth": 0, "handlers": [], "level": logging.NOTSET}


@contextlib.contextmanager
def _root_logger_guard():
    """Keep the root logger's handlers and level unchanged across the block.

    ``onnxruntime.quantization`` calls ``logging.warning``/``logging.info`` (module
    functions that run ``logging.basicConfig()`` when the root logger has no handler)
    and ``matmul_nbits_quantizer`` calls ``logging.basicConfig(level=INFO)`` at import.
    A stderr handler left on the root logger makes every propagated record (all of
    Snakemake's console lines) print a second time. While the block runs, a root
    logger without handlers gets a ``NullHandler`` (so ``basicConfig`` does nothing and
    ORT's root-logger messages are dropped); when the outermost block ends, every
    handler added meanwhile is removed, removed ones are put back and the level is
    restored. Nested and concurrent blocks (Snakemake ``run:`` jobs are threads of one
    process) share one snapshot, taken by the first block to enter.
    """
    root = logging.getLogger()
    with _GUARD_LOCK:
        if _GUARD["depth"] == 0:
            _GUARD["handlers"], _GUARD["level"] = list(root.handlers), root.level
            if not root.handlers:
                root.addHandler(logging.NullHandler())
        _GUARD["depth"] += 1
    try:
        yield
    finally:
        with _GUARD_LOCK:
            _GUARD["depth"] -= 1
            if _GUARD["depth"] == 0:
                saved = _GUARD["handlers"]
                for h in list(root.handlers):
                    if h not in saved:
                        root.removeHandler(h)
                for h in saved:
                    if h not in root.handlers:
                        root.addHandler(h)
                root.setLevel(_GUARD["level"])
                _GUARD["handlers"] = []


def _ort_quantization():
    """The ``onnxruntime.quantization`` module, imported with :func:`_root_logger_guard`."""
    with _root_logger_guard():
        return load(oq)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:DETAIL_CHARS]}" if text else type(e).__name__
