"""The converter: TraceLens IR records -> CK configurations (validation, codes, layouts, summary)."""

from __future__ import annotations

import json

import pytest

from irgen import DATA, backward, forward, write
from torq_gen_config.ck import convert, profiler_args as pa
from torq_gen_config.ck.trace_ir import TraceFormatError, read_trace


def one(records):
    conv = convert.convert_records(records)
    return conv, conv.configs


def args_of(cfg):
    return cfg["profiler_args"]


def test_plain_forward_matches_the_seed_example():
    # the seed's example: G=32, N=32, K=4, C=4, 3x3 on 200x200, pad 1
    conv, [cfg] = one([forward([32, 128, 200, 200], [128, 4, 3, 3], padding=(1, 1), groups=32)])
    assert cfg["operation_type"] == "grouped_conv_fwd"
    a = args_of(cfg)
    assert (a["G"], a["N"], a["K"], a["C"]) == (32, 32, 4, 4)
    assert a["data_type"] == 1 and a["layout"] == 3 and a["index_type"] == 0
    assert a["filter_spatial"] == [3, 3] and a["input_spatial"] == [200, 200]
    assert a["left_pads"] == a["right_pads"] == [1, 1] and "split_k" not in a
    assert cfg["metadata"]["description"] == "Forward conv: G=32, N=32, K=4, C=4, [3, 3] kernel, [200, 200] input, fp16"
    argv, _ = pa.command_args(cfg)
    assert " ".join(argv) == "grouped_conv_fwd 1 3 0 0 1 0 1 2 32 32 4 4 3 3 200 200 1 1 1 1 1 1 1 1"


@pytest.mark.parametrize("x,w,groups,kc", [
    ([2, 16, 9, 9], [32, 16, 3, 3], 1, (1, 32, 16)),        # plain
    ([2, 16, 9, 9], [32, 4, 3, 3], 4, (4, 8, 4)),           # grouped: per-group K and C
    ([2, 16, 9, 9], [16, 1, 3, 3], 16, (16, 1, 1)),         # depthwise
    ([2, 16, 9, 9], [48, 1, 3, 3], 16, (16, 3, 1)),         # depthwise with multiplier 3
    ([2, 16, 9, 9], [8, 16, 1, 1], 1, (1, 8, 16)),          # 1x1
])
def test_groups_give_per_group_channels(x, w, groups, kc):
    _, [cfg] = one([forward(x, w, groups=groups)])
    a = args_of(cfg)
    assert (a["G"], a["K"], a["C"]) == kc


def test_strided_dilated_asymmetric_padding():
    # padding of 2*ndim entries: begins then ends
    _, [f] = one([forward([1, 4, 20, 17], [8, 4, 3, 5], padding=[1, 0, 2, 3], stride=(2, 3), dilation=(2, 1))])
    a = args_of(f)
    assert a["strides"] == [2, 3] and a["dilations"] == [2, 1]
    assert a["left_pads"] == [1, 0] and a["right_pads"] == [2, 3]
    # the backward record's grad_output is checked against the asymmetric output size
    conv, cfgs = one([backward([1, 4, 20, 17], [8, 4, 3, 5], padding=[1, 0, 2, 3], stride=(2, 3), dilation=(2, 1))])
    assert [c["operation_type"] for c in cfgs] == ["grouped_conv_bwd_data", "grouped_conv_bwd_weight"]
    assert not conv.skipped


def test_scalar_and_one_element_lists_broadcast():
    rec = forward([1, 4, 10, 10], [4, 4, 3, 3])
    args = {a["arg_name"]: a for a in rec["replay_ir"]["list_pos_args"]}
    args["stride"]["value"] = 2
    args["padding"]["value"] = [1]
    _, [cfg] = one([rec])
    assert args_of(cfg)["strides"] == [2, 2] and args_of(cfg)["left_pads"] == [1, 1]


def test_one_and_three_spatial_dims():
    conv, cfgs = one([forward([2, 8, 50], [16, 8, 5], padding=(2,), stride=(1,), dilation=(1,)),
                      backward([2, 8, 50], [16, 8, 5], padding=(2,), stride=(1,), dilation=(1,)),
                      forward([1, 4, 6, 8, 8], [4, 4, 3, 3, 3], padding=(1, 1, 1), stride=(1, 1, 1), dilation=(1, 1, 1)),
                      backward([1, 4, 6, 8, 8], [4, 4, 3, 3, 3], padding=(1, 1, 1), stride=(1, 1, 1), dilation=(1, 1, 1))])
    ops = [(c["operation_type"], args_of(c)["num_dim_spatial"], args_of(c)["layout"]) for c in cfgs]
    # 1D: CK has no NGCW layouts: fwd in NWGC (1), bwd_weight in GNWC (its code 1); no 1D bwd_data
    assert ops == [("grouped_conv_fwd", 1, 1), ("grouped_conv_bwd_weight", 1, 1),
                   ("grouped_conv_fwd", 3, 3), ("grouped_conv_bwd_data", 3, 3), ("grouped_conv_bwd_weight", 3, 4)]
    assert [s[2:] for s in conv.skipped] == [("bwd_data", "CK's grouped_conv_bwd_data has no 1D instances")]
    assert cfgs[0]["metadata"]["layout_name"] == "NWGC_GKXC_NWGK" and cfgs[0]["metadata"]["notes"]
    assert cfgs[2]["metadata"]["layout_name"] == "NGCDHW_GKCZYX_NGKDHW"
    assert any("layout-3" in n for n in cfgs[3]["metadata"]["notes"])  # the upstream bwd_data 3D bug, said


@pytest.mark.parametrize("mask,ops", [
    ((True, True, False), ["grouped_conv_bwd_data", "grouped_conv_bwd_weight"]),
    ((False, True, False), ["grouped_conv_bwd_weight"]),
    ((True, False, False), ["grouped_conv_bwd_data"]),
    ((True, True, True), ["grouped_conv_bwd_data", "grouped_conv_bwd_weight"]),
])
def test_output_mask_selects_the_passes(mask, ops):
    conv, cfgs = one([backward([4, 8, 14, 14], [16, 8, 3, 3], padding=(1, 1), mask=mask)])
    assert [c["operation_type"] for c in cfgs] == ops
    assert all(c["metadata"]["pytorch_op"] == "aten::convolution_backward" for c in cfgs)
    if mask[2]:
        assert all("bias gradient" in " ".join(c["metadata"]["notes"]) for c in cfgs)


def test_bias_only_mask_is_skipped():
    conv, cfgs = one([backward([4, 8, 14, 14], [16, 8, 3, 3], mask=(False, False, True))])
    assert cfgs == [] and "asks for no data or weight gradient" in conv.skipped[0][3]


@pytest.mark.parametrize("dtype,codes", [
    ("c10::Half", {"grouped_conv_fwd": 1, "grouped_conv_bwd_data": 1, "grouped_conv_bwd_weight": 1}),
    ("c10::BFloat16", {"grouped_conv_fwd": 2, "grouped_conv_bwd_data": 2, "grouped_conv_bwd_weight": 5}),
    ("float", {"grouped_conv_fwd": 0, "grouped_conv_bwd_data": 0, "grouped_conv_bwd_weight": 0}),
])
def test_dtype_from_the_trace_with_per_op_codes(dtype, codes):
    _, cfgs = one([forward([2, 8, 7, 7], [8, 8, 3, 3], dtype=dtype), backward([2, 8, 7, 7], [8, 8, 3, 3], dtype=dtype)])
    assert {c["operation_type"]: args_of(c)["data_type"] for c in cfgs} == codes
    assert len({c["metadata"]["dtype"] for c in cfgs}) == 1


def test_double_is_refused():
    conv, cfgs = one([forward([2, 8, 7, 7], [8, 8, 3, 3], dtype="double")])
    assert cfgs == [] and "dtype double" in conv.skipped[0][3]


def test_layout_codes_contiguous_and_channels_last():
    _, cfgs = one([forward([2, 8, 7, 7], [8, 8, 3, 3]), backward([2, 8, 7, 7], [8, 8, 3, 3]),
                   forward([2, 8, 7, 7], [8, 8, 3, 3], layout="cl"), backward([2, 8, 7, 7], [8, 8, 3, 3], layout="cl")])
    got = [(c["operation_type"], args_of(c)["layout"], c["metadata"]["layout_name"]) for c in cfgs]
    assert got == [("grouped_conv_fwd", 3, "NGCHW_GKCYX_NGKHW"), ("grouped_conv_bwd_data", 3, "NGCHW_GKCYX_NGKHW"),
                   ("grouped_conv_bwd_weight", 4, "NGCHW_GKCYX_NGKHW"),  # bwd_weight's codes are shifted by one
                   ("grouped_conv_fwd", 1, "NHWGC_GKYXC_NHWGK"), ("grouped_conv_bwd_data", 1, "NHWGC_GKYXC_NHWGK"),
                   ("grouped_conv_bwd_weight", 2, "NHWGC_GKYXC_NHWGK")]


def test_mixed_memory_formats():
    # contiguous activations with a channels-last weight: NGCHW_GKYXC (2)
    _, [cfg] = one([forward([2, 8, 7, 7], [8, 8, 3, 3], w_layout="cl")])
    assert args_of(cfg)["layout"] == 2
    # channels-last activations with a contiguous weight: no CK layout, said
    conv, cfgs = one([forward([2, 8, 7, 7], [8, 8, 3, 3], layout="cl", w_layout="contiguous")])
    assert cfgs == [] and "no such layout" in conv.skipped[0][3]
    # a permuted view is neither format
    conv, cfgs = one([forward([2, 8, 7, 7], [8, 8, 3, 3], layout=[1, 2, 14, 98])])
    assert cfgs == [] and "neither contiguous nor channels-last" in conv.skipped[0][3]


@pytest.mark.parametrize("record,reason", [
    (backward([2, 8, 9, 9], [8, 8, 3, 3], transposed=True), "transposed=True"),
    (backward([2, 8, 9, 9], [8, 8, 3, 3], output_padding=[1, 0]), "output_padding"),
    (forward([2, 10, 9, 9], [8, 3, 3, 3], groups=3), "not divisible by groups=3"),
    (forward([2, 12, 9, 9], [9, 3, 3, 3], groups=3), "weight dim 1 is 3"),  # 12/3=4 channels per group
    (forward([2, 12, 9, 9], [10, 4, 3, 3], groups=3), "output channels 10"),
    (backward([2, 8, 9, 9], [8, 8, 3, 3], grad_output=[2, 8, 8, 8]), "grad_output shape"),
    (backward([2, 8, 9, 9], [8, 8, 3, 3], grad_output=[2, 4, 7, 7]), "grad_output shape"),
    (forward([2, 8, 2, 2], [8, 8, 3, 3]), "output size [0, 0] is not positive"),
    (forward([2, 8, 9, 9], [8, 8, 3, 3], stride=(1, 1, 1)), "list of 1 or 2 integers"),
    (forward([2, 8, 9], [8, 8, 3, 3], padding=(0,), stride=(1,), dilation=(1,)), "weight of rank 4"),
])
def test_invalid_records_are_skipped_with_the_reason(record, reason):
    conv, cfgs = one([record, forward([1, 4, 5, 5], [4, 4, 1, 1])])
    assert len(cfgs) == 1, "a bad record never stops the others"
    assert len(conv.skipped) == 1 and reason in conv.skipped[0][3], conv.skipped
    assert "Skipped" in conv.lines[0]


def test_aten_convolution_and_cudnn_convolution_are_read_by_their_schemas():
    rec = forward([2, 8, 9, 9], [8, 8, 3, 3], padding=(1, 1), stride=(2, 2), op="aten::convolution")
    _, [cfg] = one([rec])
    assert args_of(cfg)["strides"] == [2, 2] and args_of(cfg)["left_pads"] == [1, 1]
    # positional arguments without names: the schema order decides (cudnn: no bias, padding before stride)
    cud = {"op_name": "aten::cudnn_convolution", "replay_ir": {"list_pos_args": [
        {"arg_type": "Tensor", "value": {"shape": [2, 8, 9, 9], "dtype": "float", "strides": None}},
        {"arg_type": "Tensor", "value": {"shape": [8, 8, 3, 3], "dtype": "float", "strides": None}},
        {"arg_type": "int[]", "value": [1, 1]}, {"arg_type": "int[]", "value": [2, 2]},
        {"arg_type": "int[]", "value": [1, 1]}, {"arg_type": "int", "value": 1}], "list_kwargs": []}}
    conv, [cfg] = one([cud])
    assert args_of(cfg)["left_pads"] == [1, 1] and args_of(cfg)["strides"] == [2, 2] and args_of(cfg)["data_type"] == 0
    assert cfg["metadata"]["priority_rank"] is None and "no metadata.priority_rank" in " ".join(cfg["metadata"]["notes"])
    # transposed through aten::convolution is refused too
    rec["replay_ir"]["list_pos_args"][6]["value"] = True
    conv, cfgs = one([rec])
    assert cfgs == [] and "transposed" in conv.skipped[0][3]


def test_non_convolutions_are_counted_warnings_and_the_summary():
    conv, cfgs = one([{"op_name": "aten::add"}, {"op_name": "aten::add"}, {"op_name": "aten::mm"},
                      forward([2, 8, 9, 9], [8, 8, 3, 3], rank=3), backward([2, 8, 9, 9], [8, 8, 3, 3], rank=4,
                                                                            transposed=True)])
    assert dict(conv.not_convolutions) == {"aten::add": 2, "aten::mm": 1}
    text = convert.summary_text(conv, "out.json")
    assert "Total PyTorch operations:     5" in text
    assert "✓ Forward convolutions:       1" in text and "⚠ Skipped operations:         1" in text
    assert "⚠ Not convolutions (ignored): 3" in text and "2 × aten::add" in text
    assert "Total CK profiler configs:    1" in text and "transposed=True" in text


@pytest.mark.parametrize("content,message", [
    ("{not json", "is not valid JSON (line 1"),
    ('{"a": 1}', "expected a JSON list of TraceLens IR records, got a dict"),
    ('[1, 2]', "record 0 is not an object with a string op_name"),
    ('[{"name": "x"}]', "record 0 is not an object with a string op_name"),
])
def test_malformed_files_are_one_line_errors(tmp_path, content, message):
    p = tmp_path / "ir.json"
    p.write_text(content)
    with pytest.raises(TraceFormatError) as e:
        read_trace(p)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="trace file not found"):
        read_trace(tmp_path / "nope.json")


def test_bad_arguments_in_a_record_are_skipped_not_fatal():
    rec = forward([2, 8, 9, 9], [8, 8, 3, 3])
    rec["replay_ir"]["list_pos_args"][6]["value"] = "two"  # groups
    conv, cfgs = one([rec])
    assert cfgs == [] and "groups must be an integer" in conv.skipped[0][3]


def test_index_type_64_bit_for_huge_tensors():
    _, [cfg] = one([forward([64, 256, 512, 512], [256, 256, 3, 3], padding=(1, 1))])  # 4.3e9 elements
    assert args_of(cfg)["index_type"] == 1


def test_resnet50_trace_converts_completely(tmp_path):
    ir = DATA / "resnet50_conv_ir.json"
    out = tmp_path / "configs.json"
    conv = convert.convert_file(ir, out)
    assert conv.records == 106 and not conv.skipped and not conv.not_convolutions
    assert dict(conv.per_op) == {"fwd": 53, "bwd_data": 52, "bwd_weight": 53}
    configs = json.loads(out.read_text())
    assert len(configs) == 158
    first = configs[0]  # rank 1: the largest convolution (FLOPs) of ResNet-50
    assert first["metadata"]["priority_rank"] == 1
    for c in configs:
        argv, _ = pa.command_args(pa.normalize_config(c))
        assert len(argv) + 1 == pa.expected_argc(c["operation_type"], 2)
    # the stem: 7x7 stride 2 pad 3 on 224x224, 3 -> 64 channels, no bwd_data
    stem = [c for c in configs if c["profiler_args"]["filter_spatial"] == [7, 7]]
    assert [c["operation_type"] for c in stem] == ["grouped_conv_fwd", "grouped_conv_bwd_weight"]
    assert stem[0]["profiler_args"]["C"] == 3 and stem[0]["profiler_args"]["K"] == 64


def test_ambiguous_strides_take_the_activations_format():
    """A channels-last model's 1x1 weights (and 1x1 outputs) have strides that fit both
    formats once size-1 dims are ignored: they follow the activations (found by a user test)."""
    from irgen import channels_last, contiguous

    x, w = [2, 64, 8, 8], [32, 64, 1, 1]
    rec = forward(x, w, layout="cl")
    assert channels_last(w) == [64, 1, 64, 64]
    _, cfgs = one([rec, backward(x, w, layout="cl"), forward([2, 64, 1, 1], [32, 64, 1, 1], layout="cl"),
                   backward([2, 16, 3, 3], [8, 16, 3, 3], layout="cl")])  # a 1x1 grad_output
    assert [(c["operation_type"], c["profiler_args"]["layout"]) for c in cfgs] == [
        ("grouped_conv_fwd", 1), ("grouped_conv_bwd_data", 1), ("grouped_conv_bwd_weight", 2),
        ("grouped_conv_fwd", 3),  # every tensor fits both: contiguous
        ("grouped_conv_bwd_data", 1), ("grouped_conv_bwd_weight", 2)]
    # a contiguous 1x1 weight next to contiguous activations stays contiguous
    _, [c] = one([forward(x, w)])
    assert c["profiler_args"]["layout"] == 3 and contiguous(w) == [64, 1, 1, 1]


def test_resnet50_channels_last_converts_completely(tmp_path):
    from irgen import channels_last

    records = json.loads((DATA / "resnet50_conv_ir.json").read_text())
    for r in records:
        for a in r["replay_ir"]["list_pos_args"]:
            v = a["value"]
            if isinstance(v, dict) and "shape" in v:
                v["strides"] = channels_last(v["shape"])
    conv = convert.convert_records(records)
    assert not conv.skipped and len(conv.configs) == 158
    assert {c["metadata"]["layout_name"] for c in conv.configs} == {"NHWGC_GKYXC_NHWGK"}


@pytest.mark.parametrize("name", ["padding", "stride", "dilation", "groups"])
def test_missing_required_arguments_are_not_defaulted(name):
    rec = forward([2, 8, 9, 9], [8, 8, 3, 3])
    rec["replay_ir"]["list_pos_args"] = [a for a in rec["replay_ir"]["list_pos_args"] if a["arg_name"] != name]
    conv, cfgs = one([rec])
    assert cfgs == [] and f"argument(s) {name} missing" in conv.skipped[0][3]


def test_a_record_whose_passes_are_all_skipped_counts_as_skipped():
    conv = convert.convert_records([backward([2, 8, 50], [16, 8, 5], padding=(2,), stride=(1,), dilation=(1,),
                                             mask=(True, False, False)), forward([1, 4, 5, 5], [4, 4, 1, 1])])
    text = convert.summary_text(conv, "x.json")
    assert "⚠ Skipped operations:         1\n" in text and "1D" in text


def test_nothing_converted_writes_nothing(tmp_path):
    ir = write(tmp_path / "ir.json", [{"op_name": "aten::add"}])
    (tmp_path / "c.json").write_text("[1]")
    conv = convert.convert_file(ir, tmp_path / "c.json")
    assert conv.configs == [] and (tmp_path / "c.json").read_text() == "[1]"
    from torq_gen_config.ck import cli

    assert cli.main(["convert", str(ir), str(tmp_path / "c.json")]) == 1
    assert (tmp_path / "c.json").read_text() == "[1]"


def test_unwritable_output_names_it(tmp_path):
    ir = write(tmp_path / "ir.json", [forward([1, 4, 5, 5], [4, 4, 1, 1])])
    from torq_gen_config.core.errors import TorqGenConfigError

    with pytest.raises(TorqGenConfigError, match="cannot write /proc/x.json"):
        convert.convert_file(ir, "/proc/x.json")


def test_bool_pads_and_float_flags_are_refused():
    rec = forward([1, 4, 8, 8], [8, 4, 3, 3], padding=[True, False, True, False])
    conv, cfgs = one([rec])
    assert cfgs == [] and "padding" in conv.skipped[0][3]
    rec = backward([2, 8, 9, 9], [8, 8, 3, 3])
    rec["replay_ir"]["list_pos_args"][7]["value"] = 1.0  # transposed
    conv, cfgs = one([rec])
    assert cfgs == [] and "transposed must be a boolean" in conv.skipped[0][3]


def test_huge_sizes_are_refused_by_the_converter():
    conv, cfgs = one([forward([10 ** 20, 4, 8, 8], [8, 4, 3, 3])])
    assert cfgs == [] and "outside ckProfiler's 32-bit arguments" in conv.skipped[0][3]


def test_a_non_integer_rank_is_unranked_not_skipped():
    rec = forward([1, 4, 8, 8], [8, 4, 3, 3])
    rec["metadata"]["priority_rank"] = "3"
    _, [cfg] = one([rec])
    assert cfg["metadata"]["priority_rank"] is None and "taken as unranked" in " ".join(cfg["metadata"]["notes"])


def test_snakemake_form_refuses_a_trace_as_configurations(tmp_path):
    from torq_gen_config.ck import results
    from torq_gen_config.core.errors import TorqGenConfigError

    ir = write(tmp_path / "ir.json", [forward([1, 4, 5, 5], [4, 4, 1, 1])])
    with pytest.raises(TorqGenConfigError, match="is a TraceLens trace, not CK configurations; convert it first"):
        results.load_configs(ir)
