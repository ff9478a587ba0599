"""Parsing ckProfiler's output (the formats of profile_grouped_conv_*_impl.hpp)."""

from __future__ import annotations

from torq_gen_config.ck import profiler_output as po

FWD_OUT = """input: dim 5, lengths {32, 32, 4, 200, 200}, strides {160000, 5120000, 40000, 200, 1}
ckProfiler found 3 instances
Perf:     3.0544 ms, 3.86212 TFlops, 214.565 GB/s, DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle<256, 128, 256, 32, Default>
Perf:     2.8002 ms, 4.21272 TFlops, 234.044 GB/s, DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle<256, 256, 128, 32, Default>
DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle<64, 64, 64, 32, Filter1x1Pad0> does not support this problem
\x1b[36mvalids: 2\x1b[0m
Best configuration parameters:
name: DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle<256, 256, 128, 32, Default>
avg_time: 2.8002
tflops: 4.21272
GB/s: 234.044
"""
BWD_W_OUT = """found 2 instances
Perf:    2.52058 ms, 4.68006 TFlops, 260.007 GB/s, DeviceGroupedConvBwdWeight_Xdl_CShuffle<256, 256>, SplitK 16 (best occupancy)
Perf:    4.28219 ms, 2.75478 TFlops, 153.045 GB/s, DeviceGroupedConvBwdWeight_Xdl_CShuffle<256, 256>, SplitK 1
\x1b[36mvalids: 2\x1b[0m
Best configuration parameters:
name: DeviceGroupedConvBwdWeight_Xdl_CShuffle<256, 256> (instance 0)
avg_time: 2.52058
tflops: 4.68006
GB/s: 260.007, SplitK 16 (best occupancy)
"""


def test_forward_output():
    p = po.parse(FWD_OUT)
    assert p.found == 3 and p.valids == 2 and p.unsupported == 1
    assert [i.ms for i in p.instances] == [3.0544, 2.8002] and p.instances[0].split_k is None
    assert p.best.name.endswith("<256, 256, 128, 32, Default>") and p.best.avg_time_ms == 2.8002
    assert p.best.tflops == 4.21272 and p.best.gb_per_s == 234.044 and p.best.instance_index is None
    assert po.judge(p) is None


def test_backward_weight_split_k_and_instance_index():
    p = po.parse(BWD_W_OUT)
    assert [i.split_k for i in p.instances] == ["16 (best occupancy)", "1"]
    assert p.best.instance_index == 0 and p.best.name == "DeviceGroupedConvBwdWeight_Xdl_CShuffle<256, 256>"
    assert p.best.gb_per_s == 260.007 and p.best.split_k == "16 (best occupancy)"


def test_failures_with_exit_code_zero():
    assert po.judge(po.parse("found 4 instances\n\x1b[36mvalids: 0\x1b[0m\nBest configuration parameters:\nname: \n"
                             "avg_time: 0\ntflops: 0\nGB/s: 0\n")).startswith("valids: 0")
    assert "no 'Best configuration parameters'" in po.judge(po.parse(FWD_OUT.split("Best")[0]))
    # bwd_data prints no valids line: an empty best block without any Perf line
    assert "no CK instance supports" in po.judge(po.parse("Best configuration parameters:\nname: \navg_time: 0\n"
                                                          "tflops: 0\nGB/s: 0, SplitK 1\n"))
    # time=0: CK divides by zero (tflops inf) and the time is 0
    zero = FWD_OUT.replace("avg_time: 2.8002", "avg_time: 0")
    assert "names no measured instance" in po.judge(po.parse(zero))


def test_tail_keeps_the_best_block():
    long = "Perf: 1 ms, 1 TFlops, 1 GB/s, X\n" * 5000 + FWD_OUT.split("\x1b[36m")[1]
    tail = po.tail_with_best(long, 1000)
    assert len(tail) <= 1000 and "Best configuration parameters" in tail and tail.rstrip().endswith("GB/s: 234.044")
    assert po.tail_with_best("short", 1000) == "short"
    huge_best = "x" * 100 + "\nBest configuration parameters:\nname: " + "N" * 3000 + "\navg_time: 1\n"
    assert "Best configuration parameters" in po.tail_with_best(huge_best, 500)
