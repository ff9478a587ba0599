"""Planning of the schema-aware dtype narrowing (passes 1-3 of :mod:`.narrowing`):
per node, which element type each input/output slot needs under the ONNX operator
schemas; which constant-like producers narrow; which type each tensor is stored in.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..core.lazy import onnx
from .onnx_graph import DTYPE_ATTRS, _outer_refs, _subgraphs


# onnx.TensorProto's element types (numbers fixed by the ONNX standard), written out so that
# importing this module does not load onnx (core/lazy.py; tests/unit/test_imports.py checks them)
_FLOAT, _INT32, _INT64, _UINT32, _UINT64, _BFLOAT16 = 1, 6, 7, 12, 13, 16
_TYPE_STR = {
    _FLOAT: "tensor(float)",
    _BFLOAT16: "tensor(bfloat16)",
    _INT64: "tensor(int64)",
    _INT32: "tensor(int32)",
    _UINT64: "tensor(uint64)",
    _UINT32: "tensor(uint32)",
}
_SHORT = {
    _FLOAT: "fp32",
    _BFLOAT16: "bf16",
    _INT64: "int64",
    _INT32: "int32",
    _UINT64: "uint64",
    _UINT32: "uint32",
}
_NON_TENSOR = -1  # marker in the type map for sequence/optional/map values


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


class _NarrowingPlan:
    """Passes 1-3 of the narrowing engine (:class:`~.narrowing._Narrower` runs them,
    then rewrites the graph): the element type every node slot needs, the decision for
    constant-like producers, the stored type of every tensor. ``pairs`` maps each wide
    element type to its narrow type."""

    def __init__(self, model: onnx.ModelProto, pairs: dict[int, int], keep_inputs: dict[str, tuple[int, ...]], kind: str):
        self.src = model
        self.pairs = pairs
        self.keep_inputs = keep_inputs
        self.kind = kind

    # ---- setup -------------------------------------------------------------
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
                        types[n.output[0]] = onnx.TensorProto.FLOAT
                    elif a.name in ("value_int", "value_ints"):
                        types[n.output[0]] = onnx.TensorProto.INT64
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
            schema = onnx.defs.get_schema(n.op_type, version if version is not None else 1,
                                          "" if domain == "ai.onnx" else domain)
        except onnx.defs.SchemaError:
            return [], f"no ONNX schema for {domain}::{n.op_type} at opset {version}"
        if any(self.types.get(t) == _NON_TENSOR for t in list(n.input) + list(n.output) if t):
            return [], f"{n.op_type} has non-tensor (sequence/optional) inputs or outputs"
        tc = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        groups: dict[Any, _Group] = {}

        def add(io: str, formals, actual) -> None:
            if not formals:
                return
            last = formals[-1]
            variadic = last.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
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
                    if p.option == onnx.defs.OpSchema.FormalParameterOption.Variadic and not p.is_homogeneous:
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
        if n.op_type == "LayerNormalization" and onnx.TensorProto.FLOAT in self.pairs:
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
            if a is not None and a.type == onnx.defs.OpSchema.AttrType.INT:
                return f"attr:{name}"
        return None

    def _decide_group(self, i: int, n: onnx.NodeProto, g: _Group) -> None:
        wide_slots = [s for s in g.slots if self._is_wide(s[2])]
        if not g.slots:  # LayerNormalization's Mean/InvStdDev constraint with no such outputs
            wide = onnx.TensorProto.FLOAT
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
                        f"{_TYPE_STR[narrow]} (KEEP_INT64_INPUTS, as the original tool)")
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
                wide = next((self.types[t] for t in outs if self._is_wide(t)), onnx.TensorProto.FLOAT)
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
