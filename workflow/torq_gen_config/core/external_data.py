"""ONNX external data as this tool uses it: models whose large tensors are in the
weight store (:mod:`torq_gen_config.core.weight_store`) or in another file.

A model cut from the prepared one (a layer, a partition, a reduction candidate) keeps
its tensors' ``location`` relative to the store's folder and records that folder,
relative to its own file, in the metadata property :data:`WEIGHTS_DIR_PROP` (ONNX and
ONNX Runtime refuse ``..`` in a location and links that leave the model's folder, and
onnx refuses hard links: measured with onnx 1.23 and ONNX Runtime 1.32).

In memory, a model read with :func:`load_model` ``(weights=False)`` holds its external
tensors with *absolute* locations, so that any step can read a tensor's values
(:func:`tensor_array`, :func:`stored_bytes`) without knowing where the model came from;
:func:`save_model` makes them relative again. Such a model is never handed to ONNX
Runtime as it is (absolute locations are refused): sessions are made from saved files
with :func:`session_options` (:func:`open_session`, which also takes a model whose fixed
dims ONNX Runtime refuses: :func:`free_dims`), or from models whose tensors were read in
(:func:`load_weights`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

from .fileio import atomic_write_bytes, write_bytes_if_changed
from .limits import NOTE_CHARS
from .lazy import np, numpy_helper, onnx, ort

#: Metadata property of a model whose store is not in the model's own folder: the store's
#: folder relative to the model file's folder (e.g. ``../..`` for a layer model).
WEIGHTS_DIR_PROP = "torq_gen_config.weights_dir"
#: The ONNX Runtime session option that names the folder external data is relative to.
ORT_FOLDER_OPTION = "session.model_external_initializers_file_folder_path"


def _node_tensors(nodes) -> Iterator[Any]:
    """Every TensorProto in the attributes of ``nodes`` (``Constant`` values, tensor
    attributes) and in their subgraphs (If branches, Loop/Scan bodies, nested)."""
    for node in nodes:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _graph_tensors(a.g)
            for g in a.graphs:
                yield from _graph_tensors(g)


def _graph_tensors(graph) -> Iterator[Any]:
    """Every TensorProto of ``graph``: initializers, tensor attributes (``Constant``
    values), and those of nested subgraphs."""
    yield from graph.initializer
    yield from _node_tensors(graph.node)


def model_tensors(model) -> Iterator[Any]:
    """Every TensorProto of ``model``: the initializers and tensor attributes of the main
    graph, of every subgraph at any depth (If, Loop, Scan) and of the model's local
    functions. Whatever moves tensors to or from external data walks this, so that no
    tensor of a subgraph is left behind."""
    yield from _graph_tensors(model.graph)
    for f in model.functions:
        yield from _node_tensors(f.node)


def is_external(tensor) -> bool:
    """True when ``tensor``'s values are in an external file."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def external_entries(tensor) -> dict[str, str]:
    """The ``external_data`` entries of ``tensor`` as a dict (``location``, ``offset``, ...)."""
    return {e.key: e.value for e in tensor.external_data}


def set_external_entries(tensor, entries: dict[str, str]) -> None:
    """Make ``tensor`` external with these ``external_data`` entries (in place)."""
    del tensor.external_data[:]
    for k, v in entries.items():
        e = tensor.external_data.add()
        e.key, e.value = k, str(v)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def resolve_locations(model, model_dir: str | os.PathLike) -> None:
    """Make the locations of ``model``'s external tensors absolute (in place), for a
    model whose file is (or would be) in ``model_dir``."""
    props = {p.key: p.value for p in model.metadata_props}
    base = (Path(model_dir) / props.get(WEIGHTS_DIR_PROP, ".")).resolve()
    for t in model_tensors(model):
        if is_external(t):
            entries = external_entries(t)
            loc = entries.get("location", "")
            if not os.path.isabs(loc):
                entries["location"] = str(base / loc)
                set_external_entries(t, entries)


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
    entries = external_entries(tensor)
    loc = entries.get("location", "")
    if not os.path.isabs(loc):
        raise ValueError(f"tensor {tensor.name!r}: external data location {loc!r} is not resolved "
                         "(read the model with external_data.load_model)")
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
    tensor.data_location = onnx.TensorProto.DEFAULT
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
    entries = external_entries(tensor)
    loc = entries.get("location", "")
    if not os.path.isabs(loc):
        raise ValueError(f"tensor {tensor.name!r}: external data location {loc!r} is not resolved")
    offset = int(entries.get("offset", 0))
    length = int(entries["length"]) if "length" in entries else os.path.getsize(loc) - offset
    if length == 0:
        return np.zeros(0, np.uint8)
    return np.memmap(loc, dtype=np.uint8, mode="r", offset=offset, shape=(length,))


def external_data_problem(model) -> str | None:
    """Why an external tensor of ``model`` (absolute locations) cannot be read (its file
    missing or shorter than its entry says), or None."""
    for t in model_tensors(model):
        if is_external(t):
            e = external_entries(t)
            loc = e.get("location", "")
            if not os.path.isfile(loc):
                return f"tensor {t.name!r}: {loc} not found"
            end = int(e.get("offset", 0)) + int(e.get("length", 0))
            if end > os.path.getsize(loc):
                return f"tensor {t.name!r}: {loc} has {os.path.getsize(loc)} bytes, its data ends at {end}"
    return None


def external_bytes(model) -> int:
    """Bytes of ``model``'s values that are in external files (by their ``length``)."""
    return sum(int(external_entries(t).get("length", 0)) for t in model_tensors(model) if is_external(t))


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
    try:
        out, folder = detach_locations(model)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    kept = [(p.key, p.value) for p in out.metadata_props if p.key != WEIGHTS_DIR_PROP]
    del out.metadata_props[:]
    for k, v in kept:
        out.metadata_props.add(key=k, value=v)
    if folder is not None:
        rel = os.path.relpath(folder, os.path.abspath(path.parent))
        if rel != ".":
            out.metadata_props.add(key=WEIGHTS_DIR_PROP, value=rel)
    return out.SerializeToString(deterministic=True)


def detach_locations(model) -> tuple[Any, str | None]:
    """A copy of ``model`` whose external tensors (absolute locations, one folder) name
    their files by base name, and that folder (None when no tensor is external): for an
    ONNX Runtime session made from bytes with :data:`ORT_FOLDER_OPTION` set to it.

    Raises:
        ValueError: external tensors in more than one folder.
    """
    out = type(model)()
    out.CopyFrom(model)
    folders = set()
    for t in model_tensors(out):
        if is_external(t):
            entries = external_entries(t)
            loc = entries.get("location", "")
            if os.path.isabs(loc):
                folders.add(os.path.dirname(loc))
                entries["location"] = os.path.basename(loc)
                set_external_entries(t, entries)
    if len(folders) > 1:
        raise ValueError(f"the model's external tensors are in several folders: {sorted(folders)}")
    return out, (folders.pop() if folders else None)


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
    so = so if so is not None else ort.SessionOptions()
    folder = weights_dir(path)
    if folder != Path(path).parent.resolve():
        so.add_session_config_entry(ORT_FOLDER_OPTION, str(folder))
    return so


def free_dims(model) -> Any:
    """A copy of ``model`` with the shapes the preparation fixed taken out again: every dim
    of its graph inputs symbolic (``dim_param`` ``<input>_<axis>``, the rank kept), its
    graph outputs' and every subgraph's outputs' shapes cleared, and the ``value_info`` of
    the graph and of every subgraph (If branches, Loop/Scan bodies, nested) dropped; nodes,
    weights (stored ones too) and types are unchanged. ONNX Runtime then infers the shapes
    from the ops, as it does for a model with symbolic dims.

    Why: with the dims fixed, ONNX Runtime's shape-data propagation and its optimizer's
    constant folding of ``Shape`` make shapes in an ``If`` branch that is never taken
    concrete, and its type inference then rejects the branch (``Graph attribute inferencing
    failed: ... LSTM ... First input tensor must have rank 3``) although the model runs.
    """
    out = type(model)()
    out.CopyFrom(model)
    for inp in out.graph.input:
        tt = inp.type.tensor_type
        if inp.type.HasField("tensor_type") and tt.HasField("shape"):
            for axis, d in enumerate(tt.shape.dim):
                d.Clear()
                d.dim_param = f"{inp.name}_{axis}"

    def clear(graph) -> None:
        del graph.value_info[:]
        for o in graph.output:
            if o.type.HasField("tensor_type"):
                o.type.tensor_type.ClearField("shape")
        for node in graph.node:
            for a in node.attribute:
                if a.HasField("g"):
                    clear(a.g)
                for g in a.graphs:
                    clear(g)

    clear(out.graph)
    return out


def open_session(onnx_path: str | os.PathLike, make_options: Callable[[], Any],
                 providers: list) -> tuple[Any, str | None]:
    """An ``InferenceSession`` on the model file ``onnx_path`` (its weights found in the
    store: :func:`session_options`), with the options ``make_options()`` returns and
    ``providers``. When ONNX Runtime refuses the model as it
    is, it is tried once more with its dims free (:func:`free_dims`): the preparation fixed
    the dims for the compilers, ONNX Runtime does not need them, and a model ONNX Runtime
    runs must not fail because of them.

    Returns:
        ``(session, note)``: ``note`` is None when the model was taken as it is, else one
        line saying that its dims were left symbolic and why (ONNX Runtime's first refusal).

    Raises:
        onnxruntime's exceptions: the first refusal, when the model with free dims is
            refused too (the model's own problem, not its fixed dims) or cannot be made.
    """
    try:
        return ort.InferenceSession(os.fspath(onnx_path), sess_options=session_options(onnx_path, make_options()),
                                    providers=providers), None
    except Exception as first:  # onnxruntime raises its own pybind exception types
        refusal = first
    try:
        free, folder = detach_locations(free_dims(load_model(onnx_path, weights=False)))
        so = make_options()
        if folder is not None:
            so.add_session_config_entry(ORT_FOLDER_OPTION, folder)
        session = ort.InferenceSession(free.SerializeToString(), sess_options=so, providers=providers)
    except Exception:  # refused as well: the first message is the one that says what is wrong
        raise refusal from None
    first_line = next((ln.strip() for ln in str(refusal).splitlines() if ln.strip()), type(refusal).__name__)
    return session, ("input dims left symbolic: ONNX Runtime refused the model with the dims fixed "
                     f"({first_line[:NOTE_CHARS]})")
