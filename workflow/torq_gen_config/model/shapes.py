"""Every tensor's shape and dtype, before the layer split.

Three sources, in order (DESIGN.md, "What a verdict rests on"):

1. static shape inference (``onnx.shape_inference.infer_shapes`` with data propagation);
2. constant folding fed back into inference: folded values (a ``Shape -> Slice ->
   Concat`` target of a ``Reshape``, say) become initializers of a copy of the model,
   inference runs again and what it learns is copied back; repeated until nothing
   changes, since each round can let more ``Shape`` nodes fold;
3. for what is still unknown, the types observed in the whole-model reference run
   (:mod:`torq_gen_config.reference.model_run`), written as value_info by :func:`apply_observed_types`.

Zero-size dims are dims (``dim_value`` 0 is static). A tensor whose type stays unknown
makes the layers that read or write it "not testable" (:mod:`torq_gen_config.model.split`).
"""

from __future__ import annotations

from typing import Mapping

from ..core.lazy import helper, numpy_helper, onnx
from .folding import fold_constants
from .graph import copy_proto
from ..core.limits import NOTE_CHARS

#: Most inference/folding rounds of :func:`complete_static_shapes`.
MAX_ROUNDS = 8


def type_is_complete(tp) -> bool:
    """True for a tensor ``onnx.TypeProto`` with an element type and a fully static shape."""
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return False
    tt = tp.tensor_type
    return bool(tt.elem_type) and tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)


def _score(tp) -> tuple[int, int, int]:
    """How much of a type is known: (element type, rank, static dims)."""
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return (0, 0, 0) if tp is None or tp.WhichOneof("value") is None else (1, 1, 0)
    tt = tp.tensor_type
    has_shape = tt.HasField("shape")
    return (int(bool(tt.elem_type)), int(has_shape),
            sum(1 for d in tt.shape.dim if d.HasField("dim_value")) if has_shape else 0)


def _consistent(old, new) -> bool:
    """``new`` does not contradict what ``old`` states (element type, rank, static dims)."""
    if old is None or old.WhichOneof("value") != "tensor_type" or new.WhichOneof("value") != "tensor_type":
        return True
    a, b = old.tensor_type, new.tensor_type
    if a.elem_type and b.elem_type and a.elem_type != b.elem_type:
        return False
    if a.HasField("shape") and b.HasField("shape"):
        if len(a.shape.dim) != len(b.shape.dim):
            return False
        for x, y in zip(a.shape.dim, b.shape.dim):
            if x.HasField("dim_value") and y.HasField("dim_value") and x.dim_value != y.dim_value:
                return False
    return True


def runtime_tensors(model) -> list[str]:
    """Names of the main graph's run-time tensors: graph inputs and node outputs (not
    initializers), in graph order."""
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    for n in model.graph.node:
        names.extend(o for o in n.output if o)
    return names


def type_table(model) -> dict:
    """Tensor name -> ``onnx.TypeProto`` of graph inputs, value_info and outputs (the
    most complete entry when a name appears twice)."""
    out: dict = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.name not in out or _score(vi.type) > _score(out[vi.name]):
            out[vi.name] = vi.type
    return out


def unknown_tensors(model) -> list[str]:
    """Run-time tensors of ``model`` whose type is not complete (:func:`type_is_complete`)."""
    types = type_table(model)
    return [t for t in runtime_tensors(model) if not type_is_complete(types.get(t))]


def infer(model, warnings: list[str] | None = None):
    """``onnx.shape_inference.infer_shapes`` with data propagation (not strict); the
    model itself, with a warning appended, when inference raises."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:
        if warnings is not None:
            warnings.append(f"shape inference failed: {_one_line(e)}")
        return model


def _set_type(model, name: str, tp) -> None:
    """Make ``tp`` the type of tensor ``name`` in ``model`` (graph output or value_info)."""
    for o in model.graph.output:
        if o.name == name:
            o.type.CopyFrom(tp)
            return
    for vi in model.graph.value_info:
        if vi.name == name:
            vi.type.CopyFrom(tp)
            return
    vi = model.graph.value_info.add()
    vi.name = name
    vi.type.CopyFrom(tp)


def complete_static_shapes(model, warnings: list[str] | None = None, max_rounds: int = MAX_ROUNDS):
    """Static inference, then folded constants fed back into inference to a fixed point.

    Args:
        model: the model after the opset upgrade (not modified).
        warnings: a list that receives one line per inference failure.
        max_rounds: most folding rounds.

    Returns:
        ``(model, info)``: a copy with the value_info and output types learnt, and
        ``{"rounds": N, "learnt_from_folding": [tensor names], "unknown": [names still unknown]}``.
    """
    m = infer(copy_proto(model), warnings)
    learnt: list[str] = []
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        unknown = set(unknown_tensors(m))
        if not unknown:
            break
        values, folded, _ = fold_constants(m)
        folded_out = {o for j in folded for o in m.graph.node[j].output if o}
        graph_outputs = {o.name for o in m.graph.output}
        tmp = copy_proto(m)
        keep_nodes = [copy_proto(n) for j, n in enumerate(m.graph.node)
                      if j not in folded or any(o in graph_outputs for o in n.output)]
        del tmp.graph.node[:]
        tmp.graph.node.extend(keep_nodes)
        produced = {o for n in keep_nodes for o in n.output if o}

        have = {t.name for t in tmp.graph.initializer}
        for name in sorted(folded_out - produced - have):
            tmp.graph.initializer.append(numpy_helper.from_array(values[name], name=name))
        kept_info = [copy_proto(v) for v in tmp.graph.value_info
                     if v.name not in folded_out and v.name not in unknown]
        del tmp.graph.value_info[:]
        tmp.graph.value_info.extend(kept_info)
        inferred = infer(tmp, warnings)
        new_types = type_table(inferred)
        old_types = type_table(m)
        improved = []
        for name in unknown:
            tp = new_types.get(name)
            if tp is not None and _score(tp) > _score(old_types.get(name)) and _consistent(old_types.get(name), tp):
                _set_type(m, name, tp)
                improved.append(name)
        if not improved:
            break
        learnt.extend(improved)
    return m, {"rounds": rounds, "learnt_from_folding": sorted(set(learnt)), "unknown": unknown_runtime_tensors(m)}


def unknown_runtime_tensors(model) -> list[str]:
    """:func:`unknown_tensors` without the outputs of constant-folded nodes (those
    become initializers of the layers that read them and need no declared type).
    Folds only when some tensor is unknown (folding materializes every constant)."""
    unknown = unknown_tensors(model)
    if not unknown:
        return []
    _, folded, _ = fold_constants(model)
    constant = {o for j in folded for o in model.graph.node[j].output if o}
    return [t for t in unknown if t not in constant]


def type_proto_of(observed: Mapping):
    """An ``onnx.TypeProto`` from an observed type (``model_run.observed_type``)."""
    if observed["kind"] == "sequence":
        return helper.make_sequence_type_proto(helper.make_tensor_type_proto(observed["elem_type"] or 0, None))
    return helper.make_tensor_type_proto(observed["elem_type"], observed["shape"])


def apply_observed_types(model, observed: Mapping[str, Mapping]) -> dict:
    """Write the types observed in the whole-model run into ``model`` (in place): for
    every run-time tensor (not a graph input) whose declared type is incomplete, or
    contradicts what the run produced (a wrong value_info in the user's model: ONNX
    Runtime ignores it and computes the real shape).

    Args:
        observed: tensor name -> observed type (``kind``, ``elem_type``, ``shape``).

    Returns:
        ``{"observed": [names whose type came from the run], "conflicts": [lines: a
        declared type the run contradicts; the run's type is kept]}``.
    """
    types = type_table(model)
    inputs = {i.name for i in model.graph.input}
    done, conflicts = [], []
    for name in runtime_tensors(model):
        obs = observed.get(name)
        if obs is None or name in inputs:
            continue
        tp = type_proto_of(obs)
        old = types.get(name)
        consistent = _consistent(old, tp)
        if type_is_complete(old) and consistent:
            continue
        if not consistent:
            conflicts.append(f"{name}: the model declares {_type_text(old)}, the run gives {_type_text(tp)}")
        else:
            done.append(name)
        _set_type(model, name, tp)
    return {"observed": done, "conflicts": conflicts}


def type_text(tp) -> str:
    """``float32[1x3x0]``, ``float32[?x3]``, ``seq(float32)``, ``unknown``: a type for messages."""
    return _type_text(tp)


def _type_text(tp) -> str:
    if tp is None or tp.WhichOneof("value") is None:
        return "unknown"
    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        return f"seq({_type_text(tp.sequence_type.elem_type)})"
    if kind != "tensor_type":
        return kind.replace("_type", "")
    tt = tp.tensor_type
    try:
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "?"
    except Exception:
        dt = helper.tensor_dtype_to_string(tt.elem_type).replace("TensorProto.", "").lower()
    if not tt.HasField("shape"):
        return f"{dt}[unknown rank]"
    dims = "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)
    return f"{dt}[{dims}]"


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), text)[:NOTE_CHARS]
