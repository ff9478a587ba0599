"""Tests of torq_gen_config.model.mac_count on small single-node ONNX models (numbers by hand)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq_gen_config.model.mac_count import mac_count

F = TensorProto.FLOAT


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _init(name, shape, dtype=np.float32):
    return numpy_helper.from_array(np.zeros(shape, dtype=dtype), name)


def _model(node, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph([node], "layer", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_conv_3x3_pad1():
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    m = _model(node, [_vi("x", [1, 3, 32, 32])], [_vi("y", [1, 16, 32, 32])],
               [_init("W", (16, 3, 3, 3)), _init("B", (16,))])
    assert mac_count(m) == 16 * 32 * 32 * 3 * 3 * 3  # 442,368


def test_conv_output_shape_inferred_when_absent():
    node = helper.make_node("Conv", ["x", "W"], ["y"], strides=[2, 2])
    m = _model(node, [_vi("x", [1, 3, 32, 32])], [_vi("y", None)], [_init("W", (8, 3, 3, 3))])
    # no padding, stride 2: (32 - 3) // 2 + 1 = 15
    assert mac_count(m) == 8 * 15 * 15 * 27


def test_depthwise_conv():
    node = helper.make_node("Conv", ["x", "W"], ["y"], group=8, pads=[1, 1, 1, 1])
    m = _model(node, [_vi("x", [1, 8, 16, 16])], [_vi("y", [1, 8, 16, 16])], [_init("W", (8, 1, 3, 3))])
    assert mac_count(m) == 8 * 16 * 16 * 9  # 18,432


def test_qlinearconv_uses_weight_input_3():
    u8 = TensorProto.UINT8
    inits = [
        _init("xs", (), np.float32), _init("xz", (), np.uint8), _init("W", (4, 2, 1, 1), np.uint8),
        _init("ws", (), np.float32), _init("wz", (), np.uint8), _init("ys", (), np.float32), _init("yz", (), np.uint8),
    ]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "W", "ws", "wz", "ys", "yz"], ["y"])
    m = _model(node, [_vi("x", [1, 2, 5, 5], u8)], [_vi("y", [1, 4, 5, 5], u8)], inits)
    assert mac_count(m) == 4 * 5 * 5 * 2  # 200


def test_conv_transpose_uses_input_shape():
    node = helper.make_node("ConvTranspose", ["x", "W"], ["y"], strides=[2, 2])
    m = _model(node, [_vi("x", [1, 4, 8, 8])], [_vi("y", [1, 2, 17, 17])], [_init("W", (4, 2, 3, 3))])
    assert mac_count(m) == (4 * 8 * 8) * (2 * 3 * 3)  # 4,608


@pytest.mark.parametrize(
    "a_shape, b_shape, attrs",
    [((4, 8), (8, 5), {}), ((8, 4), (8, 5), {"transA": 1}), ((4, 8), (5, 8), {"transB": 1}),
     ((8, 4), (5, 8), {"transA": 1, "transB": 1})],
)
def test_gemm_honours_transposes(a_shape, b_shape, attrs):
    node = helper.make_node("Gemm", ["a", "b"], ["y"], **attrs)
    m = _model(node, [_vi("a", list(a_shape))], [_vi("y", [4, 5])], [_init("b", b_shape)])
    assert mac_count(m) == 4 * 8 * 5  # M=4, K=8, N=5


@pytest.mark.parametrize(
    "a_shape, b_shape, expected",
    [
        ((2, 3, 4), (4, 5), 2 * 3 * 5 * 4),  # batched: 120
        ((4,), (4, 5), 5 * 4),  # 1-D A: output (5,)
        ((2, 3, 4), (4,), 2 * 3 * 4),  # 1-D B: output (2, 3)
        ((4,), (4,), 4),  # dot product: scalar output
        ((7, 1, 3, 4), (6, 4, 2), 7 * 6 * 3 * 2 * 4),  # broadcast batch dims
    ],
)
def test_matmul_prod_output_times_k(a_shape, b_shape, expected):
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    m = _model(node, [_vi("a", list(a_shape)), _vi("b", list(b_shape))], [_vi("y", None)])
    assert mac_count(m) == expected


def test_matmul_integer_and_qlinear_matmul():
    u8 = TensorProto.UINT8
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    m = _model(node, [_vi("a", [3, 4], u8)], [_vi("y", [3, 6], TensorProto.INT32)], [_init("b", (4, 6), np.uint8)])
    assert mac_count(m) == 3 * 6 * 4
    inits = [_init("as", (), np.float32), _init("az", (), np.uint8), _init("b", (4, 6), np.uint8),
             _init("bs", (), np.float32), _init("bz", (), np.uint8), _init("ys", (), np.float32),
             _init("yz", (), np.uint8)]
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    m = _model(node, [_vi("a", [2, 3, 4], u8)], [_vi("y", [2, 3, 6], u8)], inits)
    assert mac_count(m) == 2 * 3 * 6 * 4


@pytest.mark.parametrize(
    "equation, shapes, expected",
    [
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], 2 * 3 * 4 * 5),
        ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)], 2 * 3 * 4 * 5),
        ("ij,ij->i", [(6, 7), (6, 7)], 6 * 7),
        ("bhqd,bhkd->bhqk", [(1, 2, 8, 16), (1, 2, 10, 16)], 1 * 2 * 8 * 16 * 10),
    ],
)
def test_einsum_distinct_labels(equation, shapes, expected):
    names = [f"in{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    m = _model(node, [_vi(n, list(s)) for n, s in zip(names, shapes)], [_vi("y", None)], opset=17)
    assert mac_count(m) == expected


def test_lstm_and_gru():
    seq, batch, inp, hidden = 5, 2, 3, 4
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hidden)
    m = _model(node, [_vi("x", [seq, batch, inp])], [_vi("y", None)],
               [_init("W", (1, 4 * hidden, inp)), _init("R", (1, 4 * hidden, hidden))])
    assert mac_count(m) == seq * batch * (16 * 3 + 16 * 4)  # 1,120
    # GRU with layout=1 (batch first), bidirectional
    node = helper.make_node("GRU", ["x", "W", "R"], ["y"], hidden_size=hidden, layout=1, direction="bidirectional")
    m = _model(node, [_vi("x", [batch, seq, inp])], [_vi("y", None)],
               [_init("W", (2, 3 * hidden, inp)), _init("R", (2, 3 * hidden, hidden))])
    assert mac_count(m) == seq * batch * (2 * 12 * 3 + 2 * 12 * 4)  # 1,680


def test_ops_without_formula_and_dynamic_shapes_give_none():
    relu = helper.make_node("Relu", ["x"], ["y"])
    assert mac_count(_model(relu, [_vi("x", [1, 4])], [_vi("y", [1, 4])])) is None
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    dynamic = _model(node, [_vi("a", ["N", 4])], [_vi("y", None)], [_init("b", (4, 5))])
    assert mac_count(dynamic) is None
    conv = helper.make_node("Conv", ["x", "W"], ["y"])
    dyn_conv = _model(conv, [_vi("x", [1, 3, "H", "W_"])], [_vi("y", None)], [_init("W", (8, 3, 3, 3))])
    assert mac_count(dyn_conv) is None


def test_qdq_layer_counts_only_the_compute_node():
    dq = helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x"])
    conv = helper.make_node("Conv", ["x", "W"], ["y"])
    graph = helper.make_graph(
        [dq, conv], "layer", [_vi("xq", [1, 2, 4, 4], TensorProto.UINT8)], [_vi("y", [1, 3, 2, 2])],
        [_init("s", (), np.float32), _init("z", (), np.uint8), _init("W", (3, 2, 3, 3))],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert mac_count(m) == 3 * 2 * 2 * (2 * 3 * 3)  # 216
