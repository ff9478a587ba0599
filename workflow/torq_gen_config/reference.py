"""Deterministic layer inputs and ONNX Runtime reference outputs.

Inputs are drawn from ``numpy.random.default_rng(seed)`` with per-dtype ranges
(config ``inputs``); index inputs (``Gather``/``GatherElements``/``GatherND``/
``ScatterElements``/``ScatterND`` indices) are bounded by the indexed dimension, so
that no executor reads out of bounds (the original tool segfaulted on this,
notes/reference_tool.md section 2). References come from ONNX Runtime CPU with all
graph optimizations disabled.

The reference file (``reference.npz``) holds ``input_<i>``, ``output_<i>`` arrays
and ``__meta__`` (a JSON string: names, status, message, ONNX Runtime version).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: Default value ranges per dtype class, [low, high) (config ``inputs``).
DEFAULT_INPUT_SETTINGS = {"seed": 1234, "float_range": [-1.0, 1.0], "int_range": [-40, 40], "uint8_range": [0, 80]}


def make_inputs(layer_model: "onnx.ModelProto", settings: dict | None = None,  # noqa: F821
                input_ranges: dict[str, list[float]] | None = None) -> dict[str, "np.ndarray"]:  # noqa: F821
    """Deterministic random inputs for the run-time inputs of a layer model.

    Args:
        layer_model: single-layer model (or whole model) whose graph inputs carry
            static shapes (a 0 dim gives an empty array).
        settings: ``seed``, ``float_range``, ``int_range``, ``uint8_range``.
        input_ranges: per input name, a [low, high) range that replaces the
            dtype's range (``--quantize``: a float input is drawn in its calibrated
            range, an int8 input of a full-integer layer over all int8 values).

    Returns:
        Input name -> array, in graph input order. Floats are drawn uniformly and
        cast (bfloat16, float8, int4, ... through ml_dtypes), integers uniformly in
        [low, high), bools in {False, True}; inputs that an operator reads as
        indices, axes, shapes, sizes, scales, ... follow that operator's rule
        (:func:`torq_gen_config.input_generation.generate_inputs`, docs/inputs.md).

    Raises:
        ValueError: a graph input with a symbolic or unknown dim (named in the message).
    """
    from .input_generation import generate_inputs

    return generate_inputs(layer_model, settings, input_ranges)


def compute_reference(layer_path: str | os.PathLike, out_path: str | os.PathLike, settings: dict | None = None,
                      *, intra_op_num_threads: int = 1, inputs_path: str | os.PathLike | None = None,
                      input_ranges: dict[str, list[float]] | None = None) -> dict:
    """Make inputs for a layer, run ONNX Runtime (optimizations off) and store both.

    With ``inputs_path`` (``--layer-inputs propagate``), the layer's inputs are read
    from that ``.npz`` (written by :func:`propagate_layer_inputs`) instead of drawn
    at random; ``input_ranges`` see :func:`make_inputs`.

    A layer with bfloat16 tensors (``--auto-convert-bf16``) gets its reference from
    the same layer widened to float32 (:func:`~torq_gen_config.precision.dtype_conversion.widen_bf16_to_fp32`:
    bf16 constants and inputs upcast exactly), run on the bf16 inputs, with the
    bf16 outputs rounded to bf16 (round to nearest even): ONNX Runtime CPU has no
    bf16 kernels for most ops (notes/toolchain.md section 5), and this is the
    result of an exact computation on the values the executor sees
    (docs/precision.md). ``meta["reference_precision"]`` says which was used.

    A failing reference (ONNX Runtime refuses the model or fails to run it) is
    recorded, not raised: the file then holds the inputs and ``status: error`` with
    ONNX Runtime's message, so executors can still run (their results are
    "unverified").

    Returns:
        The metadata dict stored as ``__meta__`` (``status``, ``message``,
        ``input_names``, ``output_names``, ``ort_version``, ``run_ms``).
    """
    import time

    import numpy as np
    import onnx
    import onnxruntime as ort

    layer = onnx.load(str(layer_path))
    if inputs_path is not None:
        inputs = load_layer_inputs(inputs_path, layer)
    else:
        inputs = make_inputs(layer, settings, input_ranges)
    output_names = [o.name for o in layer.graph.output]
    bf16 = has_bfloat16(layer)
    meta: dict[str, Any] = {
        "status": "ok", "message": None, "engine": "onnxruntime", "ort_version": ort.__version__,
        "graph_optimization_level": "disabled", "input_names": list(inputs), "output_names": output_names,
        "settings": {**DEFAULT_INPUT_SETTINGS, **(settings or {})}, "run_ms": None,
        "layer_inputs": "propagate" if inputs_path is not None else "random",
        "reference_precision": "fp32 on bf16 values, outputs rounded to bf16" if bf16 else "as the model",
    }
    outputs = []
    try:
        t0 = time.perf_counter()
        outputs = reference_outputs(layer, inputs, output_names, intra_op_num_threads=intra_op_num_threads,
                                    model_path=layer_path)
        meta["run_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    except Exception as e:  # ORT raises its own Fail/InvalidGraph/NotImplemented types
        meta["status"] = "error"
        meta["message"] = f"ONNX Runtime failed on the layer: {str(e).strip()[:2000]}"
        outputs = []
    arrays = {f"input_{i}": a for i, a in enumerate(inputs.values())}
    arrays.update({f"output_{i}": np.asarray(a) for i, a in enumerate(outputs)})
    save_npz(out_path, arrays, meta)
    return meta


def reference_outputs(model: "onnx.ModelProto", feeds: dict, output_names: list[str], *,  # noqa: F821
                      intra_op_num_threads: int | None = None, model_path: str | os.PathLike | None = None) -> list:
    """Run ``model`` in ONNX Runtime CPU with graph optimizations off (the reference
    engine) and return ``output_names``' arrays.

    A model with bfloat16 tensors (:func:`has_bfloat16`) runs widened to float32
    (bf16 constants and inputs upcast exactly), and its bf16 outputs are rounded to
    bf16 (round to nearest even): ONNX Runtime CPU has no bf16 kernels for most
    ops (notes/toolchain.md section 5; docs/precision.md).

    Args:
        feeds: input name -> array (bf16 arrays as ml_dtypes.bfloat16).
        model_path: the model's file, if any (ONNX Runtime loads it from there).

    Raises:
        Exception: whatever ONNX Runtime raises (callers record it).
    """
    import numpy as np
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if intra_op_num_threads is not None:
        so.intra_op_num_threads = intra_op_num_threads
    so.log_severity_level = 3
    if not has_bfloat16(model):
        src = str(model_path) if model_path is not None else model.SerializeToString()
        sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        from .ort_io import run as run_session  # float8/int4/... feeds and outputs through OrtValues

        return run_session(sess, output_names, dict(feeds))
    from .precision.dtype_conversion import round_to_bf16, widen_bf16_to_fp32

    types = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.value_info) + list(model.graph.output)
             + list(model.graph.input)}
    sess = ort.InferenceSession(widen_bf16_to_fp32(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {k: (np.asarray(v).astype(np.float32) if np.asarray(v).dtype.name == "bfloat16" else v)
            for k, v in feeds.items()}
    outs = sess.run(output_names, feed)
    return [round_to_bf16(o) if types.get(n) == onnx.TensorProto.BFLOAT16 else o for o, n in zip(outs, output_names)]


def has_bfloat16(model: "onnx.ModelProto") -> bool:  # noqa: F821
    """True when any graph input, output, value_info or initializer of ``model``
    (main graph) is BFLOAT16, or a node casts to it."""
    import onnx

    bf = onnx.TensorProto.BFLOAT16
    g = model.graph
    if any(v.type.tensor_type.elem_type == bf for v in list(g.input) + list(g.output) + list(g.value_info)):
        return True
    if any(t.data_type == bf for t in g.initializer):
        return True
    return any(n.op_type == "Cast" and any(a.name == "to" and a.i == bf for a in n.attribute) for n in g.node)


def load_input_data(path: str | os.PathLike, model: "onnx.ModelProto") -> dict[str, "np.ndarray"]:  # noqa: F821
    """Model inputs from a user's ``.npz`` (``--input-data``), keyed by input name.

    An array may carry one extra leading sample dimension (``N`` samples of the
    input's shape); the first sample is used.

    A bfloat16 model input (``--auto-convert-bf16``) accepts float arrays (float16,
    float32, float64, or ml_dtypes.bfloat16), rounded to bfloat16 through float32
    (round to nearest even, as :func:`~torq_gen_config.precision.dtype_conversion.round_to_bf16`),
    and ``|V2`` arrays (what ``numpy.savez`` makes of an ml_dtypes.bfloat16 array),
    read as bfloat16 bit patterns.

    Raises:
        ModelError: unreadable file, a missing input name, a shape that matches
            neither the input's shape nor ``(N, *shape)``, or a non-float array for
            a bfloat16 input.
    """
    import numpy as np
    from onnx import TensorProto, helper

    from .errors import ModelError

    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read input data {path}: {e}") from None
    feeds = {}
    with data:
        for vi in model.graph.input:
            if vi.name not in data.files:
                raise ModelError(f"input data {path} has no array {vi.name!r}; the model's inputs are "
                                 f"{[v.name for v in model.graph.input]}, the file has {data.files}")
            a = data[vi.name]
            shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                          for d in vi.type.tensor_type.shape.dim)
            if a.shape != shape and a.shape[1:] == shape:
                a = a[0]
            if a.shape != shape:
                raise ModelError(f"input data {path}: {vi.name!r} has shape {a.shape}, the model expects {shape}")
            if vi.type.tensor_type.elem_type == TensorProto.BFLOAT16:
                feeds[vi.name] = _input_data_to_bf16(a, vi.name, path)
            else:
                feeds[vi.name] = a.astype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    return feeds


def _input_data_to_bf16(a: "np.ndarray", name: str, path) -> "np.ndarray":  # noqa: F821
    """A user's array for a bfloat16 input as ml_dtypes.bfloat16 (see :func:`load_input_data`)."""
    import ml_dtypes
    import numpy as np

    from .errors import ModelError
    from .precision.dtype_conversion import round_to_bf16

    if a.dtype.name == "bfloat16":
        return a
    if a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.fields is None:
        return a.view(ml_dtypes.bfloat16)
    if np.issubdtype(a.dtype, np.floating):
        return round_to_bf16(a)
    raise ModelError(f"input data {path}: {name!r} has dtype {a.dtype}, but the model input is bfloat16 "
                     f"(--auto-convert-bf16); give float values (float32/float64/float16 or ml_dtypes.bfloat16), "
                     f"they are rounded to bfloat16")


def load_layer_inputs(path: str | os.PathLike, layer: "onnx.ModelProto") -> dict[str, "np.ndarray"]:  # noqa: F821
    """A layer's inputs from ``<layer>/inputs.npz`` (:func:`propagate_layer_inputs`), keyed
    by the layer's graph inputs in order.

    The file is written with :func:`save_npz` (bfloat16 arrays as uint16 bit patterns,
    listed in ``__meta__``); a file without ``__meta__`` (written by an older version,
    where ``numpy.savez`` stored bfloat16 as raw ``|V2``) is read too. Either way an
    input the layer declares BFLOAT16 comes back as ml_dtypes.bfloat16.

    Raises:
        KeyError: the file has no array for one of the layer's inputs.
    """
    import ml_dtypes
    import onnx

    arrays = _read_layer_inputs_file(path)
    inputs = {}
    for vi in layer.graph.input:
        a = arrays[vi.name]
        if (vi.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 and a.dtype.name != "bfloat16"
                and a.dtype.itemsize == 2 and (a.dtype.kind == "V" or a.dtype == "uint16")):
            a = a.view(ml_dtypes.bfloat16)
        inputs[vi.name] = a
    return inputs


def _read_layer_inputs_file(path: str | os.PathLike) -> dict[str, "np.ndarray"]:  # noqa: F821
    """All arrays of a layer inputs file (``__meta__`` dropped, bf16 keys restored)."""
    import numpy as np

    with np.load(Path(path), allow_pickle=False) as z:
        has_meta = "__meta__" in z.files
    if has_meta:
        return load_npz(path)[0]
    with np.load(Path(path), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _same_arrays(old: dict, new: dict) -> bool:
    """True when both hold the same names with equal dtypes, shapes and values (bfloat16
    compared bit for bit, NaN equal to NaN for other floats)."""
    import numpy as np

    if set(old) != set(new):
        return False
    for k, a in new.items():
        b = old[k]
        if b.dtype != a.dtype or b.shape != a.shape:
            return False
        if a.dtype.name == "bfloat16":
            if not np.array_equal(b.view(np.uint16), a.view(np.uint16)):
                return False
        elif not np.array_equal(b, a, equal_nan=a.dtype.kind in "fc"):
            return False
    return True


def propagate_layer_inputs(prepared_path: str | os.PathLike, manifest: dict, layers_dir: str | os.PathLike,
                           settings: dict | None = None, input_data: str | os.PathLike | None = None) -> dict:
    """Run the whole prepared model once in ONNX Runtime and store each layer's inputs.

    ``--layer-inputs propagate``: every layer then sees the values it would see in the
    model (post-ReLU non-negative, real ranges) instead of random ones. Model inputs
    come from ``input_data`` (``--input-data``) or are drawn like layer inputs.
    Writes ``<layers_dir>/<slug>/inputs.npz`` per layer with :func:`save_npz` (bfloat16
    arrays as uint16 bit patterns; read back by :func:`load_layer_inputs`), leaving a
    file whose arrays did not change untouched (so its layer is not retested).

    Returns:
        ``{"model_inputs": {name: [shape]}, "source": "random"|path, "run_ms",
        "layers": N, "rewritten": M}``.

    Raises:
        ModelError: ONNX Runtime cannot run the whole model, or bad ``input_data``.
    """
    import time

    import numpy as np
    import onnx
    import onnxruntime as ort

    from .errors import ModelError

    model = onnx.load(str(prepared_path))
    feeds = load_input_data(input_data, model) if input_data else make_inputs(model, settings)
    bf16_names: set[str] = set()
    if has_bfloat16(model):  # --auto-convert-bf16: run in fp32 on bf16 values, round bf16 tensors
        from .precision.dtype_conversion import widen_bf16_to_fp32

        g = model.graph
        bf16_names = {v.name for v in list(g.input) + list(g.output) + list(g.value_info)
                      if v.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16}
        model = widen_bf16_to_fp32(model)
    needed = sorted({i["name"] for layer in manifest["layers"] for i in layer["inputs"]} - set(feeds))
    have = {o.name for o in model.graph.output}
    types = {vi.name: vi for vi in model.graph.value_info}
    for name in needed:
        if name not in have:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(types[name]) if name in types else setattr(vi, "name", name)
            model.graph.output.append(vi)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        run_feeds = {k: (v.astype(np.float32) if v.dtype.name == "bfloat16" else v) for k, v in feeds.items()}
        t0 = time.perf_counter()
        values = dict(zip(needed, sess.run(needed, run_feeds)))
        run_ms = (time.perf_counter() - t0) * 1000
        if bf16_names:
            from .precision.dtype_conversion import round_to_bf16

            values = {k: (round_to_bf16(v) if k in bf16_names else v) for k, v in values.items()}
    except Exception as e:
        raise ModelError(f"--layer-inputs propagate needs ONNX Runtime to run the whole model, and it failed: "
                         f"{str(e).strip()[:500]}") from None
    values.update(feeds)
    rewritten = 0
    for layer in manifest["layers"]:
        arrays = {i["name"]: np.asarray(values[i["name"]]) for i in layer["inputs"]}
        path = Path(layers_dir) / layer["slug"] / "inputs.npz"
        if path.exists():
            try:
                unchanged = _same_arrays(_read_layer_inputs_file(path), arrays)
            except Exception:  # unreadable or foreign file: write it again
                unchanged = False
            if unchanged:
                continue
        save_npz(path, arrays, {"kind": "layer_inputs", "layer": layer["slug"]})
        rewritten += 1
    return {"model_inputs": {k: list(v.shape) for k, v in feeds.items()},
            "source": str(input_data) if input_data else "random", "run_ms": round(run_ms, 3),
            "layers": len(manifest["layers"]), "rewritten": rewritten}


def save_npz(path: str | os.PathLike, arrays: dict[str, "np.ndarray"], meta: dict) -> None:  # noqa: F821
    """Write arrays plus a JSON ``__meta__`` entry to an ``.npz`` atomically.

    bfloat16 arrays (ml_dtypes) are stored as uint16 bit patterns and listed in
    ``meta["bf16_keys"]`` so that :func:`load_npz` restores them.
    """
    import io

    import numpy as np

    from .fileio import atomic_write_bytes

    meta = dict(meta)
    bf16 = []
    store = {}
    for k, a in arrays.items():
        if a.dtype.name == "bfloat16":
            bf16.append(k)
            a = a.view(np.uint16)
        store[k] = a
    meta["bf16_keys"] = bf16
    store["__meta__"] = np.array(json.dumps(meta))
    buf = io.BytesIO()
    np.savez(buf, **store)
    atomic_write_bytes(path, buf.getvalue())


def load_npz(path: str | os.PathLike) -> tuple[dict[str, "np.ndarray"], dict]:  # noqa: F821
    """Read a file written by :func:`save_npz`: ``(arrays, meta)``."""
    import numpy as np

    with np.load(Path(path), allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"]))
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
    if meta.get("bf16_keys"):
        import ml_dtypes

        for k in meta["bf16_keys"]:
            arrays[k] = arrays[k].view(ml_dtypes.bfloat16)
    return arrays, meta


def load_reference(path: str | os.PathLike) -> tuple[dict, dict, dict]:
    """Read ``reference.npz``: ``(inputs by name, reference outputs by name, meta)``.

    Outputs are empty when the reference failed (``meta["status"] == "error"``).
    """
    arrays, meta = load_npz(path)
    inputs = {n: arrays[f"input_{i}"] for i, n in enumerate(meta["input_names"])}
    outputs = {n: arrays[f"output_{i}"] for i, n in enumerate(meta["output_names"]) if f"output_{i}" in arrays}
    return inputs, outputs, meta
