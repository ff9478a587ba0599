"""Rules for inputs an op reads as indices, lengths, trip counts or conditions (Gather*,
Scatter*, OneHot, MaxUnpool, sequence lengths, Loop, Compress)."""

from __future__ import annotations

import math
from typing import Callable

from ...core.lazy import np
from ..site import InputSite
from ..tensor_types import _known
from .helpers import _SPEC, _axis, _spatial_out


def _indices_along_axis(data_formal: str, spec_op: str, *, unique_if_no_reduction: bool = False):
    def rule(site: InputSite):
        data = site.shape_of(data_formal)
        if data is None or not data:
            return None
        axis = _axis(site, len(data))
        if axis is None or data[axis] is None or data[axis] <= 0:
            return None
        d = data[axis]
        if unique_if_no_reduction and site.attr("reduction", "none") == "none" and site.shape \
                and len(site.shape) == len(data) and site.shape[axis] <= d:
            # distinct indices along the axis: the spec leaves duplicates undefined without reduction
            full = list(site.shape)
            full[axis] = d
            order = np.argsort(site.rng.random(full), axis=axis)
            return np.take(order, np.arange(site.shape[axis]), axis=axis)
        return site.ints(0, d)

    rule.__doc__ = (f"{spec_op} ``indices``: in [0, s) with s = ``{data_formal}``.shape[axis]"
                    + ("; distinct along the axis when ``reduction`` is none (duplicates are undefined)"
                       if unique_if_no_reduction else "")
                    + f". Spec: {_SPEC.format(spec_op)} (\"All index values are expected to be within bounds"
                      f" [-s, s-1]\")")
    return rule


def _gathernd_indices(unique: bool, spec_op: str):
    def rule(site: InputSite):
        data = site.shape_of("data")
        if data is None or not site.shape:
            return None
        b = int(site.attr("batch_dims", 0))
        k = site.shape[-1]
        bounds = data[b:b + k]
        if len(bounds) != k or any(d is None or d <= 0 for d in bounds):
            return None
        m = site.size // k if k else 0
        space = math.prod(bounds)
        if unique and site.attr("reduction", "none") == "none" and m <= space:
            flat = site.rng.choice(space, size=m, replace=False)
            return np.stack(np.unravel_index(flat, bounds), axis=-1).reshape(site.shape)
        cols = [site.rng.integers(0, d, size=site.shape[:-1]) for d in bounds]
        return np.stack(cols, axis=-1).reshape(site.shape)

    rule.__doc__ = (f"{spec_op} ``indices`` (last dim k): column i in [0, data.shape[batch_dims + i])"
                    + ("; distinct index tuples when ``reduction`` is none" if unique else "")
                    + f". Spec: {_SPEC.format(spec_op)}")
    return rule


def _bounded_by(formal: str, dim: int, spec_op: str, what: str, spec_url: str | None = None):
    def rule(site: InputSite):
        s = site.shape_of(formal)
        if s is None or len(s) < (dim + 1 if dim >= 0 else -dim) or not s[dim]:
            return None
        return site.ints(0, s[dim])

    rule.__doc__ = (f"{spec_op} ``{what}``: in [0, {formal}.shape[{dim}]). "
                    f"Spec: {spec_url or _SPEC.format(spec_op)}")
    return rule


def _onehot_depth(site: InputSite):
    """OneHot ``depth``: the declared output's size on ``axis`` (else in [2, 10]); positive.
    Spec: https://onnx.ai/onnx/operators/onnx__OneHot.html (output rank = rank(indices) + 1,
    the new axis of size depth)."""
    ind = site.shape_of("indices")
    out = site.out_shape(0)
    if ind is not None and out is not None and len(out) == len(ind) + 1:
        a = int(site.attr("axis", -1))
        a = a + len(out) if a < 0 else a
        if 0 <= a < len(out) and out[a]:
            return [out[a]]
    return [int(site.rng.integers(2, 11))]


def _onehot_indices(site: InputSite):
    """OneHot ``indices``: in [0, depth). Spec: https://onnx.ai/onnx/operators/onnx__OneHot.html
    "values in indices ... outside the range [-depth, depth-1] result in one-hot
    representation with all 'off_value' values"."""
    depth = site.value_of("depth")
    if depth is None or int(depth.reshape(-1)[0]) <= 0:
        return None
    return site.rng.integers(0, int(depth.reshape(-1)[0]), size=site.shape)


def _tensorscatter_indices(site: InputSite):
    """TensorScatter ``write_indices`` [batch]: in [0, max_seq - seq] (mode linear) or [0,
    max_seq) (circular), with max_seq / seq the cache's / update's size on ``axis``.
    Spec: https://onnx.ai/onnx/operators/onnx__TensorScatter.html."""
    cache, upd = site.shape_of("past_cache"), site.shape_of("update")
    if cache is None or upd is None or len(cache) != len(upd):
        return None
    a = int(site.attr("axis", -2))
    a = a + len(cache) if a < 0 else a
    if not 0 <= a < len(cache) or cache[a] is None or upd[a] is None:
        return None
    hi = cache[a] if site.attr("mode", "linear") == "circular" else cache[a] - upd[a] + 1
    return site.ints(0, hi) if hi > 0 else None


def _maxunpool_indices(site: InputSite):
    """MaxUnpool ``I``: flat indices into the output (N, C, *out spatial) as MaxPool's
    ``Indices`` output: each element's index in its own (n, c) plane, distinct within a
    plane when the plane has room. Spec: https://onnx.ai/onnx/operators/onnx__MaxUnpool.html."""
    x = site.shape_of("X")
    if not _known(x) or len(x) < 3 or tuple(site.shape) != tuple(x):
        return None
    out = site.out_shape(0)
    if not _known(out) or len(out) != len(x):
        shp = site.value_of("output_shape")
        out = tuple(int(v) for v in shp.reshape(-1)) if shp is not None else (*x[:2], *_spatial_out(x[2:], site))
    plane_out, plane_in = math.prod(out[2:]), math.prod(x[2:])
    if plane_out <= 0:
        return None
    planes = x[0] * x[1]
    rows = []
    for p in range(planes):
        pos = site.rng.choice(plane_out, size=plane_in, replace=plane_in > plane_out)
        rows.append(p * plane_out + pos)
    return np.asarray(rows).reshape(x)


def _maxunpool_output_shape(site: InputSite):
    """MaxUnpool ``output_shape``: the declared output shape, else (N, C, (in-1)*stride +
    kernel - pads). Spec: https://onnx.ai/onnx/operators/onnx__MaxUnpool.html."""
    out = site.out_shape(0)
    if _known(out) and len(out) == site.size:
        return list(out)
    x = site.shape_of("X")
    if not _known(x):
        return None
    return [*x[:2], *_spatial_out(x[2:], site)]


def _seq_lens(time_dim: Callable[[InputSite], int | None], spec_op: str):
    def rule(site: InputSite):
        t = time_dim(site)
        return None if not t or t <= 0 else site.ints(1, t + 1)

    rule.__doc__ = f"{spec_op} ``sequence_lens``: in [1, sequence length]. Spec: {_SPEC.format(spec_op)}"
    return rule


def _rnn_time(site: InputSite):
    x = site.shape_of("X")
    if x is None or len(x) < 2:
        return None
    return x[1] if int(site.attr("layout", 0)) else x[0]


def _revseq_time(site: InputSite):
    x = site.shape_of("input")
    t = int(site.attr("time_axis", 0))
    return None if x is None or t >= len(x) else x[t]


def _attention_kv_len(site: InputSite):
    """Attention ``nonpad_kv_seqlen`` [batch]: in [1, total kv length] (K's sequence dim plus
    past_key's). Spec: https://onnx.ai/onnx/operators/onnx__Attention.html."""
    k = site.shape_of("K")
    if k is None or len(k) not in (3, 4):
        return None
    total = k[2] if len(k) == 4 else k[1]
    past = site.shape_of("past_key")
    if past is not None and len(past) == 4 and past[2] is not None:
        total = (total or 0) + past[2]
    return None if not total else site.ints(1, total + 1)


def _loop_trip_count(site: InputSite):
    """Loop ``M`` (trip count): the declared first dim of a scan output (the iterations),
    else in [1, 5]. Spec: https://onnx.ai/onnx/operators/onnx__Loop.html."""
    n_carried = max(len(site.node.input) - 2, 0)
    for i in range(n_carried, len(site.node.output)):
        s = site.out_shape(i)
        if s and s[0] is not None:
            return [s[0]]
    return [int(site.rng.integers(1, 6))]


def _true(site: InputSite):
    """Loop ``cond``: True (a False start runs no iteration, against declared scan shapes).
    Spec: https://onnx.ai/onnx/operators/onnx__Loop.html."""
    return np.ones(site.shape, dtype=bool)


def _false(site: InputSite):
    """Dropout ``training_mode``: False (inference: the output is deterministic; in training
    mode it is a random mask). Spec: https://onnx.ai/onnx/operators/onnx__Dropout.html."""
    return np.zeros(site.shape, dtype=bool)


def _compress_condition(site: InputSite):
    """Compress ``condition`` (1-D bool): as many True values (among the first
    min(len, dim) entries) as the declared output has on ``axis`` (flattened input without
    ``axis``). Spec: https://onnx.ai/onnx/operators/onnx__Compress.html."""
    data = site.shape_of("input")
    out = site.out_shape(0)
    if data is None or len(site.shape) != 1:
        return None
    ax = site.attr("axis")
    if ax is None:
        dim, k = (math.prod(data) if _known(data) else None), (out[0] if out and len(out) == 1 else None)
    else:
        ax = ax + len(data) if ax < 0 else ax
        dim = data[ax] if 0 <= ax < len(data) else None
        k = out[ax] if out is not None and len(out) == len(data) else None
    if dim is None:
        return None
    room = min(site.size, dim)
    if k is None:
        k = int(site.rng.integers(0, room + 1))
    if k > room:
        return None
    cond = np.zeros(site.size, dtype=bool)
    cond[site.rng.choice(room, size=k, replace=False)] = True
    return cond

