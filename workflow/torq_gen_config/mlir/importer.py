"""ONNX -> MLIR (torch dialect) import with IREE's ONNX importer, and the map from
ONNX nodes to the ``line:col`` of their ``torch.operator`` in the printed MLIR.

The importer emits one op per ONNX node in graph order. Rather than computing line
numbers by arithmetic, :func:`import_model` records how many ops each node adds,
prints the module, re-parses the printed file and reads each op's location back
(the method measured in notes/toolchain.md section 3). The op type of every mapped
op is checked against the ONNX node (``torch.operator "onnx.<OpType>"``).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from ..fileio import atomic_write_text

#: the Python distribution of the ONNX -> MLIR importer (its version goes to the report)
IMPORTER_PACKAGE = "iree-base-compiler"

_LOC = re.compile(r'loc\("(?P<file>.*)":(?P<line>\d+):(?P<col>\d+)\)')


def import_model(onnx_model: "onnx.ModelProto", mlir_path: str | os.PathLike, *, record_locations: bool = False) -> dict:  # noqa: F821
    """Import an in-memory ONNX model to MLIR and write it to ``mlir_path`` atomically.

    Args:
        onnx_model: model with inferred shapes (graph name becomes the function name).
        mlir_path: output ``.mlir`` file.
        record_locations: also return, per ONNX node, the location of the op that
            defines the node's results (needs a re-parse of the written file).

    Returns:
        ``{"import_ms": float, "locations": [per node: {"line", "col", "mlir_op",
        "onnx_op", "n_mlir_ops", "verified"}] (only with record_locations)}``.

    Raises:
        Exception: whatever the importer raises for an unsupported model (the
            caller records it as an ``import`` error).
    """
    from iree.compiler import ir
    from iree.compiler.extras import onnx_importer

    t0 = time.perf_counter()
    spans: list[tuple[int, int]] = []

    class _RecordingImporter(onnx_importer.NodeImporter):
        __slots__ = ()

        def import_node(self, node):  # noqa: D401 - same contract as the base class
            before = len(self._b.operations)
            super().import_node(node)
            spans.append((before, len(self._b.operations)))

    ctx = ir.Context()
    model_info = onnx_importer.ModelInfo(onnx_model)
    module = model_info.create_module(context=ctx).operation
    imp = onnx_importer.NodeImporter.define_function(model_info.main_graph, module)
    if record_locations:
        imp.__class__ = _RecordingImporter
    imp.import_all()
    module.verify()
    text = module.get_asm(assume_verified=True) + "\n"
    atomic_write_text(mlir_path, text)
    result: dict[str, Any] = {"import_ms": round((time.perf_counter() - t0) * 1000, 3)}
    if record_locations:
        result["locations"] = _read_locations(ctx, Path(mlir_path), list(onnx_model.graph.node), spans)
    return result


def _read_locations(ctx, mlir_path: Path, nodes: list, spans: list[tuple[int, int]]) -> list[dict]:
    """Re-parse the printed module and read the location of each node's last op."""
    from iree.compiler import ir

    parsed = ir.Module.parseFile(str(mlir_path), ctx)
    func = None
    for op in parsed.body.operations:
        if op.operation.name == "func.func":
            func = op
            break
    ops = [o.operation for o in func.regions[0].blocks[0].operations]
    out = []
    for node, (a, b) in zip(nodes, spans):
        rec: dict[str, Any] = {"onnx_op": node.op_type, "n_mlir_ops": b - a, "line": None, "col": None,
                               "mlir_op": None, "verified": False}
        if b > a:
            op = ops[b - 1]
            m = _LOC.search(str(op.location))
            name = _onnx_op_name(op)
            rec["mlir_op"] = name or op.name
            if m:
                rec["line"], rec["col"] = int(m["line"]), int(m["col"])
            rec["verified"] = name == f"onnx.{node.op_type}"
        out.append(rec)
    return out


def _onnx_op_name(op) -> str | None:
    """The ``"onnx.<OpType>"`` name of a ``torch.operator`` op, else None."""
    if op.name != "torch.operator":
        return None
    try:
        return str(op.attributes["name"]).strip('"')
    except (KeyError, ValueError):
        return None


def import_layer(onnx_path: str | os.PathLike, mlir_path: str | os.PathLike) -> dict:
    """Import one layer model file to MLIR; never raises for importer failures.

    Returns:
        ``{"status": "ok"|"error", "message": str|None, "import_ms": float}``. On
        error ``mlir_path`` is written empty so that the workflow's file contract
        holds; the layer-test job reads the status and records an ``import`` error.
    """
    import onnx

    t0 = time.perf_counter()
    try:
        model = onnx.load(str(onnx_path))
        res = import_model(model, mlir_path)
        return {"status": "ok", "message": None, "import_ms": res["import_ms"]}
    except Exception as e:  # importer errors come as many exception types
        atomic_write_text(mlir_path, "")
        msg = f"{type(e).__name__}: {str(e).strip()}"
        return {"status": "error", "message": msg[:4000], "import_ms": round((time.perf_counter() - t0) * 1000, 3)}


def import_full_model(prepared_path: str | os.PathLike, mlir_path: str | os.PathLike) -> dict:
    """Import the whole prepared model once and build the node -> ``line:col`` map.

    Returns:
        JSON-safe ``{"mlir_file": str, "status", "message", "import_ms", "nodes":
        [per prepared node: {"index", "onnx_op", "line", "col", "mlir_op",
        "n_mlir_ops", "verified"}], "n_unverified": int}``. An importer failure
        is recorded (``status: error``) and leaves every node unmapped.
    """
    import onnx

    model = onnx.load(str(prepared_path))
    try:
        res = import_model(model, mlir_path, record_locations=True)
    except Exception as e:
        atomic_write_text(mlir_path, "")
        return {"mlir_file": str(mlir_path), "status": "error", "message": f"{type(e).__name__}: {str(e).strip()[:2000]}",
                "import_ms": None, "nodes": [], "n_unverified": len(model.graph.node)}
    nodes = [{"index": j, **rec} for j, rec in enumerate(res["locations"])]
    return {"mlir_file": str(mlir_path), "status": "ok", "message": None, "import_ms": res["import_ms"],
            "nodes": nodes, "n_unverified": sum(1 for n in nodes if not n["verified"])}


def layer_location(layer: dict, locations: dict) -> str | None:
    """The ``"line:col"`` of a layer's own op in the full-model MLIR, or None.

    Uses the layer's ``primary_prepared_index`` (the node of the layer's op type,
    also inside an opset-upgrade expansion) and only returns locations whose op type
    was verified against the ONNX node.
    """
    nodes = locations.get("nodes") or []
    j = layer.get("primary_prepared_index")
    if j is None or j >= len(nodes):
        return None
    rec = nodes[j]
    if not rec.get("verified") or rec.get("line") is None:
        return None
    return f"{rec['line']}:{rec['col']}"


def operator_at(mlir_text_lines: list[str], location: str) -> str | None:
    """The ``onnx.<OpType>`` of the ``torch.operator`` that starts at ``line:col``.

    Used to check compiler JSON keys against the MLIR file; returns None when no
    ``torch.operator`` starts there.
    """
    line, col = (int(x) for x in location.split(":"))
    if not 1 <= line <= len(mlir_text_lines):
        return None
    text = mlir_text_lines[line - 1][col - 1:]
    m = re.match(r'torch\.operator "(onnx\.[A-Za-z0-9_]+)"', text)
    return m.group(1) if m else None
