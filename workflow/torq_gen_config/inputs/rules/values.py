"""Rules for inputs whose values (not their shape) an op constrains: strings, distinct or
non-zero elements, divisors, shift amounts, bounds, scales, variances, RoIs."""

from __future__ import annotations

import math

from ...core.lazy import np
from ..site import InputSite
from ..tensor_types import _is_float, _is_int, _known
from .helpers import _SPEC


def _words(rng, n: int, avoid: str = "") -> list[str]:
    """``n`` short lowercase words (1 to 5 letters) without the characters of ``avoid``."""
    letters = [c for c in "abcdefghijklmnopqrstuvwxyz" if c not in avoid] or ["a"]
    return ["".join(letters[int(i)] for i in rng.integers(0, len(letters), size=int(rng.integers(1, 6))))
            for _ in range(n)]


def _string_split_input(site: InputSite):
    """StringSplit ``X``: strings of k non-empty words joined by ``delimiter`` (a space
    when it is empty or absent: whitespace splitting), k = the declared substrings
    output's last dim (<= maxsplit + 1), so the output has the declared shape. Spec:
    https://onnx.ai/onnx/operators/onnx__StringSplit.html."""
    out = site.out_shape(0)
    if out is None or len(out) != len(site.shape) + 1 or not out[-1]:
        return None
    k = out[-1]
    maxsplit = site.attr("maxsplit")
    if maxsplit is not None and k > int(maxsplit) + 1:
        return None
    delim = site.attr("delimiter", "") or " "
    return np.array([delim.join(_words(site.rng, k, delim)) for _ in range(site.size)], dtype=object)


def _string_normalizer_input(site: InputSite):
    """StringNormalizer ``X``: short words, of which in - out (the declared output's count)
    are ``stopwords`` (removed by the op) and the others are not. Spec:
    https://onnx.ai/onnx/operators/onnx__StringNormalizer.html."""
    stop = [w.decode() if isinstance(w, bytes) else w for w in (site.attr("stopwords") or [])]
    out = site.out_shape(0)
    if out is None or len(out) != len(site.shape) or out[-1] is None:
        return None
    n_drop = site.shape[-1] - out[-1]
    if n_drop < 0 or (n_drop and not stop) or site.size != site.shape[-1]:
        return None
    fold = (lambda w: w) if int(site.attr("is_case_sensitive", 0)) else str.lower
    stopset = {fold(w) for w in stop}
    words = [w for w in _words(site.rng, 4 * site.size) if fold(w) not in stopset][:site.size]
    if len(words) < site.size:
        return None
    for i in site.rng.choice(site.size, size=n_drop, replace=False):
        words[int(i)] = stop[int(site.rng.integers(0, len(stop)))]
    return np.array(words, dtype=object)


def _unique_input(site: InputSite):
    """Unique ``X``: exactly k distinct values (or slices along ``axis``), k = the declared
    ``Y``'s length there, each present at least once. Spec:
    https://onnx.ai/onnx/operators/onnx__Unique.html."""
    out = site.out_shape(0)
    axis = site.attr("axis")
    if out is None:
        return None
    if axis is None:
        if len(out) != 1 or out[0] is None or not 0 < out[0] <= site.size:
            return None
        k, n, slice_shape, ax = out[0], site.size, (), 0
    else:
        r = len(site.shape)
        ax = axis + r if axis < 0 else axis
        if not 0 <= ax < r or len(out) != r or out[ax] is None or not 0 < out[ax] <= site.shape[ax]:
            return None
        k, n = out[ax], site.shape[ax]
        slice_shape = tuple(d for i, d in enumerate(site.shape) if i != ax)
    if _is_int(site.dtype):
        lo, hi = site.data_range()
        if hi - lo < k:
            return None
        room = hi - lo < k * max(1, math.prod(slice_shape))
        pool = site.rng.choice(np.arange(lo, hi), size=(k, *slice_shape), replace=room)
    else:  # multiples of 1/8: exact in bfloat16/float16
        pool = site.rng.choice(np.arange(-4 * k, 4 * k), size=(k, *slice_shape), replace=bool(slice_shape)) / 8.0
    pool = np.asarray(pool).astype(np.float32 if not _is_int(site.dtype) else np.int64).astype(site.dtype)
    if len({p.tobytes() for p in pool}) != k:
        return None
    pick = np.concatenate([np.arange(k), site.rng.integers(0, k, size=n - k)])
    vals = pool[site.rng.permutation(pick)]
    return vals.reshape(site.shape) if axis is None else np.moveaxis(vals, 0, ax)


def _nonzero_input(site: InputSite):
    """NonZero ``X``: exactly k non-zero elements, k = the declared output's dim 1 (the
    count of non-zero elements), the others zero. Spec:
    https://onnx.ai/onnx/operators/onnx__NonZero.html."""
    out = site.out_shape(0)
    if out is None or len(out) != 2 or out[1] is None or out[1] > site.size:
        return None
    v = site.data()
    if v.dtype == np.bool_:
        v = np.ones(site.shape, dtype=bool)
    elif _is_int(v.dtype):
        v = np.where(v.astype(np.int64) == 0, 1, v).astype(v.dtype)
    else:
        v = np.where(v.astype(np.float32) == 0, np.float32(0.5), v.astype(np.float32)).astype(v.dtype)
    keep = np.zeros(site.size, dtype=bool)
    keep[site.rng.choice(site.size, size=out[1], replace=False)] = True
    return np.where(keep.reshape(site.shape), v, np.zeros((), dtype=v.dtype))


def _unit_interval(spec_op: str, what: str):
    def rule(site: InputSite):
        return site.uniform(0.0, 1.0)

    rule.__doc__ = f"{spec_op} ``{what}``: in [0, 1). Spec: {_SPEC.format(spec_op)}"
    return rule


def _dropout_ratio(site: InputSite):
    """Dropout ``ratio``: in [0, 0.5) (the spec's [0, 1)). Spec:
    https://onnx.ai/onnx/operators/onnx__Dropout.html."""
    return site.uniform(0.0, 0.5)


def _nonzero_divisor(spec_op: str):
    def rule(site: InputSite):
        if not _is_int(site.dtype):
            return None
        v = site.data()
        lo, hi = site.data_range()
        fill = 1 if hi > 1 else (-1 if lo < 0 else None)
        if fill is None:
            return None
        return np.where(v.astype(np.int64) == 0, fill, v).astype(site.dtype)

    rule.__doc__ = (f"{spec_op} ``B`` of an integer type: the plain values with zeros replaced by 1 "
                    f"(integer division by zero is undefined). Spec: {_SPEC.format(spec_op)}")
    return rule


def _bitshift_amount(site: InputSite):
    """BitShift ``Y``: in [0, bit width) (wider shifts are undefined in C and differ
    between executors). Spec: https://onnx.ai/onnx/operators/onnx__BitShift.html."""
    return site.ints(0, 8 * site.dtype.itemsize)


def _int_exponent(site: InputSite):
    """Pow ``Y`` of an integer type: in [0, 4) (negative integer powers and overflow are
    not defined by the spec). Spec: https://onnx.ai/onnx/operators/onnx__Pow.html."""
    return site.ints(0, 4) if _is_int(site.dtype) else None


def _clip_bound(upper: bool):
    def rule(site: InputSite):
        lo, hi = site.data_range()
        mid = (lo + hi) / 2
        if _is_int(site.dtype):
            m = int(math.floor(mid))
            return site.ints(m, hi) if upper else site.ints(lo, max(m, lo + 1))
        return site.uniform(mid, hi) if upper else site.uniform(lo, mid)

    rule.__doc__ = (f"Clip ``{'max' if upper else 'min'}``: in the {'upper' if upper else 'lower'} half of the "
                    f"data range, so that min <= max. Spec: {_SPEC.format('Clip')}")
    return rule


def _positive_scale(spec_op: str, what: str):
    def rule(site: InputSite):
        return site.uniform(0.005, 0.05) if _is_float(site.dtype) else None

    rule.__doc__ = (f"{spec_op} ``{what}``: positive, in [0.005, 0.05) (a quantization step for data "
                    f"in the float range). Spec: {_SPEC.format(spec_op)}")
    return rule


def _variance(site: InputSite):
    """BatchNormalization ``input_var``: non-negative, in [0, high) of the float range
    (a variance). Spec: https://onnx.ai/onnx/operators/onnx__BatchNormalization.html."""
    lo, hi = site.data_range()
    return site.uniform(0.0, max(hi, 1e-3))


def _roi_align_rois(site: InputSite):
    """RoiAlign ``rois`` [num_rois, 4]: [x1, y1, x2, y2] inside the feature map in input
    coordinates (x1 <= x2 < W / spatial_scale). Spec:
    https://onnx.ai/onnx/operators/onnx__RoiAlign.html."""
    x = site.shape_of("X")
    if not _known(x) or len(x) != 4 or len(site.shape) != 2 or site.shape[1] != 4:
        return None
    scale = float(site.attr("spatial_scale", 1.0)) or 1.0
    h, w = x[2] / scale, x[3] / scale
    n = site.shape[0]
    x1, y1 = site.rng.uniform(0, w * 0.5, size=n), site.rng.uniform(0, h * 0.5, size=n)
    x2, y2 = x1 + site.rng.uniform(0, w * 0.5, size=n), y1 + site.rng.uniform(0, h * 0.5, size=n)
    return np.stack([x1, y1, x2, y2], axis=1)

