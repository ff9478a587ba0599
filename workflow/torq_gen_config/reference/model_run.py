"""The whole-model reference run: every tensor's real value, shape and dtype.

The model is evaluated node by node in graph order (ONNX graphs are topologically
sorted), each node as a one-node model on ONNX Runtime (optimizations off, as the
layer references), and on onnx's reference implementation where ONNX Runtime fails
on it. This gives what a whole-model run with every tensor exposed gives (Polygraphy's
``--onnx-outputs mark all``), but

* memory stays bounded: a value is dropped as soon as its last consumer ran, so the
  peak is the set of live tensors, not every tensor of the model at once (marking all
  outputs is what runs out of memory on big models, NVIDIA/TensorRT#4443);
* a node that neither engine can run costs only the nodes downstream of it: their
  values are unavailable, with the reason, and everything else is still computed.

Callers receive every produced value through ``on_value`` (to write each layer's
inputs as they become available) and get the observed type of every tensor.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from ..core.external_data import is_external
from ..core.lazy import helper, np, numpy_helper, onnx
from ..model.folding import ConstantValues, fold_constants
from ..model.graph import copy_proto, node_inputs
from .reference_run import ENGINES, ReferenceTimeout, engine_label, run_reference

#: Longest engine message kept per failed node (characters).
MESSAGE_LIMIT = 600


def _nbytes(value) -> int:
    if isinstance(value, list):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))


def observed_type(value) -> dict:
    """The type of a run-time value: ``{"kind": "tensor", "elem_type": int, "shape": [...]}``
    or ``{"kind": "sequence", "elem_type": int | 0, "shape": None}`` (a list of arrays)."""
    if isinstance(value, list):
        et = 0
        if value:
            et = helper.np_dtype_to_tensor_dtype(np.asarray(value[0]).dtype)
        return {"kind": "sequence", "elem_type": int(et), "shape": None}
    a = np.asarray(value)
    return {"kind": "tensor", "elem_type": int(helper.np_dtype_to_tensor_dtype(a.dtype)), "shape": [int(d) for d in a.shape]}


def _type_map(model) -> dict:
    """Tensor name -> ``onnx.TypeProto`` (any kind) of the graph inputs, value_info and outputs."""
    return {vi.name: vi.type for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)
            if vi.type.WhichOneof("value") is not None}


def _input_info(name: str, value):
    t = observed_type(value)
    if t["kind"] == "sequence":
        return helper.make_tensor_sequence_value_info(name, t["elem_type"] or 1, None)
    return helper.make_tensor_value_info(name, t["elem_type"], t["shape"])


def _output_info(name: str, types: dict):
    """The declared type of a node output for a one-node model: the model's type
    (the run tells the real shape; a declared shape that differs is only a warning
    for ONNX Runtime), untyped when unknown."""
    vi = onnx.ValueInfoProto()
    vi.name = name
    tp = types.get(name)
    if tp is not None and tp.WhichOneof("value") is not None:
        vi.type.CopyFrom(tp)
        if vi.type.WhichOneof("value") == "tensor_type" and not vi.type.tensor_type.elem_type:
            vi.ClearField("type")
    return vi


def node_model(model, node, feeds: dict, constants: dict, types: dict):
    """A one-node model of ``node`` (a node of ``model``): its run-time inputs (including
    names its subgraphs read from the enclosing graph) are graph inputs typed from
    their values in ``feeds``, constant inputs are initializers, outputs carry the
    element types known in ``types`` (untyped when unknown). A constant held in a weight
    store (:meth:`~.model.folding.ConstantValues.proto`) is referred to, not copied: the
    engine reads it from there (:func:`~.reference_run.run_reference`)."""
    ins = node_inputs(node)
    graph_inputs = [_input_info(t, feeds[t]) for t in ins if t in feeds]
    inits = []
    for t in ins:
        if t in constants and t not in feeds:
            proto = constants.proto(t) if isinstance(constants, ConstantValues) else None
            if proto is not None and is_external(proto):
                inits.append(copy_proto(proto))
            else:
                inits.append(numpy_helper.from_array(constants[t], name=t))
    outs = [_output_info(o, types) for o in node.output if o]
    graph = helper.make_graph([copy_proto(node)], "node", graph_inputs, outs, initializer=inits)
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    m.functions.extend(model.functions)
    return m


def _infer_output_types(m) -> None:
    """Fill in untyped outputs of a one-node model from onnx shape inference (in place)."""
    if all(o.type.WhichOneof("value") is not None for o in m.graph.output):
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:
        return
    found = {vi.name: vi.type for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for o in m.graph.output:
        if o.type.WhichOneof("value") is None and o.name in found:
            tp = found[o.name]
            if tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type:
                o.type.tensor_type.elem_type = tp.tensor_type.elem_type
            elif tp.WhichOneof("value") not in (None, "tensor_type"):
                o.type.CopyFrom(tp)


def run_model_by_node(model, feeds: dict, *, on_value: Callable[[str, Any], None] | None = None,
                      timeout_s: float | None = None, engines: Iterable[str] = ENGINES,
                      keep: Iterable[str] = ()) -> dict:
    """Evaluate ``model`` node by node on ``feeds`` (see the module docstring).

    Args:
        model: a model whose graph inputs are ``feeds``' names (a prepared model).
        feeds: graph input name -> numpy array.
        on_value: called as ``on_value(name, value)`` for every graph input and every
            tensor a node produces, once, as soon as it exists (values are numpy arrays,
            sequences lists of arrays; the callback must not modify them).
        timeout_s: wall-clock budget in seconds for the whole run (None: unbounded);
            nodes not reached in time get unavailable outputs.
        engines: engines to try per node, in order (default ONNX Runtime, then onnx's
            reference implementation).
        keep: tensor names never dropped (the caller reads them after the run from
            the returned ``values``).

    Returns:
        A JSON-safe dict (``values`` aside): ``types`` (tensor name -> :func:`observed_type`
        of every graph input and produced tensor), ``engines`` (engine -> number of
        nodes it ran), ``fallback_nodes`` (nodes run by a later engine: ``graph_index``,
        ``op_type``, ``name``, ``errors`` per engine that failed), ``failed_nodes``
        (nodes no engine could run, same fields), ``unavailable`` (tensor name -> why it
        has no value), ``nodes_run``, ``nodes_not_run`` (nodes that failed, had an input
        without value or were not reached in time), ``peak_live_bytes`` (largest total
        size of the values held at once, bytes), ``seconds``, ``values`` (the ``keep`` tensors
        that exist: name -> array).
    """
    start = time.perf_counter()
    deadline = None if timeout_s is None else start + float(timeout_s)
    engines = list(engines)
    constants, folded, _ = fold_constants(model)
    types = _type_map(model)
    nodes = list(model.graph.node)
    keep = set(keep) | {o.name for o in model.graph.output}
    remaining: dict[str, int] = {}
    for j, n in enumerate(nodes):
        if j in folded:
            continue
        for t in node_inputs(n):
            remaining[t] = remaining.get(t, 0) + 1
    live: dict[str, Any] = {}
    result: dict[str, Any] = {"types": {}, "engines": {e: 0 for e in engines}, "fallback_nodes": [],
                              "failed_nodes": [], "unavailable": {}, "nodes_run": 0, "nodes_not_run": 0,
                              "peak_live_bytes": 0,
                              "seconds": None, "values": {}}
    live_bytes = 0

    def produce(name: str, value) -> None:
        nonlocal live_bytes
        live[name] = value
        live_bytes += _nbytes(value)
        result["types"][name] = observed_type(value)
        if on_value is not None:
            on_value(name, value)

    for name, value in feeds.items():
        if name not in constants:
            produce(name, value)
    result["peak_live_bytes"] = live_bytes

    for j, node in enumerate(nodes):
        if j in folded:
            continue
        outs = [o for o in node.output if o]
        ins = node_inputs(node)
        missing = [t for t in ins if t not in live and t not in constants]
        if missing:
            reason = result["unavailable"].get(missing[0]) or f"{missing[0]!r} has no value"
            for o in outs:
                result["unavailable"][o] = f"input {missing[0]!r} of {node.op_type} node {node.name or j} " \
                                           f"is unavailable ({reason})" if not reason.startswith("input ") else reason
            result["nodes_not_run"] += 1
            continue
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left <= 0:
            for o in outs:
                result["unavailable"][o] = f"the whole-model run exceeded its {timeout_s:g} s limit before " \
                                           f"{node.op_type} node {node.name or j}"
            result["nodes_not_run"] += 1
            continue
        feed = {t: live[t] for t in ins if t in live}
        m = node_model(model, node, feed, constants, types)
        _infer_output_types(m)
        errors: dict[str, str] = {}
        values = None
        for engine in engines:
            try:
                values = run_reference(m, feed, outs, engine=engine, timeout_s=left)
                result["engines"][engine] += 1
                break
            except ReferenceTimeout as e:
                errors[engine] = str(e)
                break
            except Exception as e:  # the engines raise their own exception types
                errors[engine] = _one_line(e)
        record = {"graph_index": j, "op_type": node.op_type, "name": node.name, "errors": errors}
        if values is None:
            result["failed_nodes"].append(record)
            msg = "; ".join(f"{engine_label(e)}: {m_}" for e, m_ in errors.items())
            for o in outs:
                result["unavailable"][o] = f"{node.op_type} node {node.name or j} could not be evaluated ({msg})"
            result["nodes_not_run"] += 1
            continue
        if errors:
            result["fallback_nodes"].append(record)
        result["nodes_run"] += 1
        for o, v in zip(outs, values):
            produce(o, v)
        result["peak_live_bytes"] = max(result["peak_live_bytes"], live_bytes)
        for t in ins:
            if t in remaining:
                remaining[t] -= 1
                if remaining[t] == 0 and t in live and t not in keep:
                    live_bytes -= _nbytes(live.pop(t))
        for o in outs:  # outputs nobody reads
            if remaining.get(o, 0) == 0 and o in live and o not in keep:
                live_bytes -= _nbytes(live.pop(o))
    result["values"] = {t: live[t] for t in keep if t in live}
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def run_summary(res: dict, max_unavailable: int = 200) -> dict:
    """The JSON-safe summary of a :func:`run_model_by_node` result (no values, no types;
    at most ``max_unavailable`` unavailable tensors listed, ``num_unavailable`` counts all)."""
    return {"engines": res["engines"], "nodes_run": res["nodes_run"], "nodes_not_run": res.get("nodes_not_run", 0),
            "seconds": res["seconds"],
            "peak_live_bytes": res["peak_live_bytes"], "fallback_nodes": res["fallback_nodes"],
            "failed_nodes": res["failed_nodes"],
            "unavailable": dict(list(res["unavailable"].items())[:max_unavailable]),
            "num_unavailable": len(res["unavailable"])}


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " ".join(lines)[:MESSAGE_LIMIT]
