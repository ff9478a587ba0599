"""Precision changes of models: dtype conversion and int8 quantization."""
