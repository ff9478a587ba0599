"""The weight store (:mod:`torq_gen_config.core.weight_store`): each large tensor on disk once,
read by ONNX Runtime, onnx, IREE's parameter loader and the MLIR importer from the same
bytes; and the split, the folding and the layer references on top of it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TensorProto, helper, make_model, tvi
from fixtures.models import if_lstm_model
from onnx import numpy_helper

from torq_gen_config.core import external_data as xd
from torq_gen_config.core import weight_store as ws
from torq_gen_config.discovery.batch_compile import layer_weight_bytes, plan_batches
from torq_gen_config.mlir.importer import import_layer, write_with_weights
from torq_gen_config.model.folding import ConstantValues, fold_constants
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.split import split_layers

T = TensorProto


def _mlp(seed: int = 0):
    """x[1,64] -> MatMul(W1) -> Relu -> MatMul(W2, via an Identity) -> Mul(s) -> Add(cb) -> y;
    W1, W2 of 16 KiB, a 4-byte scale and a 256-byte Constant (both kept inside)."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((64, 64), dtype=np.float32)
    w2 = rng.standard_normal((64, 64), dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Identity", ["W2"], ["W2i"]),
             helper.make_node("MatMul", ["r", "W2i"], ["m"]),
             helper.make_node("Mul", ["m", "s"], ["ms"]),
             helper.make_node("Constant", [], ["cb"], value=numpy_helper.from_array(
                 np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 64), "cb")),
             helper.make_node("Add", ["ms", "cb"], ["y"])]
    inits = [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"),
             numpy_helper.from_array(np.array(0.5, np.float32), "s")]
    return make_model(nodes, [tvi("x", T.FLOAT, [1, 64])], [tvi("y", T.FLOAT, [1, 64])], inits)


def _big_const_mlp():
    """As :func:`_mlp`, with the Constant node's value large enough for the store (16 KiB)."""
    m = _mlp()
    big = numpy_helper.from_array(np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64), "cbig")
    m.graph.node.append(helper.make_node("Constant", [], ["cbig"], value=big))
    m.graph.node.append(helper.make_node("MatMul", ["y", "cbig"], ["z"]))
    del m.graph.output[:]
    m.graph.output.extend([tvi("z", T.FLOAT, [1, 64])])
    onnx.checker.check_model(m)
    return m


def test_externalize_moves_large_tensors_once_and_ort_reads_them(tmp_path):
    m = _big_const_mlp()
    x = np.random.default_rng(1).standard_normal((1, 64), dtype=np.float32)
    expected = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    info = ws.externalize(m, tmp_path / ws.STORE_FILE)
    assert info["tensors"] == 3 and info["tensor_bytes"] == 3 * 64 * 64 * 4  # W1, W2, the Constant's value
    inside = [t.name for t in xd.model_tensors(m) if not xd.is_external(t)]
    assert "s" in inside  # 4 bytes: stays in the model
    for t in xd.model_tensors(m):
        if xd.is_external(t):
            e = {x.key: x.value for x in t.external_data}
            assert e["location"] == ws.STORE_FILE and int(e["offset"]) % 64 == 0 and len(e["checksum"]) == 40
    path = tmp_path / "prepared.onnx"
    path.write_bytes(m.SerializeToString())
    assert path.stat().st_size < 2000
    onnx.checker.check_model(str(path))  # the usual ONNX way: external data beside the model
    got = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, expected)
    # the same bytes are IREE parameters, keyed by tensor name
    offsets = ws.archive_offsets(tmp_path / ws.STORE_FILE)
    assert set(offsets) == {"W1", "W2", "cbig"}


def test_unchanged_store_is_left_untouched(tmp_path):
    store = tmp_path / ws.STORE_FILE
    ws.externalize(_mlp(), store)
    before = store.stat().st_mtime_ns
    os.utime(store, ns=(before - 10**9, before - 10**9))
    ws.externalize(_mlp(), store)
    assert store.stat().st_mtime_ns == before - 10**9
    ws.externalize(_mlp(seed=3), store)  # other weights: rewritten
    assert store.stat().st_mtime_ns != before - 10**9


def test_derived_models_refer_to_the_store_from_another_folder(tmp_path):
    m = _mlp()
    ws.externalize(m, tmp_path / ws.STORE_FILE)
    (tmp_path / "prepared.onnx").write_bytes(m.SerializeToString())
    whole = xd.load_model(tmp_path / "prepared.onnx", weights=False)
    assert all(os.path.isabs({e.key: e.value for e in t.external_data}["location"])
               for t in xd.model_tensors(whole) if xd.is_external(t))
    layer = tmp_path / "layers" / "a" / "model.onnx"
    layer.parent.mkdir(parents=True)
    xd.save_model(whole, layer)
    props = {p.key: p.value for p in onnx.load(str(layer), load_external_data=False).metadata_props}
    assert props[xd.WEIGHTS_DIR_PROP] == os.path.join("..", "..")
    assert xd.weights_dir(layer) == tmp_path.resolve()
    x = np.ones((1, 64), np.float32)
    want = ort.InferenceSession(str(tmp_path / "prepared.onnx")).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(layer), xd.session_options(layer)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    loaded = xd.load_model(layer)  # weights read in: self-contained in memory
    assert not any(xd.is_external(t) for t in xd.model_tensors(loaded))
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]),
                                  numpy_helper.to_array(_mlp().graph.initializer[0]))
    # the bytes do not depend on where the output directory is
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert xd.model_bytes(whole, layer) == layer.read_bytes()
    alone = onnx.load_from_string(xd.self_contained_bytes(whole))
    assert not any(xd.is_external(t) for t in xd.model_tensors(alone))
    assert xd.WEIGHTS_DIR_PROP not in {p.key for p in alone.metadata_props}


def test_short_store_is_a_clear_error(tmp_path):
    m = _mlp()
    ws.externalize(m, tmp_path / ws.STORE_FILE)
    (tmp_path / "p.onnx").write_bytes(m.SerializeToString())
    with open(tmp_path / ws.STORE_FILE, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="holds .* of its"):
        xd.load_model(tmp_path / "p.onnx")


def test_constant_values_read_stored_tensors_on_access(tmp_path):
    m = _big_const_mlp()
    ws.externalize(m, tmp_path / ws.STORE_FILE)
    xd.resolve_locations(m, tmp_path)
    values, folded, _ = fold_constants(m)
    assert isinstance(values, ConstantValues)
    # Identity of a stored weight and a Constant's stored value fold by reference
    assert values.proto("W2i") is not None and xd.is_external(values.proto("W2i"))
    assert values.proto("cbig") is not None and xd.is_external(values.proto("cbig"))
    np.testing.assert_array_equal(values["W2i"], numpy_helper.to_array(_mlp().graph.initializer[1]))
    assert values.proto("s") is not None and float(values["s"]) == 0.5
    assert "nothing" not in values and len(values) == len(set(values))


def test_split_layers_refer_to_the_store(tmp_path):
    """The split of a model with real weights: the layer files hold the graph only and
    run as the model's own layers do. (onnx's light models compute their weights with
    constant-folded nodes: those are new values, written into the layers that read them.)"""
    src = tmp_path / "mlp.onnx"
    onnx.save(_big_const_mlp(), src)
    work = tmp_path / "work"
    work.mkdir()
    store = work / ws.STORE_FILE
    model, info = prepare_model(src, store=store)
    ws.externalize(model, store)
    (work / "prepared.onnx").write_bytes(model.SerializeToString())
    whole = xd.load_model(work / "prepared.onnx", weights=False)
    man = split_layers(whole, info, work / "layers")
    layer_files = sorted((work / "layers").rglob("model.onnx"))
    assert len(layer_files) == len(man["layers"]) == 6
    layer_bytes = sum(p.stat().st_size for p in layer_files)
    assert store.stat().st_size > 3 * 64 * 64 * 4 and layer_bytes < 10_000, layer_bytes
    x = np.random.default_rng(0).standard_normal((1, 64), dtype=np.float32)
    for layer in man["layers"]:
        path = work / "layers" / layer["slug"] / "model.onnx"
        feeds = {i["name"]: x for i in layer["inputs"]}
        got = ort.InferenceSession(str(path), xd.session_options(path)).run(None, feeds)
        inline = xd.self_contained_bytes(xd.load_model(path, weights=False))
        want = ort.InferenceSession(inline).run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    second = next(layer for layer in man["layers"] if layer["op_type"] == "MatMul" and
                  any(i["name"] == "W2i" for i in layer["initializers"]))
    t = onnx.load(str(work / "layers" / second["slug"] / "model.onnx"), load_external_data=False).graph.initializer[0]
    assert xd.is_external(t)  # the Identity of a stored weight: still the stored bytes


def test_batches_end_before_their_weights_pass_the_budget():
    slugs = [f"l{i}" for i in range(10)]
    weights = {s: 10 for s in slugs} | {"l3": 100}
    plan = plan_batches(slugs, 4, "k", weights=weights, max_bytes=50)
    assert [b["members"] for b in plan] == [["l0", "l1", "l2"], ["l3"], ["l4", "l5", "l6", "l7"], ["l8", "l9"]]
    assert [b["id"] for b in plan] == ["0000-k", "0001-k", "0002-k", "0003-k"]
    # without heavy layers the cut is the plain one; units are never crossed
    assert [b["members"] for b in plan_batches(slugs, 4, "k", weights={}, unit=4)] == \
        [b["members"] for b in plan_batches(slugs, 4, "k")]
    assert [len(b["members"]) for b in plan_batches(slugs, 4, "k", weights={}, unit=6)] == [4, 2, 4]
    assert layer_weight_bytes({"initializers": [{"dtype": "float32", "shape": [64, 64]},
                                                {"dtype": "int8", "shape": [3]}]}) == 64 * 64 * 4 + 3


def test_split_writes_folded_weights_once_and_layers_refer_to_them(tmp_path):
    """Weights that constant folding computes (a ConstantOfShape fill, a Transpose of a stored
    weight) go to the split's archive (folded.irpa, keys ``folded:<name>``), not into each
    layer model; an unchanged archive is left untouched; the values read back are the
    folded ones, and the importer makes them parameters of that scope."""
    w = np.random.default_rng(1).standard_normal((64, 64), dtype=np.float32)
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["fill"],
                              value=numpy_helper.from_array(np.array([0.25], np.float32))),
             helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "fill"], ["a"]),
             helper.make_node("MatMul", ["a", "Wt"], ["y"])]
    inits = [numpy_helper.from_array(np.array([64, 64], np.int64), "shape"), numpy_helper.from_array(w, "W")]
    src = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [tvi("x", T.FLOAT, [1, 64])], [tvi("y", T.FLOAT, [1, 64])], inits), src)
    work = tmp_path / "work"
    work.mkdir()
    model, info = prepare_model(src, store=work / ws.STORE_FILE)
    ws.externalize(model, work / ws.STORE_FILE)
    (work / "prepared.onnx").write_bytes(model.SerializeToString())
    folded = work / ws.FOLDED_FILE
    man = split_layers(xd.load_model(work / "prepared.onnx", weights=False), info, work / "layers", folded_store=folded)
    assert [layer["op_type"] for layer in man["layers"]] == ["MatMul", "MatMul"]
    assert sorted(ws.archive_offsets(folded)) == ["folded:Wt", "folded:fill"]
    mtime = folded.stat().st_mtime_ns
    split_layers(xd.load_model(work / "prepared.onnx", weights=False), info, work / "layers", folded_store=folded)
    assert folded.stat().st_mtime_ns == mtime
    second = xd.load_model(work / "layers" / man["layers"][1]["slug"] / "model.onnx", weights=False)
    t = next(t for t in second.graph.initializer if t.name == "Wt")
    assert xd.is_external(t) and ws.parameter_key(t, {}) == "folded:Wt"
    np.testing.assert_array_equal(xd.tensor_array(t), w.T)
    assert all(p.stat().st_size < 2000 for p in (work / "layers").rglob("model.onnx"))


def test_engines_read_stored_tensors_without_copies(tmp_path):
    """A node model and a whole model whose tensors are in the store run on ONNX Runtime
    from memory (the folder option) and on onnx's evaluator (weights read in), with the
    outputs of the same model inline."""
    from torq_gen_config.reference.model_run import run_model_by_node
    from torq_gen_config.reference.reference_run import run_reference

    inline = _big_const_mlp()
    m = _big_const_mlp()
    ws.externalize(m, tmp_path / ws.STORE_FILE)
    xd.resolve_locations(m, tmp_path)
    detached, folder = xd.detach_locations(m)
    assert folder == str(tmp_path.resolve()) and all(
        not os.path.isabs(xd.external_entries(t)["location"]) for t in xd.model_tensors(detached) if xd.is_external(t))
    x = np.random.default_rng(2).standard_normal((1, 64), dtype=np.float32)
    want = ort.InferenceSession(inline.SerializeToString()).run(None, {"x": x})[0]
    for engine in ("onnxruntime", "onnx"):
        got = run_reference(m, {"x": x}, ["z"], engine=engine)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert xd.is_external(m.graph.initializer[0])  # the caller's model is not changed
    by_node = run_model_by_node(m, {"x": x})
    np.testing.assert_allclose(by_node["values"]["z"], want, rtol=1e-5, atol=1e-5)


def test_every_subgraph_tensor_round_trips_through_the_store_and_the_import(tmp_path):
    """Nested If branches whose weights are Constant nodes and branch initializers (issue
    42 item 2): the preparation moves each of them into the store, the If layer's model
    refers to them, ONNX Runtime reads them back, and the MLIR import writes each one's
    own bytes (inline) or names it as a parameter (external), never an empty tensor."""
    user = if_lstm_model(trap=False)
    want = {t.name: numpy_helper.to_array(t) for t in xd.model_tensors(user)
            if numpy_helper.to_array(t).nbytes >= ws.MIN_EXTERNAL_BYTES}
    # Constants and initializers of the then-branch, of both inner branches (nested)
    assert {"then_W", "then_B", "inner_then_R", "inner_else_B", "ii_big"} <= set(want), sorted(want)
    src = tmp_path / "if_lstm.onnx"
    onnx.save(user, src)
    work = tmp_path / "work"
    work.mkdir()
    store = work / ws.STORE_FILE
    model, info = prepare_model(src, store=store, input_shapes={"x": [5, 1, 64]})
    ws.externalize(model, store)
    xd.save_model(model, work / "prepared.onnx")
    assert set(ws.archive_offsets(store)) == set(want)
    whole = xd.load_model(work / "prepared.onnx", weights=False)
    stored = {t.name for t in xd.model_tensors(whole) if xd.is_external(t)}
    assert stored == set(want)  # none left inside a branch
    man = split_layers(whole, info, work / "layers")
    layer = next(la for la in man["layers"] if la["op_type"] == "If")
    path = work / "layers" / layer["slug"] / "model.onnx"
    read = {t.name: numpy_helper.to_array(t) for t in xd.model_tensors(xd.load_model(path)) if t.name in want}
    assert set(read) == set(want)
    for name, value in want.items():
        np.testing.assert_array_equal(read[name], value, err_msg=name)
    x = np.random.default_rng(0).standard_normal((5, 1, 64), dtype=np.float32)
    expected = onnx.reference.ReferenceEvaluator(user).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(path), xd.session_options(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.tanh(got), expected, rtol=1e-5, atol=1e-6)

    mlir = tmp_path / "if.mlir"
    res = import_layer(path, mlir)
    assert res["status"] == "ok", res["message"]
    write_with_weights(mlir, tmp_path / "if_weights.mlir")
    text = (tmp_path / "if_weights.mlir").read_text()
    for name, value in want.items():
        assert value.tobytes().hex().upper() in text, name
    res = import_layer(path, tmp_path / "if_params.mlir", parameters=True)
    assert res["status"] == "ok", res["message"]
    text = (tmp_path / "if_params.mlir").read_text()
    for name in want:
        assert f'#stream.parameter.named<"model"::"{name}">' in text, name
