"""The weight store: each large tensor of the prepared model on disk once.

The preparation moves every tensor of at least :data:`MIN_EXTERNAL_BYTES` (initializers
and ``Constant`` values, subgraphs included) into one file beside ``prepared.onnx``,
:data:`STORE_FILE`, an IREE parameter archive that is also the model's ONNX external
data (``location``, ``offset``, ``length`` and a ``checksum``: the SHA-1 of the tensor's
bytes, so that a changed weight changes every model file that refers to it, and
Snakemake reruns what reads it). The layer, partition and reduction models cut from the
prepared model refer to the same bytes instead of copying them
(:mod:`torq_gen_config.core.external_data`).

Values that constant folding computes (``ConstantOfShape`` weights, a folded
``Transpose`` of a weight) are not tensors of the prepared model; the split and the
full-model plan write those their models read into archives of their own beside the
store (:func:`store_folded`: :data:`FOLDED_FILE`, :data:`FOLDED_RUN_FILE`), referred
to the same way. All of them are IREE parameter archives of one scope
(:data:`PARAMETER_SCOPE`): ``parameters: external`` (docs/parameters.md) runs the
modules with ``--parameters=model=<archive>`` for each.
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from .external_data import (
    external_entries,
    is_external,
    load_tensor,
    model_tensors,
    set_external_entries,
)
from .lazy import np, numpy_helper, onnx, rt

#: The store's file name, in the folder of ``prepared.onnx``.
STORE_FILE = "weights.irpa"
#: Tensors with fewer bytes stay inside the model (shapes, scales, small constants):
#: onnx's own default threshold for external data.
MIN_EXTERNAL_BYTES = 1024
#: The scope of the store's entries as IREE parameters (``--parameters=model=<store>``).
PARAMETER_SCOPE = "model"
#: The archives, beside the store, of the values that constant folding computed
#: (:func:`store_folded`): the layer split's, and the full-model plan's (one writer each).
FOLDED_FILE, FOLDED_RUN_FILE = "folded.irpa", "folded_run.irpa"
#: The key prefix of a folded value in its archive: never the key of a stored tensor, so
#: that the store and a folded archive can be one parameter scope (``--parameters`` twice).
FOLDED_KEY = "folded:"


def _raw_bytes(tensor) -> bytes:
    """The little-endian raw bytes of an in-model tensor (typed fields converted)."""
    if tensor.HasField("raw_data"):
        return tensor.raw_data

    return numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data


def externalize(model, store_path: str | os.PathLike, *, min_bytes: int = MIN_EXTERNAL_BYTES) -> dict:
    """Move the values of ``model``'s tensors of at least ``min_bytes`` bytes into the
    store ``store_path`` (in place: those tensors then refer to it by its file name, so
    ``model`` must be saved in the store's folder). Tensors already external (absolute
    locations: :func:`load_model`, :func:`resolve_locations`) are copied file to file,
    without passing through memory; strings stay inside.

    The store is an IREE parameter archive (``.irpa``, written by ``iree.runtime``): one
    entry per tensor, keyed by the tensor's name (``name#2``... for a name used twice),
    each entry's bytes being the tensor's raw little-endian data; the ONNX external
    data entries point at those bytes (``offset``, ``length``) and carry their SHA-1
    (``checksum``). So one file serves ONNX Runtime, onnx and the MLIR import, and
    ``iree-run-module --parameters=model=<store>`` (:data:`PARAMETER_SCOPE`). Written
    atomically; an unchanged store is left untouched (its mtime too).

    Returns:
        ``{"tensors": int, "bytes": int (the store's size), "tensor_bytes": int (the
        tensors' bytes), "file": str (the store's file name)}``.

    Raises:
        OSError: the store cannot be written.
    """
    store_path = Path(store_path)
    index = rt.ParameterIndex()
    moved: list[tuple[Any, str, int, str]] = []
    keys: set[str] = set()
    sources: dict[str, int] = {}  # the files external tensors are copied from: their descriptors
    try:
        for t in model_tensors(model):
            if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
                continue
            source = _external_source(t, min_bytes)
            if source is None:
                if is_external(t):
                    load_tensor(t)  # small: inside the model
                data = _raw_bytes(t)
                if len(data) < min_bytes:
                    continue
            key, n = t.name or "tensor", 1
            while key in keys:
                n += 1
                key = f"{t.name or 'tensor'}#{n}"
            keys.add(key)
            if source is not None:
                loc, offset, length, checksum = source
                if loc not in sources:
                    sources[loc] = os.open(loc, os.O_RDONLY)
                index.add_from_file_handle(key, rt.FileHandle.wrap_fd(sources[loc]), length, offset)
                moved.append((t, key, length, checksum or _file_sha1(sources[loc], offset, length)))
                continue
            index.add_buffer(key, data)
            moved.append((t, key, len(data), hashlib.sha1(data).hexdigest()))
            _clear_values(t)  # the index holds the bytes now: never twice in memory
        return _write_store(index, moved, store_path)
    finally:
        for fd in sources.values():
            os.close(fd)


def _external_source(tensor, min_bytes: int) -> tuple[str, int, int, str | None] | None:
    """``(location, offset, length, checksum or None)`` of an external tensor of at least
    ``min_bytes`` bytes with an absolute location, else None."""
    if not is_external(tensor):
        return None
    e = external_entries(tensor)
    loc = e.get("location", "")
    if not os.path.isabs(loc):
        return None
    offset = int(e.get("offset", 0))
    length = int(e["length"]) if "length" in e else os.path.getsize(loc) - offset
    if length < min_bytes:
        return None
    if offset + length > os.path.getsize(loc):
        raise ValueError(f"tensor {tensor.name!r}: {loc} is shorter than its {length} bytes at offset {offset}")
    return loc, offset, length, e.get("checksum")


def _file_sha1(fd: int, offset: int, length: int) -> str:
    """SHA-1 of ``length`` bytes at ``offset`` of the open file ``fd``, read in chunks."""
    h = hashlib.sha1()
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 24), offset)
        if not chunk:
            raise ValueError("the file ends before the tensor's bytes do")
        h.update(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return h.hexdigest()


def _write_store(index, moved: list, store_path: Path) -> dict:
    """Write the archive of ``index`` to ``store_path`` (atomically; left untouched when
    equal) and point each moved tensor at its bytes there."""
    store_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=store_path.parent, prefix=f".{store_path.stem}.tmp.", suffix=store_path.suffix)
    os.close(fd)
    try:
        index.create_archive_file(tmp)
        del index
        offsets = archive_offsets(tmp)
        for t, key, length, checksum in moved:
            set_external_entries(t, {"location": store_path.name, "offset": offsets[key], "length": length,
                             "checksum": checksum})
        if _same_file(tmp, store_path):
            os.unlink(tmp)
        else:
            os.chmod(tmp, 0o644)
            os.replace(tmp, store_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"tensors": len(moved), "bytes": store_path.stat().st_size,
            "tensor_bytes": sum(m[2] for m in moved), "file": store_path.name}


def _clear_values(tensor) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)


def archive_offsets(path: str | os.PathLike) -> dict[str, int]:
    """Entry key -> byte offset of its data in the parameter archive ``path``."""
    index = rt.ParameterIndex()
    index.load(str(path))
    return {k: e.file_storage[1] for k, e in index.items() if e.is_file}


def store_folded(values, names, path: str | os.PathLike, *, min_bytes: int = MIN_EXTERNAL_BYTES) -> dict:
    """Put the folded values among ``names`` into the archive ``path`` (beside the store:
    :data:`FOLDED_FILE`), so that the models cut from them refer to their bytes as to
    the stored tensors', instead of holding a copy each (a model whose weights are
    computed, e.g. by ``ConstantOfShape``, a ``Transpose`` or a ``Cast`` of a weight).

    Args:
        values: the folded values (``model.folding.ConstantValues``): each name held as
            an array of at least ``min_bytes`` bytes is written, under
            :data:`FOLDED_KEY` + its name, and replaced by a ``TensorProto`` that refers
            to the archive (absolute location; ``values.set_proto``). Tensors of the
            model (held as protos) are left as they are.
        names: the values to consider (those the cut models read).
        path: the archive, written as :func:`externalize` writes the store (atomically;
            an unchanged archive is left untouched; one without tensors is still written).

    Returns:
        :func:`externalize`'s summary.

    Raises:
        OSError: the archive cannot be written.
    """
    holder, chosen = onnx.ModelProto(), []
    for name in sorted(set(names)):  # sorted: the same values give the same archive
        if name not in values or values.proto(name) is not None:
            continue
        arr = np.asarray(values[name])
        if arr.dtype.kind in "OUSV" or arr.nbytes < min_bytes:
            continue
        try:
            holder.graph.initializer.append(numpy_helper.from_array(arr, FOLDED_KEY + name))
        except Exception:  # a dtype onnx cannot hold: the value stays in the models
            continue
        chosen.append(name)
    info = externalize(holder, path, min_bytes=min_bytes)
    folder = Path(path).resolve().parent
    for name, t in zip(chosen, holder.graph.initializer):
        entries = external_entries(t)
        entries["location"] = str(folder / entries["location"])
        set_external_entries(t, entries)
        values.set_proto(name, t)
    return info


def parameter_key(tensor, keys_by_offset: dict[str, dict[int, str]]) -> str | None:
    """The archive key of ``tensor`` (its entry in a parameter archive: the store,
    :data:`STORE_FILE`, or a folded one, found by its external-data ``offset``; absolute
    location, as :func:`load_model` leaves it), or None for a tensor inside the model or
    in another file. ``keys_by_offset``: a
    cache, store path -> {offset: key}, filled on first use of each store.

    Raises:
        OSError: the store cannot be read.
    """
    if not is_external(tensor):
        return None
    entries = external_entries(tensor)
    loc = entries.get("location", "")
    if not loc.endswith(".irpa") or not os.path.isabs(loc):
        return None
    if loc not in keys_by_offset:
        keys_by_offset[loc] = {offset: key for key, offset in archive_offsets(loc).items()}
    return keys_by_offset[loc].get(int(entries.get("offset", 0)))


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.getsize(a) == os.path.getsize(b) and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False
