"""Where each op of a placed module really ran, read back from what ``iree-compile``
wrote (docs/toolchain.md, 'Reading back where each op ran').

Three sources, all keyed by the ``line:col`` locations of ``full.mlir`` that the placed
module keeps (:mod:`.placement`):

- the flow-level IR before ``iree-flow-deduplicate-executables``: which ops were fused
  into the executable of each dispatch site (dedup later merges identical executables
  and hides the others' locations);
- the stream-level IR (after :func:`~.stream_split.split_shared_executables`): the
  device of each dispatch site and the executable it calls;
- the executable sources (``--iree-hal-dump-executable-sources-to``): each
  executable's backends (``embedded_elf_x86_64``, ``vmvx_bytecode_fb``, ...); one built
  for two backends is the signature of the IREE bug the split avoids.

Sites of the two IRs are joined by their location (the dispatch keeps its root op's
location). Locations of ``tensor.empty``, ``linalg.fill``, ``arith.constant`` and block
arguments are ignored, as are fused locations: IREE merges identical ops, so they can
carry another op's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..core.lazy import ir
from .placement import location_keys, parse_module

#: ops whose location says nothing about which op a kernel computes
IGNORED_OPS = ("tensor.empty", "linalg.fill", "arith.constant")
_VARIANT = re.compile(r"hal\.executable\.variant\s+(?:public\s+|private\s+)?@([A-Za-z0-9_$.-]+)")
_EXECUTABLE = re.compile(r"hal\.executable\s+(?:public\s+|private\s+)?@\"?([A-Za-z0-9_$.-]+)")


def flow_sites(flow_text: str) -> list[dict]:
    """The dispatch sites of the flow-level IR (before executable deduplication).

    Returns:
        Per ``flow.dispatch`` op in order: ``{"loc": [line:col, ...] of the site,
        "executable": name, "ops": sorted line:col of the ops in the executable,
        "merged": those found only in fused locations (ops IREE merged from several
        layers)}``.

    Raises:
        ValueError: the text does not parse.
    """
    module = parse_module(flow_text, "the flow-level IR")
    contents: dict[str, tuple[set[str], set[str]]] = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "flow.executable":
            own: set[str] = set()
            merged: set[str] = set()
            _collect(op, own, merged)
            contents[ir.StringAttr(op.attributes["sym_name"]).value] = (own, merged - own)
    sites = []
    for op in _walk(module.operation, skip=("flow.executable",)):
        if op.name == "flow.dispatch":
            exe = ir.SymbolRefAttr(op.attributes["entry_point"]).value[0] if "entry_point" in op.attributes else (
                ir.SymbolRefAttr(ir.ArrayAttr(op.attributes["entry_points"])[0]).value[0])
            own, merged = contents.get(exe, (set(), set()))
            sites.append({"loc": location_keys(str(op.location)), "executable": exe, "ops": sorted(own),
                          "merged": sorted(merged)})
    return sites


def executable_backends(sources_dir: str | Path) -> dict[str, list[str]]:
    """Executable name -> the variants (backends) built for it, from the files of
    ``--iree-hal-dump-executable-sources-to``."""
    out: dict[str, list[str]] = {}
    for path in sorted(Path(sources_dir).glob("*.mlir")):
        text = path.read_text(encoding="utf-8", errors="replace")
        m = _EXECUTABLE.search(text)
        name = m.group(1) if m else path.stem.removeprefix("module_")
        for v in _VARIANT.findall(text):
            if v not in out.setdefault(name, []):
                out[name].append(v)
    return out


def read_placement(*, flow: list[dict], stream: list[dict], devices: Mapping[str, str],
                   assignment: Mapping[str, str], backends: Mapping[str, list[str]] | None = None) -> dict:
    """Join the sources into a record of where each placed op ran.

    Args:
        flow: :func:`flow_sites`.
        stream: the stream-level sites (``split_shared_executables()["sites"]``: ``{"loc",
            "executable", "device"}`` with ``device`` a device symbol).
        devices: device symbol -> executor name.
        assignment: ``{"line:col": executor}`` for every placed op (``place_module()["placed"]``).
        backends: :func:`executable_backends` (None: not checked).

    Returns:
        ``{"ops": {"line:col": {"assigned": executor, "ran_on": [executors], "status":
        "as assigned" | "elsewhere" | "no kernel"}}, "elsewhere": [line:col],
        "two_backends": {executable: [variants]}, "sites": int}``. ``elsewhere``: an op
        that ran on another device than assigned, or also there (without the pins of
        :func:`~.placement.pin_affinities`, IREE moves producers to their consumers' device).
    """
    by_loc: dict[str, set[str]] = {}  # site location -> ops fused into its executables
    merged_at: dict[str, set[str]] = {}  # site location -> ops found only in merged locations
    for s in flow:
        for loc in s["loc"][:1]:
            by_loc.setdefault(loc, set()).update(s["ops"] or [loc])
            merged_at.setdefault(loc, set()).update(s.get("merged") or [])
    ran: dict[str, set[str]] = {}
    ran_merged: dict[str, set[str]] = {}
    for s in stream:
        ex = devices.get(s.get("device") or "")
        if ex is None:
            continue
        for loc in (s.get("loc") or [])[:1]:
            for key in by_loc.get(loc, {loc}):
                ran.setdefault(key, set()).add(ex)
            for key in merged_at.get(loc, ()):
                ran_merged.setdefault(key, set()).add(ex)
    ops: dict[str, Any] = {}
    for key, assigned in assignment.items():
        # an op's own kernels say where it ran; merged ops only when it has no kernel of its own
        on = sorted(ran.get(key) or ran_merged.get(key) or ())
        status = "no kernel" if not on else ("as assigned" if on == [assigned] else "elsewhere")
        ops[key] = {"assigned": assigned, "ran_on": on, "status": status}
    two = {name: v for name, v in (backends or {}).items() if len(v) > 1}
    return {"ops": ops, "elsewhere": [k for k, r in ops.items() if r["status"] == "elsewhere"],
            "two_backends": two, "sites": len(stream)}


def _walk(op, skip: Iterable[str] = ()) -> Iterable[Any]:
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                yield child
                if child.name not in skip:
                    yield from _walk(child, skip)


def _collect(op, own: set[str], merged: set[str]) -> None:
    """The ``line:col`` of every op under ``op`` that computes something: into ``own``
    from an op's own location, into ``merged`` from a location fused from several ops'
    (IREE merged identical ops of several layers, e.g. the same broadcast in two
    LayerNormalizations: it says which layers shared a computation, not where each ran)."""
    for child in _walk(op):
        if child.name not in IGNORED_OPS:
            found = location_keys(str(child.location))
            (own if len(found) == 1 else merged).update(found)
