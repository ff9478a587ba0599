"""The value store (core/value_store.py): content-addressed values, records, pruning."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from torq_gen_config.core.errors import DamagedWorkFile
from torq_gen_config.core.value_store import (ValueStore, prune, read_record, store_file_of, value_digest,
                                              write_record)


@pytest.mark.parametrize("value", [
    np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    np.array(3.5, dtype=np.float64),  # 0-d
    np.zeros((0, 3), dtype=np.int64),  # empty
    np.array([True, False]),
    np.arange(6, dtype=np.uint8).reshape(2, 3),
    np.linspace(-2, 2, 8, dtype=np.float32).astype(ml_dtypes.bfloat16),
    np.linspace(-2, 2, 8, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn),
    np.array(["a", "bc"], dtype=object),
])
def test_round_trip_keeps_dtype_shape_and_bits(tmp_path, value):
    store = ValueStore(tmp_path)
    ref = store.put(value)
    back = store.load(ref)
    assert back.dtype == value.dtype and back.shape == value.shape
    if value.dtype == object:
        assert list(back) == list(value)
    else:
        assert back.tobytes() == value.tobytes()
    assert json.loads(json.dumps(ref)) == ref  # JSON-safe


def test_equal_values_are_stored_once_and_others_apart(tmp_path):
    store = ValueStore(tmp_path)
    a = np.arange(12, dtype=np.float32)
    r1, r2 = store.put(a), store.put(a.copy())
    assert r1 == r2 and len(list(tmp_path.glob("*.npy"))) == 1
    # the same bytes under another dtype or shape are another value
    assert store.put(a.view(np.int32))["digest"] != r1["digest"]
    assert store.put(a.reshape(3, 4))["digest"] != r1["digest"]
    assert value_digest(np.float32(3)) != value_digest(np.array([3], np.float32))
    assert len(list(tmp_path.glob("*.npy"))) == 3
    # an unchanged value is not written again (its file keeps its mtime)
    before = store.path(r1).stat().st_mtime_ns
    store.put(a)
    assert store.path(r1).stat().st_mtime_ns == before


def test_load_maps_the_file_read_only_and_tools_may_read_it_in_place(tmp_path):
    store = ValueStore(tmp_path)
    ref = store.put(np.ones((4, 4), np.float32))
    v = store.load(ref)
    assert store_file_of(v) == str(store.path(ref))
    with pytest.raises(ValueError):
        v[0, 0] = 2  # read-only: nobody changes a stored value through its map
    assert store_file_of(v[1:]) is None and store_file_of(v.reshape(16)) is None and store_file_of(v + 1) is None
    assert store_file_of(np.ones(3)) is None
    assert store_file_of(store.load(ref, mmap_mode=None)) is None


def test_a_damaged_or_missing_value_is_named_and_removed(tmp_path):
    store = ValueStore(tmp_path)
    ref = store.put(np.arange(100, dtype=np.float32))
    store.path(ref).write_bytes(store.path(ref).read_bytes()[:60])  # cut short
    with pytest.raises(DamagedWorkFile, match=ref["digest"]):
        store.load(ref)
    assert not store.path(ref).exists()
    with pytest.raises(DamagedWorkFile):
        store.load(ref)
    ref = store.put(np.arange(4, dtype=np.float32))
    with pytest.raises(DamagedWorkFile, match="shape"):
        store.load({**ref, "shape": [2, 2]})


def test_records_find_their_store_relative_to_themselves(tmp_path):
    store = ValueStore(tmp_path / "work" / "values")
    rec = tmp_path / "work" / "layers" / "L" / "inputs.json"
    rec.parent.mkdir(parents=True)
    ref = store.put(np.arange(3))
    assert write_record(rec, {"values": {"x": ref}}, store, only_if_changed=True)
    assert not write_record(rec, {"values": {"x": ref}}, store, only_if_changed=True)
    moved = tmp_path / "moved"
    (tmp_path / "work").rename(moved)
    got, st = read_record(moved / "layers" / "L" / "inputs.json")
    assert list(st.load(got["values"]["x"])) == [0, 1, 2]
    bad = moved / "layers" / "L" / "reference.json"
    bad.write_text("{\"values\"")
    with pytest.raises(DamagedWorkFile):
        read_record(bad)
    assert not bad.exists()
    with pytest.raises(FileNotFoundError):
        read_record(bad)


def test_prune_keeps_what_records_refer_to(tmp_path):
    store = ValueStore(tmp_path / "values")
    keep, drop = store.put(np.arange(3)), store.put(np.arange(4))
    (tmp_path / "values" / ".x.tmp").write_bytes(b"partial")
    rec = tmp_path / "r.json"
    write_record(rec, {"outputs": {"y": keep}}, store)
    removed, freed = prune(tmp_path / "values", [rec, tmp_path / "missing.json"])
    assert removed == 2 and freed > 0
    assert store.path(keep).exists() and not store.path(drop).exists()
    # an unreadable record keeps everything
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    store.put(np.arange(5))
    assert prune(tmp_path / "values", [rec, bad]) == (0, 0)
