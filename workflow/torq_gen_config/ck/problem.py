"""One grouped convolution as CK sees it: G groups, N images, K and C channels per group.

Shapes in PyTorch terms: input ``[N, G*C, *in]``, weight ``[G*K, C, *filter]``, output
``[N, G*K, *out]``. The formulas are CK's ``ConvParam`` (library/src/utility/
convolution_parameter.cpp): ``out = floor((in + lp + rp - ((f - 1) * d + 1)) / s) + 1``,
``flop = 2 * G * N * K * C * prod(out) * prod(filter)`` (``GetFlops``) and bytes = the input,
weight and output tensors counted once each (``GetByte``). The same numbers hold for the
backward passes, which is how CK reports their TFLOPS.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from math import prod

#: Bytes per element of the data types a trace can carry.
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class ConvProblem:
    """A grouped convolution problem.

    Attributes:
        G, N, K, C: groups, batch, output channels per group, input channels per group.
        filter, input: spatial sizes (1 to 3 entries, outermost first: D, H, W).
        strides, dilations, left_pads, right_pads: per spatial dimension.
        dtype: ``"fp32"``, ``"fp16"`` or ``"bf16"``.
        channels_last: the activations are channels-last in memory (NHWC), else NCHW.
        weight_channels_last: the weight is ``[G*K, *filter, C]`` in memory (KYXC), else KCYX.
    """

    G: int
    N: int
    K: int
    C: int
    filter: tuple[int, ...]
    input: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    left_pads: tuple[int, ...]
    right_pads: tuple[int, ...]
    dtype: str = "fp16"
    channels_last: bool = False
    weight_channels_last: bool = False

    @property
    def ndim(self) -> int:
        """Number of spatial dimensions (1, 2 or 3)."""
        return len(self.filter)

    def output(self) -> tuple[int, ...]:
        """Output spatial sizes (may be <= 0 for an impossible problem)."""
        return tuple((i + lp + rp - ((f - 1) * d + 1)) // s + 1
                     for i, f, s, d, lp, rp in zip(self.input, self.filter, self.strides, self.dilations,
                                                   self.left_pads, self.right_pads))

    def flops(self) -> int:
        """Floating-point operations of one pass: 2·G·N·K·C·∏out·∏filter (CK ``ConvParam::GetFlops``)."""
        return 2 * self.G * self.N * self.K * self.C * prod(self.output()) * prod(self.filter)

    def tensor_elements(self) -> tuple[int, int, int]:
        """Element counts of the input, weight and output tensors."""
        return (self.N * self.G * self.C * prod(self.input), self.G * self.K * self.C * prod(self.filter),
                self.N * self.G * self.K * prod(self.output()))

    def bytes(self, element_bytes: int | None = None) -> int:
        """Bytes of the input, weight and output tensors, each counted once (CK ``GetByte``).

        Args:
            element_bytes: bytes per element (default: that of ``dtype``).
        """
        size = element_bytes or ELEMENT_BYTES[self.dtype]
        return size * sum(self.tensor_elements())

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def throughput(problem: ConvProblem, ms: float, element_bytes: int | None = None) -> tuple[float, float]:
    """TFLOPS and GB/s of one pass that took ``ms`` milliseconds, as CK computes them
    (``flop / 1e9 / ms`` and ``bytes / 1e6 / ms``); (0, 0) for ``ms <= 0``."""
    if ms <= 0:
        return 0.0, 0.0
    return problem.flops() / 1e9 / ms, problem.bytes(element_bytes) / 1e6 / ms
