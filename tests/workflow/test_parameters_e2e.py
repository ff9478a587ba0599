"""Weights inline or as IREE parameters (``parameters``, docs/parameters.md), end to end with
the real tools: discovery gives the same verdict for every (layer, executor) both ways, and
so does the full-model run; in external mode the modules hold no weights.

Marked ``slow`` (about 3 minutes on 2 cores, most of it SqueezeNet's two discoveries).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli, run_snakemake, work
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from torq_gen_config.mlir.importer import has_stored_weights

pytestmark = pytest.mark.slow


def transformer_block(path: Path, d: int = 128, seq: int = 16, ff: int = 512) -> Path:
    """One pre-norm transformer block on ``[seq, d]``: LayerNormalization, single-head
    attention (Q/K/V MatMuls, K's weight stored transposed behind a Transpose that the
    split folds, Softmax), output projection, residual, LayerNormalization, a Gemm + Relu +
    MatMul MLP, residual. Every weight matrix is >= 1 KiB (stored), seeded."""
    rng = np.random.default_rng(0)

    def w(name, *shape, scale=None):
        return nh.from_array((rng.standard_normal(shape) * (scale or 1 / np.sqrt(shape[-1]))).astype(np.float32), name)

    inits = [w("wq", d, d), w("wk_t", d, d), w("wv", d, d), w("wo", d, d), w("w1", ff, d), w("w2", ff, d),
             nh.from_array(np.ones(d, np.float32), "g1"), nh.from_array(np.zeros(d, np.float32), "b1"),
             nh.from_array(np.ones(d, np.float32), "g2"), nh.from_array(np.zeros(d, np.float32), "b2"),
             w("bq", d, scale=0.1), w("bo", d, scale=0.1), w("bf1", ff, scale=0.1), w("bf2", d, scale=0.1),
             nh.from_array(np.array(1 / np.sqrt(d), np.float32), "scale")]
    n = h.make_node
    nodes = [
        n("LayerNormalization", ["x", "g1", "b1"], ["ln1"], axis=-1, epsilon=1e-5),
        n("MatMul", ["ln1", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q"]),
        n("Transpose", ["wk_t"], ["wk"], perm=[1, 0]),  # a weight-only node: folded, then a parameter too
        n("MatMul", ["ln1", "wk"], ["k"]), n("MatMul", ["ln1", "wv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[1, 0]), n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]),
        n("Softmax", ["s"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["a"]),
        n("MatMul", ["a", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["o"]), n("Add", ["x", "o"], ["r1"]),
        n("LayerNormalization", ["r1", "g2", "b2"], ["ln2"], axis=-1, epsilon=1e-5),
        n("Gemm", ["ln2", "w1", "bf1"], ["f1"], transB=1), n("Relu", ["f1"], ["f1r"]),
        n("MatMul", ["f1r", "w2"], ["f2"]), n("Add", ["f2", "bf2"], ["f"]), n("Add", ["r1", "f"], ["y"]),
    ]
    g = h.make_graph(nodes, "block", [h.make_tensor_value_info("x", T.FLOAT, [seq, d])],
                     [h.make_tensor_value_info("y", T.FLOAT, [seq, d])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, path)
    return path


def report_of(out: Path, name: str) -> dict:
    return json.loads((out / f"torq_gen_config_{name}.json").read_text())


def verdicts(report: dict) -> dict:
    return {(lid, ex): e["status"] for lid, op in report["ops"].items() for ex, e in op["executors"].items()}


def module_bytes(out: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in work(out).glob(pattern))


def discover_both(tmp_path: Path, model: Path, name: str, snakemake_external: tuple[str, ...] = ()) -> dict:
    """Discovery inline (CLI) and external (CLI, or the Snakemake form with these ``--config``
    settings), then `run` both ways, keeping the modules and layer MLIR (``keep_work: all``)
    to compare; returns ``{mode: {"out", "report", "stdout", "plan"}}``."""
    found = {}
    for mode in ("inline", "external"):
        out = tmp_path / mode
        if mode == "external" and snakemake_external:
            r = run_snakemake("--cores", "2", "--config", f"model={model}", f"output_dir={out}", "keep_work=all",
                              *snakemake_external)
        else:
            r = run_cli("discover", "--model", model, "--output-dir", out, "--parameters", mode, "-j", "2",
                        "--keep-work", "all")
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        rr = run_cli("run", "--model", model, "--output-dir", out, "--parameters", mode, "-j", "2",
                     "--keep-work", "all")
        assert rr.returncode == 0, (rr.stdout + rr.stderr)[-3000:]
        found[mode] = {"out": out, "report": report_of(out, name), "stdout": r.stdout,
                       "plan": json.loads((work(out) / "full" / "plan.json").read_text())}
    return found


def check_modes(found: dict, external_reason: str = "chosen with --parameters or in the config") -> None:
    """The same verdicts and the same full-model verdict both ways; each mode says what it was."""
    inline, external = found["inline"]["report"], found["external"]["report"]
    assert verdicts(inline) == verdicts(external)
    assert set(verdicts(inline).values()) == {"success"}
    assert inline["full_model"]["status"] == external["full_model"]["status"] == "success"
    for mode in ("inline", "external"):
        rec = found[mode]["report"]["provenance"]["parameters"]
        assert (rec["mode"], rec["reason"]) == (mode, "chosen with --parameters or in the config" if mode == "inline" else external_reason)
        assert found[mode]["plan"]["options"]["parameters"]["mode"] == mode
        iree_parts = [p for p in found[mode]["plan"]["partitions"] if p["backend"] == "iree"]
        flags = [" ".join(p["executor_def"]["options"].get("run_flags") or []) for p in iree_parts]
        assert flags and all(("--parameters=model=" in f) == (mode == "external") for f in flags)
    if "Weights:" in found["external"]["stdout"]:  # the CLI form prints the final text
        assert f"Weights: external ({external_reason})" in found["external"]["stdout"]


def test_transformer_block_same_verdicts_smaller_modules(tmp_path):
    model = transformer_block(tmp_path / "block.onnx")
    # external through auto, in the Snakemake form: 770 KiB of stored weights >= 0.5 MiB
    found = discover_both(tmp_path, model, "block", snakemake_external=("parameters=auto", "parameters_auto_mb=0.5"))
    check_modes(found, external_reason="auto: 770.0 KiB of weights >= 0.5 MiB")
    assert "Weights: inline (chosen with --parameters or in the config)" in found["inline"]["stdout"]
    ext = work(found["external"]["out"])
    assert "#stream.parameter.named" in (ext / "layers" / "Gemm_f1" / "model.mlir").read_text()
    assert json.loads((ext / "layers" / "Gemm_f1" / "import.json").read_text())["parameters"] == "external"
    assert '"model"::"folded:wk"' in (ext / "layers" / "MatMul_k" / "model.mlir").read_text()  # the folded Transpose
    sizes = {m: (module_bytes(found[m]["out"], "batches/*/*/module.vmfb"),
                 module_bytes(found[m]["out"], "full/partitions/*/module.vmfb")) for m in found}
    print("transformer block module bytes (discovery batches, run partitions):", sizes)
    assert sizes["external"][0] * 3 < sizes["inline"][0]
    assert sizes["external"][1] * 3 < sizes["inline"][1]


def test_squeezenet_same_verdicts(tmp_path, squeezenet_path):
    found = discover_both(tmp_path, squeezenet_path, "light_squeezenet")
    check_modes(found)
    ext, inl = work(found["external"]["out"]), work(found["inline"]["out"])
    folded = (ext / "folded.irpa").stat().st_size  # the weights: ConstantOfShape fills, folded by the split
    assert folded > 4_000_000
    mlir = {m: sum(p.stat().st_size for p in d.glob("layers/*/model.mlir"))
            for m, d in (("inline", inl), ("external", ext))}
    sizes = {m: (module_bytes(found[m]["out"], "batches/*/*/module.vmfb"),
                 module_bytes(found[m]["out"], "full/partitions/*/module.vmfb")) for m in found}
    print("light_squeezenet layer MLIR bytes:", mlir, "module bytes (discovery batches, run partitions):", sizes)
    # neither mode's layer MLIR holds the weights: inline ones refer to the store (written in
    # for a compile), external ones load parameters
    assert max(mlir.values()) * 20 < folded
    assert any(has_stored_weights(p) for p in inl.glob("layers/*/model.mlir"))
    assert not any(has_stored_weights(p) for p in ext.glob("layers/*/model.mlir"))
    # the external modules carry none of the weights (the inline ones fold the splat weights to fills)
    assert sizes["external"][0] < folded and sizes["external"][1] < folded
