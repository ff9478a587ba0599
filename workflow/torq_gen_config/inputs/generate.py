"""The generator: one seeded stream, graph inputs in order, each input's value from the
first consuming node whose rule gives one (:data:`~torq_gen_config.inputs.rules.RULES`),
else plain per-dtype values."""

from __future__ import annotations

import math
from typing import Any

from ..core.lazy import np, onnx
from ..core.ort_io import numpy_dtype
from .rules import RULES
from .site import InputSite, _formal_names, _Graph
from .tensor_types import _int_info, _is_int, input_shape


#: string inputs: characters and length range [1, 8]
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


#: Default value ranges per dtype class, [low, high) (config ``inputs``).
DEFAULT_INPUT_SETTINGS = {"seed": 1234, "float_range": [-1.0, 1.0], "int_range": [-40, 40], "uint8_range": [0, 80]}


class _Generator:
    def __init__(self, model, settings: dict, input_ranges: dict | None):
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
        per byte; :mod:`torq_gen_config.core.ort_io` packs them for ONNX Runtime);
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
        (:func:`generate_inputs`, docs/inputs.md).

    Raises:
        ValueError: a graph input with a symbolic or unknown dim (named in the message).
    """
    return generate_inputs(layer_model, settings, input_ranges)
