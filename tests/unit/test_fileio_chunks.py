"""fileio: JSON written a line at a time (json_chunks) and several files written all or
none from bytes or chunks, unchanged files kept (atomic_write_files)."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from torq_gen_config.core.fileio import atomic_write_files, json_bytes, json_chunks


@pytest.mark.parametrize("data", [
    {"a": 1, "ops": {"x": {"k": [1, 2.5, None]}, "y": {"s": "é\n\"q\""}}, "z": {"n": [1, {"m": True}]}},
    {"ops": {}, "b": []},
    {"ops": {"only": 1}},
    {"b": "no ops at all"},
    {"a": {}, "ops": [1, 2]},  # not a mapping: written as usual
])
def test_json_chunks_is_the_same_json(data):
    text = b"".join(json_chunks(data, one_line="ops")).decode()
    assert json.loads(text) == data
    if isinstance(data.get("ops"), dict) and data["ops"]:
        block = text.split('  "ops": {\n', 1)[1].split("\n  }", 1)[0].splitlines()
        assert len(block) == len(data["ops"])  # one line per entry
        for line, (k, v) in zip(block, data["ops"].items()):
            key, value = line.strip().rstrip(",").split(": ", 1)
            assert (json.loads(key), json.loads(value)) == (k, v)
    else:  # nothing to put on one line: exactly json_bytes
        assert text.encode() == json_bytes(data)


def test_json_chunks_converts_numpy_and_refuses_nan():
    out = b"".join(json_chunks({"ops": {"x": {"v": np.float32(1.5), "i": np.int64(3)}}}, one_line="ops"))
    assert json.loads(out) == {"ops": {"x": {"v": 1.5, "i": 3}}}
    with pytest.raises(ValueError):
        b"".join(json_chunks({"ops": {"x": math.nan}}, one_line="ops"))


def test_atomic_write_files_from_chunks_keeps_unchanged_files(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "sub" / "b.bin"
    atomic_write_files({a: iter([b"{", b"}"]), b: b"\x00\x01"})
    assert a.read_bytes() == b"{}" and b.read_bytes() == b"\x00\x01"
    old = 1_000_000_000_000_000_000
    for p in (a, b):
        os.utime(p, ns=(old, old))
    atomic_write_files({a: [b"{}"], b: b"\x00\x02"}, keep_unchanged=True)
    assert a.stat().st_mtime_ns == old  # same bytes: untouched
    assert b.read_bytes() == b"\x00\x02" and b.stat().st_mtime_ns > old
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_atomic_write_files_replaces_nothing_when_a_chunk_fails(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"old a")
    b.write_bytes(b"old b")

    def chunks():
        yield b"new"
        raise ValueError("cannot encode")

    with pytest.raises(ValueError):
        atomic_write_files({a: b"new a", b: chunks()})
    assert a.read_bytes() == b"old a" and b.read_bytes() == b"old b"
    assert not [p for p in tmp_path.glob(".*.tmp")]
