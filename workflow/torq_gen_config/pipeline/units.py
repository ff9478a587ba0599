"""The unit of work: a group of consecutive tested layers that one Snakemake job
prepares (rule ``prepare_unit``: quantize, reference, MLIR import of each member) or
tests on one executor (rule ``test_unit``: its compile batches, then each member's
compile, run and compare), each layer still writing its own files.

Why groups (docs/scale.md): a job per (layer, step) made a 936-layer model about
5,000 Snakemake jobs; Snakemake's cost per job (DAG building, metadata, scheduling,
a job start on a cluster node) then dominated the no-op and the cluster runs. A unit
holds :func:`unit_size` layers (about 32, a whole number of compile batches), so a
5,000-layer model is a few hundred jobs.

Reruns stay per layer. Snakemake reruns a unit job when one of its inputs, params or
rules changed; inside it, each per-layer output has a key (:func:`make_key` of the
settings it was made with and of the identity, size and mtime, of the files it was made
from, then the identity of the output itself), and a member whose key still matches keeps
its files. A unit job keeps its members' keys in one :class:`KeyFile` beside its record
(``units/<unit>/prepared.keys.json``, ``units/<unit>/<executor>.keys.json``: a file per
output would be thousands of 4 KB blocks); other outputs (a compile batch's) keep theirs
in a file beside them (``<output>.key``). So a changed layer recomputes only itself, a job
killed half-way resumes with the members it finished, and a membership change (a
layer added) retests nobody else.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from ..core.fileio import atomic_write_text
from ..core.keep_work import cleaned_identity

#: layers per unit, rounded up to a whole number of compile batches (:func:`unit_size`)
UNIT_LAYERS = 32
#: work/<model>/units/<unit id>/: the units' own records (prepared.json, <executor>.json)
PREPARED_FILE = "prepared.json"
#: suffix of the key file beside a per-layer output (:func:`record_key`)
KEY_SUFFIX = ".key"
#: the format of a unit job's key file (:class:`KeyFile`)
KEYS_SCHEMA = "torq-gen-config/unit-keys/1"


def unit_size(compile_batch: int) -> int:
    """Layers per unit for ``compile_batch`` layers per compile batch: about
    :data:`UNIT_LAYERS`, a multiple of ``compile_batch`` so that a batch never spans
    two units (32 -> 32, 1 -> 32, 5 -> 35, 64 -> 64).

    Raises:
        ValueError: ``compile_batch`` < 1.
    """
    if compile_batch < 1:
        raise ValueError(f"compile_batch must be >= 1, got {compile_batch}")
    return compile_batch * max(1, math.ceil(UNIT_LAYERS / compile_batch))


def plan_units(slugs: list[str], compile_batch: int) -> list[dict]:
    """The tested layers (``slugs``, manifest order) cut into units of
    :func:`unit_size` layers: ``[{"id": "<index:04d>", "members": [slug, ...]}]``.
    The id is a slot: another membership keeps the id, and the unit job reruns by
    its ``members`` param (its members' keys keep what did not change)."""
    size = unit_size(compile_batch)
    return [{"id": f"{k // size:04d}", "members": list(slugs[k:k + size])} for k in range(0, len(slugs), size)]


def file_identity(path: str | os.PathLike | None) -> list[int] | None:
    """``[size (bytes), mtime_ns]`` of ``path``, or None when there is none. A file that
    ``--keep-work minimal`` removed and recorded as restorable keeps the identity it had
    (:func:`~torq_gen_config.core.keep_work.cleaned_identity`): its removal redoes nothing."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return cleaned_identity(path)
    return [st.st_size, st.st_mtime_ns]


def make_key(settings: Any, files: Iterable[str | os.PathLike | None]) -> str:
    """sha256 (hex) of ``settings`` (JSON data, keys sorted) and of the identity of
    each of ``files`` (:func:`file_identity`, in order): what a per-layer output was
    made from."""
    text = json.dumps({"settings": settings, "files": [[str(f), file_identity(f)] for f in files]},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class KeyFile:
    """The keys of the per-layer outputs of one unit job, in one JSON file (``{"schema",
    "keys": {output path, relative to the file's folder: "<key> <identity>"}}``), rewritten
    atomically after each output is recorded. One writer per file: the unit job (or a re-target of one of
    its layers, which Snakemake does not run beside it).

    A layer that moved to another unit (a layer added or removed before it) finds its key
    in the file of the same name of the unit it was in (``units/*/<name>``, read once when
    a key is not in this file): a key is valid wherever it is, since it names the identity
    of the output it was recorded for, so such a layer is not tested again."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._keys: dict[str, str] | None = None
        self._others: dict[str, str] | None = None

    @staticmethod
    def _read(path: Path) -> dict[str, str]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))["keys"]
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or damaged: its members are made again
            return {}
        return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}

    def _load(self) -> dict[str, str]:
        if self._keys is None:
            self._keys = self._read(self.path)
        return self._keys

    def _name(self, output: str | os.PathLike) -> str:
        # the same name in every unit's file (the unit folders are siblings)
        return os.path.relpath(os.path.abspath(output), os.path.abspath(self.path.parent))

    def recorded(self, output: str | os.PathLike) -> list[str] | None:
        """``[key, identity]`` recorded for ``output`` (here, else in another unit's file), or None."""
        name = self._name(output)
        entry = self._load().get(name)
        if entry is None:
            if self._others is None:
                self._others = {}
                for other in sorted(self.path.parent.parent.glob(f"*/{self.path.name}")):
                    if other.parent != self.path.parent:
                        self._others.update(self._read(other))
            entry = self._others.get(name)
        return entry.split() if entry else None

    def record(self, output: str | os.PathLike, line: str) -> None:
        """Record ``line`` (``"<key> <identity>"``) for ``output`` and write the file."""
        self._load()[self._name(output)] = line
        self._save()

    def drop(self, output: str | os.PathLike) -> None:
        """Forget ``output``'s key (it is being made again) and write the file."""
        if self._load().pop(self._name(output), None) is not None:
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps({"schema": KEYS_SCHEMA, "keys": self._keys}, indent=0,
                                                sort_keys=True) + "\n")


def _recorded(output: str | os.PathLike, keys: KeyFile | None) -> list[str] | None:
    """``[key, identity]`` of ``output`` from ``keys``, else from its key file beside it."""
    if keys is not None:
        return keys.recorded(output)
    try:
        with open(f"{output}{KEY_SUFFIX}") as f:
            return f.read().split()
    except OSError:
        return None


def is_current(output: str | os.PathLike, key: str, *others: str | os.PathLike, keys: KeyFile | None = None) -> bool:
    """Whether ``output`` (and the ``others`` written with it) exist, its recorded key
    (in ``keys``, else its key file) is ``key`` (it was made from what ``key`` describes)
    and ``output`` is still the file the key was recorded for (same content up to
    :data:`CONTENT_ID_BYTES`, else same size and mtime: one edited, damaged or replaced
    outside the workflow is made again)."""
    if not all(os.path.exists(p) or cleaned_identity(p) is not None for p in (output, *others)):
        return False
    recorded = _recorded(output, keys)
    if recorded is None:
        return False
    return recorded[:1] == [key] and recorded[1:] == [_identity_text(output)]


def changed_outside(output: str | os.PathLike, keys: KeyFile | None = None) -> str | None:
    """``"deleted"`` or ``"changed"`` when ``output`` is no longer the file its key was
    recorded for (edited, damaged or removed outside the job that made it), else None
    (no key: never finished, or still the same file)."""
    recorded = _recorded(output, keys)
    if recorded is None or len(recorded) < 2:
        return None
    now = _identity_text(output)
    if recorded[1] == now:
        return None
    return "deleted" if now == "missing" else "changed"


#: outputs up to this size are identified by their content in a key file, larger ones by
#: size and mtime (Snakemake touches a job's declared outputs after it: a re-targeted
#: result.json must still match the key its job recorded)
CONTENT_ID_BYTES = 4 * 1024 * 1024


def _identity_text(path: str | os.PathLike) -> str:
    """``size:sha1`` of a small file, ``size:mtime_ns`` of a large one, ``missing``."""
    ident = file_identity(path)
    if ident is None:
        return "missing"
    if ident[0] <= CONTENT_ID_BYTES:
        with open(path, "rb") as f:
            return f"{ident[0]}:sha1-{hashlib.sha1(f.read()).hexdigest()}"
    return f"{ident[0]}:{ident[1]}"


def record_key(output: str | os.PathLike, key: str, keys: KeyFile | None = None) -> None:
    """Record the key of ``output`` with the identity of ``output`` as it is now, in
    ``keys`` or its key file (atomically, after ``output`` itself: an output whose job was
    killed before this has no key and is made again)."""
    line = f"{key} {_identity_text(output)}"
    if keys is not None:
        keys.record(output, line)
    else:
        atomic_write_text(f"{output}{KEY_SUFFIX}", line + "\n")


def drop_key(output: str | os.PathLike, keys: KeyFile | None = None) -> None:
    """Forget the key of ``output`` (it is being made again)."""
    if keys is not None:
        keys.drop(output)
        return
    try:
        os.unlink(f"{output}{KEY_SUFFIX}")
    except FileNotFoundError:
        pass


def unit_key_file(unit_record: str | os.PathLike | None, job: str) -> KeyFile | None:
    """The :class:`KeyFile` of a unit job (``job``: ``prepared`` or the executor's name),
    beside the unit's record ``unit_record`` (``units/<unit>/<anything>.json``); None
    without a record (keys then beside each output)."""
    if not unit_record:
        return None
    return KeyFile(Path(unit_record).parent / f"{job}.keys.json")


def newer_than(paths: Iterable[str | os.PathLike], output: str | os.PathLike) -> bool:
    """Whether one of ``paths`` was modified after ``output`` (a missing output counts
    as older): make's rule, for inputs whose changes must redo ``output``."""
    out = file_identity(output)
    if out is None:
        return True
    return any((ident := file_identity(p)) is not None and ident[1] > out[1] for p in paths)
