"""Atomic file writes and JSON helpers.

Every result file of the workflow is written through these functions: the data
goes to a temporary file in the same directory, is flushed and fsync'ed, then
renamed over the target with :func:`os.replace` (atomic on POSIX). A reader (or a
rerun after a kill) sees either the old file or the complete new one, never a
partial write.
"""

from __future__ import annotations

import filecmp
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from .errors import DamagedWorkFile, ReportError
from .isolation import check_running
from .lazy import ml_dtypes, np, zipfile

# Files get the usual permissions (0666 minus the umask), not mkstemp's 0600. Read once
# at import, in the main thread (os.umask cannot be read without setting it).
_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


def remove_temporary_files(directory: str | os.PathLike) -> int:
    """Remove the temporary files (``.<name>.<random>.tmp``) that writers killed in the
    middle of an atomic write left under ``directory``. Only call it while holding the
    run lock of what the directory belongs to (no writer of it is alive then).

    Returns:
        The number of files removed.
    """
    removed = 0
    for p in Path(directory).rglob(".*.tmp"):
        try:
            if p.is_file():
                p.unlink()
                removed += 1
        except OSError:
            pass
    return removed


def _refuse_while_stopping(path) -> None:
    """No result is written once the run is stopping (Ctrl-C, SIGTERM): a tool or worker
    the stop killed would otherwise be recorded as a crash of the layer, and the resumed
    run would keep that made-up verdict."""
    check_running(f"writing {Path(path).name}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, creating parent directories.

    Raises:
        OSError: the directory cannot be created or written.
        RunStopped: the run is stopping (nothing is written).
    """
    _refuse_while_stopping(path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_files(files: Mapping[str | os.PathLike, bytes | Iterable[bytes]], *,
                       keep_unchanged: bool = False) -> None:
    """Write several files so that a failure leaves all of them as they were: every
    temporary file is written and synced first (a full disk or a read-only directory
    fails here, before any file is replaced), then each is renamed into place.

    A file's content is bytes, or an iterable of bytes chunks written one after the other
    (a large file is then never held whole in memory: :func:`json_chunks`).
    ``keep_unchanged``: a file whose new bytes equal what is on disk is left untouched,
    its mtime too (so Snakemake reruns nothing that consumes it).

    Raises:
        OSError: a directory cannot be created or written (no file was replaced).
        RunStopped: the run is stopping (nothing is written).
    """
    for path in files:
        _refuse_while_stopping(path)
    staged = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                if isinstance(data, (bytes, bytearray)):
                    f.write(data)
                else:
                    for chunk in data:
                        f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, _FILE_MODE)
        for tmp, path in staged:
            if keep_unchanged and _same_bytes(tmp, path):
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


def _same_bytes(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.getsize(a) == os.path.getsize(b) and filecmp.cmp(a, b, shallow=False)
    except FileNotFoundError:
        return False


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically. See :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def json_bytes(data: Any, *, compact: bool = False) -> bytes:
    """The bytes :func:`write_json` writes for ``data`` (indented JSON, keys in
    insertion order, UTF-8; ``compact``: on one line, no spaces), e.g. for
    :func:`write_bytes_if_changed`."""
    if compact:
        return (json.dumps(data, separators=(",", ":"), allow_nan=False, default=_json_default) + "\n").encode("utf-8")
    return (json.dumps(data, indent=2, allow_nan=False, default=_json_default) + "\n").encode("utf-8")


def json_chunks(data: Mapping[str, Any], *, one_line: str) -> Iterator[bytes]:
    """The JSON of ``data`` as :func:`json_bytes` writes it, except that each entry of
    the mapping ``data[one_line]`` is on one line of its own (compact, made by the C
    encoder), yielded a line at a time.

    For the report JSON, whose ``ops`` are ~50 KB of indented JSON per layer: indenting
    250 MB of JSON (5,000 layers) takes Python's pure-Python encoder and about 1 GB of
    temporary strings; one op per line takes the C encoder and one op's string at a time,
    and is still read line by line (``grep '"Conv_3"'``) and by any JSON reader.
    """
    keys = list(data)
    yield b"{\n"
    for i, key in enumerate(keys):
        tail = ",\n" if i < len(keys) - 1 else "\n"
        value = data[key]
        if key == one_line and isinstance(value, Mapping) and value:
            yield f"  {json.dumps(key)}: {{\n".encode("utf-8")
            last = len(value) - 1
            for j, (k, v) in enumerate(value.items()):
                line = json.dumps(v, allow_nan=False, default=_json_default)
                yield f"    {json.dumps(k)}: {line}{',' if j < last else ''}\n".encode("utf-8")
            yield f"  }}{tail}".encode("utf-8")
        else:
            text = json.dumps(value, indent=2, allow_nan=False, default=_json_default).replace("\n", "\n  ")
            yield f"  {json.dumps(key)}: {text}{tail}".encode("utf-8")
    yield b"}\n"


def write_json(path: str | os.PathLike, data: Any, *, compact: bool = False) -> None:
    """Write ``data`` as indented JSON (keys in insertion order) atomically; ``compact``:
    on one line (the per-layer records: a 1,000-layer model has thousands of them)."""
    atomic_write_bytes(path, json_bytes(data, compact=compact))


def write_bytes_if_changed(path: str | os.PathLike, data: bytes) -> bool:
    """Write ``data`` atomically unless ``path`` already holds exactly these bytes.

    Keeping an unchanged file untouched keeps its mtime, so Snakemake does not
    rerun the jobs that consume it (files over 1 MB are compared by mtime only).

    Returns:
        True when the file was (re)written, False when it was already up to date.
    """
    path = Path(path)
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    atomic_write_bytes(path, data)
    return True


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes (``hashlib.file_digest``: read in blocks, not into memory).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def file_fingerprint(path: str | os.PathLike) -> dict:
    """Identity of a file: ``{"path" (absolute), "size" (bytes), "mtime_ns"}`` (None
    values when it does not exist). Used as a rule param: the workflow's rerun
    triggers do not include input-file sets, so pointing a setting at another file
    (even an older one) must change a param."""
    p = Path(path).resolve()
    try:
        st = p.stat()
    except OSError:
        return {"path": str(p), "size": None, "mtime_ns": None}
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """Read a JSON file with a one-line error for the user.

    Raises:
        ReportError: the file is missing, a directory, not UTF-8 text, not valid JSON, or
            nested too deeply for the parser.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ReportError(f"{what} {path} is a directory, not a file") from None
    except UnicodeDecodeError as e:
        raise ReportError(f"{what} {path} is not a UTF-8 text file (byte {e.start}: {e.reason}); "
                          "is it a JSON file?") from None
    except OSError as e:
        raise ReportError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f"{what} {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise ReportError(f"{what} {path} is nested too deeply to be read") from None


def _json_default(obj: Any) -> Any:
    """Convert numpy scalars and paths for :func:`json.dumps`."""
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def save_npz(path: str | os.PathLike, arrays: dict[str, "np.ndarray"], meta: dict,  # noqa: F821
             *, only_if_changed: bool = False) -> bool:
    """Write arrays plus a JSON ``__meta__`` entry to an ``.npz`` atomically.

    Arrays of the ml_dtypes types (bfloat16, float8 variants, int4, ...), which
    ``numpy.savez`` would store as raw ``|V`` bytes, are stored as unsigned-integer
    views of their bits and listed in ``meta["ml_dtypes_keys"]`` (name -> dtype name;
    bfloat16 ones also in ``meta["bf16_keys"]``, read by older versions) so that
    :func:`load_npz` restores them; string arrays are stored as numpy unicode arrays
    (no pickle). The bytes are a function of the arrays and ``meta`` (``numpy.savez``
    writes fixed zip dates), so with ``only_if_changed`` an unchanged file keeps its
    mtime (nothing downstream reruns).

    Returns:
        True when the file was written.
    """

    meta = dict(meta)
    special: dict[str, str] = {}
    store = {}
    for k, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.type.__module__.startswith("ml_dtypes"):  # bfloat16, float8_*, int4, ...
            special[k] = a.dtype.name
            a = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])
        elif a.dtype.kind == "O":  # strings (ONNX Runtime returns str objects)
            a = a.astype(str)
        store[k] = a
    meta["bf16_keys"] = [k for k, d in special.items() if d == "bfloat16"]
    meta["ml_dtypes_keys"] = special
    store["__meta__"] = np.array(json.dumps(meta))
    buf = io.BytesIO()
    np.savez(buf, **store)
    if only_if_changed:

        return write_bytes_if_changed(path, buf.getvalue())
    atomic_write_bytes(path, buf.getvalue())
    return True


def damaged_work_file(path: str | os.PathLike, error: Exception, redo: str = "make it anew") -> DamagedWorkFile:
    """Remove the work file ``path`` that could not be read (``error``), so that the next
    run makes it again, and return the error to raise: one line naming the file and what
    the next run does (``redo``). The one wording of a damaged work file (the rules' manifest
    read and the report's result read use it too)."""
    Path(path).unlink(missing_ok=True)
    return DamagedWorkFile(f"work file {path} is damaged ({type(error).__name__}: {error}); removed it: run the "
                           f"same command again to {redo}")


def load_npz(path: str | os.PathLike) -> tuple[dict[str, "np.ndarray"], dict]:  # noqa: F821
    """Read a file written by :func:`save_npz`: ``(arrays, meta)``, ml_dtypes arrays
    restored (files written before ``ml_dtypes_keys`` existed: their ``bf16_keys``).

    Raises:
        FileNotFoundError: no such file.
        DamagedWorkFile: the file exists but is not a complete archive of :func:`save_npz`
            (cut short, overwritten): it is removed, so that the next run writes it again.
    """
    try:
        with np.load(Path(path), allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, EOFError, KeyError, ValueError, OSError) as e:
        raise damaged_work_file(path, e) from None
    special = meta.get("ml_dtypes_keys") or {k: "bfloat16" for k in meta.get("bf16_keys") or []}
    if special:
        for k, name in special.items():
            arrays[k] = arrays[k].view(getattr(ml_dtypes, name))
    return arrays, meta
