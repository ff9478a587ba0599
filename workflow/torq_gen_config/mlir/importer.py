"""ONNX -> MLIR (torch dialect) import with IREE's ONNX importer, and the map from
ONNX nodes to the ``line:col`` of their ``torch.operator`` in the printed MLIR.

The importer emits one op per ONNX node in graph order. Rather than computing line
numbers by arithmetic, :func:`import_model` records how many ops each node adds,
prints the module, re-parses the printed file and reads each op's location back
(docs/toolchain.md, 'IREE import and node locations'). The op type of every mapped
op is checked against the ONNX node (``torch.operator "onnx.<OpType>"``).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.fileio import atomic_write_text
from ..core.external_data import external_entries, is_external, load_model, stored_bytes
from ..core.lazy import np
from ..core.lazy import ir, iree_importer_overrides, onnx, onnx_importer, util
from ..core.weight_store import MIN_EXTERNAL_BYTES, PARAMETER_SCOPE, parameter_key

#: the Python distribution of the ONNX -> MLIR importer (its version goes to the report)
IMPORTER_PACKAGE = "iree-base-compiler"

_LOC = re.compile(r'loc\("(?P<file>.*)":(?P<line>\d+):(?P<col>\d+)\)')


def import_model(onnx_model: "onnx.ModelProto", mlir_path: str | os.PathLike, *, record_locations: bool = False,  # noqa: F821
                 elide_weights: bool = False, parameters: bool = False, stored_by_reference: bool = False) -> dict:
    """Import an in-memory ONNX model to MLIR and write it to ``mlir_path`` atomically.

    Args:
        onnx_model: model with inferred shapes (graph name becomes the function name);
            its tensors may be in the weight store (:func:`~torq_gen_config.core.external_data.load_model`
            with ``weights=False``): they are mapped, not copied.
        mlir_path: output ``.mlir`` file.
        record_locations: also return, per ONNX node, the location of the op that
            defines the node's results (needs a re-parse of the written file).
        elide_weights: leave the values of resources of more than
            :data:`~torq_gen_config.core.weight_store.MIN_EXTERNAL_BYTES` bytes out of the
            printed ``dialect_resources`` (the ops and their ``line:col`` are unchanged,
            the file cannot be compiled): for a map of locations only.
        parameters: the tensors of the weight store become IREE parameters
            (``parameters: external``, docs/parameters.md): each one a module-level
            ``util.global private @<name> = #stream.parameter.named<"model"::"<archive
            key>"> : tensor<...>`` read by ``util.global.load`` +
            ``torch_c.from_builtin_tensor`` where the constant was (the form of
            iree's own ``iree-import-onnx --externalize-params``); the module then
            runs with ``--parameters=model=<the store>``. Other tensors stay inline.
        stored_by_reference: each resource whose bytes are in the weight store is
            written as a reference to them (``"torq-gen-config-stored:<offset>:<length>:<file>"``,
            :func:`write_with_weights`) instead of their hex text (twice their size):
            the file is then compiled through :func:`write_with_weights`, which any
            compile of :func:`~torq_gen_config.backends.iree_tools.compile_mlir_module`
            does; ``iree-compile`` refuses the file as it is (not hex).

    Returns:
        ``{"import_ms": float, "locations": [per node: {"line", "col", "mlir_op",
        "onnx_op", "n_mlir_ops", "verified"}] (only with record_locations)}``.

    Raises:
        Exception: whatever the importer raises for an unsupported model (the
            caller records it as an ``import`` error).
    """
    t0 = time.perf_counter()
    spans: list[tuple[int, int]] = []

    class _StoreImporter(onnx_importer.NodeImporter):
        """The importer, reading tensors of the weight store through a memory map (their
        bytes become the resource blobs without a copy in memory) and, with
        ``record_locations``, recording how many ops each node adds."""

        __slots__ = ()

        def import_node(self, node):  # noqa: D401 - same contract as the base class
            before = len(self._b.operations)
            super().import_node(node)
            if record_locations and self._b == top_block[0]:  # a subgraph's nodes are inside their node's op
                spans.append((before, len(self._b.operations)))

        def import_regions(self, onnx_attrs, op):
            """The base class's, with each subgraph (If branches, Loop/Scan bodies, nested)
            imported by this class too, so that its initializers and ``Constant`` values in
            the weight store are read from there (the base importer reads only in-line
            values: a stored tensor would come out empty)."""
            graphs = sorted((a for a in onnx_attrs if a.type == onnx.AttributeProto.AttributeType.GRAPH),
                            key=lambda a: a.name)
            for attr, region in zip(graphs, op.regions):
                inputs = list(attr.g.input)
                region.blocks.append(*[self._cc.type_proto_to_type(i.type) for i in inputs],
                                     arg_locs=[op.location] * len(inputs))
                block = region.blocks[0]
                sub = _StoreImporter(onnx_importer.GraphInfo(self._gi.model_info, attr.g, is_subgraph=True),
                                     parent_op=op, block=block, context_cache=self._cc, module_op=self._m,
                                     module_cache=self._mc)
                for i, value in zip(inputs, block.arguments):
                    sub._nv_map[i.name] = value
                for k, v in self._nv_map.items():  # outer-scope values (as the base class: they win)
                    sub._nv_map[k] = v
                sub.import_all(False)

        def import_initializer(self, initializer, extern_name=None):
            large_inline = initializer.HasField("raw_data") and len(initializer.raw_data) >= MIN_EXTERNAL_BYTES
            if not is_external(initializer) and not large_inline:
                return super().import_initializer(initializer, extern_name)
            iname = extern_name if extern_name else initializer.name
            key = parameter_key(initializer, store_keys) if parameters else None
            if key is not None:
                return self._import_parameter(initializer, iname, key)
            with ir.InsertionPoint(self._b), ir.Location.name(iname):
                cc = self._cc
                data = stored_bytes(initializer) if is_external(initializer) else initializer.raw_data
                value = ir.DenseResourceElementsAttr.get_from_buffer(
                    data, cc._sanitize_name(initializer.name), cc.tensor_proto_to_builtin_type(initializer), alignment=8)
                if stored_by_reference and is_external(initializer):  # where its bytes are, not the bytes
                    e = external_entries(initializer)
                    blobs[_resource_key(str(value))] = _StoredRef(e["location"], int(e.get("offset", 0)), len(data))
                else:
                    blobs[_resource_key(str(value))] = data  # printed by _write_asm, streamed
                op = ir.Operation.create(name="torch.operator", results=[cc.tensor_proto_to_type(initializer)],
                                         attributes={"name": ir.StringAttr.get("onnx.Constant"),
                                                     "torch.onnx.value": value})
                self._nv_map[iname] = op.result
            return op.result

        def _import_parameter(self, t, iname, key):
            """A stored tensor as a global named parameter, loaded where it is used."""
            cc = self._cc
            with self._c, ir.Location.unknown():  # a signless builtin tensor, converted to the torch type
                elem_type = iree_importer_overrides.ELEM_TYPE_TO_SIGNLESS_IR_TYPE[t.data_type]
                gtype = ir.RankedTensorType.get(tuple(t.dims), elem_type())
            if not globals_state:
                globals_state["table"] = ir.SymbolTable(self._m)
            with ir.InsertionPoint.at_block_begin(self._m.regions[0].blocks[0]), ir.Location.unknown(self._c):
                value = ir.Attribute.parse(f"#stream.parameter.named<{ir.StringAttr.get(PARAMETER_SCOPE)}::"
                                           f"{ir.StringAttr.get(key)}> : {gtype}")
                g = util.GlobalOp(ir.StringAttr.get(cc._sanitize_name(t.name or "param")), ir.TypeAttr.get(gtype),
                                  sym_visibility=ir.StringAttr.get("private"), initial_value=value)
                globals_state["table"].insert(g)  # renamed when the name is taken
                if globals_state.get("last") is not None:
                    g.move_after(globals_state["last"])  # declaration order
                globals_state["last"] = g
            sym = ir.StringAttr(g.attributes["sym_name"]).value
            with ir.InsertionPoint(self._b), ir.Location.name(iname):
                load = util.GlobalLoadOp(gtype, sym)
                result = ir.Operation.create("torch_c.from_builtin_tensor", results=[cc.tensor_proto_to_type(t)],
                                             operands=[load.result]).result
            self._nv_map[iname] = result
            return result

    store_keys: dict = {}  # store -> {offset: archive key} (weight_store.parameter_key)
    blobs: dict = {}  # resource key -> its bytes (a memory map of the store, or the tensor's raw data)
    globals_state: dict = {}  # the module's symbol table and its last parameter global
    ctx = ir.Context()
    model_info = onnx_importer.ModelInfo(onnx_model)
    module = model_info.create_module(context=ctx).operation
    imp = onnx_importer.NodeImporter.define_function(model_info.main_graph, module)
    imp.__class__ = _StoreImporter
    top_block = [imp._b]
    imp.import_all()
    module.verify()
    _write_asm(module, mlir_path, blobs, elide=elide_weights)
    result: dict[str, Any] = {"import_ms": round((time.perf_counter() - t0) * 1000, 3)}
    if record_locations:
        result["locations"] = _read_locations(ctx, Path(mlir_path), list(onnx_model.graph.node), spans)
    return result


_RESOURCE_USE = re.compile(r'dense_resource<("(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_$.-]*)>')
_RESOURCE_LINE = re.compile(r'      ("(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_$.-]*): ".*"\Z')
#: the printed form of a blob of alignment 8 (MLIR's: the alignment as a 4-byte little-endian prefix)
_BLOB_PREFIX = "0x08000000"
#: bytes hexed at a time when a blob is written out
_HEX_CHUNK = 8 << 20
#: a resource value that names weight-store bytes instead of holding them (not hex: no tool
#: but :func:`write_with_weights` reads it)
STORED_PREFIX = "torq-gen-config-stored:"


def _resource_key(attr_text: str) -> str:
    """The key of a ``dense_resource<key> : type`` attribute, as printed."""
    m = _RESOURCE_USE.search(attr_text)
    if not m:
        raise ValueError(f"not a dense_resource attribute: {attr_text[:80]}")
    return m.group(1)


def _write_asm(module, mlir_path: str | os.PathLike, blobs: dict, *, elide: bool = False) -> None:
    """Print ``module`` to ``mlir_path`` atomically, the importer's text form, without
    ever holding the weights' text (twice their size) in memory: MLIR prints the module
    with its large resources elided, and each of them is written out from its bytes in
    ``blobs`` (key -> bytes or memory map), in chunks. A large resource not in ``blobs``
    (made elsewhere than the initializers) makes MLIR print the whole module instead.
    ``elide``: the large resources stay out (the file is a map of the ops' locations,
    not a module to compile).

    Raises:
        OSError: the file cannot be written.
    """
    path = Path(mlir_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # resources whose printed value is longer are elided: those of MIN_EXTERNAL_BYTES bytes and more
            module.print(file=f, assume_verified=True, large_resource_limit=len(_BLOB_PREFIX) + 2 * MIN_EXTERNAL_BYTES - 1)
            f.write("\n")
        text = Path(tmp).read_text(encoding="utf-8")  # small: the large values are not in it
        body, sep, tail = text.partition("\n{-#\n")
        present = {}  # key -> its printed entry (the small ones)
        for ln in tail.split("\n"):
            m = _RESOURCE_LINE.match(ln.rstrip(","))
            if m:
                present[m.group(1)] = ln.rstrip(",")
        # in MLIR's order (creation: the order the ops first use them)
        order = [k for k in dict.fromkeys(m.group(1) for m in _RESOURCE_USE.finditer(body))
                 if k in present or not elide]
        order += [k for k in present if k not in order]
        if any(k not in present and k not in blobs for k in order):  # a value only MLIR holds: it prints all
            with open(tmp, "w", encoding="utf-8") as f:
                module.print(file=f, assume_verified=True)
                f.write("\n")
            os.replace(tmp, path)
            return
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(body.rstrip("\n") + "\n")
            if order:
                f.write("\n{-#\n  dialect_resources: {\n    builtin: {\n")
                for i, key in enumerate(order):
                    if key in present:
                        f.write(present[key])
                    elif isinstance(blobs[key], _StoredRef):
                        ref = blobs[key]
                        f.write(f'      {key}: "{STORED_PREFIX}{ref.offset}:{ref.length}:{ref.location}"')
                    else:
                        f.write(f'      {key}: "')
                        _write_hex(f, blobs[key])
                        f.write('"')
                    f.write(",\n" if i < len(order) - 1 else "\n")
                f.write("    }\n  }\n#-}\n")
            f.write("\n")  # as the importer's text always ended
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class _StoredRef:
    """Where a resource's bytes are in the weight store (absolute file, byte offset, length)."""

    location: str
    offset: int
    length: int


def _write_hex(f, data) -> None:
    """A blob's printed value (without quotes): the alignment prefix, then its bytes as hex, in chunks."""
    f.write(_BLOB_PREFIX)
    view = memoryview(data).cast("B")
    for k in range(0, len(view), _HEX_CHUNK):
        f.write(view[k:k + _HEX_CHUNK].hex().upper())


_STORED_ENTRY = re.compile(r'(      (?:"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_$.-]*): )"' + re.escape(STORED_PREFIX)
                           + r'(\d+):(\d+):(.*)"(,?)\n?\Z')


def has_stored_weights(mlir_path: str | os.PathLike) -> bool:
    """Whether an MLIR file refers to weight-store bytes (:func:`import_model`'s
    ``stored_by_reference``) and so must be written out with them before it is compiled.
    Reads the file in blocks (a file with hex weights is read once, as its compile would)."""
    marker = f'"{STORED_PREFIX}'.encode()
    tail = b""
    with open(mlir_path, "rb") as f:
        while block := f.read(8 << 20):
            if marker in tail + block:
                return True
            tail = block[-len(marker):]
    return False


def write_with_weights(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Write ``src`` to ``dst`` with each weight-store reference replaced by the bytes it
    names, as hex: the importer's own text form, line for line (compiler diagnostics keep
    their ``line:col``), the bytes read from a memory map of the store and written in
    chunks (no copy of a weight in memory).

    Raises:
        OSError: a file cannot be read or written.
        ValueError: a referenced file is shorter than the reference says (the store changed).
    """
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(src, encoding="utf-8") as fin, open(dst, "w", encoding="utf-8") as fout:
        for line in fin:
            m = _STORED_ENTRY.match(line) if STORED_PREFIX in line else None
            if m is None:
                fout.write(line)
                continue
            offset, length, location = int(m.group(2)), int(m.group(3)), m.group(4)
            if os.path.getsize(location) < offset + length:
                raise ValueError(f"{src}: {location} has {os.path.getsize(location)} bytes, a weight ends at "
                                 f"{offset + length} (the weight store changed since the import)")
            fout.write(f'{m.group(1)}"')
            _write_hex(fout, np.memmap(location, dtype=np.uint8, mode="r", offset=offset, shape=(length,))
                       if length else b"")
            fout.write(f'"{m.group(5)}\n')


def _read_locations(ctx, mlir_path: Path, nodes: list, spans: list[tuple[int, int]]) -> list[dict]:
    """Re-parse the printed module and read the location of each node's last op."""
    parsed = ir.Module.parseFile(str(mlir_path), ctx)
    func = None
    for op in parsed.body.operations:
        if op.operation.name == "func.func":
            func = op
            break
    ops = [o.operation for o in func.regions[0].blocks[0].operations]
    out = []
    for node, (a, b) in zip(nodes, spans):
        rec: dict[str, Any] = {"onnx_op": node.op_type, "n_mlir_ops": b - a, "line": None, "col": None,
                               "mlir_op": None, "verified": False}
        if b > a:
            op = ops[b - 1]
            m = _LOC.search(str(op.location))
            name = _onnx_op_name(op)
            rec["mlir_op"] = name or op.name
            if m:
                rec["line"], rec["col"] = int(m["line"]), int(m["col"])
            rec["verified"] = name == f"onnx.{node.op_type}"
        out.append(rec)
    return out


def _onnx_op_name(op) -> str | None:
    """The ``"onnx.<OpType>"`` name of a ``torch.operator`` op, else None."""
    if op.name != "torch.operator":
        return None
    try:
        return str(op.attributes["name"]).strip('"')
    except (KeyError, ValueError):
        return None


def import_layer(onnx_path: str | os.PathLike, mlir_path: str | os.PathLike, parameters: bool = False) -> dict:
    """Import one layer model file to MLIR; never raises for importer failures.
    ``parameters``: its stored tensors as IREE parameters (:func:`import_model`); else
    its stored weights are references to the weight store (``stored_by_reference``), not
    hex: the file holds the layer's ops, its compile writes the weights in.

    Returns:
        ``{"status": "ok"|"error", "message": str|None, "import_ms": float}``. On
        error ``mlir_path`` is written empty so that the workflow's file contract
        holds; the layer-test job reads the status and records an ``import`` error.
    """
    t0 = time.perf_counter()
    try:
        model = load_model(onnx_path, weights=False)  # the importer maps the stored weights
        res = import_model(model, mlir_path, parameters=parameters, stored_by_reference=True)
        return {"status": "ok", "message": None, "import_ms": res["import_ms"]}
    except Exception as e:  # importer errors come as many exception types
        atomic_write_text(mlir_path, "")
        msg = f"{type(e).__name__}: {str(e).strip()}"
        return {"status": "error", "message": msg[:4000], "import_ms": round((time.perf_counter() - t0) * 1000, 3)}


def import_full_model(prepared_path: str | os.PathLike, mlir_path: str | os.PathLike, weights: bool = True) -> dict:
    """Import the whole prepared model once and build the node -> ``line:col`` map.

    ``weights``: the file keeps the weights (an executor compiles it: TORQ's whole-model
    run); False: they are elided (:func:`import_model`), the file is the map of the
    compiler JSON's keys only, and a fraction of the weights' size.

    Returns:
        JSON-safe ``{"mlir_file": str, "status", "message", "import_ms", "nodes":
        [per prepared node: {"index", "onnx_op", "line", "col", "mlir_op",
        "n_mlir_ops", "verified"}], "n_unverified": int}``. An importer failure
        is recorded (``status: error``) and leaves every node unmapped.
    """
    model = load_model(prepared_path, weights=False)
    try:
        res = import_model(model, mlir_path, record_locations=True, elide_weights=not weights)
    except Exception as e:
        atomic_write_text(mlir_path, "")
        return {"mlir_file": str(mlir_path), "status": "error", "message": f"{type(e).__name__}: {str(e).strip()[:2000]}",
                "import_ms": None, "nodes": [], "n_unverified": len(model.graph.node)}
    nodes = [{"index": j, **rec} for j, rec in enumerate(res["locations"])]
    return {"mlir_file": str(mlir_path), "status": "ok", "message": None, "import_ms": res["import_ms"],
            "nodes": nodes, "n_unverified": sum(1 for n in nodes if not n["verified"])}


def layer_location(layer: dict, locations: dict) -> str | None:
    """The ``"line:col"`` of a layer's own op in the full-model MLIR, or None.

    Uses the layer's ``primary_prepared_index`` (the node of the layer's op type,
    also inside an opset-upgrade expansion) and only returns locations whose op type
    was verified against the ONNX node.
    """
    nodes = locations.get("nodes") or []
    j = layer.get("primary_prepared_index")
    if j is None or j >= len(nodes):
        return None
    rec = nodes[j]
    if not rec.get("verified") or rec.get("line") is None:
        return None
    return f"{rec['line']}:{rec['col']}"


def operator_at(mlir_text_lines: list[str], location: str) -> str | None:
    """The ``onnx.<OpType>`` of the ``torch.operator`` that starts at ``line:col``.

    Used to check compiler JSON keys against the MLIR file; returns None when no
    ``torch.operator`` starts there.
    """
    line, col = (int(x) for x in location.split(":"))
    if not 1 <= line <= len(mlir_text_lines):
        return None
    text = mlir_text_lines[line - 1][col - 1:]
    m = re.match(r'torch\.operator "(onnx\.[A-Za-z0-9_]+)"', text)
    return m.group(1) if m else None
