"""Op-aware generated inputs (inputs/) and ONNX Runtime I/O for every dtype (ort_io).

Real ONNX Runtime runs, no mocks: node tests from the onnx wheel run on generated
inputs, and small Identity/Cast models check the OrtValue round trip of float8, int4
and bfloat16 tensors against onnx's ReferenceEvaluator.
"""

from __future__ import annotations

import functools
import warnings

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TensorProto, helper, make_model, tvi

from torq_gen_config.core import ort_io
from torq_gen_config.inputs.generate import generate_inputs, make_inputs
from torq_gen_config.inputs.rules import RULES


@functools.lru_cache(maxsize=1)
def _node_tests() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c.model for c in collect_testcases(None)}


def _session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


#: node tests (onnx wheel) per rule family. Most fail on the old uniform inputs (or
#: produce other output shapes than declared; benchmarks/generated_inputs.py); the
#: Gather/Scatter ones had bounded indices before too, the Cast ones need ort_io.
NODE_TESTS = {
    "reshape": ["test_reshape_reordered_all_dims", "test_reshape_negative_dim"],
    "expand": ["test_expand_dim_changed", "test_expand_dim_unchanged"],
    "tile": ["test_tile"],
    "resize": ["test_resize_upsample_scales_linear", "test_resize_downsample_sizes_nearest_not_smaller",
               "test_resize_tf_crop_and_resize", "test_upsample_nearest"],
    "slice": ["test_slice", "test_slice_neg_steps", "test_slice_negative_axes"],
    "split": ["test_split_variable_parts_2d_opset18"],
    "pad": ["test_constant_pad_axes", "test_reflect_pad"],
    "topk": ["test_top_k"],
    "nms": ["test_nonmaxsuppression_two_batches", "test_nonmaxsuppression_center_point_box_format"],
    "onehot": ["test_onehot_with_axis"],
    "gather": ["test_gather_0", "test_gather_elements_1", "test_gathernd_example_int32_batch_dim1",
               "test_nllloss_NCd1_weight", "test_sce_mean_weight"],
    "scatter": ["test_scatter_elements_with_axis", "test_scatternd", "test_scatter_with_axis", "test_tensorscatter"],
    "reduce axes": ["test_reduce_sum_keepdims_random", "test_reduce_mean_do_not_keepdims_example"],
    "squeeze": ["test_squeeze", "test_unsqueeze_unsorted_axes"],
    "cast float8/int4/bf16": ["test_cast_FLOAT_to_FLOAT8E4M3FN", "test_cast_FLOAT8E5M2FNUZ_to_FLOAT",
                              "test_cast_INT4_to_FLOAT", "test_cast_FLOAT_to_UINT4", "test_castlike_BFLOAT16_to_FLOAT"],
    "integer divisor": ["test_div_uint8", "test_mod_mixed_sign_int32"],
    "zero-size dims": ["test_reduce_sum_empty_set", "test_split_zero_size_splits_opset18", "test_triu_zero"],
    "other shapes and counts": ["test_range_int32_type_negative_delta", "test_col2im", "test_affine_grid_2d",
                                "test_maxunpool_export_with_output_shape", "test_loop11", "test_cumsum_2d_axis_0",
                                "test_dft_axis", "test_melweightmatrix", "test_rotary_embedding",
                                "test_reversesequence_time", "test_center_crop_pad_crop_axes_chw",
                                "test_attention_4d_causal_nonpad_batch_prefill", "test_dropout_default_ratio"],
    "data-dependent output counts": ["test_compress_0", "test_string_split_basic",
                                     "test_unique_bfloat16_sorted_without_axis", "test_nonzero_example"],
}


@pytest.mark.parametrize("name", [n for names in NODE_TESTS.values() for n in names])
def test_node_test_runs_on_generated_inputs_with_declared_output_shapes(name):
    model = _node_tests().get(name)
    if model is None:
        pytest.skip(f"{name} is not in this onnx version's node tests")
    sess = _session(model)
    feeds = generate_inputs(model, {"seed": 3})
    assert list(feeds) == [i.name for i in model.graph.input]
    for vi in model.graph.input:
        assert feeds[vi.name].shape == tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    outs = ort_io.run(sess, None, feeds)
    for o, a in zip(model.graph.output, outs):
        dims = o.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            assert a.shape == tuple(d.dim_value for d in dims), (o.name, a.shape)


def test_rules_are_keyed_by_schema_input_names():
    """Every rule names a formal input of its op's current schema (a typo would never fire)."""
    for domain, op, formal in RULES:
        schema = onnx.defs.get_schema(op, onnx.defs.onnx_opset_version() + 10, domain)
        assert formal in [i.name for i in schema.inputs], (domain, op, formal)


# ------------------------------------------------------------------------ rules on small models
def test_reshape_shape_is_the_declared_output_shape_and_unknown_output_keeps_the_count():
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                   [tvi("x", TensorProto.FLOAT, [2, 3, 4]), tvi("s", TensorProto.INT64, [3])],
                   [tvi("y", TensorProto.FLOAT, [4, 1, 6])])
    assert generate_inputs(m)["s"].tolist() == [4, 1, 6]
    m2 = helper.make_model(helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], "g",
        [tvi("x", TensorProto.FLOAT, [2, 3, 4]), tvi("s", TensorProto.INT64, [3])],
        [tvi("y", TensorProto.FLOAT, None)]))
    s = generate_inputs(m2)["s"]
    assert s.dtype == np.int64 and np.prod(s) == 24 and (s > 0).all()


def test_whole_model_rule_reads_intermediate_shapes_from_shape_inference():
    m = make_model([helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Reshape", ["t", "s"], ["y"])],
                   [tvi("x", TensorProto.FLOAT, [2, 6]), tvi("s", TensorProto.INT64, [2])],
                   [tvi("y", TensorProto.FLOAT, [3, 4])])
    assert not m.graph.value_info
    assert generate_inputs(m)["s"].tolist() == [3, 4]


def test_gather_indices_bounded_and_index_rules_ignore_input_ranges():
    table = onnx.numpy_helper.from_array(np.zeros((3, 10), np.float32), "table")
    m = make_model([helper.make_node("Gather", ["table", "idx"], ["y"], axis=1)],
                   [tvi("idx", TensorProto.INT64, [64])], [tvi("y", TensorProto.FLOAT, [3, 64])], [table])
    idx = generate_inputs(m, None, {"idx": [100, 200]})["idx"]
    assert idx.min() >= 0 and idx.max() < 10


def test_unsqueeze_axes_follow_the_output_rank():
    m = make_model([helper.make_node("Unsqueeze", ["x", "a"], ["y"])],
                   [tvi("x", TensorProto.FLOAT, [3, 4]), tvi("a", TensorProto.INT64, [2])],
                   [tvi("y", TensorProto.FLOAT, [1, 3, 1, 4])])
    for seed in range(5):
        a = generate_inputs(m, {"seed": seed})["a"]
        assert sorted(int(v) % 4 for v in a) == [0, 2] and all(-4 <= v < 4 for v in a)


def test_integer_divisor_has_no_zero_but_float_divisor_keeps_plain_values():
    m = make_model([helper.make_node("Div", ["a", "b"], ["y"]), helper.make_node("Div", ["f", "g"], ["z"])],
                   [tvi("a", TensorProto.INT32, [400]), tvi("b", TensorProto.INT32, [400]),
                    tvi("f", TensorProto.FLOAT, [3]), tvi("g", TensorProto.FLOAT, [3])],
                   [tvi("y", TensorProto.INT32, [400]), tvi("z", TensorProto.FLOAT, [3])])
    x = generate_inputs(m)
    assert (x["b"] != 0).all() and x["b"].min() >= -40 and x["b"].max() < 40
    rng = np.random.default_rng(1234)  # a, b (the divisor rule draws the plain values), f, g: one stream
    rng.integers(-40, 40, 400), rng.integers(-40, 40, 400)
    np.testing.assert_array_equal(x["f"], rng.uniform(-1, 1, 3).astype(np.float32))


def test_unsatisfiable_rule_falls_back_to_plain_values():
    """Reshape's data comes from a custom op (no shape): its shape input gets plain ints."""
    nodes = [helper.make_node("Mystery", ["x"], ["t"], domain="com.example"),
             helper.make_node("Reshape", ["t", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [tvi("x", TensorProto.FLOAT, [2, 3]), tvi("s", TensorProto.INT64, [50])],
                              [tvi("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    s = generate_inputs(m)["s"]
    assert s.dtype == np.int64 and s.min() >= -40 and s.max() < 40 and (s < 0).any()


# ------------------------------------------------------------------------ plain values, shapes, dtypes
def test_same_seed_same_arrays_and_plain_values_are_the_old_uniform_draws():
    m = make_model([helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
                    helper.make_node("Add", ["a", "bf"], ["c"])],
                   [tvi("a", TensorProto.FLOAT, [4, 5]), tvi("b", TensorProto.INT64, [4, 5])],
                   [tvi("c", TensorProto.FLOAT, [4, 5])])
    x1, x2, x3 = generate_inputs(m, {"seed": 5}), generate_inputs(m, {"seed": 5}), generate_inputs(m, {"seed": 6})
    for k in x1:
        np.testing.assert_array_equal(x1[k], x2[k])
    assert not np.array_equal(x1["a"], x3["a"])
    rng = np.random.default_rng(5)
    np.testing.assert_array_equal(x1["a"], rng.uniform(-1, 1, (4, 5)).astype(np.float32))
    np.testing.assert_array_equal(x1["b"], rng.integers(-40, 40, (4, 5)))
    for k, v in make_inputs(m, {"seed": 5}).items():  # make_inputs delegates
        np.testing.assert_array_equal(v, x1[k])


def test_rule_values_are_deterministic():
    m = _node_tests()["test_slice_neg_steps"]
    a, b = generate_inputs(m, {"seed": 9}), generate_inputs(m, {"seed": 9})
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_zero_size_dims_give_empty_arrays():
    m = make_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Not", ["b"], ["nb"])],
                   [tvi("x", TensorProto.FLOAT, [2, 0, 3]), tvi("b", TensorProto.BOOL, [0])],
                   [tvi("y", TensorProto.FLOAT, [2, 0, 3]), tvi("nb", TensorProto.BOOL, [0])])
    x = generate_inputs(m)
    assert x["x"].shape == (2, 0, 3) and x["x"].dtype == np.float32 and x["b"].shape == (0,)
    outs = ort_io.run(_session(m), None, x)
    assert outs[0].shape == (2, 0, 3)


@pytest.mark.parametrize("dim, what", [(tvi("x", TensorProto.FLOAT, ["N", 3]), "symbolic ('N')"),
                                       (tvi("x", TensorProto.FLOAT, [None, 3]), "unknown")])
def test_symbolic_or_unknown_dim_is_a_value_error_naming_input_and_dim(dim, what):
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [dim],
                                            [tvi("y", TensorProto.FLOAT, None)]))
    with pytest.raises(ValueError, match=rf"input 'x': dim 0 is {what.replace('(', '[(]').replace(')', '[)]')}"):
        generate_inputs(m)


def test_input_ranges_replace_the_dtype_range():
    m = make_model([helper.make_node("Add", ["f", "f"], ["y"]), helper.make_node("Add", ["q", "q"], ["z"])],
                   [tvi("f", TensorProto.FLOAT, [2000]), tvi("q", TensorProto.INT8, [4096])],
                   [tvi("y", TensorProto.FLOAT, [2000]), tvi("z", TensorProto.INT8, [4096])])
    x = generate_inputs(m, {"seed": 1}, {"f": [2.5, 3.25], "q": [-128, 128]})
    assert 2.5 <= x["f"].min() and x["f"].max() < 3.25
    assert x["q"].min() == -128 and x["q"].max() == 127


def test_every_dtype_gets_values_of_its_numpy_or_ml_dtypes_type():
    types = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN,
             TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT8E8M0,
             TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2, TensorProto.FLOAT4E2M1,
             TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32,
             TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64, TensorProto.BOOL, TensorProto.STRING,
             TensorProto.COMPLEX64]
    ins = [tvi(f"x{t}", t, [3, 4]) for t in types]
    m = helper.make_model(helper.make_graph([], "g", ins, []))
    x = generate_inputs(m)
    for t in types:
        a = x[f"x{t}"]
        assert a.shape == (3, 4) and a.dtype == ort_io.numpy_dtype(t), TensorProto.DataType.Name(t)
    assert x[f"x{TensorProto.INT4}"].astype(int).min() >= -8 and x[f"x{TensorProto.UINT2}"].astype(int).max() <= 3
    assert x[f"x{TensorProto.FLOAT8E8M0}"].astype(np.float32).min() > 0  # no zero, no NaN
    s = x[f"x{TensorProto.STRING}"]
    assert s.dtype == object and all(isinstance(v, str) and 1 <= len(v) <= 8 and v.isascii() for v in s.ravel())


def test_string_inputs_run_in_ort():
    m = _node_tests()["test_equal_string"]
    feeds = generate_inputs(m)
    assert all(a.dtype == object for a in feeds.values())
    assert ort_io.run(_session(m), None, feeds)[0].dtype == np.bool_


def test_string_normalizer_input_holds_as_many_stopwords_as_the_output_drops():
    # (not run: onnxruntime's StringNormalizer needs the en_US.UTF-8 locale, absent on some machines)
    m = _node_tests()["test_strnormalizer_export_monday_casesensintive_lower"]  # x [4] -> y [3], stopword monday
    x = generate_inputs(m)["x"].tolist()
    assert x.count("monday") == 1 and len(x) == 4


# ------------------------------------------------------------------------ ort_io
def _cast_model(src, dst, shape, opset=25):
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=dst)], "g", [tvi("x", src, shape)],
                              [tvi("y", dst, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=11)


def _identity_model(t, shape):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [tvi("x", t, shape)],
                              [tvi("y", t, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)], ir_version=11)


def _check_against_reference(model, x):
    from onnx.reference import ReferenceEvaluator

    got = ort_io.run(_session(model), None, {"x": x})[0]
    want = np.asarray(ReferenceEvaluator(model).run(None, {"x": x})[0])
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    return got


@pytest.mark.parametrize("t", [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                               TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ])
@pytest.mark.parametrize("shape", [[3, 5], [7], [], [0, 2]])
def test_ort_io_round_trip_of_bf16_and_float8(t, shape):
    dt = ort_io.numpy_dtype(t)
    x = np.random.default_rng(0).uniform(-3, 3, size=shape).astype(np.float32)
    got = _check_against_reference(_identity_model(t, shape), x.astype(dt))  # in and out as t
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), x.astype(dt).reshape(-1).view(np.uint8))
    _check_against_reference(_cast_model(TensorProto.FLOAT, t, shape), x)  # out as t
    _check_against_reference(_cast_model(t, TensorProto.FLOAT, shape), x.astype(dt))  # in as t


@pytest.mark.parametrize("t, wide, values", [
    (TensorProto.INT4, TensorProto.INT8, [-8, -1, 0, 1, 7, 3, -3]),
    (TensorProto.UINT4, TensorProto.UINT8, [0, 15, 1, 9, 4]),
    (TensorProto.INT2, TensorProto.INT8, [-2, -1, 0, 1, 1]),
    (TensorProto.UINT2, TensorProto.UINT8, [3, 0, 1, 2, 2, 1]),
])
def test_ort_io_round_trip_of_packed_sub_byte_types(t, wide, values):
    dt = ort_io.numpy_dtype(t)
    for shape in ([len(values)], [1, len(values)]):  # odd counts: a half-filled last byte
        x = np.asarray(values).reshape(shape)
        _check_against_reference(_cast_model(t, wide, shape), x.astype(dt))  # packed feed
        got = _check_against_reference(_cast_model(wide, t, shape), x.astype(ort_io.numpy_dtype(wide)))  # packed output
        np.testing.assert_array_equal(got.astype(np.int64), x)


def test_pack_sub_byte_puts_element_zero_in_the_low_bits():
    a = np.array([1, -2, 7], dtype=ml_dtypes.int4)
    assert ort_io.pack_sub_byte(a, 4).tolist() == [0xE1, 0x07]
    back = ort_io.unpack_sub_byte(np.array([0xE1, 0x07], np.uint8), 4, (3,), ml_dtypes.int4)
    assert back.astype(int).tolist() == [1, -2, 7]


def test_ort_backend_runs_float8_and_int4_layers(tmp_path):
    from torq_gen_config.backends.onnxruntime import OnnxRuntimeBackend

    backend = OnnxRuntimeBackend("ort", {})
    for name, model, x in [
        ("to_f8", _cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN, [2, 3]),
         np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)),
        ("from_i4", _cast_model(TensorProto.INT4, TensorProto.FLOAT, [5]),
         np.array([-8, -1, 0, 1, 7]).astype(ml_dtypes.int4)),
    ]:
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, path)
        art = backend.compile(onnx_path=str(path), mlir_path=None, work_dir=str(tmp_path), timeout_s=60, log_path=None)
        out, _ = backend.run(art, inputs={"x": x}, input_names=["x"], output_names=["y"], work_dir=str(tmp_path),
                             timeout_s=60, log_path=None)
        from onnx.reference import ReferenceEvaluator

        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        assert out["y"].dtype == want.dtype
        np.testing.assert_array_equal(out["y"].astype(np.float32), want.astype(np.float32))


def test_reference_outputs_return_float8_outputs_as_ml_dtypes():
    from torq_gen_config.reference import reference_outputs

    m = _cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E5M2, [4])
    y = reference_outputs(m, {"x": np.array([0.5, -1, 3, 100], np.float32)}, ["y"])[0]
    assert y.dtype == ml_dtypes.float8_e5m2 and y.astype(np.float32).tolist() == [0.5, -1, 3, 96]
