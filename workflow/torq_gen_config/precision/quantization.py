"""Static int8 quantization (A8W8) with ONNX Runtime: the names of the former single module.

Kept so that ``from torq_gen_config.precision.quantization import X`` keeps working;
the code lives in the modules of the steps (imported in this order, each only from
those before it):

* :mod:`.ort_quantization`: :class:`QuantizationError`, the root-logger guard around
  ``onnxruntime.quantization``;
* :mod:`.folding`: :func:`fold_to_initializers`;
* :mod:`.calibration`: :func:`calibration_samples` and the calibration defaults;
* :mod:`.ranges`: :func:`tensor_ranges`;
* :mod:`.qdq_graph`: the Q/DQ graph surgery after ``quantize_static``,
  :func:`place_constant_nodes_before_use`;
* :mod:`.quantize`: :func:`quantize_model` (the ``quantize_static`` wrapper);
* :mod:`.alignment`: :func:`compute_nodes`, :func:`align_layers`, :func:`base_tensor_name`.

New code imports from those modules. A test that patches a private helper patches it
in the module that calls it (e.g. ``qdq_graph._scale_zp``), not here.
"""

from __future__ import annotations

from .alignment import align_layers, base_tensor_name, compute_nodes
from .calibration import (DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SEED, DEFAULT_FLOAT_RANGE, INT_INPUT_RANGE,
                          calibration_samples)
from .folding import fold_to_initializers
from .ort_quantization import QuantizationError
from .qdq_graph import QUANTIZED_OP_BASE, place_constant_nodes_before_use
from .quantize import HYBRID_QOPERATOR_OPS, NON_COMPUTE_OPS, QUANT_FORMATS, quantize_model
from .ranges import tensor_ranges

# private helpers that tests reach through this module
from .calibration import _layer_samples  # noqa: F401
from .ort_quantization import _root_logger_guard  # noqa: F401
from .qdq_graph import _scale_zp  # noqa: F401
from .quantize import _choose_format  # noqa: F401

__all__ = [
    "QuantizationError", "HYBRID_QOPERATOR_OPS", "NON_COMPUTE_OPS", "QUANTIZED_OP_BASE", "QUANT_FORMATS",
    "DEFAULT_CALIBRATION_SAMPLES", "DEFAULT_CALIBRATION_SEED", "DEFAULT_FLOAT_RANGE", "INT_INPUT_RANGE",
    "fold_to_initializers", "calibration_samples", "tensor_ranges", "quantize_model", "compute_nodes",
    "align_layers", "base_tensor_name", "place_constant_nodes_before_use",
]
