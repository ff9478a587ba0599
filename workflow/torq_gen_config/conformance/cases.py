"""ONNX's node tests (``onnx.backend.test.case.node.collect_testcases``): which ones are run,
their inputs and expected outputs, and what decides a test's result (its fingerprint)."""

from __future__ import annotations

import hashlib
import random
import re
import warnings
from dataclasses import dataclass, field

from ..core.lazy import difflib, np, numpy_helper, onnx, onnx_node_tests

#: rtol/atol of a test case without its own (every onnx 1.23 node test carries 1e-3 / 1e-7)
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-5


@dataclass
class Selection:
    """The node tests chosen, and how many were left out on the way."""

    cases: list
    collected: int = 0
    expanded: int = 0
    non_tensor_io: int = 0
    considered: int = 0
    op_types: list[str] = field(default_factory=list)  # every op type of the tests with tensor I/O
    ops: list[str] | None = None  # what was asked for
    match: str | None = None
    sample: int | None = None
    seed: int = 1


def tensor_io_only(model) -> bool:
    """True when every graph input and output of ``model`` is a tensor (no sequence/optional)."""
    return all(v.type.HasField("tensor_type") for v in list(model.graph.input) + list(model.graph.output))


def as_array(v) -> np.ndarray:
    """A node test's input/output value as a numpy array (TensorProto -> to_array,
    object arrays of str -> unicode)."""
    if isinstance(v, onnx.TensorProto):
        v = numpy_helper.to_array(v)
    a = np.asarray(v)
    if a.dtype == object and all(isinstance(x, (str, bytes)) for x in a.flat):
        a = np.array([x.decode() if isinstance(x, bytes) else x for x in a.flat], dtype=str).reshape(a.shape)
    return a


def widen(a: np.ndarray) -> np.ndarray:
    """An ml_dtypes array other than bfloat16 as the exact values in a numpy type
    (float8/float4 -> float32, int4/int2 -> int8, uint4/uint2 -> uint8); others unchanged."""
    if not a.dtype.type.__module__.startswith("ml_dtypes") or a.dtype.name == "bfloat16":
        return a
    if a.dtype.name in ("int4", "int2"):
        return a.astype(np.int8)
    if a.dtype.name in ("uint4", "uint2"):
        return a.astype(np.uint8)
    return a.astype(np.float32)


def op_types(model) -> str:
    """The op types of ``model``'s nodes, sorted and joined with ``+`` (``-`` for none)."""
    return "+".join(sorted({n.op_type for n in model.graph.node})) or "-"


def opset(model) -> int | None:
    """The opset of the domain of ``model``'s first node (the default domain without nodes)."""
    domain = model.graph.node[0].domain if len(model.graph.node) else ""
    domain = "" if domain == "ai.onnx" else domain
    return next((int(o.version) for o in model.opset_import if (o.domain or "") == domain), None)


def inputs_of(case) -> dict[str, np.ndarray]:
    """The test's inputs (its first data set), keyed by graph input name."""
    return {i.name: as_array(v) for i, v in zip(case.model.graph.input, case.data_sets[0][0])}


def expected_of(case) -> dict[str, np.ndarray]:
    """The test's expected outputs (its first data set), keyed by graph output name."""
    return {o.name: as_array(v) for o, v in zip(case.model.graph.output, case.data_sets[0][1])}


def tolerances(case) -> tuple[float, float]:
    """The test's own ``(rtol, atol)``, else the defaults."""
    rtol = getattr(case, "rtol", None) or DEFAULT_RTOL
    atol = getattr(case, "atol", None)
    return rtol, DEFAULT_ATOL if atol is None else atol


def case_digest(case) -> str:
    """SHA-256 of what a test is: its model bytes, inputs, expected outputs and tolerances."""
    h = hashlib.sha256(case.model.SerializeToString(deterministic=True))
    for arrays in (inputs_of(case), expected_of(case)):
        for name, a in arrays.items():
            h.update(f"|{name}|{a.dtype.str}|{a.dtype.name}|{a.shape}|".encode())
            h.update(a.astype(str).tobytes() if a.dtype.kind in "USO" else np.ascontiguousarray(a).tobytes())
    h.update(repr(tolerances(case)).encode())
    return h.hexdigest()


def collect(*, ops: list[str] | None = None, match: str | None = None, sample: int | None = None,
            seed: int = 1) -> Selection:
    """The node tests of the installed onnx wheel, without ``*_expanded*`` function
    expansions and models with sequence/optional graph inputs or outputs; then only those
    whose node is of one of ``ops`` (case-insensitive), whose name matches the regular
    expression ``match`` (``re.search``), and a random ``sample`` of them drawn with ``seed``.
    Sorted by name.

    Raises:
        ValueError: an op type of ``ops`` that no test has (the message names near ones), or a
            bad regular expression.
    """
    with warnings.catch_warnings():  # the cases' own numpy overflow warnings
        warnings.simplefilter("ignore")
        cases = onnx_node_tests.collect_testcases(None)
    sel = Selection(cases=[], collected=len(cases), ops=list(ops) if ops else None, match=match, sample=sample,
                    seed=seed)
    cases = [c for c in cases if "_expanded" not in c.name]
    sel.expanded = sel.collected - len(cases)
    tensor = [c for c in cases if tensor_io_only(c.model)]
    sel.non_tensor_io = len(cases) - len(tensor)
    cases = tensor
    sel.op_types = sorted({n.op_type for c in cases for n in c.model.graph.node})
    if ops:
        known = {o.lower(): o for o in sel.op_types}
        unknown = [o for o in ops if o.lower() not in known]
        if unknown:
            near = difflib.get_close_matches(unknown[0], sel.op_types, n=3, cutoff=0.6)
            raise ValueError(f"no node test has op type(s) {', '.join(unknown)}"
                             + (f"; did you mean {', '.join(near)}?" if near else
                                f" ({len(sel.op_types)} op types have tests, e.g. {', '.join(sel.op_types[:5])})"))
        wanted = {o.lower() for o in ops}
        cases = [c for c in cases if any(n.op_type.lower() in wanted for n in c.model.graph.node)]
    if match:
        try:
            rx = re.compile(match)
        except re.error as e:
            raise ValueError(f"--match {match!r} is not a regular expression: {e}") from None
        cases = [c for c in cases if rx.search(c.name)]
    sel.considered = len(cases)
    if sample is not None and sample < len(cases):
        cases = random.Random(seed).sample(cases, sample)
    sel.cases = sorted(cases, key=lambda c: c.name)
    return sel
