"""The work directory's size, and what ``--keep-work minimal`` removes from it.

A finished run (its report written) no longer needs its bulky intermediates: compiled
modules, merged batch MLIR, the layers' own MLIR, the runtime's input and output files
of successful tests, the full-model run's partition modules (and the one-module run's
placed IR, IR dumps, run files and diagnostic module: all but its ``placement.json`` and
``compiled.json``), the compiled partitions of
``run --reduce``'s candidates (:func:`removable`). ``keep_work: minimal`` removes them
(:func:`clean`: rule ``aggregate_report`` before it writes the report, ``run`` before it
adds its section); ``all`` (the default) keeps everything.

Removed files are made again where they are needed, never an error:

- a compiled module (a layer's, a compile batch's, a partition's) is not part of any
  key: the job that runs it finds it missing and compiles again (``units.is_current``
  on the batch's module; ``steps.full_model`` for a partition); a test writes its run
  files anew;
- a layer's ``model.mlir`` is part of its tests' keys (its size and mtime). It is
  *restorable*: its identity and SHA-1 are recorded in ``keep_work.json`` before it is
  removed, every currency check (``units.file_identity``/``is_current``) takes
  that recorded identity for the missing file (:func:`cleaned_identity`), so nothing is
  retested because it was removed; a job that reads it imports it again
  (:func:`restore`), and when the import gives the same bytes the file gets its old
  mtime back, so its identity, and every key made from it, is unchanged.

Sizes are real disk usage (``st_blocks`` * 512), a file with several hard links counted
once.
"""

from __future__ import annotations

import fnmatch
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from .external_data import model_tensors
from .fileio import file_digest, read_json, write_json
from .layout import (
    BATCH_MLIR_FILE,
    BATCHES_DIR,
    COMPILED_FILE,
    FULL_DIR,
    LAYER_INPUTS_FILE,
    LAYER_REFERENCE_FILE,
    LAYERS_DIR,
    MLIR_FILE,
    MODEL_FILE,
    MODULE_FILE,
    MODULE_PARTITION_PREFIX,
    MODULE_SIDE_FILE,
    PARTITION_RUN_DIR,
    PARTITIONS_DIR,
    UNITS_DIR,
    VALUES_DIR,
)
from .lazy import onnx, rich_filesize
from .value_store import prune as prune_values

#: the record of what the clean-up removed, in the work directory (schema keep_work)
KEEP_WORK_FILE = "keep_work.json"
SCHEMA = "torq-gen-config/keep-work/1"
#: keep_work values: every file kept, or the finished run's intermediates removed
ALL, MINIMAL = "all", "minimal"
#: file names whose removal keeps their identity (:func:`cleaned_identity`)
RESTORABLE_NAMES = frozenset({MLIR_FILE})


def human(n: int | None) -> str:
    """``n`` bytes as a short decimal size (``3.2 MB``)."""
    return "?" if n is None else rich_filesize.decimal(int(n))


# ---- one pass over the work directory

def _scan(root: Path) -> list[tuple[tuple[str, ...], os.DirEntry]]:
    """Every regular file under ``root`` (symbolic links not followed) with its path parts
    relative to ``root``: one ``scandir`` pass (a 1,000-layer work directory has ~20,000 files)."""
    found: list[tuple[tuple[str, ...], os.DirEntry]] = []
    stack: list[tuple[str, tuple[str, ...]]] = [(str(root), ())]
    while stack:
        path, parts = stack.pop()
        try:
            with os.scandir(path) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append((e.path, (*parts, e.name)))
                    elif e.is_file(follow_symlinks=False):
                        found.append(((*parts, e.name), e))
        except OSError:  # gone or unreadable meanwhile
            continue
    return found


def _usage(entries: Iterable[tuple[tuple[str, ...], os.DirEntry]]) -> tuple[int, int]:
    seen: set[tuple[int, int]] = set()
    total = files = 0
    for _, e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            files += 1
    return total, files


def disk_usage(root: str | os.PathLike) -> tuple[int, int]:
    """``(bytes, files)`` of the regular files under ``root``: disk usage
    (``st_blocks`` * 512), each inode once (hard links)."""
    return _usage(_scan(Path(root)))


def freed_by(paths: Iterable[str | os.PathLike]) -> int:
    """The disk space removing ``paths`` gives back: the blocks of each inode all of
    whose links are among ``paths`` (a file also linked elsewhere frees nothing)."""
    links: dict[tuple[int, int], list] = {}
    for p in paths:
        try:
            st = os.stat(p, follow_symlinks=False)
        except OSError:
            continue
        entry = links.setdefault((st.st_dev, st.st_ino), [st, set()])
        entry[1].add(os.path.abspath(p))
    return sum(st.st_blocks * 512 for st, names in links.values() if len(names) >= st.st_nlink)


# ---- what minimal removes

#: the files a layer's run reads and writes beside its result (the runtime's inputs and outputs)
RUN_IO = ("in_*.npy", "out_*.npy", "in_*.bin", "out_*.bin", "bench_in_*.npy", "bench_in_*.bin")
#: folders of those files of a backend that keeps them apart (torq: inputs/input_<i>.bin, outputs/output_<i>.bin)
RUN_IO_DIRS = ("inputs", "outputs")


def remove_run_files(directory: str | os.PathLike) -> int:
    """Remove the runtime's input and output files of a finished layer test from its folder
    (:data:`RUN_IO`, and the ``.bin`` files of :data:`RUN_IO_DIRS`): the test compared the
    outputs in memory and keeps what it needs (its verdict, ``outputs.npz`` where it is not a
    success). Returns the number of files removed."""
    d = Path(directory)
    removed = 0
    for pattern in RUN_IO:
        for p in d.glob(pattern):
            p.unlink(missing_ok=True)
            removed += 1
    for sub in RUN_IO_DIRS:
        for p in (d / sub).glob("*.bin"):
            p.unlink(missing_ok=True)
            removed += 1
        try:
            (d / sub).rmdir()
        except OSError:  # absent, or something else is there
            pass
    return removed


def _successes(work: Path) -> set[tuple[str, str]]:
    """The (layer slug, executor) pairs whose verdict is ``success``, from the units'
    records (``units/<unit>/<executor>.json``: one read per unit, not per layer)."""
    found: set[tuple[str, str]] = set()
    for rec_path in sorted((work / UNITS_DIR).glob("*/*.json")):
        if rec_path.name == "prepared.json":
            continue
        try:
            rec = read_json(rec_path, "unit record")
            found.update((m["slug"], rec["executor"]) for m in rec["members"] if m.get("status") == "success")
        except Exception:  # noqa: BLE001 - unreadable: its layers' files are kept
            continue
    return found


def _compiled_artifact(pdir: Path) -> tuple[str | None, str | None]:
    """``(status, artifact path)`` of a partition's ``compiled.json`` (Nones if unreadable)."""
    try:
        c = read_json(pdir / COMPILED_FILE, "compiled partition")
        return c.get("status"), ((c.get("artifact") or {}).get("path"))
    except Exception:  # noqa: BLE001 - kept as it is
        return None, None


def _own_module(pdir: Path) -> bool:
    """Whether the full-model partition in ``pdir`` was compiled alone, into its own module."""
    status, artifact = _compiled_artifact(pdir)
    return status == "ok" and bool(artifact) and Path(artifact).name == MODULE_FILE \
        and Path(artifact).parent.name == pdir.name


def _select(work: Path, entries: list[tuple[tuple[str, ...], os.DirEntry]]) -> list[Path]:
    """:func:`removable` among the scanned ``entries`` of ``work``."""
    out: list[Path] = []
    success = _successes(work)
    partitions: dict[str, list[Path]] = {}  # full run, by partition: checked once each below
    reduce_parts: dict[str, list[Path]] = {}
    for parts, e in entries:
        n, name = len(parts), parts[-1]
        if parts[0] == BATCHES_DIR and n == 4 and (name == BATCH_MLIR_FILE or name.endswith(".vmfb")):
            out.append(Path(e.path))
        elif parts[0] == LAYERS_DIR and n == 3 and name == MLIR_FILE:
            if e.stat(follow_symlinks=False).st_size > 0:  # an import that failed left it empty
                out.append(Path(e.path))
        elif parts[0] == LAYERS_DIR and n == 4 and (name.endswith(".vmfb") or (
                (parts[1], parts[2]) in success and any(fnmatch.fnmatchcase(name, p) for p in RUN_IO))):
            out.append(Path(e.path))
        elif parts[:2] == (FULL_DIR, BATCHES_DIR) and n == 5 and name == BATCH_MLIR_FILE:
            out.append(Path(e.path))
        elif parts[:2] == (FULL_DIR, PARTITIONS_DIR) and n == 4 and name in (MODULE_FILE, MLIR_FILE):
            partitions.setdefault(parts[2], []).append(Path(e.path))
        elif parts[:2] == (FULL_DIR, PARTITIONS_DIR) and n == 5 and parts[3] == PARTITION_RUN_DIR \
                and any(fnmatch.fnmatchcase(name, p) for p in RUN_IO):  # the run's copies of activations
            out.append(Path(e.path))
        elif parts[:2] == (FULL_DIR, PARTITIONS_DIR) and n >= 4 and parts[2].startswith(MODULE_PARTITION_PREFIX) \
                and name not in (MODULE_SIDE_FILE, COMPILED_FILE):  # placed.mlir (weights), IR dumps, run files
            partitions.setdefault(parts[2], []).append(Path(e.path))
        elif parts[:3] == ("full", "reduce", "partitions") and n >= 5:
            reduce_parts.setdefault(parts[3], []).append(Path(e.path))
        elif parts[:3] == ("full", "reduce", "candidates") and n == 5 and name == MODEL_FILE:
            out.append(Path(e.path))
    for pid, paths in partitions.items():
        pdir = work / "full" / "partitions" / pid
        if (pdir / MODULE_FILE).is_file() and _own_module(pdir):
            out.extend(paths)
    for pid, paths in reduce_parts.items():
        if _compiled_artifact(work / "full" / "reduce" / "partitions" / pid)[0] == "ok":
            out.extend(paths)
    return sorted(out)


def removable(work: str | os.PathLike) -> list[Path]:
    """The files of work directory ``work`` that ``keep_work: minimal`` removes, all
    made again where needed (module docstring):

    - ``batches/<executor>/<batch>/``: ``batch.mlir``, ``*.vmfb``;
    - ``layers/<slug>/model.mlir`` of a layer imported without error (not empty;
      restorable), ``layers/<slug>/<executor>/*.vmfb`` (a layer compiled alone) and, for
      a ``success`` verdict, the run's input and output files there (:data:`RUN_IO`;
      nothing reads them after the test; a difference's or error's stay, to look at or
      rerun);
    - ``full/batches/<executor>/<batch>/batch.mlir`` (the batch's ``module.vmfb`` is a
      Snakemake ``temp()`` output: Snakemake removes it once ``run_full_model`` is done);
    - ``full/partitions/<pid>/``: ``module.vmfb`` and ``model.mlir`` of a partition
      compiled alone (its ``compiled.json`` names that module; the full-model run
      compiles it again if it runs again), and the runtime's input and output files in its
      ``run/`` (:data:`RUN_IO`: the run compared them in memory);
    - ``full/reduce/partitions/<pid>/`` of a candidate partition compiled without error
      (the whole folder: the reduction compiles it again if a new candidate needs it;
      a failing one stays, its MLIR is the reproducer's) and
      ``full/reduce/candidates/<key>/model.onnx``.

    Never results, references, inputs, manifests, the layers' ONNX models, weights,
    the report inputs, logs, the user's choices or Snakemake's declared outputs.
    """
    w = Path(work)
    return _select(w, _scan(w))


# ---- the record of removed files

def _record_path(work: Path) -> Path:
    return work / KEEP_WORK_FILE


def read_record(work: str | os.PathLike) -> dict:
    """``keep_work.json`` of ``work`` (an empty record when there is none or it cannot be read)."""
    try:
        rec = read_json(_record_path(Path(work)), "keep-work record")
        if isinstance(rec, dict) and isinstance(rec.get("restorable"), dict):
            return rec
    except Exception:  # noqa: BLE001 - a damaged record: as if nothing was removed
        pass
    return {"schema": SCHEMA, "restorable": {}, "last": None, "total": {"files": 0, "bytes": 0}}


def clean(work: str | os.PathLike) -> dict:
    """Remove :func:`removable` from ``work``. The identity of each restorable file
    (``[size, mtime_ns, sha1]``) goes to ``keep_work.json`` before the file is removed.
    Call it only while no job of this work directory runs (the run lock's holder, at
    the end of a run).

    Returns:
        ``{"files": removed, "bytes": disk space freed}``.
    """
    w = Path(work)
    paths = removable(w)
    if not paths:
        return {"files": 0, "bytes": 0}
    freed = freed_by(paths)
    rec = read_record(w)
    restorable = rec["restorable"]
    for p in paths:
        rel = p.relative_to(w)
        if p.name in RESTORABLE_NAMES and rel.parts[0] == LAYERS_DIR:  # a layer's MLIR (keys name it)
            st = p.stat()
            restorable[rel.as_posix()] = [st.st_size, st.st_mtime_ns, file_digest(p, "sha1")]
    rec["schema"] = SCHEMA
    rec["last"] = {"files": len(paths), "bytes": freed, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    rec["total"] = {"files": rec["total"].get("files", 0) + len(paths), "bytes": rec["total"].get("bytes", 0) + freed}
    write_json(_record_path(w), rec)  # first: a removed restorable file always has its identity
    with _LOCK:
        _RECORDS.clear()
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    for d in sorted({p.parent for p in paths}, key=lambda d: len(d.parts), reverse=True):
        if d != w and w in d.parents:  # an emptied folder of a reduce partition
            try:
                d.rmdir()
            except OSError:
                pass
    return {"files": len(paths), "bytes": freed}


_LOCK = threading.Lock()
_RECORDS: dict[str, tuple[int, dict]] = {}


def _restorable_entry(path: str | os.PathLike) -> list | None:
    """The recorded ``[size, mtime_ns, sha1]`` of restorable ``path`` (whether it exists or
    not), from the record of the work directory above it; None when not recorded."""
    p = Path(os.path.abspath(path))
    if p.name not in RESTORABLE_NAMES:
        return None
    for work in list(p.parents)[:4]:  # layers/<slug>/model.mlir: the work directory is 2 up
        rec_path = _record_path(work)
        try:
            mtime = rec_path.stat().st_mtime_ns
        except OSError:
            continue
        key = str(rec_path)
        with _LOCK:
            cached = _RECORDS.get(key)
        if cached is None or cached[0] != mtime:
            cached = (mtime, read_record(work)["restorable"])
            with _LOCK:
                _RECORDS[key] = cached
        entry = cached[1].get(p.relative_to(work).as_posix())
        return entry if isinstance(entry, list) and len(entry) == 3 else None
    return None


def cleaned_identity(path: str | os.PathLike) -> list[int] | None:
    """For a missing file that the clean-up removed, the ``[size, mtime_ns]`` it had
    (what currency checks take for it); None otherwise."""
    if Path(path).name not in RESTORABLE_NAMES or os.path.lexists(path):
        return None
    entry = _restorable_entry(path)
    return [entry[0], entry[1]] if entry else None


def restore(path: str | os.PathLike, make: Callable[[str], None]) -> bool:
    """Make a file the clean-up removed again before it is read: ``make(tmp)`` writes
    it to a temporary path; when it has the recorded size and SHA-1 it gets the
    recorded mtime back (its identity is unchanged), else it keeps its new one (the
    jobs whose keys name it are then redone). Moved into place atomically: two jobs
    may restore the same file at once.

    Returns:
        True when ``path`` was made again (False: it exists, or was not removed by the
        clean-up).
    """
    if os.path.lexists(path):
        return False
    entry = _restorable_entry(path)
    if entry is None:
        return False
    p = Path(path)
    tmp = p.with_name(f".{p.name}.restore-{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        make(str(tmp))
        if tmp.stat().st_size == entry[0] and file_digest(tmp, "sha1") == entry[2]:
            os.utime(tmp, ns=(time.time_ns(), entry[1]))
        os.replace(tmp, p)
    except BaseException:  # not made again: from now on it is simply missing (its job redoes it)
        forget(p)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return True


def forget(path: str | os.PathLike) -> None:
    """Drop ``path`` from the record of removed files: a missing file is then missing to
    every currency check (the job that made it makes it again)."""
    p = Path(os.path.abspath(path))
    for work in list(p.parents)[:4]:
        if _record_path(work).is_file():
            rec = read_record(work)
            if rec["restorable"].pop(p.relative_to(work).as_posix(), None) is not None:
                write_json(_record_path(work), rec)
                with _LOCK:
                    _RECORDS.clear()
            return


# ---- the summary line and the report's work_dir

def _model_bytes(model: str | os.PathLike) -> int | None:
    """The model file's size plus that of the external data files it names (its weights
    may be there), or None when it cannot be read. Only a file under 64 MiB is parsed: a
    model with its weights outside is small."""
    try:
        size = os.stat(model).st_size
        if size > (64 << 20):
            return size
        data = Path(model).read_bytes()
        if b"\x0a\x08location" not in data:  # names no external data file
            return size

        locations = {e.value for t in model_tensors(onnx.load_from_string(data)) for e in t.external_data
                     if e.key == "location"}
        return size + sum(os.stat(Path(model).parent / loc).st_size for loc in locations)
    except Exception:  # an unreadable model or data file: the size line says what it can
        return None


def measure(work: str | os.PathLike, model: str | os.PathLike | None, *,
            output_dir: str | os.PathLike | None = None) -> dict:
    """The report's ``work_dir`` section: ``{"path"`` (relative to ``output_dir`` when
    given), ``"bytes"`` (disk usage), ``"files"``, ``"model_bytes"`` (the model file's
    size), ``"ratio"`` (bytes / model_bytes), ``"removable_bytes"`` (what ``minimal``
    would free now), and after a clean-up ``"freed_files"``, ``"freed_bytes"`` (all
    clean-ups so far: the same in a rerun that removes nothing)``}``."""
    w = Path(work)
    entries = _scan(w)
    total, files = _usage(entries)
    model_bytes = _model_bytes(model) if model else None
    path = os.path.relpath(w, output_dir) if output_dir else str(w)
    sec = {"path": Path(path).as_posix(), "bytes": total, "files": files, "model_bytes": model_bytes,
           "ratio": round(total / model_bytes, 2) if model_bytes else None,
           "removable_bytes": freed_by(_select(w, entries))}
    total = read_record(w)["total"] if _record_path(w).is_file() else {}
    if total.get("files"):
        sec.update(freed_files=total["files"], freed_bytes=total.get("bytes", 0))
    return sec


def finish(work: str | os.PathLike, keep_work: str, model: str | os.PathLike | None, *,
           output_dir: str | os.PathLike | None = None, echo: Callable[[str], None] | None = None) -> dict:
    """At the end of a finished run: the values no layer record refers to any more removed
    from the value store (:func:`~torq_gen_config.core.value_store.prune`: a layer whose
    inputs changed left its old ones), with ``keep_work`` ``minimal`` :func:`clean` (one
    line to ``echo`` when something was removed), then :func:`measure`."""
    records = [p for d in (Path(work) / LAYERS_DIR).glob("*") for p in (d / LAYER_INPUTS_FILE, d / LAYER_REFERENCE_FILE)]
    prune_values(Path(work) / VALUES_DIR, records)
    if keep_work == MINIMAL and Path(work).is_dir():
        removed = clean(work)
        if removed["files"] and echo:
            echo(f"--keep-work minimal: removed {removed['files']} file(s), {human(removed['bytes'])}, from {work}")
    return measure(work, model, output_dir=output_dir)


def recorded_line(sec: dict) -> str:
    """The report's ``work_dir`` section as one line (``view``): its size when the report
    was written, and what that run's clean-up freed or ``minimal`` would have freed."""
    text = f"Work directory: {sec.get('path')}, {human(sec.get('bytes'))}"
    if sec.get("model_bytes") and sec.get("ratio") is not None:
        text += f" ({sec['ratio']:.1f}x the model's {human(sec['model_bytes'])})"
    if sec.get("freed_files"):
        text += f"; --keep-work minimal freed {human(sec.get('freed_bytes'))} ({sec['freed_files']} files)"
    if sec.get("removable_bytes"):
        text += f"; --keep-work minimal would free {human(sec['removable_bytes'])}"
    return text + " (when the report was written)"


def size_line(sec: dict, work: str | os.PathLike, keep_work: str) -> str:
    """``Work directory: <work>, 49.1 MB (15.6x the model's 3.2 MB); --keep-work minimal
    would free 30.1 MB`` (after a clean-up: what the last one freed)."""
    text = f"Work directory: {work}, {human(sec['bytes'])}"
    if sec.get("model_bytes"):
        text += f" ({sec['ratio']:.1f}x the model's {human(sec['model_bytes'])})"
    if keep_work == MINIMAL:
        last = read_record(work).get("last") or {}
        if last.get("files"):
            # the last clean-up's, which may be an earlier run's (a rerun that changed nothing removes nothing)
            text += (f"; --keep-work minimal freed {human(last['bytes'])} ({last['files']} files, its last clean-up: "
                     f"{last['at']})")
        if sec.get("removable_bytes"):
            text += f"; {human(sec['removable_bytes'])} more removable"
    elif sec.get("removable_bytes"):
        text += f"; --keep-work minimal would free {human(sec['removable_bytes'])}"
    return text
