"""The stream-level executable split: one copy per device of every ``stream.executable``
dispatched from more than one device (docs/toolchain.md, 'The IREE shared-executable bug').

IREE deduplicates identical dispatches before it knows their devices; an executable
then used by two devices gets one variant per backend, and the host code of one device
looks up its function inside the other backend's binary: the wrong kernel runs, or the
compiler crashes while linking. Compiling in two halves (``--compile-to=stream``, this
split, ``--compile-from=stream``) gives each device an executable of its own.

The rewrite works on the parsed IR with IREE's MLIR Python bindings: the affinity of a
dispatch is its own ``affinity`` attribute (``stream.async.dispatch``) or that of the
nearest enclosing op that has one (``stream.cmd.execute``); for an executable dispatched
from devices D1, D2, ... the first keeps the original, each other gets a clone named
``<executable>__<device symbol>`` and its dispatch sites are rewritten to it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..core.lazy import ir
from .placement import parse_module

_DISPATCH_OPS = ("stream.cmd.dispatch", "stream.async.dispatch", "flow.dispatch")
_FILE_LOC = re.compile(r'"[^"]*":(\d+):(\d+)')
_AFFINITY_SYMBOL = re.compile(r"#hal\.device\.affinity<@([A-Za-z0-9_$.-]+)")


def split_shared_executables(stream_ir: str | bytes) -> dict:
    """Give each device its own copy of every executable dispatched from several devices.

    Args:
        stream_ir: what ``iree-compile --compile-to=stream`` wrote: text, or bytecode
            (``--emit-mlir-bytecode``: it keeps the locations, and the weights whole).

    Returns:
        ``{"module": the rewritten ``ir.Module`` (write it with
        :func:`write_bytecode`), "split": {executable: [device symbols, the first one
        keeping the original]}, "sites": [per dispatch site: {"loc": [line:col, ...],
        "executable": name after the split, "device": device symbol or None}],
        "unknown_affinity": int (sites with no affinity found, not even the module's
        ``stream.affinity.default``: left as they were)}``. A site without an affinity
        runs on the default device, and is counted there.
        An IR with no shared executable comes back unchanged (``split`` empty).

    Raises:
        ValueError: the text does not parse.
    """
    ctx = ir.Context()
    module = parse_module(stream_ir, "the stream-level IR", ctx)
    executables = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
                   for op in module.body.operations if op.operation.name == "stream.executable"}
    sites: list[tuple[Any, int, str | None]] = []  # (dispatch op, index in its entry points, device symbol)
    # a dispatch without an affinity of its own or around it runs on the module's default device
    attrs = module.operation.attributes
    default = affinity_symbol(str(attrs["stream.affinity.default"])) if "stream.affinity.default" in attrs else None
    for op, affinity in _dispatches(module.operation, default):
        for i, _ in enumerate(_entry_points(op)):
            sites.append((op, i, affinity))
    users: dict[str, list[str]] = {}
    for op, i, dev in sites:
        root = _entry_points(op)[i][0]
        if root in executables and dev is not None and dev not in users.setdefault(root, []):
            users[root].append(dev)
    split = {name: devs for name, devs in users.items() if len(devs) > 1}
    with ctx, ir.Location.unknown():
        clones: dict[tuple[str, str], str] = {}
        taken = set(executables)
        for name, devs in split.items():
            original = executables[name]
            for dev in devs[1:]:
                new = f"{name}__{dev}"
                k = 1
                while new in taken:
                    k += 1
                    new = f"{name}__{dev}_{k}"
                taken.add(new)
                clone = original.clone(ip=ir.InsertionPoint(original))
                clone.attributes["sym_name"] = ir.StringAttr.get(new)
                clones[(name, dev)] = new
        by_op: dict[int, list] = {}
        for op, i, dev in sites:
            refs = _entry_points(op)
            new = clones.get((refs[i][0], dev)) if dev is not None else None
            if new is None:
                continue
            entry = by_op.setdefault(id(op), [op, list(refs)])
            entry[1][i] = [new, *refs[i][1:]]
        for op, refs in by_op.values():
            attrs = [ir.SymbolRefAttr.get(r) for r in refs]
            if "entry_points" in op.attributes:
                op.attributes["entry_points"] = ir.ArrayAttr.get(attrs)
            else:
                op.attributes["entry_point"] = attrs[0]
        module.operation.verify()
        listed = [{"loc": _FILE_LOC.findall(str(op.location)), "executable": _entry_points(op)[i][0], "device": dev}
                  for op, i, dev in sites]
    for s in listed:
        s["loc"] = [f"{a}:{b}" for a, b in s["loc"]]
    return {"module": module, "split": split, "sites": listed,
            "unknown_affinity": sum(1 for _, _, d in sites if d is None)}


def write_bytecode(module, path: str | Path) -> None:
    """Write an ``ir.Module`` as MLIR bytecode (its locations and resources whole), the
    input of ``iree-compile --compile-from=stream``.

    Raises:
        OSError: the file cannot be written.
    """
    with open(path, "wb") as f:
        module.operation.write_bytecode(f)


def affinity_symbol(attr_text: str | None) -> str | None:
    """The device symbol of an ``#hal.device.affinity<@device_x>`` attribute's text
    (also the first one of ``#hal.device.optimal<[...]>``), else None."""
    m = _AFFINITY_SYMBOL.search(attr_text or "")
    return m.group(1) if m else None


def _entry_points(op) -> list[list[str]]:
    """The symbol paths (``[executable, export]``) a dispatch op calls."""
    if "entry_points" in op.attributes:
        return [ir.SymbolRefAttr(a).value for a in ir.ArrayAttr(op.attributes["entry_points"])]
    if "entry_point" in op.attributes:
        return [ir.SymbolRefAttr(op.attributes["entry_point"]).value]
    return []


def _dispatches(op, affinity: str | None):
    """Yield ``(dispatch op, device symbol or None)`` for every dispatch under ``op``."""
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                here = affinity
                if "affinity" in child.attributes:
                    here = affinity_symbol(str(child.attributes["affinity"])) or affinity
                if child.name in _DISPATCH_OPS:
                    yield child, here
                if child.name != "stream.executable":
                    yield from _dispatches(child, here)
