"""Layer split: one small ONNX model per layer of the user's model.

A *layer* is a node of the user's model that computes on run-time data. Nodes whose
inputs are all constant (``Constant``, ``ConstantOfShape`` of a constant shape,
``Identity`` of an initializer, ``Shape``/``Size`` of a tensor with a static shape
and arithmetic on such values) are evaluated here and their values become
initializers of the layers that consume them; they are not layers
(as in the original tool: docs/original_tool.md, 'Layer IDs and indices').

Layer ID: ``<OpType>_<first output name>`` of the user's node (the original tool's).
When the opset upgrade expanded a user node into several nodes, the layer model
holds the non-constant part of that expansion, and it is still one layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from ..core.external_data import save_model
from ..core.layout import MODEL_FILE
from ..core.lazy import helper, onnx
from ..core.weight_store import store_folded
from .folding import fold_constants
from .extract import extract_model
from .graph import node_inputs, value_types
from .mac_count import mac_count
from .shapes import type_is_complete, type_table, type_text

#: Name of the layer model file inside each layer directory.
_SLUG_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def layer_slug(layer_id: str, max_len: int = 80) -> str:
    """A safe, stable directory name for a layer ID.

    Characters outside ``[A-Za-z0-9._-]`` (output names often contain ``/`` or
    ``:``) become ``_``; when anything was replaced or cut, an 8-hex-digit hash of
    the full ID is appended so that two IDs never share a slug.
    """
    s = _SLUG_BAD.sub("_", layer_id).strip("._") or "layer"
    if s != layer_id or len(s) > max_len:
        h = hashlib.sha1(layer_id.encode("utf-8")).hexdigest()[:8]
        s = f"{s[: max_len - 9]}-{h}"
    return s


def split_layers(model: "onnx.ModelProto", info: dict, layers_dir: str | os.PathLike,  # noqa: F821
                 folded_store: str | os.PathLike | None = None) -> dict:
    """Write one ONNX model per layer and return the manifest.

    Args:
        model: the prepared model (see :func:`torq_gen_config.model.prepare.prepare_model`).
        info: the preparation info (``user_nodes``, ``prepared_nodes``).
        layers_dir: directory that receives ``<slug>/model.onnx`` per layer (a tensor of
            ``model`` in the weight store stays there: the layer model refers to it,
            :mod:`~torq_gen_config.core.weight_store`). A file whose bytes did not change is left untouched (its mtime too), so only
            changed layers rerun; directories of layers that no longer exist are removed.
        folded_store: the archive beside the weight store (its :data:`~torq_gen_config.core.weight_store.FOLDED_FILE`)
            that receives the folded values the layers read (weights computed by
            ``ConstantOfShape``, a folded ``Transpose``...):
            :func:`~torq_gen_config.core.weight_store.store_folded`; the layer models refer
            to it. None: such values are copied into each layer model that reads them.

    Returns:
        The manifest (JSON-safe): ``layers`` (in model order) with ``layer_id``,
        ``slug``, ``op_type``, ``node_index``, ``graph_index``, ``node_name``,
        ``prepared_node_indices``, ``primary_prepared_index`` (the node of the
        layer's own op type, used for its MLIR location), ``inputs``/``outputs``
        (name, dtype, shape), ``initializers`` (name, dtype, shape), ``mac_count``,
        and ``not_testable`` (the reason, :func:`not_testable_reason`) for a layer
        whose input or output type is unknown: it gets no test jobs;
        and ``folded_nodes`` (user nodes that were constant-folded), ``warnings``.
    """
    layers_dir = Path(layers_dir)
    layers_dir.mkdir(parents=True, exist_ok=True)
    values, folded, warnings = fold_constants(model)
    nodes = list(model.graph.node)
    if folded_store is not None:
        store_folded(values, {t for j, n in enumerate(nodes) if j not in folded for t in node_inputs(n)}, folded_store)
    groups: dict[int, list[int]] = {}
    for j, p in enumerate(info["prepared_nodes"]):
        groups.setdefault(p["graph_index"], []).append(j)
    types = value_types(model)
    all_types = type_table(model)
    graph_outputs = [o.name for o in model.graph.output]

    layers = []
    folded_nodes = []
    slugs: dict[str, str] = {}
    for un in info["user_nodes"]:
        if un["node_index"] is None:  # a Constant node: never a layer
            continue
        members = [j for j in groups.get(un["graph_index"], []) if j not in folded]
        if not members:
            folded_nodes.append({"node_index": un["node_index"], "op_type": un["op_type"], "outputs": un["outputs"]})
            continue
        first_out = next((t for t in un["outputs"] if t), f"node{un['node_index']}")
        layer_id = f"{un['op_type']}_{first_out}"
        slug = layer_slug(layer_id)
        if slug in slugs and slugs[slug] != layer_id:
            slug = f"{slug}-{un['node_index']}"
        slugs[slug] = layer_id
        primary = next((j for j in members if nodes[j].op_type == un["op_type"]), members[-1])
        layer_model, io = build_layer_model(model, members, values, types, graph_outputs, layer_id, un["node_index"])
        save_model(layer_model, layers_dir / slug / MODEL_FILE, only_if_changed=True)
        untestable = not_testable_reason(io, all_types, info)
        layers.append({
            "layer_id": layer_id,
            "slug": slug,
            "op_type": un["op_type"],
            "node_index": un["node_index"],
            "graph_index": un["graph_index"],
            "node_name": un["name"],
            "prepared_node_indices": members,
            "primary_prepared_index": primary,
            **io,
            "mac_count": _safe_mac_count(mac_count, layer_model),
            "signature": layer_signature(layer_model),
            **({"not_testable": untestable} if untestable else {}),
        })

    keep = {layer["slug"] for layer in layers}
    for d in layers_dir.iterdir():
        if d.is_dir() and d.name not in keep and (d / MODEL_FILE).exists():
            shutil.rmtree(d)
    return {"layers": layers, "folded_nodes": folded_nodes, "warnings": warnings,
            "total_user_nodes": len(info["user_nodes"])}


def not_testable_reason(io: dict, types: dict, info: dict | None = None) -> str | None:
    """Why a layer cannot be tested, or None: an input or output whose type is not a
    tensor with a known dtype and a fully static shape (zero-size dims are static).

    A guessed stand-in (a rank-0 tensor, a dim of 1) would test another layer than the
    model holds, so such a layer gets this reason instead of verdicts. The reason names
    the tensor and says why its type is unknown: the whole-model reference run gave it
    no value (``info["model_run"]["unavailable"]``, with that run's reason), it is a
    sequence or optional value, or static inference could not infer it.
    """
    run = (info or {}).get("model_run") or {}
    unavailable = run.get("unavailable") or {}
    for kind in ("inputs", "outputs"):
        for entry in io[kind]:
            name = entry["name"]
            tp = types.get(name)
            if type_is_complete(tp):
                continue
            known = type_text(tp)
            what = f"the type/shape of {kind[:-1]} {name!r} is unknown" + (f" ({known})" if known != "unknown" else "")
            if tp is not None and tp.WhichOneof("value") not in (None, "tensor_type"):
                return (f"not testable: {kind[:-1]} {name!r} is a {type_text(tp)} value; layer tests take tensors "
                        "only")
            if name in unavailable:
                return f"not testable: {what}: {unavailable[name]}"
            if run.get("ran"):
                return (f"not testable: {what}: static inference could not infer it and the whole-model reference "
                        "run gave it no value")
            if run.get("error"):
                return (f"not testable: {what}: static shape inference could not infer it, and the whole-model "
                        f"reference run failed ({run['error']})")
            return f"not testable: {what}: static shape inference could not infer it"
    return None


def layer_signature(layer_model) -> str:
    """Hash that is equal for layers that test the same thing (``--dedup-layers``).

    Covers, per node: op type, domain and attribute values; and the layer's input and
    output shapes and dtypes, and its initializers' shapes and dtypes (not their
    values), as the issue for duplicate detection specifies. The original tool ignored
    attribute values (docs/original_tool.md, 'Skip mode, dedup, cache, timing'); here
    they count.

    Returns:
        A 16-hex-digit SHA-1 prefix.
    """
    def attr_value(a):
        v = helper.get_attribute_value(a)
        if hasattr(v, "SerializeToString"):
            return hashlib.sha1(v.SerializeToString(deterministic=True)).hexdigest()
        if isinstance(v, (list, tuple)):
            return [x.decode("latin-1") if isinstance(x, bytes) else
                    (hashlib.sha1(x.SerializeToString(deterministic=True)).hexdigest() if hasattr(x, "SerializeToString") else x)
                    for x in v]
        return v.decode("latin-1") if isinstance(v, bytes) else v

    def vi(v):
        tt = v.type.tensor_type
        return [tt.elem_type, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim]]

    g = layer_model.graph
    sig = {
        "nodes": [[n.op_type, n.domain, sorted((a.name, attr_value(a)) for a in n.attribute)] for n in g.node],
        "inputs": [vi(v) for v in g.input],
        "outputs": [vi(v) for v in g.output],
        "initializers": [[t.data_type, list(t.dims)] for t in g.initializer],
        "opset": sorted((o.domain, o.version) for o in layer_model.opset_import),
    }
    return hashlib.sha1(json.dumps(sig, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_layer_model(model, members: list[int], values: dict, types: dict, graph_outputs: list[str],
                      layer_id: str, node_index: int):
    """Build the stand-alone ONNX model of one layer (:func:`~.extract.extract_model`).

    Run-time inputs become graph inputs (types from shape inference), constant
    inputs (``values``) become initializers, and every tensor produced by the layer's
    nodes that is not a direct input of one of them (or is a model output) becomes a
    graph output. The graph is named ``main`` so that the imported MLIR function is
    ``@main``; the layer ID and node index are metadata props; shapes are inferred.

    Returns:
        ``(model, io)`` with ``io`` = ``{"inputs", "outputs", "initializers"}`` lists
        of ``{"name", "dtype", "shape"}``.
    """
    layer, names = extract_model(
        model, members, constants=values, types=types, graph_outputs=graph_outputs, outputs="unread_inside",
        props={"torq_gen_config.layer_id": layer_id, "torq_gen_config.node_index": str(node_index)},
        infer_shapes=True)
    out_types = value_types(layer)
    io = {
        "inputs": [_describe(t, types) for t in names["inputs"]],
        "outputs": [_describe(t, out_types) for t in names["outputs"]],
        "initializers": [{"name": t.name, "dtype": _dtype_name(t.data_type), "shape": list(t.dims)}
                         for t in layer.graph.initializer],
    }
    return layer, io


def _describe(name: str, types: dict) -> dict:
    t = types.get(name)
    if t is None or not t.HasField("tensor_type"):
        return {"name": name, "dtype": None, "shape": None}
    tt = t.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return {"name": name, "dtype": _dtype_name(tt.elem_type), "shape": shape}


def _dtype_name(elem_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _safe_mac_count(fn, layer_model) -> int | None:
    try:
        return fn(layer_model)
    except Exception:
        return None
