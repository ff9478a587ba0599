"""Tests of torq_gen_config.mlir.merge: imported layer modules merged into one module,
compiled once and run function by function with the real IREE tools."""

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
from torq_gen_config.mlir.importer import import_model
from torq_gen_config.mlir.merge import MergeError, function_name, functions_at, merge_modules, parse_layer_module

vi = h.make_tensor_value_info


def _conv(scale: float) -> onnx.ModelProto:
    """A Conv whose weight initializer is named "w" (the resource key clashes between layers)."""
    w = numpy_helper.from_array(np.full((2, 1, 3, 3), scale, np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "main",
                     [vi("x", T.FLOAT, [1, 1, 4, 4])], [vi("y", T.FLOAT, [1, 2, 4, 4])], initializer=[w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _lppool() -> onnx.ModelProto:
    g = h.make_graph([h.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2])], "main",
                     [vi("x", T.FLOAT, [1, 2, 4, 4])], [vi("y", T.FLOAT, [1, 2, 3, 3])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def layers(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("layers")
    out = {}
    for name, model in (("conv_a", _conv(0.5)), ("conv_b", _conv(-2.0)), ("lppool", _lppool())):
        out[name] = d / f"{name}.mlir"
        import_model(model, out[name])
    return out


def test_function_names_are_unique_bare_identifiers():
    taken: set[str] = set()
    assert function_name("Conv_r0", taken) == "l_Conv_r0"
    assert function_name("a-b.c", taken) == "l_a_b_c"
    assert function_name("a_b_c", taken) == "l_a_b_c_2"  # the sanitized name was taken
    assert taken == {"l_Conv_r0", "l_a_b_c", "l_a_b_c_2"}


def test_parse_rejects_other_forms(layers):
    text = layers["conv_a"].read_text()
    assert parse_layer_module(text).resources[0][0] == "w"
    with pytest.raises(MergeError):
        parse_layer_module("")  # a failed import writes an empty file
    with pytest.raises(MergeError):
        parse_layer_module(text.replace("module {", "module attributes {x = 1} {", 1))
    fn = text[text.index("  func.func"):text.index("\n  }\n") + 4]
    with pytest.raises(MergeError, match="top-level"):
        parse_layer_module(text.replace(fn, fn + fn.replace("@main", "@other"), 1))
    with pytest.raises(MergeError):
        parse_layer_module(text.replace("builtin: {", "other: {", 1))


def test_merged_module_compiles_once_and_runs_each_function(layers, tmp_path):
    """Two layers whose weights share the resource key "w" keep their own weights."""
    members = [(f"l_{n}", parse_layer_module(layers[n].read_text())) for n in ("conv_a", "conv_b")]
    text, spans = merge_modules(members)
    assert "dense_resource<l_conv_a__w>" in text and "dense_resource<l_conv_b__w>" in text
    assert text.count("func.func @") == 2 and spans["l_conv_a"][1] < spans["l_conv_b"][0]
    merged = tmp_path / "batch.mlir"
    merged.write_text(text)
    backend = make_backend({"name": "cpu", "backend": "iree", "options": {"target": "llvm-cpu"}})
    art = backend.compile(onnx_path=None, mlir_path=str(merged), work_dir=str(tmp_path / "m"), timeout_s=300,
                          log_path=None)
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    for name, scale in (("conv_a", 0.5), ("conv_b", -2.0)):
        one = CompiledArtifact(path=art.path, compile_ms=None,
                               info={"function": f"l_{name}", "signature": parse_mlir_signature(layers[name])})
        out, _ = backend.run(one, inputs={"x": x}, input_names=["x"], output_names=["y"],
                             work_dir=str(tmp_path / name), timeout_s=120, log_path=None)
        ref = onnx.reference.ReferenceEvaluator(_conv(scale)).run(None, {"x": x})[0]
        np.testing.assert_allclose(out["y"], ref, rtol=1e-5, atol=1e-5)


def test_error_locations_name_the_failing_function(layers, tmp_path):
    members = [(f"l_{n}", parse_layer_module(layers[n].read_text())) for n in ("conv_a", "lppool", "conv_b")]
    text, spans = merge_modules(members)
    merged = tmp_path / "batch.mlir"
    merged.write_text(text)
    backend = make_backend({"name": "cpu", "backend": "iree", "options": {"target": "vmvx"}})
    from torq_gen_config.backends.base import StageError

    with pytest.raises(StageError) as ei:
        backend.compile(onnx_path=None, mlir_path=str(merged), work_dir=str(tmp_path / "m"), timeout_s=300,
                        log_path=None)
    assert functions_at(ei.value.message, str(merged), spans) == ["l_lppool"]
    # notes and other files do not count
    assert functions_at(f"{merged}:{spans['l_conv_a'][0]}:3: note: x\nother.mlir:{spans['l_conv_b'][0]}:1: error: y",
                        str(merged), spans) == []


def test_merge_refuses_an_undefined_resource(layers):
    layer = parse_layer_module(layers["conv_a"].read_text())
    with pytest.raises(MergeError, match="not defined"):
        merge_modules([("l_a", type(layer)(function_lines=layer.function_lines, resources=()))])
    with pytest.raises(MergeError, match="twice"):
        merge_modules([("l_a", layer), ("l_a", layer)])
