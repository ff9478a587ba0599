"""onnx's reference implementation as the product uses it: ``onnx.reference.ReferenceEvaluator``
with the operators whose onnx implementation deviates from its own spec page replaced by the
page's formula. Every evaluation of the spec goes through :func:`spec_evaluator`: the second
reference engine, the spec in float64 that settles a dispute, and constant folding (a folded
node's value is what the layer after it is tested on)."""

from __future__ import annotations

from ..core.lazy import np, onnx


def _lrn_op():
    """LRN as its spec page defines it (onnx.ai/onnx/operators/onnx__LRN.html): square_sum
    over the channels ``[c - floor((size-1)/2), c + ceil((size-1)/2)]``. onnx 1.23's
    implementation loops over the batch instead of the channels (channels >= N get
    square_sum 0: 50 % off on a 16-channel LRN of batch 1)."""
    from onnx.reference.op_run import OpRun

    class LRN(OpRun):
        op_domain = ""

        def _run(self, x, alpha=None, beta=None, bias=None, size=None):
            channels = x.shape[1]
            lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
            sq = x ** 2
            square_sum = np.zeros_like(x)
            for c in range(channels):
                square_sum[:, c] = sq[:, max(0, c - lo):min(channels, c + hi + 1)].sum(axis=1)
            return ((x / (bias + (alpha / size) * square_sum) ** beta).astype(x.dtype),)

    return LRN


def spec_evaluator(model: "onnx.ModelProto"):  # noqa: F821
    """An ``onnx.reference.ReferenceEvaluator`` of ``model`` with the corrected operators
    (:func:`_lrn_op`).

    Raises:
        whatever the evaluator raises on a model it cannot take.
    """
    return onnx.reference.ReferenceEvaluator(model, new_ops=[_lrn_op()])
