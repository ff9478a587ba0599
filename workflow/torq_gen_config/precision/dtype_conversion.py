"""Schema-aware narrowing of an ONNX model's element types (fp32 -> bf16, int64 -> int32):
the names of the former single module.

Kept so that ``from torq_gen_config.precision.dtype_conversion import X`` keeps
working; the code lives in the modules of the steps (each imports only those before it):

* :mod:`.onnx_graph`: subgraph scopes, names and tensor helpers the passes share;
* :mod:`.bf16_rounding`: :func:`round_to_bf16` (round to nearest even) and its errors;
* :mod:`.widening`: :func:`widen_bf16_to_fp32`, the exact inverse for ONNX Runtime references;
* :mod:`.narrowing_plan`: passes 1-3 of the engine (which type every slot needs and gets);
* :mod:`.narrowing`: :func:`convert_to_bf16`, :func:`convert_int64_to_int32` and the
  engine's rewrite (the rules are in its docstring).

New code imports from those modules.
"""

from __future__ import annotations

from .bf16_rounding import round_to_bf16
from .narrowing import BF16_OPSET, KEEP_INT64_INPUTS, convert_int64_to_int32, convert_to_bf16
from .onnx_graph import DTYPE_ATTRS  # noqa: F401  (public name of the former module)
from .widening import widen_bf16_to_fp32

__all__ = [
    "BF16_OPSET",
    "KEEP_INT64_INPUTS",
    "convert_to_bf16",
    "convert_int64_to_int32",
    "widen_bf16_to_fp32",
    "round_to_bf16",
]
