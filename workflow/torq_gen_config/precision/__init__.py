"""Precision changes of models: dtype conversion and int8 quantization.

dtype conversion: :mod:`.onnx_graph`, :mod:`.bf16_rounding`, :mod:`.widening`,
:mod:`.narrowing_plan`, :mod:`.narrowing`. int8 quantization: :mod:`.ort_quantization`,
:mod:`.folding`, :mod:`.calibration`, :mod:`.ranges`, :mod:`.qdq_graph`, :mod:`.quantize`,
:mod:`.alignment`; and :mod:`.layer_mapping` (layers of the fp32 model -> nodes of the
quantized model).
"""
