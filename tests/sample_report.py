"""A hand-made discovery report shared by the report tests (edit, view, bad inputs): six
layers on three executors, results with real metrics (compare_outputs on small arrays),
built with report.build.build_report; no workflow run."""

from __future__ import annotations

import numpy as np

from torq_gen_config.compare import compare_outputs
from torq_gen_config.report.build import build_report

TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
EXECUTORS = [
    {"name": "llvm-cpu", "backend": "iree", "options": {}},
    {"name": "vmvx", "backend": "iree", "options": {}},
    {"name": "ort", "backend": "onnxruntime", "options": {}},
]
NAMES = ["llvm-cpu", "vmvx", "ort"]


def _metrics(rel):
    r = np.linspace(1.0, 2.0, 100)
    return compare_outputs({"y": r * (1 + rel)}, {"y": r}, ["y"])


def _ok(rel=1e-6, run_ms=2.0):
    status = "success" if rel <= 0.01 else "difference"
    return {"status": status, "backend": "iree", "tolerance_used": TOL, "metrics": _metrics(rel),
            "failure_report": None, "timing": {"compile_ms": 10.0, "run_ms": run_ms}, "reference": {"status": "ok"}}


def _err(stage="compile", summary="legalization failed"):
    return {"status": "error", "backend": "iree", "tolerance_used": TOL, "metrics": None,
            "failure_report": {"type": "error", "stage": stage, "summary": summary,
                               "message": f"{summary}\nline two\nline three"},
            "timing": {"compile_ms": 5.0, "run_ms": None}, "reference": {"status": "ok"}}


LAYERS = [
    # layer_id, op_type, node_index, mlir_location
    ("Conv_conv1", "Conv", 0, "100:12"),
    ("Relu_relu1", "Relu", 1, "42:12"),
    ("Conv_conv2", "Conv", 2, "43:12"),
    ("Relu_relu2", "Relu", 3, "44:12"),
    ("MatMul_fc", "MatMul", 4, "50:3"),
    ("Gather_critical", "Gather", 5, None),
]


def _layers():
    return [{"layer_id": lid, "slug": lid.lower(), "op_type": op, "node_index": i, "mlir_location": loc,
             "mac_count": 442368 if op == "Conv" else None, "skipped_reason": None}
            for lid, op, i, loc in LAYERS]


def _results():
    return {
        # llvm-cpu is 3 % off: difference at 0.01, success at 0.05 -> recommendation vmvx
        "Conv_conv1": {"llvm-cpu": _ok(0.03), "vmvx": _ok(), "ort": _ok()},
        "Relu_relu1": {"llvm-cpu": _ok(), "vmvx": _ok(), "ort": _ok()},
        "Conv_conv2": {"llvm-cpu": _ok(), "vmvx": _ok(), "ort": _ok()},
        "Relu_relu2": {"llvm-cpu": _ok(), "vmvx": _ok(), "ort": _ok()},
        "MatMul_fc": {"llvm-cpu": _err(), "vmvx": _err("run", "trap"), "ort": _ok()},
        "Gather_critical": {"llvm-cpu": _err(), "vmvx": _err(), "ort": _err("run", "no kernel")},
    }


def make_report(**kw):
    args = dict(model_name="tiny", layers=_layers(), results=_results(), executors=EXECUTORS,
                default_tolerance=TOL, mlir_file="work/full.mlir", provenance={"tool": "test"})
    args.update(kw)
    return build_report(**args)
