"""Op-aware deterministic inputs for an ONNX model (one layer or a whole model).

Most graph inputs are data, drawn uniformly per dtype (config ``inputs``: floats in
``float_range``, integers in ``int_range``, uint8 in ``uint8_range``, bools). But an
operator may read an integer input as axes, a shape, indices, split sizes or a count,
and a float input as resize scales or a threshold; uniform values there make the op
fail ("axis 31 is not in valid range", "invalid expand shape", "Integer division by
zero") or read out of bounds. For those inputs a rule derives the values from the
consuming node: its schema (the formal name of the input), its attributes, the static
shapes of its other inputs, and its declared output shapes (graph outputs and
``value_info``), so that the op runs and produces the shape the model declares.

The rules are one table, :data:`RULES`: ``(domain, op type, formal input name) -> rule``.
The formal name comes from ``onnx.defs.get_schema(op_type, opset, domain)`` (variadic
inputs: every position of the last formal parameter). Each rule is a function of an
:class:`InputSite` (the input as that node's input) that returns the values, or None
when it cannot satisfy the op's constraint (e.g. a shape it needs is unknown); the
input then gets the plain per-dtype values (the behaviour before these rules). The
rules, with the operator spec's constraint they follow, are documented in
docs/inputs.md and in each rule's docstring (spec pages: https://onnx.ai/onnx/operators/).

Determinism: one ``numpy.random.default_rng(seed)`` stream, inputs generated in graph
input order; a rule that needs another graph input's value (``Range``'s ``limit``
needs ``start`` and ``delta``) generates that one first. An input without a rule
draws what the generator before these rules drew (same numpy calls, same order), so a
model none of whose inputs has a rule or a 0 dim keeps its values (except dtypes that
generator mishandled: strings, int4/int2 drawn as floats, float8e8m0 NaNs).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import onnx

__all__ = ["generate_inputs", "InputSite", "RULES", "input_shape"]

_SPEC = "https://onnx.ai/onnx/operators/onnx__{}.html"
#: string inputs: characters and length range [1, 8]
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_SUB_BYTE_INTS = ("int4", "uint4", "int2", "uint2")
_INT64_MAX = 2**63 - 1


#: Default value ranges per dtype class, [low, high) (config ``inputs``).
DEFAULT_INPUT_SETTINGS = {"seed": 1234, "float_range": [-1.0, 1.0], "int_range": [-40, 40], "uint8_range": [0, 80]}


# ----------------------------------------------------------------------------- shapes and values
def _dims(type_proto) -> tuple | None:
    """Static dims of a tensor type: ints, None for an unknown/symbolic dim; None when
    the rank is unknown or the type is not a tensor."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in type_proto.tensor_type.shape.dim)


def input_shape(vi: "onnx.ValueInfoProto") -> tuple[int, ...]:
    """The static shape of graph input ``vi``; a 0 dim is a real (empty) dim.

    Raises:
        ValueError: ``vi`` is not a tensor, has no shape, or a dim is symbolic
            (``dim_param``) or unknown; the message names the input and the dim.
    """
    t = vi.type
    if not t.HasField("tensor_type"):
        raise ValueError(f"input {vi.name!r} is not a tensor ({t.WhichOneof('value')}); inputs are generated "
                         f"for tensors only")
    if not t.tensor_type.HasField("shape"):
        raise ValueError(f"input {vi.name!r} has no shape (unknown rank); give it a static shape")
    dims = []
    for i, d in enumerate(t.tensor_type.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            raise ValueError(f"input {vi.name!r}: dim {i} is symbolic ({d.dim_param!r}); give it a static size")
        else:
            raise ValueError(f"input {vi.name!r}: dim {i} is unknown; give it a static size")
    return tuple(dims)


def _match(expected, declared) -> bool:
    """``expected`` (ints) agrees with ``declared`` (ints or None per dim; None = unknown)."""
    if declared is None:
        return True
    return len(expected) == len(declared) and all(d is None or int(e) == d for e, d in zip(expected, declared))


def _known(shape) -> bool:
    return shape is not None and all(d is not None for d in shape)


def _is_float(dt) -> bool:
    return dt.kind == "f" or dt.name.startswith(("bfloat16", "float"))


def _is_int(dt) -> bool:
    return dt.kind in "iu" or dt.name in _SUB_BYTE_INTS


def _int_info(dt) -> tuple[int, int]:
    """[min, max] of an integer dtype (ml_dtypes int4/uint4/int2/uint2 included)."""
    import numpy as np

    if dt.name in _SUB_BYTE_INTS:
        import ml_dtypes

        info = ml_dtypes.iinfo(dt)
    else:
        info = np.iinfo(dt)
    return int(info.min), int(info.max)


class _Graph:
    """What the rules read about the model: shapes, constants, consumers, opsets."""

    def __init__(self, model: "onnx.ModelProto"):
        self.model = model
        g = model.graph
        self.opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
        self.shapes: dict[str, tuple | None] = {}
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            self.shapes[vi.name] = _dims(vi.type)
        self._tensors = {t.name: t for t in g.initializer}
        for t in g.initializer:
            self.shapes[t.name] = tuple(int(d) for d in t.dims)
        self._constants: dict[str, Any] = {}
        self.consumers: dict[str, list] = defaultdict(list)
        for node in g.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
                self._constants[node.output[0]] = node
            for pos, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((node, pos))
        self._inferred = False
        self._arrays: dict[str, Any] = {}

    def shape(self, name: str) -> tuple | None:
        """Dims of ``name`` (None per unknown dim), None when its rank is unknown; runs
        onnx shape inference once when a value has no shape in the model."""
        s = self.shapes.get(name)
        if s is None and name in self._constants:
            a = self.constant(name)
            s = None if a is None else tuple(a.shape)
            self.shapes[name] = s
        if s is None and not self._inferred:
            self._inferred = True
            try:
                import onnx

                inferred = onnx.shape_inference.infer_shapes(self.model)
                for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
                    if self.shapes.get(vi.name) is None:
                        self.shapes[vi.name] = _dims(vi.type)
            except Exception:  # a model shape inference rejects: rules then fall back where they need shapes
                pass
            s = self.shapes.get(name)
        return s

    def constant(self, name: str):
        """The value of an initializer or ``Constant`` output ``name``, else None."""
        if name in self._arrays:
            return self._arrays[name]
        from onnx import helper, numpy_helper

        a = None
        if name in self._tensors:
            a = numpy_helper.to_array(self._tensors[name])
        elif name in self._constants:
            import numpy as np

            for at in self._constants[name].attribute:
                v = helper.get_attribute_value(at)
                if at.name == "value":
                    a = numpy_helper.to_array(v)
                elif at.name in ("value_int", "value_ints"):
                    a = np.asarray(v, dtype=np.int64)
                elif at.name in ("value_float", "value_floats"):
                    a = np.asarray(v, dtype=np.float32)
        self._arrays[name] = a
        return a


def _formal_names(node, schema) -> list[str]:
    """The schema's formal input name of each position of ``node.input`` (positions past
    the last formal parameter belong to it when it is variadic)."""
    from onnx.defs import OpSchema

    formals = [f.name for f in schema.inputs]
    if not formals:
        return []
    last_variadic = schema.inputs[-1].option == OpSchema.FormalParameterOption.Variadic
    out = []
    for i in range(len(node.input)):
        if i < len(formals):
            out.append(formals[i])
        elif last_variadic:
            out.append(formals[-1])
        else:
            out.append(f"#{i}")
    return out


class InputSite:
    """One graph input as input ``position`` (formal name ``formal``) of ``node``: what a
    rule reads. Shapes are tuples of ints with None for an unknown dim, or None when the
    rank is unknown."""

    def __init__(self, gen: "_Generator", name: str, shape: tuple, dtype, node, position: int,
                 formals: list[str], domain: str, opset: int):
        self.gen, self.name, self.shape, self.dtype = gen, name, tuple(shape), dtype
        self.node, self.position, self.formals = node, position, formals
        self.formal = formals[position]
        self.domain, self.opset = domain, opset

    # --- the node
    @property
    def rng(self):
        return self.gen.rng

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    def attr(self, name: str, default=None):
        """The node's attribute ``name`` (bytes decoded), else ``default``."""
        from onnx import helper

        for a in self.node.attribute:
            if a.name == name:
                v = helper.get_attribute_value(a)
                return v.decode() if isinstance(v, bytes) else v
        return default

    def input_name(self, formal: str) -> str | None:
        """The value name at the first position of ``formal`` ("" / missing -> None)."""
        for i, f in enumerate(self.formals):
            if f == formal:
                return self.node.input[i] or None
        return None

    def shape_of(self, formal: str) -> tuple | None:
        name = self.input_name(formal)
        return None if name is None else self.gen.graph.shape(name)

    def value_of(self, formal: str):
        """The value of input ``formal``: a constant, or a graph input (generated first
        when needed); None when absent or computed by another node."""
        name = self.input_name(formal)
        return None if name is None else self.gen.value(name)

    def out_shape(self, i: int = 0) -> tuple | None:
        outs = [o for o in self.node.output]
        if i >= len(outs) or not outs[i]:
            return None
        return self.gen.graph.shape(outs[i])

    @property
    def n_outputs(self) -> int:
        return len([o for o in self.node.output if o])

    # --- making values
    def fit(self, values) -> "np.ndarray | None":
        """``values`` as an array of this input's shape and dtype; None on a size mismatch."""
        import numpy as np

        a = np.asarray(values)
        if a.size != self.size:
            return None
        if _is_int(self.dtype):  # saturate to the dtype (e.g. int64 "to the end" ends written to int32)
            lo, hi = _int_info(self.dtype)
            a = np.clip(a.astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64), lo, hi)
        elif _is_float(self.dtype) and self.dtype != np.float64:
            a = a.astype(np.float32)  # ml_dtypes types convert from float32
        return a.astype(self.dtype).reshape(self.shape)

    def ints(self, low: int, high: int) -> "np.ndarray":
        """Integers uniform in [low, high) of this input's shape and dtype."""
        return self.rng.integers(int(low), int(high), size=self.shape).astype(self.dtype)

    def uniform(self, low: float, high: float) -> "np.ndarray":
        """Floats uniform in [low, high) of this input's shape and dtype."""
        import numpy as np

        return self.rng.uniform(low, high, size=self.shape).astype(np.float32).astype(self.dtype)

    def data(self) -> "np.ndarray":
        """The plain per-dtype values (what an input without a rule gets)."""
        return self.gen.data(self.name, self.shape, self.dtype)

    def data_range(self) -> tuple[float, float]:
        """[low, high) of :meth:`data` for this input (its ``input_ranges`` entry, else
        the dtype's configured range, clipped to the dtype)."""
        return self.gen.data_range(self.name, self.dtype)


Rule = Callable[[InputSite], Any]


# ----------------------------------------------------------------------------- generator
class _Generator:
    def __init__(self, model, settings: dict, input_ranges: dict | None):
        import numpy as np

        self.graph = _Graph(model)
        self.settings = settings
        self.ranges = input_ranges or {}
        self.rng = np.random.default_rng(settings["seed"])
        self.inputs = {vi.name: vi for vi in model.graph.input}
        self.values: dict[str, Any] = {}
        self.memo: dict[Any, Any] = {}
        self._busy: set[str] = set()

    def value(self, name: str):
        """A constant's value, or graph input ``name``'s generated value; None otherwise."""
        if name in self.inputs:
            if name not in self.values:
                if name in self._busy:  # a cycle between rules: no value
                    return None
                self.generate(name)
            return self.values[name]
        return self.graph.constant(name)

    def generate(self, name: str) -> None:
        import numpy as np

        from .ort_io import numpy_dtype

        vi = self.inputs[name]
        shape = input_shape(vi)
        dtype = numpy_dtype(vi.type.tensor_type.elem_type)
        self._busy.add(name)
        try:
            if math.prod(shape) == 0:
                self.values[name] = np.zeros(shape, dtype=dtype) if dtype.kind != "O" else np.empty(shape, dtype=object)
                return
            value = None
            for site in self.sites(name, shape, dtype):  # the first consumer whose rule gives values
                rule = RULES.get((site.domain, site.node.op_type, site.formal))
                if rule is None:
                    continue
                got = rule(site)
                value = None if got is None else site.fit(got)
                if value is not None:
                    break
            self.values[name] = value if value is not None else self.data(name, shape, dtype)
        finally:
            self._busy.discard(name)

    def sites(self, name: str, shape, dtype):
        import onnx.defs

        for node, pos in self.graph.consumers.get(name, []):
            domain = node.domain if node.domain != "ai.onnx" else ""
            opset = self.graph.opsets.get(domain)
            if opset is None:
                continue
            try:
                schema = onnx.defs.get_schema(node.op_type, opset, domain)
            except Exception:  # no schema (custom op): no rule
                continue
            yield InputSite(self, name, shape, dtype, node, pos, _formal_names(node, schema), domain, opset)

    def data_range(self, name: str, dtype) -> tuple[float, float]:
        s = self.settings
        custom = self.ranges.get(name)
        if _is_int(dtype):
            lo, hi = s["uint8_range"] if dtype.name == "uint8" else s["int_range"]
            if custom is not None:
                lo, hi = int(custom[0]), int(custom[1])
            imin, imax = _int_info(dtype)
            return max(int(lo), imin), min(int(hi), imax + 1)
        lo, hi = custom if custom is not None else s["float_range"]
        return float(lo), float(hi)

    def data(self, name: str, shape, dtype):
        """Plain values: the generator before the op rules, for every dtype."""
        import numpy as np

        rng = self.rng
        if dtype == np.bool_:
            return rng.integers(0, 2, size=shape).astype(np.bool_)
        if dtype.kind in "OUS":  # strings: short ASCII, as a numpy object array (what onnxruntime takes)
            n = int(math.prod(shape))
            lengths = rng.integers(1, 9, size=n)
            chars = rng.integers(0, len(_ALPHABET), size=int(lengths.sum()))
            out, k = [], 0
            for ln in lengths:
                out.append("".join(_ALPHABET[c] for c in chars[k:k + ln]))
                k += ln
            return np.array(out, dtype=object).reshape(shape)
        if _is_int(dtype):
            lo, hi = self.data_range(name, dtype)
            return rng.integers(lo, hi, size=shape).astype(dtype)
        lo, hi = self.data_range(name, dtype)
        if dtype.kind == "c":
            re = rng.uniform(lo, hi, size=shape)
            return (re + 1j * rng.uniform(lo, hi, size=shape)).astype(dtype)
        x = rng.uniform(lo, hi, size=shape).astype(np.float32)
        if dtype.name == "float8_e8m0fnu":  # exponent only: positive powers of two, no zero
            x = np.maximum(np.abs(x), np.float32(2.0 ** -8))
        return x.astype(dtype)


def generate_inputs(model: "onnx.ModelProto", settings: dict | None = None,
                    input_ranges: dict[str, list[float]] | None = None) -> dict[str, "np.ndarray"]:
    """Deterministic, op-aware values for every graph input of ``model``.

    Args:
        model: a one-layer model or a whole model; every graph input a tensor with a
            static shape (0 dims allowed: the array is empty).
        settings: ``seed``, ``float_range``, ``int_range``, ``uint8_range`` (defaults:
            :data:`DEFAULT_INPUT_SETTINGS`).
        input_ranges: per input name, a [low, high) range that replaces the dtype's
            range of the plain values (``--quantize``). Structural rules (axes,
            shapes, indices, sizes, counts; docs/inputs.md) do not read it.

    Returns:
        Input name -> array of the input's shape, in graph input order. dtypes:
        numpy's for numpy types; ml_dtypes for bfloat16, float8 (e4m3fn, e4m3fnuz,
        e5m2, e5m2fnuz, e8m0fnu), int4/uint4, int2/uint2, float4e2m1 (one element
        per byte; :mod:`torq_gen_config.ort_io` packs them for ONNX Runtime);
        ``object`` arrays of short ASCII ``str`` for STRING. Plain values: floats
        uniform in ``float_range`` (through float32), integers uniform in
        ``int_range`` (uint8: ``uint8_range``) clipped to the dtype, bools in {False,
        True}. An input read by an operator as axes, shape, indices, sizes, scales,
        thresholds, divisors, ... gets the values of its rule in :data:`RULES`
        (docs/inputs.md; each rule cites its ONNX operator spec page); where the
        rule cannot be satisfied (e.g. a shape it needs is unknown), plain values.

    Raises:
        ValueError: an input that is not a tensor, has no shape, or has a symbolic
            or unknown dim (the message names the input and the dim), or has a dtype
            with no numpy/ml_dtypes type.
    """
    s = {**DEFAULT_INPUT_SETTINGS, **(settings or {})}
    gen = _Generator(model, s, input_ranges)
    for vi in model.graph.input:  # check every shape first: the error names the input
        input_shape(vi)
    for vi in model.graph.input:
        if vi.name not in gen.values:
            gen.generate(vi.name)
    return {vi.name: gen.values[vi.name] for vi in model.graph.input}


# ----------------------------------------------------------------------------- rule helpers
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


# ----------------------------------------------------------------------------- rules: axes
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


# ----------------------------------------------------------------------------- rules: indices
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
            import numpy as np

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
        import numpy as np

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
    import numpy as np

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
    import numpy as np

    return np.ones(site.shape, dtype=bool)


def _false(site: InputSite):
    """Dropout ``training_mode``: False (inference: the output is deterministic; in training
    mode it is a random mask). Spec: https://onnx.ai/onnx/operators/onnx__Dropout.html."""
    import numpy as np

    return np.zeros(site.shape, dtype=bool)


def _compress_condition(site: InputSite):
    """Compress ``condition`` (1-D bool): as many True values (among the first
    min(len, dim) entries) as the declared output has on ``axis`` (flattened input without
    ``axis``). Spec: https://onnx.ai/onnx/operators/onnx__Compress.html."""
    import numpy as np

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


# ----------------------------------------------------------------------------- rules: shapes and sizes
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
    import numpy as np

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
    import numpy as np

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
    import numpy as np

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
    import numpy as np

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


def _window_size(site: InputSite):
    """Hann/Hamming/BlackmanWindow ``size``: the declared output length, else in [1, 16];
    positive. Spec: https://onnx.ai/onnx/operators/onnx__HannWindow.html."""
    out = site.out_shape(0)
    return [out[0]] if out is not None and len(out) == 1 and out[0] else [int(site.rng.integers(1, 17))]


def _mel_num_bins(site: InputSite):
    """MelWeightMatrix ``num_mel_bins``: the declared output's dim 1 (else in [2, 9]).
    Spec: https://onnx.ai/onnx/operators/onnx__MelWeightMatrix.html (output
    [floor(dft_length/2) + 1, num_mel_bins])."""
    out = site.out_shape(0)
    return [out[1]] if out is not None and len(out) == 2 and out[1] else [int(site.rng.integers(2, 10))]


def _mel_dft_length(site: InputSite):
    """MelWeightMatrix ``dft_length``: 2 * (out[0] - 1) for the declared output (else 16)."""
    out = site.out_shape(0)
    return [2 * (out[0] - 1)] if out is not None and len(out) == 2 and out[0] and out[0] > 1 else [16]


def _mel_sample_rate(site: InputSite):
    """MelWeightMatrix ``sample_rate``: in [8000, 16000] Hz."""
    return [int(site.rng.integers(8000, 16001))]


def _mel_lower(site: InputSite):
    """MelWeightMatrix ``lower_edge_hertz``: in [0, 100) Hz."""
    return [float(site.rng.uniform(0.0, 100.0))]


def _mel_upper(site: InputSite):
    """MelWeightMatrix ``upper_edge_hertz``: in [0.5, 0.9) * sample_rate / 2 (below Nyquist,
    so that the highest triangle lies inside the spectrum). Spec:
    https://onnx.ai/onnx/operators/onnx__MelWeightMatrix.html."""
    sr = site.value_of("sample_rate")
    if sr is None or sr.size != 1:
        return None
    return [float(sr.reshape(-1)[0]) / 2 * float(site.rng.uniform(0.5, 0.9))]


def _stft_frame_length(site: InputSite):
    """STFT ``frame_length``: the window's length, else from the declared output's bins
    (onesided: 2 * (bins - 1)), else min(signal length, 8). Spec:
    https://onnx.ai/onnx/operators/onnx__STFT.html."""
    sig = site.shape_of("signal")
    if sig is None or len(sig) < 2 or sig[1] is None:
        return None
    win = site.shape_of("window")
    if win is not None and len(win) == 1 and win[0]:
        return [win[0]]
    out = site.out_shape(0)
    if out is not None and len(out) == 4 and out[2]:
        fl = 2 * (out[2] - 1) if int(site.attr("onesided", 1)) else out[2]
        if 0 < fl <= sig[1]:
            return [fl]
    return [min(sig[1], 8)]


def _stft_frame_step(site: InputSite):
    """STFT ``frame_step``: a positive step giving the declared number of frames,
    (length - frame_length) // step + 1, else frame_length // 2. Spec:
    https://onnx.ai/onnx/operators/onnx__STFT.html."""
    sig = site.shape_of("signal")
    if sig is None or len(sig) < 2 or sig[1] is None:
        return None
    fl = site.value_of("frame_length")
    win = site.shape_of("window")
    flen = int(fl.reshape(-1)[0]) if fl is not None and fl.size == 1 else (win[0] if win and win[0] else None)
    if not flen or flen > sig[1]:
        return None
    out = site.out_shape(0)
    if out is not None and len(out) == 4 and out[1]:
        for s in range(1, sig[1] + 1):
            if (sig[1] - flen) // s + 1 == out[1]:
                return [s]
    return [max(1, flen // 2)]


def _dft_length(site: InputSite):
    """DFT ``dft_length``: the signal's length on the transformed axis (positive). Spec:
    https://onnx.ai/onnx/operators/onnx__DFT.html."""
    x = site.shape_of("input")
    if x is None or len(x) < 2:
        return None
    av = site.value_of("axis") if site.input_name("axis") else None
    a = int(av.reshape(-1)[0]) if av is not None and av.size else int(site.attr("axis", 1))
    a = a + len(x) if a < 0 else a
    return [x[a]] if 0 <= a < len(x) and x[a] else None


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
    import numpy as np

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
    import numpy as np

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
    import numpy as np

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
    import numpy as np

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


# ----------------------------------------------------------------------------- rules: value ranges
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
    import numpy as np

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
    import numpy as np

    if not site.shape or site.shape[-1] != 4:
        return None
    lead = site.shape[:-1]
    rng = site.rng
    a, b = rng.uniform(0.0, 0.6, size=(*lead, 2)), rng.uniform(0.05, 0.4, size=(*lead, 2))
    if int(site.attr("center_point_box", 0)):
        return np.concatenate([a + b / 2, b], axis=-1)
    return np.concatenate([a, a + b], axis=-1)


def _unit_interval(spec_op: str, what: str):
    def rule(site: InputSite):
        return site.uniform(0.0, 1.0)

    rule.__doc__ = f"{spec_op} ``{what}``: in [0, 1). Spec: {_SPEC.format(spec_op)}"
    return rule


def _dropout_ratio(site: InputSite):
    """Dropout ``ratio``: in [0, 0.5) (the spec's [0, 1)). Spec:
    https://onnx.ai/onnx/operators/onnx__Dropout.html."""
    return site.uniform(0.0, 0.5)


def _nms_max_boxes(site: InputSite):
    """NonMaxSuppression ``max_output_boxes_per_class``: in [0, N] (N boxes). Spec:
    https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html."""
    boxes = site.shape_of("boxes")
    n = boxes[1] if boxes is not None and len(boxes) == 3 and boxes[1] is not None else 10
    return site.ints(0, n + 1)


def _nonzero_divisor(spec_op: str):
    def rule(site: InputSite):
        import numpy as np

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
    import numpy as np

    x = site.shape_of("X")
    if not _known(x) or len(x) != 4 or len(site.shape) != 2 or site.shape[1] != 4:
        return None
    scale = float(site.attr("spatial_scale", 1.0)) or 1.0
    h, w = x[2] / scale, x[3] / scale
    n = site.shape[0]
    x1, y1 = site.rng.uniform(0, w * 0.5, size=n), site.rng.uniform(0, h * 0.5, size=n)
    x2, y2 = x1 + site.rng.uniform(0, w * 0.5, size=n), y1 + site.rng.uniform(0, h * 0.5, size=n)
    return np.stack([x1, y1, x2, y2], axis=1)


# ----------------------------------------------------------------------------- the table
def _reduce_ops():
    return ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
            "ReduceProd", "ReduceSum", "ReduceSumSquare")


#: (domain, op type, formal input name) -> rule. Domain "" is ai.onnx. Each rule's
#: docstring states its constraint and the spec page; docs/inputs.md has the table.
RULES: dict[tuple[str, str, str], Rule] = {
    # axes
    **{("", op, "axes"): _reduce_axes for op in _reduce_ops()},
    ("", "Squeeze", "axes"): _squeeze_axes,
    ("", "Unsqueeze", "axes"): _unsqueeze_axes,
    ("", "CumSum", "axis"): _single_axis("x", "CumSum"),
    ("", "CumProd", "axis"): _single_axis("x", "CumProd"),
    ("", "DFT", "axis"): _dft_axis,
    ("", "Pad", "axes"): _pad_axes,
    # indices
    ("", "Gather", "indices"): _indices_along_axis("data", "Gather"),
    ("", "GatherElements", "indices"): _indices_along_axis("data", "GatherElements"),
    ("", "ScatterElements", "indices"): _indices_along_axis("data", "ScatterElements", unique_if_no_reduction=True),
    ("", "Scatter", "indices"): _indices_along_axis("data", "Scatter", unique_if_no_reduction=True),
    ("", "GatherND", "indices"): _gathernd_indices(False, "GatherND"),
    ("", "ScatterND", "indices"): _gathernd_indices(True, "ScatterND"),
    ("", "OneHot", "depth"): _onehot_depth,
    ("", "OneHot", "indices"): _onehot_indices,
    ("", "TensorScatter", "write_indices"): _tensorscatter_indices,
    ("", "NegativeLogLikelihoodLoss", "target"): _bounded_by("input", 1, "NegativeLogLikelihoodLoss", "target"),
    ("", "SoftmaxCrossEntropyLoss", "labels"): _bounded_by("scores", 1, "SoftmaxCrossEntropyLoss", "labels"),
    ("", "RoiAlign", "batch_indices"): _bounded_by("X", 0, "RoiAlign", "batch_indices"),
    ("", "RotaryEmbedding", "position_ids"): _bounded_by("cos_cache", 0, "RotaryEmbedding", "position_ids"),
    ("ai.onnx.ml", "ArrayFeatureExtractor", "Y"): _bounded_by(
        "X", -1, "ArrayFeatureExtractor", "Y",
        "https://onnx.ai/onnx/operators/onnx_aionnxml_ArrayFeatureExtractor.html"),
    ("", "MaxUnpool", "I"): _maxunpool_indices,
    ("", "MaxUnpool", "output_shape"): _maxunpool_output_shape,
    ("", "ReverseSequence", "sequence_lens"): _seq_lens(_revseq_time, "ReverseSequence"),
    ("", "RNN", "sequence_lens"): _seq_lens(_rnn_time, "RNN"),
    ("", "GRU", "sequence_lens"): _seq_lens(_rnn_time, "GRU"),
    ("", "LSTM", "sequence_lens"): _seq_lens(_rnn_time, "LSTM"),
    ("", "Attention", "nonpad_kv_seqlen"): _attention_kv_len,
    ("", "Loop", "M"): _loop_trip_count,
    ("", "Loop", "cond"): _true,
    ("", "Compress", "condition"): _compress_condition,
    # shapes, sizes, counts
    ("", "Reshape", "shape"): _reshape_shape,
    ("", "Expand", "shape"): _expand_shape,
    ("", "ConstantOfShape", "input"): _constant_of_shape,
    ("", "Tile", "repeats"): _tile_repeats,
    ("", "Resize", "scales"): _resize_scales,
    ("", "Resize", "sizes"): _resize_sizes,
    ("", "Resize", "roi"): _resize_roi,
    ("", "Upsample", "scales"): _resize_scales,
    ("", "Range", "start"): _range_start,
    ("", "Range", "delta"): _range_delta,
    ("", "Range", "limit"): _range_limit,
    ("", "Slice", "starts"): _slice_inputs,
    ("", "Slice", "ends"): _slice_inputs,
    ("", "Slice", "axes"): _slice_inputs,
    ("", "Slice", "steps"): _slice_inputs,
    ("", "Pad", "pads"): _pad_pads,
    ("", "Split", "split"): _split_sizes,
    ("", "SplitToSequence", "split"): _split_to_sequence_sizes,
    ("", "CenterCropPad", "shape"): _center_crop_pad_shape,
    ("", "Col2Im", "image_shape"): _col2im_image_shape,
    ("", "Col2Im", "block_shape"): _col2im_block_shape,
    ("", "AffineGrid", "size"): _affine_grid_size,
    ("", "HannWindow", "size"): _window_size,
    ("", "HammingWindow", "size"): _window_size,
    ("", "BlackmanWindow", "size"): _window_size,
    ("", "MelWeightMatrix", "num_mel_bins"): _mel_num_bins,
    ("", "MelWeightMatrix", "dft_length"): _mel_dft_length,
    ("", "MelWeightMatrix", "sample_rate"): _mel_sample_rate,
    ("", "MelWeightMatrix", "lower_edge_hertz"): _mel_lower,
    ("", "MelWeightMatrix", "upper_edge_hertz"): _mel_upper,
    ("", "STFT", "frame_length"): _stft_frame_length,
    ("", "STFT", "frame_step"): _stft_frame_step,
    ("", "DFT", "dft_length"): _dft_length,
    ("", "TopK", "K"): _topk_k,
    ("", "StringSplit", "X"): _string_split_input,
    ("", "StringNormalizer", "X"): _string_normalizer_input,
    ("", "Unique", "X"): _unique_input,
    ("", "NonZero", "X"): _nonzero_input,
    # value ranges
    ("", "NonMaxSuppression", "boxes"): _nms_input(_nms_boxes),
    ("", "NonMaxSuppression", "scores"): _nms_input(_unit_interval("NonMaxSuppression", "scores")),
    ("", "NonMaxSuppression", "max_output_boxes_per_class"): _nms_input(_nms_max_boxes),
    ("", "NonMaxSuppression", "iou_threshold"): _nms_input(_unit_interval("NonMaxSuppression", "iou_threshold")),
    ("", "NonMaxSuppression", "score_threshold"): _nms_input(_unit_interval("NonMaxSuppression", "score_threshold")),
    ("", "Dropout", "ratio"): _dropout_ratio,
    ("", "Dropout", "training_mode"): _false,
    ("", "Bernoulli", "input"): _unit_interval("Bernoulli", "input"),
    ("", "Div", "B"): _nonzero_divisor("Div"),
    ("", "Mod", "B"): _nonzero_divisor("Mod"),
    ("", "BitShift", "Y"): _bitshift_amount,
    ("", "Pow", "Y"): _int_exponent,
    ("", "Clip", "min"): _clip_bound(False),
    ("", "Clip", "max"): _clip_bound(True),
    ("", "QuantizeLinear", "y_scale"): _positive_scale("QuantizeLinear", "y_scale"),
    ("", "DequantizeLinear", "x_scale"): _positive_scale("DequantizeLinear", "x_scale"),
    ("", "QLinearConv", "x_scale"): _positive_scale("QLinearConv", "x_scale"),
    ("", "QLinearConv", "w_scale"): _positive_scale("QLinearConv", "w_scale"),
    ("", "QLinearConv", "y_scale"): _positive_scale("QLinearConv", "y_scale"),
    ("", "QLinearMatMul", "a_scale"): _positive_scale("QLinearMatMul", "a_scale"),
    ("", "QLinearMatMul", "b_scale"): _positive_scale("QLinearMatMul", "b_scale"),
    ("", "QLinearMatMul", "y_scale"): _positive_scale("QLinearMatMul", "y_scale"),
    ("", "BatchNormalization", "input_var"): _variance,
    ("", "RoiAlign", "rois"): _roi_align_rois,
}


def make_inputs(layer_model: "onnx.ModelProto", settings: dict | None = None,  # noqa: F821
                input_ranges: dict[str, list[float]] | None = None) -> dict[str, "np.ndarray"]:  # noqa: F821
    """Deterministic random inputs for the run-time inputs of a layer model.

    Args:
        layer_model: single-layer model (or whole model) whose graph inputs carry
            static shapes (a 0 dim gives an empty array).
        settings: ``seed``, ``float_range``, ``int_range``, ``uint8_range``.
        input_ranges: per input name, a [low, high) range that replaces the
            dtype's range (``--quantize``: a float input is drawn in its calibrated
            range, an int8 input of a full-integer layer over all int8 values).

    Returns:
        Input name -> array, in graph input order. Floats are drawn uniformly and
        cast (bfloat16, float8, int4, ... through ml_dtypes), integers uniformly in
        [low, high), bools in {False, True}; inputs that an operator reads as
        indices, axes, shapes, sizes, scales, ... follow that operator's rule
        (:func:`torq_gen_config.input_generation.generate_inputs`, docs/inputs.md).

    Raises:
        ValueError: a graph input with a symbolic or unknown dim (named in the message).
    """
    return generate_inputs(layer_model, settings, input_ranges)
