"""Layer references: each layer's inputs and its outputs on both reference engines.

Inputs are the values the layer receives in the whole-model reference run
(:func:`propagate_layer_inputs`, ``--layer-inputs propagate``, the default), else
op-aware generated values (:func:`make_inputs`, :mod:`torq_gen_config.input_generation`:
axes, shapes, indices, ... are valid for their op; docs/inputs.md). References come
from ONNX Runtime CPU with all graph optimizations disabled and from onnx's reference
implementation (:mod:`torq_gen_config.reference_run`); the configured one is what the
verdicts are computed against (docs/comparison.md, "References").

The reference file (``reference.npz``) holds ``input_<i>``, ``output_<i>`` (the
configured engine's outputs), ``second_output_<i>`` (the other engine's) and
``__meta__`` (a JSON string: names, both engines' status, message and version, how
the inputs were made, the engines' agreement metrics).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .reference_run import has_bfloat16  # noqa: F401 (re-exported: its old place)

#: Time limit of an engine when the caller gives none (the config's default ``timeout_s``), seconds.
DEFAULT_TIMEOUT_S = 300.0
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
                      input_ranges: dict[str, list[float]] | None = None, engine: str = "onnxruntime",
                      timeout_s: float | None = None, inputs: dict | None = None, inputs_source: str | None = None,
                      second_opinion: bool = True) -> dict:
    """A layer's inputs and its outputs on both reference engines, stored in one file.

    Inputs: with ``inputs_path`` (``--layer-inputs propagate``, the default) the
    values the layer receives in the whole-model run (:func:`propagate_layer_inputs`),
    checked against the layer's declared inputs (names, dtypes, shapes); where that
    run could not produce them, or they do not match, generated values
    (:func:`make_inputs`; ``input_ranges`` as there), and ``meta["layer_inputs"]``
    says so and why. ``inputs`` (name -> array, described by ``inputs_source``) are
    used as given. Otherwise: generated values.

    Outputs: ``engine`` (``onnxruntime`` or ``onnx``, :mod:`torq_gen_config.reference_run`)
    gives the reference the verdicts are computed against (``output_<i>``); the other
    engine gives the second opinion (``second_output_<i>``, ``meta["second"]``;
    ``second_opinion=False`` skips it, e.g. for a whole model). When
    both ran, ``meta["engines_agreement"]`` holds the metrics of ONNX Runtime's
    outputs against the ONNX reference implementation's (:func:`~torq_gen_config.compare.compare_outputs`),
    from which the report derives a reference dispute for any tolerance.

    A layer with bfloat16 tensors (``--auto-convert-bf16``) gets its references from
    the same layer widened to float32, run on the bf16 inputs, with the bf16 outputs
    rounded to bf16 (round to nearest even): ONNX Runtime CPU has no bf16 kernels for
    most ops (notes/toolchain.md section 5; docs/precision.md).
    ``meta["reference_precision"]`` says which was used.

    A failing engine (it refuses the model, fails on the inputs, or exceeds
    ``timeout_s`` seconds) is recorded, not raised: the file then holds the inputs and
    that engine's ``status: error`` (or ``timeout``) and message; the executors still
    run (with a failed primary reference their results are "unverified").

    Returns:
        The metadata dict stored as ``__meta__`` (``status``, ``message``, ``engine``,
        ``engine_version``, ``ort_version``, ``input_names``, ``output_names``,
        ``run_ms``, ``layer_inputs``, ``second``, ``engines_agreement``).
    """
    import time

    import numpy as np
    import onnx

    from .compare import compare_on_model
    from .isolation import WorkerCrash, WorkerTimeout, run_isolated_each
    from .limits import call_limit
    from .reference_run import ENGINES, ReferenceTimeout, engine_label, engine_version, run_reference_file

    if engine not in ENGINES:
        raise ValueError(f"unknown reference engine {engine!r}; expected one of {ENGINES}")
    layer = onnx.load(str(layer_path))
    how = "random"
    if inputs is not None:
        how = inputs_source or "given"
    elif inputs_path is not None:
        inputs, how = _propagated_inputs(inputs_path, layer)
    output_names = [o.name for o in layer.graph.output]
    if inputs is None:
        try:
            inputs = make_inputs(layer, settings, input_ranges)
        except Exception as e:  # e.g. an input without a static shape: no values, no reference
            message = f"cannot make the layer's inputs: {type(e).__name__}: {str(e)[:1000]}"
            meta = {"status": "error", "message": message, "engine": engine, "engine_version": None,
                    "ort_version": engine_version("onnxruntime"), "input_names": [], "output_names": output_names,
                    "settings": {**DEFAULT_INPUT_SETTINGS, **(settings or {})}, "run_ms": None,
                    "layer_inputs": f"none ({message})", "inputs_missing": True,
                    "second": {"engine": next(x for x in ENGINES if x != engine), "status": "not run",
                               "message": None, "run_ms": None}, "engines_agreement": None}
            save_npz(out_path, {}, meta)
            return meta
    bf16 = has_bfloat16(layer)

    second_engine = next(e for e in ENGINES if e != engine)
    engines = [engine, second_engine] if second_opinion else [engine]
    limit = call_limit(timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S)
    # both engines in one supervised worker, each bounded on its own (a hang or crash
    # of one stops that worker: its status is then "timeout" or "crash")
    outcomes = run_isolated_each(
        [(run_reference_file, (str(layer_path), inputs, output_names, eng, timeout_s, intra_op_num_threads), {})
         for eng in engines],
        limit_s=limit, what=[f"{engine_label(eng)} on the layer" for eng in engines])

    def engine_result(eng: str, outcome) -> tuple[dict, list]:
        info: dict[str, Any] = {"engine": eng, "engine_version": engine_version(eng), "status": "ok",
                                "message": None, "run_ms": None}
        if not isinstance(outcome, BaseException):
            outs, run_ms = outcome
            info["run_ms"] = round(run_ms, 3)
            return info, outs
        if isinstance(outcome, (ReferenceTimeout, WorkerTimeout)):
            info["status"] = "timeout"
        elif isinstance(outcome, WorkerCrash):
            info["status"] = "crash"
        else:  # each engine raises its own exception types
            info["status"] = "error"
        info["message"] = f"{engine_label(eng)} failed on the layer: {str(outcome).strip()[:2000]}"
        return info, []

    primary, outputs = engine_result(engine, outcomes[0])
    if second_opinion:
        second, second_outputs = engine_result(second_engine, outcomes[1])
    else:
        second, second_outputs = {"engine": second_engine, "status": "not run", "message": None, "run_ms": None}, []
    meta: dict[str, Any] = {
        "status": "ok" if primary["status"] == "ok" else "error", "message": primary["message"],
        "engine": engine, "engine_version": primary["engine_version"], "ort_version": engine_version("onnxruntime"),
        "graph_optimization_level": "disabled", "input_names": list(inputs), "output_names": output_names,
        "settings": {**DEFAULT_INPUT_SETTINGS, **(settings or {})}, "run_ms": primary["run_ms"],
        "layer_inputs": how,
        "reference_precision": "fp32 on bf16 values, outputs rounded to bf16" if bf16 else "as the model",
        "second": second, "engines_agreement": None,
    }
    if primary["status"] == "timeout":
        meta["timed_out"] = True
    if outputs and second_outputs:
        ort_outs, spec_outs = (outputs, second_outputs) if engine == "onnxruntime" else (second_outputs, outputs)
        try:
            meta["engines_agreement"] = compare_on_model(layer, dict(zip(output_names, ort_outs)),
                                                         dict(zip(output_names, spec_outs)), output_names)
        except Exception as e:  # a non-numeric output: no agreement check
            meta["engines_agreement_error"] = f"{type(e).__name__}: {e}"[:500]
    arrays = {f"input_{i}": a for i, a in enumerate(inputs.values())}
    arrays.update({f"output_{i}": np.asarray(a) for i, a in enumerate(outputs)})
    arrays.update({f"second_output_{i}": np.asarray(a) for i, a in enumerate(second_outputs)})
    save_npz(out_path, arrays, meta)
    return meta


def _propagated_inputs(path: str | os.PathLike, layer) -> tuple[dict | None, str]:
    """A layer's inputs from its ``inputs.npz`` if they fit its declared inputs, else
    ``(None, "generated: <why>")``."""
    import numpy as np

    from .ort_io import numpy_dtype

    try:
        arrays, meta = load_layer_inputs(path, layer)
    except Exception as e:  # unreadable file: generate, and say so
        return None, f"generated (the whole-model run's inputs.npz could not be read: {str(e)[:200]})"
    if meta.get("fallback"):
        return None, f"generated ({meta['fallback']})"
    for vi in layer.graph.input:
        tt = vi.type.tensor_type
        a = arrays.get(vi.name)
        if a is None:
            return None, f"generated (the whole-model run gave no value for input {vi.name!r})"
        want = [d.dim_value for d in tt.shape.dim]
        try:
            dtype = numpy_dtype(tt.elem_type)
        except Exception:
            dtype = None
        if dtype == np.dtype(object) and a.dtype.kind in "USO":  # strings are stored as unicode arrays
            arrays[vi.name] = a = a.astype(object)
        if list(a.shape) != want or (dtype is not None and a.dtype != dtype):
            return None, (f"generated (input {vi.name!r} is {a.dtype}{list(a.shape)} in the whole-model run, the "
                          f"layer declares {getattr(dtype, 'name', tt.elem_type)}{want})")
    return arrays, f"propagate ({meta.get('source') or 'whole-model run'})"


def reference_outputs(model: "onnx.ModelProto", feeds: dict, output_names: list[str], *,  # noqa: F821
                      intra_op_num_threads: int | None = None, model_path: str | os.PathLike | None = None,
                      timeout_s: float | None = None) -> list:
    """Run ``model`` in ONNX Runtime CPU with graph optimizations off (the reference
    engine) and return ``output_names``' arrays; bfloat16 models widened as
    :func:`torq_gen_config.reference_run.run_reference` describes.

    Args:
        feeds: input name -> array (bf16 arrays as ml_dtypes.bfloat16).
        model_path: the model's file, if any (ONNX Runtime loads it from there).
        timeout_s: wall-clock limit in seconds (None: none).

    Raises:
        Exception: whatever ONNX Runtime raises (callers record it).
    """
    from .reference_run import run_reference

    return run_reference(model, feeds, output_names, engine="onnxruntime", timeout_s=timeout_s,
                         model_path=model_path, intra_op_num_threads=intra_op_num_threads)


def open_input_data(path: str | os.PathLike):
    """Open an ``--input-data`` file (``.npz``, arrays by input name) without unpickling.

    Returns:
        The ``numpy.lib.npyio.NpzFile`` (a context manager).

    Raises:
        ModelError: the file is missing or unreadable, or it is not an ``.npz`` archive
            (a single ``.npy`` array has no input names).
    """
    import zipfile

    import numpy as np

    from .errors import ModelError

    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as e:
        raise ModelError(f"cannot read input data {path}: {e.strerror or e}") from None
    if not is_zip:
        raise ModelError(f"input data {path} is not an .npz archive (write one with numpy.savez(path, "
                         "<input name>=array, ...))")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ModelError(f"cannot read input data {path}: {e}") from None


def load_input_data(path: str | os.PathLike, model: "onnx.ModelProto",  # noqa: F821
                    notes: list[str] | None = None) -> dict[str, "np.ndarray"]:  # noqa: F821
    """Model inputs from a user's ``.npz`` (``--input-data``), keyed by input name.

    An array may carry one extra leading sample dimension (``N`` samples of the
    input's shape); the first sample is used.

    A bfloat16 model input (``--auto-convert-bf16``) accepts float arrays (float16,
    float32, float64, or ml_dtypes.bfloat16), rounded to bfloat16 through float32
    (round to nearest even, as :func:`~torq_gen_config.precision.dtype_conversion.round_to_bf16`),
    and ``|V2`` arrays (what ``numpy.savez`` makes of an ml_dtypes.bfloat16 array),
    read as bfloat16 bit patterns.

    Zero-size dims are dims: an input of shape (2, 0, 4) takes a (2, 0, 4) array.
    Arrays are converted to the input's dtype within a kind (float64 -> float32,
    int32 -> int64; ``notes`` gets a line per conversion and per array the model does
    not take); string inputs take numpy unicode arrays.

    Raises:
        ModelError: unreadable file, a missing input name, a shape that matches
            neither the input's shape nor ``(N, *shape)``, a float array for an integer
            input (or the reverse), an object array, or a non-float array for a
            bfloat16 input.
    """
    import numpy as np
    from onnx import TensorProto, helper

    from .errors import ModelError

    data = open_input_data(path)
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
            dims = vi.type.tensor_type.shape.dim
            shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
            if len(a.shape) == len(shape) + 1 and _fits(a.shape[1:], shape):
                a = a[0]
            if not _fits(a.shape, shape):
                want = "x".join("?" if d is None else str(d) for d in shape) or "a scalar"
                raise ModelError(f"input data {path}: {vi.name!r} has shape {'x'.join(map(str, a.shape)) or 'scalar'}, "
                                 f"the model expects {want} (or N samples of it)")
            if vi.type.tensor_type.elem_type == TensorProto.BFLOAT16:
                feeds[vi.name] = _input_data_to_bf16(a, vi.name, path)
                continue
            from .ort_io import numpy_dtype

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
    import ast
    import zipfile

    import numpy as np

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
    import numpy as np

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


def load_layer_inputs(path: str | os.PathLike, layer: "onnx.ModelProto") -> tuple[dict, dict]:  # noqa: F821
    """A layer's inputs from ``<layer>/inputs.npz`` (:func:`propagate_layer_inputs`):
    ``(arrays by name, meta)``; ``meta["fallback"]`` is set (and ``arrays`` empty) when
    the whole-model run could not produce them.

    The file is written with :func:`save_npz` (bfloat16 arrays as uint16 bit patterns,
    listed in ``__meta__``); a file without ``__meta__`` (written by an older version,
    where ``numpy.savez`` stored bfloat16 as raw ``|V2``) is read too. Either way an
    input the layer declares BFLOAT16 comes back as ml_dtypes.bfloat16.
    """
    import ml_dtypes
    import numpy as np
    import onnx

    with np.load(Path(path), allow_pickle=False) as z:
        has_meta = "__meta__" in z.files
    if has_meta:
        arrays, meta = load_npz(path)
    else:
        with np.load(Path(path), allow_pickle=False) as z:
            arrays, meta = {k: z[k] for k in z.files}, {}
    for vi in layer.graph.input:
        a = arrays.get(vi.name)
        if a is None:
            continue
        if (vi.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 and a.dtype.name != "bfloat16"
                and a.dtype.itemsize == 2 and (a.dtype.kind == "V" or a.dtype == "uint16")):
            arrays[vi.name] = a.view(ml_dtypes.bfloat16)
    return arrays, meta


def propagate_layer_inputs(prepared_path: str | os.PathLike, manifest: dict, layers_dir: str | os.PathLike,
                           model_inputs: str | os.PathLike, *, timeout_s: float | None = None,
                           failed: str | None = None) -> dict:
    """The whole-model reference run, and each layer's inputs from it (``--layer-inputs
    propagate``, the default): every layer sees the values it gets in the model.

    The prepared model runs node by node (:func:`torq_gen_config.model_run.run_model_by_node`,
    bounded memory) on the model input values of ``model_inputs``
    (:mod:`torq_gen_config.model_inputs`). Each layer's ``<layers_dir>/<slug>/inputs.npz``
    is written with :func:`save_npz` as soon as its inputs exist (only when its arrays
    changed, so unchanged layers are not retested). A layer whose inputs the run could
    not produce (a node upstream that neither engine can evaluate) gets an
    ``inputs.npz`` without arrays whose ``__meta__["fallback"]`` says why; its reference
    job then generates its inputs (:func:`compute_reference`) and says so. ``failed``:
    the run is not done (it crashed or hung in an earlier attempt, this reason): every
    layer falls back so.

    Returns:
        JSON-safe ``{"model_inputs": source, "layers": N, "rewritten": M,
        "fallback": {slug: reason}, "run": run summary}`` (the summary has ``error``
        when ``failed``).

    Raises:
        ModelError: ``model_inputs`` lacks an input of the model.
    """
    import onnx

    from .model_inputs import load_model_inputs
    from .model_run import run_model_by_node, run_summary

    model = onnx.load(str(prepared_path))
    feeds, meta = load_model_inputs(model_inputs, model)
    source = f"whole-model run on {meta.get('source') or 'model inputs'}"
    layers = [layer for layer in manifest["layers"] if not layer.get("not_testable")]
    waiting: dict[str, list[str]] = {}
    need: dict[str, set[str]] = {}
    got: dict[str, dict] = {}
    order: dict[str, list[str]] = {}
    for layer in layers:
        names = [i["name"] for i in layer["inputs"]]
        order[layer["slug"]] = names
        need[layer["slug"]] = set(names)
        got[layer["slug"]] = {}
        for n in names:
            waiting.setdefault(n, []).append(layer["slug"])
    rewritten = 0

    def write(slug: str, arrays: dict, extra: dict) -> None:
        nonlocal rewritten
        path = Path(layers_dir) / slug / "inputs.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        if save_npz(path, arrays, {"kind": "layer_inputs", "layer": slug, **extra}, only_if_changed=True):
            rewritten += 1

    def on_value(name: str, value) -> None:
        for slug in waiting.get(name, ()):
            got[slug][name] = value
            if len(got[slug]) == len(need[slug]):
                arrays = got.pop(slug)
                if any(isinstance(a, list) for a in arrays.values()):
                    continue  # a sequence value: such layers are not testable (the split says so)
                write(slug, {n: arrays[n] for n in order[slug]}, {"source": source})

    for slug, names in order.items():  # layers without run-time inputs
        if not names:
            write(slug, {}, {"source": source})
            got.pop(slug)
    if failed:
        fallback = {slug: f"the whole-model run failed: {failed}" for slug in got}
        for slug, reason in fallback.items():
            write(slug, {}, {"fallback": reason})
        run = {"engines": [], "nodes_run": 0, "seconds": 0.0, "peak_live_bytes": 0, "fallback_nodes": [],
               "failed_nodes": [], "unavailable": {}, "num_unavailable": 0, "error": failed}
        return {"model_inputs": meta.get("source"), "layers": len(layers), "rewritten": rewritten,
                "fallback": fallback, "run": run}
    res = run_model_by_node(model, feeds, on_value=on_value, timeout_s=timeout_s)
    fallback = {}
    for slug, have in got.items():
        missing = [n for n in order[slug] if n not in have]
        why = res["unavailable"].get(missing[0]) if missing else None
        reason = (f"the whole-model run gave no value for input {missing[0]!r}: {why or 'not computed'}"
                  if missing else "the whole-model run gave a sequence value")
        fallback[slug] = reason
        write(slug, {}, {"fallback": reason})
    return {"model_inputs": meta.get("source"), "layers": len(layers), "rewritten": rewritten,
            "fallback": fallback, "run": run_summary(res)}


def save_npz(path: str | os.PathLike, arrays: dict[str, "np.ndarray"], meta: dict,  # noqa: F821
             *, only_if_changed: bool = False) -> bool:
    """Write arrays plus a JSON ``__meta__`` entry to an ``.npz`` atomically.

    Arrays of the ml_dtypes types (bfloat16, float8 variants, int4, ...), which
    ``numpy.savez`` would store as raw ``|V`` bytes, are stored as unsigned-integer
    views of their bits and listed in ``meta["ml_dtypes_keys"]`` (name -> dtype name;
    bfloat16 ones also in ``meta["bf16_keys"]``, read by older versions) so that
    :func:`load_npz` restores them; string arrays are stored as numpy unicode arrays
    (no pickle). The bytes are a function of the arrays and ``meta`` (``numpy.savez``
    writes fixed zip dates), so with ``only_if_changed`` an unchanged file keeps its
    mtime (nothing downstream reruns).

    Returns:
        True when the file was written.
    """
    import io

    import numpy as np

    from .fileio import atomic_write_bytes

    meta = dict(meta)
    special: dict[str, str] = {}
    store = {}
    for k, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.type.__module__.startswith("ml_dtypes"):  # bfloat16, float8_*, int4, ...
            special[k] = a.dtype.name
            a = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])
        elif a.dtype.kind == "O":  # strings (ONNX Runtime returns str objects)
            a = a.astype(str)
        store[k] = a
    meta["bf16_keys"] = [k for k, d in special.items() if d == "bfloat16"]
    meta["ml_dtypes_keys"] = special
    store["__meta__"] = np.array(json.dumps(meta))
    buf = io.BytesIO()
    np.savez(buf, **store)
    if only_if_changed:
        from .fileio import write_bytes_if_changed

        return write_bytes_if_changed(path, buf.getvalue())
    atomic_write_bytes(path, buf.getvalue())
    return True


def load_npz(path: str | os.PathLike) -> tuple[dict[str, "np.ndarray"], dict]:  # noqa: F821
    """Read a file written by :func:`save_npz`: ``(arrays, meta)``, ml_dtypes arrays
    restored (files written before ``ml_dtypes_keys`` existed: their ``bf16_keys``)."""
    import numpy as np

    with np.load(Path(path), allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"]))
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
    special = meta.get("ml_dtypes_keys") or {k: "bfloat16" for k in meta.get("bf16_keys") or []}
    if special:
        import ml_dtypes

        for k, name in special.items():
            arrays[k] = arrays[k].view(getattr(ml_dtypes, name))
    return arrays, meta


def load_reference(path: str | os.PathLike) -> tuple[dict, dict, dict]:
    """Read ``reference.npz``: ``(inputs by name, reference outputs by name, meta)``.

    Outputs are empty when the reference failed (``meta["status"] != "ok"``); the
    second engine's outputs are in ``meta["second_outputs"]`` (name -> array, empty
    when it failed or the file predates it).
    """
    arrays, meta = load_npz(path)
    inputs = {n: arrays[f"input_{i}"] for i, n in enumerate(meta["input_names"])}
    outputs = {n: arrays[f"output_{i}"] for i, n in enumerate(meta["output_names"]) if f"output_{i}" in arrays}
    meta["second_outputs"] = {n: arrays[f"second_output_{i}"] for i, n in enumerate(meta["output_names"])
                              if f"second_output_{i}" in arrays}
    return inputs, outputs, meta
