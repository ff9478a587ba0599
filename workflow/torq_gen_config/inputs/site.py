"""What a rule reads: the model's shapes and constants (:class:`_Graph`) and one graph
input as one node's input (:class:`InputSite`)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable

from ..core.lazy import helper, np, numpy_helper, onnx
from .tensor_types import _dims, _int_info, _is_float, _is_int


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

        a = None
        if name in self._tensors:
            a = numpy_helper.to_array(self._tensors[name])
        elif name in self._constants:
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
    formals = [f.name for f in schema.inputs]
    if not formals:
        return []
    last_variadic = schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
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
    rank is unknown. ``gen`` is the generator (:class:`.generate._Generator`: rng, values,
    memo), not imported here so that this module stays below it."""

    def __init__(self, gen, name: str, shape: tuple, dtype, node, position: int,
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
        return self.rng.uniform(low, high, size=self.shape).astype(np.float32).astype(self.dtype)

    def data(self) -> "np.ndarray":
        """The plain per-dtype values (what an input without a rule gets)."""
        return self.gen.data(self.name, self.shape, self.dtype)

    def data_range(self) -> tuple[float, float]:
        """[low, high) of :meth:`data` for this input (its ``input_ranges`` entry, else
        the dtype's configured range, clipped to the dtype)."""
        return self.gen.data_range(self.name, self.dtype)


Rule = Callable[[InputSite], Any]
