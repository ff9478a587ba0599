"""Static int8 quantization (A8W8) of whole models and single layers with ONNX Runtime.

Wraps :func:`onnxruntime.quantization.quantize_static` (the original tool does the
same: docs/original_tool.md, 'Quantization'):

* Calibration: random samples uniform in ``[-1, 1)``, seed 0, 20 samples by default,
  or the samples of a user ``.npz`` file (:func:`calibration_samples`).
* Types: QInt8 activations and QInt8 weights (A8W8) only; optional per-channel weights.
* Formats: ``qdq`` (QuantizeLinear/DequantizeLinear around float ops), ``qoperator``
  (QLinearConv, QLinearMatMul, com.microsoft QLinear* ops) and ``hybrid`` (QOperator
  when every compute op of the model is in :data:`HYBRID_QOPERATOR_OPS`, else QDQ).
* ``full_integer``: the graph-input QuantizeLinear and graph-output DequantizeLinear
  nodes are removed so the model's I/O are int8.

Per-layer quantization uses the activation ranges measured on the *whole* model
(:func:`tensor_ranges`) as ``TensorQuantOverrides``, so a layer quantized alone gets the
same scales and zero points as inside the whole model (except where ORT fuses an
activation into the op in the whole model: there the op's output takes the
activation's range). Unlike the original tool, a
failed quantization is never replaced by the float model: :class:`QuantizationError`.

The steps live in their own modules: :mod:`.folding`, :mod:`.calibration`,
:mod:`.ranges`, this module (``quantize_static``), :mod:`.qdq_graph` (the graph
surgery after it), :mod:`.alignment` (layers -> quantized compute ops) and
:mod:`.ort_quantization` (the error and the logging guard).
"""

from __future__ import annotations

import os
import tempfile

from ..core.lazy import np, onnx
from .calibration import (DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SEED, _check_finite_samples,
                          _input_specs, _layer_samples)
from .folding import _infer, fold_to_initializers
from .ort_quantization import QuantizationError, _one_line, _ort_quantization, _root_logger_guard
from .qdq_graph import (_QDQ_OPS, QUANTIZED_OP_BASE, _complete_value_info, _count_quantized, _drop_unused_initializers,
                        _dtype_name, _elem_types, _io_quantization, _io_to_wrap, _strip_io_qdq, _wrap_io,
                        place_constant_nodes_before_use)
from .ranges import _float_tensors, tensor_ranges

#: Ops for which ``hybrid`` chooses QOperator (the original tool's ``--quant-format hybrid``).
HYBRID_QOPERATOR_OPS = frozenset({"Conv", "Add", "Mul", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
                                  "Relu", "Clip", "LeakyRelu", "Sigmoid", "Softmax"})

#: Ops that are not compute ops for the ``hybrid`` choice: quantization wrappers,
#: constants, identity/cast and ops that only read or change shapes (the opset upgrade
#: turns a Softmax-9 into Shape/Flatten/Softmax/Reshape, which is still a Softmax layer).
NON_COMPUTE_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Constant",
                             "ConstantOfShape", "Identity", "Cast", "Shape", "Size", "Reshape", "Flatten",
                             "Squeeze", "Unsqueeze"})

#: Accepted values of ``quant_format``.
QUANT_FORMATS = ("qdq", "qoperator", "hybrid")


def _compute_op_types(model) -> list[str]:
    return [n.op_type for n in model.graph.node if n.op_type not in NON_COMPUTE_OPS]


def _choose_format(model, quant_format: str) -> str:
    if quant_format != "hybrid":
        return quant_format
    ops = _compute_op_types(model)
    return "qoperator" if ops and all(op in HYBRID_QOPERATOR_OPS for op in ops) else "qdq"


class _Reader:
    """``CalibrationDataReader`` over a list of feed dicts."""

    def __init__(self, samples):
        self._samples = list(samples)
        self._it = iter(self._samples)

    def get_next(self):
        return next(self._it, None)

    def __len__(self):
        return len(self._samples)

    def __iter__(self):
        return iter(self._samples)

    def rewind(self):
        self._it = iter(self._samples)

    def set_range(self, start_index: int, end_index: int):
        self._it = iter(self._samples[start_index:end_index])


def _reader(samples):
    CalibrationDataReader = _ort_quantization().CalibrationDataReader

    class Reader(_Reader, CalibrationDataReader):
        pass

    return Reader(samples)


def quantize_model(model, *, ranges: dict, samples: list[dict] | None = None, quant_format: str = "qdq",
                   per_channel: bool = False, full_integer: bool = False,
                   wrap_unquantized_io: bool = False,
                   wrap_only: "Collection[str] | None" = None) -> tuple["onnx.ModelProto", dict]:  # noqa: F821
    """Quantize a float model (the whole model or one layer) to int8 with ``quantize_static``.

    Steps (docs/original_tool.md, 'Quantization'; onnxruntime.quantization docs):

    1. :func:`fold_to_initializers` (weights must be initializers).
    2. Format: ``qdq`` or ``qoperator`` as given; ``hybrid`` uses QOperator if every
       compute op of this model (ops outside :data:`NON_COMPUTE_OPS`) is in
       :data:`HYBRID_QOPERATOR_OPS`, else QDQ (``info["format_used"]``).
    3. ``quantize_static`` with QInt8 activations and QInt8 weights (A8W8), MinMax
       calibration, ``per_channel`` as given, and ``TensorQuantOverrides`` with
       ``rmin``/``rmax`` from ``ranges`` for every tensor of the model found there,
       so a layer quantized alone gets the scales it has in the whole model.
       Calibration data: ``samples``, or (``None``, for a layer model) 20 samples
       (seed 0) per input uniform in its range from ``ranges`` ([-1, 1) if absent).
       Runs in a temporary directory (ORT writes files).
    4. ``wrap_unquantized_io`` (single layers): a float32 graph input with a consumer
       that is not a QuantizeLinear, and a float32 graph output not produced by a
       DequantizeLinear (with ``wrap_only``: only those of these names, the tensors
       the whole quantized model holds quantized), get a QuantizeLinear -> DequantizeLinear pair (int8, scale and
       zero point from its range as ORT computes them, 0 included; range from
       ``ranges`` or, if absent, measured on the calibration samples), so that layers
       ORT leaves in float (lone Relu, MaxPool, Dropout) are tested with quantized I/O
       as in the whole model. The pairs are listed in ``info["wrapped_io"]``.
    5. ``full_integer``: graph inputs whose consumers are all QuantizeLinear nodes
       (with one scale/zero point) and graph outputs produced by DequantizeLinear lose
       these nodes and become int8, keeping their names; an input that also feeds a
       non-Q node stays float (warning).
    6. Shapes: onnx shape inference, then one ORT run (optimizations off, zero
       inputs) for tensors still lacking value_info (com.microsoft QLinear* outputs,
       which IREE's importer would otherwise type ``!torch.none``). The result passes
       ``onnx.checker.check_model`` (non-full check).

    Args:
        model: float ``onnx.ModelProto`` (not modified).
        ranges: ``{tensor: [min, max]}`` (from :func:`tensor_ranges` on the whole model).
        samples: calibration feed dicts, or None (generated, see step 3).

    Returns:
        ``(quantized_model, info)``; ``info`` (JSON-safe) = ``{"quant_format",
        "format_used", "per_channel", "full_integer", "activation_type": "int8",
        "weight_type": "int8", "quantized_nodes": int (compute nodes that are QLinear*/
        *Integer ops or read a DequantizeLinear output), "wrapped_io": [{"tensor",
        "kind": "input"|"output", "scale", "zero_point"}], "io_quantization": {graph
        I/O name: {"scale", "zero_point", "dtype": "int8", "io_dtype": dtype of the
        graph I/O}}, "warnings": [str], "quantized": bool (any Q/DQ or quantized op)}``.

    ``onnxruntime.quantization`` runs inside :func:`_root_logger_guard` (the root
    logger's handlers and level are unchanged afterwards).

    Raises:
        QuantizationError: unknown ``quant_format``; a calibration sample lacks an
            input or holds NaN/inf; ``quantize_static`` (or the calibration run)
            raised; the result fails the ONNX checker. Any other exception (ORT's
            ``AssertionError: scale issue`` included) is raised as a QuantizationError
            too, never as itself.
    """
    try:
        with _root_logger_guard():
            return _quantize_model(model, ranges=ranges, samples=samples, quant_format=quant_format,
                                   per_channel=per_channel, full_integer=full_integer,
                                   wrap_unquantized_io=wrap_unquantized_io, wrap_only=wrap_only)
    except QuantizationError:
        raise
    except Exception as e:
        raise QuantizationError(f"quantization failed: {_one_line(e)}") from None


def _quantize_model(model, *, ranges: dict, samples: list[dict] | None, quant_format: str, per_channel: bool,
                    full_integer: bool, wrap_unquantized_io: bool, wrap_only=None):
    """:func:`quantize_model` without its logging guard and error wrapping."""
    oq = _ort_quantization()
    QuantFormat, QuantType = oq.QuantFormat, oq.QuantType

    if quant_format not in QUANT_FORMATS:
        raise QuantizationError(f"unknown quant_format {quant_format!r} (expected one of {', '.join(QUANT_FORMATS)})")
    try:
        folded = fold_to_initializers(model)
    except Exception as e:
        raise QuantizationError(f"constant folding before quantization failed: {_one_line(e)}") from None
    fmt = _choose_format(folded, quant_format)
    warnings: list[str] = []
    for t, r in ranges.items():
        try:
            lo, hi = float(r[0]), float(r[1])
        except (TypeError, ValueError, IndexError):
            raise QuantizationError(f"range of tensor {t!r} must be [min, max], got {r!r}") from None
        if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
            raise QuantizationError(f"range of tensor {t!r} must be finite [min, max] with min <= max, got {r!r}")
    present = set(_float_tensors(folded))
    overrides = {t: [{"rmin": np.float32(r[0]), "rmax": np.float32(r[1])}]
                 for t, r in ranges.items() if t in present}
    input_names = [s[0] for s in _input_specs(folded)]
    if samples is None:
        calib = _layer_samples(folded, ranges, DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SEED)
    else:
        calib = []
        for k, s in enumerate(samples):
            missing = [t for t in input_names if t not in s]
            if missing:
                raise QuantizationError(f"calibration sample {k} has no value for model input {missing[0]!r}")
            calib.append({t: s[t] for t in input_names})
        if not calib:
            raise QuantizationError("quantization needs at least one calibration sample")
        _check_finite_samples(calib)

    with tempfile.TemporaryDirectory(prefix="tgc-quant-") as tmp:
        src = os.path.join(tmp, "float.onnx")
        dst = os.path.join(tmp, "quant.onnx")
        big = folded.ByteSize() > 1_800_000_000
        try:
            _save(folded, src, big)
            oq.quantize_static(
                src, dst, _reader(calib),
                quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                per_channel=per_channel,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                use_external_data_format=big,
                extra_options={"TensorQuantOverrides": overrides} if overrides else {},
            )
            q = onnx.load(dst)
        except QuantizationError:
            raise
        except Exception as e:
            raise QuantizationError(f"onnxruntime quantize_static ({fmt}) failed: {_one_line(e)}") from None

    wrapped: list[dict] = []
    if wrap_unquantized_io:
        q = _infer(q)
        to_wrap = [t for t in _io_to_wrap(q) if wrap_only is None or t in wrap_only]
        need = [t for t in to_wrap if t not in ranges]
        extra_ranges = {}
        if need:
            try:
                extra_ranges = tensor_ranges(folded, calib)
            except QuantizationError as e:
                warnings.append(f"cannot measure ranges for wrapping {need}: {e}")
        q, wrapped = _wrap_io(q, {**extra_ranges, **ranges}, warnings, only=wrap_only)
    io_quant = _io_quantization(q)
    if full_integer:
        q = _strip_io_qdq(q, warnings)
    q = _drop_unused_initializers(q)
    q = place_constant_nodes_before_use(q)
    q = _complete_value_info(q, warnings)
    final_types = _elem_types(q)
    for name, rec in io_quant.items():
        rec["io_dtype"] = _dtype_name(final_types.get(name))
    try:
        onnx.checker.check_model(q)
    except Exception as e:
        raise QuantizationError(f"quantized model fails the ONNX checker: {_one_line(e)}") from None
    info = {
        "quant_format": quant_format,
        "format_used": fmt,
        "per_channel": bool(per_channel),
        "full_integer": bool(full_integer),
        "activation_type": "int8",
        "weight_type": "int8",
        "quantized_nodes": _count_quantized(q),
        "wrapped_io": wrapped,
        "io_quantization": io_quant,
        "warnings": warnings,
        "quantized": any(n.op_type in _QDQ_OPS or n.op_type in QUANTIZED_OP_BASE or n.op_type.startswith("QLinear")
                         for n in q.graph.node),
    }
    return q, info


def _save(model, path: str, external: bool) -> None:
    if external:
        onnx.save_model(model, path, save_as_external_data=True, location=os.path.basename(path) + ".data")
    else:
        onnx.save_model(model, path)
