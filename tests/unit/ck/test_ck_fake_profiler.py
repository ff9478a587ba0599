"""Checks of the fake ckProfiler test fixture (tests/fixtures/fake_ck/ckProfiler)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FAKE = Path(__file__).resolve().parents[2] / "fixtures" / "fake_ck" / "ckProfiler"
# grouped_conv_fwd fp16 NHWGC, G=2 N=32 K=C=64, 3x3 over 56x56, stride/dilation/pad 1
FWD = "grouped_conv_fwd 1 1 0 0 1 0 1 2 2 32 64 64 3 3 56 56 1 1 1 1 1 1 1 1".split()
BWW = "grouped_conv_bwd_weight 1 4 0 0 0 1 2 2 32 64 64 3 3 56 56 1 1 1 1 1 1 1 1 all".split()
BWD = "grouped_conv_bwd_data 1 1 0 1 0 1 2 2 32 64 64 3 3 56 56 1 1 1 1 1 1 1 1".split()
PERF = re.compile(r"^Perf: +(\S+) ms, (\S+) TFlops, (\S+) GB/s, (.+)$", re.M)
FLOP = 2 * 2 * 32 * 64 * 64 * 56 * 56 * 3 * 3


def run(args, mode="ok", **env):
    e = dict(os.environ, FAKE_CK_MODE=mode, **env)
    return subprocess.run([sys.executable, str(FAKE), *args], capture_output=True, text=True,
                          env=e, timeout=30)


def test_argc_formula_matches_notes():
    assert len(FWD) + 1 == 14 + 6 * 2 and len(BWW) + 1 == 14 + 6 * 2


def test_fwd_ok_has_ansi_valids_and_best_block():
    r = run(FWD)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("input: dim 5, lengths {2, 32, 64, 56, 56}, strides {64, 401408, 1, 7168, 128}\n")
    assert "ckProfiler found 8 instances\n" in r.stdout
    assert re.search(r"\x1b\[36mvalids: [1-9]\d*\x1b\[0m\n", r.stdout)
    assert "does not support this problem" in r.stdout
    best = r.stdout.split("Best configuration parameters:\n", 1)[1].splitlines()
    assert best[0].startswith("name: DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle<")
    assert [ln.split(":")[0] for ln in best[1:]] == ["avg_time", "tflops", "GB/s"]
    fastest = max(PERF.findall(r.stdout), key=lambda p: float(p[1]))
    assert best[0] == "name: " + fastest[3] and best[2] == "tflops: " + fastest[1]


def test_tflops_and_bandwidth_derived_from_flops():
    perf = PERF.findall(run(FWD).stdout)
    assert len(perf) >= 3
    nbytes = 2 * (2 * 32 * 64 * 56 * 56 * 2 + 2 * 64 * 64 * 9)  # fp16 in+out (same size), wei
    for ms, tf, gbs, _ in perf:
        assert FLOP / 1e9 / float(ms) == pytest.approx(float(tf), rel=2e-5)
        assert nbytes / 1e6 / float(ms) == pytest.approx(float(gbs), rel=2e-5)


def test_time_zero_gives_zero_avg_time():
    args = list(FWD)
    args[7] = "0"
    assert "avg_time: 0\ntflops: inf\n" in run(args).stdout


def test_wrong_count_prints_help_rc1():
    r = run(FWD[:-1])
    assert r.returncode == 1 and r.stdout.startswith("arg1: tensor operation (grouped_conv_fwd: ")
    r = run(["grouped_conv_bwd_data"])
    assert r.returncode == 1 and "arg8: split-K" in r.stdout


def test_no_args_lists_operations_and_unknown_op_fails():
    r = run([])
    assert r.returncode == 0 and "\tgrouped_conv_bwd_weight: Grouped Convolution Backward Weight\n" in r.stdout
    r = run(["profile_grouped_conv_fwd", *FWD[1:]])
    assert r.returncode != 0 and "cannot find operation: profile_grouped_conv_fwd" in r.stderr


def test_not_implemented_combinations():
    for args in (["grouped_conv_bwd_data", *BWD[1:3], "0", "0", "0", "1", "1", "1", "1", "8", "8",
                  "3", "8", "1", "1", "0", "0", "0"],  # bwd_data has no 1D
                 ["grouped_conv_bwd_weight", "1", "0", *BWW[3:]]):  # bwd_weight layout 0 unused
        r = run(args)
        assert (r.returncode, r.stdout) == (1, "this data_type & layout is not implemented\n")


def test_bwd_data_split_k_all_aborts():
    r = run([*BWD, "all"])
    assert r.returncode == -6 and "what():  stoi" in r.stderr


def test_bwd_data_split_k_zero_sweeps():
    r = run([*BWD, "0"])
    assert r.returncode == 0 and r.stdout.startswith("out: dim 5")
    ks = {int(m) for m in re.findall(r", SplitK (\d+)$", r.stdout, re.M)}
    assert ks <= {1, 2, 4, 8, 16, 32, 64, 128} and len(ks) > 1
    assert "valids" not in r.stdout and re.search(r"\nGB/s: \S+, SplitK \d+\n$", r.stdout)


def test_bwd_weight_split_k_all():
    r = run(BWW)
    assert r.returncode == 0 and "found 6 instances\n" in r.stdout
    assert re.search(r", SplitK \d+ \(best occupancy\)$", r.stdout, re.M)
    assert re.search(r"\nname: DeviceGroupedConvBwdWeight_\S.*> \(instance \d+\)\navg_time: \S+\n"
                     r"tflops: \S+\nGB/s: \S+, SplitK \d+( \(best occupancy\))?\n$", r.stdout)


def test_mode_valids0():
    r = run(FWD, mode="valids0")
    assert r.returncode == 0 and "Perf:" not in r.stdout
    assert r.stdout.endswith("\x1b[36mvalids: 0\x1b[0m\nBest configuration parameters:\nname: \n"
                             "avg_time: 0\ntflops: 0\nGB/s: 0\n")


def test_mode_crash_and_nobest_and_long():
    assert run(FWD, mode="crash").returncode == -11
    r = run(FWD, mode="nobest")
    assert r.returncode == 0 and "Perf:" in r.stdout and "Best configuration" not in r.stdout
    r = run(FWD, mode="long")
    assert len(PERF.findall(r.stdout)) > 2000 and len(r.stdout) > 100_000
    assert "Best configuration parameters:" in r.stdout[-1000:]


def test_log_counts_calls(tmp_path):
    log = tmp_path / "calls.jsonl"
    run(FWD, FAKE_CK_LOG=str(log))
    run([], FAKE_CK_LOG=str(log))
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 2 and lines[0][0].endswith("ckProfiler") and lines[0][1:] == FWD
