"""Rules for inputs an op reads as a shape, sizes, scales or a count (Reshape, Expand, Tile,
Resize, Range, Pad, Split, CenterCropPad, Col2Im, AffineGrid, TopK)."""

from __future__ import annotations

import itertools
import math

from ...core.lazy import np
from ..site import InputSite
from ..tensor_types import _is_int, _known, _match
from .helpers import _axis, _composition, _factorize, _norm_axes


def _reshape_shape(site: InputSite):
    """Reshape ``shape``: the declared output shape (explicit dims); unknown dims filled so
    that the element count is the data's; an unknown output gets a random factorization
    of the count. Spec: https://onnx.ai/onnx/operators/onnx__Reshape.html."""
    data = site.shape_of("data")
    n = site.size
    if not _known(data):
        return None
    count = math.prod(data)
    out = site.out_shape(0)
    if out is not None and len(out) == n:
        if int(site.attr("allowzero", 0)) == 0 and any(d == 0 and (i >= len(data) or data[i] != 0)
                                                         for i, d in enumerate(out)):
            return None  # a literal 0 would copy the input's dim (allowzero=0)
        unknown = [i for i, d in enumerate(out) if d is None]
        known_prod = math.prod(d for d in out if d is not None)
        dims = list(out)
        if not unknown:
            return dims if known_prod == count else None
        if known_prod == 0 or count % known_prod:
            return None
        for i, f in zip(unknown, _factorize(site.rng, count // known_prod, len(unknown))):
            dims[i] = f
        return dims
    return _factorize(site.rng, count, n)


def _broadcast_ok(data, shape, out) -> bool:
    try:
        b = np.broadcast_shapes(tuple(data), tuple(shape))
    except ValueError:
        return False
    return _match(b, out)


def _expand_shape(site: InputSite):
    """Expand ``shape``: the declared output shape's last len(shape) dims (dims the input
    broadcasts); without one, the input's dims (size-1 ones widened to 1..3) with leading
    new dims in [1, 3]. Spec: https://onnx.ai/onnx/operators/onnx__Expand.html (numpy
    broadcasting of input and shape)."""
    data = site.shape_of("input")
    n = site.size
    if not _known(data):
        return None
    out = site.out_shape(0)
    if _known(out) and len(out) >= n:
        cand = list(out[len(out) - n:])
        if _broadcast_ok(data, cand, out):
            return cand
        return None
    r = len(data)
    widen = [d if d != 1 else int(site.rng.integers(1, 4)) for d in data]
    if n >= r:
        shape = [int(site.rng.integers(1, 4)) for _ in range(n - r)] + widen
    else:
        shape = widen[r - n:]
    return shape if _broadcast_ok(data, shape, out) else None


def _constant_of_shape(site: InputSite):
    """ConstantOfShape ``input``: the declared output shape, else dims in [1, 4]; all
    non-negative. Spec: https://onnx.ai/onnx/operators/onnx__ConstantOfShape.html."""
    out = site.out_shape(0)
    if out is not None and len(out) == site.size:
        return [d if d is not None else int(site.rng.integers(1, 5)) for d in out]
    return site.ints(1, 5)


def _tile_repeats(site: InputSite):
    """Tile ``repeats``: out[i] / in[i] of the declared output (1 for an empty input dim),
    else in [1, 3]; non-negative. Spec: https://onnx.ai/onnx/operators/onnx__Tile.html."""
    data = site.shape_of("input")
    if data is None or len(data) != site.size:
        return None
    out = site.out_shape(0)
    reps = []
    for i, d in enumerate(data):
        o = out[i] if out is not None and len(out) == len(data) else None
        if o is None or d is None:
            reps.append(int(site.rng.integers(1, 4)))
        elif d == 0:
            reps.append(1)
        elif o % d:
            return None
        else:
            reps.append(o // d)
    return reps


def _resize_targets(site: InputSite):
    """(input dims, output dims) on the resized axes (``axes`` attribute, opset 18+), the
    output from the declared shape, else 1 on the first two dims and 2x on the others."""
    x = site.shape_of("X")
    if not _known(x):
        return None
    r = len(x)
    axes = site.attr("axes")
    axes = list(range(r)) if axes is None else _norm_axes(axes, r)
    if axes is None:
        return None
    out = site.out_shape(0)
    if _known(out) and len(out) == r:
        tgt = [out[a] for a in axes]
    else:
        tgt = [x[a] if (a < 2 and r >= 3) else 2 * x[a] for a in axes]
    return [x[a] for a in axes], tgt


def _resize_scales(site: InputSite):
    """Resize ``scales`` (and Upsample's): out/in per resized axis, nudged up so that
    floor(in * scale) = out in float32 (1 where a dim is unchanged). Spec:
    https://onnx.ai/onnx/operators/onnx__Resize.html "output_dimension =
    floor(input_dimension * (roi_end - roi_start) * scale)"; roi is 0..1 except for
    tf_crop_and_resize, where the roi's extent is divided out."""
    if site.node.op_type == "Resize" and site.input_name("sizes"):
        sizes = site.value_of("sizes")
        if sizes is None or sizes.size:  # sizes given: "Only one of 'scales' and 'sizes' can be specified"
            return None
    t = _resize_targets(site)
    if t is None:
        return None
    ins, outs = t
    if len(ins) != site.size:
        return None
    extent = [1.0] * len(ins)
    if site.attr("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        roi = site.value_of("roi")
        if roi is not None and roi.size == 2 * len(ins):
            roi = roi.astype(np.float64).reshape(-1)
            extent = [float(roi[len(ins) + i] - roi[i]) for i in range(len(ins))]
    scales = []
    for d, o, e in zip(ins, outs, extent):
        if d == 0:
            scales.append(1.0)
            continue
        s = np.float32(o / (d * e)) if e > 0 else np.float32(o / d)
        for _ in range(8):
            if math.floor(float(np.float32(d) * np.float32(e) * s)) >= o:
                break
            s = np.nextafter(s, np.float32(np.inf))
        scales.append(float(s))
    return scales


def _resize_sizes(site: InputSite):
    """Resize ``sizes``: the declared output's dims on the resized axes. With
    ``keep_aspect_ratio_policy`` not_larger/not_smaller the output is round(scale * in)
    with scale = min/max(sizes / in): sizes then hold out[j] on an axis j whose ratio
    out[j] / in[j] reproduces every output dim, and floor/ceil(scale * in) on the
    others. Spec: https://onnx.ai/onnx/operators/onnx__Resize.html."""
    t = _resize_targets(site)
    if t is None or len(t[1]) != site.size:
        return None
    ins, outs = t
    policy = site.attr("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch" or len(ins) < 2:
        return outs
    for j in range(len(ins)):
        if not ins[j]:
            continue
        scale = outs[j] / ins[j]
        if all(math.floor(d * scale + 0.5) == o for d, o in zip(ins, outs)):
            edge = math.floor if policy == "not_smaller" else math.ceil
            return [outs[j] if k == j else int(edge(d * scale)) for k, d in enumerate(ins)]
    return None


def _resize_roi(site: InputSite):
    """Resize ``roi``: [starts..., ends...] normalized, starts in [0, 0.3), ends in [0.7, 1]
    (start < end). Spec: https://onnx.ai/onnx/operators/onnx__Resize.html (roi is read with
    coordinate_transformation_mode tf_crop_and_resize)."""
    n = site.size // 2
    if n * 2 != site.size:
        return None
    return np.concatenate([site.rng.uniform(0.0, 0.3, size=n), site.rng.uniform(0.7, 1.0, size=n)])


def _range_start(site: InputSite):
    """Range ``start``: an integer value in [-8, 8) (exact in every dtype). Spec:
    https://onnx.ai/onnx/operators/onnx__Range.html."""
    return site.ints(-8, 8) if _is_int(site.dtype) else site.fit(site.rng.integers(-8, 8, size=site.shape))


def _range_delta(site: InputSite):
    """Range ``delta``: non-zero, ±1 or ±2 (exact in every dtype). Spec:
    https://onnx.ai/onnx/operators/onnx__Range.html."""
    v = int(site.rng.integers(1, 3)) * (1 if site.rng.random() < 0.7 else -1)
    return [v] if site.size == 1 else None


def _range_limit(site: InputSite):
    """Range ``limit``: start + (n - 1/2) * delta (start + n * delta for integers) so that
    ceil((limit - start) / delta) = n, the declared output length (else n in [1, 10]).
    Spec: https://onnx.ai/onnx/operators/onnx__Range.html "number_of_elements =
    max( ceil( (limit - start) / delta ) , 0 )"."""
    start, delta = site.value_of("start"), site.value_of("delta")
    if start is None or delta is None or start.size != 1 or delta.size != 1:
        return None
    st, de = float(start.reshape(-1)[0]), float(delta.reshape(-1)[0])
    if de == 0:
        return None
    out = site.out_shape(0)
    n = out[0] if out is not None and len(out) == 1 and out[0] is not None else int(site.rng.integers(1, 11))
    lim = st + n * de if _is_int(site.dtype) else st + (n - 0.5) * de
    return [lim]

def _pad_pads(site: InputSite):
    """Pad ``pads`` (opset 11+): per padded axis (``axes``, else all) begin + end = out - in
    of the declared output (else a total in [0, 2]), split at random; each side <= dim - 1
    for reflect, <= dim for wrap; layout [x1_begin, x2_begin, ..., x1_end, x2_end, ...].
    Spec: https://onnx.ai/onnx/operators/onnx__Pad.html."""
    data = site.shape_of("data")
    if not _known(data):
        return None
    r = len(data)
    if site.input_name("axes"):
        av = site.value_of("axes")
        axes = None if av is None else _norm_axes(av.reshape(-1), r)
    else:
        axes = list(range(r))
    if axes is None or 2 * len(axes) != site.size:
        return None
    out = site.out_shape(0)
    mode = site.attr("mode", "constant")
    begins, ends = [], []
    for a in axes:
        d = data[a]
        cap = d - 1 if mode == "reflect" else (d if mode == "wrap" else None)
        total = out[a] - d if out is not None and len(out) == r and out[a] is not None else \
            int(site.rng.integers(0, 3 if cap is None else min(2, 2 * cap) + 1))
        if total >= 0:
            lo = max(0, total - cap) if cap is not None else 0
            hi = min(total, cap) if cap is not None else total
            if lo > hi:
                return None
            b = int(site.rng.integers(lo, hi + 1))
        else:
            b = int(site.rng.integers(total, 1))
        begins.append(b)
        ends.append(total - b)
    return begins + ends


def _split_sizes(site: InputSite):
    """Split ``split`` (opset 13+): the declared outputs' sizes on ``axis`` when they sum to
    the input's, else a random composition of the dim into len(split) parts. Spec:
    https://onnx.ai/onnx/operators/onnx__Split.html "the sum of the values in split must
    be equal to the dim value at axis specified"."""
    data = site.shape_of("input")
    if data is None:
        return None
    a = _axis(site, len(data))
    if a is None or data[a] is None:
        return None
    d, n = data[a], site.size
    outs = [site.out_shape(i) for i in range(n)]
    if n == site.n_outputs and all(o is not None and len(o) == len(data) and o[a] is not None for o in outs):
        sizes = [o[a] for o in outs]
        if sum(sizes) == d:
            return sizes
    return _composition(site.rng, d, n)


def _split_to_sequence_sizes(site: InputSite):
    """SplitToSequence ``split``: a scalar in [1, dim], or a 1-D composition of the dim.
    Spec: https://onnx.ai/onnx/operators/onnx__SplitToSequence.html."""
    data = site.shape_of("input")
    if data is None:
        return None
    a = _axis(site, len(data))
    if a is None or not data[a]:
        return None
    if len(site.shape) == 0:
        return [int(site.rng.integers(1, data[a] + 1))]
    return _composition(site.rng, data[a], site.size)


def _center_crop_pad_shape(site: InputSite):
    """CenterCropPad ``shape``: the declared output's dims on ``axes`` (else in [1, 2*dim]).
    Spec: https://onnx.ai/onnx/operators/onnx__CenterCropPad.html."""
    data = site.shape_of("input_data")
    if not _known(data):
        return None
    r = len(data)
    axes = site.attr("axes")
    axes = list(range(r)) if axes is None else _norm_axes(axes, r)
    if axes is None or len(axes) != site.size:
        return None
    out = site.out_shape(0)
    return [out[a] if out is not None and len(out) == r and out[a] is not None
            else int(site.rng.integers(1, 2 * data[a] + 1)) for a in axes]


def _col2im_blocks(site: InputSite, image) -> list[int] | None:
    """A block shape with C * prod(block) = input.shape[1] and the input's L blocks."""
    x = site.shape_of("input")
    out = site.out_shape(0)
    if not _known(x) or len(x) != 3 or image is None:
        return None
    k = len(image)
    dil = list(site.attr("dilations", [1] * k))
    pads = list(site.attr("pads", [0] * 2 * k))
    strides = list(site.attr("strides", [1] * k))
    c = out[1] if out is not None and len(out) == k + 2 and out[1] else None
    for block in itertools.product(*[range(1, int(image[i]) + pads[i] + pads[i + k] + 1) for i in range(k)]):
        pb = math.prod(block)
        if x[1] % pb or (c is not None and x[1] // pb != c):
            continue
        blocks = 1
        for i in range(k):
            eff = image[i] + pads[i] + pads[i + k] - dil[i] * (block[i] - 1) - 1
            blocks *= (eff // strides[i] + 1) if eff >= 0 else 0
        if blocks == x[2]:
            return list(block)
    return None


def _col2im_image_shape(site: InputSite):
    """Col2Im ``image_shape``: the declared output's spatial dims. Spec:
    https://onnx.ai/onnx/operators/onnx__Col2Im.html."""
    out = site.out_shape(0)
    if out is None or len(out) != site.size + 2 or not _known(out[2:]):
        return None
    return list(out[2:])


def _col2im_block_shape(site: InputSite):
    """Col2Im ``block_shape``: a block with C * prod(block) = input.shape[1] and
    L = prod(floor((image + pads - dilation * (block - 1) - 1) / stride) + 1) = input.shape[2].
    Spec: https://onnx.ai/onnx/operators/onnx__Col2Im.html."""
    image = site.value_of("image_shape")
    return _col2im_blocks(site, None if image is None else image.reshape(-1).tolist())


def _affine_grid_size(site: InputSite):
    """AffineGrid ``size``: [N, C, (D,) H, W] with N = theta's batch and the spatial dims of
    the declared grid (N, (D,) H, W, 2|3); C in [1, 3]. Spec:
    https://onnx.ai/onnx/operators/onnx__AffineGrid.html."""
    theta = site.shape_of("theta")
    if theta is None or not theta or theta[0] is None:
        return None
    k = site.size - 2
    out = site.out_shape(0)
    spatial = list(out[1:1 + k]) if out is not None and len(out) == k + 2 and _known(out[1:1 + k]) else \
        [int(v) for v in site.rng.integers(2, 6, size=k)]
    return [theta[0], int(site.rng.integers(1, 4)), *spatial]

def _topk_k(site: InputSite):
    """TopK ``K``: the declared output's size on ``axis``, else in [1, dim]; in [0, dim].
    Spec: https://onnx.ai/onnx/operators/onnx__TopK.html."""
    x = site.shape_of("X")
    if x is None or not x:
        return None
    a = _axis(site, len(x), -1)
    if a is None or x[a] is None:
        return None
    out = site.out_shape(0)
    if out is not None and len(out) == len(x) and out[a] is not None and out[a] <= x[a]:
        return [out[a]]
    return [int(site.rng.integers(1, x[a] + 1))] if x[a] else [0]

