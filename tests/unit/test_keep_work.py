"""keep_work.py: the work directory's size (disk usage, hard links once), which files
``--keep-work minimal`` removes, its record, and how a removed layer MLIR keeps its
identity for the currency checks (pipeline/units.py) and is made again with it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torq_gen_config.core import keep_work
from torq_gen_config.core.fileio import write_json
from torq_gen_config.core.schemas import schema_for, validator
from torq_gen_config.pipeline import units


def _blocks(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _file(path: Path, size: int = 10_000, byte: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(byte * size)
    return path


def test_disk_usage_counts_a_hard_linked_file_once(tmp_path):
    a = _file(tmp_path / "a.bin", 100_000)
    _file(tmp_path / "sub" / "b.bin", 50_000)
    os.link(a, tmp_path / "sub" / "a_link.bin")
    os.symlink(a, tmp_path / "sym.bin")  # not followed, not counted
    total, files = keep_work.disk_usage(tmp_path)
    assert files == 2
    assert total == _blocks(a) + _blocks(tmp_path / "sub" / "b.bin")
    assert total >= 150_000  # real blocks, not st_size


def test_freed_by_counts_only_inodes_whose_every_link_goes(tmp_path):
    a = _file(tmp_path / "a.bin", 100_000)
    b = _file(tmp_path / "b.bin", 40_000)
    os.link(a, tmp_path / "a2.bin")
    assert keep_work.freed_by([a, b]) == _blocks(b)  # a is still linked as a2.bin
    assert keep_work.freed_by([a, tmp_path / "a2.bin", b]) == _blocks(a) + _blocks(b)
    assert keep_work.freed_by([tmp_path / "missing"]) == 0


def _work_dir(tmp_path: Path) -> Path:
    """A work directory with the files of a finished discovery and run, by kind."""
    w = tmp_path / "work" / "m"
    for name in ("prepared.onnx", "full.mlir", "weights.irpa", "model_inputs.npz", "report_summary.json",
                 "layers/manifest.json", "logs/aggregate_report.log", "user_choices.json"):
        _file(w / name, 100)
    for slug, import_status, verdict in (("Conv_a", "ok", "success"), ("Relu_b", "error", "difference")):
        d = w / "layers" / slug
        for name in ("model.onnx", "inputs.npz", "reference.npz", "reference.npz.key", "import.json.key"):
            _file(d / name, 100)
        write_json(d / "import.json", {"status": import_status, "message": None, "import_ms": 1.0, "stage": None})
        _file(d / "model.mlir", 5000 if import_status == "ok" else 0)
        for ex in ("llvm-cpu", "ort"):
            _file(d / ex / "result.json", 100)
            _file(d / ex / "result.json.key", 100)
        _file(d / "llvm-cpu" / "module.vmfb", 3000)  # compiled alone
        for name in ("in_0.npy", "out_0.npy"):
            _file(d / "llvm-cpu" / name, 2000)
    write_json(w / "units" / "0000" / "llvm-cpu.json", {
        "unit": "0000", "executor": "llvm-cpu",
        "members": [{"slug": "Conv_a", "status": "success", "tested": True, "result": [1, 1]},
                    {"slug": "Relu_b", "status": "difference", "tested": True, "result": [1, 1]}]})
    write_json(w / "units" / "0000" / "prepared.json", {"unit": "0000", "members": []})
    b = w / "batches" / "llvm-cpu" / "0000-0123456789"
    for name, size in (("batch.mlir", 8000), ("module.vmfb", 6000), ("batch.json", 100), ("batch.json.key", 100)):
        _file(b / name, size)
    full = w / "full"
    for name in ("plan.json", "assignment.json", "reference.npz", "result.json"):
        _file(full / name, 100)
    alone, member = full / "partitions" / "llvm-cpu-aaaaaaaaaaaa", full / "partitions" / "vmvx-bbbbbbbbbbbb"
    for pdir, artifact in ((alone, f"{alone}/module.vmfb"), (member, str(full / "batches/vmvx/0000-1/module.vmfb"))):
        write_json(pdir / "compiled.json", {"status": "ok", "artifact": {"path": artifact}})
        _file(pdir / "model.onnx", 100)
        _file(pdir / "model.mlir", 4000)
    _file(alone / "module.vmfb", 3000)
    _file(member / "run" / "in_0.npy", 200)  # the partition run's copies of activations
    _file(member / "run" / "out_0.npy", 200)
    module = full / "partitions" / "module-cccccccccccc"  # the one-module run: its side file and record stay
    write_json(module / "compiled.json", {"status": "ok", "artifact": {"path": f"{module}/module.vmfb"}})
    for name, size in (("placement.json", 100), ("module.vmfb", 3000), ("placed.mlir", 9000),
                       ("ir/m/0_dedup.mlir", 2000), ("sources/e.mlir", 500), ("run/out_0.npy", 200),
                       ("bisect/module.vmfb", 3000)):
        _file(module / name, size)
    _file(full / "batches" / "vmvx" / "0000-1" / "module.vmfb", 3000)  # a Snakemake temp() output: Snakemake's
    _file(full / "batches" / "vmvx" / "0000-1" / "batch.mlir", 3000)
    red = full / "reduce"
    write_json(red / "partitions" / "p-ok" / "compiled.json", {"status": "ok"})
    _file(red / "partitions" / "p-ok" / "module.vmfb", 3000)
    _file(red / "partitions" / "p-ok" / "model.mlir", 3000)
    write_json(red / "partitions" / "p-bad" / "compiled.json", {"status": "error"})
    _file(red / "partitions" / "p-bad" / "model.mlir", 3000)  # the reproducer's MLIR of a failing compile
    _file(red / "candidates" / "k1" / "model.onnx", 3000)
    _file(red / "candidates" / "k1.json", 100)
    _file(red / "values" / "index.json", 100)
    return w


def test_removable_selects_the_intermediates_and_nothing_a_reader_needs(tmp_path):
    w = _work_dir(tmp_path)
    got = sorted(p.relative_to(w).as_posix() for p in keep_work.removable(w))
    assert got == sorted([
        "batches/llvm-cpu/0000-0123456789/batch.mlir", "batches/llvm-cpu/0000-0123456789/module.vmfb",
        "layers/Conv_a/model.mlir",  # imported: restorable (Relu_b's import failed: empty, kept)
        "layers/Conv_a/llvm-cpu/module.vmfb", "layers/Relu_b/llvm-cpu/module.vmfb",
        "layers/Conv_a/llvm-cpu/in_0.npy", "layers/Conv_a/llvm-cpu/out_0.npy",  # a success's run files only
        "full/batches/vmvx/0000-1/batch.mlir",
        "full/partitions/llvm-cpu-aaaaaaaaaaaa/module.vmfb", "full/partitions/llvm-cpu-aaaaaaaaaaaa/model.mlir",
        "full/partitions/vmvx-bbbbbbbbbbbb/run/in_0.npy", "full/partitions/vmvx-bbbbbbbbbbbb/run/out_0.npy",
        *(f"full/partitions/module-cccccccccccc/{name}" for name in (
            "module.vmfb", "placed.mlir", "ir/m/0_dedup.mlir", "sources/e.mlir", "run/out_0.npy",
            "bisect/module.vmfb")),
        "full/reduce/partitions/p-ok/compiled.json", "full/reduce/partitions/p-ok/module.vmfb",
        "full/reduce/partitions/p-ok/model.mlir", "full/reduce/candidates/k1/model.onnx",
    ])


def test_clean_removes_them_records_the_layer_mlir_and_validates(tmp_path):
    w = _work_dir(tmp_path)
    mlir = w / "layers" / "Conv_a" / "model.mlir"
    before = units.file_identity(mlir)
    expected = keep_work.freed_by(keep_work.removable(w))
    total = keep_work.disk_usage(w)[0]
    assert keep_work.clean(w) == {"files": 22, "bytes": expected}
    assert not mlir.exists() and not (w / "full/reduce/partitions/p-ok").exists()
    assert (w / "full/reduce/partitions/p-bad/model.mlir").is_file()
    assert keep_work.disk_usage(w)[0] == total - expected + _blocks(w / keep_work.KEEP_WORK_FILE)
    rec = json.loads((w / keep_work.KEEP_WORK_FILE).read_text())
    assert list(rec["restorable"]) == ["layers/Conv_a/model.mlir"]  # a partition's MLIR names no key
    assert rec["restorable"]["layers/Conv_a/model.mlir"][:2] == before
    assert rec["last"]["files"] == 22 and rec["total"] == {"files": 22, "bytes": expected}
    assert schema_for(f"work/m/{keep_work.KEEP_WORK_FILE}") == "keep_work.schema.yaml"
    validator("keep_work.schema.yaml").validate(rec)
    assert keep_work.clean(w) == {"files": 0, "bytes": 0}  # nothing left to remove: the record stays
    assert json.loads((w / keep_work.KEEP_WORK_FILE).read_text())["total"]["files"] == 22


def test_a_removed_layer_mlir_keeps_its_identity_in_the_currency_checks(tmp_path):
    w = _work_dir(tmp_path)
    d = w / "layers" / "Conv_a"
    mlir, status = d / "model.mlir", d / "import.json"
    ident = units.file_identity(mlir)
    key = units.make_key({"precision": None}, [d / "model.onnx"])
    units.record_key(status, key)
    test_key = units.make_key({"executor": "llvm-cpu"}, [d / "model.onnx", mlir, status])
    keep_work.clean(w)
    assert units.file_identity(mlir) == ident  # the unit's drift and every key see the same file
    assert units.make_key({"executor": "llvm-cpu"}, [d / "model.onnx", mlir, status]) == test_key
    assert units.is_current(status, key, mlir)  # its import is not redone because it was removed
    # a compiled module is not restorable: its absence is noticed (its batch is compiled again)
    assert not units.is_current(status, key, w / "batches/llvm-cpu/0000-0123456789/module.vmfb")
    assert units.file_identity(w / "layers" / "Relu_b" / "nothing.mlir") is None


def test_restore_gives_the_same_bytes_their_old_mtime_and_other_bytes_a_new_identity(tmp_path):
    w = _work_dir(tmp_path)
    mlir = w / "layers" / "Conv_a" / "model.mlir"
    content, ident = mlir.read_bytes(), units.file_identity(mlir)
    keep_work.clean(w)
    assert keep_work.restore(mlir, lambda tmp: Path(tmp).write_bytes(content))
    assert mlir.read_bytes() == content and units.file_identity(mlir) == ident
    assert not keep_work.restore(mlir, lambda tmp: pytest.fail("it exists: not made again"))
    assert not list(mlir.parent.glob(".*.tmp"))
    keep_work.clean(w)
    assert keep_work.restore(mlir, lambda tmp: Path(tmp).write_bytes(content + b"changed"))
    assert units.file_identity(mlir) != ident  # another import: the keys that name it are redone
    keep_work.clean(w)

    def fails(tmp):
        Path(tmp).write_bytes(b"")
        raise RuntimeError("the import failed")

    with pytest.raises(RuntimeError):
        keep_work.restore(mlir, fails)
    assert not mlir.exists() and units.file_identity(mlir) is None  # simply missing now: its job redoes it
    assert "layers/Conv_a/model.mlir" not in json.loads((w / keep_work.KEEP_WORK_FILE).read_text())["restorable"]
    other = w / "layers" / "Relu_b" / "model.mlir"
    other.unlink()
    assert not keep_work.restore(other, lambda tmp: pytest.fail("not removed by the clean-up"))


def test_measure_finish_and_the_summary_lines(tmp_path):
    w = _work_dir(tmp_path)
    model = _file(tmp_path / "m.onnx", 20_000)
    sec = keep_work.measure(w, model, output_dir=tmp_path)
    assert sec["path"] == "work/m" and sec["bytes"] == keep_work.disk_usage(w)[0]
    assert sec["model_bytes"] == 20_000 and sec["ratio"] == round(sec["bytes"] / 20_000, 2)
    assert sec["removable_bytes"] == keep_work.freed_by(keep_work.removable(w))
    validator("report.schema.yaml").validate({"ops": {}, "work_dir": sec})
    line = keep_work.size_line(sec, w, "all")
    assert line.startswith(f"Work directory: {w}, {keep_work.human(sec['bytes'])} (")
    assert f"the model's 20.0 kB); --keep-work minimal would free {keep_work.human(sec['removable_bytes'])}" in line
    lines = []
    after = keep_work.finish(w, "minimal", model, output_dir=tmp_path, echo=lines.append)
    assert after["freed_files"] == 22 and after["freed_bytes"] == sec["removable_bytes"]
    record = _blocks(w / keep_work.KEEP_WORK_FILE)
    assert after["bytes"] == sec["bytes"] - sec["removable_bytes"] + record and after["removable_bytes"] == 0
    assert lines == [f"--keep-work minimal: removed 22 file(s), {keep_work.human(after['freed_bytes'])}, from {w}"]
    assert keep_work.finish(w, "minimal", model, output_dir=tmp_path, echo=lines.append) == after  # a rerun
    assert len(lines) == 1
    assert f"--keep-work minimal freed {keep_work.human(after['freed_bytes'])} (22 files, " in \
        keep_work.size_line(after, w, "minimal")
    assert "freed" in keep_work.recorded_line(after) and "when the report was written" in keep_work.recorded_line(after)
    fresh = _work_dir(tmp_path / "other")
    assert "freed_files" not in keep_work.finish(fresh, "all", model)
    assert keep_work.removable(fresh)  # all: nothing removed
