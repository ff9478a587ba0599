"""pipeline/units.py: the unit plan (about 32 layers, whole compile batches) and the
per-layer keys that keep what is up to date inside a unit job."""

from __future__ import annotations

import json
import os
import time

import pytest

from torq_gen_config.discovery.batch_compile import plan_batches
from torq_gen_config.pipeline import units


@pytest.mark.parametrize("compile_batch,size", [(1, 32), (8, 32), (5, 35), (32, 32), (64, 64), (100, 100)])
def test_unit_size_is_about_32_layers_and_whole_batches(compile_batch, size):
    assert units.unit_size(compile_batch) == size
    assert units.unit_size(compile_batch) % compile_batch == 0


def test_unit_size_refuses_a_batch_below_one():
    with pytest.raises(ValueError, match="compile_batch"):
        units.unit_size(0)


@pytest.mark.parametrize("n,compile_batch", [(0, 32), (1, 32), (66, 32), (100, 5), (70, 1), (1000, 32), (5000, 64)])
def test_units_cover_the_layers_in_order_and_nest_the_batches(n, compile_batch):
    slugs = [f"L{i}" for i in range(n)]
    plan = units.plan_units(slugs, compile_batch)
    assert [s for u in plan for s in u["members"]] == slugs
    assert [u["id"] for u in plan] == [f"{k:04d}" for k in range(len(plan))]
    assert all(len(u["members"]) <= units.unit_size(compile_batch) for u in plan)
    # every compile batch of the same layers lies in one unit (a unit job compiles its own)
    unit_of = {s: u["id"] for u in plan for s in u["members"]}
    for b in plan_batches(slugs, compile_batch, "k"):
        assert len({unit_of[s] for s in b["members"]}) == 1, b


def test_a_5000_layer_model_is_a_few_hundred_jobs():
    plan = units.plan_units([f"L{i}" for i in range(5000)], 32)
    jobs = len(plan) * (1 + 3)  # prepare + a test job per executor (the default three)
    assert len(plan) == 157 and jobs < 700


def test_key_follows_settings_and_file_identity(tmp_path):
    f = tmp_path / "model.onnx"
    f.write_bytes(b"abc")
    k = units.make_key({"a": 1}, [f, None])
    assert k == units.make_key({"a": 1}, [f, None])
    assert k != units.make_key({"a": 2}, [f, None])
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert k != units.make_key({"a": 1}, [f, None])  # rewritten (mtime), even with the same bytes
    f.unlink()
    assert units.make_key({"a": 1}, [f]) != k  # gone


def test_is_current_needs_the_output_its_companions_and_the_same_key(tmp_path):
    out, other = tmp_path / "result.json", tmp_path / "model.mlir"
    assert not units.is_current(out, "k")
    out.write_text("{}")
    assert not units.is_current(out, "k")  # no key file: made by a job killed before its key
    units.record_key(out, "k")
    assert units.is_current(out, "k") and not units.is_current(out, "k2")
    assert not units.is_current(out, "k", other)
    other.write_text("")
    assert units.is_current(out, "k", other)
    out.write_text('{"status": "error"}')  # edited (or damaged) outside the workflow
    assert not units.is_current(out, "k")
    units.record_key(out, "k")
    assert units.is_current(out, "k")
    units.drop_key(out)
    units.drop_key(out)  # twice is fine
    assert not units.is_current(out, "k")


def test_newer_than(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert units.newer_than([a], b)  # a missing output is older than anything
    b.write_text("")
    assert not units.newer_than([a], b)  # a missing input is not newer
    time.sleep(0.01)
    a.write_text("")
    assert units.newer_than([a], b) and not units.newer_than([b], a)


def test_changed_outside_names_an_edited_or_deleted_output(tmp_path):
    from torq_gen_config.pipeline.units import changed_outside

    out = tmp_path / "result.json"
    assert changed_outside(out) is None  # never made
    out.write_text('{"status": "success"}')
    assert changed_outside(out) is None  # made, but its job was killed before the key
    units.record_key(out, "k")
    assert changed_outside(out) is None
    out.write_text('{"status": "error"}')
    assert changed_outside(out) == "changed"
    out.unlink()
    assert changed_outside(out) == "deleted"


def test_a_unit_key_file_holds_its_members_keys_and_finds_those_of_a_moved_layer(tmp_path):
    """One key file per unit job (units/<unit>/<job>.keys.json) instead of a file beside
    each output; a layer now in another unit (a layer added before it) finds its key in
    the file of the unit it was in, so it is not tested again."""
    layer = tmp_path / "layers" / "A" / "llvm-cpu" / "result.json"
    layer.parent.mkdir(parents=True)
    layer.write_text('{"status": "success"}')
    u0 = units.unit_key_file(tmp_path / "units" / "0000" / "prepared.json", "llvm-cpu")
    assert u0.path == tmp_path / "units" / "0000" / "llvm-cpu.keys.json"
    assert not units.is_current(layer, "k", keys=u0)
    units.record_key(layer, "k", u0)
    assert units.is_current(layer, "k", keys=u0) and not units.is_current(layer, "k2", keys=u0)
    assert not (layer.parent / "result.json.key").exists()  # no file beside the output
    assert list(json.loads(u0.path.read_text())["keys"]) == ["../../layers/A/llvm-cpu/result.json"]
    # read again by a later job; the same layer now in unit 0001
    u1 = units.unit_key_file(tmp_path / "units" / "0001" / "prepared.json", "llvm-cpu")
    assert units.is_current(layer, "k", keys=u1)
    assert units.changed_outside(layer, u1) is None
    layer.write_text('{"status": "error"}')  # edited outside the workflow
    assert not units.is_current(layer, "k", keys=units.KeyFile(u1.path)) and units.changed_outside(layer, u1) == "changed"
    units.record_key(layer, "k", u1)
    assert units.is_current(layer, "k", keys=units.KeyFile(u1.path))
    units.drop_key(layer, u1)
    assert json.loads(u1.path.read_text())["keys"] == {}
    # unit 0000's entry is older than the file: it no longer counts
    assert not units.is_current(layer, "k", keys=units.KeyFile(u1.path))
    # a damaged key file: its members are made again, nothing raises
    u0.path.write_text("{not json")
    assert units.KeyFile(u0.path).recorded(layer) is None
