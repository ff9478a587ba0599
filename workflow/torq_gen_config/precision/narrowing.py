"""Schema-aware narrowing of an ONNX model's element types: fp32 -> bf16, int64 -> int32.

One engine (:class:`_Narrower`) serves both conversions; it is parameterised by the
(wide, narrow) element-type pairs: ``FLOAT -> BFLOAT16``, or ``INT64 -> INT32`` plus
``UINT64 -> UINT32``.

Rules (the original tool's, docs/original_tool.md, 'Dtype conversion'; types: ONNX operator schemas via
``onnx.defs`` at the model's opset):

* Per node, every formal input/output parameter has a type string: a type
  constraint (``T``; its ``allowed_type_strs``) or a literal (``tensor(int64)``). A
  variadic last parameter covers the remaining actual inputs/outputs. A constraint
  shared by several parameters is decided once per node: narrow if the narrow type
  is allowed, else every parameter bound to it keeps the wide type.
* Graph inputs and outputs of a wide type become narrow (the original tool's ``convert_io``).
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
  (:data:`KEEP_INT64_INPUTS`, as the original tool). INT64_MIN/INT64_MAX (UINT64 max)
  sentinels in constants are clamped to the 32-bit extremes and reported; any other
  out-of-range constant raises :class:`~torq_gen_config.core.errors.ModelError`.
* bf16 only: constants are rounded to nearest even; finite values beyond the bf16
  maximum (~3.39e38) are clamped to +-max instead of becoming inf (counted).
  ``LayerNormalization.stash_type`` becomes bf16 because its schema (constraint
  ``U`` of Mean/InvStdDev, opset 17+) allows bf16, as the original tool does; it stays float
  if a consumer of Mean/InvStdDev requires float. ``Resize`` roi/scales stay fp32
  because their schema allows only float types there.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any


from ..core.errors import ConfigError, ModelError
from ..core.lazy import helper, ml_dtypes, np, onnx
from .bf16_rounding import _bf16_stats, round_to_bf16
from .narrowing_plan import _SHORT, _NarrowingPlan
from .onnx_graph import _all_names, _default_opset, _from_array, _one_line, _rename_refs, _subgraphs, _to_array

#: Minimum default-domain opset: bf16 Conv etc. exist in ONNX schemas from opset 22
#: (the original tool upgrades to 22 for both conversions).
BF16_OPSET = 22

#: Inputs kept int64 by the int32 conversion although the schema allows int32 (as the
#: seed does): op_type -> input indices.
KEEP_INT64_INPUTS: dict[str, tuple[int, ...]] = {"Slice": (1, 2, 3, 4)}

# np.iinfo(np.int32) ... (their min and max), written out so that importing this module does not
# load numpy (core/lazy.py; tests/unit/test_imports.py checks them)
_IntRange = namedtuple("_IntRange", "min max")
_I32 = _IntRange(-(2**31), 2**31 - 1)
_I64 = _IntRange(-(2**63), 2**63 - 1)
_U32 = _IntRange(0, 2**32 - 1)
_U64 = _IntRange(0, 2**64 - 1)


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

    Rules: the original tool's ``FP32Converter`` (docs/original_tool.md, 'Dtype
    conversion'), ONNX schemas via onnx.defs;
    see the module docstring.
    """
    return _Narrower(model, {onnx.TensorProto.FLOAT: onnx.TensorProto.BFLOAT16}, {}, "bf16").run()


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

    Rules: the original tool's ``Int64Converter`` (docs/original_tool.md, 'Dtype
    conversion'), ONNX schemas via onnx.defs.
    """
    pairs = {onnx.TensorProto.INT64: onnx.TensorProto.INT32, onnx.TensorProto.UINT64: onnx.TensorProto.UINT32}
    return _Narrower(model, pairs, KEEP_INT64_INPUTS, "int32").run()


class _Narrower(_NarrowingPlan):
    """Generic narrowing engine: ``pairs`` maps each wide element type to its narrow type.

    Passes 1-3 (what each tensor needs and gets) are :class:`~.narrowing_plan._NarrowingPlan`;
    passes 4-5 (rewrite, emit the Casts, fix types, check) are here."""

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

    def _narrow_tensor(self, t: onnx.TensorProto, report_name: str, kind: str) -> onnx.TensorProto:
        """The narrow copy of a wide constant tensor (statistics / clamping reported)."""
        a = _to_array(t)
        if t.data_type == onnx.TensorProto.FLOAT:
            x = a.astype(np.float32)
            r = round_to_bf16(x, saturate=True)
            clamped = int(np.count_nonzero(np.isinf(x.astype(ml_dtypes.bfloat16)) & np.isfinite(x)))
            self.report["constants"].append({"name": report_name, "kind": kind, **_bf16_stats(x, r, clamped)})
            out = _from_array(r, t.name)
        elif t.data_type == onnx.TensorProto.INT64:
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
        elif t.data_type == onnx.TensorProto.UINT64:
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
