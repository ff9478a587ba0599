"""Static int8 quantization (A8W8) of whole models and single layers with ONNX Runtime.

Wraps :func:`onnxruntime.quantization.quantize_static` (the original tool does the
same; seed: notes/reference_tool.md s6 "Quantization" and "Quantized flow"):

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

The quantized flow maps layers to compute ops of the quantized full model:
:func:`compute_nodes` lists the compute nodes (Q/DQ and Constant dropped, QLinear*
renamed back to the base op) and :func:`align_layers` aligns them with the layers by a
longest common subsequence over op types (seed 001 "Quantized Models") where
:func:`torq_gen_config.precision.layer_mapping.match_by_names` found no match by tensor
name; activations that ORT fuses away (Relu after Conv) are left unaligned.

Logging: ``onnxruntime.quantization`` logs through the root logger
(``logging.warning(...)``), which configures the root logger with a stderr handler
when it has none (``logging.basicConfig``), so every later record of every logger
(Snakemake's console lines included) would be printed twice. Every import of and call
into ``onnxruntime.quantization`` here runs inside :func:`_root_logger_guard`, which
leaves the root logger's handlers and level as they were.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from ..errors import ModelError

__all__ = [
    "QuantizationError", "HYBRID_QOPERATOR_OPS", "NON_COMPUTE_OPS", "QUANTIZED_OP_BASE", "QUANT_FORMATS",
    "DEFAULT_CALIBRATION_SAMPLES", "DEFAULT_CALIBRATION_SEED", "DEFAULT_FLOAT_RANGE", "INT_INPUT_RANGE",
    "fold_to_initializers", "calibration_samples", "tensor_ranges", "quantize_model", "compute_nodes",
    "align_layers", "base_tensor_name",
]


class QuantizationError(ModelError):
    """Quantization of a model or layer failed (reason in the message); never replaced by the float model."""


#: Ops for which ``hybrid`` chooses QOperator (seed: notes/reference_tool.md s6, ``--quant-format hybrid``).
HYBRID_QOPERATOR_OPS = frozenset({"Conv", "Add", "Mul", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
                                  "Relu", "Clip", "LeakyRelu", "Sigmoid", "Softmax"})

#: Ops that are not compute ops for the ``hybrid`` choice: quantization wrappers,
#: constants, identity/cast and ops that only read or change shapes (the opset upgrade
#: turns a Softmax-9 into Shape/Flatten/Softmax/Reshape, which is still a Softmax layer).
NON_COMPUTE_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Constant",
                             "ConstantOfShape", "Identity", "Cast", "Shape", "Size", "Reshape", "Flatten",
                             "Squeeze", "Unsqueeze"})

#: Quantized op type -> base op type (for :func:`compute_nodes`).
QUANTIZED_OP_BASE = {
    "QLinearConv": "Conv", "QLinearMatMul": "MatMul", "QGemm": "Gemm", "QLinearAdd": "Add", "QLinearMul": "Mul",
    "QLinearConcat": "Concat", "QLinearGlobalAveragePool": "GlobalAveragePool",
    "QLinearAveragePool": "AveragePool", "QLinearSoftmax": "Softmax", "QLinearSigmoid": "Sigmoid",
    "QLinearLeakyRelu": "LeakyRelu", "QLinearReduceMean": "ReduceMean", "QLinearWhere": "Where",
    "ConvInteger": "Conv", "MatMulInteger": "MatMul",
}

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
#: Accepted values of ``quant_format``.
QUANT_FORMATS = ("qdq", "qoperator", "hybrid")
#: Calibration defaults of the original tool (seed: notes/reference_tool.md s6).
DEFAULT_CALIBRATION_SAMPLES = 20
DEFAULT_CALIBRATION_SEED = 0
DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
#: Random integer inputs that are not indices are drawn uniformly from ``[0, 10)``
#: (small non-negative values); index inputs (Gather/GatherElements/GatherND/Scatter*
#: indices read straight from a graph input) are drawn in ``[0, dim)`` of the indexed
#: axis, as the layers' test inputs (:func:`torq_gen_config.input_generation.make_inputs`).
INT_INPUT_RANGE = (0, 10)
# Suffixes ORT appends to tensor names it quantizes (used to match names in align_layers).
_ORT_SUFFIXES = ("_quantized", "_QuantizeLinear_Output", "_DequantizeLinear_Output", "_QuantizeLinear_Input",
                 "_DequantizeLinear_Input")


# --------------------------------------------------------------------------- logging
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
        import onnxruntime.quantization as oq
    return oq


# --------------------------------------------------------------------------- folding
def fold_to_initializers(model) -> "onnx.ModelProto":  # noqa: F821
    """Copy of ``model`` with every constant subgraph evaluated into initializers.

    ``quantize_static`` only quantizes weights that are initializers, while e.g. the
    onnx wheel's ``light_*`` models compute their weights with ``ConstantOfShape``.
    Shapes are inferred first (so ``Shape``/``Size`` of static tensors fold too), the
    nodes that :func:`torq_gen_config.model.split.fold_constants` evaluates are
    removed, and their values that remaining nodes (or subgraphs) consume become
    initializers. A folded value that is a graph output is produced by a ``Constant``
    node. Unused initializers are dropped; value_info of removed tensors too.

    Args:
        model: an ``onnx.ModelProto`` (not modified).

    Returns:
        The folded model (``onnx.ModelProto``), shapes inferred where onnx can.
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from ..model.split import _outer_scope_inputs, fold_constants

    m = _infer(model)
    values, folded, _warnings = fold_constants(m)
    keep = [n for j, n in enumerate(m.graph.node) if j not in folded]
    graph_outputs = [o.name for o in m.graph.output]
    produced = {t for n in keep for t in n.output if t}
    graph_inputs = {i.name for i in m.graph.input}
    needed: list[str] = []
    for n in keep:
        for t in list(n.input) + _outer_scope_inputs(n):
            if t and t not in needed:
                needed.append(t)
    const_nodes = []
    for t in graph_outputs:
        if t not in produced and t not in graph_inputs and t in values:
            const_nodes.append(helper.make_node("Constant", [], [t], value=numpy_helper.from_array(np.asarray(values[t]), t)))
    orig_inits = {t.name: t for t in m.graph.initializer}
    inits = []
    for t in needed:
        if t in produced or t in graph_inputs:
            continue
        if t in orig_inits:
            inits.append(orig_inits[t])
        elif t in values:
            inits.append(numpy_helper.from_array(np.asarray(values[t]), t))
    alive = produced | {c.output[0] for c in const_nodes}
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    del g.node[:]
    g.node.extend(const_nodes + list(keep))
    del g.initializer[:]
    g.initializer.extend(inits)
    vis = [v for v in m.graph.value_info if v.name in alive]
    del g.value_info[:]
    g.value_info.extend(vis)
    return _infer(out)


def _infer(model):
    """Shape inference that never fails (returns a copy; the input on failure)."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        try:
            return onnx.shape_inference.infer_shapes(model)
        except Exception:
            m = onnx.ModelProto()
            m.CopyFrom(model)
            return m


# ----------------------------------------------------------------------- calibration
def _input_specs(model) -> list[tuple[str, "np.dtype", list]]:  # noqa: F821
    """(name, numpy dtype, shape with None for unknown dims) of each real graph input."""
    from onnx import helper

    inits = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else None
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        specs.append((vi.name, dtype, shape))
    return specs


def calibration_samples(model, *, n: int, seed: int, float_range: tuple[float, float] = DEFAULT_FLOAT_RANGE,
                        data_path: str | os.PathLike | None = None) -> list[dict[str, "np.ndarray"]]:  # noqa: F821
    """Calibration samples for ``model``: one feed dict (input name -> array) per sample.

    Random (``data_path`` None; seed: notes/reference_tool.md s6, 20 samples, seed 0,
    uniform [-1, 1)): ``n`` samples, seeded and deterministic. Float inputs are drawn
    from ``numpy.random.default_rng(seed)`` uniform in ``[low, high)`` of
    ``float_range`` (cast to the input's float dtype). Non-float inputs are drawn as
    the layers' test inputs (:func:`torq_gen_config.input_generation.make_inputs`, seed
    derived from ``(seed, sample index)``): index inputs (Gather/GatherElements/
    GatherND/ScatterElements/ScatterND indices that are graph inputs) in ``[0, dim)``
    of the indexed axis, other integer inputs in :data:`INT_INPUT_RANGE` ``[0, 10)``,
    bool inputs random booleans. Unknown (symbolic) dims are taken as 1.

    From a ``.npz`` file (``numpy.savez``): one array per model input, keyed by input
    name. For an input of shape ``S`` an array may be

    * ``S``: one sample;
    * ``[N, *S]``: N samples (first axis = sample axis);
    * ``[N, *S[1:]]`` when ``S[0]`` (the batch dim) is 1: N samples of batch 1, e.g.
      ``[N, 3, 224, 224]`` for an input ``[1, 3, 224, 224]``.

    All inputs must hold the same N. Float data of any width is accepted for float
    inputs and integer data for integer inputs (cast to the input dtype); float data
    must be finite (no NaN/inf, also after the cast). ``n`` is ignored (all samples
    of the file are used).

    Returns:
        ``list[dict[str, np.ndarray]]`` with arrays of the inputs' dtypes and shapes.

    Raises:
        QuantizationError: ``n`` < 1; the file is missing or not an ``.npz`` archive
            (a ``.npy`` or text file renamed ``.npz``: "<path>: not an .npz archive
            (numpy.savez): ..."); a model input has no array in the file, the file has
            a key that is not a model input, an array's shape fits none of the forms
            above, its dtype does not fit the input, float data holds NaN or inf, or
            the inputs hold different N. The message names the input and its expected
            shapes and dtype.
    """
    import numpy as np

    specs = _input_specs(model)
    if data_path is None:
        if n < 1:
            raise QuantizationError(f"calibration needs at least 1 sample, got n={n}")
        lo, hi = float(float_range[0]), float(float_range[1])
        if not hi >= lo:
            raise QuantizationError(f"calibration float range must be (low, high) with low <= high, got {float_range!r}")
        return _random_samples(model, specs, n, seed, lambda name: (lo, hi))

    p = Path(data_path)
    if not p.is_file():
        raise QuantizationError(f"calibration data file not found: {p}")
    arrays = _load_npz(p)
    names = [s[0] for s in specs]
    extra = sorted(set(arrays) - set(names))
    if extra:
        expected = ", ".join(f"{nm!r} {_fmt_shape(sh)} {dt}" for nm, dt, sh in specs)
        raise QuantizationError(f"{p}: key(s) {', '.join(map(repr, extra))} are not inputs of the model "
                                f"(model inputs: {expected})")
    per_input: dict[str, np.ndarray] = {}
    counts = {}
    for name, dtype, shape in specs:
        batch1 = bool(shape) and shape[0] == 1
        want = (f"{_fmt_shape(shape)} (one sample) or {_fmt_shape(['N', *shape])} (N samples)"
                + (f" or {_fmt_shape(['N', *shape[1:]])} (N samples of batch 1)" if batch1 else ""))
        if name not in arrays:
            raise QuantizationError(f"{p}: model input {name!r} (expected shape {want}, dtype {dtype}) has no array in the file")
        a = arrays[name]
        if _shape_fits(a.shape, shape):
            a = a[None, ...]
        elif a.ndim == len(shape) + 1 and _shape_fits(a.shape[1:], shape):
            pass
        elif batch1 and a.ndim == len(shape) and _shape_fits(a.shape[1:], shape[1:]):
            a = a[:, None, ...]  # N samples of batch 1
        else:
            raise QuantizationError(f"{p}: array for input {name!r} has shape {list(a.shape)}, expected {want}")
        if dtype is not None and not _dtype_fits(a.dtype, np.dtype(dtype)):
            raise QuantizationError(f"{p}: array for input {name!r} has dtype {a.dtype}, expected {np.dtype(dtype)} "
                                    f"(shape {want})")
        if dtype is not None and np.dtype(dtype).kind in "iu" and a.dtype != np.dtype(dtype) and a.size:
            info = np.iinfo(np.dtype(dtype))
            if a.min() < info.min or a.max() > info.max:
                raise QuantizationError(f"{p}: array for input {name!r} has values outside the range of {np.dtype(dtype)}")
        if dtype is not None:
            with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, rejected below
                a = a.astype(dtype, copy=False)
        if _is_float_dtype(a.dtype) and a.size:
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            if bad:
                raise QuantizationError(
                    f"{p}: array for input {name!r} holds {bad} non-finite value(s) (NaN or inf"
                    f"{', after conversion to ' + np.dtype(dtype).name if dtype is not None else ''}); "
                    f"calibration data must be finite")
        per_input[name] = a
        counts[name] = a.shape[0]
    if len(set(counts.values())) > 1:
        raise QuantizationError(f"{p}: inputs hold different numbers of samples: {counts}")
    total = next(iter(counts.values()), 0)
    if total == 0:
        raise QuantizationError(f"{p}: the file holds no samples")
    return [{k: np.ascontiguousarray(v[i]) for k, v in per_input.items()} for i in range(total)]


def _load_npz(p: Path) -> dict[str, "np.ndarray"]:  # noqa: F821
    """The arrays of the ``.npz`` archive ``p`` (QuantizationError if it is none)."""
    import zipfile

    import numpy as np

    def not_npz(why: str) -> QuantizationError:
        return QuantizationError(f"{p}: not an .npz archive (numpy.savez): {why}; calibration data must be an "
                                 f".npz file with one array per model input, keyed by input name")

    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise QuantizationError(f"{p}: cannot read calibration data: {_one_line(e)}") from None
    if head.startswith(b"\x93NUMPY"):
        raise not_npz("it is a single .npy array (numpy.save)")
    if not zipfile.is_zipfile(p):
        raise not_npz("it is not a zip archive" + (" (the file is empty)" if not head else ""))
    try:
        z = np.load(p, allow_pickle=False)
    except Exception as e:
        raise not_npz(_one_line(e)) from None
    if not isinstance(z, np.lib.npyio.NpzFile):  # pragma: no cover - a zip is always loaded as NpzFile
        raise not_npz(f"numpy.load returned a {type(z).__name__}")
    try:
        with z:
            return {k: z[k] for k in z.files}
    except Exception as e:
        raise QuantizationError(f"{p}: cannot read calibration data (expected an .npz file keyed by model input "
                                f"name): {_one_line(e)}") from None


def _is_float_dtype(dt) -> bool:
    """Float numpy dtype, bfloat16 (ml_dtypes) included; None (unknown) counts as float."""
    import numpy as np

    if dt is None:
        return True
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.name == "bfloat16"


def _random_samples(model, specs, n: int, seed: int, float_range_of) -> list[dict]:
    """``n`` random feed dicts: float inputs from ``default_rng(seed)`` uniform in
    ``float_range_of(name)``; the other inputs from :func:`torq_gen_config.input_generation.make_inputs`
    (bounded index inputs, other integers in :data:`INT_INPUT_RANGE`, booleans), seeded
    per sample with ``(seed, sample index)``."""
    import numpy as np

    others = [name for name, dtype, _ in specs if not _is_float_dtype(dtype)]
    for name, dtype, _ in specs:
        if name in others and np.dtype(dtype).kind not in "iub":
            raise QuantizationError(f"cannot generate calibration data for input {name!r} of dtype {np.dtype(dtype)}")
    extra: list[dict] = [{} for _ in range(n)]
    if others:
        from ..input_generation import make_inputs

        inferred = _infer(model)  # value_info: shapes of the indexed data tensors
        settings = {"int_range": list(INT_INPUT_RANGE), "uint8_range": list(INT_INPUT_RANGE)}
        for k in range(n):
            sub_seed = int(np.random.SeedSequence([int(seed), k]).generate_state(1)[0])
            feeds = make_inputs(inferred, {**settings, "seed": sub_seed})
            extra[k] = {name: feeds[name] for name in others}
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        feed = {}
        for name, dtype, shape in specs:
            if name in extra[k]:
                feed[name] = extra[k][name]
            else:
                lo, hi = float_range_of(name)
                feed[name] = _random_array(rng, dtype, shape, float(lo), float(hi))
        out.append(feed)
    return out


def _fmt_dim(d) -> str:
    return "?" if d is None else str(d)


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(_fmt_dim(d) for d in shape) + "]"


def _shape_fits(actual, expected) -> bool:
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected))


def _dtype_fits(actual, expected) -> bool:
    if actual == expected:
        return True
    if expected.kind == "f":
        return actual.kind == "f"
    if expected.kind in "iu":
        return actual.kind in "iu"
    return False


def _random_array(rng, dtype, shape, lo: float, hi: float):
    import numpy as np

    shp = [1 if d is None else d for d in shape]
    dt = np.dtype(dtype if dtype is not None else np.float32)
    if _is_float_dtype(dt):
        return rng.uniform(lo, hi, size=shp).astype(dt)
    if dt.kind in "iu":
        return rng.integers(INT_INPUT_RANGE[0], INT_INPUT_RANGE[1], size=shp).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shp).astype(bool)
    raise QuantizationError(f"cannot generate calibration data for an input of dtype {dt}")


# ---------------------------------------------------------------------------- ranges
def _ort_session(model, extra_outputs: list[str]):
    """ORT CPU session (graph optimizations off) with ``extra_outputs`` added as graph outputs."""
    import onnx
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    types = {v.name: v for v in list(m.graph.value_info) + list(m.graph.input)}
    for t in extra_outputs:
        if t in have:
            continue
        vi = onnx.ValueInfoProto()
        if t in types:
            vi.CopyFrom(types[t])
        else:
            vi.name = t
        m.graph.output.append(vi)
        have.add(t)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _float_tensors(model) -> list[str]:
    """Graph inputs and node outputs of float type (from value_info), in graph order."""
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
    types = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    inits = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    names += [t for n in model.graph.node for t in n.output if t]
    return [t for t in dict.fromkeys(names) if types.get(t) in floats]


def tensor_ranges(model, samples: list[dict]) -> dict[str, list[float]]:
    """Observed ``[min, max]`` of every float tensor over the calibration samples.

    Runs ONNX Runtime (CPU, graph optimizations off, so no tensor is fused away) once
    per sample with every float tensor (graph inputs and float node outputs, types
    from shape inference) as an output. Non-finite values (NaN, inf) are ignored: a
    range spans the finite values only, and a tensor that is empty or holds no finite
    value in any sample gets no range (it is left out of the result, so quantization
    calibrates it itself or leaves it unquantized). The model is folded first
    (:func:`fold_to_initializers`), so constant subgraphs have no ranges.

    Args:
        model: float ``onnx.ModelProto``.
        samples: feed dicts (see :func:`calibration_samples`).

    Returns:
        ``{tensor name: [min, max]}`` (Python floats).

    Raises:
        QuantizationError: ORT cannot load or run the model on a sample.
    """
    import numpy as np

    m = fold_to_initializers(model)
    names = _float_tensors(m)
    try:
        sess = _ort_session(m, names)
    except Exception as e:
        raise QuantizationError(f"ONNX Runtime cannot load the model to measure tensor ranges: {_one_line(e)}") from None
    feed_names = [i.name for i in sess.get_inputs()]
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for k, s in enumerate(samples):
        try:
            outs = sess.run(names, {t: s[t] for t in feed_names})
        except KeyError as e:
            raise QuantizationError(f"calibration sample {k} has no value for model input {e.args[0]!r}") from None
        except Exception as e:
            raise QuantizationError(f"ONNX Runtime failed on calibration sample {k}: {_one_line(e)}") from None
        for t, a in zip(names, outs):
            a = np.asarray(a)
            if a.size == 0:
                continue
            fin = a[np.isfinite(a)] if not np.all(np.isfinite(a)) else a
            if fin.size == 0:
                continue
            mn, mx = float(fin.min()), float(fin.max())
            lo[t] = min(lo.get(t, mn), mn)
            hi[t] = max(hi.get(t, mx), mx)
    return {t: [lo[t], hi[t]] for t in names if t in lo}


# ---------------------------------------------------------------------- quantization
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


def _layer_samples(model, ranges: dict, n: int, seed: int) -> list[dict]:
    """Random samples: float inputs uniform in their range from ``ranges`` (else
    [-1, 1)), other inputs as in :func:`calibration_samples` (index inputs bounded by
    the indexed axis, other integers in :data:`INT_INPUT_RANGE`)."""
    return _random_samples(model, _input_specs(model), n, seed, lambda name: ranges.get(name, DEFAULT_FLOAT_RANGE))


def _check_finite_samples(samples: list[dict]) -> None:
    """QuantizationError if a float array of a calibration sample holds NaN or inf."""
    import numpy as np

    for k, s in enumerate(samples):
        for name, a in s.items():
            a = np.asarray(a)
            if _is_float_dtype(a.dtype) and a.size and not np.all(np.isfinite(a)):
                raise QuantizationError(f"calibration sample {k}: input {name!r} holds non-finite values (NaN or inf); "
                                        f"calibration data must be finite")


def quantize_model(model, *, ranges: dict, samples: list[dict] | None = None, quant_format: str = "qdq",
                   per_channel: bool = False, full_integer: bool = False,
                   wrap_unquantized_io: bool = False,
                   wrap_only: "Collection[str] | None" = None) -> tuple["onnx.ModelProto", dict]:  # noqa: F821
    """Quantize a float model (the whole model or one layer) to int8 with ``quantize_static``.

    Steps (seed: notes/reference_tool.md s6; onnxruntime.quantization docs):

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
    import numpy as np

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
            import onnx

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
    import onnx

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


def place_constant_nodes_before_use(model) -> "onnx.ModelProto":  # noqa: F821
    """The same model with every node that reads only initializers (the
    DequantizeLinear of an int8 weight, a Constant) moved right before its first
    consumer; other nodes keep their order, so the order stays topological.

    onnxruntime.quantization puts the weights' DequantizeLinear nodes at the top of
    the graph; next to their Conv they stay in the Conv's partition when ``run``
    cuts the model into runs of consecutive nodes per executor.
    """
    import onnx

    nodes = list(model.graph.node)
    produced = {t for n in nodes for t in n.output if t}
    graph_inputs = {i.name for i in model.graph.input}
    const_like = [all((not t) or (t not in produced and t not in graph_inputs) for t in n.input) for n in nodes]
    pending = {}  # output tensor -> index of a constant-like node not placed yet
    for j, n in enumerate(nodes):
        if const_like[j]:
            for t in n.output:
                pending[t] = j
    order: list[int] = []
    placed: set[int] = set()

    def place(j: int) -> None:
        if j in placed:
            return
        for t in nodes[j].input:
            k = pending.get(t)
            if k is not None and k != j:
                place(k)
        placed.add(j)
        order.append(j)

    for j in range(len(nodes)):
        if not const_like[j]:
            place(j)
    for j in range(len(nodes)):
        place(j)  # constant-like nodes nobody reads, and chains of them
    if order == list(range(len(nodes))):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes[j] for j in order)
    return out


def _save(model, path: str, external: bool) -> None:
    import onnx

    if external:
        onnx.save_model(model, path, save_as_external_data=True, location=os.path.basename(path) + ".data")
    else:
        onnx.save_model(model, path)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:1500]}" if text else type(e).__name__


def _initializer_value(model, name: str):
    from onnx import numpy_helper

    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] == name:
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
    return None


def _elem_types(model) -> dict[str, int]:
    types = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in model.graph.initializer:
        types[t.name] = t.data_type
    return types


def _is_float_type(elem_type) -> bool:
    from onnx import TensorProto

    return elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


def _io_to_wrap(q) -> list[str]:
    """Float32 graph inputs with a non-Q consumer and float32 outputs not produced by
    DQ (QuantizeLinear takes float32 at the opsets used here; float16/double/bf16
    tensors stay as they are, as in the whole quantized model)."""
    from onnx import TensorProto

    types = _elem_types(q)
    inits = {t.name for t in q.graph.initializer}
    producers = {t: n for n in q.graph.node for t in n.output}
    names = []
    for vi in q.graph.input:
        if vi.name in inits or types.get(vi.name) != TensorProto.FLOAT:
            continue
        consumers = [n for n in q.graph.node if vi.name in n.input]
        if any(n.op_type != "QuantizeLinear" for n in consumers):
            names.append(vi.name)
    for vi in q.graph.output:
        p = producers.get(vi.name)
        if types.get(vi.name) == TensorProto.FLOAT and (p is None or p.op_type != "DequantizeLinear"):
            names.append(vi.name)
    return names


def _scale_zp(lo: float, hi: float) -> tuple["np.ndarray", "np.ndarray"]:  # noqa: F821
    """int8 scale/zero point of ``[lo, hi]`` exactly as ORT computes activation params
    (``quant_utils.compute_scale_zp``, asymmetric, 0 included in the range)."""
    import numpy as np
    from onnx import TensorProto

    with _root_logger_guard():
        from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(TensorProto.INT8)
    zp, scale = compute_scale_zp(np.array(lo, dtype=np.float32), np.array(hi, dtype=np.float32), qmin, qmax)
    return np.asarray(scale, dtype=np.float32).reshape(()), np.asarray(zp, dtype=np.int8).reshape(())


def _wrap_io(q, ranges: dict, warnings: list[str], only=None):
    """Insert Q->DQ pairs on unquantized float graph I/O (see :func:`quantize_model` step 4)."""
    import onnx
    from onnx import helper, numpy_helper

    names = [t for t in _io_to_wrap(q) if only is None or t in only]
    if not names:
        return q, []
    out = onnx.ModelProto()
    out.CopyFrom(q)
    g = out.graph
    inputs = {vi.name for vi in g.input}
    used = {t for n in g.node for t in list(n.input) + list(n.output)} | {t.name for t in g.initializer} | inputs
    wrapped = []
    new_nodes_front = []
    for t in names:
        if t not in ranges:
            warnings.append(f"no range for {t!r}: left unquantized")
            continue
        scale, zp = _scale_zp(*ranges[t])
        base = _unique(f"{t}_wrap", used)
        s_name, z_name = _unique(f"{base}_scale", used), _unique(f"{base}_zero_point", used)
        g.initializer.extend([numpy_helper.from_array(scale, s_name), numpy_helper.from_array(zp, z_name)])
        q_out, dq_out = _unique(f"{base}_q", used), _unique(f"{base}_dq", used)
        if t in inputs:
            for n in g.node:
                if n.op_type != "QuantizeLinear":
                    for i, x in enumerate(n.input):
                        if x == t:
                            n.input[i] = dq_out
            new_nodes_front += [helper.make_node("QuantizeLinear", [t, s_name, z_name], [q_out], name=f"{base}_QuantizeLinear"),
                                helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out], name=f"{base}_DequantizeLinear")]
            kind = "input"
        else:
            f_name = _unique(f"{t}_float", used)
            for n in g.node:
                for i, x in enumerate(n.output):
                    if x == t:
                        n.output[i] = f_name
                for i, x in enumerate(n.input):
                    if x == t:
                        n.input[i] = f_name
            for vi in g.value_info:
                if vi.name == t:
                    vi.name = f_name
            g.node.extend([helper.make_node("QuantizeLinear", [f_name, s_name, z_name], [q_out], name=f"{base}_QuantizeLinear"),
                           helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [t], name=f"{base}_DequantizeLinear")])
            kind = "output"
        wrapped.append({"tensor": t, "kind": kind, "scale": float(scale), "zero_point": int(zp)})
    if new_nodes_front:
        nodes = new_nodes_front + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
    return _infer(out), wrapped


def _unique(name: str, used: set) -> str:
    cand, k = name, 1
    while cand in used:
        cand = f"{name}_{k}"
        k += 1
    used.add(cand)
    return cand


def _qparams(model, node) -> tuple[Any, Any, int] | None:
    """(scale, zero_point, quantized elem_type) of a Q/DQ node, from initializers."""
    from onnx import helper

    scale = _initializer_value(model, node.input[1]) if len(node.input) > 1 else None
    zp = _initializer_value(model, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scale is None:
        return None
    if zp is None:
        import numpy as np

        zp = np.zeros_like(scale, dtype=np.uint8)
    return scale, zp, helper.np_dtype_to_tensor_dtype(zp.dtype)


def _jsonable(a):
    import numpy as np

    a = np.asarray(a)
    return a.item() if a.ndim == 0 or a.size == 1 else a.tolist()


def _strip_io_qdq(q, warnings: list[str]):
    """Make graph I/O int8 by removing input Q and output DQ nodes (see :func:`quantize_model` step 5)."""
    import numpy as np
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(q)
    g = out.graph
    inits = {t.name for t in g.initializer}
    input_names = {vi.name for vi in g.input}
    output_names = {vi.name for vi in g.output}
    remove: set[int] = set()
    for vi in g.input:
        if vi.name in inits:
            continue
        consumers = [(j, n) for j, n in enumerate(g.node) if vi.name in n.input]
        if not consumers:
            continue
        if any(n.op_type != "QuantizeLinear" for _, n in consumers):
            warnings.append(f"full_integer: input {vi.name!r} also feeds non-QuantizeLinear nodes; it stays float")
            continue
        params = [_qparams(out, n) for _, n in consumers]
        if any(p is None for p in params) or any(
                not (np.array_equal(p[0], params[0][0]) and np.array_equal(p[1], params[0][1]) and p[2] == params[0][2])
                for p in params):
            warnings.append(f"full_integer: input {vi.name!r} is quantized with different parameters; it stays float")
            continue
        for j, n in consumers:
            old = n.output[0]
            remove.add(j)
            for m in g.node:
                for i, x in enumerate(m.input):
                    if x == old:
                        m.input[i] = vi.name
            if old in output_names:  # a pass-through Q output: keep the name by renaming the graph output
                for o in g.output:
                    if o.name == old:
                        o.name = vi.name
        vi.type.tensor_type.elem_type = params[0][2]
    producers = {t: (j, n) for j, n in enumerate(g.node) for t in n.output}
    for vi in g.output:
        pj = producers.get(vi.name)
        if pj is None or pj[1].op_type != "DequantizeLinear":
            continue
        j, dq = pj
        src = dq.input[0]
        params = _qparams(out, dq)
        if params is None or src in input_names or src in inits or src in output_names:
            warnings.append(f"full_integer: output {vi.name!r} keeps its DequantizeLinear (its int8 source is not a node output)")
            continue
        remove.add(j)
        for m in g.node:
            for i, x in enumerate(m.output):
                if x == src:
                    m.output[i] = vi.name
            for i, x in enumerate(m.input):
                if x == src:
                    m.input[i] = vi.name
        vi.type.tensor_type.elem_type = params[2]
    nodes = [n for j, n in enumerate(g.node) if j not in remove]
    del g.node[:]
    g.node.extend(nodes)
    # value_info of renamed/removed tensors would conflict with graph I/O types
    io = {vi.name for vi in list(g.input) + list(g.output)}
    vis = [v for v in g.value_info if v.name not in io]
    del g.value_info[:]
    g.value_info.extend(vis)
    return out


def _drop_unused_initializers(q):
    """Remove initializers that no node (or subgraph) reads and that are no graph output."""
    from ..model.split import _outer_scope_inputs

    used = {t for n in q.graph.node for t in list(n.input) + _outer_scope_inputs(n)} | {o.name for o in q.graph.output}
    keep = [t for t in q.graph.initializer if t.name in used]
    if len(keep) != len(q.graph.initializer):
        del q.graph.initializer[:]
        q.graph.initializer.extend(keep)
    return q


def _dtype_name(elem_type) -> str | None:
    from onnx import helper

    if not elem_type:
        return None
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:
        return None


def _io_quantization(q) -> dict:
    """Scale/zero point at the graph I/O: inputs read by a QuantizeLinear and outputs
    written by a DequantizeLinear (before ``full_integer`` removes these nodes)."""
    from onnx import helper

    inits = {t.name for t in q.graph.initializer}
    producers = {t: n for n in q.graph.node for t in n.output}
    res = {}

    def rec(name, node):
        p = _qparams(q, node)
        if p is not None:
            res[name] = {"scale": _jsonable(p[0]), "zero_point": _jsonable(p[1]),
                         "dtype": helper.tensor_dtype_to_np_dtype(p[2]).name, "io_dtype": None}

    for vi in q.graph.input:
        if vi.name in inits:
            continue
        node = next((n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input and n.input[0] == vi.name), None)
        if node is not None:
            rec(vi.name, node)
    for vi in q.graph.output:
        node = producers.get(vi.name)
        if node is not None and node.op_type == "DequantizeLinear":
            rec(vi.name, node)
    return res


def _complete_value_info(q, warnings: list[str]):
    """Shape inference, then an ORT run for tensors still without value_info."""
    import numpy as np
    from onnx import helper

    q = _infer(q)
    known = set(_elem_types(q))
    missing = [t for n in q.graph.node for t in n.output if t and t not in known]
    if not missing:
        return q
    try:
        sess = _ort_session(q, missing)
        feeds = {}
        for i in sess.get_inputs():
            spec = next(s for s in _input_specs(q) if s[0] == i.name)
            feeds[i.name] = np.zeros([1 if d is None else d for d in spec[2]], dtype=spec[1])
        outs = sess.run(missing, feeds)
    except Exception as e:
        warnings.append(f"value_info of {len(missing)} tensor(s) unknown (ONNX Runtime run failed: {_one_line(e)})")
        return q
    for t, a in zip(missing, outs):
        a = np.asarray(a)
        q.graph.value_info.append(helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    return q


def _count_quantized(q) -> int:
    producers = {t: n for n in q.graph.node for t in n.output}
    count = 0
    for n in q.graph.node:
        if n.op_type in _QDQ_OPS or n.op_type == "Constant":
            continue
        if n.op_type in QUANTIZED_OP_BASE or n.op_type.startswith("QLinear"):
            count += 1
        elif any(t in producers and producers[t].op_type == "DequantizeLinear" for t in n.input):
            count += 1
    return count


# -------------------------------------------------------------------------- alignment
def compute_nodes(model) -> list[dict]:
    """The compute nodes of a quantized model, in graph order.

    QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear and Constant nodes are
    dropped; quantized op types are renamed to their base type with
    :data:`QUANTIZED_OP_BASE` (seed 001 "Quantized Models", steps 2-3).

    Returns:
        ``[{"index": position in model.graph.node, "op_type": base type,
        "quantized_op_type": the node's own type, "outputs": [names]}]``.
    """
    out = []
    for j, n in enumerate(model.graph.node):
        if n.op_type in _QDQ_OPS or n.op_type == "Constant":
            continue
        out.append({"index": j, "op_type": QUANTIZED_OP_BASE.get(n.op_type, n.op_type),
                    "quantized_op_type": n.op_type, "outputs": [t for t in n.output]})
    return out


def base_tensor_name(name: str) -> str:
    """``name`` without the suffix onnxruntime.quantization appends (``_quantized``, ...)."""
    for s in _ORT_SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def align_layers(layers: list[dict], computes: list[dict]) -> list[int | None]:
    """Align layers with compute ops by a longest common subsequence of op types.

    Order-preserving (seed 001 "Quantized Models" step 4; notes/reference_tool.md s6):
    among the alignments with the most op-type matches, one with the most pairs whose
    names agree is chosen (the layer's first output is among the compute node's
    outputs, also after removing the suffixes ORT appends such as ``_quantized``).
    Implemented as a weighted LCS: a match weighs ``K`` (K = min(m, n) + 1) plus 1
    for agreeing names, so names only break ties. O(m*n) time and memory with numpy
    (one vectorised pass per layer: the row is a running maximum).

    Args:
        layers: items with ``"op_type"`` and ``"outputs"`` (output names).
        computes: from :func:`compute_nodes`.

    Returns:
        Per layer, the position in ``computes`` it is aligned with, or None (no
        counterpart, e.g. a Relu fused into the preceding Conv).
    """
    import numpy as np

    m, n = len(layers), len(computes)
    if m == 0 or n == 0:
        return [None] * m
    K = min(m, n) + 1
    codes: dict[str, int] = {}
    lt = np.array([codes.setdefault(x["op_type"], len(codes)) for x in layers], dtype=np.int64)
    ct = np.array([codes.setdefault(x["op_type"], len(codes)) for x in computes], dtype=np.int64)
    cnames: dict[str, list[int]] = {}
    for j, c in enumerate(computes):
        for t in c.get("outputs") or []:
            if t:
                for key in {t, base_tensor_name(t)}:
                    cnames.setdefault(key, []).append(j)
    dp = np.zeros((m + 1, n + 1), dtype=np.int64)
    for i in range(1, m + 1):
        w = np.where(ct == lt[i - 1], K, 0)
        outs = layers[i - 1].get("outputs") or []
        first = outs[0] if outs else None
        if first:
            for j in set(cnames.get(first, [])):
                if w[j]:
                    w[j] += 1
        prev = dp[i - 1]
        cand = np.maximum(prev[1:], np.where(w > 0, prev[:-1] + w, 0))
        dp[i, 1:] = np.maximum.accumulate(cand)
        dp[i, 0] = 0
    # backtrack
    res: list[int | None] = [None] * m
    i, j = m, n
    while i > 0 and j > 0:
        v = dp[i, j]
        if v == dp[i - 1, j]:
            i -= 1
        elif v == dp[i, j - 1]:
            j -= 1
        else:  # a match ends here
            res[i - 1] = j - 1
            i -= 1
            j -= 1
    return res
