"""Calibration samples for static quantization: random (seeded, the original tool's
defaults) or read from a user ``.npz`` file, checked against the model's inputs.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.lazy import helper, np, zipfile
from ..inputs import make_inputs
from .folding import _infer
from .ort_quantization import QuantizationError, _one_line


#: Calibration defaults of the original tool (docs/original_tool.md, 'Quantization').
DEFAULT_CALIBRATION_SAMPLES = 20
DEFAULT_CALIBRATION_SEED = 0
DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
#: Random integer inputs that are not indices are drawn uniformly from ``[0, 10)``
#: (small non-negative values); index inputs (Gather/GatherElements/GatherND/Scatter*
#: indices read straight from a graph input) are drawn in ``[0, dim)`` of the indexed
#: axis, as the layers' test inputs (:func:`torq_gen_config.inputs.generate.make_inputs`).
INT_INPUT_RANGE = (0, 10)


def _input_specs(model) -> list[tuple[str, "np.dtype", list]]:  # noqa: F821
    """(name, numpy dtype, shape with None for unknown dims) of each real graph input."""
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

    Random (``data_path`` None; the original tool's 20 samples, seed 0,
    uniform [-1, 1)): ``n`` samples, seeded and deterministic. Float inputs are drawn
    from ``numpy.random.default_rng(seed)`` uniform in ``[low, high)`` of
    ``float_range`` (cast to the input's float dtype). Non-float inputs are drawn as
    the layers' test inputs (:func:`torq_gen_config.inputs.generate.make_inputs`, seed
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
    if dt is None:
        return True
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.name == "bfloat16"


def _random_samples(model, specs, n: int, seed: int, float_range_of) -> list[dict]:
    """``n`` random feed dicts: float inputs from ``default_rng(seed)`` uniform in
    ``float_range_of(name)``; the other inputs from :func:`torq_gen_config.inputs.generate.make_inputs`
    (bounded index inputs, other integers in :data:`INT_INPUT_RANGE`, booleans), seeded
    per sample with ``(seed, sample index)``."""
    others = [name for name, dtype, _ in specs if not _is_float_dtype(dtype)]
    for name, dtype, _ in specs:
        if name in others and np.dtype(dtype).kind not in "iub":
            raise QuantizationError(f"cannot generate calibration data for input {name!r} of dtype {np.dtype(dtype)}")
    extra: list[dict] = [{} for _ in range(n)]
    if others:
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
    shp = [1 if d is None else d for d in shape]
    dt = np.dtype(dtype if dtype is not None else np.float32)
    if _is_float_dtype(dt):
        return rng.uniform(lo, hi, size=shp).astype(dt)
    if dt.kind in "iu":
        return rng.integers(INT_INPUT_RANGE[0], INT_INPUT_RANGE[1], size=shp).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shp).astype(bool)
    raise QuantizationError(f"cannot generate calibration data for an input of dtype {dt}")


def _layer_samples(model, ranges: dict, n: int, seed: int) -> list[dict]:
    """Random samples: float inputs uniform in their range from ``ranges`` (else
    [-1, 1)), other inputs as in :func:`calibration_samples` (index inputs bounded by
    the indexed axis, other integers in :data:`INT_INPUT_RANGE`)."""
    return _random_samples(model, _input_specs(model), n, seed, lambda name: ranges.get(name, DEFAULT_FLOAT_RANGE))


def _check_finite_samples(samples: list[dict]) -> None:
    """QuantizationError if a float array of a calibration sample holds NaN or inf."""
    for k, s in enumerate(samples):
        for name, a in s.items():
            a = np.asarray(a)
            if _is_float_dtype(a.dtype) and a.size and not np.all(np.isfinite(a)):
                raise QuantizationError(f"calibration sample {k}: input {name!r} holds non-finite values (NaN or inf); "
                                        f"calibration data must be finite")
