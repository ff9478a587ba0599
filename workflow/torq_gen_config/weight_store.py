"""The weight store: each large tensor of the prepared model on disk once.

The preparation moves every tensor of at least :data:`MIN_EXTERNAL_BYTES` (initializers
and ``Constant`` values, subgraphs included) into one file beside ``prepared.onnx``,
:data:`STORE_FILE`, an IREE parameter archive that is also the model's ONNX external data (``location``, ``offset``, ``length`` and a
``checksum``: the SHA-1 of the tensor's bytes, so that a changed weight changes every
model file that refers to it, and Snakemake reruns what reads it). The layer, partition
and reduction models cut from the prepared model refer to the same bytes instead of
copying them: their tensors keep the store's ``location`` relative to the store's
folder, and the model records that folder relative to its own file in the metadata
property :data:`WEIGHTS_DIR_PROP` (ONNX and ONNX Runtime refuse ``..`` in a location and
links that leave the model's folder, and onnx refuses hard links: measured with onnx
1.23 and ONNX Runtime 1.32).

Values that constant folding computes (``ConstantOfShape`` weights, a folded
``Transpose`` of a weight) are not tensors of the prepared model; the split and the
full-model plan write those their models read into archives of their own beside the
store (:func:`store_folded`: :data:`FOLDED_FILE`, :data:`FOLDED_RUN_FILE`), referred
to the same way. All of them are IREE parameter archives of one scope
(:data:`PARAMETER_SCOPE`): ``parameters: external`` (docs/parameters.md) runs the
modules with ``--parameters=model=<archive>`` for each.

In memory, a model read with :func:`load_model` ``(weights=False)`` holds its external
tensors with *absolute* locations, so that any step can read a tensor's values
(:func:`tensor_array`) without knowing where the model came from; :func:`save_model`
makes them relative again. Such a model is never handed to ONNX Runtime as it is
(absolute locations are refused): sessions are made from saved files with
:func:`session_options`, or from models whose tensors were read in
(:func:`load_weights`).
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .fileio import atomic_write_bytes, write_bytes_if_changed

#: The store's file name, in the folder of ``prepared.onnx``.
STORE_FILE = "weights.irpa"
#: Metadata property of a model whose store is not in the model's own folder: the store's
#: folder relative to the model file's folder (e.g. ``../..`` for a layer model).
WEIGHTS_DIR_PROP = "torq_gen_config.weights_dir"
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
#: The ONNX Runtime session option that names the folder external data is relative to.
_ORT_FOLDER_OPTION = "session.model_external_initializers_file_folder_path"


def _graph_tensors(graph) -> Iterator[Any]:
    """Every TensorProto of ``graph``: initializers, tensor attributes (``Constant``
    values), and those of nested subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _graph_tensors(a.g)
            for g in a.graphs:
                yield from _graph_tensors(g)


def model_tensors(model) -> Iterator[Any]:
    """Every TensorProto of ``model`` (:func:`_graph_tensors` of the main graph and of
    the model's local functions)."""
    yield from _graph_tensors(model.graph)
    for f in model.functions:
        for node in f.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t


def is_external(tensor) -> bool:
    """True when ``tensor``'s values are in an external file."""
    from onnx import TensorProto

    return tensor.data_location == TensorProto.EXTERNAL


def _entries(tensor) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _set_entries(tensor, entries: dict[str, str]) -> None:
    from onnx import TensorProto

    del tensor.external_data[:]
    for k, v in entries.items():
        e = tensor.external_data.add()
        e.key, e.value = k, str(v)
    tensor.data_location = TensorProto.EXTERNAL


def _raw_bytes(tensor) -> bytes:
    """The little-endian raw bytes of an in-model tensor (typed fields converted)."""
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    from onnx import numpy_helper

    return numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data


def externalize(model, store_path: str | os.PathLike, *, min_bytes: int = MIN_EXTERNAL_BYTES) -> dict:
    """Move the values of ``model``'s tensors of at least ``min_bytes`` bytes into the
    store ``store_path`` (in place: those tensors then refer to it by its file name, so
    ``model`` must be saved in the store's folder). Tensors already external are read
    in first; strings stay inside.

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
    import iree.runtime as rt
    from onnx import TensorProto

    store_path = Path(store_path)
    index = rt.ParameterIndex()
    moved: list[tuple[Any, str, int, str]] = []
    keys: set[str] = set()
    for t in model_tensors(model):
        if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
            continue
        if is_external(t):
            load_tensor(t)
        data = _raw_bytes(t)
        if len(data) < min_bytes:
            continue
        key, n = t.name or "tensor", 1
        while key in keys:
            n += 1
            key = f"{t.name or 'tensor'}#{n}"
        keys.add(key)
        index.add_buffer(key, data)
        moved.append((t, key, len(data), hashlib.sha1(data).hexdigest()))
        _clear_values(t)  # the index holds the bytes now: never twice in memory
    store_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=store_path.parent, prefix=f".{store_path.stem}.tmp.", suffix=store_path.suffix)
    os.close(fd)
    try:
        index.create_archive_file(tmp)
        del index
        offsets = archive_offsets(tmp)
        for t, key, length, checksum in moved:
            _set_entries(t, {"location": store_path.name, "offset": offsets[key], "length": length,
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
    import iree.runtime as rt

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
    import numpy as np
    from onnx import ModelProto, numpy_helper

    holder, chosen = ModelProto(), []
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
        entries = _entries(t)
        entries["location"] = str(folder / entries["location"])
        _set_entries(t, entries)
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
    entries = _entries(tensor)
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


def resolve_locations(model, model_dir: str | os.PathLike) -> None:
    """Make the locations of ``model``'s external tensors absolute (in place), for a
    model whose file is (or would be) in ``model_dir``."""
    props = {p.key: p.value for p in model.metadata_props}
    base = (Path(model_dir) / props.get(WEIGHTS_DIR_PROP, ".")).resolve()
    for t in model_tensors(model):
        if is_external(t):
            entries = _entries(t)
            loc = entries.get("location", "")
            if not os.path.isabs(loc):
                entries["location"] = str(base / loc)
                _set_entries(t, entries)


def load_model(path: str | os.PathLike, *, weights: bool = True):
    """Read an ONNX model file whose tensors may be in the store (or in any external
    data beside it, the usual ONNX way).

    Args:
        path: the ``.onnx`` file.
        weights: True: every tensor's values are read in (the model is self-contained
            in memory). False: external tensors stay external, with absolute locations
            (module docstring): memory holds the graph only.

    Returns:
        The ``onnx.ModelProto``.

    Raises:
        OSError: the file (or, with ``weights``, a store file) cannot be read.
        google.protobuf.message.DecodeError: the file is not an ONNX model.
        ValueError: a store file is shorter than a tensor's entry says.
    """
    import onnx

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    resolve_locations(model, path.parent)
    if weights:
        load_weights(model)
    return model


def load_tensor(tensor) -> None:
    """Read an external tensor's values into it (in place; its location must be
    absolute, as :func:`load_model` leaves it).

    Raises:
        OSError, ValueError: the file cannot be read or is too short.
    """
    from onnx import TensorProto

    entries = _entries(tensor)
    loc = entries.get("location", "")
    if not os.path.isabs(loc):
        raise ValueError(f"tensor {tensor.name!r}: external data location {loc!r} is not resolved "
                         "(read the model with weight_store.load_model)")
    offset = int(entries.get("offset", 0))
    with open(loc, "rb") as f:
        f.seek(offset)
        if "length" in entries:
            length = int(entries["length"])
            data = f.read(length)
            if len(data) != length:
                raise ValueError(f"tensor {tensor.name!r}: {loc} holds {len(data)} of its {length} bytes "
                                 f"at offset {offset}")
        else:
            data = f.read()
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT
    tensor.raw_data = data


def load_weights(model) -> None:
    """Read every external tensor of an in-memory model in (:func:`load_tensor`)."""
    for t in model_tensors(model):
        if is_external(t):
            load_tensor(t)


def tensor_array(tensor):
    """The values of ``tensor`` (in the model or external, with an absolute location) as
    a numpy array, without changing ``tensor``.

    Raises:
        OSError, ValueError: as :func:`load_tensor`.
    """
    from onnx import numpy_helper

    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    t = type(tensor)()
    t.CopyFrom(tensor)
    load_tensor(t)
    return numpy_helper.to_array(t)


def stored_bytes(tensor):
    """A read-only memory map of an external tensor's bytes (absolute location, as
    :func:`load_model` leaves it): a 1-D ``numpy.memmap`` of uint8, nothing read yet.

    Raises:
        OSError, ValueError: the file cannot be mapped or is too short.
    """
    import numpy as np

    entries = _entries(tensor)
    loc = entries.get("location", "")
    if not os.path.isabs(loc):
        raise ValueError(f"tensor {tensor.name!r}: external data location {loc!r} is not resolved")
    offset = int(entries.get("offset", 0))
    length = int(entries["length"]) if "length" in entries else os.path.getsize(loc) - offset
    if length == 0:
        return np.zeros(0, np.uint8)
    return np.memmap(loc, dtype=np.uint8, mode="r", offset=offset, shape=(length,))


def external_bytes(model) -> int:
    """Bytes of ``model``'s values that are in external files (by their ``length``)."""
    return sum(int(_entries(t).get("length", 0)) for t in model_tensors(model) if is_external(t))


def model_bytes(model, path: str | os.PathLike) -> bytes:
    """The bytes of ``model`` as a file at ``path`` (deterministic serialization): its
    external tensors (absolute locations, :func:`load_model`) relative to their store's
    folder, and that folder relative to ``path``'s folder in :data:`WEIGHTS_DIR_PROP`.
    The in-memory model is not changed. Equal bytes for an equal model wherever the
    output directory is, so they can name a file by their hash.

    Raises:
        ValueError: external tensors in more than one folder.
    """
    path = Path(path)
    out = type(model)()
    out.CopyFrom(model)
    folders = set()
    for t in model_tensors(out):
        if is_external(t):
            entries = _entries(t)
            loc = entries.get("location", "")
            if os.path.isabs(loc):
                folders.add(os.path.dirname(loc))
                entries["location"] = os.path.basename(loc)
                _set_entries(t, entries)
    if len(folders) > 1:
        raise ValueError(f"{path}: the model's external tensors are in several folders: {sorted(folders)}")
    kept = [(p.key, p.value) for p in out.metadata_props if p.key != WEIGHTS_DIR_PROP]
    del out.metadata_props[:]
    for k, v in kept:
        out.metadata_props.add(key=k, value=v)
    if folders:
        rel = os.path.relpath(folders.pop(), os.path.abspath(path.parent))
        if rel != ".":
            out.metadata_props.add(key=WEIGHTS_DIR_PROP, value=rel)
    return out.SerializeToString(deterministic=True)


def save_model(model, path: str | os.PathLike, *, only_if_changed: bool = False) -> bool:
    """Write ``model`` to ``path`` atomically as :func:`model_bytes` gives it.

    Args:
        only_if_changed: leave the file untouched (mtime too) when its bytes are equal.

    Returns:
        True when the file was written.

    Raises:
        ValueError: external tensors in more than one folder.
        OSError: the file cannot be written.
    """
    data = model_bytes(model, path)
    if only_if_changed:
        return write_bytes_if_changed(path, data)
    atomic_write_bytes(path, data)
    return True


def self_contained_bytes(model) -> bytes:
    """The bytes of ``model`` with every tensor's values inside (for a file handed to
    someone else, e.g. the reducer's reproducer). ``model`` is not changed.

    Raises:
        OSError, ValueError: a stored tensor cannot be read; ValueError: the model is
            over protobuf's 2 GB limit.
    """
    out = type(model)()
    out.CopyFrom(model)
    load_weights(out)
    del out.metadata_props[:]
    out.metadata_props.extend(p for p in model.metadata_props if p.key != WEIGHTS_DIR_PROP)
    return out.SerializeToString(deterministic=True)


def weights_dir(path: str | os.PathLike) -> Path:
    """The folder a saved model's external data is relative to (its own folder, or the
    one :data:`WEIGHTS_DIR_PROP` names)."""
    import onnx

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
        rel = {p.key: p.value for p in model.metadata_props}.get(WEIGHTS_DIR_PROP, ".")
    except Exception:  # an unreadable file: the caller's own load reports it
        rel = "."
    return (path.parent / rel).resolve()


def session_options(path: str | os.PathLike, so=None):
    """ONNX Runtime session options that find the external data of the model file
    ``path`` (the folder :func:`weights_dir` names); ``so`` is changed and returned when
    given, else a new ``SessionOptions``."""
    import onnxruntime as ort

    so = so if so is not None else ort.SessionOptions()
    folder = weights_dir(path)
    if folder != Path(path).parent.resolve():
        so.add_session_config_entry(_ORT_FOLDER_OPTION, str(folder))
    return so
