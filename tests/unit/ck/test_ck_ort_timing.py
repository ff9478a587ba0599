"""The ONNX Runtime cross-check backend: each formulation against a numpy reference, the
reference against onnx's own reference implementation and the adjoint identities, and real
timings through ``ck-profile run --backend onnxruntime``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from torq_gen_config.ck import cli, ort_timing, profiler_args as pa
from torq_gen_config.ck.problem import ConvProblem

PROBLEMS = [
    ConvProblem(1, 2, 4, 3, (3, 3), (9, 8), (1, 1), (1, 1), (1, 1), (1, 1), "fp32"),         # plain
    ConvProblem(3, 2, 2, 4, (3, 2), (11, 9), (2, 3), (1, 2), (1, 0), (2, 1), "fp16"),        # grouped, asymmetric
    ConvProblem(6, 1, 1, 1, (3, 3), (7, 7), (2, 2), (2, 2), (2, 2), (2, 2), "bf16"),         # depthwise, dilated
    ConvProblem(1, 3, 5, 2, (4,), (17,), (3,), (1,), (0,), (2,), "fp32"),                    # 1D
    ConvProblem(2, 1, 2, 2, (2, 3, 2), (5, 6, 7), (1, 2, 2), (2, 1, 1), (1, 1, 0), (0, 1, 1), "fp32"),  # 3D
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=["plain", "grouped", "depthwise", "1d", "3d"])
@pytest.mark.parametrize("op", pa.OPERATIONS)
def test_formulation_matches_the_numpy_reference(op, problem):
    assert ort_timing.check(op, problem) < 1e-5


@pytest.mark.parametrize("problem", PROBLEMS, ids=["plain", "grouped", "depthwise", "1d", "3d"])
def test_numpy_reference_against_onnx_reference_and_adjoints(problem):
    """Ground truth not written here: onnx's ReferenceEvaluator for Conv/ConvTranspose, and
    <dy, conv(x, w)> = <bwd_data(dy, w), x> = <bwd_weight(x, dy), w> (both passes are adjoints
    of the linear forward convolution)."""
    rng = np.random.default_rng(3)
    p = problem
    x = rng.standard_normal((p.N, p.G * p.C, *p.input))
    w = rng.standard_normal((p.G * p.K, p.C, *p.filter))
    dy = rng.standard_normal((p.N, p.G * p.K, *p.output()))
    y = ort_timing.reference(pa.FWD, p, x, w)
    model, _ = ort_timing.build_model(pa.FWD, p)
    onnx_y = ReferenceEvaluator(model).run(None, {"a": x.astype(np.float32), "b": w.astype(np.float32)})[0]
    assert np.allclose(y, onnx_y, rtol=1e-4, atol=1e-4)
    dx = ort_timing.reference(pa.BWD_DATA, p, dy, w)
    dw = ort_timing.reference(pa.BWD_WEIGHT, p, x, dy)
    assert dx.shape == x.shape and dw.shape == w.shape
    ip = float(np.sum(dy * y))
    assert float(np.sum(dx * x)) == pytest.approx(ip, rel=1e-9)
    assert float(np.sum(dw * w)) == pytest.approx(ip, rel=1e-9)


def test_run_with_the_onnxruntime_backend(tmp_path, capsys):
    p = ConvProblem(2, 2, 8, 4, (3, 3), (16, 16), (1, 1), (1, 1), (1, 1), (1, 1), "fp16")
    configs = [pa.make_config(p, op, layout="NGCHW_GKCYX_NGKHW", metadata={"priority_rank": 1}) for op in pa.OPERATIONS]
    (tmp_path / "c.json").write_text(json.dumps(configs))
    out = tmp_path / "r.json"
    rc = cli.main(["run", str(tmp_path / "c.json"), "--backend", "onnxruntime", "--output", str(out), "--quiet",
                   "--work-dir", str(tmp_path / "w"), "--timeout", "120"])
    assert rc == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    assert doc["backend"] == "onnxruntime" and doc["stats"]["success"] == 3
    for r in doc["results"]:
        assert r["avg_time_ms"] > 0 and r["tflops"] == pytest.approx(p.flops() / 1e9 / r["avg_time_ms"], rel=1e-3)
        assert r["gb_per_s"] == pytest.approx(p.bytes(4) / 1e6 / r["avg_time_ms"], rel=1e-3)
        assert "matches the float64 numpy reference" in r["stdout"] and "timed in fp32" in r["stdout"]
        assert r["best"]["name"].startswith("onnxruntime_cpu_")
