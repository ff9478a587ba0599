"""Golden command lines of the real ckProfiler: argument counts, codes, split_k rules."""

from __future__ import annotations

import pytest

from torq_gen_config.ck import profiler_args as pa
from torq_gen_config.ck.problem import ConvProblem, throughput

P2 = ConvProblem(G=2, N=4, K=8, C=3, filter=(3, 3), input=(16, 12), strides=(2, 1), dilations=(1, 2),
                 left_pads=(1, 0), right_pads=(0, 2), dtype="bf16")


def cfg(op, problem=P2, layout="NGCHW_GKCYX_NGKHW"):
    return pa.normalize_config(pa.make_config(problem, op, layout=layout, metadata={}))


def test_golden_forward():
    argv, notes = pa.command_args(cfg(pa.FWD))
    assert argv == "grouped_conv_fwd 2 3 0 0 1 0 1 2 2 4 8 3 3 3 16 12 2 1 1 2 1 0 0 2".split() and not notes


def test_golden_backward_data_takes_integer_split_k():
    argv, _ = pa.command_args(cfg(pa.BWD_DATA))
    assert argv == "grouped_conv_bwd_data 2 3 0 1 0 1 2 2 4 8 3 3 3 16 12 2 1 1 2 1 0 0 2 0".split()


def test_golden_backward_weight_layout_4_dtype_5_split_k_all():
    argv, _ = pa.command_args(cfg(pa.BWD_WEIGHT))
    assert argv == "grouped_conv_bwd_weight 5 4 0 1 0 1 2 2 4 8 3 3 3 16 12 2 1 1 2 1 0 0 2 all".split()


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("op", pa.OPERATIONS)
def test_argc_rule(op, ndim):
    p = ConvProblem(1, 1, 1, 1, (1,) * ndim, (4,) * ndim, (1,) * ndim, (1,) * ndim, (0,) * ndim, (0,) * ndim, "fp16")
    argv, _ = pa.command_args(cfg(op, p, layout="NWGC_GKXC_NWGK" if ndim == 1 else
                                  "NGCHW_GKCYX_NGKHW" if ndim == 2 else "NGCDHW_GKCZYX_NGKDHW"))
    assert len(argv) + 1 == 14 + 6 * ndim == pa.expected_argc(op, ndim)


def test_split_k_all_for_bwd_data_is_sent_as_its_sweep():
    c = cfg(pa.BWD_DATA)
    c["profiler_args"]["split_k"] = "all"  # what the seed's converter wrote
    argv, notes = pa.command_args(c)
    assert argv[-1] == "0" and "aborts" in notes[0]


def test_old_build_without_bwd_data_split_k():
    argv, notes = pa.command_args(cfg(pa.BWD_DATA), bwd_data_split_k=False)
    assert len(argv) + 1 == pa.expected_argc(pa.BWD_DATA, 2, bwd_data_split_k=False) == 25
    assert argv[-1] == "2" and "no split_k argument" in notes[0]


def test_seed_operation_names_are_read_as_the_real_ones():
    c = pa.make_config(P2, pa.FWD, layout="NGCHW_GKCYX_NGKHW", metadata={})
    c["operation_type"] = "profile_grouped_conv_fwd"
    assert pa.normalize_config(c)["operation_type"] == "grouped_conv_fwd"


@pytest.mark.parametrize("change,message", [
    (lambda c: c.update(operation_type="conv"), "is none of"),
    (lambda c: c["profiler_args"].pop("G"), "lacks G"),
    (lambda c: c["profiler_args"].update(strides=[1]), "strides must be a list of 2 integers"),
    (lambda c: c["profiler_args"].update(num_dim_spatial=4), "must be 1, 2 or 3"),
    (lambda c: c["profiler_args"].update(K=0), "K must be >= 1"),
    (lambda c: c["profiler_args"].update(layout="3"), "layout must be an integer"),
    (lambda c: c["profiler_args"].update(split_k="some"), "split_k must be an integer or \"all\""),
])
def test_bad_configurations(change, message):
    c = pa.make_config(P2, pa.BWD_WEIGHT, layout="NGCHW_GKCYX_NGKHW", metadata={})
    change(c)
    with pytest.raises(pa.ConfigFormatError, match=message.replace("(", r"\(").replace('"', '"')):
        pa.normalize_config(c, where="configuration 7")


def test_config_id_is_content_addressed():
    a, b = cfg(pa.FWD), cfg(pa.FWD)
    b["metadata"] = {"priority_rank": 9, "description": "other"}
    assert pa.config_id(a) == pa.config_id(b) and pa.config_id(a).startswith("fwd_")
    b["profiler_args"]["N"] = 5
    assert pa.config_id(a) != pa.config_id(b)


def test_problem_round_trip_and_ck_formulas():
    c = cfg(pa.FWD)
    assert pa.problem_of_config(c) == P2
    out = P2.output()
    # out = floor((in + lp + rp - ((f - 1) * d + 1)) / s) + 1 (CK ConvParam)
    assert out == ((16 + 1 + 0 - 3) // 2 + 1, (12 + 0 + 2 - 5) // 1 + 1) == (8, 10)
    assert P2.flops() == 2 * 2 * 4 * 8 * 3 * 8 * 10 * 9
    assert P2.bytes() == 2 * (4 * 2 * 3 * 16 * 12 + 2 * 8 * 3 * 9 + 4 * 2 * 8 * 8 * 10)
    tf, gbs = throughput(P2, 0.5)
    assert tf == pytest.approx(P2.flops() / 1e9 / 0.5) and gbs == pytest.approx(P2.bytes() / 1e6 / 0.5)
    assert throughput(P2, 0.0) == (0.0, 0.0)
