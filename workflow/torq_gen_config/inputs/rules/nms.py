"""NonMaxSuppression inputs, solved together so that the op selects the declared number of boxes."""

from __future__ import annotations

import math

from ...core.lazy import np
from ..site import InputSite, Rule
from ..tensor_types import _known
from .helpers import _composition


def _nms_solution(site: InputSite) -> dict | None:
    """NonMaxSuppression inputs giving the declared number of selected boxes M (memoized
    per node): mutually disjoint boxes (IoU 0: none suppresses another for any
    iou_threshold in [0, 1]), so that a (batch, class) pair selects min(max_output,
    #scores > score_threshold) boxes; the counts per pair are a composition of M."""
    key = ("nms", id(site.node))
    if key not in site.gen.memo:
        site.gen.memo[key] = _solve_nms(site)
    return site.gen.memo[key]


def _solve_nms(site: InputSite) -> dict | None:
    g, rng = site.gen, site.rng
    names = {f: site.input_name(f) for f in ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold",
                                             "score_threshold")}
    if not all(names[f] in g.inputs for f in ("boxes", "scores") if names[f]) or not names["scores"]:
        return None
    bs, ss = g.graph.shape(names["boxes"]), g.graph.shape(names["scores"])
    if not _known(bs) or not _known(ss) or len(bs) != 3 or len(ss) != 3 or bs[2] != 4 or ss[2] != bs[1]:
        return None
    nb, nc, n = bs[0], ss[1], bs[1]
    groups = nb * nc
    out = site.out_shape(0)
    target = out[0] if out is not None and len(out) == 2 and out[0] is not None else None

    def given(f):
        nm = names[f]
        return None if nm is None else (None if nm in g.inputs else g.graph.constant(nm))

    mo_free = names["max_output_boxes_per_class"] in g.inputs
    mo_c = given("max_output_boxes_per_class")
    mo = int(mo_c.reshape(-1)[0]) if mo_c is not None and mo_c.size else (None if mo_free else 0)
    thr_free = names["score_threshold"] in g.inputs
    thr_c = given("score_threshold")
    has_thr = names["score_threshold"] is not None
    thr = float(thr_c.reshape(-1)[0]) if thr_c is not None and thr_c.size else (float(rng.uniform(0.3, 0.7))
                                                                                 if has_thr else None)
    if target is None:
        target = int(rng.integers(0, groups * n + 1)) if (mo is None or mo) else 0
    if has_thr:
        cap = n if mo is None else min(mo, n)
        if target > groups * cap:
            return None
        sel = _composition(rng, target, groups, positive=False)
        while any(c > cap for c in sel):  # move the excess to groups with room
            i = next(i for i, c in enumerate(sel) if c > cap)
            j = next(j for j, c in enumerate(sel) if c < cap)
            sel[i] -= 1
            sel[j] += 1
        mo = n if mo is None else mo
    else:  # every box passes: each group selects min(max_output, n)
        if mo is None:
            if target % groups or target // groups > n:
                return None
            mo = target // groups
        if groups * min(mo, n) != target:
            return None
        sel = [n] * groups
    # disjoint boxes: box i in cell i of a grid over [0, 1)^2
    side = math.ceil(math.sqrt(n)) or 1
    cell = 1.0 / side
    idx = np.arange(n)
    y0, x0 = (idx // side) * cell, (idx % side) * cell
    y1 = y0 + rng.uniform(0.05, 0.3, size=(nb, n)) * cell
    x1 = x0 + rng.uniform(0.05, 0.3, size=(nb, n)) * cell
    y2 = y1 + rng.uniform(0.3, 0.65, size=(nb, n)) * cell
    x2 = x1 + rng.uniform(0.3, 0.65, size=(nb, n)) * cell
    if int(site.attr("center_point_box", 0)):
        boxes = np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=-1)
    else:
        boxes = np.stack([y1, x1, y2, x2], axis=-1)
    scores = np.empty((groups, n))
    lo_thr = 0.0 if thr is None else thr
    for k, c in enumerate(sel):
        above = np.zeros(n, dtype=bool)
        above[rng.choice(n, size=c, replace=False)] = True
        scores[k] = np.where(above, rng.uniform(lo_thr + (1 - lo_thr) * 0.05, 1.0, size=n),
                             rng.uniform(0.0, lo_thr * 0.95, size=n) if thr is not None else 0.0)
    return {"boxes": boxes, "scores": scores.reshape(nb, nc, n), "max_output_boxes_per_class": [mo],
            "iou_threshold": [float(rng.uniform(0.0, 1.0))], "score_threshold": [thr if thr is not None else 0.0]}


def _nms_input(fallback: Rule):
    def rule(site: InputSite):
        sol = _nms_solution(site)
        return fallback(site) if sol is None else sol[site.formal]

    rule.__doc__ = (f"NonMaxSuppression ``boxes``/``scores``/``max_output_boxes_per_class``/``iou_threshold``/"
                    f"``score_threshold``, solved together when boxes and scores are inputs: disjoint boxes "
                    f"(IoU 0), scores above/below the threshold and max_output chosen so that the op selects the "
                    f"declared number of boxes; otherwise: {(fallback.__doc__ or '').strip()}")
    return rule


def _nms_boxes(site: InputSite):
    """NonMaxSuppression ``boxes`` [B, N, 4]: well-formed boxes in [0, 1): corners
    [y1, x1, y2, x2] with y1 < y2, x1 < x2 (center_point_box 0) or [x_c, y_c, w, h]
    with w, h > 0 (1). Spec: https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html."""
    if not site.shape or site.shape[-1] != 4:
        return None
    lead = site.shape[:-1]
    rng = site.rng
    a, b = rng.uniform(0.0, 0.6, size=(*lead, 2)), rng.uniform(0.05, 0.4, size=(*lead, 2))
    if int(site.attr("center_point_box", 0)):
        return np.concatenate([a + b / 2, b], axis=-1)
    return np.concatenate([a, a + b], axis=-1)


def _nms_max_boxes(site: InputSite):
    """NonMaxSuppression ``max_output_boxes_per_class``: in [0, N] (N boxes). Spec:
    https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html."""
    boxes = site.shape_of("boxes")
    n = boxes[1] if boxes is not None and len(boxes) == 3 and boxes[1] is not None else 10
    return site.ints(0, n + 1)
