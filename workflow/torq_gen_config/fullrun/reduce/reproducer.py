"""The reproducer folder of ``run --reduce`` (``reduced/`` beside the report): the nodes the
search kept (:mod:`.search`) as a model with its inputs and reference outputs, the compiler
JSON that runs them on the same executors, the raw tool command of the failing step,
``reduce.json`` and ``README.txt``."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Mapping

from ...backends import make_backend
from ...core.fileio import read_json, write_json
from ...core.external_data import self_contained_bytes
from ...core.lazy import np
from ...mlir.importer import write_with_weights
from .search import Outcome, Reducer
from ...core.layout import CASE_INPUTS_FILE, MODEL_FILE, MODULE_FILE, PARTITIONS_DIR, RESULT_FILE, PartitionFolder

def write_reduced(reducer: Reducer, found: Mapping, *, target: Outcome, out_dir: Path) -> dict:
    """Write the data of the reproducer folder: ``model.onnx`` (the nodes found),
    ``inputs.npz`` (its inputs from the whole-model reference run, keyed by input name,
    as ``--input-data`` takes them) and ``reference_outputs.npz`` (the reference values of
    its outputs); :func:`save_reduced` adds ``reduce.json`` and ``README.txt``.

    Returns:
        The report's ``full_model.reduced`` section (``reproducer`` and ``raw_commands``
        still empty).
    """
    nodes = list(found["nodes"])
    model, io = reducer.candidate_model(nodes)
    model.graph.name = "reduced"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MODEL_FILE).write_bytes(self_contained_bytes(model))  # a file to hand on: weights inside
    tmp = out_dir / "inputs.tmp.npz"
    np.savez(tmp, **{n: reducer.value(n) for n in io["inputs"]})
    os.replace(tmp, out_dir / CASE_INPUTS_FILE)
    tmp = out_dir / "reference_outputs.tmp.npz"
    np.savez(tmp, **{n: reducer.value(n) for n in io["outputs"]})
    os.replace(tmp, out_dir / "reference_outputs.npz")
    outcome: Outcome | None = found.get("outcome")
    kept = reducer.describe_nodes(nodes)
    if outcome is None:  # the budget was spent before the whole set ran
        status = "stopped"
    elif not found["reproduced"]:
        status = "not reproduced"
    elif len(nodes) == len(reducer.nodes):
        status = "not reduced" if found.get("minimal") else "stopped"
    else:
        status = "reduced"
    section = {
        "status": status,
        "target": target.as_dict(),
        "outcome": outcome.as_dict() if outcome else None,
        "num_nodes": len(nodes), "from_nodes": len(reducer.nodes),
        "nodes": kept, "inputs": io["inputs"], "outputs": io["outputs"],
        "minimal": bool(found.get("minimal")),
        "note": _note(status, found, reducer),
        "budget": reducer.budget.describe(), "budget_spent": reducer.exhausted,
        "candidates_run": reducer.evaluated, "candidates_reused": reducer.cached, "compiles": reducer.compiles,
        "seconds": round(time.monotonic() - reducer.started, 1),
        "dir": str(out_dir), "reproducer": None, "raw_commands": [], "cwd": os.getcwd(),
        "steps": list(found.get("steps") or []),
    }
    return section


def save_reduced(out_dir: Path, section: Mapping) -> None:
    """Write ``reduce.json`` (the section) and ``README.txt`` (what it is and how to run it)."""
    write_json(out_dir / "reduce.json", section)
    (out_dir / "README.txt").write_text(_readme(section), encoding="utf-8")


def _note(status: str, found: Mapping, reducer: Reducer) -> str:
    if status == "not reproduced":
        return ("the failure did not reproduce when the nodes ran as the reducer runs them (each partition compiled "
                "alone, inputs from the node-by-node reference run): nothing was reduced; model.onnx is the whole set")
    if status == "stopped":
        return (f"the search stopped ({reducer.exhausted}) before a smaller failing subgraph was found; model.onnx is "
                "the whole set; run again to continue (the work done is kept) or allow more with --reduce-budget")
    if status == "not reduced":
        return ("the failure disappears on every smaller candidate tried: the whole set of nodes is the smallest "
                "failing subgraph found")
    if found.get("minimal"):
        return "1-minimal: dropping any one of these nodes makes the failure go away"
    return (f"the search stopped early ({reducer.exhausted}): smaller failing subgraphs may exist; run again to "
            "continue (the work done is kept)")


def _readme(s: Mapping) -> str:
    lines = [
        "Reduced reproducer written by `torq-gen-config run --reduce`.",
        "",
        f"The run failed: {s['target']['summary']}",
        f"Result: {s['status']}, {s['num_nodes']} of {s['from_nodes']} nodes; {s['note']}.",
        "",
        "Nodes kept (index in the prepared model, op type, name, layer, executor):",
        *[f"  {n['index']:>5}  {n['op_type']:<18} {n['name'] or '-':<30} {n['layer_id']}  on {n['executor']}"
          for n in s["nodes"]],
        "",
        "Files: model.onnx (the subgraph), inputs.npz (its inputs, from the whole-model reference run),",
        "reference_outputs.npz (the reference values of its outputs), reduce.json (the search),",
        "and the compiler JSON the command below uses (the same executor per node).",
        "",
        f"Reproduce (from {s.get('cwd') or 'the directory --reduce ran in'}; exit status 1 and the same failure):",
        f"  {s['reproducer'] or s.get('reproducer_note') or 'n/a'}",
    ]
    if s.get("raw_commands"):
        lines += ["", "The tool command(s) of the failing step:", *[f"  {c}" for c in s["raw_commands"]]]
    return "\n".join(lines) + "\n"


def raw_commands(reducer: Reducer, found: Mapping, out_dir: Path) -> list[str]:
    """The failing step's tool command lines for the nodes found: for a compile error the
    compiler's command on a copy of the failing partition's MLIR in ``out_dir``; else the
    commands the reducer's log of that candidate recorded (``$ ...`` lines)."""
    nodes = list(found["nodes"])
    cdir = reducer.work / "candidates" / reducer._key(nodes)
    result_path = cdir / RESULT_FILE
    if not result_path.is_file():
        return []
    result = read_json(result_path, "reduction candidate result")
    failure = result.get("failure") or {}
    pid = failure.get("pid")
    if result.get("status") == "error" and pid and failure.get("stage") in ("compile", "timeout", "crash"):
        mlir = PartitionFolder(reducer.work / PARTITIONS_DIR / pid).mlir
        ex = reducer.executors.get(failure.get("executor") or "")
        if mlir.is_file() and ex:
            try:
                backend = make_backend(ex)
                argv = backend.compile_argv(str(out_dir / "partition.mlir"), str(out_dir / MODULE_FILE))
            except Exception:
                argv = None
            if argv:
                write_with_weights(mlir, out_dir / "partition.mlir")  # self-contained: the weights written in
                return [shlex.join(argv)]
    log = cdir / "candidate.log"
    if log.is_file():
        return [ln[2:] for ln in log.read_text(errors="replace").splitlines() if ln.startswith("$ ")][-4:]
    return []


def reproducer_compiler_json(reducer: Reducer, found: Mapping, locations: Mapping, prepared) -> dict:
    """The compiler JSON of the reduced model: each node's executor keyed by the
    ``line:col`` of its op in the reduced model's own ``full.mlir`` (``locations``,
    ``prepared``: the reduced model as the workflow prepared it).

    Raises:
        ValueError: the prepared reduced model's nodes are not the reduced nodes (its
            preparation changed them) or a node has no verified location.
    """
    nodes = list(found["nodes"])
    recs = locations.get("nodes") or []
    if len(prepared.graph.node) != len(nodes):
        raise ValueError(f"the prepared reduced model has {len(prepared.graph.node)} nodes, not {len(nodes)}")
    assignments: dict[str, dict] = {}
    for k, j in enumerate(nodes):
        op = reducer.model.graph.node[j].op_type
        if prepared.graph.node[k].op_type != op:
            raise ValueError(f"node {k} of the prepared reduced model is {prepared.graph.node[k].op_type}, not {op}")
        rec = recs[k] if k < len(recs) else {}
        if not rec.get("verified") or rec.get("line") is None:
            raise ValueError(f"node {k} ({op}) of the reduced model has no verified MLIR location")
        assignments[f"{rec['line']}:{rec['col']}"] = {"executor": reducer.node_executor[j]}
    return {"op_assignments": assignments, "model_name": "model"}
