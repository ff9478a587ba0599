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
rules changed; inside it, each per-layer output has a key file beside it
(``<output>.key``: :func:`make_key` of the settings it was made with and of the
identity, size and mtime, of the files it was made from, then the identity of the
output itself), and a member whose key still matches keeps its files. So a changed layer recomputes only itself, a job
killed half-way resumes with the members it finished, and a membership change (a
layer added) retests nobody else.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Iterable

from ...core.fileio import atomic_write_text
from ...core.keep_work import cleaned_identity

#: layers per unit, rounded up to a whole number of compile batches (:func:`unit_size`)
UNIT_LAYERS = 32
#: work/<model>/units/<unit id>/: the units' own records (prepared.json, <executor>.json)
PREPARED_FILE = "prepared.json"
#: suffix of the key file beside a per-layer output (:func:`record_key`)
KEY_SUFFIX = ".key"


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


def is_current(output: str | os.PathLike, key: str, *others: str | os.PathLike) -> bool:
    """Whether ``output`` (and the ``others`` written with it) exist, its key file holds
    ``key`` (it was made from what ``key`` describes) and ``output`` is still the file
    the key was recorded for (same content up to :data:`CONTENT_ID_BYTES`, else same
    size and mtime: one edited, damaged or replaced outside the workflow is made again)."""
    if not all(os.path.exists(p) or cleaned_identity(p) is not None for p in (output, *others)):
        return False
    try:
        with open(f"{output}{KEY_SUFFIX}") as f:
            recorded = f.read().split()
    except OSError:
        return False
    return recorded[:1] == [key] and recorded[1:] == [_identity_text(output)]


def changed_outside(output: str | os.PathLike) -> str | None:
    """``"deleted"`` or ``"changed"`` when ``output`` is no longer the file its key was
    recorded for (edited, damaged or removed outside the job that made it), else None
    (no key: never finished, or still the same file)."""
    try:
        with open(f"{output}{KEY_SUFFIX}") as f:
            recorded = f.read().split()
    except OSError:
        return None
    if len(recorded) < 2:
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


def record_key(output: str | os.PathLike, key: str) -> None:
    """Write the key file of ``output`` with the identity of ``output`` as it is now
    (atomically, after ``output`` itself: an output whose job was killed before this
    has no key and is made again)."""
    atomic_write_text(f"{output}{KEY_SUFFIX}", f"{key} {_identity_text(output)}\n")


def drop_key(output: str | os.PathLike) -> None:
    """Remove the key file of ``output`` (it is being made again)."""
    try:
        os.unlink(f"{output}{KEY_SUFFIX}")
    except FileNotFoundError:
        pass


def newer_than(paths: Iterable[str | os.PathLike], output: str | os.PathLike) -> bool:
    """Whether one of ``paths`` was modified after ``output`` (a missing output counts
    as older): make's rule, for inputs whose changes must redo ``output``."""
    out = file_identity(output)
    if out is None:
        return True
    return any((ident := file_identity(p)) is not None and ident[1] > out[1] for p in paths)
