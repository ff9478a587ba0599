#!/usr/bin/env python
"""Check a compiler JSON against the MLIR it refers to.

Every ``op_assignments`` key must be the ``line:col`` of a ``torch.operator`` in the
report's ``mlir_file`` whose op type is the layer's op type, or (a quantized model,
``--quantize``) a quantized form of it: an op mapped to the layer's op type by
:data:`torq_gen_config.precision.qdq_graph.QUANTIZED_OP_BASE` (``onnx.QLinearConv``
or ``onnx.ConvInteger`` for a Conv layer, the com.microsoft ``onnx.QLinearConcat`` for
a Concat layer, ...). Thin entry point over
:func:`torq_gen_config.mlir.importer.operator_at`.

Usage: python scripts/check_compiler_json.py results/<model>/torq_gen_config_<model>.json
Exit status 0 when every key checks out, 1 otherwise (the mismatches are listed).
"""

import argparse
import json
import sys
from pathlib import Path

from torq_gen_config.mlir.importer import operator_at
from torq_gen_config.precision.qdq_graph import QUANTIZED_OP_BASE


def accepted_ops(op_type: str) -> set[str]:
    """The MLIR op names (``onnx.<Op>``) that a layer of ``op_type`` may point at:
    the op type itself and its quantized forms (:data:`QUANTIZED_OP_BASE`)."""
    return {f"onnx.{op_type}"} | {f"onnx.{q}" for q, base in QUANTIZED_OP_BASE.items() if base == op_type}


def main(report_path: str) -> int:
    report_path = Path(report_path)
    report = json.loads(report_path.read_text())
    compiler_path = report_path.with_name(report_path.stem + "_compiler.json")
    compiler = json.loads(compiler_path.read_text())
    lines = (report_path.parent / report["mlir_file"]).read_text().splitlines()
    by_loc = {op["mlir_location"]: (lid, op["op_type"]) for lid, op in report["ops"].items()}
    bad = 0
    for loc in compiler["op_assignments"]:
        lid, op_type = by_loc.get(loc, (None, None))
        found = operator_at(lines, loc)
        if lid is None or found not in accepted_ops(op_type):
            bad += 1
            print(f"MISMATCH {loc}: layer {lid} ({op_type}) but the MLIR has {found}")
    print(f"{len(compiler['op_assignments']) - bad} of {len(compiler['op_assignments'])} assignments point at "
          f"a torch.operator of the layer's op type (or its quantized form) in {report['mlir_file']}")
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Exit status 0 when every key checks out, 1 otherwise, 2 for a bad input.")
    parser.add_argument("report", help="the report, results/<model>/torq_gen_config_<model>.json")
    args = parser.parse_args()
    try:
        sys.exit(main(args.report))
    except (OSError, ValueError, KeyError) as e:  # a missing file, malformed JSON, not a report
        print(f"check_compiler_json: error: {args.report}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
