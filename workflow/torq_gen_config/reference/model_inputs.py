"""The model's input values: one set, used by every whole-model step.

The whole-model reference run (shapes, realistic layer inputs), the full-model
reference of ``run`` and the full-subgraph test all start from the same values:
the user's ``--input-data`` arrays, else op-aware generated values (seeded,
:func:`torq_gen_config.inputs.make_inputs`). In subgraph mode the subgraph's
inputs are the values those tensors have in a run of the whole model. They are
written once, by the preparation, to ``work/model_inputs.npz``
(:data:`torq_gen_config.core.layout.MODEL_INPUTS_FILE`), keyed by the prepared model's input names, with the
dtypes of the prepared model (bf16 / int32 after a conversion).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from ..core.errors import ModelError
from ..core.fileio import load_npz, save_npz
from ..core.lazy import ml_dtypes, np, onnx, zipfile
from ..core.ort_io import numpy_dtype
from ..inputs import DEFAULT_INPUT_SETTINGS, make_inputs
from ..model.graph import copy_proto
from ..model.symbolic_dims import declared_shape
from ..precision.bf16_rounding import round_to_bf16

#: File name of the model's input values in the work directory.


def input_data_shapes(path: str | os.PathLike, model: "onnx.ModelProto") -> dict[str, list[int]]:  # noqa: F821
    """Shapes that the user's ``--input-data`` arrays give the model's dynamic dims
    (:func:`~torq_gen_config.model.symbolic_dims.is_dynamic`: a named dim, ``?``, no
    value, ``-1``).

    An array of the input's rank gives its shape; one of rank + 1 (``N`` samples)
    gives the shape of one sample; for an input that declares no shape, the array's
    shape. Inputs without a dynamic dim, or without an array, are left out
    (:func:`load_input_data` checks them).

    Raises:
        ModelError: the file cannot be read.
    """

    data = open_input_data(path, model)
    shapes = {}
    inits = {t.name for t in model.graph.initializer}
    with data:
        for vi in model.graph.input:
            if vi.name in inits or vi.name not in data.files:
                continue
            declared = declared_shape(vi)
            shape = list(data[vi.name].shape)
            if declared is None:  # no shape declared: any array (ONNX Runtime takes any rank)
                shapes[vi.name] = [int(d) for d in shape]
                continue
            if None not in declared:
                continue
            rank = len(declared)
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
        ModelError: unusable ``input_data`` (see :func:`load_input_data`).
    """
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
    out = {}
    for vi in model.graph.input:
        if vi.name not in feeds:
            continue
        a = feeds[vi.name]
        et = vi.type.tensor_type.elem_type
        if isinstance(a, list) or not et:
            out[vi.name] = a
        elif et == onnx.TensorProto.BFLOAT16:
            out[vi.name] = a if getattr(a.dtype, "name", "") == "bfloat16" else round_to_bf16(np.asarray(a, np.float32))
        else:
            want = numpy_dtype(et)
            out[vi.name] = a if a.dtype == want else np.asarray(a).astype(want)
    return out


def save_model_inputs(path: str | os.PathLike, feeds: dict, meta: dict) -> None:
    """Write the model input values (atomically, and only when they changed, so an
    unchanged file keeps its mtime; see :func:`torq_gen_config.core.fileio.save_npz`)."""

    save_npz(path, dict(feeds), {"kind": "model_inputs", **meta}, only_if_changed=True)


def load_model_inputs(path: str | os.PathLike, model: "onnx.ModelProto | None" = None) -> tuple[dict, dict]:  # noqa: F821
    """Read ``model_inputs.npz``: ``(feeds, meta)``; with ``model``, only (and all of)
    its graph inputs, in its order.

    Raises:
        ModelError: the file lacks an input of ``model``, or holds one with another
            dtype or shape than ``model`` declares.
    """
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


class _OneArray:
    """A single ``.npy`` array read as an archive holding it under one name (the model's
    one input): the interface of ``NpzFile`` that :func:`load_input_data` uses."""

    def __init__(self, array, name: str):
        self.files, self._array = [name], array

    def __getitem__(self, name: str):
        return self._array

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        pass


def open_input_data(path: str | os.PathLike, model: "onnx.ModelProto | None" = None):  # noqa: F821
    """Open an ``--input-data`` file without unpickling: an ``.npz`` (arrays by input
    name), or a single ``.npy`` array for a model with one input (``model``: the array is
    that input's; without a model, only checked to be readable).

    Returns:
        The ``numpy.lib.npyio.NpzFile`` (a context manager), or an object with the same
        ``files``, item access and ``close``.

    Raises:
        ModelError: the file is missing or unreadable, it is neither an ``.npz`` nor an
            ``.npy`` file, or it is an ``.npy`` array and the model has several inputs.
    """

    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as e:
        raise ModelError(f"cannot read input data {path}: {e.strerror or e}") from None
    if not is_zip:
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ModelError(f"input data {path} is neither an .npz archive nor an .npy array ({e}); write one with "
                             "numpy.savez(path, <input name>=array, ...)") from None
        if model is None:
            return _OneArray(array, "")
        inits = {t.name for t in model.graph.initializer}
        names = [vi.name for vi in model.graph.input if vi.name not in inits]
        if len(names) != 1:
            raise ModelError(f"input data {path} is a single .npy array, and the model has {len(names)} inputs "
                             f"{names}: write an .npz with numpy.savez(path, <input name>=array, ...)")
        return _OneArray(array, names[0])
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ModelError(f"cannot read input data {path}: {e}") from None


def load_input_data(path: str | os.PathLike, model: "onnx.ModelProto",  # noqa: F821
                    notes: list[str] | None = None) -> dict[str, "np.ndarray"]:  # noqa: F821
    """Model inputs from a user's ``.npz`` (``--input-data``), keyed by input name (or an
    ``.npy`` array for a model with one input: :func:`open_input_data`).

    An array may carry one extra leading sample dimension (``N`` samples of the
    input's shape); the first sample is used.

    A bfloat16 model input (``--auto-convert-bf16``) accepts float arrays (float16,
    float32, float64, or ml_dtypes.bfloat16), rounded to bfloat16 through float32
    (round to nearest even, as :func:`~torq_gen_config.precision.bf16_rounding.round_to_bf16`),
    and ``|V2`` arrays (what ``numpy.savez`` makes of an ml_dtypes.bfloat16 array),
    read as bfloat16 bit patterns.

    Zero-size dims are dims: an input of shape (2, 0, 4) takes a (2, 0, 4) array. A
    dynamic dim (a named dim, ``?``, no value, ``-1``) takes any size, and an input that
    declares no shape any array, as in ONNX Runtime.
    Arrays are converted to the input's dtype within a kind (float64 -> float32,
    int32 -> int64; ``notes`` gets a line per conversion and per array the model does
    not take); string inputs take numpy unicode arrays.

    Raises:
        ModelError: unreadable file, a missing input name, a shape that matches
            neither the input's shape nor ``(N, *shape)``, a float array for an integer
            input (or the reverse), an object array, or a non-float array for a
            bfloat16 input.
    """

    data = open_input_data(path, model)
    feeds = {}
    with data:
        taken = {vi.name for vi in model.graph.input}
        extra = sorted(set(data.files) - taken)
        if extra and notes is not None:
            notes.append(f"input data {path}: arrays {', '.join(map(repr, extra))} are not inputs of the model "
                         "and are ignored")
        for vi in model.graph.input:
            if vi.name not in data.files:
                raise ModelError(f"input data {path} has no array {vi.name!r}; the model's inputs are "
                                 f"{[v.name for v in model.graph.input]}, the file has {data.files}")
            try:
                a = data[vi.name]
            except ValueError as e:
                a = _raw_npz_member(path, vi.name)  # numpy writes float8_e5m2 as '<f1', which it cannot read back
                if a is None:  # an object array (pickled): refused without allow_pickle
                    raise ModelError(f"input data {path}: array {vi.name!r} cannot be read without pickle ({e}); "
                                     "save strings as a numpy unicode array (dtype 'U'), numbers with a numeric "
                                     "dtype") from None
            shape = declared_shape(vi)
            if shape is None:  # no shape declared: ONNX Runtime takes any
                shape = (None,) * a.ndim
            if len(a.shape) == len(shape) + 1 and _fits(a.shape[1:], shape):
                a = a[0]
            if not _fits(a.shape, shape):
                want = "x".join("?" if d is None else str(d) for d in shape) or "a scalar"
                raise ModelError(f"input data {path}: {vi.name!r} has shape {'x'.join(map(str, a.shape)) or 'scalar'}, "
                                 f"the model expects {want} (or N samples of it)")
            if vi.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16:
                feeds[vi.name] = _input_data_to_bf16(a, vi.name, path)
                continue

            want = numpy_dtype(vi.type.tensor_type.elem_type)
            if want.type.__module__.startswith("ml_dtypes"):  # float8, int4, ...: bit patterns or values
                if a.dtype == want:
                    feeds[vi.name] = a
                elif a.dtype.kind in "Vu" and a.dtype.itemsize == want.itemsize and a.dtype.names is None:
                    feeds[vi.name] = a.view(want)  # what numpy.savez makes of an ml_dtypes array
                elif _kind(a.dtype) == _kind(want):
                    if notes is not None:
                        notes.append(f"input data {path}: {vi.name!r} converted from {a.dtype} to {want}")
                    feeds[vi.name] = a.astype(want)
                else:
                    raise ModelError(f"input data {path}: {vi.name!r} has dtype {a.dtype}, the model input is {want}")
                continue
            if want == np.dtype(object):  # a string input
                if a.dtype.kind not in "US":
                    raise ModelError(f"input data {path}: {vi.name!r} has dtype {a.dtype}, the model input is a "
                                     "string tensor")
                feeds[vi.name] = a.astype(object)
                continue
            if _kind(a.dtype) != _kind(want):
                raise ModelError(f"input data {path}: {vi.name!r} has dtype {a.dtype}, the model input is {want}; "
                                 f"give {_kind(want)} values (converting them here could change their meaning)")
            if a.dtype != want and notes is not None:
                notes.append(f"input data {path}: {vi.name!r} converted from {a.dtype} to {want}")
            feeds[vi.name] = a.astype(want)
    return feeds


def _raw_npz_member(path, name: str):
    """The array ``name`` of an ``.npz`` read from its raw bytes, for the descriptors
    numpy writes but cannot read (``'<f1'`` of float8_e5m2): a uint8 array of its
    shape (the caller views it as the model's dtype), or None when it is not such a
    1-byte array (e.g. a pickled object array)."""
    try:
        with zipfile.ZipFile(path) as z, z.open(f"{name}.npy") as f:
            version = np.lib.format.read_magic(f)
            hlen = int.from_bytes(f.read(2 if version[0] == 1 else 4), "little")
            header = ast.literal_eval(f.read(hlen).decode("latin1"))
            if str(header.get("descr")) not in ("<f1", "|f1", "f1") or header.get("fortran_order"):
                return None
            return np.frombuffer(f.read(), dtype=np.uint8).reshape(header["shape"]).copy()
    except (KeyError, OSError, ValueError, SyntaxError, zipfile.BadZipFile):
        return None


def _kind(dtype) -> str:
    """"float", "integer" or "bool" (or the numpy kind letter) of a dtype, for the input-data check."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "bool"
    if dtype.kind in "iu":
        return "integer"
    if dtype.kind == "f" or dtype.type.__module__.startswith("ml_dtypes"):
        return "float" if dtype.kind == "f" or "float" in dtype.name else "integer"
    return dtype.kind


def _fits(shape: tuple, model_shape: tuple) -> bool:
    """True when an array shape matches a model shape (None dims match anything)."""
    return len(shape) == len(model_shape) and all(m is None or m == d for d, m in zip(shape, model_shape))


def _input_data_to_bf16(a: "np.ndarray", name: str, path) -> "np.ndarray":  # noqa: F821
    """A user's array for a bfloat16 input as ml_dtypes.bfloat16 (see :func:`load_input_data`)."""
    if a.dtype.name == "bfloat16":
        return a
    if a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.fields is None:
        return a.view(ml_dtypes.bfloat16)
    if np.issubdtype(a.dtype, np.floating):
        return round_to_bf16(a)
    raise ModelError(f"input data {path}: {name!r} has dtype {a.dtype}, but the model input is bfloat16 "
                     f"(--auto-convert-bf16); give float values (float32/float64/float16 or ml_dtypes.bfloat16), "
                     f"they are rounded to bfloat16")
