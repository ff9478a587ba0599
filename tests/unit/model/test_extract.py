"""The one nodes -> stand-alone model builder (:mod:`torq_gen_config.model.extract`).

Its rules on a small graph, and that the layer split, the subgraph cut and the full-model
partitions build the same models with it: the layer and subgraph builders as they
were before it (frozen copies at the end of this file) and ``fullrun.partition.build_partition_model``
are compared with it on light_squeezenet and on models with If/Loop/Scan bodies. Byte for
byte, except that an initializer of the source model is now copied as it is (so that it can
keep referring to the weight store) where the frozen builders made it anew from its values:
those are compared by name, dtype, shape and values (:func:`_same_model`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.model import folding, graph, split, subgraph
from torq_gen_config.model.extract import extract_model
from torq_gen_config.model.prepare import prepare_model

T = TensorProto


def _small():
    """x -> Abs(a) -> Add(a, w)=b -> Relu(b)=y ; Neg(a)=n (model output); w an initializer."""
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Add", ["a", "w"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"]), helper.make_node("Neg", ["a"], ["n"])]
    m = make_model(nodes, [tvi("x", T.FLOAT, [2])], [tvi("y", T.FLOAT, [2]), tvi("n", T.FLOAT, [2])],
                   [numpy_helper.from_array(np.ones(2, np.float32), "w")])
    m.graph.value_info.extend([tvi("a", T.FLOAT, [2]), tvi("b", T.FLOAT, [2])])
    m.producer_name, m.doc_string = "me", "the doc"
    return m


def test_boundary_and_policies():
    m = _small()
    w = m.graph.initializer[0]
    new, io = extract_model(m, [1, 2], constants={"w": w})
    assert io == {"inputs": ["a"], "outputs": ["y"], "initializers": ["w"]}  # b is read inside only
    assert new.graph.name == "main" and new.producer_name == "torq-gen-config" and not new.graph.value_info
    assert [o.version for o in new.opset_import] == [o.version for o in m.opset_import]
    assert new.graph.input[0].type == m.graph.value_info[0].type
    onnx.checker.check_model(new)
    # a tensor read outside the members is an output with "read_outside", not with "unread_inside"
    _, io = extract_model(m, [0, 1], constants={"w": w})
    assert io["outputs"] == ["a", "b"] and io["inputs"] == ["x"]
    _, io = extract_model(m, [0, 1], constants={"w": w}, outputs="unread_inside")
    assert io["outputs"] == ["b"]
    # without constants, w is a (run-time) input
    _, io = extract_model(m, [1], outputs=["b"])
    assert io["inputs"] == ["a", "w"] and io["initializers"] == []
    new, _ = extract_model(m, [0, 1, 2], constants={"w": np.ones(2, np.float32)}, value_info_policy="produced")
    assert [v.name for v in new.graph.value_info] == ["b"]  # a is an output: Neg reads it
    new, _ = extract_model(m, [1, 2], constants={"w": w}, value_info_policy="copy", keep_metadata=True,
                           props={"k": "v"})
    assert [v.name for v in new.graph.value_info] == ["b"]
    assert (new.graph.name, new.producer_name, new.doc_string) == (m.graph.name, "me", "the doc")
    assert {p.key: p.value for p in new.metadata_props} == {"k": "v"}
    with pytest.raises(ValueError):
        extract_model(m, [0], outputs="everything")
    with pytest.raises(ValueError):
        extract_model(m, [0], value_info_policy="all")


def test_external_data_reference_kept_and_functions(tmp_path):
    m = _small()
    onnx.save(m, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    lazy = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    w = lazy.graph.initializer[0]
    new, _ = extract_model(lazy, [1], constants={"w": w})
    assert new.graph.initializer[0].data_location == T.EXTERNAL
    assert new.graph.initializer[0].external_data == w.external_data
    m.functions.append(helper.make_function("local", "F", ["i"], ["o"], [helper.make_node("Abs", ["i"], ["o"])],
                                            [helper.make_opsetid("", 17)]))
    assert len(extract_model(m, [0], functions=True)[0].functions) == 1
    assert len(extract_model(m, [0])[0].functions) == 0


# ----------------------------------------------------------------------------- same models as before


def _if_model():
    then_g = helper.make_graph([helper.make_node("Relu", ["a"], ["t"])], "then", [], [tvi("t", T.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "else", [], [tvi("e", T.FLOAT, [2])])
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["y", "a"], ["z"])]
    return make_model(nodes, [tvi("x", T.FLOAT, [2])], [tvi("z", T.FLOAT, [2])],
                      [numpy_helper.from_array(np.array(0, np.float32), "zero")])


def _models(tmp_path, squeezenet_path) -> list[Path]:
    """light_squeezenet, an If reading outer-scope tensors, and onnx's If/Loop/Scan node tests."""
    from onnx.backend.test.case.node import collect_testcases

    paths = [squeezenet_path]
    onnx.save(_if_model(), tmp_path / "if.onnx")
    paths.append(tmp_path / "if.onnx")
    wanted = {"test_if", "test_loop11", "test_scan9_sum", "test_range_float_type_positive_delta_expanded"}
    for case in collect_testcases():
        if case.name in wanted:
            onnx.save(case.model, tmp_path / f"{case.name}.onnx")
            paths.append(tmp_path / f"{case.name}.onnx")
    assert len(paths) == 2 + len(wanted)
    return paths


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _canonical(model) -> bytes:
    """``model``'s bytes with each main-graph initializer rebuilt from its values."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = [numpy_helper.from_array(numpy_helper.to_array(t), t.name) for t in m.graph.initializer]
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    return m.SerializeToString(deterministic=True)


def _same_model(a, b) -> bool:
    """Equal models, initializers compared by name, dtype, shape and values."""
    if isinstance(a, bytes):
        a, b = onnx.load_from_string(a), onnx.load_from_string(b)
    return _canonical(a) == _canonical(b)


def test_layer_models_identical(tmp_path, squeezenet_path, monkeypatch):
    n = 0
    for path in _models(tmp_path, squeezenet_path):
        model, info = prepare_model(path)
        new = split.split_layers(model, info, tmp_path / "new" / path.stem)
        with monkeypatch.context() as mp:
            mp.setattr(split, "build_layer_model", _old_build_layer_model)
            old = split.split_layers(model, info, tmp_path / "old" / path.stem)
        assert json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True), path.stem
        a, b = _tree(tmp_path / "new" / path.stem), _tree(tmp_path / "old" / path.stem)
        assert a.keys() == b.keys() and all(_same_model(a[k], b[k]) for k in a), path.stem
        n += len(a)
    assert n > 66


def _ranges(info) -> list[tuple[int, int]]:
    gi = [u["graph_index"] for u in info["user_nodes"] if u["node_index"] is not None]
    k = len(gi)
    cand = [(gi[0], gi[-1]), (gi[0], gi[0]), (gi[k // 3], gi[k // 2]), (gi[k // 2], gi[-1]), (gi[-1], gi[-1])]
    return sorted(set(cand))


def test_subgraph_models_identical(tmp_path, squeezenet_path):
    n = 0
    for path in _models(tmp_path, squeezenet_path):
        model, info = prepare_model(path)
        origin = [p["graph_index"] for p in info["prepared_nodes"]]
        for first, last in _ranges(info):
            try:
                old = _old_extract_subgraph(model, origin, first, last)
            except subgraph.ModelError:
                with pytest.raises(subgraph.ModelError):
                    subgraph.extract_subgraph(model, origin, first, last)
                continue
            new = subgraph.extract_subgraph(model, origin, first, last)
            assert new[0].SerializeToString(deterministic=True) == old[0].SerializeToString(deterministic=True)
            assert new[1:] == old[1:]
            n += 1
    assert n >= 10


def test_partition_models_identical(tmp_path, squeezenet_path):
    """``fullrun.partition.build_partition_model`` is ``extract_model`` with the partition options."""
    from torq_gen_config.fullrun.partition import build_partition_model

    for path in _models(tmp_path, squeezenet_path):
        model, _ = prepare_model(path)
        values, folded, _ = folding.fold_constants(model)
        live = [j for j in range(len(model.graph.node)) if j not in folded]
        for members in (live, live[: len(live) // 2 or 1], live[len(live) // 2:]):
            old, old_io = _old_build_partition_model(model, members, values)
            assert _same_model(build_partition_model(model, members, values)[0], old)
            new, io = extract_model(model, members, constants=values, outputs="read_outside",
                                    value_info_policy="produced", infer_shapes=True,
                                    props={"torq_gen_config.prepared_nodes": f"{members[0]}-{members[-1]}"})
            assert _same_model(new, old)
            assert io == old_io


# ---- frozen copies (split.py / subgraph.py / full_model.py before model/extract.py)


def _old_build_partition_model(model, members, values, *, types=None, consumers=None, graph_outputs=None):
    """fullrun.partition.build_partition_model before model/extract.py."""
    import onnx
    from onnx import helper, numpy_helper

    from torq_gen_config.model.graph import copy_proto, node_inputs, tensor_consumers, value_info, value_types

    def _np(value):
        return np.asarray(value)

    types = types if types is not None else value_types(model)
    consumers = consumers if consumers is not None else tensor_consumers(model)
    graph_outputs = list(graph_outputs if graph_outputs is not None else (o.name for o in model.graph.output))
    member_set = set(members)
    nodes = [model.graph.node[j] for j in members]
    produced: list[str] = [t for n in nodes for t in n.output if t]
    produced_set = set(produced)
    inputs, inits = [], []
    seen: set[str] = set()
    for n in nodes:
        for t in node_inputs(n):
            if t in produced_set or t in seen:
                continue
            seen.add(t)
            if t in values:
                inits.append(numpy_helper.from_array(_np(values[t]), name=t))
            else:
                inputs.append(value_info(t, types))
    gout = set(graph_outputs)
    outs = [t for t in produced if t in gout or any(c not in member_set for c in consumers.get(t, ()))]
    if not outs:
        read_inside = {t for n in nodes for t in node_inputs(n)}
        outs = [t for t in produced if t not in read_inside] or produced[-1:]
    outputs = [value_info(t, types) for t in outs]
    internal = [value_info(t, types) for t in produced if t not in set(outs) and t in types]
    graph = helper.make_graph([copy_proto(n) for n in nodes], "main", inputs, outputs, initializer=inits,
                              value_info=internal)
    part = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="torq-gen-config")
    part.ir_version = model.ir_version
    helper.set_model_props(part, {"torq_gen_config.prepared_nodes": f"{members[0]}-{members[-1]}"})
    try:
        part = onnx.shape_inference.infer_shapes(part, data_prop=True)
    except Exception:  # keep the copied types; the importer reports what it lacks
        pass
    io = {"inputs": [vi.name for vi in inputs], "outputs": list(outs), "initializers": [t.name for t in inits]}
    return part, io


def _old_build_layer_model(model, members: list[int], values: dict, types: dict, graph_outputs: list[str],
                      layer_id: str, node_index: int):
    """Build the stand-alone ONNX model of one layer.

    Run-time inputs become graph inputs (types from shape inference), constant
    inputs become initializers, and every tensor produced by the layer's nodes that
    is not consumed inside the layer becomes a graph output. The graph is named
    ``main`` so that the imported MLIR function is ``@main``.

    Returns:
        ``(model, io)`` with ``io`` = ``{"inputs", "outputs", "initializers"}`` lists
        of ``{"name", "dtype", "shape"}``.
    """
    import onnx
    from onnx import helper, numpy_helper

    nodes = [model.graph.node[j] for j in members]
    produced = [t for n in nodes for t in n.output if t]
    produced_set = set(produced)
    consumed_inside = {t for n in nodes for t in n.input if t}
    inputs, inits = [], []
    seen = set()
    for n in nodes:
        for t in list(n.input) + _outer_scope_inputs(n):
            if not t or t in produced_set or t in seen:
                continue
            seen.add(t)
            if t in values:
                inits.append(numpy_helper.from_array(values[t], name=t))
            else:
                inputs.append(graph.value_info(t, types))
    outputs = [graph.value_info(t, types) for t in produced if t not in consumed_inside or t in graph_outputs]
    g = helper.make_graph([graph.copy_proto(n) for n in nodes], "main", inputs, outputs, initializer=inits)
    layer = helper.make_model(g, opset_imports=list(model.opset_import), producer_name="torq-gen-config")
    layer.ir_version = model.ir_version
    helper.set_model_props(layer, {"torq_gen_config.layer_id": layer_id, "torq_gen_config.node_index": str(node_index)})
    try:
        layer = onnx.shape_inference.infer_shapes(layer, data_prop=True)
    except Exception:
        pass
    out_types = graph.value_types(layer)
    io = {
        "inputs": [split._describe(vi.name, types) for vi in inputs],
        "outputs": [split._describe(vi.name, out_types) for vi in outputs],
        "initializers": [{"name": t.name, "dtype": split._dtype_name(t.data_type), "shape": list(t.dims)} for t in inits],
    }
    return layer, io


def _old_extract_subgraph(model, origin: list[int], first: int, last: int) -> tuple[Any, list[int], dict]:
    """Cut the user's node range ``first..last`` (graph indices in the user's model)
    out of the prepared ``model``.

    Args:
        model: the prepared model (opset upgraded, shapes inferred).
        origin: per node of ``model``, the graph index of the user node it comes from.
        first, last: graph indices of the range's ends (inclusive).

    Returns:
        ``(submodel, sub_origin, info)``: the subgraph model (same opsets, IR
        version, graph name, value_info of its tensors), the ``origin`` of its nodes,
        and ``{"inputs", "outputs", "outside_constant_nodes" (graph indices in the
        user's model of the constant-producing nodes taken from outside the range),
        "num_nodes"}``.

    Raises:
        ModelError: the range produces nothing that is used after it.
    """
    import numpy as np
    from onnx import helper, numpy_helper

    from torq_gen_config.model.graph import tensor_consumers
    from torq_gen_config.model.graph import node_inputs
    from torq_gen_config.model.folding import static_shapes as _static_shapes

    nodes = list(model.graph.node)
    in_range = [j for j, o in enumerate(origin) if first <= o <= last]
    range_set = set(in_range)
    producer: dict[str, int] = {}
    for j, n in enumerate(nodes):
        for t in n.output:
            if t:
                producer[t] = j
    inits = {t.name: t for t in model.graph.initializer}
    const, from_shape = subgraph.constant_nodes(model)
    shapes = _static_shapes(model)

    keep = set(range_set)               # node indices of the subgraph
    need_inits: list[str] = []          # initializers it reads
    shape_values: dict[str, Any] = {}   # Shape/Size of a static run-time tensor -> its value
    inputs: list[str] = []              # run-time tensors read from outside the range

    def need(t: str) -> list[str]:
        """Tensor ``t`` is read by a node of the subgraph; returns further tensors needed."""
        if t in inits:
            if t not in need_inits:
                need_inits.append(t)
            return []
        p = producer.get(t)
        if p is not None and p in keep:
            return []
        if p is None or p not in const:  # run-time data from outside (or a graph input)
            if t not in inputs:
                inputs.append(t)
            return []
        if t in from_shape:  # Shape/Size of run-time data: only its static shape is needed
            n = nodes[p]
            shp = shapes[n.input[0]]
            if n.op_type == "Size":
                shape_values[t] = np.array(int(np.prod(shp)), dtype=np.int64)
            else:
                shape_values[t] = np.array(shp[graph.node_attr(n, "start", 0):graph.node_attr(n, "end", None)], dtype=np.int64)
            return []
        keep.add(p)  # a constant-producing node outside the range, and what it needs
        return node_inputs(nodes[p])

    for j in in_range:
        stack = list(reversed(node_inputs(nodes[j])))
        while stack:
            stack.extend(reversed(need(stack.pop())))

    consumers = tensor_consumers(model)
    graph_outputs = {o.name for o in model.graph.output}
    outputs: list[str] = []
    for j in in_range:
        for t in nodes[j].output:
            if not t or t in outputs:
                continue
            used_after = any(k not in range_set for k in consumers.get(t, ()))
            if t in graph_outputs or (used_after and j not in const):
                outputs.append(t)
    if not outputs:
        raise subgraph.ModelError(f"the subgraph (user nodes {first}..{last}) computes no tensor that is used after it "
                         "or is a model output")

    order = sorted(keep)
    types = graph.value_types(model)
    sub_nodes = [graph.copy_proto(nodes[j]) for j in order]
    initializers = [graph.copy_proto(inits[t]) for t in need_inits]
    initializers += [numpy_helper.from_array(v, name=t) for t, v in shape_values.items()]
    boundary = set(inputs) | set(outputs)
    used = {t for n in sub_nodes for t in list(n.input) + list(n.output) if t}
    inner_info = [graph.copy_proto(v) for v in model.graph.value_info if v.name in used and v.name not in boundary]
    g = helper.make_graph(sub_nodes, model.graph.name, [graph.value_info(t, types) for t in inputs],
                              [graph.value_info(t, types) for t in outputs], initializer=initializers,
                              value_info=inner_info)
    sub = helper.make_model(g, opset_imports=list(model.opset_import))
    sub.ir_version = model.ir_version
    for attr in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(sub, attr, getattr(model, attr))
    sub.functions.extend(model.functions)
    sub_origin = [origin[j] for j in order]
    outside = sorted({origin[j] for j in order if j not in range_set})
    info = {"inputs": inputs, "outputs": outputs, "outside_constant_nodes": outside, "num_nodes": len(order)}
    return sub, sub_origin, info


# frozen copy of the old model.split helper the frozen builders above used
def _outer_scope_inputs(node) -> list[str]:
    """Tensors that the subgraphs of ``node`` read from the enclosing graph."""
    names: list[str] = []

    def visit(graph, defined: set[str]) -> None:
        defined = set(defined) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
        for n in graph.node:
            for t in n.input:
                if t and t not in defined and t not in names:
                    names.append(t)
            for a in n.attribute:
                for g in ([a.g] if a.type == 5 else list(a.graphs) if a.type == 10 else []):
                    visit(g, defined)
            defined.update(t for t in n.output if t)

    for a in node.attribute:
        if a.type == 5:
            visit(a.g, set())
        elif a.type == 10:
            for g in a.graphs:
                visit(g, set())
    return names
