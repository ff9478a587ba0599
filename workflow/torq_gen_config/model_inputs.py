"""The model's input values: one set, used by every whole-model step.

The whole-model reference run (shapes, realistic layer inputs), the full-model
reference of ``run`` and the full-subgraph test all start from the same values:
the user's ``--input-data`` arrays, else op-aware generated values (seeded,
:func:`torq_gen_config.reference.make_inputs`). In subgraph mode the subgraph's
inputs are the values those tensors have in a run of the whole model. They are
written once, by the preparation, to ``work/model_inputs.npz``
(:data:`MODEL_INPUTS_FILE`), keyed by the prepared model's input names, with the
dtypes of the prepared model (bf16 / int32 after a conversion).
"""

from __future__ import annotations

import os
from pathlib import Path

#: File name of the model's input values in the work directory.
MODEL_INPUTS_FILE = "model_inputs.npz"


def input_data_shapes(path: str | os.PathLike, model: "onnx.ModelProto") -> dict[str, list[int]]:  # noqa: F821
    """Shapes that the user's ``--input-data`` arrays give the model's symbolic dims.

    An array of the input's rank gives its shape; one of rank + 1 (``N`` samples)
    gives the shape of one sample. Inputs without a symbolic dim, or without an
    array, are left out (:func:`torq_gen_config.reference.load_input_data` checks them).

    Raises:
        ModelError: the file cannot be read.
    """
    import numpy as np

    from .errors import ModelError

    from .reference import open_input_data

    data = open_input_data(path)
    shapes = {}
    inits = {t.name for t in model.graph.initializer}
    with data:
        for vi in model.graph.input:
            if vi.name in inits or vi.name not in data.files:
                continue
            tt = vi.type.tensor_type
            if not tt.HasField("shape") or all(d.HasField("dim_value") for d in tt.shape.dim):
                continue
            shape = list(data[vi.name].shape)
            rank = len(tt.shape.dim)
            if len(shape) == rank + 1:
                shape = shape[1:]
            if len(shape) == rank:
                shapes[vi.name] = [int(d) for d in shape]
    return shapes


def model_input_values(model: "onnx.ModelProto", settings: dict | None = None,  # noqa: F821
                       input_data: str | os.PathLike | None = None, notes: list[str] | None = None) -> tuple[dict, str]:
    """The input values of ``model`` (its static shapes fixed): the user's
    ``input_data`` .npz (checked against the inputs, first sample of ``[N, *shape]``
    arrays; ``notes`` gets a line per dtype conversion and ignored array), else values
    generated with the seed of ``settings``.

    Returns:
        ``(feeds, source)``: input name -> array, and ``"input_data <path>"`` or
        ``"generated (seed S)"``.

    Raises:
        ModelError: unusable ``input_data`` (see :func:`torq_gen_config.reference.load_input_data`).
    """
    from .model.graph import copy_proto
    from .reference import DEFAULT_INPUT_SETTINGS, load_input_data, make_inputs

    if any(vi.type.WhichOneof("value") != "tensor_type" for vi in model.graph.input):
        # sequence/optional inputs get no value: the layers that read them are not testable
        model = copy_proto(model)
        tensors = [copy_proto(vi) for vi in model.graph.input if vi.type.WhichOneof("value") == "tensor_type"]
        del model.graph.input[:]
        model.graph.input.extend(tensors)
    if input_data:
        return load_input_data(input_data, model, notes), f"input_data {input_data}"
    seed = {**DEFAULT_INPUT_SETTINGS, **(settings or {})}["seed"]
    return make_inputs(model, settings), f"generated (seed {seed})"


def cast_to_model_inputs(feeds: dict, model: "onnx.ModelProto") -> dict:  # noqa: F821
    """``feeds`` converted to the dtypes of ``model``'s graph inputs (after a bf16 or
    int32 conversion): floats to bfloat16 by round to nearest even, other types by
    ``astype``. Names ``model`` does not take are dropped."""
    import numpy as np
    from onnx import TensorProto, helper

    out = {}
    for vi in model.graph.input:
        if vi.name not in feeds:
            continue
        a = feeds[vi.name]
        et = vi.type.tensor_type.elem_type
        if isinstance(a, list) or not et:
            out[vi.name] = a
        elif et == TensorProto.BFLOAT16:
            from .precision.dtype_conversion import round_to_bf16

            out[vi.name] = a if getattr(a.dtype, "name", "") == "bfloat16" else round_to_bf16(np.asarray(a, np.float32))
        else:
            from .ort_io import numpy_dtype

            want = numpy_dtype(et)
            out[vi.name] = a if a.dtype == want else np.asarray(a).astype(want)
    return out


def save_model_inputs(path: str | os.PathLike, feeds: dict, meta: dict) -> None:
    """Write the model input values (atomically, and only when they changed, so an
    unchanged file keeps its mtime; see :func:`torq_gen_config.reference.save_npz`)."""
    from .reference import save_npz

    save_npz(path, dict(feeds), {"kind": "model_inputs", **meta}, only_if_changed=True)


def load_model_inputs(path: str | os.PathLike, model: "onnx.ModelProto | None" = None) -> tuple[dict, dict]:  # noqa: F821
    """Read ``model_inputs.npz``: ``(feeds, meta)``; with ``model``, only (and all of)
    its graph inputs, in its order.

    Raises:
        ModelError: the file lacks an input of ``model``, or holds one with another
            dtype or shape than ``model`` declares.
    """
    import numpy as np

    from .errors import ModelError
    from .ort_io import numpy_dtype
    from .reference import load_npz

    arrays, meta = load_npz(Path(path))
    if model is None:
        return arrays, meta
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if vi.name not in arrays:
            raise ModelError(f"{path} has no values for input {vi.name!r} ({meta.get('source')}); "
                             "rerun the preparation")
        a = arrays[vi.name]
        tt = vi.type.tensor_type
        want = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        try:
            dtype = numpy_dtype(tt.elem_type)
        except Exception:
            dtype = None
        if dtype == np.dtype(object) and a.dtype.kind in "USO":  # strings are stored as unicode arrays
            a = a.astype(object)
        if (dtype is not None and a.dtype != dtype) or len(a.shape) != len(want) or any(
                w is not None and w != d for d, w in zip(a.shape, want)):
            raise ModelError(f"{path}: input {vi.name!r} is {a.dtype}{list(a.shape)}, the model declares "
                             f"{getattr(dtype, 'name', tt.elem_type)}{want}")
        feeds[vi.name] = a
    return feeds, meta
