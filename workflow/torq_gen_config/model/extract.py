"""Nodes -> stand-alone model: the one builder behind the layer models
(:mod:`torq_gen_config.model.split`), the subgraph (:mod:`torq_gen_config.model.subgraph`)
and the full-model partitions (:mod:`torq_gen_config.fullrun.partition`).

:func:`extract_model` takes a model and some of its nodes (indices into
``model.graph.node``, in the order the new graph holds them) and builds an ONNX model
that runs those nodes alone:

* **Inputs**: every tensor a node reads (its inputs and the outer-scope names its
  If/Loop/Scan bodies read, :func:`~torq_gen_config.model.graph.node_inputs`) that no
  listed node produces and that is not in ``constants``, in order of first read; or the
  names given as ``inputs``. Each gets its type from ``types``, untyped when unknown.
* **Initializers**: the tensors in ``constants`` that the nodes read, in order of first
  read (or the names given as ``initializers``). A numpy value becomes a new tensor with
  its data embedded (``numpy_helper.from_array``); a ``TensorProto`` (an initializer of
  the model, or the :meth:`~.folding.ConstantValues.proto` of a name) is copied as it is: one whose data is still external (the model was loaded
  with ``load_external_data=False``) keeps its ``external_data`` reference, which is
  relative to the directory of the original model. Nothing else of the model's
  initializers is copied.
* **Outputs** (``outputs``): ``"read_outside"``: the produced tensors that a node not in
  the list reads (bodies included) or that are model outputs; when there are none, the
  produced tensors no listed node reads, else the last one produced (so that the model
  stays valid). ``"unread_inside"``: the produced tensors no listed node has as a direct
  input, plus those that are model outputs. Or a list of names. Types as for inputs.
* **value_info** (``value_info``): ``"none"``; ``"produced"``: a typed entry (from
  ``types``) for each produced tensor that is not an output; ``"copy"``: copies of the
  model's own entries for the tensors the nodes read or write directly, boundary excluded.
* **Model**: every opset import of the model (all domains, used or not) and its IR
  version. ``keep_metadata=False``: the graph is named ``main`` (the function name after
  the MLIR import), ``producer_name`` is ``torq-gen-config`` and ``props`` become
  ``metadata_props``; ``keep_metadata=True``: graph name, producer name and version,
  domain, model version and doc string are the model's. The model's local functions
  are copied only with ``functions=True`` (a node that calls one needs it).
* ``infer_shapes``: run onnx shape inference (``data_prop``) on the result; when it
  fails the copied types stay.

Nodes are deep copies; the source model is not changed.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..core.lazy import helper, np, numpy_helper, onnx
from .folding import ConstantValues
from .graph import copy_proto, node_inputs, tensor_consumers, value_info, value_types

#: Output policies of :func:`extract_model` (or a list of names).
OUTPUT_POLICIES = ("read_outside", "unread_inside")
#: value_info policies of :func:`extract_model`.
VALUE_INFO_POLICIES = ("none", "produced", "copy")
#: Model fields copied with ``keep_metadata=True``.
_METADATA = ("producer_name", "producer_version", "domain", "model_version", "doc_string")


def extract_model(model, members: Sequence[int], *, constants: Mapping[str, Any] | None = None,
                  inputs: Sequence[str] | None = None, initializers: Sequence[str] | None = None,
                  outputs: str | Sequence[str] = "read_outside", types: Mapping | None = None,
                  consumers: Mapping[str, set] | None = None, graph_outputs: Iterable[str] | None = None,
                  value_info_policy: str = "none", keep_metadata: bool = False, functions: bool = False,
                  props: Mapping[str, str] | None = None, infer_shapes: bool = False) -> tuple[Any, dict]:
    """The stand-alone ONNX model of the nodes ``members`` of ``model`` (module docstring).

    Args:
        model: the source ``onnx.ModelProto`` (prepared, shape-inferred).
        members: indices of the nodes in ``model.graph.node``, in the new graph's order.
        constants: tensor name -> numpy array or ``TensorProto``: read tensors found here
            become initializers instead of inputs.
        inputs, initializers: explicit boundary names (default: computed, first read first).
        outputs: ``"read_outside"``, ``"unread_inside"`` or a list of names.
        types: tensor name -> ``TypeProto`` (default :func:`~.graph.value_types` of ``model``).
        consumers: tensor name -> node indices that read it (default
            :func:`~.graph.tensor_consumers`; used by ``"read_outside"``).
        graph_outputs: the model's output names (default: from ``model``).
        value_info_policy: ``"none"``, ``"produced"`` or ``"copy"``.
        keep_metadata, functions, props, infer_shapes: see the module docstring.

    Returns:
        ``(new_model, io)``, ``io = {"inputs", "outputs", "initializers"}``: lists of
        tensor names in graph order.

    Raises:
        ValueError: an unknown ``outputs`` or ``value_info_policy``; KeyError: an
            explicit initializer name missing from ``constants``.
    """
    if value_info_policy not in VALUE_INFO_POLICIES:
        raise ValueError(f"value_info_policy {value_info_policy!r}: expected one of {VALUE_INFO_POLICIES}")
    if isinstance(outputs, str) and outputs not in OUTPUT_POLICIES:
        raise ValueError(f"outputs {outputs!r}: expected one of {OUTPUT_POLICIES} or a list of names")
    constants = constants or {}
    types = types if types is not None else value_types(model)
    gout = list(graph_outputs if graph_outputs is not None else (o.name for o in model.graph.output))
    nodes = [model.graph.node[j] for j in members]
    produced: list[str] = [t for n in nodes for t in n.output if t]
    produced_set = set(produced)

    if inputs is None or initializers is None:
        found_inputs, found_inits, seen = [], [], set()
        for n in nodes:
            for t in node_inputs(n):
                if t in produced_set or t in seen:
                    continue
                seen.add(t)
                (found_inits if t in constants else found_inputs).append(t)
        inputs = found_inputs if inputs is None else inputs
        initializers = found_inits if initializers is None else initializers
    inputs, initializers = list(inputs), list(initializers)

    if outputs == "read_outside":
        consumers = consumers if consumers is not None else tensor_consumers(model)
        member_set, gset = set(members), set(gout)
        outs = [t for t in produced if t in gset or any(c not in member_set for c in consumers.get(t, ()))]
        if not outs:
            read_inside = {t for n in nodes for t in node_inputs(n)}
            outs = [t for t in produced if t not in read_inside] or produced[-1:]
    elif outputs == "unread_inside":
        direct = {t for n in nodes for t in n.input if t}
        outs = [t for t in produced if t not in direct or t in gout]
    else:
        outs = list(outputs)

    inits = []
    for t in initializers:
        proto = constants.proto(t) if isinstance(constants, ConstantValues) else None
        v = proto if proto is not None else constants[t]
        inits.append(copy_proto(v) if isinstance(v, onnx.TensorProto) else numpy_helper.from_array(np.asarray(v), name=t))
    new_nodes = [copy_proto(n) for n in nodes]
    if value_info_policy == "produced":
        out_set = set(outs)
        infos = [value_info(t, types) for t in produced if t not in out_set and t in types]
    elif value_info_policy == "copy":
        boundary = set(inputs) | set(outs)
        used = {t for n in new_nodes for t in list(n.input) + list(n.output) if t}
        infos = [copy_proto(v) for v in model.graph.value_info if v.name in used and v.name not in boundary]
    else:
        infos = []
    graph = helper.make_graph(new_nodes, model.graph.name if keep_metadata else "main",
                              [value_info(t, types) for t in inputs], [value_info(t, types) for t in outs],
                              initializer=inits, value_info=infos)
    if keep_metadata:
        new = helper.make_model(graph, opset_imports=list(model.opset_import))
    else:
        new = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="torq-gen-config")
    new.ir_version = model.ir_version
    if keep_metadata:
        for attr in _METADATA:
            setattr(new, attr, getattr(model, attr))
    if functions:
        new.functions.extend(model.functions)
    if props:
        helper.set_model_props(new, dict(props))
    if infer_shapes:
        try:
            new = onnx.shape_inference.infer_shapes(new, data_prop=True)
        except Exception:  # keep the copied types; the importer reports what it lacks
            pass
    return new, {"inputs": inputs, "outputs": outs, "initializers": [t.name for t in inits]}
