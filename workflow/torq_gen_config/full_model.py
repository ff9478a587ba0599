"""Old import path of the full-model run: re-exports :mod:`torq_gen_config.fullrun`
(one module per step) and the TORQ whole-model names now in
:mod:`torq_gen_config.backends.torq.whole_model`. New code imports from there."""

from __future__ import annotations

from .backends.torq.whole_model import (  # noqa: F401
    TORQ_MAP_FILE,
    TORQ_PARTITION,
    _file_sha256,
    _torq_backend_options,
    mlir_function,
    torq_options,
)
from .fullrun import *  # noqa: F401,F403
from .fullrun import __all__ as _fullrun_all
from .fullrun.common import _layer_span, _round  # noqa: F401
from .fullrun.compile import compile_partition  # noqa: F401
from .fullrun.execute import (  # noqa: F401
    _artifact,
    _check_partition,
    _compare_and_finish,
    _constant_outputs,
    _last_uses,
    _new_result,
)
from .fullrun.plan import _prune  # noqa: F401
from .fullrun.report_section import _fmt, _fmt_ms  # noqa: F401
from .fullrun.selection import _NULL_NAMES, _executor_name, _named_executors  # noqa: F401
from .model.graph import copy_proto, node_inputs, tensor_consumers, value_info, value_types  # noqa: F401

__all__ = [*_fullrun_all, "TORQ_MAP_FILE", "TORQ_PARTITION", "mlir_function", "torq_options"]
