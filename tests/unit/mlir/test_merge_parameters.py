"""Layers imported with their stored weights as IREE parameters (``parameters: external``,
docs/parameters.md): the import's form, the batch merge of such modules (globals renamed per
function, two layers reading one tensor), and a compile + run with ``--parameters`` that
gives the outputs of onnx's reference implementation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.reference
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from torq_gen_config.backends import make_backend
from torq_gen_config.backends.base import CompiledArtifact
from torq_gen_config.backends.iree_tools import parse_mlir_signature
from torq_gen_config.backends.parameters import with_parameters
from torq_gen_config.mlir.importer import import_model
from torq_gen_config.mlir.merge import MergeError, merge_modules, parse_layer_module
from torq_gen_config.core.external_data import load_model, load_weights
from torq_gen_config.core.weight_store import externalize

vi = h.make_tensor_value_info
RNG = np.random.default_rng(7)
W = (RNG.standard_normal((16, 32)) * 0.2).astype(np.float32)  # 2 KiB: stored
IDX = RNG.integers(0, 8, size=(256,)).astype(np.int64)  # 2 KiB of int64: stored, a signless i64 global
B = np.arange(4, dtype=np.float32)  # 16 bytes: stays inline


def _layer(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = h.make_graph(nodes, "main", inputs, outputs, initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)  # the split's layer models carry every type


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict:
    """The store of a model holding ``w`` and ``idx`` (``weights.irpa``), and layer models
    that refer to it: two MatMuls reading ``w`` (the same tensor), a Gather with ``idx``."""
    d = tmp_path_factory.mktemp("store")
    holder = _layer([], [], [], [numpy_helper.from_array(W, "w"), numpy_helper.from_array(IDX, "idx")])
    externalize(holder, d / "weights.irpa")
    onnx.save(holder, d / "prepared.onnx")
    tensors = {t.name: t for t in load_model(d / "prepared.onnx", weights=False).graph.initializer}
    layers = {
        "mm_a": _layer([h.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", T.FLOAT, [2, 16])],
                       [vi("y", T.FLOAT, [2, 32])], [tensors["w"]]),
        "mm_b": _layer([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])],
                       [vi("x", T.FLOAT, [2, 16])], [vi("y", T.FLOAT, [2, 32])], [tensors["w"]]),
        "gather": _layer([h.make_node("Gather", ["x", "idx"], ["g"]), h.make_node("Add", ["g", "b"], ["y"])],
                         [vi("x", T.FLOAT, [8, 4])], [vi("y", T.FLOAT, [256, 4])],
                         [tensors["idx"], numpy_helper.from_array(B, "b")]),
    }
    mlir = {}
    for name, m in layers.items():
        mlir[name] = d / f"{name}.mlir"
        import_model(m, mlir[name], parameters=True)
    return {"dir": d, "layers": layers, "mlir": mlir, "store": d / "weights.irpa"}


def _reference(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    load_weights(m)
    return onnx.reference.ReferenceEvaluator(m).run(None, feeds)[0]


def test_stored_tensors_are_named_parameters(stored):
    text = stored["mlir"]["gather"].read_text()
    assert 'util.global private @idx = #stream.parameter.named<"model"::"idx"> : tensor<256xi64>' in text
    assert "util.global.load @idx : tensor<256xi64>" in text
    assert "torch_c.from_builtin_tensor" in text and "!torch.vtensor<[256],si64>" in text
    assert "dense_resource<b>" in text  # under 1 KiB: inline
    layer = parse_layer_module(text)
    assert [g[0] for g in layer.globals] == ["idx"]


def test_merge_renames_the_globals_per_function(stored):
    members = [(f"l_{n}", parse_layer_module(stored["mlir"][n].read_text())) for n in ("mm_a", "mm_b", "gather")]
    text, spans = merge_modules(members)
    for fn in ("l_mm_a", "l_mm_b"):  # one tensor, two layers: a global each, one parameter
        assert f'util.global private @{fn}__w = #stream.parameter.named<"model"::"w">' in text
        assert f"util.global.load @{fn}__w :" in text
    assert "util.global.load @w " not in text and "@l_gather__idx" in text
    # a function's span starts at its globals
    lines = text.splitlines()
    assert lines[spans["l_mm_b"][0] - 1].startswith("  util.global private @l_mm_b__w")


def test_merged_module_runs_each_function_with_the_store(stored, tmp_path):
    members = [(f"l_{n}", parse_layer_module(stored["mlir"][n].read_text())) for n in ("mm_a", "mm_b", "gather")]
    text, _ = merge_modules(members)
    merged = tmp_path / "batch.mlir"
    merged.write_text(text)
    ex = with_parameters({"name": "cpu", "backend": "iree", "options": {"target": "llvm-cpu"}},
                         {"mode": "external"}, [str(stored["store"])])
    assert ex["options"]["run_flags"] == [f"--parameters=model={stored['store']}"]
    backend = make_backend(ex)
    art = backend.compile(onnx_path=None, mlir_path=str(merged), work_dir=str(tmp_path / "m"), timeout_s=300,
                          log_path=None)
    assert "stream.parameter" not in Path(art.path).read_bytes().decode("latin-1")
    feeds = {"mm_a": {"x": RNG.standard_normal((2, 16)).astype(np.float32)},
             "mm_b": {"x": RNG.standard_normal((2, 16)).astype(np.float32)},
             "gather": {"x": RNG.standard_normal((8, 4)).astype(np.float32)}}
    for name, x in feeds.items():
        one = CompiledArtifact(path=art.path, compile_ms=None,
                               info={"function": f"l_{name}", "signature": parse_mlir_signature(stored["mlir"][name])})
        out, _ = backend.run(one, inputs=x, input_names=["x"], output_names=["y"], work_dir=str(tmp_path / name),
                             timeout_s=120, log_path=None)
        np.testing.assert_allclose(out["y"], _reference(stored["layers"][name], x), rtol=1e-5, atol=1e-5)
    # without the store the module cannot be loaded: the weights really are parameters
    bare = make_backend({"name": "cpu", "backend": "iree", "options": {"target": "llvm-cpu"}})
    from torq_gen_config.backends.base import StageError

    with pytest.raises(StageError, match="parameter|scope"):
        bare.run(CompiledArtifact(path=art.path, compile_ms=None, info={"function": "l_mm_a"}), inputs=feeds["mm_a"],
                 input_names=["x"], output_names=["y"], work_dir=str(tmp_path / "bare"), timeout_s=120, log_path=None)


def test_merge_refuses_other_globals_and_undefined_loads(stored):
    text = stored["mlir"]["mm_a"].read_text()
    with pytest.raises(MergeError):  # a global that is not a named parameter
        parse_layer_module(text.replace('#stream.parameter.named<"model"::"w">', "dense<0.0>", 1))
    layer = parse_layer_module(text)
    with pytest.raises(MergeError, match="not a global"):
        merge_modules([("l_a", type(layer)(function_lines=layer.function_lines, resources=layer.resources))])
