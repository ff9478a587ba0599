"""Shared pieces of the rules: axis normalization, random axis sets, compositions and
factorizations of a count, the spec page link."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    from ..site import InputSite

_SPEC = "https://onnx.ai/onnx/operators/onnx__{}.html"


def _axis(site: InputSite, rank: int, default: int = 0) -> int | None:
    """The node's ``axis`` attribute normalized to [0, rank)."""
    a = int(site.attr("axis", default))
    return a + rank if -rank <= a < 0 else (a if 0 <= a < rank else None)


def _signed(rng, axes, rank: int) -> list[int]:
    """``axes`` in random order, each written as ``a`` or ``a - rank`` at random (both
    valid: the specs accept [-r, r))."""
    axes = [int(a) for a in axes]
    order = rng.permutation(len(axes)) if axes else []
    return [axes[i] - rank if rng.random() < 0.5 else axes[i] for i in order]


def _choose_axes(rng, rank: int, n: int, ok: Callable[[set], bool], *, limit: int = 20000):
    """A random set of ``n`` distinct axes of [0, rank) for which ``ok(set)`` holds
    (None when none does)."""
    if n > rank or n < 0:
        return None
    if math.comb(rank, n) <= limit:
        cands = [c for c in itertools.combinations(range(rank), n) if ok(set(c))]
    else:  # pragma: no cover - ranks over ~20
        cands = []
        for _ in range(2000):
            c = tuple(sorted(rng.choice(rank, size=n, replace=False).tolist()))
            if ok(set(c)):
                cands.append(c)
    if not cands:
        return None
    return list(cands[int(rng.integers(0, len(cands)))])


def _norm_axes(values, rank: int) -> list[int] | None:
    out = []
    for a in list(map(int, values)):
        if not -rank <= a < rank:
            return None
        out.append(a + rank if a < 0 else a)
    return out


def _composition(rng, total: int, n: int, *, positive: bool = True) -> list[int]:
    """``n`` non-negative ints summing to ``total`` (positive ones when total >= n and
    ``positive``), at random."""
    if n <= 0:
        return []
    if positive and total >= n:
        cuts = sorted(rng.choice(range(1, total), size=n - 1, replace=False).tolist()) if n > 1 else []
        bounds = [0, *cuts, total]
        return [bounds[i + 1] - bounds[i] for i in range(n)]
    cuts = sorted(rng.integers(0, total + 1, size=n - 1).tolist())
    bounds = [0, *cuts, total]
    return [bounds[i + 1] - bounds[i] for i in range(n)]


def _factorize(rng, count: int, n: int) -> list[int]:
    """``n`` dims whose product is ``count``: its prime factors spread at random."""
    dims = [1] * n
    if n == 0:
        return dims
    if count == 0:
        dims[int(rng.integers(0, n))] = 0
        return dims
    c, p = count, 2
    factors = []
    while p * p <= c:
        while c % p == 0:
            factors.append(p)
            c //= p
        p += 1
    if c > 1:
        factors.append(c)
    for f in factors:
        dims[int(rng.integers(0, n))] *= f
    return dims


def _spatial_out(in_dims, site: InputSite) -> list[int]:
    """Transposed-pooling output dims (MaxUnpool): (in - 1) * stride + kernel - pads."""
    k = list(site.attr("kernel_shape", []))
    s = list(site.attr("strides", [1] * len(k)))
    p = list(site.attr("pads", [0] * (2 * len(k))))
    return [(d - 1) * s[i] + k[i] - p[i] - p[i + len(k)] for i, d in enumerate(in_dims)]

