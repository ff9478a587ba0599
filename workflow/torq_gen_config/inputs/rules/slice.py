"""Slice ``starts``/``ends``/``axes``/``steps``, solved together per node."""

from __future__ import annotations

import math

from ..site import InputSite
from ..tensor_types import _int_info, _is_int, _known
from .helpers import _choose_axes, _norm_axes


_INT64_MAX = 2**63 - 1


def _slice_solution(site: InputSite) -> dict | None:
    """starts/ends/axes/steps of one Slice, solved together (memoized per node)."""
    key = ("slice", id(site.node))
    if key in site.gen.memo:
        return site.gen.memo[key]
    site.gen.memo[key] = sol = _solve_slice(site)
    return sol


def _slice_len(d: int, st: int, en: int, s: int) -> int:
    """Output length of Slice on a dim of size d (the spec's clamping)."""
    st = st + d if st < 0 else st
    en = en + d if en < 0 else en
    if s > 0:
        st, en = min(max(st, 0), d), min(max(en, 0), d)
    else:
        st, en = min(max(st, 0), d - 1), min(max(en, -1), d - 1)
    return max(0, math.ceil((en - st) / s))


def _solve_slice(site: InputSite) -> dict | None:
    """Slice inputs giving the declared output: see :func:`_slice_inputs`."""
    g = site.gen
    data = site.shape_of("data")
    if not _known(data):
        return None
    r = len(data)
    names = {f: site.input_name(f) for f in ("starts", "ends", "axes", "steps")}
    n_shape = g.graph.shape(names["starts"]) if names["starts"] else None
    if n_shape is None or len(n_shape) != 1 or n_shape[0] is None:
        return None
    n = n_shape[0]
    const = {f: (g.graph.constant(nm) if nm and nm not in g.inputs else None) for f, nm in names.items()}
    out = site.out_shape(0)
    out = out if out is not None and len(out) == r else None
    rng = site.rng
    # axes
    if const["axes"] is not None:
        axes = _norm_axes(const["axes"].reshape(-1), r)
    elif names["axes"] is None:
        axes = list(range(n))
    else:
        need = {i for i in range(r) if out is not None and out[i] is not None and out[i] != data[i]}
        axes = _choose_axes(rng, r, n, lambda c: need <= c)
        axes = None if axes is None else [axes[i] for i in rng.permutation(len(axes))]
    if axes is None or len(axes) != n or n > r:
        return None
    if out is not None and any(out[i] is not None and out[i] != data[i] for i in range(r) if i not in axes):
        return None
    steps_c = const["steps"].reshape(-1).tolist() if const["steps"] is not None else None
    starts_c = const["starts"].reshape(-1).tolist() if const["starts"] is not None else None
    ends_c = const["ends"].reshape(-1).tolist() if const["ends"] is not None else None
    starts, ends, steps = [], [], []
    for k, a in enumerate(axes):
        d = data[a]
        o = out[a] if out is not None and out[a] is not None else (int(rng.integers(1, d + 1)) if d else 0)
        if steps_c is not None:
            s_opts = [int(steps_c[k])]
        elif names["steps"] is None:
            s_opts = [1]
        else:
            s_opts = [s for s in (1, 1, 2, -1) if o <= 1 or (o - 1) * abs(s) + 1 <= d]
        s = s_opts[int(rng.integers(0, len(s_opts)))] if s_opts else 1
        if s == 0:
            return None
        span = (o - 1) * abs(s) + 1 if o > 0 else 0
        if starts_c is not None:
            st = int(starts_c[k])
            st_n = min(max(st + d if st < 0 else st, 0), d if s > 0 else d - 1)
            en = st_n + span if s > 0 else st_n - span
            if s < 0 and en < 0:
                en = -d - 1
        elif ends_c is not None:
            en = int(ends_c[k])
            en_n = en + d if en < 0 else en
            en_n = min(max(en_n, 0), d) if s > 0 else min(max(en_n, -1), d - 1)
            st = en_n - span if s > 0 else en_n + span
        elif s > 0:
            st = int(rng.integers(0, d - span + 1)) if d - span >= 0 else 0
            en = st + span
            if en == d and rng.random() < 0.3:
                en = _INT64_MAX  # "slice to the end", as exporters write it
            elif en < d and rng.random() < 0.5:
                en -= d
            if st > 0 and rng.random() < 0.5:
                st -= d
        else:
            st = int(rng.integers(span - 1, d)) if d and span else (d - 1 if d else 0)
            en = st - span
            if en < 0:
                en = -d - 1
        if _slice_len(d, st, en, s) != o:
            return None
        starts.append(st)
        ends.append(en)
        steps.append(s)
    axes_vals = [a - r if rng.random() < 0.5 else a for a in axes]
    return {"starts": starts, "ends": ends, "axes": axes_vals, "steps": steps}


def _slice_inputs(site: InputSite):
    """Slice ``starts``/``ends``/``axes``/``steps`` (opset 10+), solved together: axes
    distinct in [-r, r) including every axis the declared output shortens; per axis a
    step (1, 2 or -1 where the output fits) and a start/end (negative and "to the end"
    forms included) whose clamped slice has the declared output length (constants among
    the four kept). Spec: https://onnx.ai/onnx/operators/onnx__Slice.html."""
    sol = _slice_solution(site)
    if sol is None:
        return None
    v = sol[site.formal]
    if _is_int(site.dtype):
        lo, hi = _int_info(site.dtype)
        v = [min(max(x, lo), hi) for x in v]
    return v

