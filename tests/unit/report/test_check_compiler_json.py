"""scripts/check_compiler_json.py: compiler JSON keys against the MLIR they name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "check_compiler_json.py"

MLIR = """module {
  func.func @main(%arg0: !torch.vtensor<[1,3,8,8],f32>) -> !torch.vtensor<[1,4,8,8],f32> {
    %0 = torch.operator "onnx.QLinearConv"(%arg0) : (!torch.vtensor<[1,3,8,8],f32>) -> !torch.vtensor<[1,4,8,8],si8>
    %1 = torch.operator "onnx.QLinearConcat"(%0) : (!torch.vtensor<[1,4,8,8],si8>) -> !torch.vtensor<[1,4,8,8],si8>
    %2 = torch.operator "onnx.Relu"(%1) : (!torch.vtensor<[1,4,8,8],si8>) -> !torch.vtensor<[1,4,8,8],si8>
    return %2 : !torch.vtensor<[1,4,8,8],f32>
  }
}
"""


def load_script():
    spec = importlib.util.spec_from_file_location("check_compiler_json", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_report(tmp_path: Path, ops: dict, assignments: list[str]) -> Path:
    (tmp_path / "full.mlir").write_text(MLIR)
    report = tmp_path / "torq_gen_config_m.json"
    report.write_text(json.dumps({"mlir_file": "full.mlir", "ops": ops}))
    (tmp_path / "torq_gen_config_m_compiler.json").write_text(
        json.dumps({"op_assignments": {loc: {"executor": "x"} for loc in assignments}}))
    return report


def test_quantized_ops_match_their_layer(tmp_path, capsys):
    mod = load_script()
    ops = {"l0": {"op_type": "Conv", "mlir_location": "3:10"},
           "l1": {"op_type": "Concat", "mlir_location": "4:10"},  # com.microsoft QLinearConcat
           "l2": {"op_type": "Relu", "mlir_location": "5:10"}}
    report = write_report(tmp_path, ops, ["3:10", "4:10", "5:10"])
    assert mod.main(str(report)) == 0, capsys.readouterr().out
    assert "3 of 3" in capsys.readouterr().out
    assert "onnx.QLinearConv" in mod.accepted_ops("Conv") and "onnx.ConvInteger" in mod.accepted_ops("Conv")


def test_real_mismatches_still_reported(tmp_path, capsys):
    mod = load_script()
    ops = {"l0": {"op_type": "Relu", "mlir_location": "3:10"},  # a Relu layer pointing at a QLinearConv
           "l1": {"op_type": "MatMul", "mlir_location": "4:10"},  # QLinearConcat is no MatMul
           "l2": {"op_type": "Relu", "mlir_location": "5:10"}}
    report = write_report(tmp_path, ops, ["3:10", "4:10", "5:10", "6:5"])
    assert mod.main(str(report)) == 1
    out = capsys.readouterr().out
    assert "MISMATCH 3:10" in out and "MISMATCH 4:10" in out and "MISMATCH 6:5" in out
    assert "MISMATCH 5:10" not in out and "1 of 4" in out


def test_help_and_a_missing_report_are_one_clean_answer(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[3] / "scripts" / "check_compiler_json.py"
    h = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and "usage:" in h.stdout and "Traceback" not in h.stderr
    m = subprocess.run([sys.executable, str(script), str(tmp_path / "none.json")], capture_output=True, text=True,
                       timeout=60)
    assert m.returncode == 2 and m.stderr.count("\n") == 1 and "none.json" in m.stderr, m.stderr
