"""Schema-aware narrowing of an ONNX model's element types: fp32 -> bf16, int64 -> int32.

One engine (:class:`_Narrower`) serves both conversions; it is parameterised by the
(wide, narrow) element-type pairs: ``FLOAT -> BFLOAT16``, or ``INT64 -> INT32`` plus
``UINT64 -> UINT32``.

Rules (seed: notes/reference_tool.md section 6; types: ONNX operator schemas via
``onnx.defs`` at the model's opset):

* Per node, every formal input/output parameter has a type string: a type
  constraint (``T``; its ``allowed_type_strs``) or a literal (``tensor(int64)``). A
  variadic last parameter covers the remaining actual inputs/outputs. A constraint
  shared by several parameters is decided once per node: narrow if the narrow type
  is allowed, else every parameter bound to it keeps the wide type.
* Graph inputs and outputs of a wide type become narrow (the seed's ``convert_io``).
* Constant producers (initializers, ``Constant``, ``ConstantOfShape``) and nodes
  whose output type is set by an attribute (``Cast.to``, ``dtype`` of
  ``EyeLike``/``Random*``/``Bernoulli``/``Multinomial``, ``output_datatype``,
  ``LayerNormalization.stash_type``) are narrowed unless every consumer requires the
  wide type (then they are left exactly as they are, with no Cast).
* Wherever the stored type of a tensor differs from what a consumer needs, one
  ``Cast`` per (tensor, target type) is inserted: narrow -> wide right before the
  first consumer that needs it, wide -> narrow right after the producer.
* Nodes with subgraph attributes (If/Loop/Scan/...), without a schema (custom
  domains, model-local functions) or with non-tensor inputs/outputs (sequences,
  optionals) are opaque: their subgraphs are not converted and their wide inputs,
  outer-scope references and outputs stay wide (Casts around them; outer-scope
  names inside a subgraph are renamed to the wide Cast's output when needed).
* int32 only: ``Slice`` parameters stay int64 although the schema allows int32
  (:data:`KEEP_INT64_INPUTS`, as the seed). INT64_MIN/INT64_MAX (UINT64 max)
  sentinels in constants are clamped to the 32-bit extremes and reported; any other
  out-of-range constant raises :class:`~torq_gen_config.errors.ModelError`.
* bf16 only: constants are rounded to nearest even; finite values beyond the bf16
  maximum (~3.39e38) are clamped to +-max instead of becoming inf (counted).
  ``LayerNormalization.stash_type`` becomes bf16 because its schema (constraint
  ``U`` of Mean/InvStdDev, opset 17+) allows bf16, as the seed does; it stays float
  if a consumer of Mean/InvStdDev requires float. ``Resize`` roi/scales stay fp32
  because their schema allows only float types there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, defs, helper, numpy_helper

from ..errors import ConfigError, ModelError

__all__ = [
    "BF16_OPSET",
    "KEEP_INT64_INPUTS",
    "convert_to_bf16",
    "convert_int64_to_int32",
    "widen_bf16_to_fp32",
    "round_to_bf16",
]

#: Minimum default-domain opset: bf16 Conv etc. exist in ONNX schemas from opset 22
#: (the seed upgrades to 22 for both conversions).
BF16_OPSET = 22

#: Inputs kept int64 by the int32 conversion although the schema allows int32 (as the
#: seed does): op_type -> input indices.
KEEP_INT64_INPUTS: dict[str, tuple[int, ...]] = {"Slice": (1, 2, 3, 4)}

#: Attributes holding an output element type (TensorProto enum) that the engine rewrites.
DTYPE_ATTRS = ("to", "dtype", "output_datatype", "output_dtype")

_BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
_I32 = np.iinfo(np.int32)
_I64 = np.iinfo(np.int64)
_U32 = np.iinfo(np.uint32)
_U64 = np.iinfo(np.uint64)

_TYPE_STR = {
    TensorProto.FLOAT: "tensor(float)",
    TensorProto.BFLOAT16: "tensor(bfloat16)",
    TensorProto.INT64: "tensor(int64)",
    TensorProto.INT32: "tensor(int32)",
    TensorProto.UINT64: "tensor(uint64)",
    TensorProto.UINT32: "tensor(uint32)",
}
_SHORT = {
    TensorProto.FLOAT: "fp32",
    TensorProto.BFLOAT16: "bf16",
    TensorProto.INT64: "int64",
    TensorProto.INT32: "int32",
    TensorProto.UINT64: "uint64",
    TensorProto.UINT32: "uint32",
}
_NON_TENSOR = -1  # marker in the type map for sequence/optional/map values


# --------------------------------------------------------------------------- public API


def round_to_bf16(array: np.ndarray, *, saturate: bool = False) -> np.ndarray:
    """Round float32 values to ``ml_dtypes.bfloat16``, round-to-nearest-even.

    Args:
        array: array-like of float32 (other float types are converted to float32 first).
        saturate: clamp finite values whose rounding overflows (|x| beyond the bf16
            maximum, ~3.39e38) to +-max instead of +-inf (used for constants, as the
            seed enforces only the bf16 maximum). inf and NaN are kept.

    Returns:
        An array of the same shape with dtype ``ml_dtypes.bfloat16``.

    Source: seed notes/reference_tool.md s6 (round-to-nearest-even, only the bf16
    maximum enforced); ``ml_dtypes``' float32 -> bfloat16 cast rounds to nearest even.
    """
    x = np.asarray(array, dtype=np.float32)
    r = x.astype(ml_dtypes.bfloat16)
    if saturate:
        over = np.isinf(r) & np.isfinite(x)
        if over.any():
            r = np.where(over, np.copysign(_BF16_MAX, x).astype(ml_dtypes.bfloat16), r)
    return r


def convert_to_bf16(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """Convert an fp32 model to bf16 (FLOAT -> BFLOAT16), keeping what the schemas require in fp32.

    Args:
        model: shape-inferred model at default-domain opset >= :data:`BF16_OPSET`;
            not modified.

    Returns:
        ``(converted_model, report)``; the report is JSON-safe: ``constants`` (per
        narrowed float constant: ``name``, ``kind``, ``values``, ``max_abs_error``,
        ``mean_abs_error``, ``rmse``, ``max_rel_error`` (over nonzero values, 0.0 if
        none), ``clamped_to_max``), ``casts_inserted``, ``kept_wide`` (``node``,
        ``op_type``, ``tensor``, ``reason``), ``io_converted`` and ``origin`` (per
        node of the converted model, the index of the input-model node it belongs to).

    Raises:
        ConfigError: the default-domain opset is below 22.
        ModelError: the converted model fails shape inference or
            ``onnx.checker.check_model(full_check=True)``.

    Rules: seed notes/reference_tool.md s6 (FP32Converter), ONNX schemas via onnx.defs;
    see the module docstring.
    """
    return _Narrower(model, {TensorProto.FLOAT: TensorProto.BFLOAT16}, {}, "bf16").run()


def convert_int64_to_int32(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """Convert INT64 -> INT32 and UINT64 -> UINT32 where the schemas allow it.

    Schema-required int64 (Reshape shape, Shape output, ...) and the inputs in
    :data:`KEEP_INT64_INPUTS` stay int64. Sentinels INT64_MIN/INT64_MAX (UINT64 max)
    in constants (initializers, Constant values, ConstantOfShape values) are clamped.

    Args:
        model: shape-inferred model at default-domain opset >= :data:`BF16_OPSET`;
            not modified.

    Returns:
        ``(converted_model, report)``: report keys ``clamped`` (``[{"name",
        "int64_min", "int64_max"}]``, uint64 tensors: ``{"name", "uint64_max"}``),
        ``casts_inserted``, ``kept_wide``, ``io_converted``, ``origin`` (as in
        :func:`convert_to_bf16`).

    Raises:
        ConfigError: the default-domain opset is below 22.
        ModelError: a constant holds a value outside the 32-bit range that is not a
            sentinel (the message names the tensor and the first offending value), or
            the converted model fails shape inference / the full checker.

    Rules: seed notes/reference_tool.md s6 (Int64Converter), ONNX schemas via onnx.defs.
    """
    pairs = {TensorProto.INT64: TensorProto.INT32, TensorProto.UINT64: TensorProto.UINT32}
    return _Narrower(model, pairs, KEEP_INT64_INPUTS, "int32").run()


def widen_bf16_to_fp32(model: onnx.ModelProto) -> onnx.ModelProto:
    """Exact inverse of the bf16 narrowing, for computing references with ONNX Runtime.

    Every BFLOAT16 tensor becomes FLOAT (exact upcast): graph inputs, outputs,
    value_info, initializers, tensor attributes (Constant values, ConstantOfShape
    value), ``Cast``/``dtype``-like attributes and ``LayerNormalization.stash_type``,
    in the main graph and in subgraphs. The model (opset 22 ops on float) runs in
    ONNX Runtime CPU, which has no bf16 Conv (notes/toolchain.md s5). References:
    run it on bf16-rounded inputs upcast to fp32, round the outputs with
    :func:`round_to_bf16`.

    Args:
        model: a model (typically from :func:`convert_to_bf16`); not modified.

    Returns:
        The widened model.

    Raises:
        ModelError: the widened model fails ``onnx.checker.check_model``.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _widen_graph(m.graph)
    for f in m.functions:
        for n in f.node:
            _widen_node(n)
    try:
        onnx.checker.check_model(m)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"widened fp32 model fails the ONNX checker: {_one_line(e)}") from None
    return m


# --------------------------------------------------------------------------- helpers


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:2000]


def _to_array(t: TensorProto) -> np.ndarray:
    """numpy_helper.to_array, with BFLOAT16 always as ml_dtypes.bfloat16 (onnx 1.23
    returns bfloat16; older versions returned the raw uint16 bits)."""
    a = numpy_helper.to_array(t)
    if t.data_type == TensorProto.BFLOAT16 and a.dtype != ml_dtypes.bfloat16:
        a = a.astype(np.uint16).view(ml_dtypes.bfloat16)
    return a


def _from_array(a: np.ndarray, name: str) -> TensorProto:
    return numpy_helper.from_array(np.asarray(a, order="C"), name)


def _bf16_stats(x: np.ndarray, r: np.ndarray, clamped: int) -> dict:
    """Errors of the bf16 rounding ``r`` of the fp32 values ``x`` (finite values only)."""
    x64 = x.astype(np.float64).ravel()
    r64 = r.astype(np.float64).ravel()
    fin = np.isfinite(x64)
    x64, r64 = x64[fin], r64[fin]
    out: dict[str, Any] = {"values": int(x.size)}
    if x64.size == 0:
        out.update(max_abs_error=0.0, mean_abs_error=0.0, rmse=0.0, max_rel_error=0.0)
    else:
        d = np.abs(r64 - x64)
        nz = x64 != 0
        out.update(
            max_abs_error=float(d.max()),
            mean_abs_error=float(d.mean()),
            rmse=float(math.sqrt(float(np.mean(d * d)))),
            max_rel_error=float((d[nz] / np.abs(x64[nz])).max()) if nz.any() else 0.0,
        )
    out["clamped_to_max"] = int(clamped)
    return out


def _widen_type(tp: onnx.TypeProto) -> None:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        if tp.tensor_type.elem_type == TensorProto.BFLOAT16:
            tp.tensor_type.elem_type = TensorProto.FLOAT
    elif kind == "sparse_tensor_type":
        if tp.sparse_tensor_type.elem_type == TensorProto.BFLOAT16:
            tp.sparse_tensor_type.elem_type = TensorProto.FLOAT
    elif kind == "sequence_type":
        _widen_type(tp.sequence_type.elem_type)
    elif kind == "optional_type":
        _widen_type(tp.optional_type.elem_type)
    elif kind == "map_type":
        _widen_type(tp.map_type.value_type)


def _widen_tensor(t: TensorProto) -> TensorProto:
    if t.data_type != TensorProto.BFLOAT16:
        return t
    return _from_array(_to_array(t).astype(np.float32), t.name)


def _widen_node(n: onnx.NodeProto) -> None:
    for a in n.attribute:
        if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.BFLOAT16:
            a.t.CopyFrom(_widen_tensor(a.t))
        elif a.type == onnx.AttributeProto.TENSORS:
            for t in a.tensors:
                if t.data_type == TensorProto.BFLOAT16:
                    t.CopyFrom(_widen_tensor(t))
        elif a.type == onnx.AttributeProto.INT and a.name in DTYPE_ATTRS + ("stash_type",) and a.i == TensorProto.BFLOAT16:
            a.i = TensorProto.FLOAT
        elif a.type == onnx.AttributeProto.GRAPH:
            _widen_graph(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                _widen_graph(g)
        elif a.type == onnx.AttributeProto.TYPE_PROTO:
            _widen_type(a.tp)


def _widen_graph(g: onnx.GraphProto) -> None:
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        _widen_type(vi.type)
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.BFLOAT16:
            g.initializer[i].CopyFrom(_widen_tensor(t))
    for n in g.node:
        _widen_node(n)


def _default_opset(model: onnx.ModelProto) -> int | None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return None


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _graph_defined(g: onnx.GraphProto) -> set[str]:
    names = {vi.name for vi in g.input} | {t.name for t in g.initializer}
    names |= {t.values.name for t in g.sparse_initializer}
    for n in g.node:
        names.update(o for o in n.output if o)
    return names


def _outer_refs(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph (and its nested subgraphs) reads from enclosing scopes."""
    defined = _graph_defined(g)
    refs: set[str] = set()
    for n in g.node:
        refs.update(i for i in n.input if i and i not in defined)
        for sg in _subgraphs(n):
            refs.update(r for r in _outer_refs(sg) if r not in defined)
    refs.update(o.name for o in g.output if o.name not in defined)
    return refs


def _rename_refs(g: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename outer-scope references inside a subgraph (names are unique across scopes)."""
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in mapping:
                n.input[k] = mapping[i]
        for sg in _subgraphs(n):
            _rename_refs(sg, mapping)
    for o in g.output:
        if o.name in mapping:
            o.name = mapping[o.name]


def _all_names(g: onnx.GraphProto, acc: set[str]) -> set[str]:
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        acc.add(vi.name)
    acc.update(t.name for t in g.initializer)
    for n in g.node:
        acc.add(n.name)
        acc.update(n.input)
        acc.update(n.output)
        for sg in _subgraphs(n):
            _all_names(sg, acc)
    return acc


# --------------------------------------------------------------------------- engine


class _Group:
    """Slots of one node bound to one type constraint (or one literal parameter)."""

    __slots__ = ("key", "allowed", "slots", "decision", "reason", "mechanism", "free")

    def __init__(self, key, allowed: set[str]):
        self.key = key
        self.allowed = allowed
        self.slots: list[tuple[str, int, str, str]] = []  # (io, index, tensor, formal name)
        self.decision: int | None = None  # element type the wide slots get
        self.reason = ""
        self.mechanism: str | None = None  # how an attribute-driven output type is rewritten
        self.free = False  # decided by the consumers (constant-like producers)


class _Narrower:
    """Generic narrowing engine: ``pairs`` maps each wide element type to its narrow type."""

    def __init__(self, model: onnx.ModelProto, pairs: dict[int, int], keep_inputs: dict[str, tuple[int, ...]], kind: str):
        self.src = model
        self.pairs = pairs
        self.keep_inputs = keep_inputs
        self.kind = kind

    # ---- setup -------------------------------------------------------------

    def run(self) -> tuple[onnx.ModelProto, dict]:
        opset = _default_opset(self.src)
        if opset is None or opset < BF16_OPSET:
            raise ConfigError(
                f"{self.kind} conversion needs the model at default-domain opset >= {BF16_OPSET} "
                f"(found {opset}); upgrade it with onnx.version_converter first")
        m = onnx.ModelProto()
        m.CopyFrom(self.src)
        try:
            m = onnx.shape_inference.infer_shapes(m)
        except Exception:  # keep the caller's value_info as is
            pass
        self.m = m
        self.g = m.graph
        self.opsets = {("ai.onnx" if o.domain == "" else o.domain): int(o.version) for o in m.opset_import}
        self.functions = {(f.domain, f.name) for f in m.functions}
        self.types = self._collect_types()
        self.nodes = list(self.g.node)
        self.init_names = {t.name for t in self.g.initializer}
        self.graph_inputs = [vi.name for vi in self.g.input if vi.name not in self.init_names]
        self.graph_outputs = [vi.name for vi in self.g.output]
        self.used_names = _all_names(self.g, set())
        self._schemas: dict[int, Any] = {}
        self.report: dict[str, Any] = {"casts_inserted": 0, "kept_wide": [], "io_converted": []}
        if self.kind == "bf16":
            self.report["constants"] = []
        else:
            self.report["clamped"] = []

        self._analyse_nodes()
        self._decide_free()
        self._stored_types()
        self._emit()
        self._fix_value_info()
        return self._finish()

    def _collect_types(self) -> dict[str, int]:
        types: dict[str, int] = {}
        for vi in list(self.g.input) + list(self.g.value_info) + list(self.g.output):
            t = vi.type
            if t.WhichOneof("value") == "tensor_type":
                if t.tensor_type.elem_type:
                    types[vi.name] = t.tensor_type.elem_type
            else:
                types[vi.name] = _NON_TENSOR
        for t in self.g.initializer:
            types[t.name] = t.data_type
        for n in self.g.node:  # Constant outputs even without value_info
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output and n.output[0] not in types:
                for a in n.attribute:
                    if a.name == "value":
                        types[n.output[0]] = a.t.data_type
                    elif a.name in ("value_float", "value_floats"):
                        types[n.output[0]] = TensorProto.FLOAT
                    elif a.name in ("value_int", "value_ints"):
                        types[n.output[0]] = TensorProto.INT64
        return types

    def _is_wide(self, name: str) -> bool:
        return bool(name) and self.types.get(name) in self.pairs

    def _node_label(self, i: int) -> str:
        n = self.nodes[i]
        return n.name or f"{n.op_type}#{i}"

    # ---- pass 1: per-node requirements ------------------------------------

    def _analyse_nodes(self) -> None:
        """Per node: the element type each wide input needs and each wide output gets."""
        self.in_req: list[dict[int, int]] = []  # node -> {input index: required type}
        self.implicit: list[set[str]] = []  # node -> wide outer-scope refs of its subgraphs
        self.out_group: list[dict[int, _Group]] = []  # node -> {output index: group}
        self.groups: list[list[_Group]] = []
        self.consumers: dict[str, list[tuple[int, int | None, int]]] = defaultdict(list)
        for i, n in enumerate(self.nodes):
            groups, opaque = self._node_groups(i, n)
            reqs: dict[int, int] = {}
            outs: dict[int, _Group] = {}
            imp: set[str] = set()
            if opaque is not None:
                for j, t in enumerate(n.input):
                    if self._is_wide(t):
                        reqs[j] = self.types[t]
                        self._kept(i, t, opaque)
                for sg in _subgraphs(n):
                    imp.update(r for r in _outer_refs(sg) if self._is_wide(r))
                for t in imp:
                    self._kept(i, t, f"{opaque} (outer-scope reference)")
                for j, t in enumerate(n.output):
                    if self._is_wide(t):
                        g = _Group(("opaque", j), set())
                        g.slots.append(("out", j, t, t))
                        g.decision = self.types[t]
                        g.reason = opaque
                        outs[j] = g
                        self._kept(i, t, opaque)
                groups = list(outs.values())
            else:
                for g in groups:
                    self._decide_group(i, n, g)
                    for io, j, t, _ in g.slots:
                        if not self._is_wide(t):
                            continue
                        if io == "in":
                            reqs[j] = g.decision if g.decision is not None else self.types[t]
                        else:
                            outs[j] = g
            self.in_req.append(reqs)
            self.implicit.append(imp)
            self.out_group.append(outs)
            self.groups.append(groups)
            for j, typ in reqs.items():
                self.consumers[n.input[j]].append((i, j, typ))
            for t in imp:
                self.consumers[t].append((i, None, self.types[t]))
        for t in self.graph_outputs:
            if self._is_wide(t):
                self.consumers[t].append((-1, None, self.pairs[self.types[t]]))

    def _kept(self, i: int | None, tensor: str, reason: str) -> None:
        if i is None:
            node, op = None, "initializer"
        else:
            node, op = self._node_label(i), self.nodes[i].op_type
        self.report["kept_wide"].append({"node": node, "op_type": op, "tensor": tensor, "reason": reason})

    def _node_groups(self, i: int, n: onnx.NodeProto) -> tuple[list[_Group], str | None]:
        """Group the node's present slots by type constraint; or the reason it is opaque."""
        domain = n.domain or "ai.onnx"
        if _subgraphs(n):
            return [], f"{n.op_type} has subgraph attributes; its subgraphs are not converted"
        if (n.domain, n.op_type) in self.functions:
            return [], f"{n.op_type} is a model-local function; its body is not converted"
        version = self.opsets.get(domain)
        try:
            schema = defs.get_schema(n.op_type, version if version is not None else 1, "" if domain == "ai.onnx" else domain)
        except defs.SchemaError:
            return [], f"no ONNX schema for {domain}::{n.op_type} at opset {version}"
        if any(self.types.get(t) == _NON_TENSOR for t in list(n.input) + list(n.output) if t):
            return [], f"{n.op_type} has non-tensor (sequence/optional) inputs or outputs"
        tc = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        groups: dict[Any, _Group] = {}

        def add(io: str, formals, actual) -> None:
            if not formals:
                return
            last = formals[-1]
            variadic = last.option == defs.OpSchema.FormalParameterOption.Variadic
            for j, t in enumerate(actual):
                if j < len(formals):
                    p = formals[j]
                elif variadic:
                    p = last
                else:
                    continue
                if not t:
                    continue
                if p.type_str in tc:
                    key: Any = p.type_str
                    if p.option == defs.OpSchema.FormalParameterOption.Variadic and not p.is_homogeneous:
                        key = (p.type_str, io, j)
                    allowed = tc[p.type_str]
                else:
                    key, allowed = ("literal", io, j), {p.type_str}
                g = groups.get(key)
                if g is None:
                    g = groups[key] = _Group(key, allowed)
                g.slots.append((io, j, t, p.name))

        add("in", list(schema.inputs), list(n.input))
        add("out", list(schema.outputs), list(n.output))
        # LayerNormalization: the Mean/InvStdDev constraint follows stash_type even with no such outputs.
        if n.op_type == "LayerNormalization" and TensorProto.FLOAT in self.pairs:
            ukey = schema.outputs[1].type_str if len(schema.outputs) > 1 else None
            if ukey in tc and ukey not in groups:
                groups[ukey] = _Group(ukey, tc[ukey])
        self._schemas[i] = schema
        return list(groups.values()), None

    def _mechanism(self, i: int, n: onnx.NodeProto, g: _Group) -> str | None:
        """How the type of an attribute-driven output group can be rewritten, or None."""
        schema = self._schemas[i]
        attrs = {a.name: a for a in n.attribute}
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            if any(k in attrs for k in ("value", "value_float", "value_floats", "value_int", "value_ints")):
                return "constant"
            return None
        if n.op_type == "ConstantOfShape" and n.domain in ("", "ai.onnx"):
            return "constant_of_shape"
        if n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx"):
            if len(schema.outputs) > 1 and g.key == schema.outputs[1].type_str:
                return "stash_type"
            return None
        for name in DTYPE_ATTRS:
            a = schema.attributes.get(name)
            if a is not None and a.type == defs.OpSchema.AttrType.INT:
                return f"attr:{name}"
        return None

    def _decide_group(self, i: int, n: onnx.NodeProto, g: _Group) -> None:
        wide_slots = [s for s in g.slots if self._is_wide(s[2])]
        if not g.slots:  # LayerNormalization's Mean/InvStdDev constraint with no such outputs
            wide = TensorProto.FLOAT
            stash = next((a.i for a in n.attribute if a.name == "stash_type"), 1)
            if stash != wide:
                return
        elif not wide_slots:
            return
        else:
            wide = self.types[wide_slots[0][2]]
        narrow = self.pairs[wide]
        op = n.op_type
        keep = self.keep_inputs.get(op, ())
        kept = [s for s in g.slots if s[0] == "in" and s[1] in keep]
        if kept:
            g.decision = wide
            names = ", ".join(f"'{s[3]}'" for s in kept)
            g.reason = (f"{op} input(s) {names} kept {_TYPE_STR[wide]} although the schema allows "
                        f"{_TYPE_STR[narrow]} (KEEP_INT64_INPUTS, as the seed)")
        elif _TYPE_STR[narrow] not in g.allowed:
            g.decision = wide
            io, _, _, pname = wide_slots[0] if wide_slots else ("out", 0, "", "?")
            what = "input" if io == "in" else "output"
            if isinstance(g.key, tuple) and g.key[0] == "literal":
                g.reason = f"schema of {op} {what} '{pname}' allows only {next(iter(g.allowed))}"
            else:
                tstr = g.key if isinstance(g.key, str) else g.key[0]
                g.reason = f"schema of {op} {what} '{pname}' (type constraint {tstr}) does not allow {_TYPE_STR[narrow]}"
        elif any(s[0] == "in" for s in g.slots):
            g.decision = narrow
        else:  # output type set by attributes
            g.mechanism = self._mechanism(i, n, g)
            if g.mechanism is None:
                g.decision = wide
                g.reason = f"output type of {op} is set by attributes the converter does not rewrite"
            else:
                g.free = True
                g.decision = narrow  # provisional; _decide_free may keep it wide
        if g.decision == wide and not g.free:
            for io, j, t, _ in wide_slots:
                self._kept(i, t, g.reason)

    # ---- pass 2: constant-like producers ----------------------------------

    def _all_consumers_wide(self, tensors: list[str]) -> bool:
        cons = [c for t in tensors for c in self.consumers.get(t, [])]
        return bool(cons) and all(c[0] >= 0 and c[2] in self.pairs for c in cons)

    def _decide_free(self) -> None:
        for i, groups in enumerate(self.groups):
            for g in groups:
                if not g.free:
                    continue
                outs = [s[2] for s in g.slots if s[0] == "out"]
                wide = next((self.types[t] for t in outs if self._is_wide(t)), TensorProto.FLOAT)
                if self._all_consumers_wide(outs):
                    g.decision = wide
                    g.reason = f"every consumer requires {_TYPE_STR[wide]}"
                    for t in outs:
                        self._kept(i, t, g.reason)
                else:
                    g.decision = self.pairs[wide]

    # ---- pass 3: stored types ---------------------------------------------

    def _stored_types(self) -> None:
        self.stored: dict[str, int] = {}
        self.stored_name: dict[str, str] = {}
        self.producer: dict[str, int] = {}
        for t in self.graph_inputs:
            if self._is_wide(t):
                self.stored[t] = self.pairs[self.types[t]]
                self.report["io_converted"].append(t)
        self.narrow_inits: set[str] = set()
        for t in self.g.initializer:
            if t.data_type in self.pairs:
                if self._all_consumers_wide([t.name]):
                    self.stored[t.name] = t.data_type
                    self._kept(None, t.name, f"every consumer requires {_TYPE_STR[t.data_type]}")
                else:
                    self.stored[t.name] = self.pairs[t.data_type]
                    self.narrow_inits.add(t.name)
        for i, outs in enumerate(self.out_group):
            for j, g in outs.items():
                t = self.nodes[i].output[j]
                self.stored[t] = g.decision
                self.producer[t] = i
        for t in self.graph_outputs:
            if self._is_wide(t) and t not in self.report["io_converted"]:
                self.report["io_converted"].append(t)
        for t in self.stored:
            self.stored_name[t] = t
        # A graph output whose producer must stay wide: the producer writes <t>__<wide>
        # and a Cast writes the graph output name.
        self.renamed: dict[str, str] = {}
        for t in self.graph_outputs:
            if self._is_wide(t) and self.stored.get(t) == self.types[t] and t in self.producer:
                new = self._unique(f"{t}__{_SHORT[self.types[t]]}")
                self.stored_name[t] = new
                self.renamed[t] = new

    def _unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.used_names:
            name = f"{base}_{k}"
            k += 1
        self.used_names.add(name)
        return name

    # ---- pass 4: rewrite and emit ------------------------------------------

    def _emit(self) -> None:
        self.new_nodes: list[onnx.NodeProto] = []
        self.origin: list[int] = []
        self.cast_cache: dict[tuple[str, int], str] = {}

        for k, init in enumerate(self.g.initializer):
            if init.name in self.narrow_inits:
                self.g.initializer[k].CopyFrom(self._narrow_tensor(init, init.name, "initializer"))

        for i, n in enumerate(self.nodes):
            orig_outputs = list(n.output)
            for j, typ in self.in_req[i].items():
                n.input[j] = self._resolve(n.input[j], typ, i)
            if self.implicit[i]:
                mapping = {}
                for t in self.implicit[i]:
                    r = self._resolve(t, self.types[t], i)
                    if r != t:
                        mapping[t] = r
                if mapping:
                    for sg in _subgraphs(n):
                        _rename_refs(sg, mapping)
            self._rewrite_attributes(i, n)
            for j, t in enumerate(n.output):
                if t in self.renamed and self.producer.get(t) == i:
                    n.output[j] = self.renamed[t]
            self.new_nodes.append(n)
            self.origin.append(i)
            # output Casts (wide producer, narrow consumers)
            for j, g in self.out_group[i].items():
                t = orig_outputs[j]
                wide = self.types[t]
                if g.decision != wide:
                    continue
                narrow = self.pairs[wide]
                if any(c[2] == narrow for c in self.consumers.get(t, [])):
                    out = t if t in self.renamed else self._unique(f"{t}__to_{_SHORT[narrow]}")
                    self._cast(self.stored_name[t], out, narrow, i)
                    self.cast_cache[(t, narrow)] = out

    def _resolve(self, t: str, target: int, consumer: int) -> str:
        """Name of ``t`` in element type ``target``, inserting an input Cast if needed."""
        if self.stored.get(t, target) == target:
            return self.stored_name.get(t, t)
        key = (t, target)
        if key not in self.cast_cache:
            out = self._unique(f"{t}__to_{_SHORT[target]}")
            self._cast(self.stored_name.get(t, t), out, target, consumer)
            self.cast_cache[key] = out
        return self.cast_cache[key]

    def _cast(self, src: str, dst: str, to: int, owner: int) -> None:
        name = self._unique(f"Cast__{dst}")
        self.new_nodes.append(helper.make_node("Cast", [src], [dst], name=name, to=to))
        self.origin.append(owner)
        self.report["casts_inserted"] += 1

    def _rewrite_attributes(self, i: int, n: onnx.NodeProto) -> None:
        for g in self.groups[i]:
            if g.mechanism is None or g.decision is None:
                continue
            narrowed = g.decision in self.pairs.values()
            out = n.output[0] if n.output else ""
            if g.mechanism == "constant" and narrowed:
                self._narrow_constant_node(n, out)
            elif g.mechanism == "constant_of_shape" and narrowed:
                a = next((a for a in n.attribute if a.name == "value"), None)
                if a is None:  # default value: float 0
                    n.attribute.append(helper.make_attribute("value", _from_array(np.zeros(1, dtype=np.float32), "")))
                    a = n.attribute[-1]
                a.t.CopyFrom(self._narrow_tensor(a.t, out, "ConstantOfShape"))
            elif g.mechanism == "stash_type" and narrowed:
                a = next((a for a in n.attribute if a.name == "stash_type"), None)
                if a is None:
                    n.attribute.append(helper.make_attribute("stash_type", g.decision))
                else:
                    a.i = g.decision
            elif g.mechanism.startswith("attr:"):
                name = g.mechanism[5:]
                a = next((a for a in n.attribute if a.name == name), None)
                if a is not None:
                    if a.i in self.pairs or narrowed:
                        a.i = g.decision
                else:
                    default = self._schemas[i].attributes[name].default_value
                    has_default = default.type != 0
                    if narrowed or not has_default:
                        n.attribute.append(helper.make_attribute(name, g.decision))

    def _narrow_constant_node(self, n: onnx.NodeProto, out: str) -> None:
        attrs = {a.name: a for a in n.attribute}
        if "value" in attrs:
            src = attrs["value"].t
        elif "value_float" in attrs:
            src = _from_array(np.array(attrs["value_float"].f, dtype=np.float32), "")
        elif "value_floats" in attrs:
            src = _from_array(np.array(list(attrs["value_floats"].floats), dtype=np.float32), "")
        elif "value_int" in attrs:
            src = _from_array(np.array(attrs["value_int"].i, dtype=np.int64), "")
        else:
            src = _from_array(np.array(list(attrs["value_ints"].ints), dtype=np.int64), "")
        if src.data_type not in self.pairs:
            return
        new = self._narrow_tensor(src, out, "Constant")
        new.name = src.name
        for k in [k for k, a in enumerate(n.attribute) if a.name.startswith("value")][::-1]:
            del n.attribute[k]
        n.attribute.append(helper.make_attribute("value", new))

    def _narrow_tensor(self, t: TensorProto, report_name: str, kind: str) -> TensorProto:
        """The narrow copy of a wide constant tensor (statistics / clamping reported)."""
        a = _to_array(t)
        if t.data_type == TensorProto.FLOAT:
            x = a.astype(np.float32)
            r = round_to_bf16(x, saturate=True)
            clamped = int(np.count_nonzero(np.isinf(x.astype(ml_dtypes.bfloat16)) & np.isfinite(x)))
            self.report["constants"].append({"name": report_name, "kind": kind, **_bf16_stats(x, r, clamped)})
            out = _from_array(r, t.name)
        elif t.data_type == TensorProto.INT64:
            lo, hi = a == _I64.min, a == _I64.max
            bad = ~(lo | hi) & ((a < _I32.min) | (a > _I32.max))
            if bad.any():
                v = int(a[bad].ravel()[0])
                raise ModelError(f"int32 conversion: {kind} '{report_name}' holds {v}, outside the int32 range "
                                 f"(only INT64_MIN/INT64_MAX sentinels are clamped)")
            r = np.clip(a, _I32.min, _I32.max).astype(np.int32)
            if lo.any() or hi.any():
                self.report["clamped"].append({"name": report_name, "int64_min": int(lo.sum()), "int64_max": int(hi.sum())})
            out = _from_array(r, t.name)
        elif t.data_type == TensorProto.UINT64:
            hi = a == _U64.max
            bad = ~hi & (a > _U32.max)
            if bad.any():
                v = int(a[bad].ravel()[0])
                raise ModelError(f"int32 conversion: {kind} '{report_name}' holds {v}, outside the uint32 range "
                                 f"(only the UINT64 max sentinel is clamped)")
            r = np.minimum(a, _U32.max).astype(np.uint32)
            if hi.any():
                self.report["clamped"].append({"name": report_name, "uint64_max": int(hi.sum())})
            out = _from_array(r, t.name)
        else:  # pragma: no cover - callers only pass wide tensors
            return t
        return out

    # ---- pass 5: types, inference, check ----------------------------------

    def _fix_value_info(self) -> None:
        g = self.g
        del g.node[:]
        g.node.extend(self.new_nodes)
        final: dict[str, int] = dict(self.stored)
        for t, new in self.renamed.items():
            final[t] = self.pairs[self.types[t]]
            final[new] = self.types[t]
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.name in final and vi.type.WhichOneof("value") == "tensor_type":
                vi.type.tensor_type.elem_type = final[vi.name]
        for t, new in self.renamed.items():
            src = next((vi for vi in list(g.value_info) + list(g.output) if vi.name == t), None)
            if src is not None:
                vi = g.value_info.add()
                vi.CopyFrom(src)
                vi.name = new
                vi.type.tensor_type.elem_type = self.types[t]

    def _finish(self) -> tuple[onnx.ModelProto, dict]:
        try:
            m = onnx.shape_inference.infer_shapes(self.m, check_type=True, strict_mode=True)
        except Exception as e:
            raise ModelError(f"{self.kind} conversion produced a model that fails shape inference: {_one_line(e)}") from None
        try:
            onnx.checker.check_model(m, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            raise ModelError(f"{self.kind} conversion produced a model that fails the ONNX checker: {_one_line(e)}") from None
        self.report["origin"] = list(self.origin)
        return m, self.report
