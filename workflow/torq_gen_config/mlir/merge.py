"""Several imported layer modules merged into one MLIR module (batched compilation).

``iree-import-onnx`` (``torq_gen_config.mlir.importer``) prints one layer as::

    module {
      func.func @main(%arg0: !torch.vtensor<...>) -> ... attributes {...} {
        ...  dense_resource<conv1_w_0> ...
      }
    }

    {-#
      dialect_resources: {
        builtin: {
          conv1_w_0: "0x0800...",
        }
      }
    #-}

:func:`merge_modules` puts the functions of several such modules into one module:
each function renamed (``@main`` -> its own name), each ``builtin`` resource key
prefixed with that name (weights of different layers often share a key, e.g. two
layers' ``_w_0``), one ``dialect_resources`` section at the end. A layer imported
with ``parameters: external`` (docs/parameters.md) also has module-level globals
before its function, one per stored tensor::

      util.global private @conv1_w_0 = #stream.parameter.named<"model"::"conv1_w_0"> : tensor<64x3x3x3xf32>

each renamed like the resources (``@<function>__conv1_w_0``, with its
``util.global.load`` references): two layers that use the same tensor get a global
each, reading the same parameter. The text is
merged, not re-parsed: the importer's output has one fixed form, which
:func:`parse_layer_module` checks line by line; a module of any other form (module
attributes, a second function, another dialect's resources) raises
:class:`MergeError`, and the caller compiles that layer alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

#: MLIR bare identifiers (symbol names and resource keys without quotes).
_BARE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*\Z")
_RESOURCE_REF = re.compile(r'dense_resource<("(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_$.-]*)>')
_RESOURCE_ENTRY = re.compile(r'      ("(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_$.-]*): (".*"),?\Z')
_HEADER = "  func.func @main("
_SYMBOL = r'("(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_$.]*)'
_GLOBAL = re.compile(r"  util\.global private @" + _SYMBOL + r"( = #stream\.parameter\.named<.*)\Z")
_GLOBAL_REF = re.compile(r"(util\.global\.load(?: immutable)? )@" + _SYMBOL)


class MergeError(ValueError):
    """A layer module is not of the form :func:`parse_layer_module` accepts."""


@dataclass(frozen=True)
class LayerModule:
    """One imported layer, split into its function and its resources.

    Attributes:
        function_lines: the lines of ``func.func @main`` (header to closing brace),
            without newlines, indented as in the module.
        resources: ``builtin`` resource key (as printed, maybe quoted) -> value text
            (the quoted hex string).
        globals: the module's parameter globals, symbol (as printed, maybe quoted)
            -> the rest of the line (`` = #stream.parameter.named<...> : tensor<...>``).
    """

    function_lines: tuple[str, ...]
    resources: tuple[tuple[str, str], ...]
    globals: tuple[tuple[str, str], ...] = ()


def function_name(slug: str, taken: set[str]) -> str:
    """An exported function name for the layer ``slug`` (``[A-Za-z0-9._-]+``), unique
    among ``taken`` (which it is added to): ``l_`` + the slug with ``-`` and ``.``
    replaced by ``_`` (an MLIR bare identifier that ``iree-run-module --function``
    takes as it is), plus ``_<n>`` when that name is already taken."""
    base = "l_" + re.sub(r"[^A-Za-z0-9_]", "_", slug)
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def parse_layer_module(text: str) -> LayerModule:
    """Split the text of one imported layer module (see the module doc).

    Raises:
        MergeError: empty text (a failed import), module attributes, not exactly one
            top-level ``func.func @main`` (after the parameter globals, if any), or a
            resource section with anything but ``builtin`` entries.
    """
    body, sep, tail = text.partition("\n{-#\n")
    lines = body.rstrip("\n").split("\n")
    if not lines or lines[0] != "module {" or lines[-1] != "}":
        raise MergeError("not a plain 'module { ... }' (empty, or module attributes)")
    inner = lines[1:-1]
    globals_: list[tuple[str, str]] = []
    while inner and (g := _GLOBAL.match(inner[0])):
        globals_.append((g.group(1), g.group(2)))
        inner = inner[1:]
    if not inner or not inner[0].startswith(_HEADER) or inner[-1] != "  }":
        raise MergeError("the module does not hold exactly one function @main")
    for ln in inner[1:-1]:
        if ln.startswith("  ") and not ln.startswith("    "):  # another top-level op
            raise MergeError(f"more than one top-level op in the module: {ln.strip()[:80]!r}")
    resources: list[tuple[str, str]] = []
    if sep:
        res_lines = tail.rstrip("\n").split("\n")
        if (res_lines[:2] != ["  dialect_resources: {", "    builtin: {"]
                or res_lines[-3:] != ["    }", "  }", "#-}"]):
            raise MergeError("a resource section other than dialect_resources/builtin")
        for ln in res_lines[2:-3]:
            m = _RESOURCE_ENTRY.match(ln)
            if not m:
                raise MergeError(f"unexpected resource entry: {ln[:80]!r}")
            resources.append((m.group(1), m.group(2)))
    elif tail:
        raise MergeError("text after the module")
    return LayerModule(function_lines=tuple(inner), resources=tuple(resources), globals=tuple(globals_))


def _renamed_key(prefix: str, key: str) -> str:
    if key.startswith('"'):
        return f'"{prefix}__{key[1:]}'
    new = f"{prefix}__{key}"
    return new if _BARE_ID.match(new) else f'"{new}"'


def merge_modules(members: list[tuple[str, LayerModule]]) -> tuple[str, dict[str, tuple[int, int]]]:
    """One module holding every member's function, renamed, with its resources.

    Args:
        members: ``(function name, parsed layer)`` pairs; names from
            :func:`function_name` (unique bare identifiers).

    Returns:
        ``(text, spans)``: the merged module text, and per function name its
        ``(first line, last line)`` in that text (1-based, inclusive): a compiler
        diagnostic at ``<file>:<line>:<col>`` names the function it falls in
        (:func:`functions_at`).

    Raises:
        MergeError: two members share a function name, or a function refers to a
            resource or a global its module does not define.
    """
    out = ["module {"]
    spans: dict[str, tuple[int, int]] = {}
    resources: list[str] = []
    for name, layer in members:
        if name in spans:
            raise MergeError(f"function name {name!r} used twice")
        keys = {key: _renamed_key(name, key) for key, _ in layer.resources}

        def rename(m: re.Match, keys=keys) -> str:
            if m.group(1) not in keys:
                raise MergeError(f"{name}: dense_resource<{m.group(1)}> is not defined in its module")
            return f"dense_resource<{keys[m.group(1)]}>"

        symbols = {sym: _renamed_key(name, sym) for sym, _ in layer.globals}

        def rename_global(m: re.Match, symbols=symbols) -> str:
            if m.group(2) not in symbols:
                raise MergeError(f"{name}: util.global.load @{m.group(2)} is not a global of its module")
            return f"{m.group(1)}@{symbols[m.group(2)]}"

        first = len(out) + 1
        out.extend(f"  util.global private @{symbols[sym]}{rest}" for sym, rest in layer.globals)
        lines = list(layer.function_lines)
        lines[0] = f"  func.func @{name}(" + lines[0][len(_HEADER):]
        for ln in lines:
            if "dense_resource<" in ln:
                ln = _RESOURCE_REF.sub(rename, ln)
            if "util.global.load" in ln:
                ln = _GLOBAL_REF.sub(rename_global, ln)
            out.append(ln)
        spans[name] = (first, len(out))
        resources.extend(f"      {keys[key]}: {value}" for key, value in layer.resources)
    out.append("}")
    text = "\n".join(out) + "\n"
    if resources:
        text += ("\n{-#\n  dialect_resources: {\n    builtin: {\n" + ",\n".join(resources)
                 + "\n    }\n  }\n#-}\n")
    return text, spans


def functions_at(diagnostics: str, mlir_file: str, spans: dict[str, tuple[int, int]]) -> list[str]:
    """The functions whose lines the ``<mlir_file>:<line>:<col>: error`` diagnostics
    point at, in the order they first appear (empty when none can be placed).

    Only ``error`` diagnostics count (notes and warnings do not fail a compile);
    ``mlir_file`` is matched by its base name, as the compiler prints the path it
    was given.
    """
    pattern = re.compile(rf"(?:^|[\s/]){re.escape(os.path.basename(mlir_file))}:(\d+):\d+: error:", re.MULTILINE)
    found: list[str] = []
    for m in pattern.finditer(diagnostics):
        line = int(m.group(1))
        for name, (a, b) in spans.items():
            if a <= line <= b and name not in found:
                found.append(name)
    return found
