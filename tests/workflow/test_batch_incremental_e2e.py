"""Compile batches keep per-layer incrementality (docs/compile_batches.md, "Reruns"):
a batch recompiled for one member retests no other member (each verdict's key holds its
own inputs, not the batch's module), another membership recompiles batches but retests nothing, a larger ``--timeout`` redoes only what timed out, and switching
between batches and one-layer compiles retests the batched executors' layers. The runs
keep their batches' modules (``--keep-work all``: the reuse of a module is what is checked;
the default ``minimal`` removes them once the report is written).

Marked ``slow``: each test runs discovery with the real tools.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from conftest import TensorProto, helper, make_model, run_cli, tvi, work
from test_compile_batches_e2e import mixed_model, ok

pytestmark = pytest.mark.slow


class Stamps:
    """mtimes of every result.json and batch.json under a work directory."""

    def __init__(self, w: Path):
        self.w = w
        self.before = self._now()

    def _now(self) -> dict:
        files = list((self.w / "layers").glob("*/*/result.json")) + list((self.w / "batches").glob("*/*/batch.json"))
        return {p: p.stat().st_mtime_ns for p in files}

    def changed(self) -> list[str]:
        """Files written (or new) since the last call, relative to the work directory."""
        now = self._now()
        out = sorted(str(p.relative_to(self.w)) for p, m in now.items() if self.before.get(p) != m)
        self.before = now
        return out


def results(paths: list[str]) -> list[str]:
    return [p for p in paths if p.endswith("result.json")]


def test_membership_mode_and_changed_member(tmp_path):
    """On the 7-layer mixed model (LpPool compiles alone): another membership recompiles
    the batches whose members changed and retests nothing (a new batch slot is compiled
    with its unit's other batches); a changed layer retests only itself; switching to
    one-layer compiles retests the iree executors."""
    model = mixed_model(tmp_path / "mixed.onnx")
    out = tmp_path / "out"
    # generated layer inputs: a change of Conv's weights changes no other layer's inputs
    run = ["discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--keep-work", "all",
           "--layer-inputs", "random"]
    ok(run_cli(*run, "--compile-batch", "3"))  # [Conv Relu LpPool] [Cast Abs Cast] [Sigmoid]
    w = work(out)
    stamps = Stamps(w)
    assert len(results(list(map(str, stamps.before)))) == 21

    # another membership: [Conv LpPool Cast] [Abs Cast Sigmoid]: both batches recompiled
    ok(run_cli(*run, "--compile-batch", "3", "--skip-ops", "Relu"))
    changed = stamps.changed()
    assert results(changed) == [] and len(changed) == 2 * 2, changed
    # [Conv Relu] [LpPool Cast] [Abs Cast] [Sigmoid]: the fourth slot is new; the unit's
    # test job compiles it with the others (all four have new members); no test is redone
    ok(run_cli(*run, "--compile-batch", "2"))
    changed = stamps.changed()
    assert results(changed) == [] and len(changed) == 4 * 2, changed
    # Sigmoid's deleted verdict, asked for: only it is tested (its batch of one: compiled alone)
    target = w / "layers" / "Sigmoid_y" / "vmvx" / "result.json"
    target.unlink()
    ok(run_cli(*run, "--compile-batch", "2", "--", str(target.relative_to(out))))
    assert stamps.changed() == ["layers/Sigmoid_y/vmvx/result.json"]
    # a batch of one layer is compiled by the layer's own test, from its own file (no merge)
    assert "a batch of one layer" in json.loads(target.read_text())["timing"]["compile_batch"]["compiled_alone"]

    # Conv changes: its batch is compiled again and only Conv is retested; Relu (same
    # batch) and LpPool (compiled alone, the next batch) keep their verdicts
    mixed_model(tmp_path / "mixed.onnx", scale=0.25)
    ok(run_cli(*run, "--compile-batch", "2"))
    first = {e: next((w / "batches" / e).glob("0000-*")) for e in ("llvm-cpu", "vmvx")}
    assert [m["slug"] for m in json.loads((first["vmvx"] / "batch.json").read_text())["members"]] == \
        ["Conv_c", "Relu_r"]
    assert stamps.changed() == sorted(
        [str((first[e] / "batch.json").relative_to(w)) for e in first]
        + [f"layers/Conv_c/{e}/result.json" for e in ("llvm-cpu", "ort", "vmvx")])

    # nothing changed: nothing runs
    ok(run_cli(*run, "--compile-batch", "2"))
    assert stamps.changed() == []

    # one-layer compiles: the iree executors' tests are redone (their compile_ms is their
    # own again), ORT's are not
    ok(run_cli(*run, "--compile-batch", "1"))
    assert stamps.changed() == sorted(f"layers/{s}/{e}/result.json" for s in
                                      ("Conv_c", "Relu_r", "LpPool_p", "Cast_d", "Abs_a", "Cast_f", "Sigmoid_y")
                                      for e in ("llvm-cpu", "vmvx"))
    res = json.loads((w / "layers" / "Relu_r" / "vmvx" / "result.json").read_text())
    assert "compile_batch" not in res["timing"]


def twice_model(path: Path) -> Path:
    """Relu -> Sigmoid -> Relu -> Sigmoid on one shape: 4 layers, 2 signatures."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Sigmoid", ["a"], ["b"], name="s1"),
             helper.make_node("Relu", ["b"], ["c"], name="r2"), helper.make_node("Sigmoid", ["c"], ["y"], name="s2")]
    onnx.save(make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 8])], [tvi("y", TensorProto.FLOAT, [1, 8])]), path)
    return path


def test_dedup_layers_and_deleted_result(tmp_path):
    """--dedup-layers switched on (fewer members, new batch ids) retests nothing and the
    duplicates copy the verdicts; a deleted verdict is redone alone, from its batch's module."""
    model = twice_model(tmp_path / "twice.onnx")
    out = tmp_path / "out"
    run = ["discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--keep-work", "all"]
    ok(run_cli(*run))
    w = work(out)
    stamps = Stamps(w)
    assert len(list((w / "batches" / "llvm-cpu").glob("*/batch.json"))) == 1  # default 32: one batch
    ok(run_cli(*run, "--dedup-layers"))  # 2 members instead of 4: the batch is compiled again
    changed = stamps.changed()
    assert results(changed) == [] and len(changed) == 2, changed
    report = json.loads((out / "torq_gen_config_twice.json").read_text())
    assert all(e["status"] == "success" for op in report["ops"].values() for e in op["executors"].values())
    target = w / "layers" / "Relu_a" / "llvm-cpu" / "result.json"
    target.unlink()
    ok(run_cli(*run, "--dedup-layers", "--", str(target.relative_to(out))))
    assert stamps.changed() == ["layers/Relu_a/llvm-cpu/result.json"]
    res = json.loads(target.read_text())
    assert res["status"] == "success" and res["timing"]["compile_batch"]["compile_ms_is"] == "share"


def test_larger_timeout_redoes_only_what_timed_out(tmp_path):
    """A batch that timed out leaves its layers to compile alone; under a larger
    --timeout the batch and the timed-out verdicts are redone, the others are not."""
    model = mixed_model(tmp_path / "mixed.onnx")
    out = tmp_path / "out"
    run = ["discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--keep-work", "all",
           "--layer-inputs", "random",
           "--compile-batch", "3"]
    ok(run_cli(*run, "--timeout", "0.5"))
    w = work(out)
    stamps = Stamps(w)
    timed_out = sorted(str(p.relative_to(w)) for p in stamps.before if p.name == "result.json"
                       and (json.loads(p.read_text()).get("failure_report") or {}).get("stage") == "timeout")
    batches_timed_out = sorted(str(p.relative_to(w)) for p in stamps.before if p.name == "batch.json"
                               and any(c["status"] == "timeout" for c in json.loads(p.read_text())["compiles"]))
    # under load a layer's reference or MLIR import can time out too (a marker beside it,
    # pipeline/markers.py): then the verdicts built on it are redone as well
    for marker in (w / "layers").glob("*/*.timed-out"):
        layer = marker.parent
        built_on = [d for d in layer.iterdir() if d.is_dir()]
        if marker.name.startswith("import."):  # the IREE executors' input; not ORT's
            built_on = [d for d in built_on if d.name != "ort"]
        timed_out += [str((d / "result.json").relative_to(w)) for d in built_on if (d / "result.json").exists()]
    timed_out = sorted(set(timed_out))
    if not timed_out and not batches_timed_out:
        pytest.skip("nothing timed out under 0.5 s on this machine")
    ok(run_cli(*run, "--timeout", "60"))
    changed = stamps.changed()
    assert results(changed) == timed_out, changed
    assert set(batches_timed_out) <= set(changed)
    for p in (w / "layers").glob("*/*/result.json"):
        assert (json.loads(p.read_text()).get("failure_report") or {}).get("stage") != "timeout", p
