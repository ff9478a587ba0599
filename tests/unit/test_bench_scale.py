"""The scaling benchmark's model (tests/fixtures/models.py, transformer_encoder_stack) and
the pure helpers of benchmarks/bench_scale.py (no discovery run)."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from fixtures.models import STACK_EXTRA_NODES, STACK_NODES_PER_BLOCK, STACK_VOCAB, transformer_encoder_stack

REPO = Path(__file__).resolve().parents[2]
OPS = {"MatMul", "Gemm", "Add", "LayerNormalization", "Softmax", "Transpose", "Reshape", "Gather", "Relu", "Mul", "Div"}


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("tgc_bench_scale", REPO / "benchmarks" / "bench_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("blocks", [1, 3])
def test_stack_is_valid_with_static_shapes(blocks):
    model = transformer_encoder_stack(blocks)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    for node in inferred.graph.node:
        for out in node.output:
            assert out in types, f"{node.name}: no inferred type for {out}"
            dims = types[out].shape.dim
            assert all(d.HasField("dim_value") for d in dims), f"{node.name}: {out} has a non-static shape"


@pytest.mark.parametrize("blocks", [1, 3])
def test_stack_node_count_and_ops(blocks):
    model = transformer_encoder_stack(blocks)
    nodes = model.graph.node
    assert len(nodes) == blocks * STACK_NODES_PER_BLOCK + STACK_EXTRA_NODES == blocks * 39 + 2
    ops = Counter(n.op_type for n in nodes)
    assert OPS <= set(ops), OPS - set(ops)
    assert "Constant" not in ops and "Shape" not in ops  # nothing the tool would fold: layers == nodes
    per_block = Counter(n.op_type for n in nodes if n.name.startswith("b0_"))
    assert sum(per_block.values()) == STACK_NODES_PER_BLOCK and OPS <= set(per_block)
    assert len({n.name for n in nodes}) == len(nodes)


@pytest.mark.parametrize("blocks", [1, 3])
def test_stack_runs_in_onnxruntime(blocks):
    import onnxruntime as ort

    model = transformer_encoder_stack(blocks, seed=blocks)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, STACK_VOCAB, size=(8, 1), dtype=np.int64)
    (out,) = session.run(None, {"ids": ids})
    assert out.shape == (8, 1, 16) and out.dtype == np.float32
    assert np.isfinite(out).all() and out.std() > 0.1


def test_stack_is_deterministic_and_sized_by_its_arguments():
    a, b = transformer_encoder_stack(2), transformer_encoder_stack(2)
    assert a.SerializeToString() == b.SerializeToString()
    assert transformer_encoder_stack(2, seed=1).SerializeToString() != a.SerializeToString()
    m = transformer_encoder_stack(1, d_model=32, heads=4, seq=4, ffn=64)
    onnx.checker.check_model(m, full_check=True)
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == [4, 1, 32]
    with pytest.raises(ValueError):
        transformer_encoder_stack(0)


def test_blocks_for_size(bench):
    assert (bench.NODES_PER_BLOCK, bench.EXTRA_NODES) == (STACK_NODES_PER_BLOCK, STACK_EXTRA_NODES)
    assert bench.blocks_for_size(80) == 2 and bench.layers_for_blocks(2) == 80
    assert bench.blocks_for_size(1000) == 26 and bench.layers_for_blocks(26) == 1016
    assert bench.blocks_for_size(5000) == 128 and bench.layers_for_blocks(128) == 4994
    assert bench.blocks_for_size(1) == 1 and bench.blocks_for_size(0) == 1
    for size in (41, 100, 300, 2000):
        assert abs(bench.layers_for_blocks(bench.blocks_for_size(size)) - size) <= STACK_NODES_PER_BLOCK // 2 + 1


def test_parse_sizes(bench):
    assert bench.parse_sizes("1000,80") == [80, 1000]
    assert bench.parse_sizes(" 80, 80 ,5000") == [80, 5000]
    with pytest.raises(Exception):
        bench.parse_sizes("0,80")


# Excerpts of Snakemake 9.27 logs (.snakemake/log/*.snakemake.log) of a discovery and a no-op.
LOG = """\
Building DAG of jobs...
Job stats:
job                  count
-----------------  -------
prepare_model            1
split_layers             1
total                    5

Select jobs to execute...
Execute 1 jobs...
[Thu Dec  3 07:49:47 2026]
Finished jobid: 3 (Rule: prepare_model)
1 of 5 steps (20%) done
[Thu Dec  3 07:49:48 2026]
Finished jobid: 4 (Rule: import_full_model)
2 of 5 steps (40%) done
Updating checkpoint dependencies.
[Thu Dec  3 07:49:50 2026]
Finished jobid: 12 (Rule: test_layer)
3 of 9 steps (33%) done
"""
NOOP_LOG = "Building DAG of jobs...\nNothing to be done (all requested files are present and up to date).\n"


def test_count_jobs(bench):
    assert bench.count_jobs(LOG) == 3
    assert bench.count_jobs(NOOP_LOG) == 0 and bench.nothing_to_do(NOOP_LOG)
    assert not bench.nothing_to_do(LOG)
    assert bench.count_jobs("Finished job 1.\n1 of 2 steps (50%) done\nFinished job 0.\n") == 2  # before Snakemake 9
    assert bench.count_jobs("7 of 9 steps (78%) done\n") == 7  # no per-job lines (quiet)
    assert bench.count_jobs("") == 0


def test_tree_pids_and_summary(bench):
    ppids = {1: 0, 10: 1, 11: 10, 12: 11, 13: 10, 20: 1}
    assert bench.tree_pids(10, ppids) == {10, 11, 12, 13}
    sampler = bench.TreeSampler(os.getpid())
    sampler.sample()
    assert sampler.peak > 10 * 2**20 and sampler.peak_procs >= 1
    assert sampler.peak_pss is None or 0 < sampler.peak_pss <= sampler.peak
    rows = [{"layers": 80, "cpu_per_layer_s": 0.2, "noop_discover_s": 2.0, "noop_snakemake_s": 1.0, "peak_rss_mb": 300,
             "peak_pss_mb": 200},
            {"layers": 1016, "cpu_per_layer_s": 0.21, "noop_discover_s": 2.5, "noop_snakemake_s": 2.0, "peak_rss_mb": 500,
             "peak_pss_mb": 400}]
    s = bench.summary(rows)
    assert s["cpu_per_layer_ratio"] == pytest.approx(1.05)
    assert s["noop_discover_ratio"] == pytest.approx(1.25) and s["noop_snakemake_ratio"] == pytest.approx(2.0)
    assert s["peak_rss_mb_largest"] == 500 and s["peak_pss_mb_largest"] == 400 and (s["smallest_layers"], s["largest_layers"]) == (80, 1016)
