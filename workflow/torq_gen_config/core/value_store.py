"""The value store: every tensor value a discovery computes, on disk once, named by its digest.

Each model input a layer receives and each value the reference runs compute (a layer's
inputs from the whole-model run, both reference engines' outputs) is one ``.npy`` file in
``work/<model>/values/`` (:data:`~torq_gen_config.core.layout.VALUES_DIR`), named by the
SHA-256 of its dtype, shape and bytes. A layer's ``inputs.json`` and ``reference.json``
hold small *value references* (``{"digest", "dtype", "shape"}``) instead of arrays, so:

- a value is written once however many records refer to it: a layer's input *is* its
  producer's stored output (the same bytes, the same digest), and a reference output equal
  to the next layer's input is the same file;
- an unchanged value is not written again, and a changed one gets another name (the
  records that refer to it change, so the jobs that read them rerun);
- the tools read the files where they are: ``iree-run-module --input=@<store file>``
  (:func:`store_file_of`), ONNX Runtime and the comparison through a read-only memory map
  (:meth:`ValueStore.load`), so memory stays bounded by the values a job touches.

ml_dtypes values (bfloat16, float8, int4) are stored as the unsigned-integer view of their
bits, strings as numpy unicode arrays (no pickle); the reference's ``dtype`` restores them.
Values no record refers to any more (a layer whose inputs changed) are removed by
:func:`prune` (rule ``aggregate_report``).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import DamagedWorkFile
from .fileio import atomic_write_bytes, damaged_work_file, json_bytes, write_bytes_if_changed
from .lazy import ml_dtypes, np

#: a value reference's fields (JSON): the digest names the file ``<digest>.npy``
REF_KEYS = ("digest", "dtype", "shape")
_DIGEST_HEX = 32  # 128 bits of SHA-256: collisions are out of reach for any work directory


def _storable(a: "np.ndarray") -> tuple["np.ndarray", str]:
    """``(array as written to the .npy, dtype name to restore)``."""
    name = a.dtype.name
    if a.dtype.type.__module__.startswith("ml_dtypes"):  # bfloat16, float8_*, int4: their bits
        return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]), name
    if a.dtype.kind == "O":  # strings as ONNX Runtime returns them
        return a.astype(str), "object"
    return a, name


def value_digest(array: Any) -> str:
    """The digest naming ``array`` in the store: SHA-256 (first 128 bits, hex) of its dtype
    name, shape and C-order bytes. Equal values (same dtype, shape, bits) share it."""
    a = np.asarray(array)
    stored, dtype = _storable(a)
    stored = np.require(stored, requirements="C")  # keeps 0-d shapes
    h = hashlib.sha256(f"{dtype}|{list(stored.shape)}|".encode())
    if stored.dtype.kind == "U":
        h.update(stored.tobytes())
    elif stored.size:
        h.update(memoryview(stored.reshape(-1)).cast("B"))
    return h.hexdigest()[:_DIGEST_HEX]


class ValueStore:
    """The content-addressed values of one work directory (``root``: its ``values/`` folder).

    Writers from several jobs and processes may put the same value at once: each writes a
    temporary file and renames it into place (the same bytes either way).
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, ref: Mapping) -> Path:
        """The store file of the value reference ``ref``."""
        return self.root / f"{ref['digest']}.npy"

    def put(self, array: Any) -> dict:
        """Store ``array`` (any numpy array; ml_dtypes and string arrays too) unless a value
        with its digest is there, and return its reference ``{"digest", "dtype", "shape"}``
        (JSON-safe; ``shape`` a list of ints).

        Cost: one SHA-256 pass over the bytes (about 1 GB/s), plus one write when new.
        """
        a = np.asarray(array)
        digest = value_digest(a)
        ref = {"digest": digest, "dtype": _storable(a)[1], "shape": [int(d) for d in a.shape]}
        path = self.path(ref)
        if not path.is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            stored = np.require(_storable(a)[0], requirements="C")
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{digest}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    np.save(f, stored, allow_pickle=False)
                os.chmod(tmp, 0o644)  # as the other work files (mkstemp makes it 0600)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return ref

    def load(self, ref: Mapping, *, mmap_mode: str | None = "r") -> "np.ndarray":
        """The value of ``ref``: read-only memory-mapped (``mmap_mode`` ``"r"``, the default;
        None reads it into memory), in its recorded dtype and shape. Empty and string
        values are read into memory (nothing to map).

        Raises:
            DamagedWorkFile: the store file is gone, or does not hold the recorded dtype
                and shape (edited or cut short outside the workflow: then it is removed);
                the message names it.
        """
        path = self.path(ref)
        shape = [int(d) for d in ref["shape"]]
        dtype = ref["dtype"]
        try:
            # scalars, empty and string values are read (numpy maps a 0-d value as shape [1])
            mode = mmap_mode if (mmap_mode and dtype != "object" and shape and 0 not in shape) else None
            a = np.load(path, mmap_mode=mode, allow_pickle=False)
            if list(a.shape) != shape:
                raise ValueError(f"holds shape {list(a.shape)}, the record says {shape}")
            if dtype == "object":
                return a.astype(object)
            if a.dtype.name != dtype:
                special = getattr(ml_dtypes, dtype, None)
                if special is None or np.dtype(special).itemsize != a.dtype.itemsize:
                    raise ValueError(f"holds {a.dtype.name}, the record says {dtype}")
                a = a.view(special)
            return a
        except FileNotFoundError:
            raise DamagedWorkFile(f"work file {path} (a value of the value store) is gone") from None
        except (OSError, ValueError, EOFError) as e:
            raise damaged_work_file(path, e, redo="make the values again") from None

    def load_all(self, refs: Mapping[str, Mapping], **kwargs) -> dict:
        """``{name: value}`` for a mapping of names to references (:meth:`load`)."""
        return {name: self.load(ref, **kwargs) for name, ref in refs.items()}


def write_record(path: str | os.PathLike, record: Mapping, store: ValueStore, *, only_if_changed: bool = False) -> bool:
    """Write a JSON record holding value references into ``store`` atomically, with the
    store's folder relative to the record (``values_dir``: the work directory can move).
    With ``only_if_changed`` an unchanged record keeps its mtime (nothing downstream reruns).

    Returns:
        True when the file was written.
    """
    data = json_bytes({**record, "values_dir": os.path.relpath(store.root, Path(path).parent)}, compact=True)
    if only_if_changed:
        return write_bytes_if_changed(path, data)
    atomic_write_bytes(path, data)
    return True


def read_record(path: str | os.PathLike) -> tuple[dict, ValueStore]:
    """A record written by :func:`write_record`: ``(record, its store)``.

    Raises:
        FileNotFoundError: no such file.
        DamagedWorkFile: not a record (cut short or edited outside the workflow); it is
            removed, and the message says so.
    """
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(record, dict) or not isinstance(record.get("values_dir"), str):
            raise ValueError("no values_dir: not a record of the value store")
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:
        raise damaged_work_file(path, e) from None
    return record, ValueStore(Path(path).parent / record["values_dir"])


def store_file_of(array: Any) -> str | None:
    """The path of the ``.npy`` store file that ``array`` maps whole, or None.

    True only for a value :meth:`ValueStore.load` returned memory-mapped and unchanged
    (the array is the map of the file itself, not a view, a copy or a dtype view of it):
    a tool may then read that file in place of a copy of the array.
    """
    if not isinstance(array, np.memmap) or not isinstance(getattr(array, "base", None), mmap.mmap):
        return None
    name = getattr(array, "filename", None)
    if not name or not str(name).endswith(".npy") or not array.flags.c_contiguous:
        return None
    return str(name)


def refs_in(record: Any) -> Iterable[str]:
    """Every digest of a value reference anywhere inside a JSON record."""
    if isinstance(record, Mapping):
        if isinstance(record.get("digest"), str) and "dtype" in record and "shape" in record:
            yield record["digest"]
        for v in record.values():
            yield from refs_in(v)
    elif isinstance(record, list):
        for v in record:
            yield from refs_in(v)


def prune(root: str | os.PathLike, records: Iterable[str | os.PathLike]) -> tuple[int, int]:
    """Remove the store files under ``root`` that none of ``records`` (JSON files holding
    value references) refers to, and the temporary files of interrupted writes.

    A record that cannot be read keeps everything (nothing is removed): a damaged record
    is made again from values that may still be there.

    Returns:
        ``(files removed, bytes freed)`` (bytes as ``st_blocks * 512``).
    """
    keep: set[str] = set()
    for rec in records:
        try:
            keep.update(refs_in(json.loads(Path(rec).read_text())))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            return 0, 0
    removed = freed = 0
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return 0, 0
    for e in entries:
        digest = e.name[:-4] if e.name.endswith(".npy") else None
        if (digest is not None and digest not in keep) or e.name.endswith(".tmp"):
            try:
                freed += e.stat().st_blocks * 512
                os.unlink(e.path)
                removed += 1
            except OSError:
                continue
    return removed, freed
