"""Rules for inputs an op reads as axes (Reduce*, Squeeze, Unsqueeze, CumSum, DFT, Pad)."""

from __future__ import annotations

from ..site import InputSite
from ..tensor_types import _match
from .helpers import _SPEC, _choose_axes, _signed


def _reduce_axes(site: InputSite):
    """Reduce* ``axes`` (opset 13/18+): distinct axes in [-r, r) of ``data``, chosen so that
    the reduction gives the declared output shape (``keepdims``).
    Spec: https://onnx.ai/onnx/operators/onnx__ReduceSum.html "Accepted range is [-r, r-1]"."""
    data = site.shape_of("data")
    if data is None:
        return None
    r, n = len(data), site.size
    keep = int(site.attr("keepdims", 1))
    out = site.out_shape(0)

    def ok(axes):
        exp = [1 if i in axes else d for i, d in enumerate(data)] if keep else \
            [d for i, d in enumerate(data) if i not in axes]
        return _match(exp, out) if all(d is not None for d in exp) else True

    axes = _choose_axes(site.rng, r, n, ok)
    return None if axes is None else _signed(site.rng, axes, r)


def _squeeze_axes(site: InputSite):
    """Squeeze ``axes`` (opset 13+): distinct axes of size-1 dims of ``data`` in [-r, r),
    matching the declared output. Spec: https://onnx.ai/onnx/operators/onnx__Squeeze.html
    "If an axis is selected with shape entry not equal to one, an error is raised"."""
    data = site.shape_of("data")
    if data is None:
        return None
    r = len(data)
    out = site.out_shape(0)

    def ok(axes):
        return all(data[i] == 1 for i in axes) and _match([d for i, d in enumerate(data) if i not in axes], out)

    axes = _choose_axes(site.rng, r, site.size, ok)
    return None if axes is None else _signed(site.rng, axes, r)


def _unsqueeze_axes(site: InputSite):
    """Unsqueeze ``axes`` (opset 13+): distinct axes in [-r', r') with r' = rank(data) +
    len(axes) (the output's rank), placing the new 1-dims where the declared output has
    them. Spec: https://onnx.ai/onnx/operators/onnx__Unsqueeze.html "Each value in axes
    should be within the (inclusive) range [-output_rank , output_rank - 1]"."""
    data = site.shape_of("data")
    if data is None:
        return None
    n = site.size
    r_out = len(data) + n
    out = site.out_shape(0)

    def ok(axes):
        it = iter(data)
        return _match([1 if j in axes else next(it) for j in range(r_out)], out)

    axes = _choose_axes(site.rng, r_out, n, ok)
    return None if axes is None else _signed(site.rng, axes, r_out)


def _single_axis(data_formal: str, spec_op: str):
    def rule(site: InputSite):
        data = site.shape_of(data_formal)
        if data is None or not data:
            return None
        r = len(data)
        a = int(site.rng.integers(0, r))
        return [a - r if site.rng.random() < 0.5 else a]

    rule.__doc__ = (f"{spec_op} ``axis`` input: one axis in [-r, r) of ``{data_formal}``. "
                    f"Spec: {_SPEC.format(spec_op)}")
    return rule


def _dft_axis(site: InputSite):
    """DFT ``axis`` (opset 20+): one signal axis in [0, r-2] (the last dim holds the
    real/imaginary parts), the one whose length the declared output changes when it
    changes one. Spec: https://onnx.ai/onnx/operators/onnx__DFT.html "Accepted range is
    [-r, -2] ∪ [0, r-2]"."""
    data = site.shape_of("input")
    if data is None or len(data) < 2:
        return None
    r = len(data)
    out = site.out_shape(0)
    cands = []
    for a in range(r - 1):
        if out is None or len(out) != r:
            cands.append(a)
        elif all(out[i] is None or out[i] == data[i] for i in range(r - 1) if i != a):
            cands.append(a)
    if not cands:
        return None
    changed = [a for a in cands if out is not None and len(out) == r and out[a] is not None and out[a] != data[a]]
    pool = changed or [a for a in cands if a != 0] or cands
    a = pool[int(site.rng.integers(0, len(pool)))]
    return [a]


def _pad_axes(site: InputSite):
    """Pad ``axes`` (opset 18+): distinct axes in [-r, r) including every axis whose
    declared output size differs from the input's. Spec:
    https://onnx.ai/onnx/operators/onnx__Pad.html "Accepted range is [-r, r-1]"."""
    data = site.shape_of("data")
    if data is None:
        return None
    r = len(data)
    out = site.out_shape(0)

    def ok(axes):
        if out is None or len(out) != r:
            return True
        return all(out[i] is None or out[i] == data[i] for i in range(r) if i not in axes)

    axes = _choose_axes(site.rng, r, site.size, ok)
    return None if axes is None else _signed(site.rng, axes, r)

