"""Input dims as exporters write them (issue 42, items 4 and 5): which dims are dynamic
(as ONNX Runtime reads them), what --input-shapes and --input-data may set, and how the
dims nothing gives are chosen (model metadata, the model's stride, the smallest size its
shapes accept), checked against ONNX Runtime itself."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.core.errors import ConfigError, ModelError
from torq_gen_config.model.symbolic_dims import (check_run_with_guessed_dims, declared_shape, fix_symbolic_dims,
                                                 input_stride, is_dynamic)
from torq_gen_config.pipeline.steps.prepare import fixed_dims_lines
from torq_gen_config.reference.model_inputs import input_data_shapes, load_input_data

F = TensorProto.FLOAT


def _input(name: str, dims) -> onnx.ValueInfoProto:
    """A float input with these dims: int -> dim_value (also -1), str -> dim_param ("" and
    "?" too), None -> a dim with neither field."""
    vi = helper.make_tensor_value_info(name, F, None)
    shape = vi.type.tensor_type.shape
    shape.SetInParent()
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        elif d is not None:
            dim.dim_param = d
    return vi


def _conv_model(dims, *, pads=1, layers=1) -> onnx.ModelProto:
    """``layers`` 3x3 Convs (3 -> 3 channels) on an input declared with ``dims``."""
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array(np.full((3, 3, 3, 3), 0.05, np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[pads] * 4))
        prev = f"c{i}"
    return make_model(nodes, [_input("x", dims)], [tvi(prev, F, ["", "", "", ""])], inits)


def _yolo_like(*, metadata: bool) -> onnx.ModelProto:
    """A YOLOv8-like neck on ``images: [batch, 3, height, width]``: five stride-2 Convs
    (total stride 32), an SPPF-like MaxPool, an upsample (Resize x2) concatenated with the
    stride-16 map and a stride-2 Conv concatenated with the stride-32 map: it runs only at
    sizes that are multiples of 32. With ``metadata``, Ultralytics' ``imgsz`` / ``batch``."""
    nodes, inits, prev, c, maps = [], [], "images", 3, []
    for i in range(5):
        inits.append(numpy_helper.from_array(np.full((8, c, 3, 3), 0.05, np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], strides=[2, 2], pads=[1] * 4))
        prev, c = f"c{i}", 8
        maps.append(prev)
    inits += [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
              numpy_helper.from_array(np.full((8, 16, 3, 3), 0.05, np.float32), "wd")]
    nodes += [helper.make_node("MaxPool", [prev], ["p5"], kernel_shape=[5, 5], pads=[2] * 4),
              helper.make_node("Resize", ["p5", "", "scales"], ["up"], mode="nearest"),
              helper.make_node("Concat", ["up", maps[3]], ["cat"], axis=1),
              helper.make_node("Conv", ["cat", "wd"], ["down"], strides=[2, 2], pads=[1] * 4),
              helper.make_node("Concat", ["down", "p5"], ["out"], axis=1)]
    m = make_model(nodes, [_input("images", ["batch", 3, "height", "width"])], [tvi("out", F, ["", "", "", ""])],
                   inits)
    if metadata:
        for key, value in (("imgsz", "[64, 96]"), ("batch", "1"), ("stride", "32")):
            p = m.metadata_props.add()
            p.key, p.value = key, value
    return m


def _ort_runs(model: onnx.ModelProto, shape) -> bool:
    """Whether ONNX Runtime runs ``model`` on a ``shape`` input (the user's model, as declared)."""
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    try:
        s.run(None, {s.get_inputs()[0].name: np.ones(shape, np.float32)})
    except Exception:  # onnxruntime's own exception types
        return False
    return True


def _fixed(model) -> tuple[int, ...]:
    return tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)


def test_the_direction_classifier_declaration_is_dynamic_as_in_onnx_runtime(tmp_path):
    """``[-1, 3, ?, ?]``: -1 and both ``?`` are dynamic; the two ``?`` are not one dim;
    --input-shapes and --input-data set them; ONNX Runtime takes the same shapes."""
    model = _conv_model([-1, 3, "?", "?"])
    onnx.checker.check_model(model, full_check=True)
    assert _ort_runs(model, (1, 3, 48, 192)) and _ort_runs(model, (2, 3, 8, 16))
    assert declared_shape(model.graph.input[0]) == (None, 3, None, None)

    m = onnx.ModelProto()
    m.CopyFrom(model)
    assert [(d["axis"], d["was"], d["to"]) for d in fix_symbolic_dims(m)] == [(0, "-1", 1), (2, "?", 32), (3, "?", 32)]

    m.CopyFrom(model)
    fixed = fix_symbolic_dims(m, {"x": [1, 3, 48, 192]})
    assert _fixed(m) == (1, 3, 48, 192) and {d["source"] for d in fixed} == {"--input-shapes"}
    with pytest.raises(ConfigError, match="dim 1 is 3 in the model .*only its dynamic dims can be set"):
        fix_symbolic_dims(onnx.load_from_string(model.SerializeToString()), {"x": [1, 4, 48, 192]})

    np.savez(tmp_path / "in.npz", x=np.ones((1, 3, 48, 192), np.float32))
    assert input_data_shapes(tmp_path / "in.npz", model) == {"x": [1, 3, 48, 192]}
    assert load_input_data(tmp_path / "in.npz", model)["x"].shape == (1, 3, 48, 192)


def test_zero_is_a_zero_size_dim_and_a_valueless_dim_is_dynamic_as_in_onnx_runtime(tmp_path):
    """ONNX Runtime takes only 0 for ``dim_value: 0`` and any size for a dim with no value
    (or an empty name); the tool reads them the same way."""
    model = _conv_model([0, 3, None, ""])
    onnx.checker.check_model(model, full_check=True)
    assert _ort_runs(model, (0, 3, 4, 4)) and not _ort_runs(model, (1, 3, 4, 4))
    assert declared_shape(model.graph.input[0]) == (0, 3, None, None)
    assert [is_dynamic(d) for d in model.graph.input[0].type.tensor_type.shape.dim] == [False, False, True, True]
    fixed = fix_symbolic_dims(model, {"x": [0, 3, 5, 7]})
    assert _fixed(model) == (0, 3, 5, 7) and [d["axis"] for d in fixed] == [2, 3]

    np.savez(tmp_path / "bad.npz", x=np.ones((1, 3, 4, 4), np.float32))
    with pytest.raises(ModelError, match="the model expects 0x3x\\?x\\?"):
        load_input_data(tmp_path / "bad.npz", _conv_model([0, 3, None, ""]))


def test_an_input_without_a_shape_takes_the_given_one_or_asks_for_it():
    """No shape at all (the checker refuses it in a main graph, ONNX Runtime takes any
    rank): a given shape is taken; without one, a one-line error naming --input-shapes."""
    model = _conv_model([1, 3, 4, 4])
    model.graph.input[0].type.tensor_type.ClearField("shape")
    assert declared_shape(model.graph.input[0]) is None
    with pytest.raises(ConfigError, match="declares no shape.*--input-shapes x:DIMS"):
        fix_symbolic_dims(onnx.load_from_string(model.SerializeToString()))
    fix_symbolic_dims(model, {"x": [1, 3, 6, 6]})
    assert _fixed(model) == (1, 3, 6, 6)


def test_named_dims_are_one_dim_but_question_marks_are_not():
    a, b = _input("a", ["n", "?", "?"]), _input("b", ["n", "?"])
    m = make_model([helper.make_node("Identity", ["a"], ["ya"]), helper.make_node("Identity", ["b"], ["yb"])],
                   [a, b], [tvi("ya", F, ["", "", ""]), tvi("yb", F, ["", ""])])
    fixed = fix_symbolic_dims(m, {"a": [2, 5, 7]})
    assert [list(d.dim_value for d in i.type.tensor_type.shape.dim) for i in m.graph.input] == [[2, 5, 7], [2, 1]]
    assert fixed[-2]["source"] == "dim 'n' of a" and fixed[-1]["source"] == "default 1"


def test_ultralytics_metadata_gives_the_image_size():
    model = _yolo_like(metadata=True)
    fixed = fix_symbolic_dims(model)
    assert _fixed(model) == (1, 3, 64, 96)
    assert [d["source"] for d in fixed] == ["model metadata batch", "model metadata imgsz", "model metadata imgsz"]


def test_without_metadata_the_spatial_dims_get_the_smallest_size_the_strides_accept():
    """The default 1 makes ONNX Runtime fail inside the model (the Concat after the
    upsample), 48 (not a multiple of the total stride 32) too; 32x32 runs, but its last
    stride-2 Conv gets a 2x2 map (a window larger than its input): the chosen 64x64 runs."""
    user = _yolo_like(metadata=False)
    assert input_stride(user, "images") == (32, 32)
    assert not _ort_runs(user, (1, 3, 1, 1)) and not _ort_runs(user, (1, 3, 48, 48))
    model = onnx.load_from_string(user.SerializeToString())
    fixed = fix_symbolic_dims(model)
    assert _fixed(model) == (1, 3, 64, 64) and _ort_runs(user, _fixed(model))
    assert [d["source"] for d in fixed] == ["default 1", "the model's stride 32", "the model's stride 32"]


def _recognizer_like() -> onnx.ModelProto:
    """A text recognizer as PaddleOCR exports it (``x: [?, 3, ?, ?]``): Convs with
    strides [2, 2], [2, 1], [1, 2], [2, 1], [2, 1] and an AveragePool [3, 2] reduce H by
    48 and W by 8; the feature map's H must then be 1 (a Squeeze of axis 2, as the
    recognizer's neck reshapes H away): it runs only where H is a multiple of 48 below 96."""
    nodes, inits, prev = [], [], "x"
    for i, strides in enumerate(([2, 2], [2, 1], [1, 2], [2, 1], [2, 1])):
        inits.append(numpy_helper.from_array(np.full((3, 3, 3, 3), 0.05, np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], strides=strides, pads=[1] * 4))
        prev = f"c{i}"
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "h_axis"))
    nodes += [helper.make_node("AveragePool", [prev], ["pooled"], kernel_shape=[3, 2], strides=[3, 2]),
              helper.make_node("Squeeze", ["pooled", "h_axis"], ["seq"])]
    return make_model(nodes, [_input("x", ["batch", 3, "?", "width"])], [tvi("seq", F, ["", "", ""])], inits)


def test_each_spatial_axis_gets_a_multiple_of_its_own_stride():
    """One total stride for both axes (the largest per op: 96) gives H = 96, where the
    recognizer's H is 2 after the pool and the Squeeze fails; per axis (48, 8) the chosen
    48 x 32 runs."""
    user = _recognizer_like()
    assert input_stride(user, "x") == (48, 8)
    assert not _ort_runs(user, (1, 3, 96, 96))
    model = onnx.load_from_string(user.SerializeToString())
    fixed = fix_symbolic_dims(model)
    assert _fixed(model) == (1, 3, 48, 32) and _ort_runs(user, _fixed(model))
    assert [d["source"] for d in fixed] == ["default 1", "the model's stride 48", "the model's stride 8"]


def _detector_like() -> onnx.ModelProto:
    """A detector head as PaddleOCR exports it (``x: [?, 3, ?, ?]``): four 3x3 stride-2
    Convs, then a 5x5 stride-2 depthwise-like Conv (total stride 32), and a Resize x2 whose
    ``roi`` is an empty constant (as Paddle2ONNX writes it)."""
    nodes, inits, prev = [], [], "x"
    for i in range(4):
        inits.append(numpy_helper.from_array(np.full((3, 3, 3, 3), 0.05, np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], strides=[2, 2], pads=[1] * 4))
        prev = f"c{i}"
    inits += [numpy_helper.from_array(np.full((3, 1, 5, 5), 0.04, np.float32), "w5"),
              numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes += [helper.make_node("Conv", [prev, "w5"], ["deep"], strides=[2, 2], pads=[2] * 4, group=3),
              helper.make_node("Constant", [], ["roi"], value=numpy_helper.from_array(np.zeros(0, np.float32))),
              helper.make_node("Resize", ["deep", "roi", "scales"], ["up"], mode="nearest")]
    return make_model(nodes, [_input("x", ["batch", 3, "h", "w"])], [tvi("up", F, ["", "", "", ""])], inits)


def test_a_strided_window_larger_than_its_input_is_not_a_size_to_test():
    """At 32 and 64 the 5x5 stride-2 Conv gets a 2x2 and a 4x4 map (legal with padding,
    ONNX Runtime runs it, IREE's compile fails on PaddleOCR's detector); 128 gives 8x8.
    The empty ``roi`` constant is not a zero-size tensor the sizes made."""
    user = _detector_like()
    assert _ort_runs(user, (1, 3, 32, 32))
    model = onnx.load_from_string(user.SerializeToString())
    fixed = fix_symbolic_dims(model)
    assert _fixed(model) == (1, 3, 128, 128) and _ort_runs(user, _fixed(model))
    assert [d["source"] for d in fixed] == ["default 1", "the model's stride 32", "the model's stride 32"]
    assert not any(d.get("unfit") for d in fixed)
    assert "the smallest multiple of the model's stride 32, at least 32, that the model's shapes fit" in \
        fixed_dims_lines(fixed, {"x": [1, 3, 128, 128]})[0]


def test_when_no_size_fits_the_warning_says_so():
    """The flattened feature map added to a constant of 3 x 20 x 20 values: only H = W = 40
    fits (not a multiple of the stride 2 that is tried); no size tried passes the shape
    inference, the dims get the base size and the warning does not claim that it fits."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1] * 4),
             helper.make_node("Flatten", ["c"], ["flat"]),
             helper.make_node("Add", ["flat", "bias"], ["y"])]
    inits = [numpy_helper.from_array(np.full((3, 3, 3, 3), 0.05, np.float32), "w"),
             numpy_helper.from_array(np.zeros((1, 3 * 20 * 20), np.float32), "bias")]
    model = make_model(nodes, [_input("x", [1, 3, "?", "?"])], [tvi("y", F, ["", ""])], inits)
    fixed = fix_symbolic_dims(model)
    assert _fixed(model) == (1, 3, 32, 32) and all(d.get("unfit") for d in fixed)
    line = fixed_dims_lines(fixed, {"x": [1, 3, 32, 32]})[0]
    assert "though the model's shapes fit no size tried (up to 32 times it)" in line
    assert "that the model's shapes fit" not in line


def test_a_channels_last_input_gets_its_height_and_width():
    """``[?, ?, ?, 3]`` (TensorFlow's layout, transposed inside the model): read as NCHW, H
    would be the channels and a 1-pixel-high image would pass the padded Convs; NHWC is
    tried first for a static last dim."""
    nodes = [helper.make_node("Transpose", ["x"], ["nchw"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["nchw", "w"], ["c"], strides=[2, 2], pads=[1] * 4),
             helper.make_node("Conv", ["c", "w"], ["y"], strides=[2, 2], pads=[1] * 4)]
    inits = [numpy_helper.from_array(np.full((3, 3, 3, 3), 0.05, np.float32), "w")]
    model = make_model(nodes, [_input("x", ["n", "h", "w", 3])], [tvi("y", F, ["", "", "", ""])], inits)
    fixed = fix_symbolic_dims(model)
    assert _fixed(model) == (1, 32, 32, 3)
    assert [d["source"] for d in fixed] == ["default 1", "the model's stride 4", "the model's stride 4"]


def test_without_strides_the_smallest_size_the_shapes_accept():
    """Four unpadded 3x3 Convs need 9x9 at least: 1 (and 8, which leaves 0x0) are refused
    by ONNX Runtime; the sizes tried start at 32 (MIN_SPATIAL), which the shapes accept."""
    user = _conv_model([-1, 3, "?", "?"], pads=0, layers=4)
    assert not _ort_runs(user, (1, 3, 1, 1)) and not _ort_runs(user, (1, 3, 8, 8))
    model = onnx.load_from_string(user.SerializeToString())
    fixed = fix_symbolic_dims(model)
    assert _fixed(model) == (1, 3, 32, 32) and _ort_runs(user, _fixed(model))
    assert fixed[1]["source"] == "the smallest size the model's shapes accept"


def test_a_run_that_fails_with_guessed_dims_is_a_warning_or_an_error_naming_input_shapes():
    fixed = [{"input": "images", "axis": 0, "was": "batch", "to": 1, "source": "default 1"},
             {"input": "images", "axis": 2, "was": "height", "to": 32, "source": "the model's stride 32"},
             {"input": "images", "axis": 3, "was": "width", "to": 32, "source": "the model's stride 32"}]
    shapes = {"images": [1, 3, 32, 32]}
    failed = [{"op_type": "Concat", "name": "cat", "graph_index": 7, "errors": {"onnxruntime": "bad dims"}}]
    assert check_run_with_guessed_dims(fixed, shapes, {"ran": True, "failed_nodes": []}) is None
    assert check_run_with_guessed_dims(fixed[:1], shapes, {"ran": True, "failed_nodes": failed}) is None
    warning = check_run_with_guessed_dims(fixed, shapes, {"ran": True, "failed_nodes": failed, "nodes_run": 9,
                                                          "nodes_not_run": 3})
    assert "Concat node cat" in warning and "--input-shapes images:1x3x32x32" in warning
    with pytest.raises(ConfigError, match="190 of 323 nodes get no value.*--input-shapes images:1x3x32x32"):
        check_run_with_guessed_dims(fixed, shapes, {"ran": True, "failed_nodes": failed, "nodes_run": 133,
                                                    "nodes_not_run": 190})

    lines = fixed_dims_lines(fixed, shapes)
    assert lines[0].startswith("warning: input images dim(s) 2, 3 (height, width)")
    assert "--input-shapes images:1x3x32x32" in lines[0] and lines[1].startswith("note: input images dim 0")



def test_input_data_as_one_npy_array_for_a_model_with_one_input(tmp_path):
    """The fresh-user test: a single .npy array was refused; it is the input of a model
    with one input, and a clear one-line error for a model with several."""
    from torq_gen_config.reference.model_inputs import input_data_shapes, load_input_data

    model = _conv_model([-1, 3, "?", "?"])
    x = np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    assert input_data_shapes(tmp_path / "x.npy", model) == {"x": [1, 3, 48, 192]}
    np.testing.assert_array_equal(load_input_data(tmp_path / "x.npy", model)["x"], x)
    two = make_model([helper.make_node("Add", ["a", "b"], ["y"])], [tvi("a", TensorProto.FLOAT, [2]),
                                                                    tvi("b", TensorProto.FLOAT, [2])],
                     [tvi("y", TensorProto.FLOAT, [2])])
    with pytest.raises(ModelError, match=r"single \.npy array, and the model has 2 inputs \['a', 'b'\]"):
        load_input_data(tmp_path / "x.npy", two)
